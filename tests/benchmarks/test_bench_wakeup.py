"""benchmarks/probes/bench_wakeup.py: every mode completes its round trips (a lost datagram
would hang it, so the modes' waiting is exercised for real) and is reported."""

from __future__ import annotations

import json
import os
import select
from pathlib import Path

import bench_wakeup  # benchmarks/ is not a package: found through the path set above
import pytest

pytestmark = pytest.mark.skipif(
    not hasattr(select, "epoll") or not hasattr(os, "sched_setaffinity"), reason="needs epoll and affinity"
)


def test_each_mode_is_measured_and_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "wakeup.json"
    assert bench_wakeup.main(["--trips", "200", "--out", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["mode"] for r in results] == list(bench_wakeup.MODES)
    assert all(r["trips"] == 200 and r["round_trip_us"] > 0 and r["cpu_us_per_trip"] >= 0 for r in results)
    printed = capsys.readouterr().out
    assert all(mode in printed for mode in bench_wakeup.MODES)


def test_the_affinity_of_the_caller_is_given_back() -> None:
    before = os.sched_getaffinity(0)
    bench_wakeup.measure("sleep, one core", 50)
    assert os.sched_getaffinity(0) == before
