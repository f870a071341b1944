"""The aggregator machine on its own: hand-made tree assignments, a controlled clock.

Each test plays the rendezvous, the children and the parent by feeding inputs to
one AggregatorMachine and reading the commands it returns.  The last tests drive
every (state, input) pair of the machine's three transition tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cco.nodes import aggregator_states as states
from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
from cco.nodes.aggregator_states import GROUP_TABLE, NODE_TABLE, SLOT_TABLE, GroupState, NodeState, SlotState
from cco.nodes.events import (
    ClosePeer,
    Command,
    ConnectTo,
    Input,
    MessageMalformed,
    MessageReceived,
    PeerConnected,
    PeerDisconnected,
    SendMessage,
    TimerFired,
)
from cco.wire import payload
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import (
    Abort,
    Address,
    AggregatorAccept,
    AggregatorRegister,
    BroadcastData,
    ChunkAck,
    ChunkMessage,
    Contribution,
    EpochChange,
    Error,
    GroupParams,
    Heartbeat,
    Message,
    NodeRef,
    PartialAggregate,
    Result,
    RetransmitRequest,
    TreeAssignment,
)
from cco.wire.packing import unpack
from cco.wire.registries import Collective, DType, ReduceOp, Role

GROUP = bytes.fromhex("a1" * 16)
OTHER = bytes.fromhex("b2" * 16)
SECRET = bytes(range(32))
KEYS = {
    GROUP: payload.derive_group_keys(SECRET, GROUP),
    OTHER: payload.derive_group_keys(SECRET[::-1], OTHER),
}
PARAMS = GroupParams(chunk_elements=4, window=2, heartbeat_interval_ms=100, operation_timeout_ms=1000)
QUORUM_WAIT_MS = 200  # below half the operation timeout: no retransmission request first
ADDRESS = Address(host="agg.test", port=4433)
PARENT = NodeRef(
    node_id="root", address=Address(host="root.test", port=4433), ranks=bitmap_from_ranks(range(6))
)
PARENT2 = NodeRef(node_id="root2", address=Address(host="root2.test", port=4433), ranks=PARENT.ranks)


def ref(node_id: str, ranks: list[int]) -> NodeRef:
    return NodeRef(
        node_id=node_id, address=Address(host="endpoint.invalid", port=1), ranks=bitmap_from_ranks(ranks)
    )


def assignment(
    children: dict[str, list[int]],
    *,
    parent: NodeRef | None = None,
    epoch: int = 1,
    group: bytes = GROUP,
    params: GroupParams = PARAMS,
) -> TreeAssignment:
    ranks = sorted(r for rs in children.values() for r in rs)
    return TreeAssignment(
        group_id=group,
        epoch=epoch,
        world_size=8,
        expected=bitmap_from_ranks(ranks),
        children=tuple(ref(n, rs) for n, rs in children.items()),
        params=params,
        parent=parent,
    )


def chunk(
    rank: int,
    *,
    values: list[int] | None = None,
    op_id: int = 0,
    index: int = 0,
    total: int = 8,
    epoch: int = 1,
    group: bytes = GROUP,
    cls: type[ChunkMessage] = Contribution,
    kind: Collective = Collective.ALL_REDUCE,
    op: ReduceOp = ReduceOp.SUM,
    root: int | None = None,
    quorum: int | None = None,
    wait_ms: int = QUORUM_WAIT_MS,
    members: list[int] | None = None,
) -> ChunkMessage:
    """Rank ``rank``'s sealed chunk (by default its rank+1 repeated); with ``quorum``, of
    a presence pass; with ``members``, of an operation a presence pass decided."""
    header = payload.ChunkHeader(
        group_id=group,
        epoch=epoch,
        op_id=op_id,
        kind=kind,
        op=op,
        dtype=DType.INT32,
        total_elements=total,
        chunk_elements=PARAMS.chunk_elements,
        chunk_index=index,
        root=root,
        quorum=quorum,
        wait_ms=wait_ms if quorum is not None else None,
        members=bitmap_from_ranks(members) if members is not None else None,
    )
    count = header.element_count
    data = np.array(values if values is not None else [rank + 1] * count, dtype=np.int64)
    return payload.seal(KEYS[group], header, rank, data, cls)


@dataclass
class Rig:
    """One aggregator, a clock, and helpers that play its peers."""

    machine: AggregatorMachine = field(
        default_factory=lambda: AggregatorMachine(AggregatorConfig(address=ADDRESS, pending_timeout=2.0))
    )
    now: float = 0.0

    def feed(self, event: Input) -> list[Command]:
        out = self.machine.handle(event, self.now)
        assert isinstance(self.machine.state, NodeState)
        return out

    def register(self, heartbeat_ms: int = 600_000) -> list[Command]:
        """Registered with a rendezvous; heartbeats slow enough not to interfere by default."""
        out = self.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
        out += self.feed(
            MessageReceived("rv", AggregatorAccept(node_id="agg", heartbeat_interval_ms=heartbeat_ms))
        )
        return out

    def connect(self, *nodes: str, role: Role = Role.ENDPOINT) -> None:
        for node in nodes:
            assert self.feed(PeerConnected(node, node, role)) == []

    def rendezvous(self, message: Message) -> list[Command]:
        return self.feed(MessageReceived("rv", message))

    def send(self, peer: str, message: Message) -> list[Command]:
        return self.feed(MessageReceived(peer, message))

    def timer(self, at: float) -> list[Command]:
        self.now = at
        return self.feed(TimerFired())


M = TypeVar("M", bound=Message)


def sent(commands: list[Command], peer: str | None = None, kind: type[M] = Message) -> list[M]:  # type: ignore[assignment]
    return [
        c.message
        for c in commands
        if isinstance(c, SendMessage) and (peer is None or c.peer == peer) and isinstance(c.message, kind)
    ]


def errors(commands: list[Command], peer: str | None = None) -> list[ErrorCode]:
    return [m.code for m in sent(commands, peer, Error)]


def root_rig(children: dict[str, list[int]] | None = None) -> Rig:
    """A registered root aggregator for GROUP with endpoint children connected."""
    children = children or {"ep0": [0], "ep1": [1], "ep2": [2]}
    rig = Rig()
    rig.register()
    rig.connect(*children)
    rig.rendezvous(assignment(children))
    return rig


def leaf_rig(*, connect_parent: bool = True) -> tuple[Rig, str]:
    """A registered non-root aggregator (children ep0, ep1) and its parent peer id."""
    rig = Rig()
    rig.register()
    rig.connect("ep0", "ep1")
    out = rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}, parent=PARENT))
    (dial,) = [c for c in out if isinstance(c, ConnectTo)]
    assert dial.expected_node_id == "root" and dial.address == PARENT.address
    if connect_parent:
        assert rig.feed(PeerConnected(dial.peer, "root", Role.AGGREGATOR)) == []
    return rig, dial.peer


# --- registration and liveness -------------------------------------------------------


def test_registers_on_rendezvous_connection_and_heartbeats() -> None:
    rig = Rig()
    out = rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    assert sent(out, "rv") == [AggregatorRegister(address=ADDRESS, capacity=64, max_fan_in=64, labels=())]
    assert rig.machine.state is NodeState.REGISTERING
    rig.rendezvous(AggregatorAccept(node_id="agg-7", heartbeat_interval_ms=100))
    assert rig.machine.state is NodeState.REGISTERED and rig.machine.node_id == "agg-7"
    assert rig.machine.next_deadline() == pytest.approx(0.1)
    beats = sent(rig.timer(0.1), "rv", Heartbeat)
    assert len(beats) == 1
    rig.rendezvous(Heartbeat(seq=1))  # the rendezvous is alive at 0.1
    assert sent(rig.timer(0.2), "rv", Heartbeat)
    assert rig.machine.state is NodeState.REGISTERED


def test_silent_rendezvous_is_lost_after_three_intervals() -> None:
    rig = Rig()
    rig.register(heartbeat_ms=100)
    out: list[Command] = []
    while rig.machine.state is NodeState.REGISTERED:
        deadline = rig.machine.next_deadline()
        assert deadline is not None
        out = rig.timer(deadline)
    assert rig.now == pytest.approx(0.3)
    assert [c for c in out if isinstance(c, ClosePeer)] == [
        ClosePeer("rv", ErrorCode.PEER_LOST, "no message for three heartbeat intervals")
    ]
    assert rig.machine.state is NodeState.DETACHED
    assert sent(rig.feed(PeerConnected("rv2", "rendezvous", Role.RENDEZVOUS)), "rv2", AggregatorRegister)


def test_losing_the_rendezvous_keeps_serving_groups() -> None:
    """The data plane needs no rendezvous: a slot open when it is lost completes."""
    rig, parent = leaf_rig()
    rig.send("ep0", chunk(0))
    out = rig.feed(PeerDisconnected("rv", ErrorCode.PEER_LOST))
    assert sent(out, "ep0", Abort) == [] and not [c for c in out if isinstance(c, ClosePeer)]
    assert rig.machine.state is NodeState.DETACHED and rig.machine.group_state(GROUP) is GroupState.ACTIVE
    out = rig.send("ep1", chunk(1))
    assert len(sent(out, parent, PartialAggregate)) == 1


def test_groups_the_returned_rendezvous_assigns_again_are_kept() -> None:
    rig, _ = leaf_rig()
    rig.feed(PeerDisconnected("rv", ErrorCode.PEER_LOST))
    rig.feed(PeerConnected("rv2", "rendezvous", Role.RENDEZVOUS))
    rig.feed(MessageReceived("rv2", AggregatorAccept(node_id="agg", heartbeat_interval_ms=600_000)))
    out = rig.feed(MessageReceived("rv2", assignment({"ep0": [0], "ep1": [1]}, parent=PARENT)))
    assert not [c for c in out if isinstance(c, ClosePeer | ConnectTo)]  # same tree: a refresh
    out = rig.timer(rig.machine.config.rendezvous_grace + 1)
    assert rig.machine.group_state(GROUP) is GroupState.ACTIVE and out == []


def test_groups_not_assigned_again_within_the_grace_end() -> None:
    rig, parent = leaf_rig()
    rig.feed(PeerDisconnected("rv", ErrorCode.PEER_LOST))
    grace = rig.machine.config.rendezvous_grace
    assert rig.machine.next_deadline() == grace
    rig.timer(grace - 1)
    assert rig.machine.group_state(GROUP) is GroupState.ACTIVE
    rig.now = grace - 0.5
    rig.send("ep0", chunk(0))  # a slot still open when the grace ends
    out = rig.timer(grace)
    assert [m.code for m in sent(out, "ep0", Abort)] == [ErrorCode.PEER_LOST]
    assert ClosePeer(parent, ErrorCode.NO_ERROR, "the group ended here") in out
    assert rig.machine.group_state(GROUP) is GroupState.UNKNOWN
    assert rig.machine.slot_bytes == 0


def test_tree_assignment_before_registration_is_a_protocol_violation() -> None:
    rig = Rig()
    rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    assert errors(rig.rendezvous(assignment({"ep0": [0]}))) == [ErrorCode.PROTOCOL_VIOLATION]
    assert rig.machine.group_state(GROUP) is GroupState.UNKNOWN


def test_inconsistent_assignment_is_refused() -> None:
    rig = Rig()
    rig.register()
    bad = TreeAssignment(
        group_id=GROUP,
        epoch=1,
        world_size=4,
        expected=bitmap_from_ranks([0, 1, 2]),
        children=(ref("ep0", [0, 1]), ref("ep1", [1])),
        params=PARAMS,
    )
    assert errors(rig.rendezvous(bad)) == [ErrorCode.INVALID_FIELD]
    small = Rig(AggregatorMachine(AggregatorConfig(address=ADDRESS, capacity=1)))
    small.register()
    small.rendezvous(assignment({"ep0": [0]}))
    assert errors(small.rendezvous(assignment({"ep0": [0]}, group=OTHER))) == [ErrorCode.RESOURCE_EXHAUSTED]


# --- aggregation --------------------------------------------------------------------


def test_root_combines_children_and_sends_result_to_every_child() -> None:
    rig = root_rig()
    assert rig.send("ep0", chunk(0)) == []
    assert rig.send("ep2", chunk(2)) == []
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.COLLECTING
    out = rig.send("ep1", chunk(1))
    results = {c.peer: c.message for c in out if isinstance(c, SendMessage)}
    assert set(results) == {"ep0", "ep1", "ep2"}
    result = results["ep0"]
    assert isinstance(result, Result)
    assert ranks_from_bitmap(result.contributors) == {0, 1, 2}
    values = payload.open_verified(KEYS[GROUP], result, frozenset({0, 1, 2}))
    assert values.tolist() == [6, 6, 6, 6]
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.COMPLETE
    assert rig.machine.slot_bytes == 0 and rig.machine.peak_slot_bytes > 0


def test_non_root_sends_partial_up_and_forwards_results_down() -> None:
    rig, parent = leaf_rig()
    rig.send("ep0", chunk(0))
    out = rig.send("ep1", chunk(1))
    (partial,) = sent(out, parent, PartialAggregate)
    assert ranks_from_bitmap(partial.contributors) == {0, 1}
    assert sent(out, "ep0") == []
    result = payload.combine([partial, chunk(2), chunk(3), chunk(4), chunk(5)], Result)
    down = rig.send(parent, result)
    assert sent(down, "ep0") == [result] and sent(down, "ep1") == [result]


def test_partial_waits_for_parent_connection() -> None:
    rig, parent = leaf_rig(connect_parent=False)
    assert rig.machine.group_state(GROUP) is GroupState.CONNECTING
    rig.send("ep0", chunk(0))
    assert rig.send("ep1", chunk(1)) == []
    assert rig.machine.slot_bytes > 0  # the partial is held, and counted
    out = rig.feed(PeerConnected(parent, "root", Role.AGGREGATOR))
    assert len(sent(out, parent, PartialAggregate)) == 1
    assert rig.machine.group_state(GROUP) is GroupState.ACTIVE and rig.machine.slot_bytes == 0


def test_identical_retransmission_is_never_counted_twice_and_gets_the_result_again() -> None:
    rig = root_rig()
    first = chunk(0)
    rig.send("ep0", first)
    assert rig.send("ep0", first) == []
    rig.send("ep1", chunk(1))
    (result, *_) = sent(rig.send("ep2", chunk(2)), None, Result)
    # after completion the copy is recognised: nothing counted twice, and since a child
    # sends a chunk again only when it lacks the result, it gets the same Result again
    assert sent(rig.send("ep0", first), "ep0", Result) == [result]
    assert sent(rig.send("ep2", chunk(2)), "ep2", Result) == [result]
    assert rig.machine.kept_result_bytes == len(result.payload)


def test_kept_results_are_bounded_by_twice_the_window() -> None:
    rig = root_rig({"ep0": [0], "ep1": [1]})
    for op_id in range(3 * PARAMS.window):
        rig.send("ep0", chunk(0, op_id=op_id, total=4))
        rig.send("ep1", chunk(1, op_id=op_id, total=4))
    assert rig.machine.kept_result_bytes == 2 * PARAMS.window * 4  # 4 one-byte integers each
    assert rig.send("ep0", chunk(0, op_id=0, total=4)) == []  # too old: recognised, not resent


def test_different_chunk_in_place_of_one_taken_is_a_duplicate_contribution() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0, values=[1, 1, 1, 1]))
    assert errors(rig.send("ep0", chunk(0, values=[9, 9, 9, 9])), "ep0") == [ErrorCode.DUPLICATE_CONTRIBUTION]
    rig.send("ep1", chunk(1))
    out = rig.send("ep2", chunk(2))
    (result, *_) = sent(out, None, Result)
    assert payload.open_verified(KEYS[GROUP], result, frozenset({0, 1, 2})).tolist() == [6, 6, 6, 6]
    assert errors(rig.send("ep1", chunk(1, values=[0, 0, 0, 0])), "ep1") == [ErrorCode.DUPLICATE_CONTRIBUTION]


def test_a_changed_payload_under_the_same_tag_is_taken_for_a_copy_and_not_added() -> None:
    """A tagged chunk's fingerprint is its header with the tag, which seals the
    payload: another payload under the same tag is a forged MAC, and its sender
    gains nothing, since a chunk taken for a copy is not added either."""
    rig = root_rig()
    first = chunk(0, values=[1, 1, 1, 1])
    rig.send("ep0", first)
    forged = dataclasses.replace(first, payload=bytes([1, 1, 1, 9]))
    assert rig.send("ep0", forged) == []  # not added, not answered
    rig.send("ep1", chunk(1))
    (result, *_) = sent(rig.send("ep2", chunk(2)), None, Result)
    assert payload.open_verified(KEYS[GROUP], result, frozenset({0, 1, 2})).tolist() == [6, 6, 6, 6]


def test_a_changed_payload_of_an_untagged_chunk_is_a_duplicate_contribution() -> None:
    """MIN, MAX and the bitwise ops carry no tag: their payload itself is fingerprinted."""
    rig = root_rig()
    first = chunk(0, values=[1, 1, 1, 1], op=ReduceOp.MAX)
    assert first.tag is None
    rig.send("ep0", first)
    changed = dataclasses.replace(first, payload=bytes([1, 1, 1, 2]))
    assert errors(rig.send("ep0", changed), "ep0") == [ErrorCode.DUPLICATE_CONTRIBUTION]
    assert rig.send("ep0", first) == []  # the copy of what was taken is still a copy


def test_children_may_speak_only_for_their_own_ranks() -> None:
    rig = root_rig()
    rig.connect("stranger")
    assert errors(rig.send("stranger", chunk(0))) == [ErrorCode.UNAUTHORIZED]
    assert errors(rig.send("ep0", chunk(1))) == [ErrorCode.UNAUTHORIZED]
    assert rig.machine.open_slots(GROUP) == 0
    rig.send("ep0", chunk(0))
    rig.send("ep1", chunk(1))
    assert len(sent(rig.send("ep2", chunk(2)), None, Result)) == 3  # other peers unaffected


def test_member_of_one_group_cannot_send_into_another() -> None:
    rig = root_rig()
    rig.connect("b0", "b1")
    rig.rendezvous(assignment({"b0": [0], "b1": [1]}, group=OTHER))
    forged = chunk(0, group=OTHER)  # ep0 is rank 0 of GROUP, not of OTHER
    assert errors(rig.send("ep0", forged), "ep0") == [ErrorCode.UNAUTHORIZED]
    assert rig.machine.open_slots(OTHER) == 0
    rig.send("b0", chunk(0, group=OTHER, values=[5, 5, 5, 5]))
    out = rig.send("b1", chunk(1, group=OTHER, values=[7, 7, 7, 7]))
    (result, _) = sent(out, None, Result)
    assert payload.open_verified(KEYS[OTHER], result, frozenset({0, 1})).tolist() == [12] * 4
    assert rig.machine.open_slots(GROUP) == 0


def test_groups_are_isolated_on_a_shared_aggregator() -> None:
    rig = root_rig({"ep0": [0], "ep1": [1]})
    rig.connect("b0", "b1")
    rig.rendezvous(assignment({"b0": [0], "b1": [1]}, group=OTHER))
    rig.send("ep0", chunk(0))
    rig.send("b0", chunk(0, group=OTHER, values=[100] * 4))
    out_a = rig.send("ep1", chunk(1))
    out_b = rig.send("b1", chunk(1, group=OTHER, values=[200] * 4))
    assert {c.peer for c in out_a if isinstance(c, SendMessage)} == {"ep0", "ep1"}
    assert {c.peer for c in out_b if isinstance(c, SendMessage)} == {"b0", "b1"}
    (ra, _) = sent(out_a, None, Result)
    (rb, _) = sent(out_b, None, Result)
    assert payload.open_verified(KEYS[GROUP], ra, frozenset({0, 1})).tolist() == [3] * 4
    assert payload.open_verified(KEYS[OTHER], rb, frozenset({0, 1})).tolist() == [300] * 4


def test_window_bounds_open_slots() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0, index=0))
    rig.send("ep0", chunk(0, index=1))
    assert errors(rig.send("ep0", chunk(0, op_id=1))) == [ErrorCode.RESOURCE_EXHAUSTED]
    assert rig.machine.open_slots(GROUP) == 2
    rig.send("ep1", chunk(1))
    rig.send("ep2", chunk(2))  # slot (0, 0) completes and frees room
    assert rig.send("ep0", chunk(0, op_id=1)) == []
    assert rig.machine.open_slots(GROUP) == 2


def test_broadcast_goes_up_unchanged_then_down_to_everyone() -> None:
    leaf, parent = leaf_rig()
    data = chunk(1, cls=BroadcastData, kind=Collective.BROADCAST, root=1, values=[9, 8, 7, 6])
    assert sent(leaf.send("ep1", data), parent) == [data]
    assert errors(leaf.send("ep0", data)) == [ErrorCode.UNAUTHORIZED]  # ep0 is not the root
    down = leaf.send(parent, data)
    assert sent(down, "ep0") == [data] and sent(down, "ep1") == [data]
    root = root_rig()
    assert {c.peer for c in root.send("ep1", data) if isinstance(c, SendMessage)} == {"ep0", "ep1", "ep2"}


# --- timeouts, aborts, epochs --------------------------------------------------------


def test_slot_timeout_aborts_down_and_up_naming_missing_ranks() -> None:
    rig, parent = leaf_rig()
    rig.now = 0.5
    rig.send("ep0", chunk(0))
    assert rig.machine.next_deadline() == pytest.approx(1.0)  # half the timeout: ask again first
    (request,) = sent(rig.timer(1.0), "ep1", RetransmitRequest)
    assert request.chunks == (0,) and request.missing == bitmap_from_ranks([1])
    assert rig.machine.next_deadline() == pytest.approx(1.5)
    out = rig.timer(1.5)
    for peer in ("ep0", "ep1", parent):
        (abort,) = sent(out, peer, Abort)
        assert abort.code is ErrorCode.TIMEOUT and abort.op_id == 0
        assert abort.missing is not None and ranks_from_bitmap(abort.missing) == {1}
        assert "missing ranks {1}" in abort.detail
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.ABORTED
    assert rig.machine.slot_bytes == 0
    assert rig.send("ep1", chunk(1)) == []  # late: dropped, no slot reopened
    assert rig.machine.open_slots(GROUP) == 0


def test_parent_asking_again_rebuilds_the_identical_partial() -> None:
    rig, parent = leaf_rig()
    rig.send("ep0", chunk(0))
    (first,) = sent(rig.send("ep1", chunk(1)), parent, PartialAggregate)
    request = RetransmitRequest(group_id=GROUP, epoch=1, op_id=0, chunks=(0, 3))
    out = rig.send(parent, request)  # chunk 3 is unknown here: nothing to ask for it
    assert {c.peer: c.message for c in out if isinstance(c, SendMessage)} == {
        "ep0": RetransmitRequest(group_id=GROUP, epoch=1, op_id=0, chunks=(0,), missing=b"\x01"),
        "ep1": RetransmitRequest(group_id=GROUP, epoch=1, op_id=0, chunks=(0,), missing=b"\x02"),
    }
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.COLLECTING
    rig.send("ep1", chunk(1))
    assert sent(rig.send("ep0", chunk(0)), parent, PartialAggregate) == [first]
    assert errors(rig.send("ep0", RetransmitRequest(group_id=GROUP, epoch=1, op_id=0, chunks=(0,)))) == [
        ErrorCode.PROTOCOL_VIOLATION  # only a parent asks again
    ]
    assert rig.send("ep0", ChunkAck(group_id=GROUP, epoch=1, op_id=0, chunks=(0,))) == []


def test_a_silent_aggregator_child_gets_time_to_name_its_own_missing_ranks() -> None:
    rig = Rig()
    rig.register()
    rig.connect("ep0")
    rig.connect("leaf", role=Role.AGGREGATOR)
    rig.rendezvous(assignment({"ep0": [0], "leaf": [1, 2, 3]}))
    rig.send("ep0", chunk(0))
    assert [m for m in sent(rig.timer(1.0), None, Abort)] == []  # waits half a timeout more
    assert rig.machine.next_deadline() == pytest.approx(1.5)
    report = Abort(
        group_id=GROUP,
        epoch=1,
        op_id=0,
        code=ErrorCode.TIMEOUT,
        detail="leaf",
        missing=bitmap_from_ranks([2]),
    )
    (forwarded,) = sent(rig.send("leaf", report), "ep0", Abort)
    assert forwarded.missing == bitmap_from_ranks([2])  # the leaf's precise answer reaches everyone
    assert rig.timer(1.5) == []


def test_data_for_a_child_not_yet_connected_waits_for_its_connection() -> None:
    rig = Rig()
    rig.register()
    rig.connect("ep1")
    rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}))
    data = chunk(1, cls=BroadcastData, kind=Collective.BROADCAST, root=1)
    assert sent(rig.send("ep1", data), "ep1") == [data]
    assert rig.machine.pending_bytes == len(data.payload)
    out = rig.feed(PeerConnected("ep0", "ep0", Role.ENDPOINT))
    assert out == [SendMessage("ep0", data)] and rig.machine.pending_bytes == 0


def test_abort_from_a_child_spreads_once() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0))
    abort = Abort(
        group_id=GROUP,
        epoch=1,
        op_id=0,
        code=ErrorCode.TIMEOUT,
        detail="gave up",
        missing=bitmap_from_ranks([1, 2]),
    )
    out = rig.send("ep1", abort)
    assert {c.peer for c in out if isinstance(c, SendMessage)} == {"ep0", "ep2"}
    (forwarded,) = sent(out, "ep0", Abort)
    assert forwarded.missing == bitmap_from_ranks([1])  # a child speaks for its own ranks only
    assert rig.send("ep2", abort) == []


def test_epoch_change_aborts_old_slots_and_refuses_old_data() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0))
    out = rig.rendezvous(
        EpochChange(group_id=GROUP, epoch=2, members=bitmap_from_ranks([0, 1]), code=ErrorCode.PEER_LOST)
    )
    (abort,) = sent(out, "ep0", Abort)
    assert abort.code is ErrorCode.PEER_LOST and abort.missing == bitmap_from_ranks([2])
    assert rig.machine.group_state(GROUP) is GroupState.STALE and rig.machine.open_slots(GROUP) == 0
    (stale,) = sent(rig.send("ep1", chunk(1)), "ep1", Abort)
    assert stale.code is ErrorCode.STALE_EPOCH
    assert rig.send("ep0", chunk(0, epoch=2)) == []  # the new epoch's data waits for its tree
    assert rig.machine.pending_bytes > 0
    rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}, epoch=2))
    assert rig.machine.group_state(GROUP) is GroupState.ACTIVE and rig.machine.pending_bytes == 0
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.COLLECTING
    assert len(sent(rig.send("ep1", chunk(1, epoch=2)), None, Result)) == 2


def test_early_data_waits_for_assignment_then_times_out_as_unknown_group() -> None:
    rig = Rig()
    rig.register()
    rig.connect("ep0", "ep1")
    assert rig.send("ep0", chunk(0)) == []
    out = rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}))
    assert out == [] and rig.machine.slot_state(GROUP, 0, 0) is SlotState.COLLECTING
    assert rig.send("ep1", chunk(0, group=OTHER)) == []
    assert rig.send("ep1", chunk(0, group=OTHER, index=1)) == []
    expired = rig.timer(2.0)
    (abort,) = [m for m in sent(expired, "ep1", Abort) if m.group_id == OTHER]  # one per operation
    assert abort.code is ErrorCode.UNKNOWN_GROUP and abort.group_id == OTHER
    assert rig.machine.pending_bytes == 0


def test_pending_queue_is_bounded_per_peer() -> None:
    rig = Rig(AggregatorMachine(AggregatorConfig(address=ADDRESS, pending_limit=2)))
    rig.register()
    rig.connect("ep0", "ep1")
    rig.send("ep0", chunk(0, index=0))
    rig.send("ep0", chunk(0, index=1))
    assert errors(rig.send("ep0", chunk(0, op_id=1))) == [ErrorCode.RESOURCE_EXHAUSTED]
    assert rig.send("ep1", chunk(1)) == []  # another peer's queue is its own


def test_parent_loss_aborts_and_redials() -> None:
    rig, parent = leaf_rig()
    rig.send("ep0", chunk(0))
    out = rig.feed(PeerDisconnected(parent, ErrorCode.PEER_LOST))
    assert [m.code for m in sent(out, "ep0", Abort)] == [ErrorCode.PEER_LOST]
    assert rig.machine.group_state(GROUP) is GroupState.CONNECTING
    redial = [c for c in rig.timer(1.0) if isinstance(c, ConnectTo)]
    assert len(redial) == 1 and redial[0].expected_node_id == "root"
    rig.feed(PeerConnected(redial[0].peer, "root", Role.AGGREGATOR))
    assert rig.machine.group_state(GROUP) is GroupState.ACTIVE


def test_malformed_input_and_stray_messages_get_typed_errors() -> None:
    rig = root_rig()
    out = rig.feed(MessageMalformed("ep0", CcoError(ErrorCode.MALFORMED_CBOR, "bad")))
    assert errors(out, "ep0") == [ErrorCode.MALFORMED_CBOR]
    assert ClosePeer("ep0", ErrorCode.MALFORMED_CBOR, "bad") in out  # a connection error
    rig.connect("ep0")
    assert errors(rig.send("ep0", AggregatorAccept(node_id="x", heartbeat_interval_ms=100))) == [
        ErrorCode.PROTOCOL_VIOLATION
    ]
    assert errors(rig.send("ep0", chunk(0, cls=Result))) == [ErrorCode.PROTOCOL_VIOLATION]
    assert errors(rig.send("nobody", chunk(0))) == [ErrorCode.UNAUTHORIZED]


def test_memory_is_window_times_chunk_not_tensor() -> None:
    rig = root_rig({"ep0": [0], "ep1": [1]})
    total = 4 * 1000  # 1000 chunks of 4 elements
    for index in range(1000):
        rig.send("ep0", chunk(0, index=index, total=total, values=[1 << 30] * 4))
        rig.send("ep1", chunk(1, index=index, total=total, values=[1 << 30] * 4))
    assert rig.machine.slot_bytes == 0
    assert rig.machine.peak_slot_bytes <= PARAMS.window * PARAMS.chunk_elements * 8


# --- the quorum policy: presence passes and decided members ------------------------------

WAIT = QUORUM_WAIT_MS / 1000


def test_a_presence_pass_at_the_root_completes_with_the_ranks_in_time_at_the_end_of_its_wait() -> None:
    rig = root_rig()
    assert rig.send("ep0", chunk(0, quorum=2)) == []
    assert rig.send("ep1", chunk(1, quorum=2)) == []
    assert rig.machine.next_deadline() == pytest.approx(WAIT)
    out = rig.timer(WAIT)
    for child in ("ep0", "ep1", "ep2"):  # the late rank gets the result too
        (result,) = sent(out, child, Result)
        assert ranks_from_bitmap(result.contributors) == {0, 1}
    late = rig.send("ep2", chunk(2, quorum=2))  # not counted: answered with the result
    assert [ranks_from_bitmap(m.contributors) for m in sent(late, "ep2", Result)] == [{0, 1}]
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.COMPLETE


def test_a_presence_pass_short_of_its_quorum_waits_for_more_then_fails_naming_them() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0, quorum=2))
    assert sent(rig.timer(WAIT), None, Result) == []  # 1 of a quorum of 2: wait on
    out = rig.send("ep1", chunk(1, quorum=2))  # the quorum, after the wait: at once
    assert [ranks_from_bitmap(m.contributors) for m in sent(out, "ep2", Result)] == [{0, 1}]
    rig2 = root_rig()
    rig2.send("ep0", chunk(0, quorum=3))
    rig2.send("ep1", chunk(1, quorum=3))
    rig2.timer(WAIT)
    out = rig2.timer(PARAMS.operation_timeout_ms / 1000)
    (abort,) = sent(out, "ep0", Abort)
    assert abort.code is ErrorCode.TIMEOUT and abort.missing == bitmap_from_ranks([2])


def test_a_presence_pass_with_every_rank_in_time_does_not_wait() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0, quorum=1))
    rig.send("ep1", chunk(1, quorum=1))
    out = rig.send("ep2", chunk(2, quorum=1))
    assert [ranks_from_bitmap(m.contributors) for m in sent(out, "ep0", Result)] == [{0, 1, 2}]


def test_below_the_root_a_presence_pass_goes_up_with_what_came_in_time() -> None:
    rig, parent = leaf_rig()
    rig.send("ep0", chunk(0, quorum=2))  # a quorum is the root's to judge
    (partial,) = sent(rig.timer(WAIT), parent, PartialAggregate)
    assert ranks_from_bitmap(partial.contributors) == {0} and partial.quorum == 2
    # late here is not necessarily late at the root, which may still lack its quorum:
    late = chunk(1, quorum=2)
    (up,) = sent(rig.send("ep1", late), parent, PartialAggregate)
    assert ranks_from_bitmap(up.contributors) == {1} and up.payload == late.payload
    assert sent(rig.send("ep1", late), parent) == []  # a copy goes up once
    result = payload.combine([partial, up], Result)
    rig.feed(MessageReceived(parent, result))
    assert sent(rig.send("ep1", late), "ep1", Result) == [result]  # once the result is known


def test_the_root_takes_the_late_ranks_a_child_aggregator_sends_while_short_of_its_quorum() -> None:
    rig = Rig()
    rig.register()
    rig.connect("ep0")
    rig.connect("mid", role=Role.AGGREGATOR)
    rig.rendezvous(assignment({"ep0": [0], "mid": [1, 2]}))
    rig.send("mid", _retype(chunk(1, quorum=3), PartialAggregate))  # mid went on with rank 1
    assert sent(rig.timer(2 * WAIT), None, Result) == []  # 1 of 3 at the end of the waits
    assert sent(rig.send("ep0", chunk(0, quorum=3)), None, Result) == []
    again = rig.send("mid", _retype(chunk(1, quorum=3), PartialAggregate))
    assert errors(again) == [] and sent(again, None, Result) == []  # a copy: not counted twice
    out = rig.send("mid", _retype(chunk(2, quorum=3), PartialAggregate))  # rank 2, late at mid
    assert [ranks_from_bitmap(m.contributors) for m in sent(out, "ep0", Result)] == [{0, 1, 2}]


def test_a_presence_pass_waits_once_more_for_a_silent_child_aggregator() -> None:
    rig = Rig()
    rig.register()
    rig.connect("ep0")
    rig.connect("mid", role=Role.AGGREGATOR)
    rig.rendezvous(assignment({"ep0": [0], "mid": [1, 2]}))
    rig.send("ep0", chunk(0, quorum=1))
    assert sent(rig.timer(WAIT), None, Result) == []  # mid releases at the end of its own wait
    rig.now = 1.5 * WAIT  # mid's wait began later, and its rank 2 was late
    assert sent(rig.send("mid", _retype(chunk(1, quorum=1), PartialAggregate)), None, Result) == []
    out = rig.timer(2 * WAIT)
    assert [ranks_from_bitmap(m.contributors) for m in sent(out, "ep0", Result)] == [{0, 1}]


def _retype(message: ChunkMessage, cls: type[ChunkMessage]) -> ChunkMessage:
    return cls(**{f.name: getattr(message, f.name) for f in dataclasses.fields(message)})


def test_an_operation_over_decided_members_waits_for_those_only() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0, members=[0, 2]))
    out = rig.send("ep2", chunk(2, members=[0, 2]))
    for child in ("ep0", "ep1", "ep2"):
        (result,) = sent(out, child, Result)
        assert ranks_from_bitmap(result.contributors) == {0, 2}
        assert result.members == bitmap_from_ranks([0, 2])
    rig.send("ep0", chunk(0, op_id=1, members=[0, 2]))
    nudged = rig.timer(PARAMS.operation_timeout_ms / 2000)  # half the timeout: ask the silent
    assert {c.peer for c in nudged if isinstance(c, SendMessage)} == {"ep2"}
    (abort,) = sent(rig.timer(PARAMS.operation_timeout_ms / 1000), "ep0", Abort)
    assert abort.missing == bitmap_from_ranks([2])  # rank 1 is not a member of this operation


def test_children_that_disagree_on_the_members_abort_the_operation() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0, members=[0, 1]))
    out = rig.send("ep1", chunk(1, members=[0, 1, 2]))
    assert [m.code for m in sent(out, "ep0", Abort)] == [ErrorCode.OPERATION_MISMATCH]


# --- every (state, input) pair ---------------------------------------------------------


def _node_in(state: NodeState) -> Rig:
    rig = Rig()
    if state is not NodeState.DETACHED:
        rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    if state is NodeState.REGISTERED:
        rig.rendezvous(AggregatorAccept(node_id="agg", heartbeat_interval_ms=100))
    assert rig.machine.state is state
    return rig


_NODE_INPUTS: dict[str, Callable[[Rig, int], Input]] = {
    states.RENDEZVOUS_CONNECTED: lambda rig, n: PeerConnected(f"rv{n}", "rendezvous", Role.RENDEZVOUS),
    "AggregatorAccept": lambda rig, n: MessageReceived(
        "rv", AggregatorAccept(node_id=f"a{n}", heartbeat_interval_ms=100)
    ),
    "Heartbeat": lambda rig, n: MessageReceived("rv", Heartbeat(seq=n)),
    "TreeAssignment": lambda rig, n: MessageReceived("rv", assignment({"ep0": [0]}, epoch=n + 1)),
    "EpochChange": lambda rig, n: MessageReceived(
        "rv", EpochChange(group_id=GROUP, epoch=n + 2, members=b"\x01", code=ErrorCode.NO_ERROR)
    ),
    "Error": lambda rig, n: MessageReceived("rv", Error(code=ErrorCode.UNAUTHORIZED, detail=f"no {n}")),
    states.RENDEZVOUS_LOST: lambda rig, n: PeerDisconnected("rv", ErrorCode.PEER_LOST),
}


def _refused_or_ignored(out: list[Command]) -> bool:
    """A disallowed input gets a typed refusal or, for a connection event, nothing."""
    codes = errors(out) + [c.code for c in out if isinstance(c, ClosePeer)]
    return (not out) or (
        bool(codes) and all(isinstance(c, ErrorCode) and c is not ErrorCode.NO_ERROR for c in codes)
    )


@pytest.mark.parametrize("state", list(NodeState))
@pytest.mark.parametrize("event", NODE_TABLE.events)
def test_node_table_every_pair(state: NodeState, event: str) -> None:
    _drive_node(state, event, 0)


@given(st.sampled_from(list(NodeState)), st.sampled_from(NODE_TABLE.events), st.integers(0, 1000))
@settings(max_examples=100, deadline=None)
def test_node_table_hypothesis(state: NodeState, event: str, n: int) -> None:
    _drive_node(state, event, n)


def _drive_node(state: NodeState, event: str, n: int) -> None:
    rig = _node_in(state)
    out = rig.feed(_NODE_INPUTS[event](rig, n))
    if NODE_TABLE.allows(state, event):
        assert rig.machine.state is NODE_TABLE.next(state, event)
    else:
        assert rig.machine.state is state
        assert _refused_or_ignored(out)


# group table: a rig in each group state, and the input realising each event


@dataclass
class GroupRig:
    rig: Rig
    parent: str | None  # our connection to the parent, when one exists or is being dialled
    parent_up: bool


def _group_in(state: GroupState, root: bool) -> GroupRig:
    rig = Rig()
    rig.register()
    rig.connect("ep0", "ep1", "root", "root2")
    if state is GroupState.UNKNOWN:
        return GroupRig(rig, None, False)
    if root and state is GroupState.ACTIVE:
        rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}))
        return GroupRig(rig, None, False)
    out = rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}, parent=PARENT))
    (dial,) = [c for c in out if isinstance(c, ConnectTo)]
    up = state is GroupState.ACTIVE or (state is GroupState.STALE and not root)
    if up:
        rig.feed(PeerConnected(dial.peer, "root", Role.AGGREGATOR))
    if state is GroupState.STALE:
        rig.rendezvous(EpochChange(group_id=GROUP, epoch=2, members=b"\x03", code=ErrorCode.NO_ERROR))
    assert rig.machine.group_state(GROUP) is state
    return GroupRig(rig, dial.peer, up)


def _group_input(g: GroupRig, event: str) -> list[Input]:
    """Inputs realising ``event``; all but the last only prepare it."""
    rig = g.rig
    epoch = rig.machine.group_epoch(GROUP) or 1
    if event == states.CHUNK_UP:
        return [MessageReceived("ep0", chunk(0, epoch=epoch))]
    if event == states.CHUNK_DOWN:
        result = payload.combine([chunk(0, epoch=epoch), chunk(1, epoch=epoch)], Result)
        return [MessageReceived(g.parent if g.parent_up and g.parent else "root", result)]
    if event == states.ASSIGNED_ROOT:
        return [MessageReceived("rv", assignment({"ep0": [0], "ep1": [1]}, epoch=epoch + 1))]
    if event == states.ASSIGNED_CONNECTED:
        return [MessageReceived("rv", assignment({"ep0": [0], "ep1": [1]}, epoch=epoch + 1, parent=PARENT))]
    if event == states.ASSIGNED_CONNECT:
        return [MessageReceived("rv", assignment({"ep0": [0], "ep1": [1]}, epoch=epoch + 1, parent=PARENT2))]
    if event == states.PARENT_CONNECTED:
        return [PeerConnected(g.parent or "root3", "root", Role.AGGREGATOR)]
    if event == states.PARENT_LOST:
        return [PeerDisconnected(g.parent or "root3", ErrorCode.PEER_LOST)]
    if event == states.PARENT_RETRY:
        prepare: list[Input] = []
        if g.parent and not g.parent_up:
            prepare.append(PeerDisconnected(g.parent, ErrorCode.PEER_LOST))  # the dial failed
        return [*prepare, TimerFired()]
    if event == states.SLOT_TIMEOUT:
        return [MessageReceived("ep0", chunk(0, epoch=epoch)), TimerFired()]
    if event == states.UNCONFIRMED:  # the rendezvous lost, and its grace over
        return [PeerDisconnected("rv", ErrorCode.PEER_LOST), TimerFired()]
    if event == "EpochChange":
        return [
            MessageReceived(
                "rv", EpochChange(group_id=GROUP, epoch=epoch + 1, members=b"\x03", code=ErrorCode.PEER_LOST)
            )
        ]
    raise AssertionError(event)


def _realised(g: GroupRig, event: str) -> str | None:
    """The group event the input for ``event`` really is in this rig (None: no group event).

    Some events need a situation the state does not have (a connected parent, a
    dial in progress); their input then is the nearest thing a peer could send.
    """
    if event == states.ASSIGNED_CONNECTED and not g.parent_up:
        return states.ASSIGNED_CONNECT
    possible = {
        states.CHUNK_DOWN: g.parent_up,
        states.PARENT_CONNECTED: g.parent is not None and not g.parent_up,
        states.PARENT_LOST: g.parent is not None,
        states.PARENT_RETRY: g.parent is not None and not g.parent_up,
    }.get(event, True)
    return event if possible else None


def _drive_group(state: GroupState, event: str, root: bool) -> None:
    g = _group_in(state, root)
    inputs = _group_input(g, event)
    for prepare in inputs[:-1]:
        g.rig.feed(prepare)
    before = g.rig.machine.group_state(GROUP)
    if isinstance(inputs[-1], TimerFired):
        deadline = g.rig.machine.next_deadline()
        g.rig.now = max(g.rig.now, deadline if deadline is not None else g.rig.now) + (
            1.0 if event == states.SLOT_TIMEOUT else 0.0
        )
        if event == states.UNCONFIRMED:
            g.rig.now += g.rig.machine.config.rendezvous_grace
    out = g.rig.feed(inputs[-1])
    after = g.rig.machine.group_state(GROUP)
    assert isinstance(after, GroupState)
    actual = _realised(g, event)
    if actual is not None and GROUP_TABLE.allows(before, actual):
        assert after is GROUP_TABLE.next(before, actual), (before, actual, after)
    else:
        assert after is before, (before, event, after)
        assert _refused_or_ignored([c for c in out if isinstance(c, ClosePeer) or sent([c], None, Error)])


@pytest.mark.parametrize("state", list(GroupState))
@pytest.mark.parametrize("event", GROUP_TABLE.events)
@pytest.mark.parametrize("root", [False, True])
def test_group_table_every_pair(state: GroupState, event: str, root: bool) -> None:
    _drive_group(state, event, root)


@given(st.sampled_from(list(GroupState)), st.sampled_from(GROUP_TABLE.events), st.booleans())
@settings(max_examples=100, deadline=None)
def test_group_table_hypothesis(state: GroupState, event: str, root: bool) -> None:
    _drive_group(state, event, root)


def test_group_table_moves_are_all_realised() -> None:
    """Every move the table allows is driven, not approximated, by some rig above."""
    seen = {
        (state, event)
        for state in GroupState
        for root in (False, True)
        for event in GROUP_TABLE.events
        if _realised(_group_in(state, root), event) == event
    }
    allowed = {(s, e) for s, moves in GROUP_TABLE.table.items() for e in moves}
    assert allowed <= seen, allowed - seen


# slot table


def _slot_rig() -> tuple[Rig, str]:
    """A non-root aggregator with children ep0..ep2 and its parent connected."""
    rig = Rig()
    rig.register()
    rig.connect("ep0", "ep1", "ep2")
    out = rig.rendezvous(assignment({"ep0": [0], "ep1": [1], "ep2": [2]}, parent=PARENT))
    (dial,) = [c for c in out if isinstance(c, ConnectTo)]
    rig.feed(PeerConnected(dial.peer, "root", Role.AGGREGATOR))
    return rig, dial.peer


_QUORUM_EVENTS = (states.WAIT_OVER, states.LATE_PART)


def _slot_in(state: SlotState, quorum: bool = False) -> tuple[Rig, str]:
    """Slot rig whose slot (op 0, chunk 0) is in ``state``; with ``quorum`` the slot is
    a presence pass (quorum 1), completed at the end of its wait without ep2."""
    rig, parent = _slot_rig()
    q = 1 if quorum else None
    rig.send("ep0", chunk(0, quorum=q))
    if state is not SlotState.COLLECTING:
        rig.send("ep1", chunk(1, quorum=q))
    if state is SlotState.COMPLETE:
        if quorum:
            rig.timer(QUORUM_WAIT_MS / 1000)
        else:
            rig.send("ep2", chunk(2))
    if state is SlotState.ABORTED:
        if quorum:
            rig.send("ep2", Abort(group_id=GROUP, epoch=1, op_id=0, code=ErrorCode.TIMEOUT, detail="late"))
        else:
            rig.timer(rig.now + 5)
    assert rig.machine.slot_state(GROUP, 0, 0) is state
    return rig, parent


def _slot_steps(state: SlotState, event: str) -> list[tuple[str, Message | float]]:
    """Inputs for ``event``: all but the last prepare it; a number is a timer at that time."""
    other = {"ep1": chunk(1, values=[8] * 4), "ep2": chunk(2, values=[9] * 4)}
    if event == states.PART:
        return (
            [("ep1", other["ep1"] if state is SlotState.COMPLETE else chunk(1))]
            if state is not (SlotState.ABORTED)
            else [("ep2", chunk(2))]
        )
    if event == states.LAST_PART:
        if state is SlotState.COLLECTING:
            return [("ep1", chunk(1)), ("ep2", chunk(2))]
        return [("ep2", other["ep2"] if state is SlotState.COMPLETE else chunk(2))]
    if event == states.RETRANSMISSION:
        return [("ep0", chunk(0))]
    if event == states.CONFLICT:
        return [("ep0", chunk(0, values=[7] * 4))]
    if event == states.TIMEOUT:
        return [("timer", 5.0)]
    if event == states.HALF_TIMEOUT:
        return [("timer", PARAMS.operation_timeout_ms / 2000)]
    if event == states.ASKED_AGAIN:
        request = RetransmitRequest(group_id=GROUP, epoch=1, op_id=0, chunks=(0,))
        return [("parent", request)]
    if event == states.WAIT_OVER:
        return [("timer", QUORUM_WAIT_MS / 1000)]
    if event == states.LATE_PART:
        return [("ep2", chunk(2, quorum=1))]
    assert event == states.ABORT
    return [("ep2", Abort(group_id=GROUP, epoch=1, op_id=0, code=ErrorCode.TIMEOUT, detail="late"))]


def _realised_slot(state: SlotState, event: str) -> str:
    """The slot event the inputs above really are: every child of a complete slot has
    sent, so a 'new' part there is a conflicting copy; an aborted slot here misses one
    child only, so any part would be its last."""
    if state is SlotState.COMPLETE and event in (states.PART, states.LAST_PART):
        return states.CONFLICT
    if state is SlotState.ABORTED and event == states.PART:
        return states.LAST_PART
    if event == states.LATE_PART and state is not SlotState.COMPLETE:
        return states.PART  # only a released slot has late parts
    return event


_SLOT_EVENTS = [*SLOT_TABLE.events, states.CONFLICT]


@pytest.mark.parametrize("state", list(SlotState))
@pytest.mark.parametrize("event", _SLOT_EVENTS)
def test_slot_table_every_pair(state: SlotState, event: str) -> None:
    _drive_slot(state, event)


@given(st.sampled_from(list(SlotState)), st.sampled_from(_SLOT_EVENTS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_slot_table_hypothesis(state: SlotState, event: str) -> None:
    _drive_slot(state, event)


def _drive_slot(state: SlotState, event: str) -> None:
    rig, parent = _slot_in(state, quorum=event in _QUORUM_EVENTS)
    steps = _slot_steps(state, event)
    for peer, message in steps[:-1]:
        assert isinstance(message, Message)
        rig.send(peer, message)
    before = rig.machine.slot_state(GROUP, 0, 0)
    assert before is not None
    peer, message = steps[-1]
    if isinstance(message, float):
        out = rig.timer(max(rig.now, message))
    else:
        out = rig.send(parent if peer == "parent" else peer, message)
    after = rig.machine.slot_state(GROUP, 0, 0)
    assert isinstance(after, SlotState)
    actual = _realised_slot(before, event)
    if SLOT_TABLE.allows(before, actual):
        assert after is SLOT_TABLE.next(before, actual)
    else:
        assert after is before
        assert errors(out) == ([ErrorCode.DUPLICATE_CONTRIBUTION] if isinstance(message, Message) else [])


def test_slot_table_moves_are_all_realised() -> None:
    allowed = {(s, e) for s, moves in SLOT_TABLE.table.items() for e in moves}
    seen = {(s, e) for s in SlotState for e in _SLOT_EVENTS if _realised_slot(s, e) == e}
    # ABORTED --part--> ABORTED is stated for a slot missing several children; the rig
    # above misses one, so check that case directly.
    rig, _ = _slot_rig()
    rig.send("ep0", chunk(0))
    rig.timer(rig.now + 5)
    assert rig.send("ep1", chunk(1)) == [] and rig.machine.slot_state(GROUP, 0, 0) is SlotState.ABORTED
    seen.add((SlotState.ABORTED, states.PART))
    assert allowed <= seen, allowed - seen


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["ep0", "ep1", "ep2", "stranger"]),
            st.integers(0, 2),
            st.integers(0, 1),
            st.booleans(),
        ),
        max_size=25,
    ),
    st.randoms(use_true_random=False),
)
@settings(max_examples=60, deadline=None)
def test_random_arrivals_never_double_count(arrivals: list[tuple[str, int, int, bool]], rnd: object) -> None:
    """Any interleaving of (re)transmissions, strangers and conflicting copies: each
    completed slot's Result is exactly the sum of the first chunk taken from each child."""
    rig = root_rig()
    rig.connect("stranger")
    taken: dict[tuple[int, str], int] = {}
    results: dict[int, list[int]] = {}
    for peer, index, op_id, variant in arrivals:
        rank = {"ep0": 0, "ep1": 1, "ep2": 2, "stranger": 0}[peer]
        value = rank + 1 + (10 if variant else 0)
        out = rig.send(peer, chunk(rank, op_id=op_id, index=index % 2, values=[value] * 4))
        key = (op_id * 2 + index % 2, peer)
        if peer != "stranger" and not errors(out) and key not in taken:
            taken[key] = value
        for message in sent(out, "ep0", Result):
            results[message.op_id * 2 + message.chunk_index] = payload.open_verified(
                KEYS[GROUP], message, frozenset({0, 1, 2})
            ).tolist()
        assert rig.machine.open_slots(GROUP) <= PARAMS.window
    for slot, values in results.items():
        expected = sum(v for (s, _), v in taken.items() if s == slot)
        assert values == [expected] * 4


