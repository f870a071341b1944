"""benchmarks/probes/bench_small_messages.py: the functions it times are those of a real
8-byte round (the chunk it builds verifies, and combining it gives the 4-rank sum),
and its two modes work, so the figures in BENCHMARKS.md stay reproducible."""

from __future__ import annotations

import json
from pathlib import Path

import bench_small_messages  # benchmarks/ is not a package: found through the path set above
import numpy as np
import pytest

from cco.wire.dtypes import ELEMENT_TYPES
from cco.wire.exact import to_limbs
from cco.wire.messages import Contribution, Result
from cco.wire.registries import DType


def test_the_timed_calls_are_a_real_round() -> None:
    ops = bench_small_messages.operations()
    sealed = ops["seal"]()
    assert isinstance(sealed, Contribution) and sealed.width == 4 and len(sealed.payload) == 18 * 4
    combined = ops["combine"]()
    assert isinstance(combined, Result) and combined.contributors == b"\x03"
    decoded = ops["decode_message"]()
    assert isinstance(decoded, Result) and decoded.contributors == b"\x0f"
    every_rank_sent = to_limbs(np.array([1.5, -2.25], dtype=np.float32), ELEMENT_TYPES[DType.FLOAT32])
    verified = ops["open_verified"]()
    assert isinstance(verified, np.ndarray)
    np.testing.assert_array_equal(verified, 4 * every_rank_sent)


def test_timing_mode_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "small.json"
    assert bench_small_messages.main(["--calls", "3", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())["seconds_per_call"]
    assert set(figures) == set(bench_small_messages.operations())
    assert all(seconds > 0 for seconds in figures.values())


def test_counting_mode_runs_one_function_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    out = tmp_path / "unused.json"
    assert bench_small_messages.main(["--only", "decode_message", "--calls", "2", "--out", str(out)]) == 0
    assert not out.exists()
    with pytest.raises(SystemExit):
        bench_small_messages.main(["--only", "no_such_function"])
