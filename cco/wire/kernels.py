"""Compiled loops for the per-chunk arithmetic of endpoints and aggregators, where numba is installed.

Some steps of every large chunk are loops over its elements that numpy runs as several
passes, through temporary arrays:

* the MAC's inner product (:class:`~cco.wire.modp.InnerProduct`), which numpy
  computes over limbs cut so that 64-bit sums hold them, in about a dozen passes;
* scaling a verified Result back (:func:`~cco.wire.blockscale.dequantize`): widen,
  multiply, divide for AVG, round to the application's type, written straight into
  the chunk's place in the result;
* an aggregator adding a child's integers into a slot's int64 accumulator
  (:func:`accumulate`: widen, add, and the accumulator's extremes, which the range
  check and the Result's width need, in one pass instead of three), where a bound
  cannot tell without them that the sum stays in range.

The loops here read each element once; ``benchmarks/probes/bench_endpoint_chunk.py``
times an endpoint's steps on either path.  Quantizing stays with numpy: a compiled
loop that rounds, checks the range and writes the integers in one pass was no faster
than numpy's vectorized passes.

numba is an optional dependency (``pip install 'cco[fast]'``): about 200 MiB installed
and a quarter of a second to import.  The client library loads it, and both loops,
on a worker thread before a member joins (:func:`preload`, called by
``Communicator.join`` unless told not to); a ``cco-node`` endpoint whose workload
has chunks that large loads them before it starts; elsewhere numba is imported when
the first large chunk needs a loop; aggregators, which do neither step, never load
it (:func:`accumulate`, the aggregator's loop, is compiled only on request).  Each
loop is compiled once per argument type and kept in numba's on-disk cache
(``cache=True``: beside this file, else in the user's cache directory), so a later
process only loads it.
``CCO_KERNELS=numpy`` keeps numpy where numba is installed, and a loop numba fails to
compile is logged and left to numpy (:func:`run`).  Each loop computes
exactly what the numpy code computes (integers exactly; floats with the same IEEE
operations, in the same order, in the same types), so peers may use either.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

import numpy as np

KERNELS_ENV = "CCO_KERNELS"
"""Environment variable: ``numba`` (the default: compiled where numba is installed)
or ``numpy`` (never compiled)."""
CHOICES = ("numba", "numpy")
SMALL = 32
"""Chunks of at most this many elements are scaled back by numpy: the loop gains
nothing on them, and a process that only moves small messages (whose MAC blocks, of
at most ``modp.SMALL_BLOCK`` elements, are summed with Python integers) then never
loads numba."""
WIDEST = 4
"""Bytes per integer the inner product's loop takes: at most 32-bit signed."""

_OFFSET = 1 << 31
Sums = tuple[np.uint64, ...]
T = TypeVar("T")
log = logging.getLogger(__name__)


def offset_product_sums(words: np.ndarray, values: np.ndarray) -> Sums:
    """Six sums from which :func:`combine` makes sum_j (w_j mod 2^61) * y_j.

    Each word's coefficient u = w mod 2^61 is u0 + 2^32 u1 (u0 < 2^32, u1 < 2^29), and
    each integer y (signed, at most 32 bits) is taken as a = y + 2^31, in [0, 2^32).
    The products u0 * a < 2^64 and u1 * a < 2^61 are cut into 32-bit halves, and six
    sums collect the halves and the coefficients' limbs: every term is below 2^32, so
    no sum overflows 64 bits before 2^32 elements.  This is the function numba
    compiles; run as Python it gives the same sums, slowly."""
    mask61 = np.uint64((1 << 61) - 1)
    mask32 = np.uint64(0xFFFFFFFF)
    shift = np.uint64(32)
    low_low = low_high = high_low = high_high = u_low = u_high = np.uint64(0)
    for j in range(len(values)):
        u = words[j] & mask61
        a = np.uint64(np.int64(values[j]) + _OFFSET)
        u0 = u & mask32
        u1 = u >> shift
        low = u0 * a
        high = u1 * a
        low_low += low & mask32
        low_high += low >> shift
        high_low += high & mask32
        high_high += high >> shift
        u_low += u0
        u_high += u1
    return low_low, low_high, high_low, high_high, u_low, u_high