# --- resource bounds (issue 11: each fails when its enforcement is removed) ---------


def test_assignment_with_more_children_than_max_fan_in_is_refused() -> None:
    """The aggregator's own max_fan_in caps its children, whatever the rendezvous says."""
    rig = Rig(AggregatorMachine(AggregatorConfig(address=ADDRESS, max_fan_in=2)))
    rig.register()
    rig.connect("ep0", "ep1", "ep2")
    out = rig.rendezvous(assignment({"ep0": [0], "ep1": [1], "ep2": [2]}))
    (error,) = sent(out, "rv", Error)
    assert error.code is ErrorCode.RESOURCE_EXHAUSTED and "max_fan_in" in error.detail
    assert rig.machine.group_state(GROUP) is GroupState.UNKNOWN
    # Exactly max_fan_in children is within the bound.
    assert errors(rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}))) == []
    assert rig.machine.group_state(GROUP) is GroupState.ACTIVE


def test_remembered_chunk_fingerprints_are_bounded_by_record_limit() -> None:
    """Completed slots are remembered (to recognise late retransmissions) only up to
    ``record_limit`` per group, oldest forgotten first: the aggregator's memory stays
    bounded however many operations a group runs."""
    rig = Rig(AggregatorMachine(AggregatorConfig(address=ADDRESS, record_limit=2)))
    rig.register()
    rig.connect("ep0", "ep1")
    rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}))
    for op_id in range(3):
        rig.send("ep0", chunk(0, op_id=op_id, total=4))
        assert len(sent(rig.send("ep1", chunk(1, op_id=op_id, total=4)), None, Result)) == 2
    assert rig.machine.slot_state(GROUP, 0, 0) is None, "the oldest record is forgotten"
    assert rig.machine.slot_state(GROUP, 1, 0) is SlotState.COMPLETE
    assert rig.machine.slot_state(GROUP, 2, 0) is SlotState.COMPLETE
    # A late copy of a remembered chunk is still recognised (and answered with its kept
    # Result); one of a forgotten chunk opens a fresh slot (which will time out):
    # nothing is counted twice either way.
    assert [m.op_id for m in sent(rig.send("ep0", chunk(0, op_id=2, total=4)), "ep0")] == [2]
    assert rig.machine.open_slots(GROUP) == 0
    assert rig.send("ep0", chunk(0, op_id=0, total=4)) == []
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.COLLECTING


