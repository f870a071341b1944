"""The endpoint session on its own: the test plays the rendezvous and the parent.

Results are built the way a tree would build them: the session's own sealed
Contribution combined with chunks the test seals for the other ranks with the
group keys.  Further tests check that results decoded chunk by chunk are the bits
of a whole-array decode and bound the memory a large operation takes; the last
drive every (state, input) pair of the session table and random input sequences
through the operation table.
"""

from __future__ import annotations

import dataclasses
import random
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pytest
import reference
from hypothesis import given, settings
from hypothesis import strategies as st

from cco.nodes import data_operation
from cco.nodes.calls import CollectiveRequest, EndpointConfig, OperationError
from cco.nodes.data_operation import source_of
from cco.nodes.endpoint import EndpointMachine
from cco.nodes.endpoint_states import (
    DATA_MOVES,
    OPERATION_TABLE,
    SESSION_TABLE,
    LinkState,
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
    Joined,
    JoinFailed,
    MessageMalformed,
    MessageReceived,
    OperationCompleted,
    OperationFailed,
    PeerConnected,
    PeerDisconnected,
    SendMessage,
    TimerFired,
)
from cco.nodes.fsm import Move, TransitionTable
from cco.nodes.operation import Quorum
from cco.wire import payload
from cco.wire.blockscale import SCALE_MAX
from cco.wire.dtypes import ELEMENT_TYPES
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.exact import limb_count, to_limbs
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import (
    MAX_TOTAL_ELEMENTS,
    Abort,
    Address,
    BroadcastData,
    ChunkAck,
    ChunkMessage,
    Contribution,
    EpochChange,
    Error,
    GroupParams,
    Heartbeat,
    JoinAccept,
    JoinReject,
    JoinRequest,
    Leave,
    Message,
    NodeRef,
    Result,
    RetransmitRequest,
    TreeAssignment,
)
from cco.wire.ops import OPS, Form, form
from cco.wire.packing import contribution_bound, narrow, unpack
from cco.wire.registries import Collective, DType, ReduceOp, Role

GROUP = bytes.fromhex("c3" * 16)
SECRET = bytes(range(100, 132))
KEYS = payload.derive_group_keys(SECRET, GROUP)
WORLD = 4
RANK = 1
PARAMS = GroupParams(chunk_elements=4, window=2, heartbeat_interval_ms=600_000, operation_timeout_ms=1000)
PARENT = NodeRef(
    node_id="leaf", address=Address(host="leaf.test", port=4433), ranks=bitmap_from_ranks([0, 1])
)
PARENT2 = NodeRef(node_id="leaf2", address=Address(host="leaf2.test", port=4433), ranks=PARENT.ranks)

M = TypeVar("M", bound=Message)


def sent(commands: list[Command], peer: str | None = None, kind: type[M] = Message) -> list[M]:  # type: ignore[assignment]
    return [
        c.message
        for c in commands
        if isinstance(c, SendMessage) and (peer is None or c.peer == peer) and isinstance(c.message, kind)
    ]


def failures(commands: list[Command]) -> list[OperationError]:
    out = []
    for c in commands:
        if isinstance(c, OperationFailed):
            assert isinstance(c.error, OperationError)
            out.append(c.error)
    return out


def tree(epoch: int = 1, parent: NodeRef = PARENT, params: GroupParams = PARAMS) -> TreeAssignment:
    return TreeAssignment(
        group_id=GROUP,
        epoch=epoch,
        world_size=WORLD,
        expected=bitmap_from_ranks([RANK]),
        children=(),
        params=params,
        parent=parent,
    )


def accept(params: GroupParams = PARAMS) -> JoinAccept:
    return JoinAccept(
        group_id=GROUP, rank=RANK, world_size=WORLD, epoch=1, group_secret=SECRET, params=params
    )


def others(
    message: ChunkMessage, values: Callable[[int, int], int] = lambda rank, i: rank
) -> list[ChunkMessage]:
    """The other ranks' chunks matching ``message`` (rank r sends values(r, i))."""
    header = payload.ChunkHeader.of(message)
    return [
        payload.seal(
            KEYS, header, r, np.array([values(r, i) for i in range(header.element_count)], dtype=np.int64)
        )
        for r in range(WORLD)
        if r != RANK
    ]


def result_for(
    message: ChunkMessage, values: Callable[[int, int], int] = lambda rank, i: rank
) -> ChunkMessage:
    """The Result a tree would return for this rank's Contribution."""
    return payload.combine([message, *others(message, values)], Result)


