"""Aggregation properties: any tree, any arrival order, the same exact and verified bytes.

For random tensors, dtypes, widths and group sizes 1..64, contributions are combined
up a random tree whose shape and arrival order are drawn by Hypothesis.  The verified
result must equal a reference computed with Python integers and fractions (never with
the code under test), and two different trees must give bit-identical messages.
Float sums travel block-scaled at a fixed width, float minima and maxima as
order-preserving keys, integers as themselves.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cco.wire.blockscale import attestations, block_count, propose, quantize, sum_limit
from cco.wire.dtypes import element_type, from_ordered_keys
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import (
    ChunkMessage,
    PartialAggregate,
    Result,
    chunk_count,
    decode_message,
    encode_message,
)
from cco.wire.payload import (
    RANGE_BOUND,
    ChunkHeader,
    GroupKeys,
    check_encoding,
    combine,
    contribution_bound,
    decode_values,
    derive_group_keys,
    encode_values,
    open_verified,
    seal,
)
from cco.wire.registries import Collective, DType, ReduceOp

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GROUP = bytes(range(16))
KEYS = derive_group_keys(bytes(range(100, 132)), GROUP)

INT_TYPES: dict[DType, Any] = {
    DType.INT8: np.int8,
    DType.INT16: np.int16,
    DType.INT32: np.int32,
    DType.INT64: np.int64,
}
FLOAT_TYPES = {
    DType.FLOAT16: np.float16,
    DType.BFLOAT16: np.float32,
    DType.FLOAT32: np.float32,
    DType.FLOAT64: np.float64,
}


def header(
    dtype: DType,
    total: int,
    chunk: int,
    index: int,
    *,
    op: ReduceOp = ReduceOp.SUM,
    width: int | None = None,
    block_elements: int | None = None,
    scales: np.ndarray | None = None,
) -> ChunkHeader:
    """A chunk header; ``width``, ``block_elements`` and ``scales`` for block-scaled chunks."""
    return ChunkHeader(
        group_id=GROUP,
        epoch=3,
        op_id=11,
        kind=Collective.ALL_REDUCE,
        op=op,
        dtype=dtype,
        total_elements=total,
        chunk_elements=chunk,
        chunk_index=index,
        width=width,
        block_elements=block_elements,
        scales=None if scales is None else np.asarray(scales, dtype="<i2").tobytes(),
    )


def random_tree(parts: Sequence[ChunkMessage], rng: random.Random) -> ChunkMessage:
    """Combine ``parts`` up a random tree: random groups, each combined in a random order."""
    level = list(parts)
    rng.shuffle(level)
    while len(level) > 1:
        grouped: list[ChunkMessage] = []
        i = 0
        while i < len(level):
            size = rng.randint(1, min(6, len(level) - i))
            children = level[i : i + size]
            i += size
            rng.shuffle(children)
            grouped.append(children[0] if size == 1 else combine(children, PartialAggregate))
        if len(grouped) == len(level):  # every group had one member: force progress
            grouped = [combine(grouped[:2], PartialAggregate), *grouped[2:]]
        level = grouped
        rng.shuffle(level)
    return combine(level, Result)


def int_inputs(dtype: DType, world: int, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    numpy_type = INT_TYPES[dtype]
    info = np.iinfo(numpy_type)
    bound = min(int(info.max), contribution_bound(world))
    inputs = []
    for _ in range(world):
        x = rng.integers(-bound, bound, size=n, endpoint=True, dtype=np.int64)
        if n:  # include the extremes often
            x[rng.integers(0, n)] = bound if rng.random() < 0.5 else -bound
        inputs.append(x.astype(numpy_type))
    return inputs


def float_inputs(dtype: DType, world: int, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    numpy_type = FLOAT_TYPES[dtype]
    magnitude = 60000.0 if dtype is DType.FLOAT16 else 2.0**20
    inputs = []
    for _ in range(world):
        x = rng.uniform(-magnitude, magnitude, size=n) * 2.0 ** rng.integers(-30, 1, size=n)
        inputs.append(x.astype(numpy_type))
    return inputs


def exact_fixed(x: np.ndarray, dtype: DType, scales: np.ndarray, block: int) -> list[int]:
    """round_half_even(x * 2^s_b) with Python's exact Fraction arithmetic, s_b the
    scale of element j's block j // block."""
    if dtype is DType.BFLOAT16:  # the tensor is bfloat16: round the float32 inputs first
        bits = x.astype("<f4").view("<u4").astype(np.uint64)
        x = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype("<u4").view("<f4")
    return [round(Fraction(float(v)) * Fraction(2) ** int(scales[j // block])) for j, v in enumerate(x)]


def reference_sum(wire_inputs: list[list[int]]) -> list[int]:
    return [sum(column) for column in zip(*wire_inputs, strict=True)]


def seal_all(keys: GroupKeys, wires: list[np.ndarray], make: ChunkHeader, chunk: int) -> list[ChunkMessage]:
    start = make.chunk_index * chunk
    return [seal(keys, make, rank, w[start : start + make.element_count]) for rank, w in enumerate(wires)]


@SETTINGS
@given(
    dtype=st.sampled_from(list(INT_TYPES)),
    world=st.integers(1, 64),
    n=st.integers(0, 40),
    chunk=st.integers(1, 48),
    seed=st.integers(0, 2**32 - 1),
    tree_a=st.randoms(use_true_random=False),
    tree_b=st.randoms(use_true_random=False),
)
def test_random_trees_give_the_exact_integer_sum_bit_identically(
    dtype: DType,
    world: int,
    n: int,
    chunk: int,
    seed: int,
    tree_a: random.Random,
    tree_b: random.Random,
) -> None:
    rng = np.random.default_rng(seed)
    inputs = int_inputs(dtype, world, n, rng)
    exact = [[int(v) for v in x] for x in inputs]
    wires = [encode_values(x, dtype, Collective.ALL_REDUCE, ReduceOp.SUM, world) for x in inputs]
    for wire, want in zip(wires, exact, strict=True):
        assert wire.tolist() == want
    expected_sum = reference_sum(exact) if n else []

    index = rng.integers(0, chunk_count(n, chunk))
    make = header(dtype, n, chunk, int(index))
    parts = seal_all(KEYS, wires, make, chunk)
    first = random_tree(parts, tree_a)
    second = random_tree(parts, tree_b)
    assert encode_message(first) == encode_message(second)

    received = decode_message(encode_message(first))
    assert isinstance(received, ChunkMessage)
    values = open_verified(KEYS, received, frozenset(range(world)))
    start = int(index) * chunk
    assert values.tolist() == expected_sum[start : start + make.element_count]
    assert all(abs(v) <= RANGE_BOUND for v in values.tolist())
    assert received.width == (minimal_width(values) if n else 1)  # the smallest that holds them


def minimal_width(values: np.ndarray) -> int:
    """1, 2, 4 or 8: the first whose signed range holds every value (by definition)."""
    return next(
        w for w in (1, 2, 4, 8) if all(-(2 ** (8 * w - 1)) <= int(v) < 2 ** (8 * w - 1) for v in values)
    )


def block_scaled_chunk(
    inputs: list[np.ndarray], dtype: DType, width: int, block: int, chunk: int, index: int, n: int
) -> tuple[ChunkHeader, list[ChunkMessage], list[list[int]], list[int]]:
    """Chunk ``index`` of a block-scaled SUM of ``inputs`` as every rank seals it:
    proposals from each rank's own chunk, the agreed scales (their minimum, as the
    scale pass computes), its quantized elements and its attestations.  Also returns
    each rank's exact integers (by Fraction) and each block's attestation count."""
    world = len(inputs)
    limit = sum_limit(width, world)
    element = element_type(dtype)
    start = index * chunk
    pieces = [x[start : start + chunk] for x in inputs]
    proposals = [propose(piece, element, block, limit) for piece in pieces]
    agreed = np.min(np.stack(proposals), axis=0)
    make = header(dtype, n, chunk, index, width=width, block_elements=block, scales=agreed)
    parts = []
    for rank, (piece, own) in enumerate(zip(pieces, proposals, strict=True)):
        values = np.concatenate([quantize(piece, element, agreed, block, limit), attestations(own, agreed)])
        parts.append(seal(KEYS, make, rank, values))
    exact = [exact_fixed(piece, dtype, agreed, block) for piece in pieces]
    attested = [sum(int(p[b]) == int(agreed[b]) for p in proposals) for b in range(len(agreed))]
    return make, parts, exact, attested


@SETTINGS
@given(
    dtype=st.sampled_from(list(FLOAT_TYPES)),
    width=st.sampled_from([1, 2, 4, 8]),
    world=st.integers(1, 64),
    n=st.integers(0, 60),
    chunk=st.integers(1, 48),
    block=st.sampled_from([16, 17, 32]),
    seed=st.integers(0, 2**32 - 1),
    tree_a=st.randoms(use_true_random=False),
    tree_b=st.randoms(use_true_random=False),
)
def test_random_trees_give_the_exact_block_scaled_sum_at_the_fixed_width(
    dtype: DType,
    width: int,
    world: int,
    n: int,
    chunk: int,
    block: int,
    seed: int,
    tree_a: random.Random,
    tree_b: random.Random,
) -> None:
    rng = np.random.default_rng(seed)
    inputs = float_inputs(dtype, world, n, rng)
    index = int(rng.integers(0, chunk_count(n, chunk)))
    make, parts, exact, attested = block_scaled_chunk(inputs, dtype, width, block, chunk, index, n)
    assert make.block_count == block_count(make.element_count, block) == len(attested)
    limit = sum_limit(width, world)
    for part, want in zip(parts, exact, strict=True):
        assert part.width == width
        assert np.frombuffer(part.payload, f"<i{width}")[: make.element_count].tolist() == want
        assert all(abs(v) <= limit for v in want)
    first = random_tree(parts, tree_a)
    second = random_tree(parts, tree_b)
    assert encode_message(first) == encode_message(second)
    assert first.width == width  # combine keeps the fixed width, never narrows or widens
    if len(parts) > 1:
        assert combine(parts[:2], PartialAggregate).width == width

    received = decode_message(encode_message(first))
    assert isinstance(received, ChunkMessage)
    assert received.scales == make.scales and received.block_elements == block
    values = open_verified(KEYS, received, frozenset(range(world)))
    assert values.tolist() == reference_sum(exact)
    carried = np.frombuffer(received.payload, f"<i{width}")[make.element_count :].tolist()
    assert carried == attested
    assert all(1 <= a <= world for a in attested)


@SETTINGS
@given(
    dtype=st.sampled_from(list(FLOAT_TYPES)),
    op=st.sampled_from([ReduceOp.MIN, ReduceOp.MAX]),
    world=st.integers(1, 64),
    n=st.integers(0, 40),
    seed=st.integers(0, 2**32 - 1),
    tree=st.randoms(use_true_random=False),
)
def test_random_trees_give_the_exact_float_minimum_and_maximum(
    dtype: DType, op: ReduceOp, world: int, n: int, seed: int, tree: random.Random
) -> None:
    rng = np.random.default_rng(seed)
    inputs = float_inputs(dtype, world, n, rng)
    if dtype is DType.BFLOAT16:  # bfloat16 values: float32 with the low 16 bits clear
        inputs = [(x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32) for x in inputs]
    for x in inputs:  # signed zeros and infinities order too
        x[rng.random(n) < 0.2] = rng.choice(np.array([0.0, -0.0, np.inf, -np.inf], dtype=x.dtype))
    wires = [encode_values(x, dtype, Collective.ALL_REDUCE, op, world) for x in inputs]
    make = header(dtype, n, max(n, 1), 0, op=op)
    parts = [seal(KEYS, make, r, w) for r, w in enumerate(wires)]
    assert all(p.tag is None and p.scales is None for p in parts)
    result = random_tree(parts, tree)
    for rank in range(world):
        values = open_verified(KEYS, result, frozenset(range(world)), own=(rank, wires[rank]))
    out = from_ordered_keys(values, element_type(dtype))
    pick = min if op is ReduceOp.MIN else max
    for j in range(n):
        want = pick((float(x[j]) for x in inputs), key=lambda v: (v, math.copysign(1.0, v)))
        assert (float(out[j]), math.copysign(1.0, float(out[j]))) == (want, math.copysign(1.0, want))


@SETTINGS
@given(
    world=st.integers(2, 40),
    n=st.integers(1, 30),
    seed=st.integers(0, 2**32 - 1),
    order=st.randoms(use_true_random=False),
)
def test_combine_is_independent_of_the_order_of_its_parts(
    world: int, n: int, seed: int, order: random.Random
) -> None:
    inputs = int_inputs(DType.INT32, world, n, np.random.default_rng(seed))
    make = header(DType.INT32, n, n, 0)
    parts = [seal(KEYS, make, r, x.astype(np.int64)) for r, x in enumerate(inputs)]
    shuffled = list(parts)
    order.shuffle(shuffled)
    assert encode_message(combine(parts, Result)) == encode_message(combine(shuffled, Result))


@pytest.mark.parametrize("op", [ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR])
def test_untagged_ops_combine_elementwise_and_check_consistency(op: ReduceOp) -> None:
    """Untagged ops carry any int64: no range bound applies to them."""
    rng = np.random.default_rng(int(op))
    world, n = 9, 50
    inputs = [rng.integers(-(2**63), 2**63 - 1, size=n, endpoint=True) for _ in range(world)]
    inputs[0][:2] = [2**63 - 1, -(2**63)]
    make = header(DType.INT64, n, n, 0, op=op)
    parts = [seal(KEYS, make, r, x) for r, x in enumerate(inputs)]
    assert all(p.tag is None for p in parts)
    result = random_tree(parts, random.Random(int(op)))
    assert result.tag is None
    pairwise: dict[ReduceOp, Callable[[int, int], int]] = {
        ReduceOp.MIN: min,
        ReduceOp.MAX: max,
        ReduceOp.BAND: lambda a, b: a & b,
        ReduceOp.BOR: lambda a, b: a | b,
        ReduceOp.BXOR: lambda a, b: a ^ b,
    }
    expected = [_fold([int(x[j]) for x in inputs], pairwise[op]) for j in range(n)]
    for rank in range(world):
        values = open_verified(KEYS, result, frozenset(range(world)), own=(rank, inputs[rank]))
        assert values.tolist() == expected


def _fold(column: list[int], f: Callable[[int, int], int]) -> int:
    acc = column[0]
    for v in column[1:]:
        acc = f(acc, v)
    return acc


def test_avg_is_the_verified_sum_divided_at_the_endpoint() -> None:
    world = 4
    inputs = [np.array([1, 2, 3, -3, 5, 7], dtype=np.int32) * (r + 1) for r in range(world)]
    make = header(DType.INT32, 6, 6, 0, op=ReduceOp.AVG)
    parts = [seal(KEYS, make, r, x.astype(np.int64)) for r, x in enumerate(inputs)]
    result = combine(parts, Result)
    values = open_verified(KEYS, result, frozenset(range(world)))
    assert values.tolist() == [10, 20, 30, -30, 50, 70]
    # sum / 4 rounded half to even: 2.5 -> 2, 5, 7.5 -> 8, -7.5 -> -8, 12.5 -> 12, 17.5 -> 18
    decoded = decode_values(values, DType.INT32, Collective.ALL_REDUCE, ReduceOp.AVG, world)
    assert decoded.tolist() == [2, 5, 8, -8, 12, 18]
    assert decoded.dtype == np.int32


def test_aggregates_widen_as_they_climb() -> None:
    world = 300
    make = header(DType.INT8, 3, 3, 0)
    parts = [seal(KEYS, make, r, np.array([127, -128, 1], dtype=np.int64)) for r in range(world)]
    assert {p.width for p in parts} == {1}
    pair = combine(parts[:2], PartialAggregate)
    assert pair.width == 2
    everything = combine(parts, Result)
    assert everything.width == 4
    assert open_verified(KEYS, everything, frozenset(range(world))).tolist() == [127 * 300, -128 * 300, 300]


def test_combine_refuses_a_sum_beyond_the_bound() -> None:
    make = header(DType.INT64, 2, 2, 0)
    big = np.array([RANGE_BOUND, -5], dtype=np.int64)
    parts = [seal(KEYS, make, r, big) for r in range(2)]
    with pytest.raises(CcoError) as caught:
        combine(parts, Result)
    assert caught.value.code is ErrorCode.OVERFLOW


def test_combine_refuses_mismatched_headers_and_overlapping_bitmaps() -> None:
    a = seal(KEYS, header(DType.INT32, 4, 4, 0), 0, np.zeros(4, dtype=np.int64))
    b = seal(KEYS, header(DType.INT32, 4, 4, 0, op=ReduceOp.AVG), 1, np.zeros(4, dtype=np.int64))
    with pytest.raises(CcoError) as caught:
        combine([a, b], Result)
    assert caught.value.code is ErrorCode.OPERATION_MISMATCH
    assert "op" in caught.value.detail
    with pytest.raises(CcoError) as caught:
        combine([a, a], Result)
    assert caught.value.code is ErrorCode.DUPLICATE_CONTRIBUTION


@pytest.mark.parametrize("width", [1, 2, 4, 8])
def test_combine_refuses_a_block_scaled_sum_beyond_its_width(width: int) -> None:
    """Honest contributions stay within Q, so their sum fits; contributions that used
    the whole width do not, and the aggregator refuses to widen them."""
    top = 2 ** (8 * width - 1) - 1 if width < 8 else RANGE_BOUND
    make = header(DType.FLOAT32, 3, 3, 0, width=width, block_elements=16, scales=np.array([0]))
    parts = [seal(KEYS, make, r, np.array([top, -1, 0, 1], dtype=np.int64)) for r in range(2)]
    with pytest.raises(CcoError) as caught:
        combine(parts, Result)
    assert caught.value.code is ErrorCode.OVERFLOW
    assert (f"does not fit {width} bytes" if width < 8 else "leaves [-B, B]") in caught.value.detail
    fits = [seal(KEYS, make, r, np.array([top // 2, -1, 0, 1], dtype=np.int64)) for r in range(2)]
    assert combine(fits, Result).width == width


def test_combine_refuses_block_scaled_chunks_that_differ_in_width_or_scales() -> None:
    def part(rank: int, width: int, scales: list[int]) -> ChunkMessage:
        make = header(DType.FLOAT16, 20, 20, 0, width=width, block_elements=16, scales=np.array(scales))
        return seal(KEYS, make, rank, np.zeros(22, dtype=np.int64))

    for other, field in ((part(1, 4, [3, 5]), "width"), (part(1, 2, [3, 4]), "scales")):
        with pytest.raises(CcoError) as caught:
            combine([part(0, 2, [3, 5]), other], Result)
        assert caught.value.code is ErrorCode.OPERATION_MISMATCH
        assert field in caught.value.detail


def test_a_block_scaled_result_is_accepted_at_its_width_only() -> None:
    """The width of a block-scaled chunk is fixed, so check_encoding accepts a wide
    width for small values; an unscaled chunk must use its smallest width."""
    make = header(DType.FLOAT32, 3, 3, 0, width=8, block_elements=16, scales=np.array([0]))
    result = combine([seal(KEYS, make, r, np.array([1, 2, 3, 1], dtype=np.int64)) for r in range(2)], Result)
    assert result.width == 8
    assert check_encoding(result).tolist() == [2, 4, 6, 2]
    assert open_verified(KEYS, result, frozenset({0, 1})).tolist() == [2, 4, 6]