def test_remembered_aborted_operations_are_bounded_by_record_limit() -> None:
    rig = Rig(AggregatorMachine(AggregatorConfig(address=ADDRESS, record_limit=2)))
    rig.register()
    rig.connect("ep0", "ep1")
    rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}))
    for op_id in range(3):
        abort = Abort(group_id=GROUP, epoch=1, op_id=op_id, code=ErrorCode.TIMEOUT, detail="gave up")
        assert sent(rig.send("ep0", abort), "ep1", Abort)
    assert rig.machine.slot_state(GROUP, 0, 0) is None, "the oldest aborted operation is forgotten"
    assert rig.machine.slot_state(GROUP, 1, 0) is SlotState.ABORTED
    assert rig.machine.slot_state(GROUP, 2, 0) is SlotState.ABORTED


def _float_chunk(rank: int, block_elements: int, values: list[int]) -> ChunkMessage:
    """Rank ``rank``'s block-scaled float32 SUM chunk (one block, scale 0)."""
    header = payload.ChunkHeader(
        group_id=GROUP,
        epoch=1,
        op_id=0,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.FLOAT32,
        total_elements=len(values),
        chunk_elements=PARAMS.chunk_elements,
        chunk_index=0,
        width=4,
        block_elements=block_elements,
        scales=bytes(2),
    )
    return payload.seal(KEYS[GROUP], header, rank, np.array([*values, 1], dtype=np.int64))