def root_chunks(
    values: np.ndarray, op_id: int, epoch: int = 1, *, dtype: DType = DType.INT64, chunk_elements: int = 4
) -> list[ChunkMessage]:
    """Rank 0's BroadcastData chunks of ``values``, as the root would seal them."""
    wire = payload.encode_values(values, dtype, Collective.BROADCAST, ReduceOp.SUM, WORLD)
    chunks = []
    for index in range(max(1, -(-wire.size // chunk_elements))):
        header = payload.ChunkHeader(
            group_id=GROUP,
            epoch=epoch,
            op_id=op_id,
            kind=Collective.BROADCAST,
            op=ReduceOp.SUM,
            dtype=dtype,
            total_elements=wire.size,
            chunk_elements=chunk_elements,
            chunk_index=index,
            root=0,
        )
        start = index * chunk_elements
        chunks.append(payload.seal(KEYS, header, 0, wire[start : start + chunk_elements], BroadcastData))
    return chunks


def int_header(op_id: int, epoch: int, total: int) -> payload.ChunkHeader:
    """Chunk 0 of an int32 SUM all-reduce of ``total`` elements."""
    return payload.ChunkHeader(
        group_id=GROUP,
        epoch=epoch,
        op_id=op_id,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.INT32,
        total_elements=total,
        chunk_elements=4,
        chunk_index=0,
    )


@dataclass
class Rig:
    """One endpoint session, its clock, and the peers the test plays."""

    machine: EndpointMachine = field(
        default_factory=lambda: EndpointMachine(
            EndpointConfig(group_id=GROUP, world_size=WORLD, credential=b"pw", rank=RANK, labels=("rack1",))
        )
    )
    now: float = 0.0
    parent: str | None = None

    def feed(self, event: Input) -> list[Command]:
        out = self.machine.handle(event, self.now)
        assert isinstance(self.machine.state, SessionState)
        return out

    def rendezvous(self, message: Message) -> list[Command]:
        return self.feed(MessageReceived("rv", message))

    def from_parent(self, message: Message) -> list[Command]:
        assert self.parent is not None
        return self.feed(MessageReceived(self.parent, message))

    def timer(self, at: float) -> list[Command]:
        self.now = at
        return self.feed(TimerFired())

    def start(self, request: CollectiveRequest) -> tuple[int, list[Command]]:
        return self.machine.start(request, self.now)

    def join(self, params: GroupParams = PARAMS) -> list[Command]:
        """IDLE -> READY; returns every command on the way."""
        out = self.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
        out += self.rendezvous(accept(params))
        dial = self.rendezvous(tree(params=params))
        (connect,) = [c for c in dial if isinstance(c, ConnectTo)]
        self.parent = connect.peer
        out += dial + self.feed(PeerConnected(connect.peer, "leaf", Role.AGGREGATOR))
        return out


def joined() -> Rig:
    rig = Rig()
    rig.join()
    return rig


def int_request(
    values: list[int], kind: Collective = Collective.ALL_REDUCE, **kw: object
) -> CollectiveRequest:
    return CollectiveRequest(kind=kind, array=np.array(values, dtype=np.int32), **kw)  # type: ignore[arg-type]


QUORUM = Quorum(min_ranks=1, wait=0.5)


def quorum_results(
    op_id: int, epoch: int, values: list[int], ranks: list[int], members: list[int] | None = None
) -> tuple[Result, Result]:
    """What the tree returns for a quorum all-reduce of int32 ``values`` (this rank's
    length) that ``ranks`` made in time, each sending its rank in every element: the
    presence pass's Result (op ``op_id``) and the data's (op ``op_id + 1``, over
    ``members``, by default ``ranks``)."""
    presence = dataclasses.replace(
        int_header(op_id, epoch, 1), dtype=DType.INT8, quorum=QUORUM.min_ranks, wait_ms=QUORUM.wait_ms
    )
    listed = bitmap_from_ranks(ranks if members is None else members)
    data = dataclasses.replace(int_header(op_id + 1, epoch, len(values)), members=listed)
    ones = [payload.seal(KEYS, presence, r, np.ones(1, dtype=np.int64)) for r in ranks]
    parts = [payload.seal(KEYS, data, r, np.full(data.element_count, r, dtype=np.int64)) for r in ranks]
    return payload.combine(ones, Result), payload.combine(parts, Result)  # type: ignore[return-value]


# --- joining ----------------------------------------------------------------------


def test_join_flow() -> None:
    rig = Rig()
    out = rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    assert sent(out, "rv") == [
        JoinRequest(group_id=GROUP, world_size=WORLD, credential=b"pw", rank=RANK, labels=("rack1",))
    ]
    assert rig.rendezvous(accept()) == [] and rig.machine.state is SessionState.ACCEPTED
    out = rig.rendezvous(tree())
    (dial,) = out
    assert isinstance(dial, ConnectTo) and dial.expected_node_id == "leaf" and dial.address == PARENT.address
    assert rig.machine.state is SessionState.CONNECTING
    out = rig.feed(PeerConnected(dial.peer, "leaf", Role.AGGREGATOR))
    assert out == [Joined(GROUP, RANK, WORLD, 1)]
    assert rig.machine.state is SessionState.READY and rig.machine.rank == RANK
    assert rig.machine.members == frozenset(range(WORLD))


def test_join_reject_ends_the_session() -> None:
    rig = Rig()
    rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    out = rig.rendezvous(JoinReject(group_id=GROUP, code=ErrorCode.BAD_CREDENTIAL, detail="no"))
    assert next(c for c in out if isinstance(c, ClosePeer)).code is ErrorCode.BAD_CREDENTIAL
    assert rig.machine.state is SessionState.REJECTED
    with pytest.raises(CcoError) as info:
        rig.start(int_request([1]))
    assert info.value.code is ErrorCode.PROTOCOL_VIOLATION


def test_join_into_a_running_group_waits_for_the_next_epoch() -> None:
    rig = Rig()
    rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    rig.rendezvous(accept())
    rig.rendezvous(
        EpochChange(group_id=GROUP, epoch=2, members=bitmap_from_ranks(range(WORLD)), code=ErrorCode.NO_ERROR)
    )
    assert rig.machine.state is SessionState.ACCEPTED and rig.machine.epoch == 2
    assert [e.code for e in sent(rig.rendezvous(tree(epoch=1)), "rv", Error)] == [ErrorCode.STALE_EPOCH]
    (dial,) = rig.rendezvous(tree(epoch=2))
    assert isinstance(dial, ConnectTo)
    assert rig.feed(PeerConnected(dial.peer, "leaf", Role.AGGREGATOR)) == [Joined(GROUP, RANK, WORLD, 2)]


# --- collectives ----------------------------------------------------------------------


def test_window_self_clocks_and_result_is_verified() -> None:
    rig = joined()
    values = list(range(20))  # five chunks of four
    op_id, out = rig.start(int_request(values))
    first = sent(out, rig.parent, Contribution)
    assert [c.chunk_index for c in first] == [0, 1] and rig.machine.outstanding == 2
    pending = {c.chunk_index: c for c in first}
    done: list[Command] = []
    order = [1, 0, 3, 2, 4]
    for index in order:
        while index not in pending:
            pytest.fail(f"chunk {index} was never sent")
        out = rig.from_parent(result_for(pending[index]))
        for c in sent(out, rig.parent, Contribution):
            pending[c.chunk_index] = c
        assert rig.machine.outstanding <= PARAMS.window
        done += out
    (completed,) = [c for c in done if isinstance(c, OperationCompleted)]
    assert completed.op_id == op_id
    assert completed.result is not None
    assert completed.result.tolist() == [v + 0 + 2 + 3 for v in values]  # ranks 0, 2, 3 send their rank
    assert completed.result.dtype == np.int32 and rig.machine.outstanding == 0


def test_chunk_0_is_sealed_from_the_encoding_start_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """start() encodes the whole input, a chunk at a time, to refuse an unencodable
    value before anything is sent; chunk 0, sealed at once, takes that encoding
    instead of encoding its values a second time.  Later chunks are encoded when sent."""
    encoded: list[tuple[int, int]] = []
    encode = data_operation.encode_range

    def counting(*args: Any) -> np.ndarray:
        encoded.append((args[5], args[6]))  # start, stop
        return encode(*args)

    monkeypatch.setattr(data_operation, "encode_range", counting)
    rig = joined()
    values = list(range(10))  # chunks of 4, 4 and 2; a window of 2
    _, out = rig.start(int_request(values))
    assert [c.chunk_index for c in sent(out, rig.parent, Contribution)] == [0, 1]
    assert encoded == [(0, 4), (4, 8), (8, 10), (4, 8)]  # the check's three, then chunk 1


def test_duplicate_results_do_not_count_twice() -> None:
    rig = joined()
    _, out = rig.start(int_request([5, 5, 5, 5]))
    (contribution,) = sent(out, rig.parent, Contribution)
    result = result_for(contribution)
    (completed,) = rig.from_parent(result)
    assert isinstance(completed, OperationCompleted) and completed.result is not None
    assert completed.result.tolist() == [10] * 4
    assert rig.from_parent(result) == []  # late duplicate of a finished operation


def test_a_different_copy_of_a_verified_chunk_fails_the_operation() -> None:
    rig = joined()
    op_id, out = rig.start(int_request(list(range(8))))
    first, _ = sent(out, rig.parent, Contribution)
    assert rig.from_parent(result_for(first)) == []
    assert rig.from_parent(result_for(first)) == []  # an identical copy is ignored
    other = result_for(first, lambda rank, i: rank + 1)  # genuine, but not what was delivered before
    (error,) = failures(rig.from_parent(other))
    assert error.code is ErrorCode.DUPLICATE_CONTRIBUTION and error.op_id == op_id


def test_a_different_copy_of_a_verified_untagged_chunk_fails_the_operation() -> None:
    """MAX chunks carry no tag: a copy is compared by a hash of its payload."""
    rig = joined()
    op_id, out = rig.start(int_request(list(range(8)), op=ReduceOp.MAX))
    first, _ = sent(out, rig.parent, Contribution)
    assert first.tag is None
    assert rig.from_parent(result_for(first, lambda rank, i: 100 + rank)) == []
    assert rig.from_parent(result_for(first, lambda rank, i: 100 + rank)) == []  # identical: ignored
    (error,) = failures(rig.from_parent(result_for(first, lambda rank, i: 200 + rank)))
    assert error.code is ErrorCode.DUPLICATE_CONTRIBUTION and error.op_id == op_id


def test_tampered_result_fails_verification_and_tells_the_tree() -> None:
    rig = joined()
    op_id, out = rig.start(int_request([1, 2, 3, 4, 5, 6, 7, 8]))
    contributions = sent(out, rig.parent, Contribution)
    good = result_for(contributions[0])
    flipped = bytes([good.payload[0] ^ 1]) + good.payload[1:]
    bad = dataclasses.replace(good, payload=flipped)
    out = rig.from_parent(bad)
    (error,) = failures(out)
    assert error.code is ErrorCode.VERIFICATION_FAILED and error.op_id == op_id
    assert GROUP.hex() in str(error) and "ALL_REDUCE" in str(error)
    (abort,) = sent(out, rig.parent, Abort)
    assert abort.code is ErrorCode.VERIFICATION_FAILED and abort.op_id == op_id
    assert rig.machine.outstanding == 0 and rig.machine.operation_state(op_id) is None
    _, out = rig.start(int_request([1]))  # the next operation is not stuck behind it
    assert len(sent(out, rig.parent, Contribution)) == 1


def test_result_missing_a_rank_fails_verification() -> None:
    rig = joined()
    _, out = rig.start(int_request([1, 1, 1, 1]))
    (contribution,) = sent(out, rig.parent, Contribution)
    partial = payload.combine([contribution, *others(contribution)[:2]], Result)  # rank 3 absent
    (error,) = failures(rig.from_parent(partial))
    assert error.code is ErrorCode.VERIFICATION_FAILED and "missing ranks [3]" in str(error)


def test_deadline_names_group_operation_and_missing_chunks() -> None:
    rig = joined()
    op_id, out = rig.start(int_request(list(range(8))))
    (first, _) = sent(out, rig.parent, Contribution)
    rig.from_parent(result_for(first))
    out: list[Command] = []
    while not failures(out):
        deadline = rig.machine.next_deadline()
        assert deadline is not None
        out = rig.timer(deadline)
    assert rig.now == pytest.approx(1.0 + 600.0)  # the group's operation timeout plus a heartbeat interval
    (error,) = failures(out)
    assert error.code is ErrorCode.TIMEOUT and error.missing_chunks == (1,)
    assert error.missing_ranks is None and "missing ranks unknown" in str(error)
    assert f"group {GROUP.hex()} op {op_id} ALL_REDUCE" in str(error)
    (abort,) = sent(out, rig.parent, Abort)
    assert abort.code is ErrorCode.TIMEOUT


def test_per_operation_timeout() -> None:
    rig = joined()
    _, out = rig.start(int_request([1], timeout=0.4))
    (chunk,) = sent(out, rig.parent, Contribution)
    assert rig.machine.next_deadline() == pytest.approx(0.2)
    # half a timeout after it left, a chunk whose result is missing is sent again
    # (identical), in case the result was lost with a connection
    assert sent(rig.timer(0.2), rig.parent, Contribution) == [chunk]
    assert rig.machine.next_deadline() == pytest.approx(0.4)  # again half a timeout later
    assert sent(rig.timer(0.31), rig.parent, Contribution) == []
    (error,) = failures(rig.timer(0.4))
    assert error.code is ErrorCode.TIMEOUT


def test_abort_from_the_tree_names_missing_ranks() -> None:
    rig = joined()
    op_id, _ = rig.start(int_request([1, 2]))
    abort = Abort(
        group_id=GROUP,
        epoch=1,
        op_id=op_id,
        code=ErrorCode.TIMEOUT,
        detail="slot",
        missing=bitmap_from_ranks([3]),
    )
    (error,) = failures(rig.from_parent(abort))
    assert error.code is ErrorCode.TIMEOUT and error.missing_ranks == frozenset({3})
    assert "missing ranks {3}" in str(error)


def test_epoch_change_fails_in_flight_operations_naming_lost_ranks() -> None:
    rig = joined()
    op_id, _ = rig.start(int_request([1, 2]))
    change = EpochChange(
        group_id=GROUP, epoch=2, members=bitmap_from_ranks([0, 1, 3]), code=ErrorCode.PEER_LOST
    )
    (error,) = failures(rig.rendezvous(change))
    assert (
        error.code is ErrorCode.PEER_LOST and error.missing_ranks == frozenset({2}) and error.op_id == op_id
    )
    assert rig.machine.state is SessionState.REPLANNING
    assert rig.machine.members == {0, 1, 3} and rig.machine.accepted_members == {0, 1, 2, 3}
    # strict membership: nothing runs over fewer ranks until the application accepts them
    refused, out = rig.start(int_request([4, 4, 4, 4]))
    (error,) = failures(out)
    assert refused == op_id + 1 and error.code is ErrorCode.PEER_LOST and error.missing_ranks == {2}
    assert "ranks {2} left" in str(error) and sent(out) == []
    assert rig.machine.accept_membership() == {0, 1, 3}
    next_op, out = rig.start(int_request([4, 4, 4, 4]))  # queued until the new tree is up
    assert next_op == op_id + 2 and sent(out) == []
    out = rig.rendezvous(tree(epoch=2))  # same parent, still connected
    assert rig.machine.state is SessionState.READY
    (contribution,) = sent(out, rig.parent, Contribution)
    assert contribution.epoch == 2
    three = payload.combine(
        [contribution, *[c for c in others(contribution) if c.contributors != bitmap_from_ranks([2])]], Result
    )
    (completed,) = rig.from_parent(three)
    assert isinstance(completed, OperationCompleted) and completed.result is not None
    assert completed.result.tolist() == [4 + 0 + 3] * 4


def test_elastic_sessions_accept_the_new_membership_at_the_epoch_change() -> None:
    rig = Rig(
        machine=EndpointMachine(
            EndpointConfig(group_id=GROUP, world_size=WORLD, credential=b"pw", rank=RANK, elastic=True)
        )
    )
    rig.join()
    rig.start(int_request([1, 2]))
    change = EpochChange(
        group_id=GROUP, epoch=2, members=bitmap_from_ranks([0, 1, 3]), code=ErrorCode.PEER_LOST
    )
    (error,) = failures(rig.rendezvous(change))  # the operation in flight still fails: the news
    assert error.code is ErrorCode.PEER_LOST and error.missing_ranks == frozenset({2})
    assert rig.machine.accepted_members == {0, 1, 3}
    rig.rendezvous(tree(epoch=2))
    _, out = rig.start(int_request([6, 6, 6, 6], op=ReduceOp.AVG))
    (contribution,) = sent(out, rig.parent, Contribution)
    three = payload.combine(
        [contribution, *[c for c in others(contribution) if c.contributors != bitmap_from_ranks([2])]], Result
    )
    (completed,) = rig.from_parent(three)
    assert isinstance(completed, OperationCompleted) and completed.result is not None
    assert completed.result.tolist() == [(6 + 0 + 3) // 3] * 4  # AVG over the three members
    with pytest.raises(CcoError) as info:  # slices of a shrunken group are not defined
        rig.start(CollectiveRequest(kind=Collective.ALL_GATHER, array=np.zeros(2, np.int32)))
    assert info.value.code is ErrorCode.UNSUPPORTED_FEATURE


def test_average_divides_by_members() -> None:
    rig = joined()
    _, out = rig.start(int_request([10, 11, 12, 13], op=ReduceOp.AVG))
    (contribution,) = sent(out, rig.parent, Contribution)
    (completed,) = rig.from_parent(result_for(contribution, lambda rank, i: 10 + i))
    assert isinstance(completed, OperationCompleted) and completed.result is not None
    assert completed.result.tolist() == [10, 11, 12, 13]


def test_parent_loss_redials_and_starts_operations_again() -> None:
    """A lost parent interrupts the operations in flight; once the parent is back they
    start again from this rank's input (same epoch, so identical chunks: idempotent
    for an aggregator that kept its slots) and complete."""
    rig = joined()
    op_id, out = rig.start(int_request([1, 2, 3, 4, 5]))
    first = sent(out, rig.parent, Contribution)
    assert rig.parent is not None and len(first) == 2
    out = rig.feed(PeerDisconnected(rig.parent, ErrorCode.PEER_LOST))
    assert failures(out) == [] and rig.machine.state is SessionState.RECONNECTING
    assert rig.machine.outstanding == 0 and rig.machine.operation_state(op_id) is OperationState.QUEUED
    redial = [c for c in rig.timer(1.0) if isinstance(c, ConnectTo)]
    assert len(redial) == 1 and redial[0].expected_node_id == "leaf"
    out = rig.feed(PeerConnected(redial[0].peer, "leaf", Role.AGGREGATOR))
    assert rig.machine.state is SessionState.READY
    rig.parent = redial[0].peer
    again = sent(out, rig.parent, Contribution)
    assert again == first  # sealing is deterministic: the same bytes
    done: list[Command] = []
    chunks = list(again)
    while chunks:
        out = rig.from_parent(result_for(chunks.pop(0)))
        chunks += sent(out, rig.parent, Contribution)
        done += out
    (completed,) = [c for c in done if isinstance(c, OperationCompleted)]
    assert completed.op_id == op_id and completed.result is not None
    assert completed.result.tolist() == [v + sum(range(WORLD)) - RANK for v in [1, 2, 3, 4, 5]]


def test_a_lost_tree_that_never_comes_back_ends_at_the_deadline_saying_why() -> None:
    rig = joined()
    op_id, _ = rig.start(int_request([1]))
    assert rig.parent is not None
    rig.feed(PeerDisconnected(rig.parent, ErrorCode.PEER_LOST))
    (error,) = failures(rig.timer(rig.now + 1000))  # past the default deadline (timeout + heartbeat)
    assert error.code is ErrorCode.TIMEOUT and error.op_id == op_id
    assert "waiting for a new tree since: connection to parent leaf lost" in str(error)


def test_leave_tells_the_rendezvous_and_fails_what_is_in_flight() -> None:
    rig = joined()
    rig.start(int_request([1]))
    out = rig.machine.leave(rig.now)
    assert sent(out, "rv") == [Leave(group_id=GROUP, rank=RANK, code=ErrorCode.NO_ERROR)]
    assert {c.peer for c in out if isinstance(c, ClosePeer)} == {"rv", rig.parent}
    assert [e.code for e in failures(out)] == [ErrorCode.ABORTED]
    assert rig.machine.state is SessionState.LEFT and rig.machine.leave(rig.now) == []


def test_heartbeats_and_rendezvous_loss() -> None:
    """A silent rendezvous detaches the session; the operation in flight completes."""
    rig = Rig()
    rig.join(GroupParams(chunk_elements=4, window=2, heartbeat_interval_ms=100, operation_timeout_ms=60_000))
    assert sent(rig.timer(0.1), "rv", Heartbeat)
    rig.rendezvous(Heartbeat(seq=7))
    _, out = rig.start(int_request([1]))
    (mine,) = sent(out, rig.parent, Contribution)
    while rig.machine.link is LinkState.ATTACHED:
        deadline = rig.machine.next_deadline()
        assert deadline is not None
        out = rig.timer(deadline)
    assert rig.now == pytest.approx(0.4) and rig.machine.state is SessionState.READY
    assert (
        ClosePeer("rv", ErrorCode.PEER_LOST, "no message from the rendezvous for three heartbeat intervals")
        in out
    )
    assert failures(out) == [] and sent(rig.timer(1.0), "rv") == []  # no heartbeats while detached
    (done,) = [c for c in rig.from_parent(result_for(mine)) if isinstance(c, OperationCompleted)]
    assert done.result is not None and done.result.tolist() == [0 + 1 + 2 + 3 - RANK + 1]


def _detached(grace: float = 5.0) -> Rig:
    config = EndpointConfig(
        group_id=GROUP, world_size=WORLD, credential=b"pw", rank=RANK, rendezvous_grace=grace
    )
    rig = Rig(machine=EndpointMachine(config))
    rig.join()
    rig.feed(PeerDisconnected("rv", ErrorCode.PEER_LOST))
    assert rig.machine.link is LinkState.DETACHED and rig.machine.state is SessionState.READY
    return rig


def test_a_rendezvous_not_back_within_the_grace_closes_the_session() -> None:
    rig = _detached(grace=5.0)
    rig.start(int_request([1]))
    assert rig.machine.next_deadline() == pytest.approx(5.0)
    out = rig.timer(5.0)
    assert rig.machine.state is SessionState.CLOSED
    (error,) = failures(out)
    assert error.code is ErrorCode.PEER_LOST and "not back within 5s" in str(error)
    assert any(isinstance(c, ClosePeer) and c.peer == rig.parent for c in out)


def test_a_returning_rendezvous_that_kept_the_group_resumes_the_membership() -> None:
    rig = _detached()
    out = rig.feed(PeerConnected("rv2", "rendezvous", Role.RENDEZVOUS))
    (request,) = sent(out, "rv2", JoinRequest)
    assert request.rank == RANK and request.group_id == GROUP and rig.machine.link is LinkState.RESUMING
    _, out = rig.start(int_request([1]))
    (mine,) = sent(out, rig.parent, Contribution)
    assert rig.feed(MessageReceived("rv2", accept())) == []
    assert rig.machine.link is LinkState.ATTACHED and rig.machine.state is SessionState.READY
    beat = rig.now + PARAMS.heartbeat_interval_ms / 1000
    assert sent(rig.timer(beat), "rv2", Heartbeat)  # heartbeats on the new connection
    out = rig.feed(MessageReceived("rv2", tree()))  # the same tree again: a refresh
    assert not [c for c in out if isinstance(c, ClosePeer | ConnectTo)]
    assert [type(c) for c in rig.from_parent(result_for(mine))] == [OperationCompleted]
    assert rig.machine.next_deadline() != pytest.approx(5.0)  # the grace timer is gone


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (dataclasses.replace(accept(), group_secret=b"\x01" * 32), "without this membership"),
        (dataclasses.replace(accept(), rank=(RANK + 1) % WORLD), "without this membership"),
        (dataclasses.replace(accept(), epoch=0), "without this membership"),
        (dataclasses.replace(accept(), epoch=2), "epoch 2 where this rank has 1"),  # messages lost
        (JoinReject(group_id=GROUP, code=ErrorCode.GROUP_FULL, detail="full"), "refused to resume"),
        (Error(code=ErrorCode.UNAUTHORIZED, detail="who?"), "refused to resume"),
    ],
)
def test_a_returning_rendezvous_without_the_membership_closes_the_session(answer: Message, why: str) -> None:
    rig = _detached()
    rig.feed(PeerConnected("rv2", "rendezvous", Role.RENDEZVOUS))
    rig.start(int_request([1]))
    out = rig.feed(MessageReceived("rv2", answer))
    assert rig.machine.state is SessionState.CLOSED
    (error,) = failures(out)
    assert error.code is ErrorCode.PEER_LOST and why in str(error)
    assert any(isinstance(c, ClosePeer) and c.peer == "rv2" for c in out)


def test_a_second_rendezvous_connection_while_attached_is_refused() -> None:
    rig = joined()
    out = rig.feed(PeerConnected("rv2", "rendezvous", Role.RENDEZVOUS))
    assert [c.code for c in out if isinstance(c, ClosePeer)] == [ErrorCode.PROTOCOL_VIOLATION]
    assert rig.machine.link is LinkState.ATTACHED


def test_malformed_bytes_from_the_parent_end_that_connection() -> None:
    rig = joined()
    rig.start(int_request([1]))
    assert rig.parent is not None
    out = rig.feed(MessageMalformed(rig.parent, CcoError(ErrorCode.TRAILING_BYTES, "junk")))
    assert [m.code for m in sent(out, rig.parent, Error)] == [ErrorCode.TRAILING_BYTES]
    assert ClosePeer(rig.parent, ErrorCode.TRAILING_BYTES, "junk") in out
    assert failures(out) == []  # the operation waits for the parent to be dialled again
    assert rig.machine.state is SessionState.RECONNECTING


def test_unencodable_input_fails_the_operation_and_keeps_op_ids_aligned() -> None:
    rig = joined()
    request = CollectiveRequest(kind=Collective.ALL_REDUCE, array=np.array([1.0, np.nan], dtype=np.float32))
    op_id, out = rig.start(request)
    (error,) = failures(out)
    assert error.code is ErrorCode.OVERFLOW and error.missing_ranks == frozenset({RANK})
    (abort,) = sent(out, rig.parent, Abort)
    assert abort.missing == bitmap_from_ranks([RANK])
    assert rig.start(int_request([1]))[0] == op_id + 1


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (CollectiveRequest(kind=Collective.REDUCE, array=np.zeros(2, np.int32)), ErrorCode.INVALID_FIELD),
        (
            CollectiveRequest(kind=Collective.BROADCAST, array=np.zeros(2, np.int32), root=9),
            ErrorCode.INVALID_FIELD,
        ),
        (
            CollectiveRequest(kind=Collective.ALL_REDUCE, array=np.zeros(2, np.uint8)),
            ErrorCode.UNSUPPORTED_FEATURE,
        ),
        (
            CollectiveRequest(kind=Collective.REDUCE_SCATTER, array=np.zeros(6, np.int32)),
            ErrorCode.INVALID_FIELD,
        ),
        (
            CollectiveRequest(kind=Collective.ALL_GATHER, op=ReduceOp.MAX, array=np.zeros(2, np.int32)),
            ErrorCode.INVALID_FIELD,
        ),
        (
            CollectiveRequest(kind=Collective.ALL_REDUCE, op=ReduceOp.BXOR, array=np.zeros(2, np.float32)),
            ErrorCode.UNSUPPORTED_FEATURE,
        ),
        (
            CollectiveRequest(kind=Collective.ALL_REDUCE, array=np.zeros(2, np.int32), width=16),
            ErrorCode.INVALID_FIELD,
        ),
        (
            CollectiveRequest(kind=Collective.ALL_REDUCE, array=np.zeros(2, np.float32), width=12),
            ErrorCode.INVALID_FIELD,
        ),
        (
            CollectiveRequest(kind=Collective.ALL_REDUCE, op=ReduceOp.MAX, array=np.zeros(2), width=16),
            ErrorCode.INVALID_FIELD,
        ),
        (CollectiveRequest(kind=Collective.ALL_REDUCE), ErrorCode.INVALID_FIELD),
        (CollectiveRequest(kind=Collective.BARRIER, timeout=0), ErrorCode.INVALID_FIELD),
    ],
)
def test_misuse_raises_without_consuming_an_op_id(request_: CollectiveRequest, code: ErrorCode) -> None:
    rig = joined()
    with pytest.raises(CcoError) as info:
        rig.start(request_)
    assert info.value.code is code
    assert rig.start(CollectiveRequest(kind=Collective.BARRIER))[0] == 0


