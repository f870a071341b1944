"""benchmarks/probes/bench_quic_round.py: its rounds are real verified all-reduces over QUIC,
and both of its modes run, so the figures in BENCHMARKS.md stay reproducible."""

from __future__ import annotations

import bench_quic_round  # benchmarks/ is not a package: found through the path set above
import pytest


def test_both_modes_run_verified_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_quic_round.main(["--rounds", "0"]) == 0
    assert capsys.readouterr().out == ""
    assert bench_quic_round.main(["--rounds", "3"]) == 0
    assert "us per round" in capsys.readouterr().out


def test_a_wrong_result_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is real: a rank whose result differs from the sum fails the run."""

    async def wrong(self: object, data: object, op: object, *, out: object) -> object:
        out[:] = 0  # type: ignore[index]
        return out

    monkeypatch.setattr(bench_quic_round.Communicator, "all_reduce", wrong)
    with pytest.raises(SystemExit, match=r"rank 0 got \[0.0, 0.0\]"):
        bench_quic_round.main(["--rounds", "1"])
