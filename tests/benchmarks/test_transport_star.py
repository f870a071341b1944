"""benchmarks/probes/transport_star.py: a short run on a shaped star moves every round's
chunks up each link and the answers down it, in order, and reports the CPU of every
process; settings it cannot measure are refused."""

from __future__ import annotations

import json
from pathlib import Path

import netns  # benchmarks/support, on the suite's pythonpath (pyproject.toml)
import pytest
import transport_star  # benchmarks/ is not a package: found through the path set in pyproject.toml

REASON = netns.unavailable_reason()
needs_namespaces = pytest.mark.skipif(REASON is not None, reason=f"namespace testbed unavailable: {REASON}")

ENDPOINTS = 2
BYTES = 256 * 1024
CHUNK = 64 * 1024
ROUNDS = 2


@needs_namespaces
def test_every_link_carries_the_rounds_both_ways(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "star.json"
    argv = ["--endpoints", str(ENDPOINTS), "--bytes", str(BYTES), "--chunk-bytes", str(CHUNK)]
    argv += ["--rounds", str(ROUNDS), "--rate-mbit", "200", "--out", str(out)]
    assert transport_star.main(argv) == 0
    result = json.loads(out.read_text())
    assert len(result["round_seconds"]) == ROUNDS and all(s > 0 for s in result["round_seconds"])
    assert result["hub_cpu_per_round"] > 0
    assert len(result["leaf_cpu_per_round"]) == ENDPOINTS and all(c > 0 for c in result["leaf_cpu_per_round"])
    for link in result["link_stats"]:  # payloads plus QUIC's and CCO's headers
        assert link["up_bytes"] >= ROUNDS * BYTES
        assert link["down_bytes"] >= ROUNDS * BYTES
    assert "CPU s per round" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--rounds", "1"],
        ["--window", "0"],
        ["--chunk-bytes", "2"],
        ["--bytes", "1024", "--chunk-bytes", "4096"],
    ],
)
def test_settings_it_cannot_measure_are_refused_before_any_star_is_built(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        transport_star.main(argv)
    assert refused.value.code == 2
