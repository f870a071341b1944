"""Results decoded chunk by chunk are the bits of a whole-array decode, and a large
operation holds its result and a few chunks, whatever the tensor size.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import reference
from endpoint_rig import (
    RANK,
    WORLD,
    Rig,
    root_chunks,
    sent,
    tree_result,
)

from cco.nodes.calls import CollectiveRequest
from cco.nodes.events import (
    Command,
    OperationCompleted,
    OperationFailed,
)
from cco.wire import payload
from cco.wire.dtypes import ELEMENT_TYPES
from cco.wire.messages import (
    ChunkMessage,
    GroupParams,
)
from cco.wire.ops import OPS, Form, form
from cco.wire.packing import contribution_bound, unpack
from cco.wire.registries import Collective, DType, ReduceOp

SPLIT = GroupParams(chunk_elements=5, window=2, heartbeat_interval_ms=600_000, operation_timeout_ms=1000)
"""Five wire integers per chunk: chunks split 64-bit elements and ALL_GATHER slices."""


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