def combine(sums: Sums) -> int:
    """sum_j u_j y_j from :func:`offset_product_sums`: sum u_j a_j less 2^31 sum u_j."""
    low_low, low_high, high_low, high_high, u_low, u_high = (int(s) for s in sums)
    products = low_low + ((low_high + high_low) << 32) + (high_high << 64)
    return products - ((u_low + (u_high << 32)) << 31)


def scaled_back(
    values: np.ndarray, factors: np.ndarray, block_elements: int, divisor: int, out: np.ndarray
) -> bool:
    """out[j] = values[j] * factors[b] (divided by ``divisor`` unless it is 1), in
    binary64, then rounded once to the type of ``out``: numpy's ``astype``, multiply,
    divide and ``astype`` again, element by element.  ``values`` are signed integers
    of any width, widened one at a time.  False if some result is not finite in
    ``out``'s type."""
    finite = True
    n = len(values)
    for b in range(len(factors)):
        factor = factors[b]
        first = b * block_elements
        stop = min(n, first + block_elements)
        # a block's slices, walked from 0: the loop numba then vectorizes
        part, dest = values[first:stop], out[first:stop]
        if divisor == 1:
            for j in range(len(part)):
                dest[j] = np.float64(part[j]) * factor
        else:
            for j in range(len(part)):
                dest[j] = np.float64(part[j]) * factor / divisor
        for j in range(len(dest)):
            finite &= bool(np.isfinite(dest[j]))
    return finite


def accumulate_loop(total: np.ndarray, part: np.ndarray) -> tuple[np.int64, np.int64]:
    """total[j] += part[j] for every j, total int64 and part any signed integer type;
    returns (min, max) of total afterwards.  Every sum must fit int64 (see
    :func:`accumulate`).  The function numba compiles; run as Python, slowly, it
    gives the same results."""
    low = high = np.int64(0)
    for j in range(len(total)):
        value = total[j] + np.int64(part[j])
        total[j] = value
        if j == 0 or value < low:
            low = value
        if j == 0 or value > high:
            high = value
    return low, high


_failed = False
"""Set when numba failed to compile a loop: the process then stays on numpy."""
_preloading = threading.Lock()
"""One :func:`preload` at a time: members joining at once from several threads load
the loops once, into one dispatcher per loop."""


def chosen() -> str:
    """What the environment asks for: :data:`KERNELS_ENV`, else ``numba``."""
    return os.environ.get(KERNELS_ENV, "numba")


@functools.cache
def _numba() -> ModuleType | None:
    if _failed:
        return None
    choice = chosen()
    if choice not in CHOICES:
        log.warning("%s=%r is not one of %s: using numpy", KERNELS_ENV, choice, ", ".join(CHOICES))
        return None
    if choice == "numpy":
        return None
    try:
        import numba
    except ImportError:
        return None
    module: ModuleType = numba
    return module


@functools.cache
def _compiled(function: Callable[..., Any]) -> Callable[..., Any] | None:
    numba = _numba()
    if numba is None:
        return None
    compiled: Callable[..., Any] = numba.njit(cache=True, nogil=True)(function)
    return compiled


def compiled_sums(width: int) -> Callable[[np.ndarray, np.ndarray], Sums] | None:
    """:func:`offset_product_sums` compiled, for integers of ``width`` bytes, or None
    where it does not apply (numba missing or turned off, or wider integers)."""
    return _compiled(offset_product_sums) if width <= WIDEST else None


def compiled_scaled_back() -> Callable[[np.ndarray, np.ndarray, int, int, np.ndarray], bool] | None:
    """:func:`scaled_back` compiled, or None (numba missing or turned off)."""
    return _compiled(scaled_back)