def test_broadcast_root_is_clocked_by_its_own_data() -> None:
    rig = joined()
    data = np.arange(10, dtype=np.float32) / 3
    op_id, out = rig.start(CollectiveRequest(kind=Collective.BROADCAST, array=data, root=RANK))
    chunks = sent(out, rig.parent, BroadcastData)
    assert [c.chunk_index for c in chunks] == [0, 1]
    done: list[Command] = []
    while chunks:
        message = chunks.pop(0)
        out = rig.from_parent(message)
        chunks += sent(out, rig.parent, BroadcastData)
        done += out
    (completed,) = [c for c in done if isinstance(c, OperationCompleted)]
    assert completed.op_id == op_id and completed.result is not None
    assert completed.result.tobytes() == data.tobytes()


def test_broadcast_receiver_keeps_chunks_that_arrive_before_it_starts() -> None:
    rig = joined()
    data = np.array([3, -1, 4, 1, -5, 9], dtype=np.int64)  # twelve wire integers: three chunks
    chunks = root_chunks(data, op_id=0)
    assert rig.from_parent(chunks[2]) == [] and rig.from_parent(chunks[0]) == []
    op_id, out = rig.start(CollectiveRequest(kind=Collective.BROADCAST, root=0, dtype=DType.INT64))
    assert sent(out) == [] and rig.machine.operation_state(op_id) is OperationState.AWAITING
    (completed,) = rig.from_parent(chunks[1])
    assert isinstance(completed, OperationCompleted) and completed.result is not None
    assert completed.result.tolist() == data.tolist()


