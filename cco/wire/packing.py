"""A chunk's integers as payload bytes, and the bounds those integers obey.

Integers are written little-endian, two's complement, ``width`` bytes each.  For
most chunks the width is the smallest of 1, 2, 4 and 8 bytes that holds every
integer of the chunk (1 for an empty chunk): aggregates widen as they climb the
tree, small values stay small on the wire, and because the width is a function of
the values the encoding of a chunk is unique.  Block-scaled chunks are the
exception: their width is part of the operation (:mod:`cco.wire.blockscale`).

The range bound B exists for the MAC: a verifier accepts a tagged chunk only if
every integer satisfies |y| <= B < p / 2, so two different integer vectors within
the bound are different modulo p.  Untagged ops (MIN, MAX, bitwise) have no such
bound; their integers only have to fit 64 bits.
"""

from __future__ import annotations

import numpy as np

from cco.wire.errors import CcoError, ErrorCode

RANGE_BOUND = (1 << 60) - 1
"""B: every integer of every tagged chunk payload satisfies |y| <= B < p / 2."""

WIDTHS = (1, 2, 4, 8)
_LIMITS = tuple((w, -(1 << (8 * w - 1)), (1 << (8 * w - 1)) - 1) for w in WIDTHS)


def contribution_bound(world_size: int) -> int:
    """floor(B / world_size): the largest |x| one contributor may send in a tagged
    integer reduction, so that no honest sum of ``world_size`` contributions leaves
    [-B, B]."""
    if world_size < 1:
        raise CcoError(ErrorCode.INVALID_FIELD, f"world_size {world_size} is below 1")
    return RANGE_BOUND // world_size


SMALL_EXTREMES = 32
"""Up to this many integers, :func:`extremes` reads them as Python integers: numpy's
two reductions cost about 1.3 us whatever the length, against 0.2 us for two
integers and 0.9 us for 32 through a list (the reference machine); an 8-byte
all-reduce finds extremes about six times per rank and round."""


def extremes(values: np.ndarray) -> tuple[int, int]:
    """(min, max) of ``values`` as Python integers; (0, 0) when empty."""
    if len(values) == 0:
        return 0, 0
    if len(values) <= SMALL_EXTREMES:
        listed = values.tolist()
        return min(listed), max(listed)
    return int(values.min()), int(values.max())


def within_bound(lo: int, hi: int) -> bool:
    """True when every integer in [lo, hi] satisfies |y| <= B."""
    return lo >= -RANGE_BOUND and hi <= RANGE_BOUND


def fits_width(lo: int, hi: int, width: int) -> bool:
    """True when [lo, hi] lies in the signed range of ``width`` bytes."""
    return -(1 << (8 * width - 1)) <= lo and hi < 1 << (8 * width - 1)


def minimal_width(lo: int, hi: int) -> int:
    """The smallest width whose signed range holds [lo, hi]."""
    for width, smallest, largest in _LIMITS:
        if smallest <= lo and hi <= largest:
            return width
    raise ValueError(f"[{lo}, {hi}] does not fit 64 bits")


def narrow(values: np.ndarray, width: int) -> np.ndarray:
    """``values`` as little-endian signed integers of ``width`` bytes (values must fit)."""
    return values.astype(f"<i{width}", copy=False)


def unpack(payload: bytes, width: int) -> np.ndarray:
    """The payload's integers, a read-only view of ``width``-byte signed integers."""
    return np.frombuffer(payload, dtype=f"<i{width}")
