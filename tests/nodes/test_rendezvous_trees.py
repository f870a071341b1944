"""The trees the rendezvous plans: when a group gets one, how capacity is shared, and
which aggregators can serve a group given what every node declared it can take.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from rendezvous_harness import CRED, GID, OTHER, Harness, only, sent_to

from cco.nodes.events import (
    Command,
    PeerConnected,
    PeerDisconnected,
    SendMessage,
)
from cco.nodes.rendezvous import GroupConfig, RendezvousConfig
from cco.nodes.rendezvous_config import DEFAULT_PARAMS
from cco.nodes.rendezvous_records import chunk_elements_limit
from cco.nodes.rendezvous_states import (
    GroupState,
)
from cco.wire.errors import ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import (
    MAC_MODULUS,
    MAX_CHUNK_ELEMENTS,
    MAX_TOTAL_ELEMENTS,
    MIN_BLOCK_ELEMENTS,
    Address,
    AggregatorAccept,
    AggregatorRegister,
    Capabilities,
    EpochChange,
    JoinAccept,
    JoinReject,
    Leave,
    Result,
    TreeAssignment,
    encode_message,
)
from cco.wire.registries import MAX_WORLD_SIZE, Collective, DType, ReduceOp, Role


def test_complete_group_gets_a_tree_aggregators_first_and_no_keys_for_aggregators() -> None:
    h = Harness()
    accept = only(h.aggregator("agg-a", fan_in=2, port=4001), "agg-a", AggregatorAccept)
    assert accept == AggregatorAccept(node_id="agg-a", heartbeat_interval_ms=1000)
    h.aggregator("agg-b", fan_in=2, port=4002)
    h.aggregator("agg-c", fan_in=2, port=4003)
    for i in range(3):
        assert not any(isinstance(m, TreeAssignment) for m in sent_to(h.endpoint(f"e{i}"), f"e{i}"))
    cmds = h.endpoint("e3")
    assignments = [(c.peer, c.message) for c in cmds if isinstance(c, SendMessage)
                   and isinstance(c.message, TreeAssignment)]  # fmt: skip
    assert [p for p, _ in assignments] == ["agg-c", "agg-a", "agg-b", "e0", "e1", "e2", "e3"]
    root = assignments[0][1]
    assert isinstance(root, TreeAssignment) and root.parent is None and root.epoch == 1
    assert ranks_from_bitmap(root.expected) == {0, 1, 2, 3}
    e0 = assignments[3][1]
    assert isinstance(e0, TreeAssignment) and e0.children == () and e0.expected == b"\x01"
    assert e0.parent is not None and e0.parent.node_id == "agg-a" and e0.parent.address.port == 4001
    assert h.group().state is GroupState.ACTIVE
    h.check_state()


def test_a_group_without_capacity_hears_no_aggregator_then_its_tree_in_that_epoch() -> None:
    h = Harness()
    for i in range(3):
        h.endpoint(f"e{i}")
    cmds = h.endpoint("e3")
    assert h.group().state is GroupState.WAITING
    for rank in range(4):
        change = only(cmds, f"e{rank}", EpochChange)
        assert isinstance(change, EpochChange) and change.code is ErrorCode.NO_AGGREGATOR
        assert change.epoch == 2 and ranks_from_bitmap(change.members) == {0, 1, 2, 3}
    cmds = h.aggregator("agg")
    assert not any(isinstance(c.message, EpochChange) for c in cmds if isinstance(c, SendMessage))
    assignment = only(cmds, "e2", TreeAssignment)
    assert isinstance(assignment, TreeAssignment) and assignment.epoch == 2
    h.check_state()


def test_a_waiting_group_that_changes_is_told_no_aggregator_again_after_the_change() -> None:
    h = Harness()
    for i in range(4):
        h.endpoint(f"e{i}")
    cmds = h.send("e3", Leave(group_id=GID, rank=3, code=ErrorCode.NO_ERROR))
    changes = [m for m in sent_to(cmds, "e0") if isinstance(m, EpochChange)]
    assert [(c.epoch, c.code) for c in changes] == [(3, ErrorCode.NO_ERROR), (4, ErrorCode.NO_AGGREGATOR)]
    assert h.group().state is GroupState.WAITING
    cmds = h.aggregator("small", capacity=1, fan_in=2)  # cannot hold three ranks: still waiting
    assert h.group().state is GroupState.WAITING
    assert not any(isinstance(m, EpochChange) for m in sent_to(cmds, "e0"))
    h.check_state()


def test_capacity_is_shared_between_groups_and_freed_when_a_group_closes() -> None:
    config = RendezvousConfig(groups={GID: GroupConfig(1, CRED), OTHER: GroupConfig(1, CRED)})
    h = Harness(config)
    h.aggregator("agg", capacity=1)
    h.endpoint("e0", world_size=1)
    h.endpoint("e1", group=OTHER, world_size=1)
    assert h.group(OTHER).state is GroupState.WAITING
    (agg,) = h.rv.status().aggregators
    assert (agg.node_id, agg.capacity, agg.groups) == ("agg", 1, (GID,))
    h.check_state()
    cmds = h.send("e0", Leave(group_id=GID, rank=0, code=ErrorCode.NO_ERROR))
    assert h.group().state is GroupState.CLOSED
    change = only(cmds, "agg", EpochChange)
    assert isinstance(change, EpochChange) and change.members == b"" and change.epoch == 2
    assert isinstance(only(cmds, "e1", TreeAssignment), TreeAssignment)
    assert h.group(OTHER).state is GroupState.ACTIVE
    h.check_state()


def test_groups_spread_over_alike_aggregators_one_each() -> None:
    """Two aggregators with room for both groups: each group goes to the less used one."""
    config = RendezvousConfig(groups={GID: GroupConfig(2, CRED), OTHER: GroupConfig(2, CRED)})
    h = Harness(config)
    h.aggregator("w0", capacity=8, port=4000)
    h.aggregator("w1", capacity=8, port=4001)
    for rank in range(2):
        h.endpoint(f"a{rank}", world_size=2)
        h.endpoint(f"b{rank}", group=OTHER, world_size=2)
    trees = [h.group(g).tree for g in (GID, OTHER)]
    assert [t.aggregator_ids if t is not None else None for t in trees] == [{"w0"}, {"w1"}]
    assert {(a.node_id, a.groups) for a in h.rv.status().aggregators} == {("w0", (GID,)), ("w1", (OTHER,))}
    h.check_state()


def test_an_aggregator_with_more_room_arriving_moves_no_group() -> None:
    """A tree on an emptier aggregator is no better: the group keeps its epoch and tree."""
    h = Harness()
    h.aggregator("w0", capacity=2)
    for rank in range(4):
        h.endpoint(f"e{rank}")
    epoch = h.group().epoch
    cmds = h.aggregator("w1", capacity=8)
    assert not any(isinstance(c, SendMessage) and isinstance(c.message, EpochChange | TreeAssignment)
                   for c in cmds)  # fmt: skip
    tree = h.group().tree
    assert h.group().epoch == epoch and tree is not None and tree.aggregator_ids == {"w0"}
    h.check_state()


FULL = Capabilities(
    dtypes=tuple(DType),
    ops=tuple(ReduceOp),
    collectives=tuple(Collective),
    max_message_size=1 << 24,
    max_chunk_elements=MAX_CHUNK_ELEMENTS,
    extensions=(),
)

DEFAULT_CHUNK = DEFAULT_PARAMS.chunk_elements
DEFAULT_SCALED = DEFAULT_PARAMS.scaled_chunk_elements


def caps(**changes: Any) -> Capabilities:
    return dataclasses.replace(FULL, **changes)


def capable_endpoint(h: Harness, peer: str, capabilities: Capabilities | None, **join: Any) -> list[Command]:
    h.feed(PeerConnected(peer, peer, Role.ENDPOINT, capabilities))
    return h.endpoint(peer, **join)


def capable_aggregator(h: Harness, peer: str, capabilities: Capabilities | None) -> list[Command]:
    h.feed(PeerConnected(peer, peer, Role.AGGREGATOR, capabilities))
    register = AggregatorRegister(
        address=Address(host=f"{peer}.test", port=4000), capacity=1, max_fan_in=16, labels=()
    )
    return h.send(peer, register)


def chunk_sizes_sent(h: Harness, group: bytes = GID) -> set[int]:
    """chunk_elements of the last TreeAssignment sent to each peer of the current tree."""
    status = h.group(group)
    assert status.tree is not None
    peers = [m.node_id for m in status.members] + sorted(status.tree.aggregator_ids)
    found = set()
    for peer in peers:
        sent = h.last[(peer, TreeAssignment, group)]
        assert isinstance(sent, TreeAssignment) and sent.epoch == status.epoch
        lowered = {"chunk_elements": DEFAULT_CHUNK, "scaled_chunk_elements": DEFAULT_SCALED}
        assert dataclasses.replace(sent.params, **lowered) == DEFAULT_PARAMS
        scaled = sent.params.scaled_chunk_elements  # lowered with it, to whole blocks
        assert scaled is None or scaled % sent.params.block_elements == 0
        assert scaled is None or scaled <= max(sent.params.chunk_elements, DEFAULT_SCALED)
        found.add(sent.params.chunk_elements)
    return found


def test_group_chunk_elements_is_at_most_every_members_max_chunk_elements() -> None:
    h = Harness()
    h.aggregator("a1")
    first = only(capable_endpoint(h, "e0", FULL), "e0", JoinAccept)
    assert isinstance(first, JoinAccept) and first.params.chunk_elements == DEFAULT_CHUNK
    small = only(capable_endpoint(h, "e1", caps(max_chunk_elements=1000)), "e1", JoinAccept)
    assert isinstance(small, JoinAccept) and small.params.chunk_elements == 1000
    capable_endpoint(h, "e2", None)  # no declared limit (an in-memory peer)
    capable_endpoint(h, "e3", caps(max_chunk_elements=DEFAULT_CHUNK))  # exactly the group's: no change
    assert h.group().state is GroupState.ACTIVE
    assert chunk_sizes_sent(h) == {1000}, "every node of the tree applies the lowered value"
    assert h.group().params.chunk_elements == 1000
    # The member with the small limit leaves: the next epoch goes back to the configured value.
    h.send("e1", Leave(group_id=GID, rank=1, code=ErrorCode.NO_ERROR))
    assert h.group().state is GroupState.ACTIVE
    assert chunk_sizes_sent(h) == {DEFAULT_CHUNK}


def test_group_chunk_message_fits_every_members_max_message_size() -> None:
    h = Harness()
    h.aggregator("a1")
    for i in range(3):
        capable_endpoint(h, f"e{i}", FULL)
    capable_endpoint(h, "e3", caps(max_message_size=4096))
    (chunk,) = chunk_sizes_sent(h)
    assert 400 <= chunk < 512, chunk  # 4096 bytes hold at most 512 8-byte elements
    assert len(encode_message(largest_chunk_message(chunk, 4, DEFAULT_PARAMS.block_elements))) <= 4096


def largest_chunk_message(chunk_elements: int, world_size: int, block_elements: int) -> Result:
    """The largest chunk message with ``chunk_elements`` 8-byte elements: block-scaled
    (scales and attestations), every header field at its largest, every rank a contributor."""
    blocks = -(-chunk_elements // block_elements)
    return Result(
        group_id=bytes(16),
        epoch=(1 << 64) - 1,
        op_id=(1 << 64) - 1,
        kind=Collective.REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.FLOAT64,
        scales=b"\xff" * 2 * blocks,
        total_elements=MAX_TOTAL_ELEMENTS,
        chunk_elements=chunk_elements,
        chunk_index=MAX_TOTAL_ELEMENTS // chunk_elements - 1,  # a full chunk
        contributors=bitmap_from_ranks(range(world_size)),
        width=8,
        payload=b"\xff" * 8 * (chunk_elements + blocks),
        tag=MAC_MODULUS - 1,
        root=world_size - 1,
        block_elements=block_elements,
    )


@pytest.mark.parametrize("world_size", [1, 4, 1000, MAX_WORLD_SIZE])
@pytest.mark.parametrize("block_elements", [MIN_BLOCK_ELEMENTS, 17, DEFAULT_PARAMS.block_elements])
@pytest.mark.parametrize("max_message_size", [1 << 14, 100_000, 1 << 20])
def test_chunk_elements_limit_is_the_largest_chunk_that_fits(
    world_size: int, block_elements: int, max_message_size: int
) -> None:
    """The bound is safe (the largest chunk message at the limit fits) and tight within
    the slack of CHUNK_HEADER_BOUND (32 more elements would not fit)."""
    limit = chunk_elements_limit(caps(max_message_size=max_message_size), world_size, block_elements)
    size = len(encode_message(largest_chunk_message(limit, world_size, block_elements)))
    assert size <= max_message_size
    assert (
        len(encode_message(largest_chunk_message(limit + 32, world_size, block_elements))) > max_message_size
    )
    assert chunk_elements_limit(caps(max_message_size=max_message_size, max_chunk_elements=7), 4, 16) == 7
    assert chunk_elements_limit(None, world_size, block_elements) == MAX_CHUNK_ELEMENTS


def unscaled_harness() -> Harness:
    """A group whose block-scaled operations' chunks are never larger than its others'."""
    params = dataclasses.replace(DEFAULT_PARAMS, scaled_chunk_elements=None)
    return Harness(RendezvousConfig(groups={GID: GroupConfig(world_size=4, credential=CRED, params=params)}))


def test_aggregator_that_cannot_take_the_groups_chunks_is_not_placed() -> None:
    h = unscaled_harness()
    capable_aggregator(h, "a-small", caps(max_chunk_elements=DEFAULT_CHUNK - 1))
    for i in range(4):
        h.endpoint(f"e{i}")
    assert h.group().state is GroupState.WAITING, "a-small cannot take 65536-element chunks"
    assert not any(isinstance(m, TreeAssignment) for m in sent_to(h.log, "a-small"))
    capable_aggregator(h, "a-exact", caps(max_chunk_elements=DEFAULT_CHUNK))
    assert h.group().state is GroupState.ACTIVE
    assert h.group().tree.aggregator_ids == {"a-exact"}  # type: ignore[union-attr]
    # If the group's chunks shrink to what a-small takes, a-small becomes usable.
    h.feed(PeerDisconnected("a-exact", ErrorCode.PEER_LOST))
    assert h.group().state is GroupState.WAITING
    h.send("e3", Leave(group_id=GID, rank=3, code=ErrorCode.NO_ERROR))
    capable_endpoint(h, "e4", caps(max_chunk_elements=DEFAULT_CHUNK - 1))
    assert h.group().state is GroupState.ACTIVE
    assert h.group().tree.aggregator_ids == {"a-small"}  # type: ignore[union-attr]
    assert chunk_sizes_sent(h) == {DEFAULT_CHUNK - 1}


def test_aggregator_chunk_message_must_fit_its_max_message_size() -> None:
    h = unscaled_harness()
    capable_aggregator(h, "a-narrow", caps(max_message_size=8 * DEFAULT_CHUNK))  # no room for the header
    for i in range(4):
        h.endpoint(f"e{i}")
    assert h.group().state is GroupState.WAITING
    capable_aggregator(h, "a-wide", caps(max_message_size=9 * DEFAULT_CHUNK))
    assert h.group().tree.aggregator_ids == {"a-wide"}  # type: ignore[union-attr]


def test_aggregator_must_take_the_largest_chunks_block_scaled_operations_may_agree() -> None:
    """By default a float SUM's ranks may agree chunks of up to 131072 elements: an
    aggregator placed in the tree takes them; a member that takes fewer lowers the
    limit for the group (to whole blocks), and an aggregator that takes that many fits."""
    h = Harness()
    capable_aggregator(h, "a-32k", caps(max_chunk_elements=DEFAULT_CHUNK))
    for i in range(4):
        h.endpoint(f"e{i}")
    assert h.group().state is GroupState.WAITING, "a-32k cannot take the block-scaled chunks"
    capable_aggregator(h, "a-64k", caps(max_chunk_elements=65536))
    assert h.group().state is GroupState.WAITING
    h.send("e3", Leave(group_id=GID, rank=3, code=ErrorCode.NO_ERROR))
    capable_endpoint(h, "e4", caps(max_chunk_elements=65536 + 100))
    assert h.group().state is GroupState.ACTIVE
    assert h.group().tree.aggregator_ids == {"a-64k"}  # type: ignore[union-attr]
    sent = h.last[("a-64k", TreeAssignment, GID)]
    assert isinstance(sent, TreeAssignment)
    assert (sent.params.chunk_elements, sent.params.scaled_chunk_elements) == (DEFAULT_CHUNK, 65536)


NARROW = caps(
    dtypes=(DType.INT32, DType.FLOAT32),
    ops=(ReduceOp.SUM, ReduceOp.MAX),
    collectives=(Collective.ALL_REDUCE, Collective.BARRIER),
)


@pytest.mark.parametrize(
    "lacking",
    [
        {"dtypes": (DType.INT32,)},
        {"ops": (ReduceOp.SUM,)},
        {"collectives": (Collective.ALL_REDUCE,)},
    ],
    ids=["dtype", "op", "collective"],
)
def test_aggregator_must_list_everything_all_members_list(lacking: dict[str, Any]) -> None:
    """The members' common dtypes, ops and collectives are what the group can run: an
    aggregator lacking any of them is not placed in the group's tree."""
    h = Harness()
    capable_aggregator(h, "a-lacking", dataclasses.replace(NARROW, **lacking))
    capable_endpoint(h, "e0", FULL)  # lists more than the others: the group needs only the common part
    for i in range(1, 4):
        capable_endpoint(h, f"e{i}", NARROW)
    assert h.group().state is GroupState.WAITING
    capable_aggregator(h, "a-fit", NARROW)
    assert h.group().state is GroupState.ACTIVE
    assert h.group().tree.aggregator_ids == {"a-fit"}  # type: ignore[union-attr]


def test_join_refused_when_no_chunk_message_fits_the_joiners_max_message_size() -> None:
    """At the smallest max_message_size (1024), a world of 6000 ranks leaves room for a
    one-element chunk (its contributors bitmap takes 750 bytes); 6008 ranks do not."""
    config = RendezvousConfig(
        groups={GID: GroupConfig(world_size=6000, credential=CRED), OTHER: GroupConfig(6008, CRED)}
    )
    h = Harness(config)
    tight = caps(max_message_size=1024)
    accept = only(capable_endpoint(h, "e0", tight, world_size=6000), "e0", JoinAccept)
    assert isinstance(accept, JoinAccept) and accept.params.chunk_elements == 1
    reject = only(capable_endpoint(h, "e1", tight, group=OTHER, world_size=6008), "e1", JoinReject)
    assert isinstance(reject, JoinReject) and reject.code is ErrorCode.MESSAGE_TOO_LARGE
    assert "max_message_size 1024" in reject.detail
    assert h.group(OTHER).members == (), "a rejected join changes nothing"
