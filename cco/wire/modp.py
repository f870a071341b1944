"""Exact arithmetic in F_p, p = 2^61 - 1, vectorised with numpy.

The tag of a chunk needs the inner product <u, y> mod p of a secret coefficient
vector u (61-bit words) and the chunk's integers y (up to 61 bits signed), over up
to 2^20 elements.  It must be exact: one wrong bit and an honest aggregate fails
verification.  numpy has no fast exact wide-integer dot product (its int64 dot is a
scalar loop and would overflow anyway), but float64 matrix-vector products run in
BLAS and are *exact* whenever every product and every partial sum is an integer of
magnitude below 2^53, in whatever order BLAS adds them.

So u is cut into eight 8-bit limbs (a free ``uint8`` view of the keystream words)
and y into 32-bit limbs: the integers themselves for payloads up to 4 bytes wide,
an unsigned low and a signed high half for 8-byte payloads.  Every limb product
has magnitude below 2^8 * 2^32 = 2^40, so a block of 2^13 elements sums to less
than 2^53: exact.  One BLAS call per block gives every limb-by-limb sum at once;
the limbs are recombined with Python integers and reduced mod p once per block.
Blocks are small enough that the float64 copies never leave the CPU caches.
(Measured on the reference machine, this beats 16-bit limbs on both sides: the
matrix-vector product with a contiguous y is cheaper than converting y's limbs.)
"""

from __future__ import annotations

import threading

import numpy as np

P = (1 << 61) - 1
"""The field modulus, a Mersenne prime: 2^61 = 1 (mod p)."""

SUB_BLOCK = 1 << 13
"""Elements summed in float64 at once: 2^13 * 2^40 = 2^53 bounds every partial sum."""

BLOCK = 1 << 16
"""Elements per call into BLAS (8 sub-blocks in one stacked product): large enough
that Python's per-block overhead vanishes, small enough to stay in cache."""

_U_LIMBS = 8
_WORD_MASK = np.uint64((1 << 61) - 1)


class _Scratch(threading.local):
    """Per-thread scratch arrays, allocated once so small chunks pay no page faults.

    ``u_limbs`` starts zeroed and only ever holds small integers: rows past the end
    of a block are finite, so zero-weighted rows can never turn a sum into NaN.
    """

    def __init__(self) -> None:
        self.u_limbs = np.zeros((BLOCK, _U_LIMBS), dtype=np.float64)
        self.y_limbs = np.zeros((BLOCK, 2), dtype=np.float64)
        self.y_single = np.zeros((BLOCK, 1), dtype=np.float64)


_scratch = _Scratch()


def _limb_sums(y_limbs: np.ndarray, u_limbs: np.ndarray) -> np.ndarray:
    """int64 (y limbs x u limbs) sums over all rows, each sub-block summed exactly in
    float64, the sub-block sums added in int64 (at most 8 * 2^53 < 2^63)."""
    m, y_count = y_limbs.shape
    full = m - m % SUB_BLOCK
    sums = np.zeros((y_count, _U_LIMBS), dtype=np.int64)
    if full:
        stacked = np.matmul(
            y_limbs[:full].reshape(-1, SUB_BLOCK, y_count).transpose(0, 2, 1),
            u_limbs[:full].reshape(-1, SUB_BLOCK, _U_LIMBS),
        )
        sums += stacked.astype(np.int64).sum(axis=0)
    if m > full:
        sums += (y_limbs[full:].T @ u_limbs[full:]).astype(np.int64)
    return sums


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
        np.copyto(u_limbs, words.view(np.uint8).reshape(m, _U_LIMBS))
        if self._width < 8:
            y_limbs = scratch.y_single[:m]
            np.copyto(y_limbs[:, 0], values)
        else:
            y_limbs = scratch.y_limbs[:m]
            np.copyto(y_limbs[:, 0], values.view(np.uint32).reshape(m, 2)[:, 0])
            np.copyto(y_limbs[:, 1], values.view(np.int32).reshape(m, 2)[:, 1])
        total = self._total
        for limb, row in enumerate(_limb_sums(y_limbs, u_limbs).tolist()):
            for k, value in enumerate(row):
                total += value << (8 * k + 32 * limb)
        self._total = total % P

    def result(self) -> int:
        """The inner product mod p, in [0, p)."""
        return self._total
