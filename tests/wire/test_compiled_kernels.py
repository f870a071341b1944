"""The compiled inner product: the same exact integer as numpy's limbs, loaded only
where a block needs it.

The six sums of :func:`~cco.wire.kernels.offset_product_sums` are checked against
Python integers with the function run as Python (no numba needed), then the compiled
loop against the same function, at the ends of every integer range and at the
largest coefficients.  Coefficients kept by one path are taken back by the other,
so peers and a process that changes its choice agree.  The MAC tests themselves
(test_payload_mac.py and its neighbours) run once on each path, through the
``inner_product_path`` fixture in conftest.py.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cco.wire import blockscale, kernels, mac
from cco.wire.dtypes import element_type
from cco.wire.errors import CcoError
from cco.wire.modp import BLOCK, SMALL_BLOCK, InnerProduct, P, prepare
from cco.wire.payload import derive_group_keys
from cco.wire.registries import DType

HAVE_NUMBA = importlib.util.find_spec("numba") is not None
NEEDS_NUMBA = pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed (pip install '.[fast]')")
KEYS = derive_group_keys(bytes(range(32)), bytes(range(16, 32)))
TYPES = [np.int8, np.int16, np.int32]


def use(choice: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the loops on ``choice`` (``numba`` or ``numpy``) from the next block on."""
    monkeypatch.setenv(kernels.KERNELS_ENV, choice)
    kernels.reset()


