"""What each reduction op and collective kind means for a chunk's integers.

Only linear ops can be authenticated end to end: the homomorphic tag of a sum is
the sum of the tags.  SUM and AVG (a sum divided by the contributor count at the
endpoint) are linear, and so are the data-moving kinds, expressed as sums:
BROADCAST is the root's data alone, ALL_GATHER the sum of zero-padded slices,
BARRIER a sum over zero elements.  MIN, MAX and the bitwise ops have no tag; TLS
protects them hop by hop, and an endpoint can still check that the result is
consistent with its own contribution (:func:`inconsistency`).  Each (kind, op,
dtype) has one wire :class:`Form`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import Enum

import numpy as np

from cco.wire.dtypes import element_type
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.exact import MAX_ELEMENTS, limb_count
from cco.wire.registries import Collective, DType, ReduceOp


@dataclass(frozen=True, slots=True)
class OpSemantics:
    """Semantics of one ``ReduceOp`` code point."""

    code: ReduceOp
    verifiable: bool
    """True when chunks carry a homomorphic tag checked end to end."""
    combine: np.ufunc
    """The exact elementwise combination of two int64 arrays."""
    integer_only: bool
    """Bitwise ops are meaningless on fixed-point floats."""


OPS: dict[ReduceOp, OpSemantics] = {
    o.code: o
    for o in (
        OpSemantics(ReduceOp.SUM, True, np.add, False),
        OpSemantics(ReduceOp.AVG, True, np.add, False),
        OpSemantics(ReduceOp.MIN, False, np.minimum, False),
        OpSemantics(ReduceOp.MAX, False, np.maximum, False),
        OpSemantics(ReduceOp.BAND, False, np.bitwise_and, True),
        OpSemantics(ReduceOp.BOR, False, np.bitwise_or, True),
        OpSemantics(ReduceOp.BXOR, False, np.bitwise_xor, True),
    )
}
assert set(OPS) == set(ReduceOp), "every registered op has semantics"

SUM_KINDS = frozenset({Collective.BROADCAST, Collective.ALL_GATHER, Collective.BARRIER})
"""Kinds expressed as a SUM: their op field must be SUM."""


class Form(Enum):
    """How a chunk's wire integers represent the application's elements (draft section
    "Element Types and Wire Integers"); a function of kind, op and dtype."""

    VALUES = "values"
    """Integer dtypes in reductions: the values themselves, at the smallest width."""
    PATTERNS = "patterns"
    """BROADCAST, ALL_GATHER and BARRIER: bit patterns (64-bit types as two halves)."""
    ORDERED = "ordered"
    """Floats under MIN and MAX: order-preserving keys of the bit patterns, exact."""
    BLOCK_SCALED = "block-scaled"
    """Floats under SUM and AVG: block-scaled fixed point at a fixed width, with one
    attestation integer per block after the elements (:mod:`cco.wire.blockscale`)."""
    EXACT = "exact"
    """Floats under SUM and AVG in a reduction of at most ``exact.MAX_ELEMENTS``
    elements: each value as exact base-2^32 limbs, rounded once at the endpoint
    (:mod:`cco.wire.exact`); no scale pass."""


@functools.cache  # a pure function of four enums, asked several times per chunk
def form(kind: Collective, op: ReduceOp, dtype: DType, exact: bool = False) -> Form:
    """The wire form of a chunk with this kind, op and dtype.  ``exact`` chooses
    between the two forms of a float SUM or AVG reduction: a chunk is EXACT when it
    carries no scales, an operation when it has at most ``exact.MAX_ELEMENTS``
    elements (:func:`sums_exactly`)."""
    if kind in SUM_KINDS:
        return Form.PATTERNS
    if not element_type(dtype).is_float:
        return Form.VALUES
    if not OPS[op].verifiable:
        return Form.ORDERED
    return Form.EXACT if exact else Form.BLOCK_SCALED


@functools.cache  # asked for every chunk message validated
def sums_floats(kind: Collective, op: ReduceOp, dtype: DType) -> bool:
    """Whether chunks of this kind, op and dtype are a float SUM or AVG reduction, the
    only ones that may be block-scaled.  Cached, as a bool, since on Python 3.11 each
    ``Form.MEMBER`` looked up on its class costs an attribute miss."""
    return form(kind, op, dtype) is Form.BLOCK_SCALED


def sums_exactly(kind: Collective, op: ReduceOp, dtype: DType, elements: int) -> bool:
    """Whether an operation of ``elements`` application elements is in the EXACT form."""
    return sums_floats(kind, op, dtype) and elements <= MAX_ELEMENTS


def scaling_problem(
    kind: Collective, op: ReduceOp, dtype: DType, total_elements: int, scaled: bool
) -> str | None:
    """Why a chunk header's scaling fields (``scaled``: it has them) do not fit its
    kind, op, dtype and total_elements, or None.  Only a float SUM or AVG reduction
    has them, and then either form is well formed: block-scaled, with them, or EXACT,
    without, at most MAX_ELEMENTS elements of ``limb_count`` positions each.  (Which
    form an operation takes is the endpoints' rule, :func:`sums_exactly`; a chunk of
    the other form has another chunk identifier, so it never combines with theirs.)"""
    sum_of_floats = sums_floats(kind, op, dtype)
    if sum_of_floats == scaled:  # block-scaled, or no scaling where there is none
        return None
    if not sum_of_floats:
        return f"{_described(kind, op, dtype)} takes no width, block_elements or scales"
    count = limb_count(dtype)
    if total_elements % count or total_elements > MAX_ELEMENTS * count:
        return (
            f"{_described(kind, op, dtype)} without scales is EXACT: total_elements "
            f"{total_elements} is not a multiple of {count} limbs up to {MAX_ELEMENTS} elements"
        )
    return None


def _described(kind: Collective, op: ReduceOp, dtype: DType) -> str:
    """The operation as errors name it; formatted only when there is an error to report."""
    return f"{dtype.name} {op.name} in {kind.name}"


def check_operation(kind: Collective, op: ReduceOp, dtype: DType, total_elements: int) -> None:
    """Refuse a header whose kind, op and dtype do not fit together."""
    if kind in SUM_KINDS and op is not ReduceOp.SUM:
        raise CcoError(ErrorCode.INVALID_FIELD, f"{kind.name} chunks carry op SUM, not {op.name}")
    if kind is Collective.BARRIER and total_elements != 0:
        raise CcoError(ErrorCode.INVALID_FIELD, "a BARRIER carries no elements")
    if OPS[op].integer_only and element_type(dtype).is_float:
        raise CcoError(ErrorCode.UNSUPPORTED_FEATURE, f"{op.name} is not defined on {dtype.name}")


CONSISTENCY_OPS = frozenset({ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR})
"""Ops whose result an endpoint can check against its own contribution."""


def inconsistency(op: ReduceOp, result: np.ndarray, own: np.ndarray) -> str | None:
    """Why ``result`` cannot be a reduction that includes ``own``, or None if it can."""
    if op is ReduceOp.MAX:
        bad = result < own
        rule = "MAX below own value"
    elif op is ReduceOp.MIN:
        bad = result > own
        rule = "MIN above own value"
    elif op is ReduceOp.BOR:
        bad = (result & own) != own
        rule = "BOR lacks own bits"
    elif op is ReduceOp.BAND:
        bad = (result | own) != own
        rule = "BAND has bits own lacks"
    else:
        return None
    if bad.any():
        return f"{rule} at element {int(np.argmax(bad))}"
    return None