def test_reduce_non_root_gets_none_and_barrier_gets_none() -> None:
    rig = joined()
    _, out = rig.start(int_request([1, 2], kind=Collective.REDUCE, root=0))
    (contribution,) = sent(out, rig.parent, Contribution)
    (completed,) = rig.from_parent(result_for(contribution))
    assert isinstance(completed, OperationCompleted) and completed.result is None
    _, out = rig.start(CollectiveRequest(kind=Collective.BARRIER))
    (contribution,) = sent(out, rig.parent, Contribution)
    assert contribution.total_elements == 0 and contribution.dtype is DType.INT8
    (completed,) = rig.from_parent(result_for(contribution))
    assert isinstance(completed, OperationCompleted) and completed.result is None


def test_retransmit_request_resends_identical_chunks() -> None:
    rig = joined()
    op_id, out = rig.start(int_request(list(range(12))))
    first, second = sent(out, rig.parent, Contribution)
    request = RetransmitRequest(group_id=GROUP, epoch=1, op_id=op_id, chunks=(1, 2, 0))
    again = rig.from_parent(request)  # chunk 2 has not been sent yet: it will be, once
    assert sent(again, rig.parent) == [first, second]
    assert rig.machine.outstanding == 2
    assert rig.from_parent(ChunkAck(group_id=GROUP, epoch=1, op_id=op_id, chunks=(0,))) == []