def test_block_scaled_chunks_must_use_the_groups_block_size() -> None:
    rig = root_rig()
    wrong = _float_chunk(0, PARAMS.block_elements * 2, [1, 2])
    assert errors(rig.send("ep0", wrong), "ep0") == [ErrorCode.OPERATION_MISMATCH]
    assert rig.machine.open_slots(GROUP) == 0
    right = [_float_chunk(r, PARAMS.block_elements, [r, r]) for r in range(3)]
    out = [c for r, part in enumerate(right) for c in rig.send(f"ep{r}", part)]
    (result,) = sent(out, "ep0", Result)
    assert result.width == 4 and unpack(result.payload, 4).tolist() == [3, 3, 3]  # two sums, 3 attestations


def test_a_bad_first_part_is_refused_to_the_child_that_sent_it() -> None:
    """The first part of a slot is kept as it is, so it is checked on arrival: a
    missing tag is refused to its sender, and the honest children still complete."""
    rig = root_rig()
    untagged = dataclasses.replace(chunk(0), tag=None)
    assert errors(rig.send("ep0", untagged), "ep0") == [ErrorCode.INVALID_FIELD]
    assert rig.machine.open_slots(GROUP) == 0
    rig.send("ep0", chunk(0))
    rig.send("ep1", chunk(1))
    assert len(sent(rig.send("ep2", chunk(2)), None, Result)) == 3


