"""benchmarks/probes/bench_sim_round.py: its rounds are real verified all-reduces, and both of
its modes run, so the instruction counts in BENCHMARKS.md stay reproducible."""

from __future__ import annotations

import bench_sim_round  # benchmarks/ is not a package: found through the path set above
import pytest


def test_each_round_is_a_verified_all_reduce_of_every_rank() -> None:
    cluster = bench_sim_round.deployment()
    results = bench_sim_round.rounds(cluster, 3)
    assert [r.tolist() for r in results] == [[0.0 + 1 + 2 + 3, 4.0]] * bench_sim_round.RANKS
    aggregator = cluster.aggregator(cluster.aggregators[0])
    assert aggregator.open_slots(bench_sim_round.GROUP) == 0  # every round completed


def test_both_modes_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_sim_round.main(["--rounds", "0"]) == 0
    assert capsys.readouterr().out == ""
    assert bench_sim_round.main(["--rounds", "5"]) == 0
    assert "us per round" in capsys.readouterr().out
