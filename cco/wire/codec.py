"""Application tensors to wire integers and back, for every form but block scaling.

A chunk's :class:`~cco.wire.ops.Form` follows from its kind, op and dtype:

* VALUES: integers in reductions are carried as they are;
* ORDERED: floats under MIN and MAX are carried as order-preserving keys of their
  bit patterns (:func:`~cco.wire.dtypes.ordered_keys`), so the integer minimum or
  maximum is exactly the float one;
* PATTERNS: BROADCAST and ALL_GATHER only move data, so every type travels as its
  bit pattern, one wire integer per element, except 64-bit types, whose patterns
  exceed the range bound and so travel as two wire integers, the low then the high
  32-bit half;
* EXACT: floats under SUM and AVG in a small reduction, as exact limbs
  (:mod:`cco.wire.exact`), ``limb_count`` wire integers per element;
* BLOCK_SCALED: floats under SUM and AVG otherwise (:mod:`cco.wire.blockscale`,
  which needs the agreed scales of each block).

``total_elements`` in a chunk header always counts element positions
(:func:`wire_length`).  The functions work on any slice of positions, so a sender
can encode and a receiver decode one chunk at a time.
"""

from __future__ import annotations

import numpy as np

from cco.wire.dtypes import (
    ElementType,
    bfloat16_from_patterns,
    bfloat16_patterns,
    element_type,
    from_ordered_keys,
    ordered_keys,
    require_storage,
)
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.exact import from_limbs, limb_count, to_limbs
from cco.wire.ops import OPS, Form, form
from cco.wire.packing import contribution_bound, extremes, fits_width
from cco.wire.registries import Collective, DType, ReduceOp


def wire_length(dtype: DType, kind: Collective, elements: int, exact: bool = False) -> int:
    """Element positions (wire integers besides attestations) that carry ``elements``
    application elements (``exact``: of an EXACT operation)."""
    if exact:
        return elements * limb_count(dtype)
    if form(kind, ReduceOp.SUM, dtype) is Form.PATTERNS:
        return elements * element_type(dtype).patterns_per_element
    return elements


def _unscaled(kind: Collective, op: ReduceOp, dtype: DType, exact: bool) -> Form:
    chosen = form(kind, op, dtype, exact)
    if chosen is Form.BLOCK_SCALED:
        raise CcoError(ErrorCode.INTERNAL_ERROR, f"{dtype.name} {op.name} is block-scaled: use blockscale")
    return chosen


def encode_range(
    flat: np.ndarray,
    element: ElementType,
    kind: Collective,
    op: ReduceOp,
    world_size: int,
    start: int,
    stop: int,
    exact: bool = False,
) -> np.ndarray:
    """Wire integers at positions [start, stop) of the flat tensor ``flat``, as int64.

    OVERFLOW for a value the form cannot carry: NaN under MIN or MAX, NaN or an
    infinity in the EXACT form, or, in a tagged integer reduction, an integer beyond
    floor(B / world_size)."""
    chosen = _unscaled(kind, op, element.code, exact)
    if chosen is Form.EXACT:  # the limbs of the elements the positions fall in
        count = limb_count(element.code)
        first, last = start // count, -(-stop // count)
        limbs = to_limbs(flat[first:last], element, first)
        return limbs[start - first * count : stop - first * count]
    if chosen is Form.PATTERNS:
        if element.code is DType.BFLOAT16:
            return bfloat16_patterns(flat[start:stop]).astype(np.int64)
        return flat.view(element.pattern)[start:stop].astype(np.int64)
    part = flat[start:stop]
    if chosen is Form.ORDERED:
        try:
            return ordered_keys(part, element)
        except CcoError as error:
            raise CcoError(error.code, f"{error.detail} (counted from element {start})") from None
    wide = part.astype(np.int64)
    bound = contribution_bound(world_size)
    if OPS[op].verifiable:
        lo, hi = extremes(wide)
        if max(-lo, hi) > bound:
            bad = int(np.argmax(np.abs(wide)))
            raise CcoError(
                ErrorCode.OVERFLOW,
                f"element {start + bad} ({int(wide[bad])}) exceeds the contribution bound {bound}",
            )
    return wide


