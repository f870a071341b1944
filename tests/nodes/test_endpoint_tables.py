"""Every (state, input) pair of the endpoint's session table, and random input
sequences through its operation table.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from endpoint_rig import (
    GROUP,
    KEYS,
    PARAMS,
    PARENT,
    PARENT2,
    QUORUM,
    RANK,
    WORLD,
    Rig,
    accept,
    int_header,
    int_request,
    joined,
    quorum_results,
    result_for,
    root_chunks,
    sent,
    tree,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from cco.nodes.calls import CollectiveRequest
from cco.nodes.endpoint_states import (
    DATA_MOVES,
    OPERATION_TABLE,
    SESSION_TABLE,
    OperationEvent,
    OperationState,
    SessionEvent,
    SessionState,
)
from cco.nodes.events import (
    ClosePeer,
    Command,
    ConnectTo,
    Input,
    MessageReceived,
    OperationCompleted,
    OperationFailed,
    PeerConnected,
    PeerDisconnected,
)
from cco.nodes.fsm import Move, TransitionTable
from cco.wire import payload
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import (
    Abort,
    ChunkAck,
    ChunkMessage,
    Contribution,
    EpochChange,
    Error,
    Heartbeat,
    JoinReject,
    RetransmitRequest,
)
from cco.wire.registries import Collective, DType, Role


def _session_in(state: SessionState) -> Rig:
    rig = Rig()
    if state is SessionState.IDLE:
        return rig
    rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    if state is SessionState.REJECTED:
        rig.rendezvous(JoinReject(group_id=GROUP, code=ErrorCode.GROUP_FULL, detail="full"))
    elif state is SessionState.ACCEPTED:
        rig.rendezvous(accept())
    elif state is SessionState.CONNECTING:
        rig.rendezvous(accept())
        (dial,) = rig.rendezvous(tree())
        assert isinstance(dial, ConnectTo)
        rig.parent = dial.peer
    elif state is not SessionState.JOINING:
        rig.join()
        assert rig.parent is not None
        if state is SessionState.REPLANNING:
            rig.rendezvous(EpochChange(group_id=GROUP, epoch=2, members=b"\x0f", code=ErrorCode.NO_ERROR))
        elif state is SessionState.RECONNECTING:
            rig.feed(PeerDisconnected(rig.parent, ErrorCode.PEER_LOST))
        elif state is SessionState.LEFT:
            rig.machine.leave(rig.now)
        elif state is SessionState.CLOSED:
            rig.feed(PeerDisconnected("rv", ErrorCode.PEER_LOST))
            rig.timer(rig.now + rig.machine.config.rendezvous_grace)
    assert rig.machine.state is state
    return rig


def _session_input(rig: Rig, event: SessionEvent, n: int) -> Input | Callable[[], list[Command]]:
    epoch = rig.machine.epoch
    parent = rig.parent or "nobody"
    own = payload.seal(KEYS, int_header(n, epoch, 1), RANK, np.zeros(1, dtype=np.int64))
    result = dataclasses.replace(result_for(own), tag=(n * 7919) % 1000)
    inputs: dict[SessionEvent, Input | Callable[[], list[Command]]] = {
        SessionEvent.RENDEZVOUS_CONNECTED: PeerConnected(f"rv{n}", "rendezvous", Role.RENDEZVOUS),
        SessionEvent.JOIN_ACCEPT: MessageReceived("rv", accept()),
        SessionEvent.JOIN_REJECT: MessageReceived(
            "rv", JoinReject(group_id=GROUP, code=ErrorCode.GROUP_FULL, detail="")
        ),
        SessionEvent.ERROR_RENDEZVOUS: MessageReceived(
            "rv", Error(code=ErrorCode.INTERNAL_ERROR, detail=str(n))
        ),
        SessionEvent.HEARTBEAT: MessageReceived("rv", Heartbeat(seq=n)),
        SessionEvent.RENDEZVOUS_LOST: PeerDisconnected("rv", ErrorCode.PEER_LOST),
        SessionEvent.RENDEZVOUS_GONE: lambda: [
            *rig.feed(PeerDisconnected("rv", ErrorCode.PEER_LOST)),
            *rig.timer(rig.now + rig.machine.config.rendezvous_grace),
        ],
        SessionEvent.LEAVE: lambda: rig.machine.leave(rig.now),
        SessionEvent.TREE_DIAL: MessageReceived("rv", tree(epoch=epoch, parent=PARENT2)),
        SessionEvent.TREE_CONNECTED: MessageReceived("rv", tree(epoch=epoch, parent=PARENT)),
        SessionEvent.PARENT_CONNECTED: PeerConnected(parent, "leaf", Role.AGGREGATOR),
        SessionEvent.PARENT_LOST: PeerDisconnected(parent, ErrorCode.PEER_LOST),
        SessionEvent.EPOCH_CHANGE: MessageReceived(
            "rv", EpochChange(group_id=GROUP, epoch=epoch + 1, members=b"\x0f", code=ErrorCode.NO_ERROR)
        ),
        SessionEvent.START: lambda: rig.start(CollectiveRequest(kind=Collective.BARRIER))[1],
        SessionEvent.RESULT: MessageReceived(parent, result),
        SessionEvent.BROADCAST_DATA: MessageReceived(
            parent, root_chunks(np.arange(3), op_id=n, epoch=epoch)[0]
        ),
        SessionEvent.ABORT: MessageReceived(
            parent, Abort(group_id=GROUP, epoch=epoch, op_id=n, code=ErrorCode.ABORTED, detail="")
        ),
        SessionEvent.ERROR_PARENT: MessageReceived(
            parent, Error(code=ErrorCode.RESOURCE_EXHAUSTED, detail="full")
        ),
        SessionEvent.RETRANSMIT_REQUEST: MessageReceived(
            parent, RetransmitRequest(group_id=GROUP, epoch=epoch, op_id=n, chunks=(0,))
        ),
        SessionEvent.CHUNK_ACK: MessageReceived(
            parent, ChunkAck(group_id=GROUP, epoch=epoch, op_id=n, chunks=(0,))
        ),
    }
    return inputs[event]


def _session_realised(rig: Rig, event: SessionEvent) -> SessionEvent:
    """TreeAssignment naming the current parent is a dial unless that parent is up."""
    up = rig.machine.state in (SessionState.READY, SessionState.REPLANNING)
    if event == SessionEvent.TREE_CONNECTED and not up:
        return SessionEvent.TREE_DIAL
    return event


def _drive_session(state: SessionState, event: SessionEvent, n: int) -> None:
    rig = _session_in(state)
    action = _session_input(rig, event, n)
    actual = _session_realised(rig, event)
    data_possible = (
        event not in (*DATA_MOVES, SessionEvent.PARENT_CONNECTED, SessionEvent.PARENT_LOST)
        or rig.parent is not None
    )
    if callable(action):
        try:
            out = action()
        except CcoError as error:
            assert not SESSION_TABLE.allows(state, event) and error.code is ErrorCode.PROTOCOL_VIOLATION
            assert rig.machine.state is state
            return
    else:
        out = rig.feed(action)
    after = rig.machine.state
    if SESSION_TABLE.allows(state, actual) and data_possible:
        assert after is SESSION_TABLE.next(state, actual), (state, actual, after)
    else:
        assert after is state, (state, event, after)
        refusals = [m.code for m in sent(out, None, Error)] + [
            c.code for c in out if isinstance(c, ClosePeer)
        ]
        assert not out or (refusals and ErrorCode.NO_ERROR not in refusals), out


@pytest.mark.parametrize("state", list(SessionState))
@pytest.mark.parametrize("event", list(SessionEvent))
def test_session_table_every_pair(state: SessionState, event: SessionEvent) -> None:
    _drive_session(state, event, 1)


@given(st.sampled_from(list(SessionState)), st.sampled_from(list(SessionEvent)), st.integers(0, 1 << 20))
@settings(max_examples=200, deadline=None)
def test_session_table_hypothesis(state: SessionState, event: SessionEvent, n: int) -> None:
    _drive_session(state, event, n)


def test_session_table_moves_are_all_realised() -> None:
    seen = {
        (state, event)
        for state in SessionState
        for event in SessionEvent
        if _session_realised(_session_in(state), event) == event
    }
    allowed = {(s, e) for s, moves in SESSION_TABLE.table.items() for e in moves}
    assert allowed <= seen, allowed - seen


_ACTIONS = [
    "start", "start_receiver", "result", "duplicate", "tampered", "forged", "retransmit", "abort", "deadline",
    "epoch", "parent", "member_lost", "late_quorum",
]  # fmt: skip


class _Recorder:
    """Wraps a table's ``fire`` to record every (state, event) it is asked for."""

    def __init__(self, table: TransitionTable[OperationState, OperationEvent, Any]) -> None:
        self.table = table
        self.seen: set[tuple[OperationState, OperationEvent]] = set()
        self._fire = table.fire

    def __call__(self, state: OperationState, event: OperationEvent) -> Move[OperationState, Any]:
        self.seen.add((state, event))
        return self._fire(state, event)


