"""benchmarks/probes/bench_wire_path.py: both ways of each step give the same bytes and
the same frame (so the probe compares like with like), and its two modes work."""

from __future__ import annotations

import json
from pathlib import Path

import bench_wire_path  # benchmarks/ is not a package: found through the path set above
import pytest

from cco.wire.framing import encode_frame
from cco.wire.messages import encode_message


def test_both_ways_of_each_step_agree_and_decode_gives_the_chunk() -> None:
    ops = bench_wire_path.operations(piece=8900)
    whole = ops["encode_whole"]()
    pieces = ops["encode_pieces"]()
    assert isinstance(whole, bytes) and isinstance(pieces, tuple)
    assert whole == b"".join(pieces) == encode_frame(encode_message(bench_wire_path.chunk()))
    (frame,) = ops["reassemble_run"]()  # type: ignore[misc]
    assert ops["reassemble_by_piece"]() == [b"".join(frame)] == [whole[4:]]  # a 4-byte prefix
    assert ops["decode_joined"]() == ops["decode_pieces"]() == bench_wire_path.chunk()


def test_timing_mode_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "wire_path.json"
    assert bench_wire_path.main(["--calls", "2", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())["seconds_per_message"]
    assert set(figures) == set(bench_wire_path.operations(piece=8900))
    assert all(seconds > 0 for seconds in figures.values())


def test_counting_mode_runs_one_step_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    out = tmp_path / "unused.json"
    assert bench_wire_path.main(["--only", "reassemble_run", "--calls", "2", "--out", str(out)]) == 0
    assert not out.exists()
    with pytest.raises(SystemExit):
        bench_wire_path.main(["--only", "no_such_step"])
