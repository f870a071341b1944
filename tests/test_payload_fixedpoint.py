"""Fixed point within its documented error bound, bit-exact transport, typed overflow.

References are exact: Python's ``Fraction`` and ``round`` (which rounds half to
even), never the code under test.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Literal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cco.wire.dtypes import element_type, round_to_bfloat16
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fixedpoint import DEFAULT_MAGNITUDE_BITS
from cco.wire.messages import Result
from cco.wire.payload import (
    RANGE_BOUND,
    ChunkHeader,
    combine,
    contribution_bound,
    decode_values,
    default_scale,
    derive_group_keys,
    encode_values,
    open_verified,
    seal,
    wire_length,
)
from cco.wire.registries import Collective, DType, ReduceOp

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEYS = derive_group_keys(b"\x01" * 32, b"\x02" * 16)
FLOATS = [DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64]
INTS = [DType.INT8, DType.INT16, DType.INT32, DType.INT64]
NUMPY: dict[DType, Any] = {
    DType.INT8: np.int8,
    DType.INT16: np.int16,
    DType.INT32: np.int32,
    DType.INT64: np.int64,
    DType.FLOAT16: np.float16,
    DType.BFLOAT16: np.float32,
    DType.FLOAT32: np.float32,
    DType.FLOAT64: np.float64,
}


def ulp(dtype: DType, magnitude: float) -> Fraction:
    """One unit in the last place of ``dtype`` at ``magnitude`` (exact)."""
    if dtype is DType.BFLOAT16:
        return Fraction(float(np.spacing(np.float32(magnitude)))) * 2**16
    return Fraction(float(np.spacing(NUMPY[dtype](magnitude))))


def documented_bound(dtype: DType, op: ReduceOp, count: int, scale: int, out: float) -> Fraction:
    """The bound stated in cco.wire.fixedpoint and the draft's "Fixed Point" section."""
    quantisation = Fraction(1, 2 ** (scale + 1)) * (1 if op is ReduceOp.AVG else count)
    rounding = ulp(dtype, abs(out)) * (1 if dtype is DType.BFLOAT16 else Fraction(1, 2))
    return quantisation + Fraction(abs(out)) * Fraction(1, 2**52) + rounding


