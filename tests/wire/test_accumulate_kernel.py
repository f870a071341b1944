"""An aggregator's accumulator: the compiled loop and numpy give the same bits.

:func:`~cco.wire.kernels.accumulate` adds a part of any wire width into an int64
total in place and returns the total's extremes.  Each module test runs on both paths
(``both_kernels``); the loop itself is also checked run as Python, without numba.
"""

from __future__ import annotations

import numpy as np
import pytest

from cco.wire import kernels
from cco.wire.packing import RANGE_BOUND, extremes

pytestmark = pytest.mark.both_kernels

WIDTHS = (1, 2, 4, 8)
SIZES = (0, 1, kernels.SMALL, kernels.SMALL + 1, 4099)


def part_of(width: int, size: int, seed: int) -> np.ndarray:
    """A payload's integers: random, with both ends of the width's range included."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(np.dtype(f"<i{width}"))
    low, high = (max(info.min, -RANGE_BOUND), min(info.max, RANGE_BOUND))
    values = rng.integers(low, high, size, dtype=np.int64, endpoint=True)
    values[: min(2, size)] = [low, high][: min(2, size)]
    part = values.astype(f"<i{width}")
    part.flags.writeable = False  # a received payload is a read-only view
    return part


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("size", SIZES)
def test_accumulate_adds_in_place_and_returns_the_extremes(
    width: int, size: int, inner_product_path: str
) -> None:
    parts = [part_of(width, size, seed) for seed in range(3)]
    total = np.zeros(size, np.int64)
    expected = np.zeros(size, np.int64)
    for part in parts:
        result = kernels.accumulate(total, part, compiled=True)
        expected += part.astype(np.int64)
        assert result == extremes(expected)
        assert total.tobytes() == expected.tobytes()


@pytest.mark.parametrize("width", WIDTHS)
def test_both_paths_agree_bit_for_bit(width: int, inner_product_path: str) -> None:
    part = part_of(width, 4099, 7)
    start = part_of(8, 4099, 8).astype(np.int64) // 4
    compiled, plain = start.copy(), start.copy()
    assert kernels.accumulate(compiled, part, compiled=True) == kernels.accumulate(plain, part)
    assert compiled.tobytes() == plain.tobytes()


def test_the_loop_run_as_python_gives_the_same_results() -> None:
    part = part_of(2, 100, 3)
    total = part_of(4, 100, 4).astype(np.int64)
    expected = total + part
    low, high = kernels.accumulate_loop(total, part)
    assert total.tobytes() == expected.tobytes()
    assert (int(low), int(high)) == extremes(expected)


def test_wrong_types_are_refused() -> None:
    with pytest.raises(ValueError, match="int64"):
        kernels.accumulate(np.zeros(4, np.int32), np.zeros(4, np.int8))
    with pytest.raises(ValueError, match="one shape"):
        kernels.accumulate(np.zeros(4, np.int64), np.zeros(5, np.int8))
    with pytest.raises(ValueError, match="signed"):
        kernels.accumulate(np.zeros(4, np.int64), np.zeros(4, np.float32))


def test_a_big_endian_part_takes_the_numpy_path() -> None:
    part = part_of(4, 100, 5).astype(">i4")
    total = np.zeros(100, np.int64)
    assert kernels.accumulate(total, part, compiled=True) == extremes(part.astype(np.int64))
    assert total.tolist() == part.tolist()
