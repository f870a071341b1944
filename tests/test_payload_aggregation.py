"""Aggregation properties: any tree, any arrival order, the same exact and verified bytes.

For random tensors, dtypes and group sizes 1..64, contributions are combined up a
random tree whose shape and arrival order are drawn by Hypothesis.  The verified
result must equal a reference computed with Python integers (never with the code
under test), and two different trees must give bit-identical messages.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    combine,
    contribution_bound,
    decode_values,
    default_scale,
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
    dtype: DType, total: int, chunk: int, index: int, *, scale: int = 0, op: ReduceOp = ReduceOp.SUM
) -> ChunkHeader:
    return ChunkHeader(
        group_id=GROUP,
        epoch=3,
        op_id=11,
        kind=Collective.ALL_REDUCE,
        op=op,
        dtype=dtype,
        scale=scale,
        total_elements=total,
        chunk_elements=chunk,
        chunk_index=index,
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


def exact_fixed(x: np.ndarray, dtype: DType, scale: int) -> list[int]:
    """round_half_even(x * 2^scale) with Python's exact Fraction arithmetic."""
    if dtype is DType.BFLOAT16:  # the tensor is bfloat16: round the float32 inputs first
        bits = x.astype("<f4").view("<u4").astype(np.uint64)
        x = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype("<u4").view("<f4")
    return [round(Fraction(float(v)) * Fraction(2) ** scale) for v in x]


def reference_sum(wire_inputs: list[list[int]]) -> list[int]:
    return [sum(column) for column in zip(*wire_inputs, strict=True)]


def seal_all(keys: GroupKeys, wires: list[np.ndarray], make: ChunkHeader, chunk: int) -> list[ChunkMessage]:
    start = make.chunk_index * chunk
    return [seal(keys, make, rank, w[start : start + make.element_count]) for rank, w in enumerate(wires)]


@SETTINGS
@given(
    dtype=st.sampled_from(list(DType)),
    world=st.integers(1, 64),
    n=st.integers(0, 40),
    chunk=st.integers(1, 48),
    seed=st.integers(0, 2**32 - 1),
    tree_a=st.randoms(use_true_random=False),
    tree_b=st.randoms(use_true_random=False),
)
def test_random_trees_give_the_exact_sum_bit_identically(
    dtype: DType,
    world: int,
    n: int,
    chunk: int,
    seed: int,
    tree_a: random.Random,
    tree_b: random.Random,
) -> None:
    rng = np.random.default_rng(seed)
    scale = default_scale(dtype, world)
    if dtype in INT_TYPES:
        inputs = int_inputs(dtype, world, n, rng)
        exact = [[int(v) for v in x] for x in inputs]
    else:
        inputs = float_inputs(dtype, world, n, rng)
        exact = [exact_fixed(x, dtype, scale) for x in inputs]
    wires = [encode_values(x, dtype, Collective.ALL_REDUCE, scale, world) for x in inputs]
    for wire, want in zip(wires, exact, strict=True):
        assert wire.tolist() == want
    expected_sum = reference_sum(exact) if n else []

    index = rng.integers(0, chunk_count(n, chunk))
    make = header(dtype, n, chunk, int(index), scale=scale)
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
    rng = np.random.default_rng(int(op))
    world, n = 9, 50
    inputs = [rng.integers(-(2**40), 2**40, size=n) for _ in range(world)]
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
    decoded = decode_values(values, DType.INT32, Collective.ALL_REDUCE, ReduceOp.AVG, 0, world)
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
