"""Every (state, input) pair of the aggregator's three transition tables."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from aggregator_rig import (
    GROUP,
    PARAMS,
    PARENT,
    PARENT2,
    QUORUM_WAIT_MS,
    Rig,
    assignment,
    chunk,
    errors,
    sent,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from cco.nodes.aggregator_states import (
    GROUP_TABLE,
    NODE_TABLE,
    SLOT_TABLE,
    GroupEvent,
    GroupState,
    NodeEvent,
    NodeState,
    SlotEvent,
    SlotState,
)
from cco.nodes.events import (
    ClosePeer,
    Command,
    ConnectTo,
    Input,
    MessageReceived,
    PeerConnected,
    PeerDisconnected,
    TimerFired,
)
from cco.wire import payload
from cco.wire.errors import ErrorCode
from cco.wire.messages import (
    Abort,
    AggregatorAccept,
    EpochChange,
    Error,
    Heartbeat,
    Message,
    Result,
    RetransmitRequest,
)
from cco.wire.registries import Role


def _node_in(state: NodeState) -> Rig:
    rig = Rig()
    if state is not NodeState.DETACHED:
        rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    if state is NodeState.REGISTERED:
        rig.rendezvous(AggregatorAccept(node_id="agg", heartbeat_interval_ms=100))
    assert rig.machine.state is state
    return rig


_NODE_INPUTS: dict[NodeEvent, Callable[[Rig, int], Input]] = {
    NodeEvent.RENDEZVOUS_CONNECTED: lambda rig, n: PeerConnected(f"rv{n}", "rendezvous", Role.RENDEZVOUS),
    NodeEvent.AGGREGATOR_ACCEPT: lambda rig, n: MessageReceived(
        "rv", AggregatorAccept(node_id=f"a{n}", heartbeat_interval_ms=100)
    ),
    NodeEvent.HEARTBEAT: lambda rig, n: MessageReceived("rv", Heartbeat(seq=n)),
    NodeEvent.TREE_ASSIGNMENT: lambda rig, n: MessageReceived("rv", assignment({"ep0": [0]}, epoch=n + 1)),
    NodeEvent.EPOCH_CHANGE: lambda rig, n: MessageReceived(
        "rv", EpochChange(group_id=GROUP, epoch=n + 2, members=b"\x01", code=ErrorCode.NO_ERROR)
    ),
    NodeEvent.ERROR: lambda rig, n: MessageReceived(
        "rv", Error(code=ErrorCode.UNAUTHORIZED, detail=f"no {n}")
    ),
    NodeEvent.RENDEZVOUS_LOST: lambda rig, n: PeerDisconnected("rv", ErrorCode.PEER_LOST),
}


def _refused_or_ignored(out: list[Command]) -> bool:
    """A disallowed input gets a typed refusal or, for a connection event, nothing."""
    codes = errors(out) + [c.code for c in out if isinstance(c, ClosePeer)]
    return (not out) or (
        bool(codes) and all(isinstance(c, ErrorCode) and c is not ErrorCode.NO_ERROR for c in codes)
    )


@pytest.mark.parametrize("state", list(NodeState))
@pytest.mark.parametrize("event", list(NodeEvent))
def test_node_table_every_pair(state: NodeState, event: NodeEvent) -> None:
    _drive_node(state, event, 0)


@given(st.sampled_from(list(NodeState)), st.sampled_from(list(NodeEvent)), st.integers(0, 1000))
@settings(max_examples=100, deadline=None)
def test_node_table_hypothesis(state: NodeState, event: NodeEvent, n: int) -> None:
    _drive_node(state, event, n)


def _drive_node(state: NodeState, event: NodeEvent, n: int) -> None:
    rig = _node_in(state)
    out = rig.feed(_NODE_INPUTS[event](rig, n))
    if NODE_TABLE.allows(state, event):
        assert rig.machine.state is NODE_TABLE.next(state, event)
    else:
        assert rig.machine.state is state
        assert _refused_or_ignored(out)


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


def _group_input(g: GroupRig, event: GroupEvent) -> list[Input]:
    """Inputs realising ``event``; all but the last only prepare it."""
    rig = g.rig
    epoch = rig.machine.group_epoch(GROUP) or 1
    if event == GroupEvent.CHUNK_UP:
        return [MessageReceived("ep0", chunk(0, epoch=epoch))]
    if event == GroupEvent.CHUNK_DOWN:
        result = payload.combine([chunk(0, epoch=epoch), chunk(1, epoch=epoch)], Result)
        return [MessageReceived(g.parent if g.parent_up and g.parent else "root", result)]
    if event == GroupEvent.ASSIGNED_ROOT:
        return [MessageReceived("rv", assignment({"ep0": [0], "ep1": [1]}, epoch=epoch + 1))]
    if event == GroupEvent.ASSIGNED_CONNECTED:
        return [MessageReceived("rv", assignment({"ep0": [0], "ep1": [1]}, epoch=epoch + 1, parent=PARENT))]
    if event == GroupEvent.ASSIGNED_CONNECT:
        return [MessageReceived("rv", assignment({"ep0": [0], "ep1": [1]}, epoch=epoch + 1, parent=PARENT2))]
    if event == GroupEvent.PARENT_CONNECTED:
        return [PeerConnected(g.parent or "root3", "root", Role.AGGREGATOR)]
    if event == GroupEvent.PARENT_LOST:
        return [PeerDisconnected(g.parent or "root3", ErrorCode.PEER_LOST)]
    if event == GroupEvent.PARENT_RETRY:
        prepare: list[Input] = []
        if g.parent and not g.parent_up:
            prepare.append(PeerDisconnected(g.parent, ErrorCode.PEER_LOST))  # the dial failed
        return [*prepare, TimerFired()]
    if event == GroupEvent.SLOT_TIMEOUT:
        return [MessageReceived("ep0", chunk(0, epoch=epoch)), TimerFired()]
    if event == GroupEvent.UNCONFIRMED:  # the rendezvous lost, and its grace over
        return [PeerDisconnected("rv", ErrorCode.PEER_LOST), TimerFired()]
    if event == GroupEvent.EPOCH_CHANGE:
        return [
            MessageReceived(
                "rv", EpochChange(group_id=GROUP, epoch=epoch + 1, members=b"\x03", code=ErrorCode.PEER_LOST)
            )
        ]
    raise AssertionError(event)


def _realised(g: GroupRig, event: GroupEvent) -> GroupEvent | None:
    """The group event the input for ``event`` really is in this rig (None: no group event).

    Some events need a situation the state does not have (a connected parent, a
    dial in progress); their input then is the nearest thing a peer could send.
    """
    if event == GroupEvent.ASSIGNED_CONNECTED and not g.parent_up:
        return GroupEvent.ASSIGNED_CONNECT
    possible = {
        GroupEvent.CHUNK_DOWN: g.parent_up,
        GroupEvent.PARENT_CONNECTED: g.parent is not None and not g.parent_up,
        GroupEvent.PARENT_LOST: g.parent is not None,
        GroupEvent.PARENT_RETRY: g.parent is not None and not g.parent_up,
    }.get(event, True)
    return event if possible else None


def _drive_group(state: GroupState, event: GroupEvent, root: bool) -> None:
    g = _group_in(state, root)
    inputs = _group_input(g, event)
    for prepare in inputs[:-1]:
        g.rig.feed(prepare)
    before = g.rig.machine.group_state(GROUP)
    if isinstance(inputs[-1], TimerFired):
        deadline = g.rig.machine.next_deadline()
        g.rig.now = max(g.rig.now, deadline if deadline is not None else g.rig.now) + (
            1.0 if event == GroupEvent.SLOT_TIMEOUT else 0.0
        )
        if event == GroupEvent.UNCONFIRMED:
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
@pytest.mark.parametrize("event", list(GroupEvent))
@pytest.mark.parametrize("root", [False, True])
def test_group_table_every_pair(state: GroupState, event: GroupEvent, root: bool) -> None:
    _drive_group(state, event, root)


@given(st.sampled_from(list(GroupState)), st.sampled_from(list(GroupEvent)), st.booleans())
@settings(max_examples=100, deadline=None)
def test_group_table_hypothesis(state: GroupState, event: GroupEvent, root: bool) -> None:
    _drive_group(state, event, root)


def test_group_table_moves_are_all_realised() -> None:
    """Every move the table allows is driven, not approximated, by some rig above."""
    seen = {
        (state, event)
        for state in GroupState
        for root in (False, True)
        for event in GroupEvent
        if _realised(_group_in(state, root), event) == event
    }
    allowed = {(s, e) for s, moves in GROUP_TABLE.table.items() for e in moves}
    assert allowed <= seen, allowed - seen


# slot table: a rig in each slot state, and the input realising each event

HALF = PARAMS.operation_timeout_ms / 2000
TIMEOUT = PARAMS.operation_timeout_ms / 1000
_PARTS = (
    SlotEvent.PART,
    SlotEvent.LAST_PART,
    SlotEvent.RETRANSMISSION,
    SlotEvent.CONFLICT,
    SlotEvent.LATE_PART,
)


@dataclass
class SlotCase:
    """A slot (op 0, chunk 0) of a non-root aggregator with children ep0..ep2 brought to a
    state, the input for one event, and the slot events that input really is there."""

    rig: Rig
    parent: str
    final: Message | float  # a message from ``sender``, or a timer at that time
    sender: str
    realised: list[SlotEvent]


def _slot_rig(aggregator_child: bool) -> tuple[Rig, str]:
    """ep0 and ep1 are endpoints; ep2 an endpoint or, with ``aggregator_child``, an aggregator."""
    rig = Rig()
    rig.register()
    rig.connect("ep0", "ep1")
    rig.connect("ep2", role=Role.AGGREGATOR if aggregator_child else Role.ENDPOINT)
    out = rig.rendezvous(assignment({"ep0": [0], "ep1": [1], "ep2": [2]}, parent=PARENT))
    (dial,) = [c for c in out if isinstance(c, ConnectTo)]
    rig.feed(PeerConnected(dial.peer, "root", Role.AGGREGATOR))
    return rig, dial.peer


def _slot_case(state: SlotState, event: SlotEvent) -> SlotCase:
    # what the state needs, and what the event needs of the slot before it
    quorum = state is SlotState.RELEASED or event in (SlotEvent.WAIT_OVER, SlotEvent.LATE_PART)
    aggregator_child = state is SlotState.EXTENDED or event is SlotEvent.SILENT_CHILD
    wait_ms = {SlotState.NUDGED: 800, SlotState.EXTENDED: 600}.get(state, QUORUM_WAIT_MS)
    sent_first = [0, 1] if event in (SlotEvent.LAST_PART, SlotEvent.LATE_PART) else [0]
    if state is SlotState.COMPLETE:
        sent_first = [0, 1, 2]
    rig, parent = _slot_rig(aggregator_child)
    q = 1 if quorum else None

    def part(rank: int, value: int | None = None) -> Message:
        values = None if value is None else [value] * 4
        return chunk(rank, quorum=q, wait_ms=wait_ms, values=values)

    for rank in sent_first:
        rig.send(f"ep{rank}", part(rank))
    times = {
        SlotState.NUDGED: [HALF],
        SlotState.EXTENDED: sorted({HALF, TIMEOUT, *([wait_ms / 1000] if quorum else [])}),
        # a silent child aggregator makes the wait last once more as long
        SlotState.RELEASED: [wait_ms / 1000, *([2 * wait_ms / 1000] if aggregator_child else [])],
    }.get(state, [])
    for at in times:
        rig.timer(at)
    if state is SlotState.ABORTED:
        rig.send("ep2", Abort(group_id=GROUP, epoch=1, op_id=0, code=ErrorCode.TIMEOUT, detail="late"))
    assert rig.machine.slot_state(GROUP, 0, 0) is state, (state, event)

    collecting = state in (SlotState.COLLECTING, SlotState.NUDGED, SlotState.EXTENDED)
    timed = {SlotState.COLLECTING: [SlotEvent.HALF_TIMEOUT], SlotState.NUDGED: []}.get(state)
    final: Message | float
    sender, realised = "ep1", [event]
    if event in (SlotEvent.PART, SlotEvent.LAST_PART, SlotEvent.LATE_PART):
        rank = 2 if event is not SlotEvent.PART else 1
        sender, final = f"ep{rank}", part(rank, 9 if state is SlotState.COMPLETE else None)
        if state is SlotState.COMPLETE:
            realised = [SlotEvent.CONFLICT]
        elif state is SlotState.RELEASED:
            realised = [SlotEvent.LATE_PART]
        elif event is SlotEvent.LATE_PART:
            realised = [SlotEvent.LAST_PART]  # two parts in, not released: the third is the last
    elif event is SlotEvent.RETRANSMISSION:
        sender, final = "ep0", part(0)
    elif event is SlotEvent.CONFLICT:
        sender, final = "ep0", part(0, 7)
    elif event is SlotEvent.ASKED_AGAIN:
        sender, final = "parent", RetransmitRequest(group_id=GROUP, epoch=1, op_id=0, chunks=(0,))
    elif event is SlotEvent.ABORT:
        sender, final = "ep2", Abort(group_id=GROUP, epoch=1, op_id=0, code=ErrorCode.TIMEOUT, detail="late")
    elif event is SlotEvent.HALF_TIMEOUT:
        final, realised = HALF, ([SlotEvent.HALF_TIMEOUT] if state is SlotState.COLLECTING else [])
    elif event is SlotEvent.WAIT_OVER:
        final = 2 * wait_ms / 1000 if state is SlotState.EXTENDED else wait_ms / 1000
        realised = [SlotEvent.WAIT_OVER] if collecting else []
    elif event is SlotEvent.SILENT_CHILD:
        final = TIMEOUT
        realised = [] if timed is None else [*timed, SlotEvent.SILENT_CHILD]
    else:
        assert event is SlotEvent.TIMEOUT
        final = 1.5 * TIMEOUT if state is SlotState.EXTENDED else TIMEOUT
        realised = (
            [SlotEvent.TIMEOUT] if state is SlotState.EXTENDED else ([] if timed is None else [*timed, event])
        )
    return SlotCase(rig, parent, final, sender, realised)


def _drive_slot(state: SlotState, event: SlotEvent) -> set[tuple[SlotState, SlotEvent]]:
    """Drive one pair; the table moves it realised."""
    case = _slot_case(state, event)
    rig = case.rig
    if isinstance(case.final, float):
        out = rig.timer(max(rig.now, case.final))
    else:
        out = rig.send(case.parent if case.sender == "parent" else case.sender, case.final)
    after = rig.machine.slot_state(GROUP, 0, 0)
    assert isinstance(after, SlotState)
    expected, moved = state, set()
    for realised in case.realised:
        move = SLOT_TABLE.move(expected, realised)
        if move is None:
            break
        moved.add((expected, realised))
        expected = move.target
    assert after is expected, (state, event, case.realised, after)
    if len(case.realised) == 1 and not moved and not isinstance(case.final, float):
        refused = case.realised[0] in _PARTS
        assert errors(out) == ([ErrorCode.DUPLICATE_CONTRIBUTION] if refused else [])
    return moved


@pytest.mark.parametrize("state", list(SlotState))
@pytest.mark.parametrize("event", list(SlotEvent))
def test_slot_table_every_pair(state: SlotState, event: SlotEvent) -> None:
    _drive_slot(state, event)


def test_slot_table_moves_are_all_realised() -> None:
    """Every move the table allows is driven, not approximated, by some case above."""
    seen = set()
    for state in SlotState:
        for event in SlotEvent:
            seen |= _drive_slot(state, event)
    allowed = {(s, e) for s, moves in SLOT_TABLE.table.items() for e in moves}
    assert allowed <= seen, sorted((s.name, e.value) for s, e in allowed - seen)
