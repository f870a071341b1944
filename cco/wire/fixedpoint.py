"""Exact fixed point: how floats become integers that sum exactly, and back.

A float x is carried as x_int = round_half_even(x * 2^s), s being the operation's
``scale``.  Integers add exactly and in any order, so every endpoint gets the same
bits whatever the tree shape.  Error bound (draft section "Fixed Point"):

* converting one value loses at most 2^-(s+1): |x_int * 2^-s - x| <= 2^-(s+1);
* a sum of c contributions is therefore within c * 2^-(s+1) of the exact sum, and
  an average within 2^-(s+1) of the exact average;
* decoding computes z = float64(Y) * 2^-s (divided by c for AVG), which adds at
  most 2^-52 * |z|, then rounds once to the application's type (half an ulp of
  that type; bfloat16 rounds through float32, so up to one bfloat16 ulp).

A value that is NaN, infinite, or whose x_int exceeds the contribution bound raises
``OVERFLOW``; so does a decoded result the application's type cannot hold.
Nothing is ever clipped or wrapped silently.
"""

from __future__ import annotations

import numpy as np

from cco.wire.dtypes import ElementType, element_type, round_to_bfloat16
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.registries import DType

RANGE_BOUND = (1 << 60) - 1
"""B: every integer of every chunk payload satisfies |y| <= B < p / 2."""

DEFAULT_MAGNITUDE_BITS: dict[DType, int] = {
    DType.FLOAT16: 16,
    DType.BFLOAT16: 24,
    DType.FLOAT32: 24,
    DType.FLOAT64: 24,
}
"""log2 of the magnitude the default scale covers: all of float16 (max 65504 <
2^16); |x| <= 2^24 for the wider types, whose full range no 60-bit integer holds."""


def contribution_bound(world_size: int) -> int:
    """floor(B / world_size): the largest |x| one contributor may send, so that no
    honest sum of ``world_size`` contributions leaves [-B, B]."""
    if world_size < 1:
        raise CcoError(ErrorCode.INVALID_FIELD, f"world_size {world_size} is below 1")
    return RANGE_BOUND // world_size


def default_scale(dtype: DType, world_size: int) -> int:
    """The scale s = 59 - E - ceil(log2(world_size)) for floats (E from
    ``DEFAULT_MAGNITUDE_BITS``), 0 for integers.

    With it every |x| <= 2^E converts without overflow: |x_int| <= 2^(59 - ceil(log2 n))
    <= floor(B / n).
    """
    if world_size < 1:
        raise CcoError(ErrorCode.INVALID_FIELD, f"world_size {world_size} is below 1")
    if not element_type(dtype).is_float:
        return 0
    return 59 - DEFAULT_MAGNITUDE_BITS[dtype] - (world_size - 1).bit_length()


def to_fixed(values: np.ndarray, scale: int, bound: int, first: int = 0) -> np.ndarray:
    """round_half_even(values * 2^scale) as int64; OVERFLOW if non-finite or beyond ``bound``.

    ``first`` is the position of ``values[0]`` in the tensor, for the error message."""
    with np.errstate(over="ignore"):
        # Exact, except on overflow (refused below) or underflow (which rounds to 0 anyway).
        scaled = np.ldexp(values.astype(np.float64), scale)
    if not np.isfinite(scaled).all():
        bad = int(np.argmin(np.isfinite(scaled)))
        what = "NaN" if np.isnan(values[bad]) else "infinite" if np.isinf(values[bad]) else "too large"
        raise CcoError(
            ErrorCode.OVERFLOW, f"element {first + bad} is {what} for fixed point at scale {scale}"
        )
    rounded = np.rint(scaled)
    if len(rounded) and float(np.abs(rounded).max()) > bound:  # float vs int compares exactly
        bad = int(np.argmax(np.abs(rounded)))
        raise CcoError(
            ErrorCode.OVERFLOW,
            f"element {first + bad} ({float(values[bad])!r}) exceeds the contribution bound {bound} "
            f"at scale {scale}",
        )
    return rounded.astype(np.int64)


def from_fixed(values: np.ndarray, scale: int, divisor: int, element: ElementType) -> np.ndarray:
    """float(values) * 2^-scale / divisor in the application's float type; OVERFLOW if
    a result does not fit that type."""
    with np.errstate(over="ignore"):
        decoded = np.ldexp(values.astype(np.float64), -scale)
        if divisor != 1:
            decoded /= divisor
        if element.code is DType.BFLOAT16:
            out = round_to_bfloat16(decoded.astype(np.float32))
        else:
            out = decoded.astype(element.storage)
    if not np.isfinite(out).all():
        bad = int(np.argmin(np.isfinite(out)))
        raise CcoError(
            ErrorCode.OVERFLOW, f"result element {bad} ({decoded[bad]!r}) does not fit {element.code.name}"
        )
    return out