def test_operations_leave_in_call_order_sharing_one_window() -> None:
    rig = joined()
    a, out_a = rig.start(int_request(list(range(12))))  # three chunks
    b, out_b = rig.start(int_request([7, 7, 7, 7]))
    assert [c.op_id for c in sent(out_a + out_b, rig.parent, Contribution)] == [a, a]
    assert rig.machine.operation_state(b) is OperationState.QUEUED
    (first, second) = sent(out_a, rig.parent, Contribution)
    out = rig.from_parent(result_for(first))
    assert [(c.op_id, c.chunk_index) for c in sent(out, rig.parent, Contribution)] == [(a, 2)]
    out = rig.from_parent(result_for(second))
    assert [(c.op_id, c.chunk_index) for c in sent(out, rig.parent, Contribution)] == [(b, 0)]


def test_an_unencodable_value_in_a_later_chunk_fails_before_anything_is_sent() -> None:
    rig = joined()
    data = np.arange(10, dtype=np.float32)
    data[9] = np.inf  # chunk 2: start() encodes every chunk before the first leaves
    op_id, out = rig.start(CollectiveRequest(kind=Collective.ALL_REDUCE, array=data))
    (error,) = failures(out)
    assert error.code is ErrorCode.OVERFLOW and "element 9 is infinite" in str(error)
    assert sent(out, rig.parent, Contribution) == [] and rig.machine.operation_state(op_id) is None


@pytest.mark.parametrize("resent", [False, True])
def test_an_input_changed_during_the_operation_fails_it_and_tells_the_tree(resent: bool) -> None:
    """The operation reads the caller's array until it completes (CollectiveRequest):
    a value changed to one that cannot be encoded fails the operation cleanly."""
    rig = joined()
    data = np.arange(40, dtype=np.float32)  # block-scaled, in ten chunks; the window holds two
    op_id, out = rig.start(CollectiveRequest(kind=Collective.ALL_REDUCE, array=data))
    first, _ = after_the_scale_pass(rig, out)
    if resent:
        data[5] = np.nan  # chunk 1, outstanding: asked for again
        out = rig.from_parent(RetransmitRequest(group_id=GROUP, epoch=1, op_id=op_id, chunks=(1,)))
    else:
        data[9] = np.nan  # chunk 2, which leaves once chunk 0 comes back
        out = rig.from_parent(tree_result(first, {r: np.zeros(0) for r in range(WORLD) if r != RANK}))
    (error,) = failures(out)
    assert error.code is ErrorCode.OVERFLOW and "the input changed" in str(error)
    (abort,) = sent(out, rig.parent, Abort)
    assert abort.op_id == op_id and abort.missing == bitmap_from_ranks([RANK])
    assert sent(out, rig.parent, Contribution) == [] and rig.machine.outstanding == 0


def test_a_strided_input_is_read_in_c_order() -> None:
    rig = joined()
    data = np.arange(24, dtype=np.int32).reshape(4, 6).T  # not C-contiguous: copied once at start
    _, out = rig.start(CollectiveRequest(kind=Collective.ALL_REDUCE, array=data))
    done: list[Command] = []
    chunks = sent(out, rig.parent, Contribution)
    while chunks:
        out = rig.from_parent(result_for(chunks.pop(0), lambda rank, i: 0))
        chunks += sent(out, rig.parent, Contribution)
        done += out
    (completed,) = [c for c in done if isinstance(c, OperationCompleted)]
    assert completed.result is not None
    assert completed.result.shape == (6, 4) and completed.result.tolist() == data.tolist()


@pytest.mark.parametrize("first_copy", [True, False])
def test_a_result_packed_wider_than_needed_is_invalid(first_copy: bool) -> None:
    """The draft: an endpoint MUST treat a Result whose width is not the smallest as
    INVALID_FIELD, whether it is the first copy of the chunk or a later one."""
    rig = joined()
    op_id, out = rig.start(int_request(list(range(8))))
    first, _ = sent(out, rig.parent, Contribution)
    result = result_for(first)
    assert result.width < 8
    if not first_copy:
        assert rig.from_parent(result) == []
    wide = narrow(unpack(result.payload, result.width).astype(np.int64), 8).tobytes()
    (error,) = failures(rig.from_parent(dataclasses.replace(result, width=8, payload=wide)))
    assert error.code is ErrorCode.INVALID_FIELD and error.op_id == op_id
    assert "not the smallest" in str(error)


def test_a_result_that_does_not_fit_fails_once_every_chunk_is_verified() -> None:
    """Decoding failures wait for the last chunk, as decoding the whole array would:
    this rank keeps sending, so the other ranks still get every chunk."""
    rig = joined()
    values = np.full(12, 100, dtype=np.int8)  # three chunks; the window holds two
    op_id, out = rig.start(CollectiveRequest(kind=Collective.ALL_REDUCE, array=values))
    first, second = sent(out, rig.parent, Contribution)
    out = rig.from_parent(result_for(first, lambda rank, i: 20))  # 100 + 3 x 20 does not fit int8
    assert failures(out) == [] and [c.chunk_index for c in sent(out, rig.parent, Contribution)] == [2]
    (third,) = sent(out, rig.parent, Contribution)
    assert rig.from_parent(result_for(second, lambda rank, i: -rank)) == []
    out = rig.from_parent(result_for(third, lambda rank, i: -rank))
    (error,) = failures(out)
    assert error.code is ErrorCode.OVERFLOW and error.op_id == op_id
    assert "decoding: chunk 0" in str(error) and error.missing_chunks == ()
    assert sent(out, rig.parent, Abort) == []  # every rank decodes the same integers


def test_a_broadcast_of_half_an_element_fails_decoding() -> None:
    rig = joined()
    header = dataclasses.replace(
        payload.ChunkHeader.of(root_chunks(np.zeros(1, dtype=np.int64), op_id=0)[0]), total_elements=3
    )
    odd = payload.seal(KEYS, header, 0, np.array([1, 2, 3], dtype=np.int64), BroadcastData)
    rig.start(CollectiveRequest(kind=Collective.BROADCAST, root=0, dtype=DType.INT64))
    (error,) = failures(rig.from_parent(odd))
    assert error.code is ErrorCode.INVALID_FIELD and "INT64 takes two wire integers per element" in str(error)


# --- results chunk by chunk, memory -----------------------------------------------------

SPLIT = GroupParams(chunk_elements=5, window=2, heartbeat_interval_ms=600_000, operation_timeout_ms=1000)
"""Five wire integers per chunk: chunks split 64-bit elements and ALL_GATHER slices."""


def tree_result(mine: ChunkMessage, others: dict[int, np.ndarray]) -> ChunkMessage:
    """What the tree returns for ``mine``: a root's BroadcastData itself; otherwise the
    Result combining it with the other ranks' wire integers ``others[rank]``.  In a
    scale pass the others propose the largest scale (so the agreed scales are this
    rank's); in block-scaled data they send zeros and attest nothing."""
    if isinstance(mine, BroadcastData):
        return mine
    header = payload.ChunkHeader.of(mine)
    start = header.chunk_index * header.chunk_elements
    if header.dtype is DType.INT16 and header.op is ReduceOp.MIN:
        others = {r: np.full(header.total_elements, SCALE_MAX, dtype=np.int64) for r in others}
    if header.block_elements is not None:
        parts = [payload.seal(KEYS, header, r, np.zeros(header.integer_count, np.int64)) for r in others]
    else:
        parts = [
            payload.seal(KEYS, header, r, wire[start : start + header.element_count])
            for r, wire in others.items()
        ]
    return payload.combine([mine, *parts], Result)


