"""The wire forms of version 2, checked from first principles.

Block-scaled fixed point (floats under SUM and AVG, :mod:`cco.wire.blockscale`):
proposals, quantization, attestations, sums within the width, decoding and the
documented error bound.  Order-preserving keys (floats under MIN and MAX,
:func:`cco.wire.dtypes.ordered_keys`), integer values and bit patterns follow.

References are exact and independent of the code under test: Python integers,
``fractions.Fraction``, ``round`` (which rounds half to even) and a rounding of
fractions to each IEEE format written here from its definition.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cco.wire import blockscale
from cco.wire.blockscale import (
    SCALE_MAX,
    SCALE_MIN,
    attestations,
    block_count,
    chunk_integers,
    dequantize,
    propose,
    quantize,
    sum_limit,
)
from cco.wire.dtypes import element_type, from_ordered_keys, ordered_keys, round_to_bfloat16
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Contribution, Result, encode_message
from cco.wire.payload import (
    RANGE_BOUND,
    ChunkHeader,
    combine,
    contribution_bound,
    decode_values,
    derive_group_keys,
    encode_values,
    open_verified,
    seal,
    wire_length,
)
from cco.wire.registries import MAX_WORLD_SIZE, Collective, DType, ReduceOp

pytestmark = pytest.mark.both_kernels

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEYS = derive_group_keys(b"\x01" * 32, b"\x02" * 16)
FLOATS = [DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64]
INTS = [DType.INT8, DType.INT16, DType.INT32, DType.INT64]
WIDTHS = [1, 2, 4, 8]
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
B = (1 << 60) - 1


# --- IEEE formats from their definition ------------------------------------------------


@dataclass(frozen=True)
class Format:
    """A binary IEEE 754 format: ``precision`` significand bits, exponents emin..emax."""

    precision: int
    emin: int
    emax: int

    @property
    def max_finite(self) -> Fraction:
        return (2 - Fraction(2) ** (1 - self.precision)) * Fraction(2) ** self.emax

    def exponent(self, magnitude: Fraction) -> int:
        """max(floor(log2 magnitude), emin): the exponent of the magnitude's binade."""
        e = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
        if Fraction(2) ** e > magnitude:
            e -= 1
        return max(e, self.emin)

    def ulp(self, magnitude: Fraction) -> Fraction:
        """The spacing of the format at ``magnitude`` (the subnormal spacing below 2^emin)."""
        if magnitude == 0:
            return Fraction(2) ** (self.emin - self.precision + 1)
        return Fraction(2) ** (self.exponent(magnitude) - self.precision + 1)

    def round(self, value: Fraction) -> Fraction | None:
        """``value`` rounded to nearest, ties to even; None when that overflows to infinity."""
        if value == 0:
            return Fraction(0)
        spacing = self.ulp(abs(value))
        rounded = round(abs(value) / spacing) * spacing
        if rounded > self.max_finite:
            return None
        return rounded if value > 0 else -rounded


F16 = Format(11, -14, 15)
BF16 = Format(8, -126, 127)
F32 = Format(24, -126, 127)
F64 = Format(53, -1022, 1023)
FORMATS = {DType.FLOAT16: F16, DType.BFLOAT16: BF16, DType.FLOAT32: F32, DType.FLOAT64: F64}


