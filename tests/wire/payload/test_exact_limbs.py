"""The EXACT form (cco/wire/exact.py): small float sums as base-2^32 limbs, summed
as integers and rounded once, correctly, at the endpoint.

The oracle is independent of the module: exact rationals (:class:`Fraction`) and a
nearest-neighbour search over the target type's representable values with numpy's
nextafter, ties to the even significand."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cco.interop import expected, reference
from cco.wire import cbor, exact
from cco.wire.dtypes import ELEMENT_TYPES, round_to_bfloat16
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.exact import LIMB_BITS, MAX_ELEMENTS, from_limbs, limb_count, to_limbs
from cco.wire.payload import ChunkHeader
from cco.wire.registries import Collective, DType, ReduceOp
from cco.workload import make_input

FLOATS = [DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64]
RESULT_TYPE = {DType.FLOAT16: np.float16, DType.BFLOAT16: np.float32, DType.FLOAT32: np.float32}


def _nearest(exact: Fraction, dtype: DType) -> float | None:
    """The value of ``dtype`` nearest ``exact``, ties to even; None beyond the largest
    finite value (IEEE round to nearest: from max + half an ulp)."""
    if dtype is DType.FLOAT64:
        try:
            return float(exact)  # Python rounds a Fraction correctly to binary64
        except OverflowError:
            return None
    if dtype is DType.BFLOAT16:
        return _nearest_bfloat16(exact)
    kind = RESULT_TYPE[dtype]
    with np.errstate(over="ignore"):  # a sum beyond the type starts from infinity
        guess = kind(float(exact)) if abs(exact) < 2**200 else kind(np.inf) * (1 if exact > 0 else -1)
        candidates = {guess, np.nextafter(guess, kind(np.inf)), np.nextafter(guess, kind(-np.inf))}
    return _closest(exact, [c for c in candidates if np.isfinite(c)], dtype)


def _nearest_bfloat16(exact: Fraction) -> float | None:
    with np.errstate(over="ignore"):  # a sum beyond binary32 starts from infinity
        guess = float(round_to_bfloat16(np.array([float(exact)], dtype=np.float32))[0])
    bits = int(np.array([guess], dtype="<f4").view("<u4")[0]) >> 16
    candidates = []
    for pattern in (bits - 1, bits, bits + 1):
        value = np.array([(pattern & 0xFFFF) << 16], dtype="<u4").view("<f4")[0]
        if np.isfinite(value):
            candidates.append(value)
    return _closest(exact, candidates, DType.BFLOAT16)


def _closest(exact: Fraction, candidates: list, dtype: DType) -> float | None:  # type: ignore[type-arg]
    best = min(candidates, key=lambda c: (abs(Fraction(float(c)) - exact), _odd(c, dtype)))
    largest = ELEMENT_TYPES[dtype].max_finite
    ulp = Fraction(largest) - Fraction(float(np.nextafter(RESULT_TYPE.get(dtype, np.float32)(largest), 0)))
    if dtype is DType.BFLOAT16:
        ulp = Fraction(2) ** (127 - 7)
    if abs(exact) >= Fraction(largest) + ulp / 2:
        return None
    return float(best)


def _odd(value: float, dtype: DType) -> int:
    """1 if ``value``'s significand is odd (loses a tie)."""
    if dtype is DType.BFLOAT16:
        return (int(np.array([value], dtype="<f4").view("<u4")[0]) >> 16) & 1
    kind = RESULT_TYPE[dtype]
    pattern = {np.float16: "<u2", np.float32: "<u4"}[kind]
    return int(np.array([value], dtype=kind).view(pattern)[0]) & 1


def _element(dtype: DType, value: np.floating) -> Fraction:  # type: ignore[type-arg]
    """The exact value of an element; bfloat16 ones are float32 values rounded to
    bfloat16 first (by the interop reference, not the module under test)."""
    if dtype is DType.BFLOAT16:
        pattern = reference.bfloat16_bits(int(np.array([value], dtype="<f4").view("<u4")[0]))
        return Fraction(float(np.array([pattern << 16], dtype="<u4").view("<f4")[0]))
    return Fraction(float(value))


def _reduce(inputs: list[np.ndarray], dtype: DType, divisor: int = 1) -> np.ndarray:
    element = ELEMENT_TYPES[dtype]
    sums = sum(to_limbs(x, element).astype(object) for x in inputs)  # exact, like an aggregator
    return from_limbs(np.array(sums, dtype=np.int64), element, divisor)


def _stored(dtype: DType, values: list[float]) -> np.ndarray:
    return np.array(values, dtype=ELEMENT_TYPES[dtype].storage)


