"""Exact limbs: small float sums in one pass, correctly rounded.

A block-scaled sum (:mod:`cco.wire.blockscale`) costs two passes, the scales and then
the data, and for a handful of elements the second round trip is most of the time
the operation takes.  A float SUM or AVG reduction of at most :data:`MAX_ELEMENTS`
elements is carried in the EXACT form instead (draft section "Exact Limbs"):

* every finite value x of the dtype (bfloat16 elements, held as binary32, first
  rounded to bfloat16 half to even, as block scaling does) is an integer multiple
  of the dtype's smallest subnormal 2^e0, so v = x * 2^-e0 is an integer, and
  |v| < 2^bits with bits = emax + 1 - e0 (40 for binary16, 261 for bfloat16, 277
  for binary32, 2098 for binary64);
* v is written as :func:`limb_count` signed base-2^32 digits, least significant
  first, every digit with the sign of v: d_k = sign(v) * ((|v| >> 32 k) mod 2^32),
  so each element occupies ``limb_count`` consecutive wire positions;
* aggregators add the digits as they add any integers: a digit sum over at most
  2^16 ranks stays below 2^48, far inside the range bound B;
* an endpoint recombines the exact sum S = sum_k D_k 2^(32 k), and rounds
  S * 2^e0 (divided by the contributor count for AVG) once, half to even, to the
  application's type.  The result is the correctly rounded exact sum: the same
  bits on every rank, whatever the tree, and no error but that one rounding.

A result beyond the type's largest finite value is OVERFLOW, as for block scaling;
an exact zero is +0.  The element count is small, so the arithmetic is plain Python
integers.
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass

import numpy as np

from cco.wire.dtypes import ElementType, round_to_bfloat16
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.registries import DType

MAX_ELEMENTS = 16
"""Float SUM and AVG reductions of at most this many elements use the EXACT form.
At 9 limbs per binary32 element that is at most 1152 payload bytes (8448 for
binary64's 66 limbs), where the scale pass it saves costs a round trip whatever the
size."""

LIMB_BITS = 32
_LIMB_MASK = (1 << LIMB_BITS) - 1


@dataclass(frozen=True, slots=True)
class _Format:
    """An IEEE 754-style binary format: what rounding needs of it."""

    precision: int  # significand bits, the implicit one included
    emin: int  # exponent of the smallest normal number
    emax: int  # exponent of the largest finite number


_FORMATS = {
    DType.FLOAT16: _Format(11, -14, 15),
    DType.BFLOAT16: _Format(8, -126, 127),
    DType.FLOAT32: _Format(24, -126, 127),
    DType.FLOAT64: _Format(53, -1022, 1023),
}


def _unit_exponent(fmt: _Format) -> int:
    """e0: the exponent of the format's smallest subnormal."""
    return fmt.emin - fmt.precision + 1


@functools.cache  # asked for every EXACT chunk's header checks
def limb_count(dtype: DType) -> int:
    """Wire positions per element: 2 for binary16, 9 for bfloat16 and binary32, 66
    for binary64."""
    fmt = _FORMATS[dtype]
    bits = fmt.emax + 1 - _unit_exponent(fmt)
    return -(-bits // LIMB_BITS)


def to_limbs(values: np.ndarray, element: ElementType, first: int = 0) -> np.ndarray:
    """The int64 limbs of ``values`` (float, the dtype's storage type; bfloat16
    elements are first rounded to bfloat16, half to even), element by element.
    OVERFLOW for NaN or an infinity (``first``: the index of values[0] in the tensor,
    for the message)."""
    shift = -_unit_exponent(_FORMATS[element.code])
    count = limb_count(element.code)
    if element.code is DType.BFLOAT16:
        values = round_to_bfloat16(np.asarray(values, dtype=np.float32))
    listed = np.asarray(values, dtype=np.float64).tolist()
    limbs = [0] * (count * len(listed))
    for index, x in enumerate(listed):
        if not math.isfinite(x):
            what = "NaN" if math.isnan(x) else "infinite"
            raise CcoError(ErrorCode.OVERFLOW, f"element {first + index} is {what}")
        numerator, denominator = x.as_integer_ratio()  # denominator a power of two, at most 2^-e0
        # v = |numerator| << (shift - log2(denominator)) is the significand (at most 53
        # bits) moved up: only the two or three limbs it lands in are not zero, so they
        # are cut from the significand alone, not from v (up to 2098 bits)
        place, offset = divmod(shift - denominator.bit_length() + 1, LIMB_BITS)
        sign = -1 if numerator < 0 else 1
        rest = abs(numerator) << offset
        position = index * count + place
        while rest:
            limbs[position] = sign * (rest & _LIMB_MASK)
            rest >>= LIMB_BITS
            position += 1
    return np.array(limbs, dtype=np.int64)


def from_limbs(sums: np.ndarray, element: ElementType, divisor: int = 1) -> np.ndarray:
    """The correctly rounded values of summed limbs ``sums`` (a whole number of
    elements), divided by ``divisor`` (AVG), in the application's storage type.
    OVERFLOW if a result does not fit the type."""
    count = limb_count(element.code)
    if len(sums) % count:
        raise CcoError(ErrorCode.INVALID_FIELD, f"{element.code.name} takes {count} limbs per element")
    if divisor < 1:
        raise CcoError(ErrorCode.INVALID_FIELD, f"divisor {divisor} is below 1")
    fmt = _FORMATS[element.code]
    unit = _unit_exponent(fmt)
    shifts = range(0, LIMB_BITS * count, LIMB_BITS)
    out = []
    for index, digits in enumerate(np.asarray(sums, dtype=np.int64).reshape(-1, count).tolist()):
        total = sum(map(operator.lshift, digits, shifts))  # sum_k d_k 2^(32 k)
        value = _round_scaled(total, unit, divisor, fmt)
        if value is None:
            raise CcoError(ErrorCode.OVERFLOW, f"result element {index} does not fit {element.code.name}")
        out.append(value)
    return np.array(out, dtype=element.storage)


def _round_scaled(total: int, exponent: int, divisor: int, fmt: _Format) -> float | None:
    """total * 2^exponent / divisor rounded half to even to ``fmt`` (subnormals
    included), as a Python float (exact: every format here is within binary64); None
    if the rounded magnitude exceeds the format's largest finite value."""
    if total == 0:
        return 0.0
    if divisor == 1:
        return _round_shifted(total, exponent, fmt)
    magnitude = abs(total)
    # e, the exponent of the leading bit (2^e <= magnitude * 2^exponent / divisor < 2^(e+1)),
    # is the difference of the bit lengths or one below it
    e = magnitude.bit_length() - divisor.bit_length() + exponent
    if not _at_least(magnitude, exponent, divisor, e):
        e -= 1
    quantum = max(e, fmt.emin) - fmt.precision + 1  # the exponent of the result's last bit
    numerator = magnitude << max(0, exponent - quantum)
    denominator = divisor << max(0, quantum - exponent)
    q, r = divmod(numerator, denominator)
    if 2 * r > denominator or (2 * r == denominator and q & 1):
        q += 1  # may carry into 2^precision: still exactly q * 2^quantum
    top = fmt.emax - fmt.precision + 1  # the quantum of the largest binade
    if quantum > top or (quantum == top and q.bit_length() > fmt.precision):
        return None
    value = math.ldexp(q, quantum)
    return -value if total < 0 else value


def _round_shifted(total: int, exponent: int, fmt: _Format) -> float | None:
    """:func:`_round_scaled` without a divisor (every SUM): the leading bit is the
    total's own, and rounding drops low bits of the total, a shift and a mask where
    the general case divides.  The arithmetic of a round's two elements is most of
    :func:`from_limbs`."""
    magnitude = abs(total)
    e = magnitude.bit_length() - 1 + exponent
    quantum = max(e, fmt.emin) - fmt.precision + 1
    drop = quantum - exponent  # bits of the total below the result's last bit
    if drop <= 0:
        q = magnitude << -drop
    else:
        q = magnitude >> drop
        rest = magnitude & ((1 << drop) - 1)
        half = 1 << (drop - 1)
        if rest > half or (rest == half and q & 1):
            q += 1  # may carry into 2^precision: still exactly q * 2^quantum
    top = fmt.emax - fmt.precision + 1
    if quantum > top or (quantum == top and q.bit_length() > fmt.precision):
        return None
    value = math.ldexp(q, quantum)
    return -value if total < 0 else value


def _at_least(magnitude: int, exponent: int, divisor: int, e: int) -> bool:
    """Whether magnitude * 2^exponent / divisor >= 2^e."""
    shift = exponent - e
    if shift >= 0:
        return magnitude << shift >= divisor
    return magnitude >= divisor << -shift
