"""Exact arithmetic in F_p, p = 2^61 - 1, vectorised with numpy.

The tag of a chunk needs the inner product <u, y> mod p of a secret coefficient
vector u (61-bit words) and the chunk's integers y (1, 2, 4 or 8 bytes, signed),
over up to 2^20 elements.  It must be exact: one wrong bit and an honest aggregate
fails verification.  A single product already needs up to 61 + 63 bits, so the
operands are cut into limbs small enough that numpy's 64-bit integer sums of
products (one pass in C, no temporary array) never overflow:

* u into a low limb of 32 bits and a high limb of 29 bits;
* y into 16-bit limbs: one signed limb for payloads of 1 or 2 bytes; for wider
  ones unsigned low limbs and a signed top limb (a free ``uint16`` / ``int16``
  view of the payload, widened to 64 bits).

Over a block of at most 2^16 elements every limb-by-limb sum stays in range: an
unsigned one below (2^32 - 1)(2^16 - 1) 2^16 < 2^64 in ``uint64``, a signed one
below (2^32 - 1) 2^15 2^16 < 2^63 in ``int64``.  The limb sums are recombined with
Python integers and reduced mod p once per block.  (Measured on the reference
machine: 0.61 ms per 64 Ki int32 elements with the coefficients' AES keystream,
against 0.89 ms for float64 products of 8-bit limbs through BLAS, whose exactness
needed 8192-element sub-blocks and eight float64 copies of every coefficient.)
Where numba is installed, blocks of integers of at most 32 bits go through a
compiled loop instead (:mod:`cco.wire.kernels`), which computes the same integer.
"""

from __future__ import annotations

import threading
from operator import mul

import numpy as np

from cco.wire import kernels

P = (1 << 61) - 1
"""The field modulus, a Mersenne prime: 2^61 = 1 (mod p)."""

BLOCK = 1 << 16
"""Elements per block: the most for which every limb sum stays within 64 bits."""

SMALL_BLOCK = 32
"""Blocks of at most this many elements are summed with Python integers instead: for
them the dozen numpy calls of the limb path cost more than the products themselves
(measured on the reference machine: 1.5 against 18 us for two int32 elements, 8 against
15 us for 32; from about 64 elements numpy is faster)."""

WORD_MASK = (1 << 61) - 1
"""Keeps a 64-bit keystream word's low 61 bits: w mod 2^61, before the reduction mod p."""
_WORD_MASK = np.uint64(WORD_MASK)
_LOW_MASK = np.uint64((1 << 32) - 1)
_HIGH_MASK = np.uint64((1 << 29) - 1)  # bits 32..60 of a word: u is the word mod 2^61
_HIGH_SHIFT = np.uint64(32)


class _Scratch(threading.local):
    """Per-thread limb arrays, allocated once so small chunks pay no page faults."""

    def __init__(self) -> None:
        self.u_limbs = np.empty((2, BLOCK), dtype=np.uint64)  # u's low and high limb, one row each
        self.y_limb = np.empty(BLOCK, dtype=np.uint64)


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
        """Add one block: ``words`` uint64 keystream words, ``values`` signed, ``width`` bytes each."""
        m = len(values)
        if m == 0:
            return
        if m > BLOCK or len(words) != m:
            raise ValueError("a block must hold at most BLOCK elements and one word per element")
        if m <= SMALL_BLOCK:
            self._total = (self._total + small_sum(mask_words(words), values)) % P
            return
        compiled = kernels.compiled_sums(self._width)
        sums = None if compiled is None else kernels.run(compiled, words, values)
        if sums is not None:
            self._total = (self._total + kernels.combine(sums)) % P
            return
        self.add_split(split_words(words, _scratch.u_limbs[:, :m]), values)

    def add_prepared(self, prepared: np.ndarray, values: np.ndarray) -> None:
        """Add one block whose coefficients :func:`prepare` kept."""
        if prepared.ndim == 1:
            self.add(prepared, values)
        else:
            self.add_split(prepared, values)

    def add_split(self, u: np.ndarray, values: np.ndarray) -> None:
        """Add one block whose coefficients are already split: ``u`` as
        :func:`split_words` returns it, one column per value."""
        m = len(values)
        if m > BLOCK or u.shape != (2, m) or u.dtype != np.uint64:
            raise ValueError("a block must hold at most BLOCK elements and two limbs per element")
        if m == 0:
            return
        values = np.ascontiguousarray(values)  # the limb views below need one run of memory
        limbs = self._width // 2 or 1  # 1- and 2-byte integers are one signed limb
        y = _scratch.y_limb[:m]
        total = 0
        for k in range(limbs - 1):  # the unsigned low limbs of wider integers
            np.copyto(y, values.view(np.uint16).reshape(m, limbs)[:, k])
            total += _limb_sum(u, y) << (16 * k)
        top = y.view(np.int64)
        np.copyto(top, values if limbs == 1 else values.view(np.int16).reshape(m, limbs)[:, -1])
        total += _limb_sum(u.view(np.int64), top) << (16 * (limbs - 1))
        self._total = (self._total + total) % P

    def result(self) -> int:
        """The inner product mod p, in [0, p)."""
        return self._total


def mask_words(words: np.ndarray) -> np.ndarray:
    """Keystream words mod 2^61 (uint64), in one numpy pass."""
    masked: np.ndarray = np.bitwise_and(words, _WORD_MASK)
    return masked


def small_sum(coefficients: np.ndarray, values: np.ndarray) -> int:
    """sum_j u_j y_j of a block of at most ``SMALL_BLOCK`` elements, in Python integers
    (exact; the loop runs in C): for so few, cheaper than the limb path's numpy calls."""
    return sum(map(mul, coefficients.tolist(), values.tolist()))


def prepare(words: np.ndarray, width: int) -> np.ndarray:
    """One block's coefficients in the form the inner product at ``width`` takes
    fastest, for :meth:`InnerProduct.add_prepared` to use again: a copy of the words
    where Python integers or the compiled loop multiply them (8 bytes per element),
    else the limbs of :func:`split_words` (16)."""
    if len(words) <= SMALL_BLOCK or kernels.compiled_sums(width) is not None:
        return words.copy()
    return split_words(words, np.empty((2, len(words)), dtype=np.uint64))


def split_words(words: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out`` ((2, m) ``uint64``) holding the low 32 and the high 29 bits of each word
    mod 2^61, the two limbs of its coefficient, one row each."""
    np.bitwise_and(words, _LOW_MASK, out=out[0])
    np.right_shift(words, _HIGH_SHIFT, out=out[1])
    np.bitwise_and(out[1], _HIGH_MASK, out=out[1])
    return out


def _limb_sum(u: np.ndarray, y: np.ndarray) -> int:
    """sum_j u_j y_j for u's two limbs (rows of ``u``) and one limb ``y`` of the
    integers, both unsigned (``uint64``) or both read as ``int64`` for a signed limb.

    One ``einsum`` computes both rows' products in a single pass over ``y``: 78 us
    for 64 Ki elements against 102 us for two ``np.dot`` calls (the reference
    machine); integer sums are exact in any order, so it is the same number."""
    low, high = np.einsum("ij,j->i", u, y).tolist()
    return int(low) + (int(high) << 32)
