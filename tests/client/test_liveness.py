"""Liveness with real processes: a rank stopped for half the liveness window keeps its
place; a rank killed is named to the others long before the window runs out, since
its closed port draws ICMP reports (draft section "Heartbeats and Loss Detection").

The services are a standalone job's (a rendezvous and an aggregator on loopback) with
a liveness window of :data:`WINDOW_MS`; each rank is ``liveness_rank.py`` in its own
process, driven line by line.  No assertion is tighter than the documented bound
(the window) plus slack for a loaded machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from cco.standalone import Job, Standalone, StandaloneSpec

WINDOW_MS = 15_000  # the default: what a loaded machine needs (an 8 s one lost a busy rank at load 20)
RANK = Path(__file__).resolve().parent / "liveness_rank.py"
SLACK = 15.0
"""Seconds beyond the window a verdict may take on a loaded machine."""

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="SIGSTOP and ICMP reports: Linux"
)


@contextmanager
def job(directory: Path) -> Iterator[Job]:
    spec = StandaloneSpec(
        directory=directory,
        listen="127.0.0.1:0",
        endpoints=3,
        operation_timeout_ms=120_000,
        liveness_ms=WINDOW_MS,
    )
    with Standalone(spec) as services:
        yield services.start()


class Ranks:
    """``world`` rank processes, each with a pipe in and a pipe out."""

    def __init__(self, job: Job, world: int, logs: Path) -> None:
        env = {**os.environ, **job.environment(), "OMP_NUM_THREADS": "1"}
        self.processes = [
            subprocess.Popen(
                [sys.executable, str(RANK), str(rank), str(world)],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=open(logs / f"rank-{rank}.log", "w"),  # noqa: SIM115 - the child owns it
                text=True,
            )
            for rank in range(world)
        ]

    def read(self, rank: int) -> dict[str, Any]:
        out = self.processes[rank].stdout
        assert out is not None
        line = out.readline()
        assert line, f"rank {rank} ended without answering"
        record: dict[str, Any] = json.loads(line)
        return record

    def tell(self, rank: int, command: str) -> None:
        pipe: IO[str] | None = self.processes[rank].stdin
        assert pipe is not None
        pipe.write(command + "\n")
        pipe.flush()

    def all(self, command: str, ranks: list[int]) -> list[dict[str, Any]]:
        for rank in ranks:
            self.tell(rank, command)
        return [self.read(rank) for rank in ranks]

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()


@contextmanager
def ranks(job: Job, world: int, logs: Path) -> Iterator[Ranks]:
    running = Ranks(job, world, logs)
    try:
        joined = [running.read(rank) for rank in range(world)]
        assert [j["joined"] for j in joined] == list(range(world))
        yield running
    finally:
        running.close()


def test_a_rank_stopped_for_half_the_window_keeps_its_place(tmp_path: Path) -> None:
    with job(tmp_path / "job") as services, ranks(services, 2, tmp_path) as group:
        first = group.all("allreduce 1000", [0, 1])
        assert [r.get("exact") for r in first] == [True, True], first
        epoch = first[0]["epoch"]
        group.processes[1].send_signal(signal.SIGSTOP)
        time.sleep(WINDOW_MS / 2000)  # half the window, without a heartbeat from rank 1
        group.processes[1].send_signal(signal.SIGCONT)
        after = group.all("allreduce 1000", [0, 1])
        assert [r.get("exact") for r in after] == [True, True], after
        assert [r["epoch"] for r in after] == [epoch, epoch]  # nobody was lost


def test_a_killed_rank_is_named_to_the_others_within_the_window(tmp_path: Path) -> None:
    with job(tmp_path / "job") as services, ranks(services, 3, tmp_path) as group:
        first = group.all("allreduce 100", [0, 1, 2])
        assert [r.get("exact") for r in first] == [True] * 3, first
        group.processes[2].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        for rank in (0, 1):
            group.tell(rank, "allreduce 100")  # rank 2 never comes
        failed = [group.read(rank) for rank in (0, 1)]
        took = time.monotonic() - killed
        for record in failed:
            assert record.get("error") == "PEER_LOST" and record["missing"] == [2], record
            assert "{2}" in record["text"]
        assert took < WINDOW_MS / 1000 + SLACK, f"the loss took {took:.1f} s"
        print(f"rank 2 named lost {took:.1f} s after SIGKILL (window {WINDOW_MS / 1000:g} s)")
