"""Application tensors to wire integers and back.

Reductions (ALL_REDUCE, REDUCE, REDUCE_SCATTER) carry integers as they are and
floats in fixed point at the header's scale (:mod:`cco.wire.fixedpoint`).
BROADCAST and ALL_GATHER only move data, so they carry every type bit-exactly: one
wire integer per element holding the element's bit pattern as a signed integer of
the same width, except 64-bit types, whose patterns exceed the range bound and so
travel as two wire integers, the low then the high 32-bit half.  ``total_elements``
in a chunk header always counts wire integers (:func:`wire_length`).

The functions work on any slice of wire positions, so a sender can encode and a
receiver decode one chunk at a time (:mod:`cco.wire.chunking`).
"""

from __future__ import annotations

import numpy as np

from cco.wire.dtypes import (
    ElementType,
    bfloat16_from_patterns,
    bfloat16_patterns,
    element_type,
    require_storage,
    round_to_bfloat16,
)
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fixedpoint import contribution_bound, from_fixed, to_fixed
from cco.wire.ops import BIT_EXACT_KINDS, check_scale
from cco.wire.registries import Collective, DType, ReduceOp


def is_bit_exact(kind: Collective) -> bool:
    return kind in BIT_EXACT_KINDS


def wire_length(dtype: DType, kind: Collective, elements: int) -> int:
    """Wire integers that carry ``elements`` application elements."""
    return elements * element_type(dtype).patterns_per_element if is_bit_exact(kind) else elements


def encode_range(
    flat: np.ndarray, element: ElementType, kind: Collective, scale: int, bound: int, start: int, stop: int
) -> np.ndarray:
    """Wire integers at positions [start, stop) of the flat tensor ``flat``, as int64."""
    if is_bit_exact(kind):
        if element.code is DType.BFLOAT16:
            return bfloat16_patterns(flat[start:stop]).astype(np.int64)
        return flat.view(element.pattern)[start:stop].astype(np.int64)
    part = flat[start:stop]
    if element.is_float:
        if element.code is DType.BFLOAT16:
            part = round_to_bfloat16(part)
        return to_fixed(part, scale, bound, first=start)
    wide = part.astype(np.int64)
    if len(wide) and max(-int(wide.min()), int(wide.max())) > bound:
        bad = int(np.argmax(np.abs(wide)))
        raise CcoError(
            ErrorCode.OVERFLOW,
            f"element {start + bad} ({int(wide[bad])}) exceeds the contribution bound {bound}",
        )
    return wide


def encode_values(
    array: np.ndarray, dtype: DType, kind: Collective, scale: int, world_size: int
) -> np.ndarray:
    """The whole tensor (any shape, flattened in C order) as int64 wire integers."""
    check_scale(kind, dtype, scale)
    element = element_type(dtype)
    flat = require_storage(array, element)
    bound = contribution_bound(world_size)
    return encode_range(flat, element, kind, scale, bound, 0, wire_length(dtype, kind, len(flat)))


def _fits(values: np.ndarray, bits: int) -> bool:
    """True when every value is a signed integer of ``bits`` bits."""
    return -(1 << (bits - 1)) <= int(values.min()) and int(values.max()) < 1 << (bits - 1)


def _checked_patterns(values: np.ndarray, pattern: np.dtype[np.signedinteger]) -> np.ndarray:
    if len(values) and not _fits(values, 8 * pattern.itemsize):
        raise CcoError(ErrorCode.OVERFLOW, f"a bit pattern does not fit {pattern}: slices overlapped")
    return values.astype(pattern)


def _round_half_even_div(values: np.ndarray, divisor: int) -> np.ndarray:
    quotient, remainder = np.divmod(values, divisor)
    twice = 2 * remainder
    up = (twice > divisor) | ((twice == divisor) & (quotient % 2 == 1))
    rounded: np.ndarray = quotient + up
    return rounded


def decode_values(
    values: np.ndarray, dtype: DType, kind: Collective, op: ReduceOp, scale: int, contributor_count: int
) -> np.ndarray:
    """Wire integers (a whole tensor, or any slice of whole elements) back to the
    application's dtype.  AVG divides by ``contributor_count``: exactly, rounding half
    to even, for integer types.  OVERFLOW if a result does not fit the type."""
    element = element_type(dtype)
    values = np.asarray(values, dtype=np.int64)
    if is_bit_exact(kind):
        if len(values) % element.patterns_per_element:
            raise CcoError(ErrorCode.INVALID_FIELD, f"{dtype.name} takes two wire integers per element")
        patterns = _checked_patterns(values, element.pattern)
        if element.code is DType.BFLOAT16:
            return bfloat16_from_patterns(patterns)
        return patterns.view(element.storage)
    if contributor_count < 1:
        raise CcoError(ErrorCode.INVALID_FIELD, f"contributor_count {contributor_count} is below 1")
    divisor = contributor_count if op is ReduceOp.AVG else 1
    if element.is_float:
        return from_fixed(values, scale, divisor, element)
    if divisor != 1:
        values = _round_half_even_div(values, divisor)
    if len(values) and not _fits(values, element.bits):
        raise CcoError(ErrorCode.OVERFLOW, f"a result does not fit {dtype.name}")
    return values.astype(element.storage)


def positions(out: np.ndarray, dtype: DType, kind: Collective) -> np.ndarray:
    """The flat application array ``out`` indexed by wire position: ``out`` itself, or
    for the two-halves form its view as 32-bit halves."""
    element = element_type(dtype)
    if is_bit_exact(kind) and element.patterns_per_element == 2:
        return out.view(element.pattern)
    return out


def decode_positions(
    values: np.ndarray, dtype: DType, kind: Collective, op: ReduceOp, scale: int, contributor_count: int
) -> np.ndarray:
    """What to store at the wire positions of ``values`` in :func:`positions`; unlike
    :func:`decode_values` it accepts a slice that splits a 64-bit element."""
    element = element_type(dtype)
    if is_bit_exact(kind) and element.patterns_per_element == 2:
        return _checked_patterns(np.asarray(values, dtype=np.int64), element.pattern)
    return decode_values(values, dtype, kind, op, scale, contributor_count)