def after_the_scale_pass(rig: Rig, out: list[Command]) -> list[Contribution]:
    """Answer a block-scaled operation's scale pass (its first chunks, ``out``) as
    :func:`tree_result` does; the data chunks sent once its scales are agreed."""
    chunks = sent(out, rig.parent, Contribution)
    while chunks and chunks[0].dtype is DType.INT16:
        out = rig.from_parent(tree_result(chunks.pop(0), {r: np.zeros(0) for r in range(WORLD) if r != RANK}))
        chunks += sent(out, rig.parent, Contribution)
    return chunks


def play_tree(
    rig: Rig,
    request: CollectiveRequest,
    others: dict[int, np.ndarray],
    incoming: list[ChunkMessage],
    delivered: list[ChunkMessage] | None = None,
) -> Command:
    """Run ``request`` with the test as the tree, answering every chunk the session
    sends and delivering ``incoming``; the outcome.  Each chunk delivered is appended
    to ``delivered`` when given (and otherwise dropped, as a tree would)."""
    _, out = rig.start(request)
    outcomes = [c for c in out if isinstance(c, OperationCompleted | OperationFailed)]
    queue = [*incoming, *sent(out, rig.parent, ChunkMessage)]
    while queue:
        chunk = tree_result(queue.pop(0), others)
        if delivered is not None:
            delivered.append(chunk)
        out = rig.from_parent(chunk)
        outcomes += [c for c in out if isinstance(c, OperationCompleted | OperationFailed)]
        queue += sent(out, rig.parent, ChunkMessage)
    (outcome,) = outcomes
    return outcome