def _run_operations(
    script: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch | None = None
) -> set[tuple[OperationState, OperationEvent]]:
    recorder = _Recorder(OPERATION_TABLE)
    patch = monkeypatch or pytest.MonkeyPatch()
    patch.setattr(OPERATION_TABLE, "fire", recorder)
    try:
        rig = joined()
        sent_chunks: dict[tuple[int, int], ChunkMessage] = {}
        delivered: list[ChunkMessage] = []
        finished: set[int] = set()
        broadcast: dict[int, list[ChunkMessage]] = {}
        started: dict[int, np.ndarray] = {}
        for action, n in script:
            rig.rendezvous(Heartbeat(seq=n))  # the rendezvous stays alive however far time jumps
            states = {op: rig.machine.operation_state(op) for op in range(rig.machine.next_op_id)}
            out: list[Command] = []
            if action == "start" and rig.machine.state in (SessionState.READY, SessionState.REPLANNING):
                values = list(range(4 * (n % 4) + 1))
                op_id, out = rig.start(int_request(values))
                started[op_id] = np.array(values[:4], dtype=np.int64)
            elif action == "start_receiver" and rig.machine.state is SessionState.READY:
                op_id = rig.machine.next_op_id
                broadcast[op_id] = root_chunks(np.arange(n % 9, dtype=np.int64), op_id, rig.machine.epoch)
                _, out = rig.start(CollectiveRequest(kind=Collective.BROADCAST, root=0, dtype=DType.INT64))
            elif action == "result" and rig.parent and (pool := _deliverable(sent_chunks, broadcast)):
                key, message = pool[n % len(pool)]
                sent_chunks.pop(key, None)
                if key[0] in broadcast:
                    broadcast[key[0]].remove(message)
                delivered.append(message)
                out = rig.from_parent(message)
            elif action == "duplicate" and rig.parent and delivered:
                out = rig.from_parent(delivered[n % len(delivered)])
            elif action == "tampered" and rig.parent and sent_chunks:
                key = sorted(sent_chunks)[n % len(sent_chunks)]
                good = result_for(sent_chunks[key])
                out = rig.from_parent(dataclasses.replace(good, tag=(good.tag or 0) ^ 1))
            elif action == "forged" and rig.parent and started:
                op_id = sorted(started)[n % len(started)]
                header = int_header(op_id, rig.machine.epoch, 4 * (n % 4) + 1)
                own = payload.seal(KEYS, header, RANK, np.zeros(header.element_count, dtype=np.int64))
                good = result_for(own)
                out = rig.from_parent(dataclasses.replace(good, tag=(good.tag or 0) ^ 1))
            elif action == "retransmit" and rig.parent and sent_chunks:
                op_id, index = sorted(sent_chunks)[n % len(sent_chunks)]
                request = RetransmitRequest(
                    group_id=GROUP, epoch=rig.machine.epoch, op_id=op_id, chunks=(index,)
                )
                out = rig.from_parent(request)
                for again in sent(out, rig.parent, Contribution):
                    assert again == sent_chunks[(again.op_id, again.chunk_index)], "a copy is identical"
            elif action == "abort" and rig.parent:
                op_id = n % max(1, rig.machine.next_op_id)
                out = rig.from_parent(
                    Abort(
                        group_id=GROUP,
                        epoch=rig.machine.epoch,
                        op_id=op_id,
                        code=ErrorCode.ABORTED,
                        detail="",
                    )
                )
            elif action == "deadline":
                deadline = rig.machine.next_deadline()
                if deadline is not None:
                    out = rig.timer(deadline)
            elif action == "epoch" and rig.machine.state is SessionState.READY:
                epoch = rig.machine.epoch + 1
                out = rig.rendezvous(
                    EpochChange(group_id=GROUP, epoch=epoch, members=b"\x0f", code=ErrorCode.NO_ERROR)
                )
                out += rig.rendezvous(tree(epoch=epoch))
                sent_chunks.clear()
                broadcast.clear()
            elif action == "member_lost" and rig.machine.state is SessionState.READY:
                epoch = rig.machine.epoch + 1
                members = sorted(rig.machine.members - {(RANK + 1 + n % 3) % WORLD})
                change = EpochChange(
                    group_id=GROUP, epoch=epoch, members=bitmap_from_ranks(members), code=ErrorCode.PEER_LOST
                )
                out = rig.rendezvous(change)
                rig.machine.accept_membership()
                out += rig.rendezvous(tree(epoch=epoch))
                sent_chunks.clear()
                broadcast.clear()
            elif (
                action == "late_quorum"
                and rig.machine.state is SessionState.READY
                and len(rig.machine.accepted_members) > 1
            ):
                # the tree went on without this rank: both results may be there first
                op_id = rig.machine.next_op_id
                values = list(range(1 + n % 4))
                ranks = sorted(rig.machine.accepted_members - {RANK})
                presence, data = quorum_results(op_id, rig.machine.epoch, values, ranks)
                out = rig.from_parent(presence)
                out += rig.start(int_request(values, quorum=QUORUM))[1]
                broadcast[op_id + 1] = [data]
            elif action == "parent" and rig.parent and rig.machine.state is SessionState.READY:
                out = rig.feed(PeerDisconnected(rig.parent, ErrorCode.PEER_LOST))
                out += rig.timer(rig.now + 1.0)  # redials (and may pass an operation's deadline)
                redial = [c for c in out if isinstance(c, ConnectTo)]
                out += rig.feed(PeerConnected(redial[0].peer, "leaf", Role.AGGREGATOR))
                rig.parent = redial[0].peer
                sent_chunks.clear()
                broadcast.clear()
            for c in sent(out, None, Contribution):
                sent_chunks[(c.op_id, c.chunk_index)] = c
            assert rig.machine.outstanding <= PARAMS.window
            for c in out:
                if isinstance(c, OperationCompleted | OperationFailed):
                    assert c.op_id not in finished, "an operation finishes once"
                    finished.add(c.op_id)
            for op_id, before in states.items():
                now_state = rig.machine.operation_state(op_id)
                if before is not None and now_state is not None:
                    assert now_state in _reachable(before), (before, now_state)
                if before is not None and now_state is None:
                    assert op_id in finished
        return recorder.seen
    finally:
        if monkeypatch is None:
            patch.undo()