# --- refusals found unasserted by scripts/mutate.py -----------------------------------


def test_registration_refused_by_the_rendezvous_detaches_and_says_why() -> None:
    rig = Rig()
    rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    out = rig.rendezvous(Error(code=ErrorCode.UNAUTHORIZED, detail="agg is already connected"))
    assert out == [ClosePeer("rv", ErrorCode.UNAUTHORIZED, "registration refused")]
    assert rig.machine.state is NodeState.DETACHED
    assert rig.machine.refusal is not None and rig.machine.refusal.code is ErrorCode.UNAUTHORIZED
    assert "already connected" in rig.machine.refusal.detail


def test_an_error_report_after_registration_changes_nothing() -> None:
    rig = root_rig()
    assert rig.rendezvous(Error(code=ErrorCode.INVALID_FIELD, detail="a report")) == []
    assert rig.machine.state is NodeState.REGISTERED and rig.machine.refusal is None
    assert rig.machine.group_state(GROUP) is GroupState.ACTIVE


def test_losing_the_rendezvous_connection_does_not_close_it_again() -> None:
    rig = root_rig()
    out = rig.feed(PeerDisconnected("rv", ErrorCode.PEER_LOST))
    assert not [c for c in out if isinstance(c, ClosePeer) and c.peer == "rv"]


