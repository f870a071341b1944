"""A chunk's integers as payload bytes: little-endian two's complement, smallest width.

The width is the smallest of 1, 2, 4 and 8 bytes that holds every integer of the
chunk (1 for an empty chunk).  Aggregates widen as they climb the tree, small
values stay small on the wire, and because the width is a function of the values
the encoding of a chunk is unique: equal results are equal bytes.
"""

from __future__ import annotations

import numpy as np

from cco.wire.fixedpoint import RANGE_BOUND

WIDTHS = (1, 2, 4, 8)
_LIMITS = tuple((w, -(1 << (8 * w - 1)), (1 << (8 * w - 1)) - 1) for w in WIDTHS)


def extremes(values: np.ndarray) -> tuple[int, int]:
    """(min, max) of ``values`` as Python integers; (0, 0) when empty."""
    if len(values) == 0:
        return 0, 0
    return int(values.min()), int(values.max())


def within_bound(lo: int, hi: int) -> bool:
    """True when every integer in [lo, hi] satisfies |y| <= B."""
    return lo >= -RANGE_BOUND and hi <= RANGE_BOUND


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
