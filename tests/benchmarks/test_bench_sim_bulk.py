"""benchmarks/probes/bench_sim_bulk.py: its rounds are verified all-reduces at every chunk
size, and the fit separates a per-chunk cost from a per-round one, so the split of the
nodes' CPU in BENCHMARKS.md stays reproducible."""

from __future__ import annotations

import json
from pathlib import Path

import bench_sim_bulk  # benchmarks/ is not a package: found through the path set above
import numpy as np
import pytest


def test_a_round_gives_every_rank_the_exact_sum() -> None:
    cluster = bench_sim_bulk.deployment(chunk_elements=1024)
    inputs = [np.full(3000, rank + 1, np.float32) for rank in range(bench_sim_bulk.RANKS)]
    outputs = [np.zeros(3000, np.float32) for _ in range(bench_sim_bulk.RANKS)]
    bench_sim_bulk.one_round(cluster, bench_sim_bulk.GROUP, inputs, outputs)
    for out in outputs:
        np.testing.assert_array_equal(out, np.full(3000, 1 + 2 + 3 + 4, np.float32))


def test_the_fit_recovers_a_known_split() -> None:
    elements = 8192
    points = {c: 0.25 + 1e-4 * bench_sim_bulk.RANKS * (elements // c) for c in (512, 1024, 4096)}
    fixed, per_chunk = bench_sim_bulk.fit(points, elements)
    assert fixed == pytest.approx(0.25)
    assert per_chunk == pytest.approx(1e-4)


def test_main_writes_one_figure_per_chunk_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim_bulk.json"
    args = ["--elements", "4096", "--chunks", "1024", "4096", "--rounds", "1", "--out", str(out)]
    assert bench_sim_bulk.main(args) == 0
    record = json.loads(out.read_text())
    assert set(record["cpu_seconds_per_round"]) == {"1024", "4096"}
    assert "us per chunk of one rank" in capsys.readouterr().out


def test_one_chunk_size_is_refused() -> None:
    with pytest.raises(SystemExit):
        bench_sim_bulk.main(["--chunks", "1024"])