def _finite(dtype: DType) -> st.SearchStrategy[float]:
    width = {DType.FLOAT16: 16, DType.FLOAT64: 64}.get(dtype, 32)
    if dtype is DType.FLOAT16:  # every finite binary16, from its bit pattern
        patterns = st.integers(0, 0xFFFF).filter(lambda p: p & 0x7C00 != 0x7C00)
        return patterns.map(lambda p: float(np.array([p], dtype="<u2").view("<f2")[0]))
    if dtype is DType.BFLOAT16:  # float32 values that stay finite once rounded to bfloat16
        top = ELEMENT_TYPES[dtype].max_finite
        return st.floats(-top, top, width=32)
    return st.floats(allow_nan=False, allow_infinity=False, width=width)


@pytest.mark.parametrize("dtype", FLOATS)
def test_limb_counts_cover_every_finite_value(dtype: DType) -> None:
    assert (
        limb_count(dtype) == {DType.FLOAT16: 2, DType.BFLOAT16: 9, DType.FLOAT32: 9, DType.FLOAT64: 66}[dtype]
    )
    element = ELEMENT_TYPES[dtype]
    tiny = {DType.FLOAT16: 2.0**-24, DType.BFLOAT16: 2.0**-133, DType.FLOAT32: 2.0**-149}.get(dtype, 5e-324)
    limbs = to_limbs(_stored(dtype, [element.max_finite, -0.0, tiny]), element).reshape(3, -1)
    assert limbs[0, -1] != 0  # the largest value reaches the top limb
    assert not limbs[1].any()  # -0 is zero
    assert limbs[2].tolist() == [1] + [0] * (limb_count(dtype) - 1)  # the smallest subnormal is one unit
    assert (np.abs(limbs) < 2**LIMB_BITS).all()


