"""What a call must be: the checks prepare() and start() make before an operation gets
its op_ids, and the whole-tensor work prepared off the event loop.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from endpoint_rig import (
    GROUP,
    PARAMS,
    QUORUM,
    WORLD,
    Rig,
    accept,
    failures,
    int_request,
    joined,
    sent,
    tree,
)

from cco.nodes.calls import CollectiveRequest
from cco.nodes.data_operation import source_of
from cco.nodes.endpoint import EndpointMachine
from cco.nodes.endpoint_states import SessionState
from cco.nodes.events import PeerConnected
from cco.nodes.operation import Quorum
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import (
    MAX_TOTAL_ELEMENTS,
    Contribution,
    EpochChange,
)
from cco.wire.registries import Collective, DType, ReduceOp, Role


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


def test_a_joined_session_starts_nothing_without_a_tree_or_once_it_left() -> None:
    """start() and prepare() need a session that can send: joined is not enough."""
    rig = Rig()
    rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    rig.rendezvous(accept())  # admitted, but no tree yet
    assert rig.machine.rank is not None and rig.machine.state is SessionState.ACCEPTED
    barrier = CollectiveRequest(kind=Collective.BARRIER)
    for call in (lambda: rig.start(barrier), lambda: rig.machine.prepare(barrier)):
        with pytest.raises(CcoError, match="is not allowed in state ACCEPTED") as info:
            call()
        assert info.value.code is ErrorCode.PROTOCOL_VIOLATION
    rig.machine.leave(rig.now)
    with pytest.raises(CcoError, match="is not allowed in state LEFT"):
        rig.start(barrier)


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