def float_arrays(dtype: DType, world: int, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    limit = 2.0 ** DEFAULT_MAGNITUDE_BITS[dtype] * (0.99 if dtype is DType.FLOAT16 else 1)
    limit = min(limit, 65504.0) if dtype is DType.FLOAT16 else limit
    out = []
    for _ in range(world):
        x = rng.uniform(-1, 1, size=n) * limit * 2.0 ** rng.integers(-40, 1, size=n)
        out.append(x.astype(NUMPY[dtype]))
    return out


@SETTINGS
@given(
    dtype=st.sampled_from(FLOATS),
    op=st.sampled_from([ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MIN, ReduceOp.MAX]),
    world=st.integers(1, 64),
    n=st.integers(1, 12),
    seed=st.integers(0, 2**32 - 1),
)
def test_float_reductions_are_within_the_documented_bound(
    dtype: DType, op: ReduceOp, world: int, n: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    inputs = float_arrays(dtype, world, n, rng)
    if dtype is DType.FLOAT16:  # keep the float16 sum representable in float16
        inputs = [(x / np.float16(world)).astype(np.float16) for x in inputs]
    scale = default_scale(dtype, world)
    wires = [encode_values(x, dtype, Collective.ALL_REDUCE, scale, world) for x in inputs]
    fold = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}[
        op
    ]
    total = wires[0]
    for w in wires[1:]:
        total = fold(total, w)
    out = decode_values(total, dtype, Collective.ALL_REDUCE, op, scale, world)
    assert out.dtype == element_type(dtype).storage
    for j in range(n):
        column = [
            Fraction(float(round_to_bfloat16(x[j : j + 1])[0] if dtype is DType.BFLOAT16 else x[j]))
            for x in inputs
        ]
        exact = {
            ReduceOp.SUM: sum(column, Fraction(0)),
            ReduceOp.AVG: sum(column, Fraction(0)) / world,
            ReduceOp.MIN: min(column),
            ReduceOp.MAX: max(column),
        }[op]
        count = world if op in (ReduceOp.SUM, ReduceOp.AVG) else 1
        error = abs(Fraction(float(out[j])) - exact)
        assert error <= documented_bound(dtype, op, count, scale, float(out[j])), (j, exact, out[j])


@SETTINGS
@given(dtype=st.sampled_from(FLOATS), n=st.integers(0, 30), seed=st.integers(0, 2**32 - 1))
def test_single_value_round_trip(dtype: DType, n: int, seed: int) -> None:
    (x,) = float_arrays(dtype, 1, n, np.random.default_rng(seed))
    scale = default_scale(dtype, 1)
    out = decode_values(
        encode_values(x, dtype, Collective.ALL_REDUCE, scale, 1),
        dtype,
        Collective.ALL_REDUCE,
        ReduceOp.SUM,
        scale,
        1,
    )
    reference = round_to_bfloat16(x) if dtype is DType.BFLOAT16 else x
    for got, want in zip(out.tolist(), reference.tolist(), strict=True):
        assert abs(Fraction(got) - Fraction(want)) <= documented_bound(dtype, ReduceOp.SUM, 1, scale, got)
    if dtype is DType.FLOAT16:  # the default scale holds every float16 exactly (-0 becomes +0)
        assert out.tolist() == x.tolist()


@SETTINGS
@given(
    dtype=st.sampled_from([DType.FLOAT16, DType.FLOAT32, DType.FLOAT64]),
    values=st.data(),
    scale=st.integers(-2048, 2047),
    world=st.integers(1, 1 << 16),
)
def test_float_encoding_is_exact_or_a_typed_overflow(
    dtype: DType, values: st.DataObject, scale: int, world: int
) -> None:
    width: Literal[16, 32, 64] = 16 if dtype is DType.FLOAT16 else 32 if dtype is DType.FLOAT32 else 64
    xs = values.draw(st.lists(st.floats(width=width), max_size=6))
    x = np.array(xs, dtype=NUMPY[dtype])
    bound = contribution_bound(world)
    try:
        wire = encode_values(x, dtype, Collective.ALL_REDUCE, scale, world)
    except CcoError as error:
        assert error.code is ErrorCode.OVERFLOW
        assert any(
            not np.isfinite(v) or abs(round(Fraction(float(v)) * Fraction(2) ** scale)) > bound for v in x
        )
        return
    expected = [round(Fraction(float(v)) * Fraction(2) ** scale) for v in x]
    assert wire.tolist() == expected
    assert all(abs(v) <= bound for v in expected)


@SETTINGS
@given(dtype=st.sampled_from(INTS), data=st.data(), world=st.integers(1, 64))
def test_integer_sums_decode_exactly_or_overflow(dtype: DType, data: st.DataObject, world: int) -> None:
    info = np.iinfo(NUMPY[dtype])
    lo, hi = max(int(info.min), -contribution_bound(world)), min(int(info.max), contribution_bound(world))
    columns = data.draw(st.lists(st.lists(st.integers(lo, hi), min_size=world, max_size=world), max_size=5))
    total = np.array([sum(c) for c in columns], dtype=np.int64)
    try:
        out = decode_values(total, dtype, Collective.ALL_REDUCE, ReduceOp.SUM, 0, world)
    except CcoError as error:
        assert error.code is ErrorCode.OVERFLOW
        assert any(not info.min <= sum(c) <= info.max for c in columns)
        return
    assert out.tolist() == [sum(c) for c in columns]


def test_contributions_beyond_the_bound_overflow() -> None:
    for dtype in FLOATS:
        for bad in (np.nan, np.inf, -np.inf):
            with pytest.raises(CcoError) as caught:
                encode_values(np.array([1.0, bad], dtype=NUMPY[dtype]), dtype, Collective.ALL_REDUCE, 10, 2)
            assert caught.value.code is ErrorCode.OVERFLOW
    world = 8
    scale = default_scale(DType.FLOAT32, world)
    edge = np.float32(2.0 ** DEFAULT_MAGNITUDE_BITS[DType.FLOAT32])
    assert encode_values(np.array([edge, -edge]), DType.FLOAT32, Collective.ALL_REDUCE, scale, world).tolist()
    with pytest.raises(CcoError) as caught:
        encode_values(np.array([edge * 2]), DType.FLOAT32, Collective.ALL_REDUCE, scale + 1, world)
    assert caught.value.code is ErrorCode.OVERFLOW
    with pytest.raises(CcoError) as caught:
        encode_values(np.array([contribution_bound(3) + 1]), DType.INT64, Collective.ALL_REDUCE, 0, 3)
    assert caught.value.code is ErrorCode.OVERFLOW


@pytest.mark.parametrize("dtype", FLOATS)
def test_default_scale_covers_the_documented_magnitude(dtype: DType) -> None:
    for world in (1, 2, 3, 7, 64, 1000, 1 << 16):
        scale = default_scale(dtype, world)
        magnitude = 2.0 ** DEFAULT_MAGNITUDE_BITS[dtype]
        top = min(magnitude, float(element_type(dtype).max_finite))
        wire = encode_values(
            np.array([top, -top], dtype=NUMPY[dtype]), dtype, Collective.ALL_REDUCE, scale, world
        )
        assert max(abs(v) for v in wire.tolist()) * world <= RANGE_BOUND
    assert default_scale(DType.INT32, 5) == 0


def test_float16_sum_that_float16_cannot_hold_overflows_on_decode() -> None:
    x = np.array([60000.0], dtype=np.float16)
    scale = default_scale(DType.FLOAT16, 2)
    total = 2 * encode_values(x, DType.FLOAT16, Collective.ALL_REDUCE, scale, 2)
    with pytest.raises(CcoError) as caught:
        decode_values(total, DType.FLOAT16, Collective.ALL_REDUCE, ReduceOp.SUM, scale, 2)
    assert caught.value.code is ErrorCode.OVERFLOW
    avg = decode_values(total, DType.FLOAT16, Collective.ALL_REDUCE, ReduceOp.AVG, scale, 2)
    assert avg.tolist() == [60000.0]


def test_scale_must_be_zero_where_fixed_point_does_not_apply() -> None:
    for dtype, kind in ((DType.INT32, Collective.ALL_REDUCE), (DType.FLOAT32, Collective.BROADCAST)):
        with pytest.raises(CcoError) as caught:
            encode_values(np.zeros(2, dtype=NUMPY[dtype]), dtype, kind, 3, 2)
        assert caught.value.code is ErrorCode.INVALID_FIELD


# --- bit-exact transport -------------------------------------------------------------


def random_patterns(dtype: DType, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arbitrary bit patterns of ``dtype``: NaNs, infinities, subnormals, -0 included."""
    if dtype is DType.BFLOAT16:
        halves = rng.integers(0, 1 << 16, size=n, dtype=np.uint32)
        return (halves << np.uint32(16)).view(np.float32)
    raw = rng.integers(0, 256, size=n * np.dtype(NUMPY[dtype]).itemsize, dtype=np.uint8)
    patterns: np.ndarray = raw.view(NUMPY[dtype])
    return patterns


@SETTINGS
@given(
    dtype=st.sampled_from(list(DType)),
    n=st.integers(0, 40),
    seed=st.integers(0, 2**32 - 1),
    root=st.integers(0, 9),
)
def test_broadcast_carries_every_bit_pattern(dtype: DType, n: int, seed: int, root: int) -> None:
    x = random_patterns(dtype, n, np.random.default_rng(seed))
    wire = encode_values(x, dtype, Collective.BROADCAST, 0, 10)
    assert len(wire) == wire_length(dtype, Collective.BROADCAST, n)
    make = ChunkHeader(
        group_id=b"\x02" * 16,
        epoch=1,
        op_id=2,
        kind=Collective.BROADCAST,
        op=ReduceOp.SUM,
        dtype=dtype,
        scale=0,
        total_elements=len(wire),
        chunk_elements=max(1, len(wire)),
        chunk_index=0,
        root=root,
    )
    sealed = seal(KEYS, make, root, wire)
    values = open_verified(KEYS, sealed, frozenset({root}))
    out = decode_values(values, dtype, Collective.BROADCAST, ReduceOp.SUM, 0, 1)
    assert out.dtype == x.dtype
    assert out.tobytes() == x.tobytes()


def test_only_the_root_seals_broadcast_data() -> None:
    make = ChunkHeader(
        group_id=b"\x02" * 16,
        epoch=1,
        op_id=2,
        kind=Collective.BROADCAST,
        op=ReduceOp.SUM,
        dtype=DType.INT8,
        scale=0,
        total_elements=1,
        chunk_elements=1,
        chunk_index=0,
        root=3,
    )
    with pytest.raises(CcoError) as caught:
        seal(KEYS, make, 2, np.zeros(1, dtype=np.int64))
    assert caught.value.code is ErrorCode.INVALID_FIELD


@pytest.mark.parametrize("dtype", list(DType))
def test_all_gather_is_a_verified_sum_of_zero_padded_slices(dtype: DType) -> None:
    world, per_rank = 5, 7
    rng = np.random.default_rng(int(dtype))
    slices = [random_patterns(dtype, per_rank, rng) for _ in range(world)]
    slice_wire = wire_length(dtype, Collective.ALL_GATHER, per_rank)
    total = slice_wire * world
    make = ChunkHeader(
        group_id=b"\x02" * 16,
        epoch=1,
        op_id=3,
        kind=Collective.ALL_GATHER,
        op=ReduceOp.SUM,
        dtype=dtype,
        scale=0,
        total_elements=total,
        chunk_elements=total,
        chunk_index=0,
    )
    parts = []
    for rank, piece in enumerate(slices):
        padded = np.zeros(total, dtype=np.int64)
        padded[rank * slice_wire : (rank + 1) * slice_wire] = encode_values(
            piece, dtype, Collective.ALL_GATHER, 0, world
        )
        parts.append(seal(KEYS, make, rank, padded))
    values = open_verified(KEYS, combine(parts, Result), frozenset(range(world)))
    out = decode_values(values, dtype, Collective.ALL_GATHER, ReduceOp.SUM, 0, world)
    assert out.tobytes() == np.concatenate(slices).tobytes()


def test_bfloat16_rounds_half_to_even_and_keeps_nan() -> None:
    bits = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F800001, 0xFF7FFFFF, 0x7FC10000], dtype="<u4")
    out = round_to_bfloat16(bits.view("<f4")).view("<u4")
    assert [hex(v) for v in out.tolist()] == [
        "0x3f800000",  # tie, even stays
        "0x3f820000",  # tie, odd rounds up
        "0x3f810000",  # above the tie
        "0x7fc00000",  # NaN whose payload is only in the dropped bits: quiet NaN
        "0xff800000",  # rounds past the largest finite value: -inf
        "0x7fc10000",  # a bfloat16 NaN keeps its pattern
    ]