@pytest.mark.parametrize("dtype", FLOATS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_sum_is_the_correctly_rounded_exact_sum(dtype: DType, data: st.DataObject) -> None:
    ranks = data.draw(st.integers(1, 5))
    n = data.draw(st.integers(0, MAX_ELEMENTS))
    inputs = [
        _stored(dtype, data.draw(st.lists(_finite(dtype), min_size=n, max_size=n))) for _ in range(ranks)
    ]
    avg = data.draw(st.booleans())
    divisor = ranks if avg else 1
    exact = [sum(_element(dtype, x[j]) for x in inputs) / divisor for j in range(n)]
    expected = [_nearest(e, dtype) for e in exact]
    if None in expected:
        with pytest.raises(CcoError) as caught:
            _reduce(inputs, dtype, divisor)
        assert caught.value.code is ErrorCode.OVERFLOW
        return
    result = _reduce(inputs, dtype, divisor)
    assert result.dtype == ELEMENT_TYPES[dtype].storage
    assert [float(r) for r in result] == expected


def test_ties_round_to_even_and_the_tree_shape_does_not_matter() -> None:
    """Each sum lies halfway between two binary32 values: 1 + 2^-24 and 3 + 2^-23 go
    down to the even 1 and 3, (1 + 2^-23) + 2^-24 up to the even 1 + 2^-22."""
    element = ELEMENT_TYPES[DType.FLOAT32]
    inputs = [
        _stored(DType.FLOAT32, [1.0, 3.0, 1.0 + 2.0**-23]),
        _stored(DType.FLOAT32, [2.0**-24, 2.0**-23, 2.0**-24]),
    ]
    assert _reduce(inputs, DType.FLOAT32).tolist() == [1.0, 3.0, 1.0 + 2.0**-22]
    limbs = [to_limbs(x, element) for x in inputs]
    assert (
        from_limbs(limbs[1] + limbs[0], element).tolist() == from_limbs(limbs[0] + limbs[1], element).tolist()
    )


def test_avg_rounds_the_exact_quotient_once() -> None:
    inputs = [_stored(DType.FLOAT32, [1.0]), _stored(DType.FLOAT32, [0.0]), _stored(DType.FLOAT32, [0.0])]
    assert _reduce(inputs, DType.FLOAT32, 3).tolist() == [float(np.float32(1 / 3))]


def test_cancellation_is_exact() -> None:
    big, small = 2.0**100, 2.0**-100
    inputs = [_stored(DType.FLOAT32, [big]), _stored(DType.FLOAT32, [small]), _stored(DType.FLOAT32, [-big])]
    assert _reduce(inputs, DType.FLOAT32).tolist() == [
        small
    ]  # binary32 arithmetic in any order gives 0 or small


def test_an_exact_zero_is_positive() -> None:
    inputs = [_stored(DType.FLOAT64, [-0.0, -1.5]), _stored(DType.FLOAT64, [-0.0, 1.5])]
    result = _reduce(inputs, DType.FLOAT64)
    assert result.tolist() == [0.0, 0.0] and not np.signbit(result).any()


@pytest.mark.parametrize("dtype", FLOATS)
def test_a_sum_beyond_the_largest_finite_value_is_overflow(dtype: DType) -> None:
    element = ELEMENT_TYPES[dtype]
    largest = 3.3895313892515355e38 if dtype is DType.BFLOAT16 else element.max_finite
    inputs = [_stored(dtype, [largest]), _stored(dtype, [largest])]
    with pytest.raises(CcoError) as caught:
        _reduce(inputs, dtype)
    assert caught.value.code is ErrorCode.OVERFLOW and "result element 0" in caught.value.detail


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_infinities_cannot_be_carried(bad: float) -> None:
    with pytest.raises(CcoError) as caught:
        to_limbs(_stored(DType.FLOAT32, [1.0, bad]), ELEMENT_TYPES[DType.FLOAT32], first=10)
    assert caught.value.code is ErrorCode.OVERFLOW and "element 11" in caught.value.detail


def test_a_partial_element_is_refused() -> None:
    with pytest.raises(CcoError) as caught:
        from_limbs(np.zeros(10, dtype=np.int64), ELEMENT_TYPES[DType.FLOAT32])
    assert caught.value.code is ErrorCode.INVALID_FIELD


# --- chunks of the EXACT form: what a header may say ------------------------------------


def _exact_header(total: int, **scaling: object) -> ChunkHeader:
    return ChunkHeader(
        group_id=bytes(16),
        epoch=1,
        op_id=4,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.AVG,
        dtype=DType.FLOAT32,
        total_elements=total,
        chunk_elements=8,
        chunk_index=0,
        **scaling,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("elements", [0, 1, MAX_ELEMENTS])
def test_a_float_sum_chunk_without_scales_is_exact(elements: int) -> None:
    header = _exact_header(elements * limb_count(DType.FLOAT32))
    header.check()
    assert header.integer_count == min(8, header.total_elements)  # limbs, no attestations


@pytest.mark.parametrize(
    ("total", "why"),
    [(10, "not a multiple of 9"), ((MAX_ELEMENTS + 1) * 9, "beyond MAX_ELEMENTS elements")],
)
def test_an_exact_chunk_of_partial_or_too_many_elements_is_invalid(total: int, why: str) -> None:
    with pytest.raises(CcoError) as caught:
        _exact_header(total).check()
    assert caught.value.code is ErrorCode.INVALID_FIELD and "EXACT" in caught.value.detail, why


def test_scales_without_block_elements_are_invalid() -> None:
    with pytest.raises(CcoError) as caught:
        _exact_header(18, scales=b"\x00\x00").check()
    assert caught.value.code is ErrorCode.INVALID_FIELD


def test_an_exact_chunk_identifier_has_no_scaling() -> None:
    """The seventh place of m is null, as for every chunk that is not block-scaled, so
    an EXACT chunk never combines with a block-scaled one of the same operation."""
    exact = _exact_header(18)
    scaled = _exact_header(18, width=4, block_elements=16, scales=b"\x00\x00")
    assert cbor.decode(exact.chunk_id())[6] is None
    assert exact.chunk_id() != scaled.chunk_id()


@pytest.mark.parametrize("dtype", [DType.FLOAT16, DType.FLOAT32, DType.FLOAT64])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.AVG])
def test_the_interop_runner_expects_what_the_exact_form_gives(dtype: DType, op: ReduceOp) -> None:
    """cco/interop/expected.py recomputes a small float sum from the reference's
    definitions (never this codec): both must give the same bits."""
    inputs = [make_input(expected.SEED, 3, rank, dtype, 7) for rank in range(3)]
    want = expected.reduce_exact(inputs, dtype, op)
    assert _reduce(inputs, dtype, 3 if op is ReduceOp.AVG else 1).tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", FLOATS)
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_sum_rounds_by_shifting_as_the_general_division_does(dtype: DType, data: st.DataObject) -> None:
    """A SUM (divisor 1) rounds by shifting the total; the general path (a division)
    must give the same value or the same overflow: t / 1 is 2t / 2.  Totals are drawn
    near the places rounding is delicate: ties, subnormals, carries, the largest value."""
    fmt = exact._FORMATS[dtype]
    unit = exact._unit_exponent(fmt)
    bits = exact.limb_count(dtype) * LIMB_BITS
    low = data.draw(st.integers(0, 2**fmt.precision + 2))
    shift = data.draw(st.integers(0, bits - fmt.precision))
    tweak = data.draw(st.sampled_from([0, 1, -1, 1 << max(0, shift - 1), -(1 << max(0, shift - 1))]))
    total = data.draw(st.sampled_from([1, -1])) * ((low << shift) + tweak)
    assert exact._round_shifted(total, unit, fmt) == exact._round_scaled(2 * total, unit, 2, fmt)
