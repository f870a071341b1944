"""Valid samples of the status messages: StatusRequest and StatusReply.

Requests with no and with the most flight-recorder entries, and the replies of a
rendezvous (members, a two-level tree, aggregators; a group with aggregators its
members' Reports excluded) and of an aggregator (its place in a tree, operation and
chunk records), their optional fields present and absent.
"""

from __future__ import annotations

from cco.interop.samples.common import Sample, group_id
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import (
    Address,
    AggregatorView,
    GroupView,
    MemberView,
    RecordView,
    StatusReply,
    StatusRequest,
    TreeNodeView,
)
from cco.wire.registries import Collective, Role


def status_samples() -> list[Sample]:
    group = group_id("training")
    members = (
        *(MemberView(rank=rank, node_id=f"ep-{rank}", state="assigned", connected=1) for rank in range(3)),
        MemberView(rank=3, node_id="ep-3", state="joined", connected=0),
    )
    tree = (
        TreeNodeView(node_id="agg-0", ranks=bitmap_from_ranks(range(4))),
        TreeNodeView(node_id="agg-1", ranks=bitmap_from_ranks([2, 3]), parent="agg-0"),
    )
    record = RecordView(
        group_id=group,
        epoch=2,
        op_id=52,
        chunk_index=17,
        kind=Collective.ALL_REDUCE,
        state="collecting",
        elements=32768,
        missing=bitmap_from_ranks([3]),
        started_ms=120_500,
        updated_ms=120_512,
    )
    return [
        Sample(
            "status-request-no-records",
            "StatusRequest without flight-recorder entries.",
            StatusRequest(records=0),
        ),
        Sample(
            "status-request-max",
            "StatusRequest for the most entries a reply may carry.",
            StatusRequest(records=4096),
        ),
        Sample(
            "status-reply-rendezvous",
            "A rendezvous's StatusReply: a group of 4 over a two-level tree (one member away, "
            "optional world_size present) and the aggregators with their load.",
            StatusReply(
                role=Role.RENDEZVOUS,
                node_id="rendezvous",
                uptime_ms=3_600_000,
                groups=(
                    GroupView(
                        group_id=group, epoch=2, state="active", world_size=4, members=members, tree=tree
                    ),
                ),
                aggregators=(
                    AggregatorView(
                        node_id="agg-0",
                        address=Address(host="10.0.0.1", port=4434),
                        capacity=16,
                        max_fan_in=8,
                        groups=1,
                        connected=1,
                        labels=("rack-a",),
                    ),
                    AggregatorView(
                        node_id="agg-1",
                        address=Address(host="10.0.0.2", port=4434),
                        capacity=1,
                        max_fan_in=2,
                        groups=1,
                        connected=0,
                        labels=(),
                    ),
                ),
                records=(),
                omitted=0,
            ),
        ),
        Sample(
            "status-reply-rendezvous-excluded",
            "A rendezvous's StatusReply for a group whose members' Reports excluded two "
            "aggregators from its trees, oldest first; its new tree is on a third.",
            StatusReply(
                role=Role.RENDEZVOUS,
                node_id="rendezvous",
                uptime_ms=60_000,
                groups=(
                    GroupView(
                        group_id=group,
                        epoch=4,
                        state="active",
                        world_size=4,
                        members=members,
                        tree=(TreeNodeView(node_id="agg-2", ranks=bitmap_from_ranks(range(4))),),
                        excluded=("agg-1", "agg-0"),
                    ),
                ),
                aggregators=(),
                records=(),
                omitted=0,
            ),
        ),
        Sample(
            "status-reply-aggregator",
            "An aggregator's StatusReply: its place in one tree (no world_size), an operation "
            "entry (chunk_index absent) and a chunk still missing rank 3; 5 entries omitted.",
            StatusReply(
                role=Role.AGGREGATOR,
                node_id="agg-1",
                uptime_ms=0,
                groups=(GroupView(group_id=group, epoch=2, state="active", members=(), tree=tree[1:]),),
                aggregators=(),
                records=(
                    RecordView(
                        group_id=group,
                        epoch=2,
                        op_id=52,
                        kind=Collective.ALL_REDUCE,
                        state="collecting",
                        elements=1 << 20,
                        missing=b"",
                        started_ms=120_400,
                        updated_ms=120_512,
                    ),
                    record,
                ),
                omitted=5,
            ),
        ),
    ]