def on_path(choice: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`use`, skipping the test for ``numba`` where it is not installed."""
    if choice == "numba" and not HAVE_NUMBA:
        pytest.skip("numba is not installed (pip install '.[fast]')")
    use(choice, monkeypatch)


def exact(words: np.ndarray, values: np.ndarray) -> int:
    return sum((int(w) % 2**61) * int(y) for w, y in zip(words, values, strict=True))


def cases(dtype: type[np.signedinteger], n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Random words and integers, and every integer at each end of its range under
    the largest words (all ones: u = 2^61 - 1 once the top three bits are dropped)."""
    rng = np.random.default_rng(n)
    info = np.iinfo(dtype)
    words = rng.integers(0, 2**64, size=n, dtype=np.uint64)
    largest = np.full(n, np.uint64(2**64 - 1))
    return [
        (words, rng.integers(info.min, info.max, size=n, endpoint=True).astype(dtype)),
        (largest, np.full(n, info.min, dtype=dtype)),
        (largest, np.full(n, info.max, dtype=dtype)),
    ]


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("n", [1, 7, 100])
def test_the_six_sums_make_the_exact_product(dtype: type[np.signedinteger], n: int) -> None:
    for words, values in cases(dtype, n):
        assert kernels.combine(kernels.offset_product_sums(words, values)) == exact(words, values)


@NEEDS_NUMBA
@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("n", [1, SMALL_BLOCK + 1, 1000, BLOCK])
def test_the_compiled_loop_gives_the_same_sums(
    dtype: type[np.signedinteger], n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    use("numba", monkeypatch)
    compiled = kernels.compiled_sums(np.dtype(dtype).itemsize)
    assert compiled is not None
    for words, values in cases(dtype, n):
        product = kernels.combine(compiled(words, values))
        if n <= 1000:
            assert product == kernels.combine(kernels.offset_product_sums(words, values))
        assert product == exact(words, values)


@NEEDS_NUMBA
def test_the_compiled_loop_reads_a_strided_array_as_its_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    use("numba", monkeypatch)
    values = np.arange(-3000, 3000, dtype=np.int32)[::3]
    words = np.random.default_rng(3).integers(0, 2**64, size=len(values), dtype=np.uint64)
    product = InnerProduct(4)
    product.add(words, values)
    assert product.result() == exact(words, values) % P


def test_wider_integers_are_never_compiled() -> None:
    assert kernels.compiled_sums(8) is None


@pytest.mark.parametrize("choice", kernels.CHOICES)
def test_either_path_takes_back_what_the_other_kept(choice: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sealing under one path and verifying under the other (a process whose choice
    changed between the two) gives the product of a fresh derivation."""
    if not HAVE_NUMBA:
        pytest.skip("numba is not installed (pip install '.[fast]'): one of the two paths is missing")
    other = next(c for c in kernels.CHOICES if c != choice)
    values = np.random.default_rng(9).integers(-(2**31), 2**31, size=5000).astype(np.int32)
    cache = mac.CoefficientCache(chunks=2)
    use(choice, monkeypatch)
    sealed = mac.inner_product(KEYS, b"chunk", values, keep=cache)
    assert len(cache) == 1
    assert cache.nbytes == (8 if choice == "numba" else 16) * len(values)
    use(other, monkeypatch)
    assert mac.inner_product(KEYS, b"chunk", values, reuse=cache) == sealed
    assert len(cache) == 0
    assert sealed == mac.inner_product(KEYS, b"chunk", values)


def test_prepared_coefficients_are_words_only_for_the_compiled_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    words = np.arange(40, dtype=np.uint64)
    use("numpy", monkeypatch)
    assert prepare(words, 4).shape == (2, 40)
    if HAVE_NUMBA:
        use("numba", monkeypatch)
        kept = prepare(words, 4)
        assert kept.shape == (40,) and not np.shares_memory(kept, words)
        assert prepare(words, 8).shape == (2, 40)


def test_numpy_is_configured_when_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernels.KERNELS_ENV, "numpy")
    assert kernels.configured() == "numpy"
    monkeypatch.setenv(kernels.KERNELS_ENV, "numba")
    assert kernels.configured() == ("numba" if HAVE_NUMBA else "numpy")


def test_an_unknown_choice_is_logged_and_numpy_is_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    use("fortran", monkeypatch)
    with caplog.at_level(logging.WARNING, logger="cco.wire.kernels"):
        assert kernels.active() == "numpy"
    assert "CCO_KERNELS='fortran' is not one of numba, numpy" in caplog.text


def test_numba_is_loaded_by_the_first_block_that_uses_it_and_no_sooner() -> None:
    """Nodes, the aggregator's arithmetic, small chunks and asking which path is
    configured never import numba (its import alone takes a quarter of a second and
    tens of MiB); a large block does, where it is installed."""
    script = """
import sys
import numpy as np
import cco.cli, cco.nodes.aggregator, cco.nodes.endpoint
from cco.wire import mac
from cco.wire.payload import derive_group_keys
keys = derive_group_keys(bytes(32), bytes(16))
from cco.wire import kernels
print(kernels.configured())
mac.inner_product(keys, b"small", np.arange(32, dtype=np.int32))
print("numba" in sys.modules)
mac.inner_product(keys, b"large", np.arange(33, dtype=np.int32))
print("numba" in sys.modules)
"""
    env = {k: v for k, v in os.environ.items() if k != kernels.KERNELS_ENV}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["numba" if HAVE_NUMBA else "numpy", "False", str(HAVE_NUMBA)]


@NEEDS_NUMBA
def test_preloading_compiles_every_loop_a_run_then_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    """After :func:`kernels.preload`, all-reduces of every width and storage type the
    payload layer hands the loops (over the in-memory cluster, each message encoded
    and decoded) compile nothing more: a ``cco-node`` endpoint that preloads before
    exempting its start-up objects from garbage collection meets no compile later."""
    from cco.nodes.calls import CollectiveRequest
    from cco.nodes.events import OperationCompleted
    from cco.nodes.rendezvous import RendezvousConfig
    from cco.nodes.sim import GroupSpec, build_cluster
    from cco.wire.registries import Collective, ReduceOp

    use("numba", monkeypatch)
    assert kernels.preload()
    loops = [kernels._compiled(kernels.offset_product_sums), kernels._compiled(kernels.scaled_back)]
    preloaded = [list(loop.signatures) for loop in loops]  # type: ignore[union-attr]
    group = bytes(range(16))
    params = RendezvousConfig().params
    cluster = build_cluster([GroupSpec(group, 3)], aggregators=1, params=params, max_fan_in=8)
    rng = np.random.default_rng(7)
    sums, avg, most = ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX
    cases = [(np.float32, None, sums), (np.float32, 16, avg), (np.float32, 8, sums)]
    cases += [(np.float64, None, sums), (np.int32, None, sums), (np.float32, None, most)]
    for dtype, width, op in cases:
        for n in (SMALL_BLOCK + 1, 3000):
            arrays = [(rng.standard_normal(n) * 100).astype(dtype) for _ in range(3)]
            requests = {
                rank: CollectiveRequest(kind=Collective.ALL_REDUCE, op=op, array=x, width=width)
                for rank, x in enumerate(arrays)
            }
            outcomes = cluster.collective(group, requests)
            assert all(isinstance(o, OperationCompleted) for o in outcomes.values()), outcomes
    assert [list(loop.signatures) for loop in loops] == preloaded  # type: ignore[union-attr]


def test_preloading_where_numpy_is_chosen_loads_nothing() -> None:
    script = "import sys\nfrom cco.wire import kernels\nprint(kernels.preload(), 'numba' in sys.modules)"
    env = {**os.environ, kernels.KERNELS_ENV: "numpy"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["False", "False"]


# --- scaling a Result back -------------------------------------------------------------


def float_chunk(dtype: type[np.floating], n: int, seed: int) -> np.ndarray:
    """Random floats over many magnitudes, with ties, signed zeros, subnormals and the
    type's extremes mixed in."""
    rng = np.random.default_rng(seed)
    info = np.finfo(dtype)
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, size=n)).astype(dtype)
    specials = [0.5, 1.5, -2.5, 0.0, -0.0, info.smallest_subnormal, -info.max, info.max]
    x[rng.integers(0, n, size=len(specials))] = np.array(specials, dtype=dtype)
    return x


def outcome(step: Callable[..., np.ndarray], *args: Any, **kwargs: Any) -> tuple[str, bytes]:
    """What a step gives: its bits, or the error it raises (code and text)."""
    try:
        return "ok", step(*args, **kwargs).tobytes()
    except CcoError as error:
        return f"{error.code.name}: {error.detail}", b""


@pytest.mark.parametrize("storage", [DType.FLOAT32, DType.FLOAT64])
@pytest.mark.parametrize("divisor", [1, 3, 4])
def test_scaling_back_gives_the_same_floats_or_error_on_either_path(
    storage: DType, divisor: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Integers beyond 2^53 (rounded to binary64 on the way), subnormal and overflowing
    results, and averages: the same bits, or the same OVERFLOW."""
    element = element_type(storage)
    rng = np.random.default_rng(divisor)
    block, n = 32, 1024
    values = rng.integers(-(2**62), 2**62, size=n) >> rng.integers(0, 62, size=n)
    values[:4] = [2**53 + 1, -(2**53) - 3, 2**62 - 1, 0]
    blocks = n // block
    for scales in (rng.integers(-40, 80, size=blocks), np.full(blocks, 1000), np.full(blocks, -900)):
        results = []
        for choice in ("numpy", "numba"):
            on_path(choice, monkeypatch)
            results.append(outcome(blockscale.dequantize, values, scales, block, divisor, element))
        assert results[0] == results[1]


@pytest.mark.parametrize("choice", ["numpy", "numba"])
@pytest.mark.parametrize("width", [np.int8, np.int16, np.int32])
def test_scaling_back_narrow_read_only_integers_into_a_slice_gives_the_same_floats(
    choice: str, width: type[np.signedinteger], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verified payload's integers as it holds them (narrow, read-only), scaled back
    into a slice of a larger result: the bits that widening them to int64 first and
    copying the decoded chunk there give, on either path; the rest of the result is
    left alone."""
    on_path(choice, monkeypatch)
    element = element_type(DType.FLOAT32)
    rng = np.random.default_rng(7)
    info = np.iinfo(width)
    block, n = 16, 200
    values = rng.integers(info.min, info.max, size=n, endpoint=True).astype(width)
    values.flags.writeable = False
    scales = rng.integers(-20, 40, size=-(-n // block))
    for divisor in (1, 3):
        wide = blockscale.dequantize(values.astype(np.int64), scales, block, divisor, element)
        result = np.full(n + 10, 7.0, dtype=np.float32)
        into = blockscale.dequantize(values, scales, block, divisor, element, out=result[5 : n + 5])
        assert np.shares_memory(into, result)
        assert result[5 : n + 5].tobytes() == wide.tobytes()
        assert (result[:5] == 7).all() and (result[n + 5 :] == 7).all()
    with pytest.raises(ValueError, match="dequantize writes"):
        blockscale.dequantize(values, scales, block, 1, element, out=np.empty(n, np.float64))


def test_the_scaling_back_loop_run_as_python_agrees_with_numpy() -> None:
    """The function numba compiles, run as Python on a short chunk: the floats numpy
    gives, for a sum and an average, and False where a result overflows."""
    element = element_type(DType.FLOAT32)
    x = float_chunk(np.float32, 40, 1)
    x[np.abs(x) > 1e30] = 2.0
    limit = blockscale.sum_limit(4, 4)
    scales = blockscale.propose(x, element, 8, limit)
    values = blockscale.quantize(x, element, scales, 8, limit)
    factors = np.ldexp(1.0, -scales.astype(np.int64))
    for divisor in (1, 3):
        back = np.empty(40, np.float32)
        assert kernels.scaled_back(values, factors, 8, divisor, back)
        assert back.tobytes() == blockscale.dequantize(values, scales, 8, divisor, element).tobytes()
    with np.errstate(over="ignore"):  # as Python, the cast to binary32 warns as numpy's does
        assert not kernels.scaled_back(values, np.ldexp(1.0, -scales.astype(np.int64) + 200), 8, 1, back)


# --- a loop numba cannot compile -----------------------------------------------------


@NEEDS_NUMBA
def test_a_loop_that_fails_to_compile_leaves_the_process_on_numpy(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As a numba that does not support this numpy would: the block is multiplied by
    numpy, the failure is logged, and no later block asks numba again."""
    from numba.core.errors import TypingError

    use("numba", monkeypatch)
    calls = []

    def broken(*args: object) -> kernels.Sums:
        calls.append(args)
        raise TypingError("no implementation for this numpy")

    monkeypatch.setattr(kernels, "compiled_sums", lambda width: broken)
    words = np.random.default_rng(4).integers(0, 2**64, size=100, dtype=np.uint64)
    values = np.arange(-50, 50, dtype=np.int32)
    product = InnerProduct(4)
    with caplog.at_level(logging.WARNING, logger="cco.wire.kernels"):
        product.add(words, values)
    assert product.result() == exact(words, values) % P
    assert len(calls) == 1 and "numba could not compile" in caplog.text
    assert kernels.active() == "numpy"
    assert kernels.compiled_scaled_back() is None  # the other loop is not tried either
    kernels.reset()
    assert kernels.active() == "numba"


def test_errors_other_than_compiling_are_raised() -> None:
    def buggy(*args: object) -> None:
        raise IndexError("a bug in the loop")

    with pytest.raises(IndexError, match="a bug in the loop"):
        kernels.run(buggy)
