"""Exact arithmetic in F_p, p = 2^61 - 1, vectorised with numpy.

The tag of a chunk needs the inner product <u, y> mod p of a secret coefficient
vector u (61-bit words) and the chunk's integers y (up to 61 bits signed), over up
to 2^20 elements.  It must be exact: one wrong bit and an honest aggregate fails
verification.  numpy has no fast exact wide-integer dot product (its int64 dot is a
scalar loop and would overflow anyway), but float64 dot products run in BLAS and
are *exact* whenever every product and every partial sum is an integer of
magnitude at most 2^53, in whatever order BLAS adds them.

So both operands are cut into 16-bit limbs: u into four unsigned limbs (a free
``uint16`` view of the keystream words), y into one to four limbs depending on the
payload width (the top limb signed, the others unsigned, again free views).  Every
limb product has magnitude at most 2^32 and a block of at most 2^20 elements sums
to at most 2^52: exact.  One small matrix product per block gives every
limb-by-limb sum at once; the limbs are recombined with Python integers and reduced
mod p once per block.  The work runs in cache-sized blocks so that the float64
copies never leave the CPU caches.
"""

from __future__ import annotations

import threading

import numpy as np

P = (1 << 61) - 1
"""The field modulus, a Mersenne prime: 2^61 = 1 (mod p)."""

LIMB_BITS = 16
BLOCK = 1 << 14
"""Elements per block: 16 Ki elements keep every scratch array in the L2 cache."""

_U_LIMBS = 4
_WORD_MASK = np.uint64((1 << 61) - 1)


class _Scratch(threading.local):
    """Per-thread scratch arrays, allocated once so small chunks pay no page faults."""

    def __init__(self) -> None:
        self.u_limbs = np.empty((BLOCK, _U_LIMBS), dtype=np.float64)
        self.y_limbs = np.empty((BLOCK, 4), dtype=np.float64)


_scratch = _Scratch()


class InnerProduct:
    """Accumulates sum_j (w_j mod 2^61) * y_j exactly, block by block.

    ``w_j mod 2^61`` differs from the coefficient u_j = (w_j mod 2^61) mod p only
    when it equals p, and then by p itself, so the result mod p is the same and the
    hot loop never reduces a coefficient.
    """

    __slots__ = ("_total", "_width")

    def __init__(self, width: int) -> None:
        if width not in (1, 2, 4, 8):
            raise ValueError(f"width {width} is not 1, 2, 4 or 8")
        self._width = width
        self._total = 0

    def add(self, words: np.ndarray, values: np.ndarray) -> None:
        """Add one block: ``words`` uint64 (overwritten), ``values`` signed, ``width`` bytes each."""
        m = len(values)
        if m == 0:
            return
        if m > BLOCK or len(words) != m:
            raise ValueError("a block must hold at most BLOCK elements and one word per element")
        scratch = _scratch
        np.bitwise_and(words, _WORD_MASK, out=words)
        u_limbs = scratch.u_limbs[:m]
        np.copyto(u_limbs, words.view(np.uint16).reshape(m, _U_LIMBS))
        y_count = max(1, self._width // 2)
        y_limbs = scratch.y_limbs[:m, :y_count]
        if y_count == 1:
            np.copyto(y_limbs[:, 0], values)
        else:
            unsigned = values.view(np.uint16).reshape(m, y_count)
            for limb in range(y_count - 1):
                np.copyto(y_limbs[:, limb], unsigned[:, limb])
            np.copyto(y_limbs[:, y_count - 1], values.view(np.int16).reshape(m, y_count)[:, y_count - 1])
        sums = u_limbs.T @ y_limbs
        total = self._total
        for k in range(_U_LIMBS):
            for limb in range(y_count):
                total += int(sums[k, limb]) << (LIMB_BITS * (k + limb))
        self._total = total % P

    def result(self) -> int:
        """The inner product mod p, in [0, p)."""
        return self._total


def to_field(value: int) -> int:
    """The element of F_p that a signed integer maps to."""
    return value % P