def encode_values(
    array: np.ndarray, dtype: DType, kind: Collective, op: ReduceOp, world_size: int, exact: bool = False
) -> np.ndarray:
    """The whole tensor (any shape, flattened in C order) as int64 wire integers."""
    element = element_type(dtype)
    flat = require_storage(array, element)
    length = wire_length(dtype, kind, len(flat), exact)
    return encode_range(flat, element, kind, op, world_size, 0, length, exact)


def _checked_patterns(values: np.ndarray, pattern: np.dtype[np.signedinteger]) -> np.ndarray:
    if not fits_width(*extremes(values), pattern.itemsize):
        raise CcoError(ErrorCode.OVERFLOW, f"a bit pattern does not fit {pattern}: slices overlapped")
    return values.astype(pattern)


def _round_half_even_div(values: np.ndarray, divisor: int) -> np.ndarray:
    quotient, remainder = np.divmod(values, divisor)
    twice = 2 * remainder
    up = (twice > divisor) | ((twice == divisor) & (quotient % 2 == 1))
    rounded: np.ndarray = quotient + up
    return rounded


def decode_values(
    values: np.ndarray,
    dtype: DType,
    kind: Collective,
    op: ReduceOp,
    contributor_count: int,
    exact: bool = False,
) -> np.ndarray:
    """Wire integers (a whole tensor, or any slice of whole elements) back to the
    application's dtype.  AVG divides by ``contributor_count``, exactly, rounding half
    to even.  OVERFLOW if a result does not fit the type."""
    element = element_type(dtype)
    values = np.asarray(values, dtype=np.int64)
    chosen = _unscaled(kind, op, dtype, exact)
    if chosen is Form.PATTERNS:
        if len(values) % element.patterns_per_element:
            raise CcoError(ErrorCode.INVALID_FIELD, f"{dtype.name} takes two wire integers per element")
        patterns = _checked_patterns(values, element.pattern)
        if element.code is DType.BFLOAT16:
            return bfloat16_from_patterns(patterns)
        return patterns.view(element.storage)
    if chosen is Form.ORDERED:
        return from_ordered_keys(values, element)
    if contributor_count < 1:
        raise CcoError(ErrorCode.INVALID_FIELD, f"contributor_count {contributor_count} is below 1")
    if chosen is Form.EXACT:
        return from_limbs(values, element, contributor_count if op is ReduceOp.AVG else 1)
    if op is ReduceOp.AVG and contributor_count != 1:
        values = _round_half_even_div(values, contributor_count)
    if not fits_width(*extremes(values), element.bits // 8):
        raise CcoError(ErrorCode.OVERFLOW, f"a result does not fit {dtype.name}")
    return values.astype(element.storage)


def positions(out: np.ndarray, dtype: DType, kind: Collective) -> np.ndarray:
    """The flat application array ``out`` indexed by wire position: ``out`` itself, or
    for the two-halves form its view as 32-bit halves."""
    element = element_type(dtype)
    if wire_length(dtype, kind, 1) == 2:
        return out.view(element.pattern)
    return out


def decode_positions(
    values: np.ndarray, dtype: DType, kind: Collective, op: ReduceOp, contributor_count: int
) -> np.ndarray:
    """What to store at the wire positions of ``values`` in :func:`positions`; unlike
    :func:`decode_values` it accepts a slice that splits a 64-bit element."""
    element = element_type(dtype)
    if wire_length(dtype, kind, 1) == 2:
        return _checked_patterns(np.asarray(values, dtype=np.int64), element.pattern)
    return decode_values(values, dtype, kind, op, contributor_count)