def _deliverable(
    sent_chunks: dict[tuple[int, int], ChunkMessage], broadcast: dict[int, list[ChunkMessage]]
) -> list[tuple[tuple[int, int], ChunkMessage]]:
    """What a correct tree could deliver now: results of sent chunks, the root's broadcast."""
    pool = [(k, result_for(c)) for k, c in sorted(sent_chunks.items())]
    return pool + [((op, c.chunk_index), c) for op, cs in sorted(broadcast.items()) for c in cs]


def _reachable(state: OperationState) -> set[OperationState]:
    seen = {state}
    frontier = [state]
    while frontier:
        for move in OPERATION_TABLE.table.get(frontier.pop(), {}).values():
            target = move.target
            if target not in seen:
                seen.add(target)
                frontier.append(target)
    return seen


@given(st.lists(st.tuples(st.sampled_from(_ACTIONS), st.integers(0, 1000)), max_size=40))
@settings(max_examples=150, deadline=None)
def test_operation_table_random_inputs(script: list[tuple[str, int]]) -> None:
    """Any sequence of results, duplicates, forgeries, aborts, deadlines and epoch
    changes moves operations only along the table, and finishes each exactly once."""
    _run_operations(script)


def test_operation_table_moves_are_all_exercised(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded random scripts, as many as it takes, reach every move of the table."""
    allowed = {(s, e) for s, moves in OPERATION_TABLE.table.items() for e in moves}
    seen: set[tuple[OperationState, OperationEvent]] = set()
    rng = random.Random(2024)
    for _ in range(2000):
        script = [(rng.choice(_ACTIONS), rng.randrange(1000)) for _ in range(rng.randrange(5, 40))]
        seen |= _run_operations(script, monkeypatch)
        if allowed <= seen:
            break
    assert allowed <= seen, sorted((s.name, e.value) for s, e in allowed - seen)