def as_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 ``values`` rounded to bfloat16 by :class:`Format` (exact, not the code under test)."""
    out = []
    for v in values.tolist():
        if math.isnan(v) or math.isinf(v):
            out.append(v)
            continue
        r = BF16.round(Fraction(v))
        out.append(math.copysign(math.inf, v) if r is None else math.copysign(float(r), v))
    return np.array(out, dtype=np.float32)


def tensor_values(x: np.ndarray, dtype: DType) -> list[Fraction]:
    """The exact values the tensor holds (a bfloat16 tensor's float32 inputs rounded first)."""
    if dtype is DType.BFLOAT16:
        x = as_bfloat16(x)
    return [Fraction(float(v)) for v in x.tolist()]


def reference_proposal(magnitude: Fraction, limit: int) -> int:
    """The largest s with round(magnitude * 2^s) <= limit (SCALE_MAX for zero), by search."""
    if magnitude == 0:
        return SCALE_MAX
    s = limit.bit_length() - (magnitude.numerator.bit_length() - magnitude.denominator.bit_length())
    while round(magnitude * Fraction(2) ** s) > limit:
        s -= 1
    while round(magnitude * Fraction(2) ** (s + 1)) <= limit:
        s += 1
    return s


def blocks_of(n: int, block: int) -> list[range]:
    return [range(start, min(start + block, n)) for start in range(0, n, block)]


def random_floats(dtype: DType, n: int, world: int, rng: np.random.Generator) -> np.ndarray:
    """Values of ``dtype`` of widely varying magnitude (zeros, subnormals, whole zero
    blocks) small enough that a sum of ``world`` stays finite in the dtype."""
    fmt = FORMATS[dtype]
    top = math.floor(math.log2(float(fmt.max_finite) / (2 * world)))
    low = fmt.emin - fmt.precision  # the smallest subnormal's exponent
    centre = int(rng.integers(low, top, endpoint=True))  # anywhere in the format's range
    exponents = np.clip(centre + rng.integers(-12, 1, size=n), low, top)
    x = rng.uniform(-1, 1, size=n) * np.exp2(exponents.astype(np.float64))
    x[rng.random(n) < 0.1] = 0.0
    if n and rng.random() < 0.3:  # a run of zeros, often a whole block
        start = int(rng.integers(0, n))
        x[start : start + int(rng.integers(1, 20))] = 0.0
    out = x.astype(NUMPY[dtype])
    return as_bfloat16(out) if dtype is DType.BFLOAT16 else out


# --- sum limit and blocks ------------------------------------------------------------------


@pytest.mark.parametrize("width", WIDTHS)
def test_sum_limit_is_the_largest_contribution_whose_group_sum_fits(width: int) -> None:
    for world in (1, 2, 3, 7, 100, 127, 128, 1000, 32767, 32768, MAX_WORLD_SIZE):
        largest = min(2 ** (8 * width - 1) - 1, B)
        if largest // world < 1:
            with pytest.raises(CcoError) as caught:
                sum_limit(width, world)
            assert caught.value.code is ErrorCode.UNSUPPORTED_FEATURE
            assert str(8 * width) in caught.value.detail
            continue
        limit = sum_limit(width, world)
        assert world * limit <= largest < world * (limit + 1)


def test_sum_limit_boundaries_and_bad_group_sizes() -> None:
    assert sum_limit(1, 127) == 1 and sum_limit(2, 32767) == 1
    assert sum_limit(8, 1) == B  # the range bound, not 2^63 - 1, limits 8-byte sums
    for width, world in ((1, 128), (2, 32768), (2, MAX_WORLD_SIZE)):
        with pytest.raises(CcoError) as caught:
            sum_limit(width, world)
        assert caught.value.code is ErrorCode.UNSUPPORTED_FEATURE
    with pytest.raises(CcoError) as caught:
        sum_limit(4, 0)
    assert caught.value.code is ErrorCode.INVALID_FIELD


def test_block_count_counts_a_shorter_last_block() -> None:
    assert [block_count(n, 16) for n in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]


# --- proposals -----------------------------------------------------------------------------


@SETTINGS
@given(
    dtype=st.sampled_from(FLOATS),
    width=st.sampled_from(WIDTHS),
    world=st.integers(1, 127),
    block=st.integers(1, 9),
    data=st.data(),
)
def test_a_proposal_is_the_largest_scale_that_fits_the_sum_limit(
    dtype: DType, width: int, world: int, block: int, data: st.DataObject
) -> None:
    bits: Literal[16, 32, 64] = 16 if dtype is DType.FLOAT16 else 64 if dtype is DType.FLOAT64 else 32
    finite = st.floats(width=bits, allow_nan=False, allow_infinity=False)
    xs = data.draw(st.lists(finite | st.sampled_from([0.0, -0.0]), max_size=30))
    x = np.array(xs, dtype=NUMPY[dtype])
    limit = sum_limit(width, world)
    element = element_type(dtype)
    if dtype is DType.BFLOAT16 and any(BF16.round(Fraction(v)) is None for v in xs):
        with pytest.raises(CcoError) as caught:  # rounds past the largest bfloat16
            propose(x, element, block, limit)
        assert caught.value.code is ErrorCode.OVERFLOW
        return
    values = tensor_values(x, dtype)
    proposals = propose(x, element, block, limit)
    assert proposals.dtype == np.int16
    assert len(proposals) == block_count(len(x), block)
    for b, positions in enumerate(blocks_of(len(x), block)):
        magnitude = max(abs(values[j]) for j in positions)
        s = int(proposals[b])
        assert s == reference_proposal(magnitude, limit)
        if magnitude:
            assert round(magnitude * Fraction(2) ** s) <= limit
            assert round(magnitude * Fraction(2) ** (s + 1)) > limit  # one more does not fit
            assert SCALE_MIN < s < SCALE_MAX


def test_proposals_at_the_edges_of_the_formats() -> None:
    cases = [
        (DType.FLOAT16, 65504.0),
        (DType.FLOAT16, 2.0**-24),  # smallest float16 subnormal
        (DType.BFLOAT16, float(BF16.max_finite)),
        (DType.FLOAT32, float(np.finfo(np.float32).max)),
        (DType.FLOAT32, 2.0**-149),
        (DType.FLOAT64, float(np.finfo(np.float64).max)),
        (DType.FLOAT64, 5e-324),
        (DType.FLOAT64, 1.5),  # 1.5 * 2^s rounds half to even at the limit
    ]
    for dtype, magnitude in cases:
        for width, world in ((1, 127), (1, 1), (2, 3), (4, 5), (8, 1), (8, 3)):
            limit = sum_limit(width, world)
            x = np.array([0.0, -magnitude, magnitude / 2], dtype=NUMPY[dtype])
            (s,) = propose(x, element_type(dtype), 16, limit).tolist()
            assert s == reference_proposal(Fraction(magnitude), limit), (dtype, magnitude, width, world)


def test_a_rounding_tie_at_the_limit_is_decided_half_to_even() -> None:
    # limit 1 (one byte, 127 ranks): 1.5 * 2^-1 = 0.75 rounds to 1, fits; 1.5 * 2^0 does not.
    assert propose(np.array([1.5]), element_type(DType.FLOAT64), 16, 1).tolist() == [-1]
    # 0.5 * 2^1 = 1 fits; 0.5 * 2^2 = 2 does not.  2.5 * 2^-1 = 1.25 -> 1 fits, * 2^0 = 2.5 -> 2 not.
    assert propose(np.array([0.5, 2.5]), element_type(DType.FLOAT64), 1, 1).tolist() == [1, -1]
    # limit 2: 2.5 * 2^0 = 2.5 rounds half to even to 2, so scale 0 fits.
    assert propose(np.array([2.5]), element_type(DType.FLOAT64), 16, 2).tolist() == [0]


def test_limits_that_binary64_cannot_hold_are_compared_exactly() -> None:
    """Q = floor(B / N) for 8-byte widths is often not a binary64 number; a value that
    scales onto the float just above Q does not fit."""
    element = element_type(DType.FLOAT64)
    checked = 0
    for world in range(1, 300):
        limit = sum_limit(8, world)
        above = float(limit)
        if Fraction(above) <= limit:
            continue
        checked += 1
        for k in (0, 3, -700):
            x = np.array([math.ldexp(above, -k)])
            assert propose(x, element, 16, limit).tolist() == [k - 1], world
            assert quantize(x, element, np.array([k - 1], dtype=np.int16), 16, limit).tolist() == [
                round(Fraction(above) / 2)
            ]
            with pytest.raises(CcoError) as caught:
                quantize(x, element, np.array([k], dtype=np.int16), 16, limit)
            assert caught.value.code is ErrorCode.OVERFLOW
    assert checked > 30


def test_zero_blocks_propose_the_largest_scale() -> None:
    x = np.array([0.0] * 16 + [-0.0] * 16 + [3.0] + [0.0] * 15 + [0.0] * 4, dtype=np.float32)
    proposals = propose(x, element_type(DType.FLOAT32), 16, sum_limit(4, 4)).tolist()
    assert proposals[:2] == [SCALE_MAX, SCALE_MAX] and proposals[3] == SCALE_MAX == 32767
    assert proposals[2] == reference_proposal(Fraction(3), sum_limit(4, 4))
    assert propose(np.zeros(0, dtype=np.float32), element_type(DType.FLOAT32), 16, 5).tolist() == []


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    ("bad", "word"), [(math.nan, "NaN"), (math.inf, "infinite"), (-math.inf, "infinite")]
)
def test_nan_and_infinities_are_refused_naming_the_element(dtype: DType, bad: float, word: str) -> None:
    x = np.array([1.0, 2.0, 3.0, bad, 5.0], dtype=NUMPY[dtype])
    element = element_type(dtype)
    for call in (
        lambda: propose(x, element, 16, 100, first=40),
        lambda: quantize(x, element, np.zeros(1, dtype=np.int16), 16, 100, first=40),
    ):
        with pytest.raises(CcoError) as caught:
            call()
        assert caught.value.code is ErrorCode.OVERFLOW
        assert "element 43" in caught.value.detail and word in caught.value.detail