def test_assignment_for_an_older_epoch_is_stale() -> None:
    rig = root_rig()
    rig.rendezvous(assignment({"ep0": [0], "ep1": [1], "ep2": [2]}, epoch=3))
    assert errors(rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}, epoch=2))) == [ErrorCode.STALE_EPOCH]
    assert rig.machine.group_epoch(GROUP) == 3
    assert errors(rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}, epoch=3))) == []  # same epoch: fine


@pytest.mark.parametrize(
    ("children", "expected"),
    [
        ({"ep0": [0, 1], "ep1": [1, 2]}, [0, 1, 2]),  # overlapping, though the union is right
        ({"ep0": [0, 1], "ep1": []}, [0, 1]),  # a child with no rank
        ({"ep0": [0], "ep1": [1]}, [0, 1, 2]),  # rank 2 reaches no child
        ({"ep0": [0], "ep1": [1, 2]}, [0, 1]),  # rank 2 is not expected
        ({}, []),  # no child at all
    ],
    ids=["overlap", "empty-child", "missing", "unexpected", "no-children"],
)
def test_children_must_partition_expected(children: dict[str, list[int]], expected: list[int]) -> None:
    rig = Rig()
    rig.register()
    bad = TreeAssignment(
        group_id=GROUP,
        epoch=1,
        world_size=4,
        expected=bitmap_from_ranks(expected),
        children=tuple(ref(n, rs) for n, rs in children.items()),
        params=PARAMS,
    )
    assert errors(rig.rendezvous(bad)) == [ErrorCode.INVALID_FIELD]
    assert rig.machine.group_state(GROUP) is GroupState.UNKNOWN