def random_input(rng: np.random.Generator, dtype: DType, kind: Collective, n: int) -> np.ndarray:
    """Any bit pattern (NaN payloads too) where data only moves; otherwise values whose
    reduction over WORLD ranks fits the type."""
    element = ELEMENT_TYPES[dtype]
    if form(kind, ReduceOp.SUM, dtype) is Form.PATTERNS:
        return rng.integers(0, 256, n * element.storage.itemsize, dtype=np.uint8).view(element.storage)
    if element.is_float:
        return rng.uniform(-1, 1, n).astype(element.storage)
    bound = min((1 << (element.bits - 1)) // (2 * WORLD), contribution_bound(WORLD))
    return rng.integers(-bound, bound, n, endpoint=True).astype(element.storage)


def _decoding_cases() -> list[tuple[Collective, DType, ReduceOp, bool]]:
    """(kind, dtype, op, this rank is the root) for every valid combination."""
    cases = [
        (kind, dtype, op, True)
        for kind in (Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER)
        for dtype in DType
        for op in ReduceOp
        if not (OPS[op].integer_only and ELEMENT_TYPES[dtype].is_float)
        and form(kind, op, dtype) is not Form.BLOCK_SCALED  # needs agreed scales: test_blockscale_endpoint
    ]
    cases += [(Collective.ALL_GATHER, dtype, ReduceOp.SUM, False) for dtype in DType]
    return cases + [
        (Collective.BROADCAST, dtype, ReduceOp.SUM, root) for dtype in DType for root in (True, False)
    ]


@pytest.mark.parametrize(("kind", "dtype", "op", "as_root"), _decoding_cases())
def test_chunk_by_chunk_decoding_is_bit_identical_to_decoding_the_whole_array(
    kind: Collective, dtype: DType, op: ReduceOp, as_root: bool
) -> None:
    rng = np.random.default_rng([int(kind), int(dtype), int(op), as_root])
    for _ in range(3):
        rig = Rig()
        rig.join(SPLIT)
        n = int(rng.integers(1, 12)) * (WORLD if kind is Collective.REDUCE_SCATTER else 1)
        data = {r: random_input(rng, dtype, kind, n) for r in range(WORLD)}
        wire = {r: payload.encode_values(x, dtype, kind, op, WORLD) for r, x in data.items()}
        if kind is Collective.ALL_GATHER:
            wire = {
                r: np.concatenate([w if q == r else np.zeros_like(w) for q in range(WORLD)])
                for r, w in wire.items()
            }
        others = {r: w for r, w in wire.items() if r != RANK and kind is not Collective.BROADCAST}
        receiver = kind is Collective.BROADCAST and not as_root
        incoming = (
            root_chunks(data[0], 0, dtype=dtype, chunk_elements=SPLIT.chunk_elements) if receiver else []
        )
        request = CollectiveRequest(
            kind=kind,
            op=op,
            array=None if receiver else data[RANK],
            root=(RANK if as_root else 0) if kind in (Collective.REDUCE, Collective.BROADCAST) else None,
            dtype=dtype,
        )
        delivered: list[ChunkMessage] = []
        outcome = play_tree(rig, request, others, incoming, delivered)
        assert isinstance(outcome, OperationCompleted) and outcome.result is not None
        delivered.sort(key=lambda c: c.chunk_index)
        integers = np.concatenate([unpack(c.payload, c.width).astype(np.int64) for c in delivered])
        contributors = 1 if kind is Collective.BROADCAST else WORLD
        whole = payload.decode_values(integers, dtype, kind, op, contributors)
        if kind is Collective.ALL_GATHER:
            whole = whole.reshape(WORLD, n)
        elif kind is Collective.REDUCE_SCATTER:
            whole = whole[RANK * (n // WORLD) : (RANK + 1) * (n // WORLD)]
        result = outcome.result
        assert (result.dtype, result.shape) == (whole.dtype, whole.shape)
        assert result.tobytes() == whole.tobytes()


def test_a_large_operation_keeps_its_result_and_a_few_chunks() -> None:
    """The memory a 4 MiB float32 all-reduce takes, from start() to the result, with the
    test as the tree: the result (the input is the caller's), a few chunks in flight."""
    params = GroupParams(
        chunk_elements=1 << 14, window=4, heartbeat_interval_ms=600_000, operation_timeout_ms=60_000
    )
    data = np.random.default_rng(7).uniform(-1, 1, 1 << 20).astype(np.float32)
    zeros = {r: np.broadcast_to(np.int64(0), data.size) for r in range(WORLD) if r != RANK}
    request = CollectiveRequest(kind=Collective.ALL_REDUCE, array=data)
    # Once untraced first: the compiled loops load on their first use in a process
    # (numba and its cache, tens of MB), which is not this operation's memory.
    warm = Rig()
    warm.join(params)
    play_tree(warm, request, zeros, [])
    rig = Rig()
    rig.join(params)
    tracemalloc.start()
    try:
        outcome = play_tree(rig, request, zeros, [])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(outcome, OperationCompleted) and outcome.result is not None
    # the other ranks sent zeros: the result is this rank's input, block-scaled once
    tolerance = reference.block_scaled_tolerance(
        [data], params.chunk_elements, params.block_elements, 32, WORLD, 24, data.astype(np.float64)
    )
    assert (np.abs(outcome.result.astype(np.float64) - data) <= tolerance).all()
    assert peak < 2 * data.nbytes + params.window * params.chunk_elements * 16, peak


# --- every (state, input) pair of the session table ---------------------------------------


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


# --- the operation table: random input sequences -------------------------------------------

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


@pytest.mark.parametrize(
    "change",
    [
        {"dtype": DType.INT16},
        {"op": ReduceOp.MAX},
        {"kind": Collective.REDUCE_SCATTER},
        {"total_elements": 12},
        {"chunk_elements": 8},
    ],
)
def test_a_genuine_result_of_another_operation_is_refused(change: dict[str, object]) -> None:
    """A Result sealed with the group's keys but for a different operation shape is
    OPERATION_MISMATCH, even though its tag and bitmap verify on their own."""
    rig = joined()
    op_id, out = rig.start(int_request(list(range(8))))
    first, _ = sent(out, rig.parent, Contribution)
    header = dataclasses.replace(payload.ChunkHeader.of(first), **change)  # type: ignore[arg-type]
    values = np.arange(header.element_count, dtype=np.int64)
    parts = [payload.seal(KEYS, header, r, values) for r in range(WORLD)]
    (error,) = failures(rig.from_parent(payload.combine(parts, Result)))
    assert error.code is ErrorCode.OPERATION_MISMATCH and error.op_id == op_id


@pytest.mark.parametrize("explicit", [False, True])
def test_the_default_deadline_is_a_watchdog_an_explicit_timeout_a_bound(explicit: bool) -> None:
    """Without a timeout, an operation may take longer than the group's operation
    timeout in all, as long as its chunks keep completing; an explicit timeout bounds
    the whole operation."""
    rig = Rig()
    params = GroupParams(chunk_elements=4, window=1, heartbeat_interval_ms=100, operation_timeout_ms=1000)
    rig.join(params)
    limit = 1.1  # the operation timeout plus one heartbeat interval
    op_id, out = rig.start(int_request(list(range(12)), timeout=limit if explicit else None))
    outcomes: list[Command] = []
    for _ in range(3):  # one chunk at a time (window 1), each answered 0.9 s after it left
        (chunk,) = sent(out, rig.parent, Contribution)
        for _ in range(9):  # the rendezvous keeps talking while time passes
            rig.rendezvous(Heartbeat(seq=1))
            outcomes += rig.timer(rig.now + 0.1)
        if failures(outcomes):
            break
        out = rig.from_parent(result_for(chunk))
        outcomes += out
    if explicit:
        (error,) = failures(outcomes)
        assert error.code is ErrorCode.TIMEOUT and error.op_id == op_id
    else:
        assert failures(outcomes) == []
        (completed,) = [c for c in outcomes if isinstance(c, OperationCompleted)]
        assert completed.op_id == op_id and rig.now == pytest.approx(2.7)


# --- refusals found unasserted by the mutation run ------------------------------------


OTHER_GROUP = bytes.fromhex("ee" * 16)


@pytest.mark.parametrize(
    "message",
    [
        JoinAccept(
            group_id=OTHER_GROUP, rank=RANK, world_size=WORLD, epoch=2, group_secret=SECRET, params=PARAMS
        ),
        JoinReject(group_id=OTHER_GROUP, code=ErrorCode.GROUP_FULL, detail="full"),
        EpochChange(group_id=OTHER_GROUP, epoch=2, members=b"\x0f", code=ErrorCode.NO_ERROR),
    ],
    ids=["JoinAccept", "JoinReject", "EpochChange"],
)
def test_the_rendezvous_speaking_of_another_group_is_refused(message: Message) -> None:
    rig = joined()
    assert [e.code for e in sent(rig.rendezvous(message), "rv", Error)] == [ErrorCode.UNKNOWN_GROUP]
    assert rig.machine.state is SessionState.READY and rig.machine.epoch == 1


def test_a_tree_for_another_group_or_without_a_parent_is_refused() -> None:
    rig = joined()
    other = dataclasses.replace(tree(epoch=2), group_id=OTHER_GROUP)
    assert [e.code for e in sent(rig.rendezvous(other), "rv", Error)] == [ErrorCode.UNKNOWN_GROUP]
    orphan = dataclasses.replace(tree(epoch=2), parent=None)
    (error,) = sent(rig.rendezvous(orphan), "rv", Error)
    assert error.code is ErrorCode.INVALID_FIELD and "an endpoint needs a parent" in error.detail
    assert rig.machine.epoch == 1


def test_an_error_answering_the_join_request_ends_the_session_with_its_code() -> None:
    rig = Rig()
    rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    out = rig.rendezvous(Error(code=ErrorCode.UNAUTHORIZED, detail="ep-1 is already connected"))
    (failed,) = [c for c in out if isinstance(c, JoinFailed)]
    assert (
        failed.code is ErrorCode.UNAUTHORIZED and "join refused: ep-1 is already connected" in failed.detail
    )
    assert next(c for c in out if isinstance(c, ClosePeer)).code is ErrorCode.UNAUTHORIZED
    assert rig.machine.state is SessionState.REJECTED


def test_the_parent_may_send_only_data_traffic() -> None:
    rig = joined()
    (error,) = sent(rig.from_parent(accept()), rig.parent, Error)
    assert (
        error.code is ErrorCode.PROTOCOL_VIOLATION
        and "JoinAccept is not allowed from the parent" in error.detail
    )


@pytest.mark.parametrize("root", [-1, WORLD])
def test_a_root_outside_the_group_is_refused(root: int) -> None:
    rig = joined()
    with pytest.raises(CcoError, match=f"root {root} is not a rank of {WORLD}") as info:
        rig.start(CollectiveRequest(kind=Collective.REDUCE, array=np.zeros(2, np.int32), root=root))
    assert info.value.code is ErrorCode.INVALID_FIELD


@pytest.mark.parametrize("kind", [Collective.BROADCAST, Collective.ALL_GATHER, Collective.BARRIER])
def test_data_moving_kinds_take_no_reduction_op(kind: Collective) -> None:
    rig = joined()
    root = 0 if kind is Collective.BROADCAST else None
    array = None if kind is Collective.BARRIER else np.zeros(2, np.int32)
    with pytest.raises(CcoError, match="takes no reduction op") as info:
        rig.start(CollectiveRequest(kind=kind, op=ReduceOp.MIN, array=array, root=root))
    assert info.value.code is ErrorCode.INVALID_FIELD


def test_a_tensor_beyond_the_element_limit_is_refused() -> None:
    rig = joined()
    huge = np.broadcast_to(np.int8(0), (MAX_TOTAL_ELEMENTS + 1,))  # no memory behind it
    with pytest.raises(CcoError, match="exceed") as info:
        rig.start(CollectiveRequest(kind=Collective.ALL_REDUCE, array=huge))
    assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE
    slice_ = np.broadcast_to(np.int8(0), (MAX_TOTAL_ELEMENTS // WORLD + 1,))  # ALL_GATHER: world x slice
    with pytest.raises(CcoError, match="exceed"):
        rig.start(CollectiveRequest(kind=Collective.ALL_GATHER, array=slice_))


@pytest.mark.parametrize("bits", [8, 16, 32, 64])
def test_every_wire_width_can_be_asked_for(bits: int) -> None:
    rig = joined()
    _, out = rig.start(
        CollectiveRequest(kind=Collective.ALL_REDUCE, array=np.ones(40, np.float32), width=bits)
    )
    chunks = after_the_scale_pass(rig, out)
    assert len(chunks) == PARAMS.window
    assert all(c.width == bits // 8 and c.block_elements == PARAMS.block_elements for c in chunks)


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.AVG])
def test_a_small_float_sum_is_exact_in_one_pass(op: ReduceOp) -> None:
    """At most MAX_ELEMENTS elements: no scale pass (one op_id), every value's limbs at
    once (a width asked for changes nothing), and the correctly rounded sum: 1 + 2^-24
    is a tie that goes to the even 1."""
    rig = joined()
    data = np.array([1.0, 2.0**-24, -3.5], dtype=np.float32)
    request = CollectiveRequest(kind=Collective.ALL_REDUCE, op=op, array=data, width=16)
    op_id, out = rig.start(request)
    assert rig.machine.next_op_id == op_id + 1
    element = ELEMENT_TYPES[DType.FLOAT32]
    rank0 = to_limbs(np.array([2.0**-24, 2.0**-24, 0.5], dtype=np.float32), element)
    others = {r: rank0 if r == 0 else np.zeros(len(rank0), np.int64) for r in range(WORLD) if r != RANK}
    chunks, done = sent(out, rig.parent, Contribution), list(out)
    assert chunks[0].total_elements == 3 * limb_count(DType.FLOAT32) and chunks[0].scales is None
    while chunks:
        out = rig.from_parent(tree_result(chunks.pop(0), others))
        chunks += sent(out, rig.parent, Contribution)
        done += out
    (completed,) = [c for c in done if isinstance(c, OperationCompleted)]
    assert completed.result is not None and completed.result.dtype == np.float32
    expected = [1.0, 2.0**-23, -3.0]
    if op is ReduceOp.AVG:
        expected = [float(np.float32(x / WORLD)) for x in (1 + 2.0**-24, 2.0**-23, -3.0)]
    assert completed.result.tolist() == expected


def test_a_rendezvous_lost_while_joining_fails_the_join_with_the_reason() -> None:
    rig = Rig()
    rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    out = rig.feed(PeerDisconnected("rv", ErrorCode.PEER_LOST))
    (failed,) = [c for c in out if isinstance(c, JoinFailed)]
    assert failed.code is ErrorCode.PEER_LOST and "rendezvous connection closed" in failed.detail
    assert not [c for c in out if isinstance(c, ClosePeer) and c.peer == "rv"]  # already closed
    assert rig.machine.state is SessionState.CLOSED


def test_a_silent_rendezvous_is_closed_and_a_joined_session_detaches_without_join_failure() -> None:
    rig = Rig()
    rig.join(GroupParams(chunk_elements=4, window=2, heartbeat_interval_ms=100, operation_timeout_ms=1000))
    out = rig.timer(rig.now + 0.31)  # three silent heartbeat intervals
    assert (
        ClosePeer("rv", ErrorCode.PEER_LOST, "no message from the rendezvous for three heartbeat intervals")
        in out
    )
    assert not [c for c in out if isinstance(c, JoinFailed)]
    assert rig.machine.state is SessionState.READY and rig.machine.link is LinkState.DETACHED


def test_data_from_a_lost_parent_connection_is_refused() -> None:
    rig = joined()
    rig.start(int_request([1]))
    lost = rig.parent
    assert lost is not None
    rig.feed(PeerDisconnected(lost, ErrorCode.PEER_LOST))
    assert rig.machine.state is SessionState.RECONNECTING
    late = result_for(payload.seal(KEYS, int_header(0, 1, 1), RANK, np.ones(1, np.int64)))
    (error,) = sent(rig.feed(MessageReceived(lost, late)), lost, Error)
    assert error.code is ErrorCode.PROTOCOL_VIOLATION


def test_an_unencodable_input_while_the_tree_is_replanned_tells_nobody() -> None:
    """Only a rank in a ready tree sends the Abort that tells the others at once."""
    rig = joined()
    rig.rendezvous(EpochChange(group_id=GROUP, epoch=2, members=b"\x0f", code=ErrorCode.NO_ERROR))
    assert rig.machine.state is SessionState.REPLANNING
    _, out = rig.start(CollectiveRequest(kind=Collective.ALL_REDUCE, array=np.array([np.nan], np.float32)))
    (error,) = failures(out)
    assert error.code is ErrorCode.OVERFLOW and sent(out, rig.parent, Abort) == []


@pytest.mark.parametrize(
    "request_",
    [
        CollectiveRequest(kind=Collective.ALL_REDUCE, array=np.zeros(2, np.float32), dtype=DType.FLOAT16),
        CollectiveRequest(kind=Collective.ALL_REDUCE, dtype=DType.INT32),
    ],
    ids=["array-not-of-the-dtype", "no-array-though-not-a-receiver"],
)
def test_an_array_must_be_given_and_match_its_dtype(request_: CollectiveRequest) -> None:
    rig = joined()
    with pytest.raises(CcoError) as info:
        rig.start(request_)
    assert info.value.code is ErrorCode.INVALID_FIELD


def test_the_chunks_kept_for_restarted_operations_are_the_last_two_windows() -> None:
    rig = joined()
    for values in (list(range(20)), list(range(8))):  # 5 chunks, then 2 (window 2)
        _, out = rig.start(int_request(values))
        chunks = sent(out, rig.parent, Contribution)
        while chunks:
            out = rig.from_parent(result_for(chunks.pop(0)))
            chunks += sent(out, rig.parent, Contribution)
    assert rig.machine.kept_chunks == [(0, 3), (0, 4), (1, 0), (1, 1)]  # 2 x window, newest last


# --- the quorum policy ------------------------------------------------------------------------


def test_a_quorum_all_reduce_sends_its_presence_first_and_its_data_over_the_decided_members() -> None:
    rig = joined()
    op_id, out = rig.start(int_request([5, 6, 7], quorum=QUORUM))
    (presence,) = sent(out, rig.parent, Contribution)
    assert (presence.op_id, presence.quorum, presence.wait_ms) == (op_id - 1, 1, 500)
    assert presence.dtype is DType.INT8 and presence.total_elements == 1
    ranks = [0, RANK, 3]
    presence_result, data_result = quorum_results(op_id - 1, 1, [5, 6, 7], [0, 3], ranks)
    everyone = payload.combine([presence_result, presence], Result)  # this rank came in time
    (data,) = sent(rig.from_parent(everyone), rig.parent, Contribution)
    assert data.op_id == op_id and data.members == bitmap_from_ranks(ranks) and data.quorum is None
    result = payload.combine([data_result, data], Result)
    (done,) = [c for c in rig.from_parent(result) if isinstance(c, OperationCompleted)]
    assert done.contributors == frozenset(ranks)
    assert done.result is not None and done.result.tolist() == [0 + 3 + 5, 0 + 3 + 6, 0 + 3 + 7]


def test_a_rank_the_quorum_went_on_without_sends_no_data_and_gets_the_result() -> None:
    rig = joined()
    op_id, _ = rig.start(int_request([5, 6], quorum=QUORUM))
    presence, data = quorum_results(op_id - 1, 1, [5, 6], [0, 2])
    assert sent(rig.from_parent(presence), rig.parent, Contribution) == []
    (done,) = [c for c in rig.from_parent(data) if isinstance(c, OperationCompleted)]
    assert done.contributors == {0, 2} and done.result is not None and done.result.tolist() == [2, 2]


def test_a_presence_result_short_of_the_quorum_fails_verification() -> None:
    rig = joined()
    op_id, _ = rig.start(int_request([5], quorum=Quorum(min_ranks=3, wait=0.5)))
    header = dataclasses.replace(int_header(op_id - 1, 1, 1), dtype=DType.INT8, quorum=3, wait_ms=500)
    two = payload.combine([payload.seal(KEYS, header, r, np.ones(1, dtype=np.int64)) for r in (0, 2)], Result)
    (error,) = failures(rig.from_parent(two))
    assert error.code is ErrorCode.VERIFICATION_FAILED and error.op_id == op_id
    assert "presence pass" in str(error) and "a quorum of 3 needed" in str(error)


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (int_request([1], kind=Collective.REDUCE_SCATTER, quorum=QUORUM), ErrorCode.UNSUPPORTED_FEATURE),
        (int_request([1], quorum=Quorum(min_ranks=0, wait=0.5)), ErrorCode.INVALID_FIELD),
        (int_request([1], quorum=Quorum(min_ranks=WORLD + 1, wait=0.5)), ErrorCode.INVALID_FIELD),
        (int_request([1], quorum=Quorum(min_ranks=1, wait=0)), ErrorCode.INVALID_FIELD),
    ],
)
def test_a_bad_quorum_is_refused_at_start(request_: CollectiveRequest, code: ErrorCode) -> None:
    rig = joined()
    with pytest.raises(CcoError) as refused:
        rig.start(request_)
    assert refused.value.code is code


# --- prepare(): the whole-tensor work before start(), for another thread ------------------------


def test_a_prepared_start_sends_what_a_direct_start_sends() -> None:
    data = np.random.default_rng(3).standard_normal(40).astype(np.float32)  # block-scaled
    request = CollectiveRequest(kind=Collective.ALL_REDUCE, array=data)
    direct, planned = joined(), joined()
    prepared = planned.machine.prepare(request)
    assert planned.machine.next_op_id == 0  # nothing started, no op_id taken
    prepared.compute()
    assert prepared.operation.scaling is not None  # the proposals, computed before start
    assert direct.start(request)[1] == planned.machine.start(request, planned.now, prepared)[1]


def test_a_plan_made_under_other_group_parameters_is_made_again() -> None:
    rig = joined()
    request = int_request(list(range(10)))
    prepared = rig.machine.prepare(request)
    prepared.compute()
    wider = dataclasses.replace(PARAMS, chunk_elements=8)
    rig.rendezvous(EpochChange(group_id=GROUP, epoch=2, members=b"\x0f", code=ErrorCode.NO_ERROR))
    rig.rendezvous(tree(epoch=2, params=wider))
    _, out = rig.machine.start(request, rig.now, prepared)
    assert {m.chunk_elements for m in sent(out, rig.parent, Contribution)} == {8}


def test_a_prepared_unencodable_input_fails_at_start_and_keeps_op_ids_aligned() -> None:
    rig = joined()
    request = CollectiveRequest(kind=Collective.ALL_REDUCE, array=np.array([1.0, np.nan], dtype=np.float32))
    prepared = rig.machine.prepare(request)
    prepared.compute()
    op_id, out = rig.machine.start(request, rig.now, prepared)
    (error,) = failures(out)
    assert error.code is ErrorCode.OVERFLOW and error.op_id == op_id
    assert rig.start(int_request([1]))[0] == op_id + 1


def _operation(machine: EndpointMachine, op_id: int) -> Any:
    """The operation ``op_id`` in flight at ``machine`` (its engine's record)."""
    assert machine._joined is not None
    return machine._joined.engine.operation(op_id)


def test_a_prepared_operation_starts_sized_as_a_direct_one_over_the_members_of_now() -> None:
    """start() keeps prepare()'s sizing and only takes the members of the moment."""
    request = int_request(list(range(10)))
    direct, planned = joined(), joined()
    prepared = planned.machine.prepare(request)
    assert prepared.operation.members == frozenset()  # prepare() does not know them yet
    direct_id, _ = direct.start(request)
    planned_id, _ = planned.machine.start(request, planned.now, prepared)
    ours, theirs = _operation(planned.machine, planned_id), _operation(direct.machine, direct_id)
    fields = ("total", "chunk_elements", "chunks", "members")
    assert [getattr(ours, f) for f in fields] == [getattr(theirs, f) for f in fields]
    assert ours.members == planned.machine.members


@pytest.mark.parametrize(
    "array",
    [
        np.ones((), dtype=np.float32),
        np.arange(12, dtype=np.int32).reshape(3, 4),
        np.arange(12, dtype=np.int32).reshape(3, 4).T,  # not C-contiguous: copied
        np.arange(12, dtype=np.int64)[::2],
        np.zeros((0, 3), dtype=np.float64),
    ],
)
def test_the_source_is_the_input_flattened_a_view_when_it_can_be(array: np.ndarray) -> None:
    source = source_of(array)
    assert source.shape == (array.size,) and source.dtype == array.dtype and source.flags.c_contiguous
    assert np.array_equal(source, np.ascontiguousarray(array).reshape(-1))
    assert np.shares_memory(source, array) == (array.flags.c_contiguous and array.size > 0)
