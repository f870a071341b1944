"""Collectives at an endpoint: the window, verification of every result, copies,
aborts and deadlines, broadcasts, retransmission, and inputs that do not encode.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from endpoint_rig import (
    GROUP,
    KEYS,
    PARAMS,
    QUORUM,
    RANK,
    WORLD,
    Rig,
    after_the_scale_pass,
    failures,
    int_request,
    joined,
    others,
    result_for,
    root_chunks,
    sent,
    tree_result,
)

from cco.nodes import data_operation
from cco.nodes.calls import CollectiveRequest
from cco.nodes.endpoint_states import (
    OperationState,
    SessionState,
)
from cco.nodes.events import (
    Command,
    OperationCompleted,
)
from cco.wire import payload
from cco.wire.dtypes import ELEMENT_TYPES
from cco.wire.errors import ErrorCode
from cco.wire.exact import limb_count, to_limbs
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import (
    Abort,
    BroadcastData,
    ChunkAck,
    Contribution,
    EpochChange,
    GroupParams,
    Heartbeat,
    Report,
    Result,
    RetransmitRequest,
)
from cco.wire.packing import narrow, unpack
from cco.wire.registries import Collective, DType, ReduceOp


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
    # the rendezvous hears of it; the next operation waits for the tree that follows
    # (tests/nodes/test_endpoint_tamper_reports.py)
    (report,) = sent(out, "rv", Report)
    assert report.op_id == op_id and report.parent == "leaf"


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


def test_average_divides_by_members() -> None:
    rig = joined()
    _, out = rig.start(int_request([10, 11, 12, 13], op=ReduceOp.AVG))
    (contribution,) = sent(out, rig.parent, Contribution)
    (completed,) = rig.from_parent(result_for(contribution, lambda rank, i: 10 + i))
    assert isinstance(completed, OperationCompleted) and completed.result is not None
    assert completed.result.tolist() == [10, 11, 12, 13]


def test_unencodable_input_fails_the_operation_and_keeps_op_ids_aligned() -> None:
    rig = joined()
    request = CollectiveRequest(kind=Collective.ALL_REDUCE, array=np.array([1.0, np.nan], dtype=np.float32))
    op_id, out = rig.start(request)
    (error,) = failures(out)
    assert error.code is ErrorCode.OVERFLOW and error.missing_ranks == frozenset({RANK})
    (abort,) = sent(out, rig.parent, Abort)
    assert abort.missing == bitmap_from_ranks([RANK])
    assert rig.start(int_request([1]))[0] == op_id + 1


@pytest.mark.parametrize(("quorum", "elements"), [(False, 2), (False, 40), (True, 2), (True, 40)])
def test_an_unencodable_input_aborts_the_calls_first_op_id_only(quorum: bool, elements: int) -> None:
    """A call of one, two or three op_ids (its presence pass, its scale pass, its
    data): one Abort, for the first, in the current epoch; the caller's failure names
    the data's op_id."""
    rig = joined()
    first = rig.machine.next_op_id
    array = np.ones(elements, np.float32)
    array[1] = np.nan
    request = CollectiveRequest(kind=Collective.ALL_REDUCE, array=array, quorum=QUORUM if quorum else None)
    op_id, out = rig.start(request)
    assert op_id == first + quorum + (elements > 16)  # a scale pass beyond the EXACT form's 16
    (abort,) = sent(out, rig.parent, Abort)
    assert (abort.op_id, abort.epoch, abort.code) == (first, 1, ErrorCode.OVERFLOW)
    assert abort.missing == bitmap_from_ranks([RANK])
    (error,) = failures(out)
    assert error.code is ErrorCode.OVERFLOW and error.op_id == op_id
    assert rig.machine.next_op_id == op_id + 1


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
    assert "does not match the operation" in error.detail


def test_the_operations_chunk_in_another_kind_of_message_is_refused() -> None:
    """An all-reduce's result comes as a Result: the same chunk as BroadcastData, its
    identity and tag intact, is not taken for it."""
    rig = joined()
    op_id, out = rig.start(int_request(list(range(4))))
    (first,) = sent(out, rig.parent, Contribution)
    result = result_for(first)
    disguised = BroadcastData(**{f.name: getattr(result, f.name) for f in dataclasses.fields(result)})
    (error,) = failures(rig.from_parent(disguised))
    assert error.code is ErrorCode.OPERATION_MISMATCH and error.op_id == op_id
    assert error.detail.startswith(f"group {GROUP.hex()} op {op_id} ALL_REDUCE: chunk 0: BroadcastData")


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


def test_one_watchdog_per_call_moved_on_by_a_verified_chunk_of_any_of_its_passes() -> None:
    """A quorum float sum is three op_ids (presence, scales, data) under one deadline:
    the presence pass's Result, verified late, moves it for the scale pass too; only
    verified chunks move it."""
    rig = Rig()
    params = GroupParams(chunk_elements=4, window=1, heartbeat_interval_ms=100, operation_timeout_ms=1000)
    rig.join(params)  # the watchdog: 1.1 s after the start or the last verified chunk
    request = CollectiveRequest(kind=Collective.ALL_REDUCE, array=np.ones(40, np.float32), quorum=QUORUM)
    op_id, out = rig.start(request)
    outcomes: list[Command] = []

    def wait_until(moment: float) -> None:
        while rig.now < moment - 1e-9:  # the rendezvous keeps talking while time passes
            rig.rendezvous(Heartbeat(seq=1))
            outcomes.extend(rig.timer(rig.now + 0.1))

    (presence,) = sent(out, rig.parent, Contribution)
    wait_until(0.9)
    (scales,) = sent(rig.from_parent(result_for(presence, lambda rank, i: 1)), rig.parent, Contribution)
    assert scales.op_id == op_id - 1
    wait_until(1.9)  # past the start's watchdog, within the one the presence Result moved
    assert failures(outcomes) == []
    others = {r: np.zeros(0) for r in range(WORLD) if r != RANK}
    while scales.op_id != op_id:  # the scale pass's chunks, then the data's first
        (scales,) = sent(rig.from_parent(tree_result(scales, others)), rig.parent, Contribution)
    wait_until(2.9)  # chunks sent again (at half the timeout) move nothing
    assert failures(outcomes) == [] and sent(outcomes, rig.parent, Contribution)
    wait_until(3.1)
    (error,) = failures(outcomes)
    assert error.code is ErrorCode.TIMEOUT and error.op_id == op_id


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


def test_an_unencodable_input_while_the_tree_is_replanned_tells_nobody() -> None:
    """Only a rank in a ready tree sends the Abort that tells the others at once."""
    rig = joined()
    rig.rendezvous(EpochChange(group_id=GROUP, epoch=2, members=b"\x0f", code=ErrorCode.NO_ERROR))
    assert rig.machine.state is SessionState.REPLANNING
    _, out = rig.start(CollectiveRequest(kind=Collective.ALL_REDUCE, array=np.array([np.nan], np.float32)))
    (error,) = failures(out)
    assert error.code is ErrorCode.OVERFLOW and sent(out, rig.parent, Abort) == []


def test_the_chunks_kept_for_restarted_operations_are_the_last_two_windows() -> None:
    rig = joined()
    for values in (list(range(20)), list(range(8))):  # 5 chunks, then 2 (window 2)
        _, out = rig.start(int_request(values))
        chunks = sent(out, rig.parent, Contribution)
        while chunks:
            out = rig.from_parent(result_for(chunks.pop(0)))
            chunks += sent(out, rig.parent, Contribution)
    assert rig.machine.kept_chunks == [(0, 3), (0, 4), (1, 0), (1, 1)]  # 2 x window, newest last
