"""benchmarks/probes/bench_workers.py: a short run measures the single aggregator and then
each of the two workers, every one of them having done some of the work."""

from __future__ import annotations

import json
from pathlib import Path

import bench_workers  # benchmarks/ is not a package: found through the path set in pyproject.toml
import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/schedstat").exists(), reason="reads Linux's schedstat")


def test_a_short_run_measures_one_aggregator_then_two_workers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "workers.json"
    assert bench_workers.main(["--elements", "65536", "--rounds", "2", "--out", str(out)]) == 0
    one, two = json.loads(out.read_text())["results"]
    assert (one["workers"], two["workers"]) == (1, 2)
    assert set(one["cpu_s_per_round"]) == {"agg"}
    assert set(two["cpu_s_per_round"]) == {"agg.w0", "agg.w1"}
    for result in (one, two):
        assert all(seconds > 0 for seconds in result["cpu_s_per_round"].values()), "every process worked"
        assert result["mb_per_cpu_s"] > 0
    printed = capsys.readouterr().out
    assert "--workers 1: CPU per round agg " in printed and "--workers 2: CPU per round agg.w0 " in printed
