"""Block-scaled fixed point: floats summed exactly, at the width of their own dtype.

A float tensor in a SUM or AVG reduction is cut into blocks of ``block_elements``
elements (counted from the start of each chunk).  For every block b the group
agrees on one scale s_b, and every contributor sends

    x_int = round_half_even(x * 2^s_b)

as a signed integer of ``width`` bytes (by default the dtype's own width).  The
scale is chosen so that no sum of the group's contributions can leave the width:
every |x_int| stays within the *sum limit* Q = floor(min(2^(8 width - 1) - 1, B) / N).
Integers then add exactly, in any order and any tree shape, so every endpoint gets
the same bits, and a finite input of any magnitude has a scale that fits it.

The agreement (draft section "Block Scales"): each contributor proposes, per block,
the largest scale at which its own block fits Q (:func:`propose`); the group takes
the minimum, which fits everyone's; and each contributor then attests, in its tagged
data, whether the agreed scale is its own proposal (:func:`attestations`).  An
endpoint refuses an agreed scale above its own proposal (its values would not fit)
and a block whose attestations sum to zero (nobody proposed that scale): so an
aggregator can neither raise a scale nor lower one without detection.

Error bound, for block b with agreed scale s_b, summed over c contributors: every
conversion errs by at most 2^-(s_b+1), so the integer sum, scaled back, is within
c * 2^-(s_b+1) of the exact sum.  Because s_b is the largest scale at which the
largest block M_b (the largest |x| any contributor has in the block) fits,
2^-(s_b+1) <= 2 M_b / (2Q + 1): the error is at most 2c M_b / (2Q + 1), about
c M_b / Q, before the single rounding of the decoded value to the dtype (half an
ulp; for 8-byte widths the integer itself may first round to binary64, adding
2^-52 |z|; bfloat16 rounds through binary32, so up to one bfloat16 ulp).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from cco.wire import kernels
from cco.wire.dtypes import ElementType, round_to_bfloat16
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.packing import RANGE_BOUND
from cco.wire.registries import DType

SCALE_MIN = -(1 << 15)
SCALE_MAX = (1 << 15) - 1
"""Scales are signed 16-bit integers.  A block of zeros proposes SCALE_MAX: it fits
at any scale, so it never lowers anyone else's."""

DEFAULT_BLOCK_ELEMENTS = 256
"""Elements per block: the scales, the scale pass and the attestations each cost
about 1/256 of an element per element."""


def sum_limit(width: int, world_size: int) -> int:
    """Q = floor(min(2^(8 width - 1) - 1, B) / world_size): the largest |x_int| a
    contributor may send so that a sum over the whole group fits ``width`` bytes and
    the range bound B.  UNSUPPORTED_FEATURE when not even 1 fits (a width too narrow
    for the group)."""
    if world_size < 1:
        raise CcoError(ErrorCode.INVALID_FIELD, f"world_size {world_size} is below 1")
    limit = min((1 << (8 * width - 1)) - 1, RANGE_BOUND) // world_size
    if limit < 1:
        raise CcoError(
            ErrorCode.UNSUPPORTED_FEATURE, f"width {8 * width} bits cannot carry a sum of {world_size} ranks"
        )
    return limit