def test_assignment_for_a_newer_epoch_aborts_what_the_old_epoch_left_open() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0, op_id=0, total=4))
    rig.send("ep1", chunk(1, op_id=0, total=4))
    assert len(sent(rig.send("ep2", chunk(2, op_id=0, total=4)), None, Result)) == 3
    rig.send("ep0", chunk(0, op_id=1, total=4))
    children = {"ep0": [0], "ep1": [1], "ep2": [2]}
    # The same epoch again (e.g. a repeated assignment) keeps everything.
    assert sent(rig.rendezvous(assignment(children)), None, Abort) == []
    assert rig.machine.slot_state(GROUP, 1, 0) is SlotState.COLLECTING
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.COMPLETE
    # A newer epoch, announced by its assignment alone: the open slot is aborted, the
    # old epoch's records are forgotten.
    out = rig.rendezvous(assignment(children, epoch=2))
    aborts = sent(out, None, Abort)
    assert {a.code for a in aborts} == {ErrorCode.STALE_EPOCH} and {a.op_id for a in aborts} == {1}
    assert rig.machine.open_slots(GROUP) == 0
    assert rig.machine.slot_state(GROUP, 0, 0) is None and rig.machine.slot_state(GROUP, 1, 0) is None


def test_broadcast_data_must_come_from_its_root_alone() -> None:
    rig = Rig()
    rig.register()
    rig.connect("ep0")
    rig.connect("sub", role=Role.AGGREGATOR)
    rig.rendezvous(assignment({"ep0": [0], "sub": [1, 2]}))
    data = chunk(1, cls=BroadcastData, kind=Collective.BROADCAST, root=1)
    widened = dataclasses.replace(data, contributors=bitmap_from_ranks([1, 2]))
    assert errors(rig.send("sub", widened), "sub") == [ErrorCode.UNAUTHORIZED]
    assert sent(rig.send("sub", data), "ep0") == [data]