def test_bfloat16_inputs_are_rounded_before_they_are_measured() -> None:
    element = element_type(DType.BFLOAT16)
    # 1 + 2^-8 + 2^-20 rounds up to the bfloat16 1 + 2^-7; the float32 itself is smaller.
    x = np.array([1 + 2.0**-8 + 2.0**-20], dtype=np.float32)
    limit = sum_limit(2, 1)
    assert propose(x, element, 16, limit).tolist() == [
        reference_proposal(Fraction(1) + Fraction(1, 128), limit)
    ]
    (s,) = propose(x, element, 16, limit).tolist()
    assert quantize(x, element, np.array([s], dtype=np.int16), 16, limit).tolist() == [
        round((1 + Fraction(1, 128)) * Fraction(2) ** s)
    ]


# --- quantization --------------------------------------------------------------------------


@SETTINGS
@given(
    dtype=st.sampled_from([DType.FLOAT16, DType.FLOAT32, DType.FLOAT64]),
    data=st.data(),
    block=st.integers(1, 5),
    limit=st.sampled_from([1, 2, 127, 2**15 - 1, 2**31 - 1, B, B // 3]),
)
def test_quantization_is_round_half_even_exact_or_a_typed_overflow(
    dtype: DType, data: st.DataObject, block: int, limit: int
) -> None:
    bits: Literal[16, 32, 64] = 16 if dtype is DType.FLOAT16 else 32 if dtype is DType.FLOAT32 else 64
    xs = data.draw(st.lists(st.floats(width=bits, allow_nan=False, allow_infinity=False), max_size=12))
    scales = data.draw(
        st.lists(
            st.integers(-1200, 1200) | st.integers(SCALE_MIN, SCALE_MAX),
            min_size=block_count(len(xs), block),
            max_size=block_count(len(xs), block),
        )
    )
    x = np.array(xs, dtype=NUMPY[dtype])
    expected = [round(Fraction(v) * Fraction(2) ** scales[j // block]) for j, v in enumerate(x.tolist())]
    try:
        got = quantize(x, element_type(dtype), np.array(scales, dtype=np.int16), block, limit, first=7)
    except CcoError as error:
        assert error.code is ErrorCode.OVERFLOW
        bad = next(j for j, v in enumerate(expected) if abs(v) > limit)  # the first one is named
        assert f"element {7 + bad} " in error.detail
        return
    assert got.dtype == np.int64
    assert got.tolist() == expected
    assert all(abs(v) <= limit for v in expected)


@SETTINGS
@given(
    data=st.data(),
    block=st.integers(1, 5),
    limit=st.sampled_from([1, 127, 2**15 - 1, 2**31 - 1, B]),
)
def test_binary32_inputs_at_binary32_scales_quantize_in_binary32_to_the_same_integers(
    data: st.DataObject, block: int, limit: int
) -> None:
    """Subnormals, ties and products too large for binary32 included: the integers
    (or the element an OVERFLOW names) are those of exact arithmetic."""
    xs = data.draw(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), max_size=12))
    n = block_count(len(xs), block)
    scales = data.draw(
        st.lists(st.integers(-126, 126) | st.sampled_from([-126, 126, 0]), min_size=n, max_size=n)
    )
    x = np.array(xs, dtype=np.float32)
    assert blockscale._in_binary32(x, np.array(scales))
    expected = [round(Fraction(v) * Fraction(2) ** scales[j // block]) for j, v in enumerate(x.tolist())]
    try:
        got = quantize(x, element_type(DType.FLOAT32), np.array(scales, dtype=np.int16), block, limit)
    except CcoError as error:
        assert error.code is ErrorCode.OVERFLOW
        bad = next(j for j, v in enumerate(expected) if abs(v) > limit)
        assert f"element {bad} " in error.detail
        return
    assert got.tolist() == expected


def test_an_overflow_names_the_first_element_past_a_limit_binary32_cannot_hold() -> None:
    """2^-52 at scale 112 is 2^60, one past the limit 2^60 - 1; binary32 rounds that
    limit up to 2^60, so a binary32 comparison let it pass and named the next element."""
    x = np.array([2.0**-52, 1.0], dtype=np.float32)
    with pytest.raises(CcoError, match="element 0 ") as caught:
        quantize(x, element_type(DType.FLOAT32), np.array([112], dtype=np.int16), 2, 2**60 - 1)
    assert caught.value.code is ErrorCode.OVERFLOW


def test_binary32_scaling_is_kept_for_the_cases_it_is_exact_in() -> None:
    x = np.array([1.5, -2.5, 2.0**-149, -(2.0**-149), 3.0e38], dtype=np.float32)
    inside, outside = np.array([126, -126]), np.array([0, 127])
    assert blockscale._in_binary32(x, inside) and not blockscale._in_binary32(x, outside)
    assert not blockscale._in_binary32(x.astype(np.float64), inside)
    assert not blockscale._in_binary32(np.ones(2, dtype=np.float16), np.array([0]))
    f32 = element_type(DType.FLOAT32)
    # ties to even, and subnormal products that round to zero, at the binary32 scales
    assert quantize(x[:4], f32, np.array([0, -126]), 2, 10).tolist() == [2, -2, 0, 0]
    # 3e38 * 2^126 is infinite in binary32 and beyond the limit in binary64 alike
    with pytest.raises(CcoError, match="element 4 ") as raised:
        quantize(x, f32, np.array([0, 0, 126]), 2, 2**31 - 1)
    assert raised.value.code is ErrorCode.OVERFLOW


def test_quantization_ties_round_half_to_even() -> None:
    x = np.array([2.5, 3.5, -2.5, -3.5, 0.5, 1.5, 5.0, 7.0, -5.0, 6.0], dtype=np.float64)
    scales = np.array([0, -1], dtype=np.int16)  # the first six at 2^0, the last four at 2^-1
    got = quantize(x, element_type(DType.FLOAT64), scales, 6, 100)
    assert got.tolist() == [2, 4, -2, -4, 0, 2, 2, 4, -2, 3]


def test_quantization_refuses_a_value_above_its_agreed_scale() -> None:
    """An input that grew since it was proposed (or a scale raised above the proposal)
    is OVERFLOW, naming the element and the scale."""
    element = element_type(DType.FLOAT32)
    limit = sum_limit(4, 4)
    x = np.array([1.0, -3.0, 0.25], dtype=np.float32)
    proposals = propose(x, element, 16, limit)
    assert np.abs(quantize(x, element, proposals, 16, limit)).max() <= limit
    with pytest.raises(CcoError) as caught:
        quantize(x, element, proposals + 1, 16, limit)
    assert caught.value.code is ErrorCode.OVERFLOW
    assert "element 1 " in caught.value.detail and f"scale {int(proposals[0]) + 1}" in caught.value.detail
    with pytest.raises(CcoError) as caught:
        quantize(x, element, np.zeros(2, dtype=np.int16), 16, limit)
    assert caught.value.code is ErrorCode.INVALID_FIELD


@pytest.mark.parametrize("n", [1, 64])  # one element (numpy), and enough for the compiled loop
@pytest.mark.parametrize(("limit", "top"), [(sum_limit(4, 4), 29), (sum_limit(4, 1), 31)])
def test_the_range_check_is_exact_where_binary32_rounds_the_limit(n: int, limit: int, top: int) -> None:
    """2^29 - 1 (the sum limit of four ranks at width 4) and 2^31 - 1 round up to 2^29
    and 2^31 in binary32.  A product of exactly that power is one above the limit and
    is refused; the largest binary32 integer below it passes."""
    f32 = element_type(DType.FLOAT32)
    assert limit == 2**top - 1 and float(np.float32(limit)) == 2**top
    ones = np.ones(n, dtype=np.float32)
    with pytest.raises(CcoError, match="element 0 ") as caught:
        quantize(ones, f32, np.array([top]), n, limit, out=np.empty(n, dtype=np.int64))
    assert caught.value.code is ErrorCode.OVERFLOW
    below = np.full(n, np.nextafter(np.float32(1.0), np.float32(0.0)))  # 1 - 2^-24
    got = quantize(below, f32, np.array([top]), n, limit, out=np.empty(n, dtype=np.int64))
    assert got.tolist() == [2**top - 2 ** (top - 24)] * n


# --- a whole operation: proposals, agreement, contributions, sums, attestations ---------------


def agree(
    inputs: list[np.ndarray], dtype: DType, block: int, limit: int
) -> tuple[list[np.ndarray], np.ndarray]:
    """Every rank's proposals, and the agreed scales (their minimum, as the scale pass computes)."""
    proposals = [propose(x, element_type(dtype), block, limit) for x in inputs]
    return proposals, np.min(np.stack(proposals), axis=0)


@SETTINGS
@given(
    dtype=st.sampled_from(FLOATS),
    width=st.sampled_from(WIDTHS),
    world=st.integers(1, 64),
    n=st.integers(0, 40),
    block=st.sampled_from([1, 3, 16]),
    seed=st.integers(0, 2**32 - 1),
)
def test_contributions_fit_their_width_and_every_block_is_attested(
    dtype: DType, width: int, world: int, n: int, block: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    inputs = [random_floats(dtype, n, world, rng) for _ in range(world)]
    limit = sum_limit(width, world)
    proposals, agreed = agree(inputs, dtype, block, limit)
    contributions = [quantize(x, element_type(dtype), agreed, block, limit) for x in inputs]
    for x, mine in zip(inputs, contributions, strict=True):
        assert mine.tolist() == [
            round(v * Fraction(2) ** int(agreed[j // block])) for j, v in enumerate(tensor_values(x, dtype))
        ]
        assert all(abs(v) <= limit for v in mine.tolist())
    largest = min(2 ** (8 * width - 1) - 1, B)
    for j in range(n):
        assert abs(sum(int(c[j]) for c in contributions)) <= largest  # a sum of N always fits
    marks = [attestations(p, agreed) for p in proposals]
    for b in range(block_count(n, block)):
        for p, mark in zip(proposals, marks, strict=True):
            assert int(mark[b]) == (1 if int(p[b]) == int(agreed[b]) else 0)
        assert 1 <= sum(int(mark[b]) for mark in marks) <= world


def test_attestations_are_one_exactly_where_the_agreed_scale_is_ones_own() -> None:
    own = np.array([5, -3, 32767, 0], dtype=np.int16)
    agreed = np.array([5, -4, 32767, -1], dtype=np.int16)
    got = attestations(own, agreed)
    assert got.dtype == np.int64 and got.tolist() == [1, 0, 1, 0]


@pytest.mark.parametrize("width", WIDTHS)
def test_a_chunk_quantized_at_its_width_seals_and_opens_as_its_int64_integers(width: int) -> None:
    """A chunk's integers written at the chunk's width (what an endpoint seals) make the
    message their int64 form makes; its Result opens to a read-only view of the
    payload at that width, holding the same integers, and scales back to the same
    floats."""
    rng = np.random.default_rng(width)
    world, n, block = 3, 50, 16
    element = element_type(DType.FLOAT32)
    inputs = [random_floats(DType.FLOAT32, n, world, rng) for _ in range(world)]
    limit = sum_limit(width, world)
    proposals, agreed = agree(inputs, DType.FLOAT32, block, limit)
    header = scaled_header(
        total_elements=n,
        chunk_elements=n,
        width=width,
        block_elements=block,
        scales=agreed.astype("<i2").tobytes(),
    )
    parts = []
    for rank, x in enumerate(inputs):
        wide = chunk_integers(x, element, agreed, proposals[rank], block, limit)
        narrow = chunk_integers(x, element, agreed, proposals[rank], block, limit, width=width)
        assert wide.dtype == np.int64 and narrow.dtype == np.dtype(f"<i{width}")
        assert narrow.tolist() == wide.tolist()
        sealed = seal(KEYS, header, rank, narrow)
        assert encode_message(sealed) == encode_message(seal(KEYS, header, rank, wide, Contribution))
        parts.append(sealed)
    result = combine(parts, Result)
    got = open_verified(KEYS, result, frozenset(range(world)))
    assert got.dtype == np.dtype(f"<i{width}") and not got.flags.writeable
    total = np.sum([quantize(x, element, agreed, block, limit) for x in inputs], axis=0)
    assert got.tolist() == total.tolist()
    back = dequantize(got, agreed, block, 1, element)
    assert back.tobytes() == dequantize(total, agreed, block, 1, element).tobytes()


# --- decoding ------------------------------------------------------------------------------


def binary64(value: Fraction) -> Fraction | None:
    return F64.round(value)


def reference_dequantize(y: int, scale: int, divisor: int, dtype: DType) -> Fraction | None:
    """y * 2^-scale / divisor in binary64 (each operation rounded), then rounded to the
    dtype (bfloat16 through binary32); None when a step overflows."""
    z = binary64(Fraction(y))
    if z is not None:
        z = binary64(z * Fraction(2) ** -scale)
    if z is not None and divisor != 1:
        z = binary64(z / divisor)
    if z is None:
        return None
    if dtype is DType.BFLOAT16:
        z = F32.round(z)
        return None if z is None else BF16.round(z)
    return FORMATS[dtype].round(z)


@SETTINGS
@given(
    dtype=st.sampled_from(FLOATS),
    width=st.sampled_from(WIDTHS),
    data=st.data(),
    block=st.integers(1, 4),
    divisor=st.integers(1, 100),
)
def test_dequantize_rounds_once_from_binary64(
    dtype: DType, width: int, data: st.DataObject, block: int, divisor: int
) -> None:
    top = 2 ** (8 * width - 1)
    ys = data.draw(
        st.lists(st.integers(-top + 1, top - 1) | st.sampled_from([0, 1, -1, top - 1]), max_size=10)
    )
    k = block_count(len(ys), block)
    scales = data.draw(
        st.lists(st.integers(-40, 1200) | st.integers(SCALE_MIN, SCALE_MAX), min_size=k, max_size=k)
    )
    expected = [reference_dequantize(y, scales[j // block], divisor, dtype) for j, y in enumerate(ys)]
    try:
        out = dequantize(
            np.array(ys, dtype=np.int64),
            np.array(scales, dtype=np.int16),
            block,
            divisor,
            element_type(dtype),
        )
    except CcoError as error:
        assert error.code is ErrorCode.OVERFLOW
        assert None in expected
        return
    assert None not in expected
    assert out.dtype == element_type(dtype).storage
    assert [Fraction(float(v)) for v in out.tolist()] == expected


def test_a_sum_the_dtype_cannot_hold_overflows_on_decode_but_its_average_does_not() -> None:
    x = np.array([60000.0], dtype=np.float16)
    element = element_type(DType.FLOAT16)
    limit = sum_limit(2, 2)
    (s,) = propose(x, element, 16, limit).tolist()
    total = 2 * quantize(x, element, np.array([s], dtype=np.int16), 16, limit)
    with pytest.raises(CcoError) as caught:
        dequantize(total, np.array([s], dtype=np.int16), 16, 1, element)
    assert caught.value.code is ErrorCode.OVERFLOW
    assert "FLOAT16" in caught.value.detail
    average = dequantize(total, np.array([s], dtype=np.int16), 16, 2, element)
    assert average.tolist() == [60000.0]


def final_rounding(dtype: DType, width: int, divisor: int, out: Fraction) -> Fraction:
    """The documented final rounding: half an ulp of the dtype (one bfloat16 ulp), plus
    2^-52 |z| when the integer or the division first rounds in binary64."""
    fmt = FORMATS[dtype]
    rounding = fmt.ulp(abs(out)) * (1 if dtype is DType.BFLOAT16 else Fraction(1, 2))
    if width == 8 or divisor != 1:
        rounding += abs(out) * Fraction(1, 2**51) + Fraction(2) ** -1074
    return rounding


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(FLOATS),
    width=st.sampled_from(WIDTHS),
    world=st.integers(1, 64),
    n=st.integers(1, 40),
    block=st.sampled_from([1, 5, 16]),
    op=st.sampled_from([ReduceOp.SUM, ReduceOp.AVG]),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_documented_error_bound_holds(
    dtype: DType, width: int, world: int, n: int, block: int, op: ReduceOp, seed: int
) -> None:
    """|decoded - exact| <= c 2^-(s_b+1) <= 2 c M_b / (2Q + 1) (divided by c for AVG),
    plus the final rounding, for every element; c = the contributors (here all N)."""
    rng = np.random.default_rng(seed)
    inputs = [random_floats(dtype, n, world, rng) for _ in range(world)]
    limit = sum_limit(width, world)
    _, agreed = agree(inputs, dtype, block, limit)
    element = element_type(dtype)
    total = sum(quantize(x, element, agreed, block, limit).astype(object) for x in inputs)
    divisor = world if op is ReduceOp.AVG else 1
    out = dequantize(np.array(total, dtype=np.int64), agreed, block, divisor, element)
    exact_inputs = [tensor_values(x, dtype) for x in inputs]
    maxima = [max(abs(x[v]) for x in exact_inputs for v in positions) for positions in blocks_of(n, block)]
    for j in range(n):
        b = j // block
        s = int(agreed[b])
        largest = maxima[b]
        exact = sum((x[j] for x in exact_inputs), Fraction(0)) / divisor
        got = Fraction(float(out[j]))
        if largest == 0:
            assert s == SCALE_MAX and got == 0
            continue
        step = world * Fraction(2) ** -(s + 1) / divisor
        assert Fraction(2) ** -(s + 1) <= 2 * largest / (2 * limit + 1)
        error = abs(got - exact)
        assert error <= step + final_rounding(dtype, width, divisor, got), (j, s, exact, got)
        assert error <= 2 * world * largest / (2 * limit + 1) / divisor + final_rounding(
            dtype, width, divisor, got
        )


def test_relative_error_per_width_matches_the_design() -> None:
    """N = c = 4, one block: the worst error relative to the block's largest |x| is
    within 2c / (2Q + 1): about 2^-27 at 4 bytes, 2^-11 at 2, 8/63 at 1 (float64
    inputs, so that the final rounding does not hide the quantization)."""
    rng = np.random.default_rng(7)
    world = 4
    inputs = [rng.uniform(-1, 1, size=256) for _ in range(world)]
    exact = [sum((Fraction(float(x[j])) for x in inputs), Fraction(0)) for j in range(256)]
    largest = max(abs(Fraction(float(v))) for x in inputs for v in x)
    element = element_type(DType.FLOAT64)
    for width, design in ((4, Fraction(1, 2**27)), (2, Fraction(1, 2**11)), (1, Fraction(8, 63))):
        limit = sum_limit(width, world)
        bound = Fraction(2 * world, 2 * limit + 1)
        assert design <= bound <= design * (1 + Fraction(1, 2**13))
        _, agreed = agree(inputs, DType.FLOAT64, 256, limit)
        total = sum(quantize(x, element, agreed, 256, limit) for x in inputs)
        out = dequantize(total, agreed, 256, 1, element)
        worst = max(abs(Fraction(float(v)) - e) for v, e in zip(out.tolist(), exact, strict=True))
        assert worst / largest <= bound + Fraction(1, 2**50), width
        assert worst / largest > bound / 64  # the quantization is really this coarse


# --- headers of block-scaled chunks --------------------------------------------------------


def scaled_header(**changes: Any) -> ChunkHeader:
    fields: dict[str, Any] = {
        "group_id": b"\x02" * 16,
        "epoch": 1,
        "op_id": 4,
        "kind": Collective.ALL_REDUCE,
        "op": ReduceOp.SUM,
        "dtype": DType.FLOAT32,
        "total_elements": 20,
        "chunk_elements": 20,
        "chunk_index": 0,
        "width": 4,
        "block_elements": 16,
        "scales": np.array([3, -2], dtype="<i2").tobytes(),
    }
    fields.update(changes)
    return ChunkHeader(**fields)


def test_block_scaling_is_required_exactly_where_the_form_has_it() -> None:
    scaled_header().check()
    assert scaled_header().integer_count == 22 and scaled_header().block_count == 2
    nothing = {"width": None, "block_elements": None, "scales": None}
    for bad in (
        scaled_header(width=None),
        scaled_header(block_elements=None),
        scaled_header(scales=None),
        scaled_header(**nothing),  # a float SUM without its scaling
        scaled_header(op=ReduceOp.MAX),  # ORDERED takes none
        scaled_header(dtype=DType.INT32),  # VALUES takes none
        scaled_header(scales=bytes(2)),  # one scale for two blocks
        scaled_header(scales=bytes(6)),
        scaled_header(block_elements=32),  # now one block, but two scales
    ):
        with pytest.raises(CcoError) as caught:
            bad.check()
        assert caught.value.code is ErrorCode.INVALID_FIELD
    scaled_header(op=ReduceOp.MAX, **nothing).check()
    scaled_header(block_elements=32, scales=bytes(2)).check()


@pytest.mark.parametrize("dtype", FLOATS)
def test_the_unscaled_codec_refuses_block_scaled_forms(dtype: DType) -> None:
    for op in (ReduceOp.SUM, ReduceOp.AVG):
        with pytest.raises(CcoError) as caught:
            encode_values(np.zeros(2, dtype=NUMPY[dtype]), dtype, Collective.ALL_REDUCE, op, 2)
        assert caught.value.code is ErrorCode.INTERNAL_ERROR
        with pytest.raises(CcoError) as caught:
            decode_values(np.zeros(2, dtype=np.int64), dtype, Collective.REDUCE, op, 2)
        assert caught.value.code is ErrorCode.INTERNAL_ERROR


# --- order-preserving keys (floats under MIN and MAX) ------------------------------------------


def total_order(v: float) -> tuple[float, float]:
    """IEEE total order of non-NaN floats: -0.0 before +0.0."""
    return (v, math.copysign(1.0, v))


def all_patterns_16(dtype: DType) -> np.ndarray:
    """Every non-NaN value of a 16-bit float type (bfloat16 as float32 holding bfloat16s)."""
    if dtype is DType.BFLOAT16:
        values = (np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)).view(np.float32)
    else:
        values = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    return values[~np.isnan(values)]


@pytest.mark.parametrize("dtype", [DType.FLOAT16, DType.BFLOAT16])
def test_keys_of_every_16_bit_value_are_consecutive_in_float_order(dtype: DType) -> None:
    values = all_patterns_16(dtype)
    keys = ordered_keys(values, element_type(dtype))
    order = sorted(range(len(values)), key=lambda i: total_order(float(values[i])))
    ranked = keys[order].tolist()
    # Sorting by value sorts the keys, with no gap: the map is the float order itself.
    assert ranked == list(range(ranked[0], ranked[0] + len(values)))
    by_value = {total_order(float(v)): int(k) for v, k in zip(values.tolist(), keys.tolist(), strict=True)}
    assert by_value[(0.0, 1.0)] == 0 and by_value[(0.0, -1.0)] == -1
    infinity = 0x7C00 if dtype is DType.FLOAT16 else 0x7F80  # +inf's own pattern is its key
    assert ranked[-1] == by_value[(math.inf, 1.0)] == infinity
    assert ranked[0] == by_value[(-math.inf, -1.0)] == -infinity - 1
    assert from_ordered_keys(keys, element_type(dtype)).tobytes() == values.tobytes()


def special_floats(dtype: DType) -> list[float]:
    info = np.finfo(np.float32 if dtype is DType.BFLOAT16 else NUMPY[dtype])
    tiny = float(info.smallest_subnormal)
    if dtype is DType.BFLOAT16:
        tiny, biggest = 2.0**-133, float(BF16.max_finite)
    else:
        biggest = float(info.max)
    return [
        -math.inf,
        -biggest,
        -1.0,
        -float(info.smallest_normal),
        -tiny,
        -0.0,
        0.0,
        tiny,
        1.0,
        biggest,
        math.inf,
    ]


@SETTINGS
@given(dtype=st.sampled_from(FLOATS), data=st.data())
def test_keys_order_like_the_floats_and_invert(dtype: DType, data: st.DataObject) -> None:
    bits: Literal[16, 32, 64] = 16 if dtype is DType.FLOAT16 else 64 if dtype is DType.FLOAT64 else 32
    xs = data.draw(
        st.lists(st.floats(width=bits, allow_nan=False) | st.sampled_from(special_floats(dtype)), max_size=30)
    )
    x = np.array(xs, dtype=NUMPY[dtype])
    if dtype is DType.BFLOAT16:
        x = as_bfloat16(x)
    element = element_type(dtype)
    keys = ordered_keys(x, element)
    assert keys.dtype == np.int64
    limit = 2 ** (element.bits - 1)
    assert all(-limit <= k < limit for k in keys.tolist())
    values = x.tolist()
    for i in range(len(values)):
        for j in range(len(values)):
            before = total_order(values[i]) < total_order(values[j])
            assert (keys[i] < keys[j]) == before, (values[i], values[j])
    back = from_ordered_keys(keys, element)
    assert back.dtype == element.storage and back.tobytes() == x.tobytes()


@pytest.mark.parametrize("dtype", FLOATS)
def test_adjacent_floats_have_adjacent_keys(dtype: DType) -> None:
    element = element_type(dtype)
    for v in special_floats(dtype)[1:-1]:
        x = np.array([v], dtype=NUMPY[dtype])
        if dtype is DType.BFLOAT16:  # the next bfloat16: pattern + 1 away from zero
            pattern = struct.unpack("<I", struct.pack("<f", v))[0]
            up = struct.unpack("<f", struct.pack("<I", pattern + (1 << 16)))[0]
        else:
            with np.errstate(over="ignore"):  # the next float after the largest is infinite
                up = float(np.nextafter(x, NUMPY[dtype](math.copysign(math.inf, v)))[0])
        (key,) = ordered_keys(x, element).tolist()
        (next_key,) = ordered_keys(np.array([up], dtype=NUMPY[dtype]), element).tolist()
        assert abs(next_key - key) == 1 and (next_key > key) == (math.copysign(1.0, v) > 0)


def test_key_map_is_its_own_inverse_on_integers() -> None:
    element = element_type(DType.FLOAT16)
    every = np.arange(-(2**15), 2**15, dtype=np.int64)
    floats = from_ordered_keys(every, element)
    patterns = floats.view(np.int16).astype(np.int64)
    # key -> pattern is the same map as pattern -> key: p >= 0 stays, else flips 15 bits
    assert np.array_equal(np.where(every < 0, every ^ 0x7FFF, every), patterns)
    finite = ~np.isnan(floats)
    assert ordered_keys(floats[finite], element).tolist() == every[finite].tolist()


@pytest.mark.parametrize("dtype", FLOATS)
def test_nan_has_no_key(dtype: DType) -> None:
    x = np.array([1.0, -0.0, math.nan], dtype=NUMPY[dtype])
    with pytest.raises(CcoError) as caught:
        ordered_keys(x, element_type(dtype))
    assert caught.value.code is ErrorCode.OVERFLOW and "element 2" in caught.value.detail
    with pytest.raises(CcoError) as caught:
        encode_values(x, dtype, Collective.ALL_REDUCE, ReduceOp.MAX, 4)
    assert caught.value.code is ErrorCode.OVERFLOW and "NaN" in caught.value.detail


@pytest.mark.parametrize("dtype", [DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32])  # every int64 fits float64
def test_keys_outside_the_width_are_refused(dtype: DType) -> None:
    element = element_type(dtype)
    top = 2 ** (element.bits - 1)
    for bad in (top, -top - 1):
        with pytest.raises(CcoError) as caught:
            from_ordered_keys(np.array([0, bad], dtype=np.int64), element)
        assert caught.value.code is ErrorCode.OVERFLOW


@SETTINGS
@given(
    dtype=st.sampled_from(FLOATS),
    op=st.sampled_from([ReduceOp.MIN, ReduceOp.MAX]),
    world=st.integers(1, 20),
    n=st.integers(0, 12),
    seed=st.integers(0, 2**32 - 1),
)
def test_float_min_and_max_are_exact(dtype: DType, op: ReduceOp, world: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    choices = special_floats(dtype)
    inputs = []
    for _ in range(world):
        x = random_floats(dtype, n, world, rng)
        special = rng.random(n) < 0.3
        x[special] = np.array(choices, dtype=NUMPY[dtype])[
            rng.integers(0, len(choices), size=int(special.sum()))
        ]
        inputs.append(x)
    wires = [encode_values(x, dtype, Collective.ALL_REDUCE, op, world) for x in inputs]
    fold = np.minimum if op is ReduceOp.MIN else np.maximum
    total = wires[0]
    for w in wires[1:]:
        total = fold(total, w)
    out = decode_values(total, dtype, Collective.ALL_REDUCE, op, world)
    pick = min if op is ReduceOp.MIN else max
    for j in range(n):
        want = pick((float(x[j]) for x in inputs), key=total_order)
        assert total_order(float(out[j])) == total_order(want)
    assert out.dtype == element_type(dtype).storage


# --- integers: values, and the range bound that applies to tagged ops only ---------------------


@SETTINGS
@given(dtype=st.sampled_from(INTS), data=st.data(), world=st.integers(1, 64))
def test_integer_sums_decode_exactly_or_overflow(dtype: DType, data: st.DataObject, world: int) -> None:
    info = np.iinfo(NUMPY[dtype])
    lo, hi = max(int(info.min), -(B // world)), min(int(info.max), B // world)
    columns = data.draw(st.lists(st.lists(st.integers(lo, hi), min_size=world, max_size=world), max_size=5))
    total = np.array([sum(c) for c in columns], dtype=np.int64)
    try:
        out = decode_values(total, dtype, Collective.ALL_REDUCE, ReduceOp.SUM, world)
    except CcoError as error:
        assert error.code is ErrorCode.OVERFLOW
        assert any(not info.min <= sum(c) <= info.max for c in columns)
        return
    assert out.tolist() == [sum(c) for c in columns]


def test_integer_average_rounds_half_to_even() -> None:
    sums = np.array([10, 14, 6, -6, -10, 3], dtype=np.int64)
    out = decode_values(sums, DType.INT16, Collective.ALL_REDUCE, ReduceOp.AVG, 4)
    assert out.tolist() == [round(Fraction(int(v), 4)) for v in sums.tolist()] == [2, 4, 2, -2, -2, 1]


def test_tagged_integer_contributions_beyond_the_bound_overflow() -> None:
    assert contribution_bound(3) == B // 3
    edge = np.array([B // 3, -(B // 3)], dtype=np.int64)
    assert encode_values(edge, DType.INT64, Collective.ALL_REDUCE, ReduceOp.SUM, 3).tolist() == edge.tolist()
    for op in (ReduceOp.SUM, ReduceOp.AVG):
        with pytest.raises(CcoError) as caught:
            encode_values(np.array([0, B // 3 + 1]), DType.INT64, Collective.ALL_REDUCE, op, 3)
        assert caught.value.code is ErrorCode.OVERFLOW and "element 1" in caught.value.detail


@pytest.mark.parametrize("op", [ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR])
def test_untagged_ops_carry_any_int64(op: ReduceOp) -> None:
    """MIN, MAX and the bitwise ops have no tag, so no range bound: any int64 travels,
    however many ranks; only SUM and AVG keep floor(B / N)."""
    extremes = [2**63 - 1, -(2**63), B + 1, -(B + 1), B // 1000 + 1, 0]
    x = np.array(extremes, dtype=np.int64)
    world = 1000
    assert encode_values(x, DType.INT64, Collective.ALL_REDUCE, op, world).tolist() == extremes
    make = ChunkHeader(
        group_id=b"\x02" * 16,
        epoch=1,
        op_id=2,
        kind=Collective.ALL_REDUCE,
        op=op,
        dtype=DType.INT64,
        total_elements=len(x),
        chunk_elements=len(x),
        chunk_index=0,
    )
    parts = [seal(KEYS, make, r, x) for r in range(3)]
    assert all(p.width == 8 and p.tag is None for p in parts)
    result = combine(parts, Result)
    own = (1, x) if op is not ReduceOp.BXOR else None
    values = open_verified(KEYS, result, frozenset(range(3)), own=own)
    expected = extremes if op is not ReduceOp.BXOR else [v ^ v ^ v for v in extremes]
    assert values.tolist() == expected
    assert decode_values(values, DType.INT64, Collective.ALL_REDUCE, op, 3).tolist() == expected
    with pytest.raises(CcoError) as caught:
        seal(KEYS, dataclasses.replace(make, op=ReduceOp.SUM), 0, x)
    assert caught.value.code is ErrorCode.OVERFLOW


# --- bit-exact transport -------------------------------------------------------------------------


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
    wire = encode_values(x, dtype, Collective.BROADCAST, ReduceOp.SUM, 10)
    assert len(wire) == wire_length(dtype, Collective.BROADCAST, n)
    make = ChunkHeader(
        group_id=b"\x02" * 16,
        epoch=1,
        op_id=2,
        kind=Collective.BROADCAST,
        op=ReduceOp.SUM,
        dtype=dtype,
        total_elements=len(wire),
        chunk_elements=max(1, len(wire)),
        chunk_index=0,
        root=root,
    )
    sealed = seal(KEYS, make, root, wire)
    values = open_verified(KEYS, sealed, frozenset({root}))
    out = decode_values(values, dtype, Collective.BROADCAST, ReduceOp.SUM, 1)
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
        total_elements=total,
        chunk_elements=total,
        chunk_index=0,
    )
    parts = []
    for rank, piece in enumerate(slices):
        padded = np.zeros(total, dtype=np.int64)
        padded[rank * slice_wire : (rank + 1) * slice_wire] = encode_values(
            piece, dtype, Collective.ALL_GATHER, ReduceOp.SUM, world
        )
        parts.append(seal(KEYS, make, rank, padded))
    values = open_verified(KEYS, combine(parts, Result), frozenset(range(world)))
    out = decode_values(values, dtype, Collective.ALL_GATHER, ReduceOp.SUM, world)
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
    finite = bits[[0, 1, 2, 4]].view("<f4")
    assert out[[0, 1, 2, 4]].view("<f4").tolist() == as_bfloat16(finite).tolist()


def test_module_constants() -> None:
    assert (SCALE_MIN, SCALE_MAX) == (-(2**15), 2**15 - 1)
    assert blockscale.DEFAULT_BLOCK_ELEMENTS == 256
    assert RANGE_BOUND == B