def block_count(elements: int, block_elements: int) -> int:
    """Blocks of a chunk of ``elements`` elements: the last one may be shorter."""
    return -(-elements // block_elements)


def _float_limit(limit: int) -> float:
    """The largest binary64 value not above ``limit`` (comparing an integral float with
    it is the same as comparing with ``limit`` itself)."""
    bound = float(limit)
    return bound if bound <= limit else float(np.nextafter(bound, 0.0))


def _own_type(values: np.ndarray, element: ElementType) -> np.ndarray:
    """``values`` in their own floating type, bfloat16 inputs first rounded to bfloat16."""
    return round_to_bfloat16(values) if element.code is DType.BFLOAT16 else values


def _check_finite(values: np.ndarray, first: int) -> None:
    finite = np.isfinite(values)
    if not finite.all():
        bad = int(np.argmin(finite))
        what = "NaN" if np.isnan(values[bad]) else "infinite"
        raise CcoError(ErrorCode.OVERFLOW, f"element {first + bad} is {what}")


def propose(
    values: np.ndarray, element: ElementType, block_elements: int, limit: int, first: int = 0
) -> np.ndarray:
    """This contributor's proposal per block: the largest scale s with
    round_half_even(M * 2^s) <= ``limit``, M being the block's largest |x|; SCALE_MAX
    for a block of zeros.  OVERFLOW for NaN or an infinity (``first`` is the tensor
    position of ``values[0]``, for the message)."""
    values = _own_type(values, element)
    if len(values) == 0:
        return np.zeros(0, dtype=np.int16)
    # |x| and the block maxima are exact in the values' own type: only the maxima
    # are widened to binary64, never the whole chunk
    maxima = np.maximum.reduceat(np.abs(values), np.arange(0, len(values), block_elements))
    maxima = maxima.astype(np.float64)
    if not np.isfinite(maxima).all():  # a NaN or an infinity is its block's maximum
        _check_finite(values, first)
    _, exponent = np.frexp(maxima)  # maxima = f * 2^exponent, 0.5 <= f < 1
    top = limit.bit_length() - 1  # 2^top <= limit < 2^(top + 1)
    scales = (top + 1) - exponent.astype(np.int64)  # maxima * 2^scales in [2^top, 2^(top + 1))
    too_big = np.rint(np.ldexp(maxima, scales)) > _float_limit(limit)
    scales -= too_big  # one less always fits: maxima * 2^(scales - 1) < 2^top <= limit
    scales[maxima == 0] = SCALE_MAX
    # finite binary64 values keep |s| below about 1140: the clip only states the range
    clipped: np.ndarray = np.clip(scales, SCALE_MIN, SCALE_MAX).astype(np.int16)
    return clipped


def attestations(own: np.ndarray, agreed: np.ndarray) -> np.ndarray:
    """1 for each block whose agreed scale is this contributor's own proposal, else 0."""
    matches: np.ndarray = np.equal(own, agreed)
    return matches.astype(np.int64)


def _per_element(scales: np.ndarray, block_elements: int, elements: int) -> np.ndarray:
    return np.repeat(np.asarray(scales, dtype=np.int64), block_elements)[:elements]


_NORMAL_POWERS = 1022
"""2^s is a normal binary64 number for |s| <= 1022."""

_BINARY32_POWERS = 126
"""2^s is a normal binary32 number for |s| <= 126."""


def _in_binary32(values: np.ndarray, scales: np.ndarray) -> bool:
    """Whether :func:`quantize` may scale ``values`` in binary32 and get the same integers.

    For binary32 values (float32, and bfloat16 once rounded) and normal binary32
    powers 2^s, x * 2^s is exact in binary32 unless it falls below 2^-126 in
    magnitude, and such a product rounds to 0 in either type; rounding an exact
    product to an integer gives the same number in both.  A product too large for
    binary32 becomes an infinity and fails the limit check as its binary64 value
    does.  Half the memory traffic: 122 against 215 us for 64 Ki elements (the
    reference machine)."""
    return values.dtype == np.float32 and (len(scales) == 0 or int(np.abs(scales).max()) <= _BINARY32_POWERS)


def _times_power_of_two(
    values: np.ndarray, scales: np.ndarray, block_elements: int, out: np.ndarray
) -> np.ndarray:
    """values * 2^s_b, element by element, correctly rounded (exact unless the product
    leaves binary64's normal range), written to ``out``: a binary64 array (which may
    be ``values`` itself), or a binary32 one for binary32 ``values`` and scales that
    :func:`_in_binary32` accepts.

    ``values`` are converted to binary64 on the way, as ``astype`` does (exactly for
    floats, and for integers of at most 53 bits).  Multiplying by a normal power of
    two rounds exactly as ``ldexp`` does, and a block-wise broadcast needs no
    per-element exponent array; ``ldexp`` remains for the rare scales whose power of
    two is not a normal number."""
    scales = np.asarray(scales, dtype=np.int64)
    if len(scales) and int(np.abs(scales).max()) > _NORMAL_POWERS:
        np.copyto(out, values)
        exact: np.ndarray = np.ldexp(out, _per_element(scales, block_elements, len(out)), out=out)
        return exact
    factors = np.ldexp(out.dtype.type(1.0), scales)
    whole = len(values) // block_elements
    cut = whole * block_elements
    np.multiply(
        values[:cut].reshape(whole, block_elements),
        factors[:whole, None],
        out=out[:cut].reshape(whole, block_elements),
    )
    if whole < len(factors):
        np.multiply(values[cut:], factors[whole], out=out[cut:])
    return out


def quantize(
    values: np.ndarray,
    element: ElementType,
    scales: np.ndarray,
    block_elements: int,
    limit: int,
    first: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """round_half_even(x * 2^s_b) for every element as int64, or written to ``out``
    when given (signed integers wide enough for ``limit``: a chunk's integers then
    need no further copy); OVERFLOW if a value is not finite or leaves [-limit,
    limit] (an input changed since it was proposed)."""
    values = _own_type(values, element)
    if len(scales) != block_count(len(values), block_elements):
        raise CcoError(ErrorCode.INVALID_FIELD, f"{len(scales)} scales for {len(values)} elements")
    scales = np.asarray(scales, dtype=np.int64)
    scaled: npt.NDArray[np.floating[Any]] = np.empty(
        len(values), dtype=np.float32 if _in_binary32(values, scales) else np.float64
    )
    with np.errstate(over="ignore", invalid="ignore"):
        np.rint(_times_power_of_two(values, scales, block_elements, scaled), out=scaled)
    bound = _float_limit(limit)
    # float() so that the comparison is exact: numpy compares a binary32 scalar with a
    # Python float in binary32, where a bound such as 2^29 - 1 rounds up to 2^29
    if len(scaled) and not (float(np.max(scaled)) <= bound and float(np.min(scaled)) >= -bound):  # NaN fails
        _check_finite(values, first)
        # in binary64 too: binary32 rounds such a bound up to the next power of two
        bad = int(np.argmax(~(np.abs(scaled).astype(np.float64) <= bound)))
        raise CcoError(
            ErrorCode.OVERFLOW,
            f"element {first + bad} ({float(values[bad])!r}) does not fit the sum limit {limit} "
            f"at scale {int(scales[bad // block_elements])}",
        )
    if out is None:
        return scaled.astype(np.int64)
    np.copyto(out, scaled, casting="unsafe")  # integral and within the limit: exact
    return out


def chunk_integers(
    values: np.ndarray,
    element: ElementType,
    scales: np.ndarray,
    proposals: np.ndarray,
    block_elements: int,
    limit: int,
    first: int = 0,
    width: int = 8,
) -> np.ndarray:
    """A block-scaled chunk's wire integers: ``values`` quantized with the agreed
    ``scales``, then this contributor's attestations (its own ``proposals`` for the
    same blocks), written into one array of signed ``width``-byte integers.  At the
    chunk's own width that array is already its payload's integers, which
    :func:`~cco.wire.payload.seal` then neither measures nor narrows again; every
    value fits it, since ``limit`` is at most the width's largest integer."""
    elements = len(values)
    chunk = np.empty(elements + len(scales), dtype=f"<i{width}")
    quantize(values, element, scales, block_elements, limit, first, out=chunk[:elements])
    chunk[elements:] = attestations(proposals, scales)
    return chunk


_COMPILED_STORAGE = (np.dtype(np.float32), np.dtype(np.float64))


def _compiled_dequantize(
    values: np.ndarray,
    scales: np.ndarray,
    block_elements: int,
    divisor: int,
    element: ElementType,
    out: np.ndarray,
) -> bool:
    """:func:`dequantize` by a compiled loop (:mod:`cco.wire.kernels`): the same
    binary64 steps and one rounding to the application's type, in one pass that reads
    the integers at their own width and writes ``out``, with no temporary.  False
    where the loop does not apply (numba missing or turned off, a chunk of a few
    elements, a type other than binary32 or binary64, scales whose powers of two are
    not normal binary64 numbers), where numba failed to compile it, or where a result
    is not finite (the numpy path then names it)."""
    if (
        len(values) <= kernels.SMALL
        or element.code is DType.BFLOAT16
        or element.storage not in _COMPILED_STORAGE
    ):
        return False
    scales = np.asarray(scales, np.int64)
    if len(scales) and int(np.abs(scales).max()) > _NORMAL_POWERS:
        return False
    scaled_back = kernels.compiled_scaled_back()
    if scaled_back is None:
        return False
    return bool(kernels.run(scaled_back, values, np.ldexp(1.0, -scales), block_elements, divisor, out))


def dequantize(
    values: np.ndarray,
    scales: np.ndarray,
    block_elements: int,
    divisor: int,
    element: ElementType,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """y * 2^-s_b (divided by ``divisor`` for AVG) rounded once to the application's
    type; OVERFLOW if a result does not fit it.  ``values`` are signed integers of any
    width (a verified payload's, as it holds them: no widened copy is made); the
    results are written to ``out`` when given (an array of the application's storage
    type and of their length, such as the chunk's slice of the result, so that they
    are not copied there afterwards; it holds garbage where OVERFLOW is raised)."""
    values = np.asarray(values)
    if values.dtype.kind != "i":
        values = values.astype(np.int64)
    if out is None:
        out = np.empty(len(values), dtype=element.storage)
    elif out.shape != values.shape or out.dtype != element.storage:
        wanted = f"{len(values)} {element.storage} values"
        raise ValueError(f"dequantize writes {wanted}, not {out.dtype}{out.shape}")
    if _compiled_dequantize(values, scales, block_elements, divisor, element, out):
        return out
    with np.errstate(over="ignore", under="ignore"):
        decoded = np.empty(len(values), dtype=np.float64)
        _times_power_of_two(values, -np.asarray(scales, np.int64), block_elements, decoded)
        if divisor != 1:
            decoded /= divisor
        if element.code is DType.BFLOAT16:
            out[...] = round_to_bfloat16(decoded.astype(np.float32))
        else:
            np.copyto(out, decoded, casting="same_kind")
    finite = np.isfinite(out)
    if not finite.all():
        bad = int(np.argmin(finite))
        raise CcoError(
            ErrorCode.OVERFLOW, f"result element {bad} ({decoded[bad]!r}) does not fit {element.code.name}"
        )
    return out
