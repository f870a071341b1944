"""Valid samples of the topology messages: TreeAssignment and EpochChange.

The assignments of an endpoint, an inner aggregator and the root, and member
bitmaps from empty to the largest allowed.
"""

from __future__ import annotations

from collections.abc import Sequence

from cco.interop.samples.common import MAX_PARAMS, PARAMS, Sample, group_id
from cco.wire.errors import ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import Address, EpochChange, NodeRef, TreeAssignment
from cco.wire.registries import MAX_WORLD_SIZE


def _node(name: str, host: str, port: int, ranks: Sequence[int]) -> NodeRef:
    return NodeRef(node_id=name, address=Address(host=host, port=port), ranks=bitmap_from_ranks(ranks))


def topology_samples() -> list[Sample]:
    root = _node("agg-root", "198.18.0.1", 4433, range(4))
    return [
        Sample(
            "tree-assignment-endpoint",
            "An endpoint's assignment (rank 1): a parent aggregator, no children, expected is the "
            "bitmap of the endpoint's own rank.",
            TreeAssignment(
                group_id=group_id("training"),
                epoch=3,
                world_size=4,
                expected=bitmap_from_ranks([1]),
                children=(),
                params=PARAMS,
                parent=_node("agg-1", "198.18.0.2", 4433, [0, 1]),
            ),
        ),
        Sample(
            "tree-assignment-root",
            "The root aggregator's assignment: two child aggregators, every rank expected, no parent.",
            TreeAssignment(
                group_id=group_id("training"),
                epoch=3,
                world_size=4,
                expected=bitmap_from_ranks(range(4)),
                children=(
                    _node("agg-1", "198.18.0.2", 4433, [0, 1]),
                    _node("agg-2", "198.18.0.3", 4433, [2, 3]),
                ),
                params=PARAMS,
            ),
        ),
        Sample(
            "tree-assignment-inner",
            "An inner aggregator: endpoint children, a parent, and ranks 0, 1 and 9 expected "
            "(a two-byte bitmap).",
            TreeAssignment(
                group_id=group_id("training"),
                epoch=4,
                world_size=10,
                expected=bitmap_from_ranks([0, 1, 9]),
                children=(
                    _node("endpoint-0", "198.18.1.1", 5000, [0]),
                    _node("endpoint-1", "198.18.1.2", 5000, [1]),
                    _node("endpoint-9", "198.18.1.10", 5000, [9]),
                ),
                params=MAX_PARAMS,
                parent=root,
            ),
        ),
        Sample(
            "epoch-change",
            "The group moves to epoch 4 after rank 2 was lost: members 0, 1, 3.",
            EpochChange(
                group_id=group_id("training"),
                epoch=4,
                members=bitmap_from_ranks([0, 1, 3]),
                code=ErrorCode.PEER_LOST,
            ),
        ),
        Sample(
            "epoch-change-empty",
            "EpochChange with an empty members bitmap (the group is dissolved).",
            EpochChange(group_id=group_id("training"), epoch=5, members=b"", code=ErrorCode.SHUTTING_DOWN),
        ),
        Sample(
            "epoch-change-rank-max",
            "EpochChange whose only member is rank 2^16-1: an 8192-byte bitmap, the largest allowed.",
            EpochChange(
                group_id=group_id("large"),
                epoch=1,
                members=bitmap_from_ranks([MAX_WORLD_SIZE - 1]),
                code=ErrorCode.NO_ERROR,
            ),
        ),
    ]
