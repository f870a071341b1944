"""``cco-node demo`` end to end, small: the command a new user runs first must work.

It starts its own rendezvous, three aggregators in a two-level tree and four
endpoints as separate processes on 127.0.0.1, runs verified float32 all-reduce
rounds and prints a summary.  The test runs the real command line as a subprocess,
bounded in time, and reads what it printed and what every node logged.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from logcheck import log_problems
from proctree import sigterm_stops_everything

ROUNDS = 3
ENDPOINTS = 4


def test_demo_runs_verified_bit_identical_rounds(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    args = ["--endpoints", str(ENDPOINTS), "--aggregators", "3", "--fan-in", "2", "--rounds", str(ROUNDS)]
    args += ["--elements", "4096", "--chunk-elements", "1024", "--timeout", "60", "--workdir", str(workdir)]
    done = subprocess.run(
        [sys.executable, "-m", "cco.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, f"demo exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    out = done.stdout
    progress = re.findall(rf"^rank 0: round (\d+)/{ROUNDS} verified", out, re.MULTILINE)
    assert progress == [str(i) for i in range(1, ROUNDS + 1)], out
    assert f"rounds completed        {ROUNDS} of {ROUNDS} on {ENDPOINTS} ranks, all verified" in out, out
    assert "results bit-identical   yes" in out, out
    logs = sorted(workdir.glob("*.log"))
    assert {p.stem for p in logs} == {"rendezvous", "agg-0", "agg-1", "agg-2"} | {
        f"ep-{i}" for i in range(ENDPOINTS)
    }
    assert log_problems(logs) == []


def test_a_demo_stopped_with_sigterm_stops_every_node_it_started(tmp_path: Path) -> None:
    """``kill`` of a running demo used to end it at once, without its clean-up, and
    its rendezvous and aggregators ran on.  It now unwinds as on Ctrl-C."""
    args = ["--endpoints", "2", "--aggregators", "1", "--rounds", "100000", "--elements", "2"]
    args += ["--workdir", str(tmp_path / "demo")]
    output = tmp_path / "demo.out"
    with open(output, "w") as out:  # a file, not a pipe that would fill while the demo stops
        demo = subprocess.Popen(
            [sys.executable, "-m", "cco.cli", "demo", *args], stdout=out, stderr=subprocess.STDOUT, text=True
        )
    # the rendezvous, the aggregator and two endpoints, once the endpoints are at work
    sigterm_stops_everything(demo, lambda: "rank 0: round 1/" in output.read_text(), started=4)