def test_parked_data_expires_oldest_first_after_pending_timeout_not_before() -> None:
    rig = Rig()  # pending_timeout 2 s
    rig.register()
    rig.connect("ep0")
    rig.send("ep0", chunk(0, group=OTHER, op_id=0))  # no assignment for OTHER: parked at 0.0
    rig.now = 1.5
    rig.send("ep0", chunk(0, group=OTHER, op_id=1))  # parked at 1.5
    assert sent(rig.timer(1.9), None, Abort) == []
    assert [a.op_id for a in sent(rig.timer(2.0), "ep0", Abort)] == [0]
    assert rig.machine.pending_bytes > 0
    assert [a.op_id for a in sent(rig.timer(3.5), "ep0", Abort)] == [1]
    assert rig.machine.pending_bytes == 0


def test_data_held_for_a_child_that_never_connects_is_dropped_after_pending_timeout() -> None:
    rig = Rig()  # pending_timeout 2 s
    rig.register()
    rig.connect("ep1")
    rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}))
    first = chunk(1, cls=BroadcastData, kind=Collective.BROADCAST, root=1, op_id=0)
    second = chunk(1, cls=BroadcastData, kind=Collective.BROADCAST, root=1, op_id=1)
    rig.send("ep1", first)  # held for ep0 at 0.0
    rig.now = 1.5
    rig.send("ep1", second)  # held for ep0 at 1.5
    rig.timer(1.9)
    assert rig.machine.pending_bytes == len(first.payload) + len(second.payload)
    rig.timer(2.0)
    assert rig.machine.pending_bytes == len(second.payload), "the older one is dropped first"
    rig.timer(3.5)
    assert rig.machine.pending_bytes == 0
    assert rig.feed(PeerConnected("ep0", "ep0", Role.ENDPOINT)) == [], "nothing stale is delivered"


def test_a_released_presence_pass_is_not_reopened_when_asked_again() -> None:
    rig, parent = leaf_rig()
    rig.send("ep0", chunk(0, quorum=2))
    assert len(sent(rig.timer(WAIT), parent, PartialAggregate)) == 1
    asked = RetransmitRequest(group_id=GROUP, epoch=1, op_id=0, chunks=(0,))
    assert rig.feed(MessageReceived(parent, asked)) == []  # no child is asked; nothing goes up again
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.COMPLETE
