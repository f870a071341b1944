"""The flight recorder: what an aggregator and an endpoint remember of their last
operations and chunks, the ranks a chunk still waits for, and its bound."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cco.nodes.events import OperationCompleted
from cco.services.recorder import Recorder
from cco.wire.errors import ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import (
    Abort,
    Address,
    Contribution,
    GroupParams,
    JoinAccept,
    NodeRef,
    PartialAggregate,
    Result,
    TreeAssignment,
)
from cco.wire.registries import Collective, DType, ReduceOp

GROUP = bytes(range(16))
PARAMS = GroupParams(chunk_elements=4, window=4, heartbeat_interval_ms=1000, operation_timeout_ms=30_000)


def _ref(node_id: str, ranks: list[int]) -> NodeRef:
    return NodeRef(node_id=node_id, address=Address(host="h", port=1), ranks=bitmap_from_ranks(ranks))


def _assignment(expected: list[int], epoch: int = 1) -> TreeAssignment:
    return TreeAssignment(
        group_id=GROUP,
        epoch=epoch,
        world_size=4,
        expected=bitmap_from_ranks(expected),
        children=tuple(_ref(f"ep-{r}", [r]) for r in expected),
        params=PARAMS,
        parent=_ref("agg-0", [0, 1, 2, 3]),
    )


def _chunk(cls: type, ranks: list[int], op_id: int = 7, chunk: int = 1, elements: int = 12):  # type: ignore[no-untyped-def]
    return cls(
        group_id=GROUP,
        epoch=1,
        op_id=op_id,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.INT32,
        total_elements=elements,
        chunk_elements=4,
        chunk_index=chunk,
        contributors=bitmap_from_ranks(ranks),
        width=4,
        payload=np.zeros(4, dtype="<i4").tobytes(),
    )


def test_an_aggregator_names_the_ranks_a_chunk_still_waits_for() -> None:
    recorder = Recorder(started=100.0)
    recorder.received(_assignment([0, 1, 2]), 100.0)
    for rank in (0, 2):
        recorder.received(_chunk(Contribution, [rank]), 100.5)
    chunk = recorder.entries[(GROUP, 1, 7, 1)]
    operation = recorder.entries[(GROUP, 1, 7, None)]
    assert (chunk.state, chunk.missing, chunk.elements) == ("collecting", frozenset({1}), 4)
    assert (operation.state, operation.elements, operation.chunks) == ("running", 12, 3)
    view = recorder.view(chunk)
    assert ranks_from_bitmap(view.missing) == {1} and view.started_ms == 500
    recorder.received(_chunk(Contribution, [1]), 101.0)
    recorder.sent(_chunk(PartialAggregate, [0, 1, 2]), 101.0)
    assert (chunk.state, chunk.missing) == ("sent up", frozenset())
    recorder.received(_chunk(Result, [0, 1, 2, 3]), 101.2)
    assert chunk.state == "complete" and recorder.view(chunk).updated_ms == 1200
    assert recorder.groups[GROUP].children == {0: "ep-0", 1: "ep-1", 2: "ep-2"}
    assert recorder.groups[GROUP].parent == "agg-0"


def test_a_quorum_chunk_waits_only_for_the_ranks_it_runs_over() -> None:
    recorder = Recorder(started=0.0)
    recorder.received(_assignment([0, 1, 2]), 0.0)
    part = dataclasses.replace(_chunk(Contribution, [0]), members=bitmap_from_ranks([0, 2]))
    recorder.received(part, 1.0)
    assert recorder.entries[(GROUP, 1, 7, 1)].missing == {2}


def test_an_abort_keeps_the_ranks_it_names() -> None:
    recorder = Recorder(started=0.0)
    recorder.received(_assignment([0, 1, 2]), 0.0)
    recorder.received(_chunk(Contribution, [0]), 1.0)
    abort = Abort(
        group_id=GROUP, epoch=1, op_id=7, code=ErrorCode.TIMEOUT, detail="", missing=bitmap_from_ranks([1])
    )
    recorder.sent(abort, 2.0)
    operation = recorder.entries[(GROUP, 1, 7, None)]
    assert operation.state == "aborted" and ranks_from_bitmap(recorder.view(operation).missing) == frozenset()
    assert operation.expected == 0b10


def test_an_endpoint_records_its_chunks_and_the_outcome() -> None:
    recorder = Recorder(started=0.0)
    accept = JoinAccept(group_id=GROUP, rank=2, world_size=4, epoch=1, group_secret=bytes(32), params=PARAMS)
    recorder.received(accept, 0.0)
    recorder.received(dataclasses.replace(_assignment([2]), children=()), 0.0)
    for chunk in range(3):
        recorder.sent(_chunk(Contribution, [2], chunk=chunk), 1.0)
    assert [e.state for e in recorder.entries.values()] == ["running", "sent", "sent", "sent"]
    assert recorder.entries[(GROUP, 1, 7, 0)].missing == frozenset()  # an endpoint waits for no rank
    recorder.received(_chunk(Result, [0, 1, 2, 3], chunk=0), 1.5)
    recorder.command(OperationCompleted(op_id=7, result=None), 2.0)
    assert recorder.entries[(GROUP, 1, 7, None)].state == "complete"
    place = recorder.groups[GROUP]
    assert (place.rank, place.parent, place.epoch) == (2, "agg-0", 1)


def test_memory_is_bounded_oldest_first() -> None:
    recorder = Recorder(started=0.0, capacity=10)
    for op_id in range(20):
        recorder.sent(_chunk(Contribution, [0], op_id=op_id, chunk=0), float(op_id))
    assert len(recorder.entries) == 10
    assert min(key[2] for key in recorder.entries) == 15  # an operation and its chunk each
    recorder.resize(4)
    assert [key[2:] for key in recorder.entries] == [(18, None), (18, 0), (19, None), (19, 0)]
    assert [v.op_id for v in recorder.views(3)] == [18, 19, 19]
    with pytest.raises(ValueError):
        Recorder(started=0.0, capacity=0)
