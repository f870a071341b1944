"""benchmarks/probes/bench_idle.py: what busy polling costs an idle node, as BENCHMARKS.md
quotes it: a real loopback cluster measured once per budget, written as JSON."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import bench_idle  # benchmarks/ is not a package: found through the path set above
import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/schedstat").exists(), reason="reads Linux's schedstat")


def test_cpu_seconds_counts_this_process_finer_than_clock_ticks() -> None:
    before = bench_idle.cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.003  # 3 ms of CPU: less than one /proc tick
    while time.process_time() < deadline:
        pass
    spent = bench_idle.cpu_seconds(os.getpid()) - before
    assert 0.002 < spent < 1.0


def test_a_short_run_measures_each_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "idle.json"
    argv = ["--busy-poll-us", "0", "2000", "--rounds", "3", "--seconds", "0.3", "--repeats", "1"]
    assert bench_idle.main([*argv, "--out", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["busy_poll_us"] for r in results] == [0, 2000]
    for result in results:
        assert set(result["cpu_ms_per_second"]) == {"rendezvous", "agg-0"}
        assert all(ms >= 0 for ms in result["cpu_ms_per_second"].values())
    printed = capsys.readouterr().out
    assert "--busy-poll-us     0: idle CPU" in printed and "--busy-poll-us  2000: idle CPU" in printed