def accumulate(total: np.ndarray, part: np.ndarray, *, compiled: bool = False) -> tuple[int, int]:
    """Add ``part`` (signed integers of any width, as a chunk's payload holds them)
    into ``total`` (int64, as long) in place; return (min, max) of ``total`` after.

    An aggregator's slot keeps one int64 accumulator per chunk and adds each child's
    part into it as it arrives, instead of combining and re-encoding partial
    aggregates: the extremes tell at once whether the total still lies in the range
    the MAC allows (:data:`~cco.wire.packing.RANGE_BOUND`) and, after the last part,
    the Result's width.  Precondition, which that range check keeps: every value of
    ``total`` and of ``part`` lies within [-2^62, 2^62], so no sum leaves int64.
    ``compiled`` asks for the compiled loop (where numba is in use and the chunk is
    larger than :data:`SMALL`; numpy otherwise, with the same results).  It is off
    by default because of what numba costs a process that has not loaded it: about
    100 MiB of resident memory and half a CPU second, against about 13 us saved per
    32 Ki-element part (5 against 18 us on the host of BENCHMARKS.md): 2 to 3% of
    an aggregator's CPU in a bulk all-reduce (``benchmarks/probes/bench_accumulate.py``).
    (0, 0) for empty arrays."""
    if total.dtype != np.int64 or part.shape != total.shape or part.dtype.kind != "i":
        raise ValueError(
            f"accumulate takes int64 and signed integers of one shape: {total.dtype}, {part.dtype}"
        )
    if compiled and len(total) > SMALL and part.dtype.isnative and total.flags.writeable:
        loop = _compiled(accumulate_loop)
        result = None if loop is None else run(loop, total, part)
        if result is not None:
            return int(result[0]), int(result[1])
    np.add(total, part, out=total)
    if len(total) == 0:
        return 0, 0
    return int(total.min()), int(total.max())


def run(kernel: Callable[..., T], *args: Any) -> T | None:
    """``kernel(*args)``, or None if numba fails to compile it for these arguments (an
    installation whose numba does not support this numpy, say).  Then the failure is
    logged, the process stays on numpy from here on, and the caller takes its numpy
    path: a broken accelerator costs speed, never a collective.  Any other error is
    raised as it is."""
    global _failed
    try:
        return kernel(*args)
    except Exception as error:
        numba = _numba()
        if numba is None or not isinstance(error, numba.core.errors.NumbaError):
            raise
        log.warning("numba could not compile %s (%s): using numpy", kernel, error)
        _failed = True
        _numba.cache_clear()
        _compiled.cache_clear()
        return None


def preload() -> bool:
    """Load numba and both loops now, for every argument type the payload layer gives
    them, instead of in the first large chunk; whether numba is in use.

    For a process that then exempts what start-up built from garbage collection
    (``cco-node``'s :func:`~cco.services.roles.settle_heap`): numba's import and its
    dispatchers leave several hundred thousand objects, and loaded in the middle of a
    run they are what the next collections walk.  On the 2-core host of BENCHMARKS.md,
    after the first 512-byte all-reduce of four endpoints loaded numba, the next rounds
    took 114, 64, 70, 36, 34, 20 and 15 ms against about 5 (young collections of 4 to
    10 ms, full ones of 20 to 59 ms, in each endpoint).  Types not foreseen here are
    still compiled when first met.  Safe to call from any thread, as often as wanted."""
    with _preloading:
        return _preload()


def _preload() -> bool:
    sums, back = compiled_sums(WIDEST), compiled_scaled_back()
    if sums is None or back is None:
        return False
    words = np.zeros(SMALL + 1, np.uint64)
    for width in (np.int8, np.int16, np.int32):
        values = np.zeros(SMALL + 1, width)
        run(sums, words, values)
        values.flags.writeable = False  # a received payload's integers are read-only views
        run(sums, words, values)
    for storage in (np.float32, np.float64):
        for itemsize in (1, 2, 4, 8):
            held = np.zeros(SMALL + 1, f"<i{itemsize}")
            held.flags.writeable = False  # scaled back as the verified payload holds them
            run(back, held, np.ones(1), SMALL + 1, 1, np.empty(SMALL + 1, storage))
    return _numba() is not None


def configured() -> str:
    """The path a process started here with this environment takes, found without
    importing numba (for a harness whose children inherit its memory peak): ``numba``
    where it is installed and not turned off, else ``numpy``."""
    return "numba" if chosen() == "numba" and importlib.util.find_spec("numba") is not None else "numpy"


def active() -> str:
    """Which path runs the loops: ``numba`` or ``numpy``."""
    return "numba" if _numba() is not None else "numpy"


def reset() -> None:
    """Choose again on the next use (after :data:`KERNELS_ENV` changed, or a failure)."""
    global _failed
    _failed = False
    _numba.cache_clear()
    _compiled.cache_clear()
