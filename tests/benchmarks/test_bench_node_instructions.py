"""benchmarks/probes/bench_node_instructions.py: which node goes under callgrind, how it is
started there, and how the counts become instructions per round.  (The measurement
itself needs valgrind and a minute or more; BENCHMARKS.md gives its figures.)"""

from __future__ import annotations

import sys
from pathlib import Path

import bench_node_instructions as bench  # benchmarks/ is not a package: found through the path set above
import pytest

ENDPOINT = ["--role", "endpoint", "--node-id", "r1-ep-2", "--rank", "2", "--world-size", "4"]


def test_the_aggregator_or_the_endpoint_of_rank_0_is_counted() -> None:
    rank0 = [*ENDPOINT[:5], "0", *ENDPOINT[6:]]
    aggregator = ["--role", "aggregator", "--node-id", "agg-0"]
    rendezvous = ["--role", "rendezvous", "--node-id", "rendezvous"]
    assert bench.counted(rank0, "endpoint") and not bench.counted(ENDPOINT, "endpoint")
    assert not bench.counted(aggregator, "endpoint") and not bench.counted(rendezvous, "endpoint")
    assert bench.counted(aggregator, "aggregator")
    assert not bench.counted(rank0, "aggregator") and not bench.counted(rendezvous, "aggregator")


def test_the_counted_node_runs_as_cco_node_under_callgrind() -> None:
    command = bench.valgrind_command(ENDPOINT, "/tmp/out.42")
    assert command[:3] == ["valgrind", "--tool=callgrind", "--callgrind-out-file=/tmp/out.42"]
    assert command[3:6] == [sys.executable, "-m", "cco.cli"] and command[6:] == ENDPOINT


def test_counts_come_from_the_summary_line(tmp_path: Path) -> None:
    dump = tmp_path / "callgrind.7.2"
    dump.write_text("version: 1\ncmd: python\npart: 2\nevents: Ir\nfn=(1) main\n3 5\nsummary: 1234567\n")
    assert bench.instructions(dump) == 1234567
    unfinished = tmp_path / "callgrind.7.3"
    unfinished.write_text("version: 1\nevents: Ir\n")
    with pytest.raises(ValueError, match="no summary line"):
        bench.instructions(unfinished)


def test_instructions_per_round_is_the_difference_over_the_extra_rounds() -> None:
    assert bench.per_round(2_000_000, 2_600_000, 50, 250) == 3000
    with pytest.raises(ValueError):
        bench.per_round(1, 2, 250, 250)


def test_without_valgrind_it_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench.shutil, "which", lambda name: None)
    assert bench.main(["--node", "endpoint"]) == 2
    assert "needs valgrind" in capsys.readouterr().err
