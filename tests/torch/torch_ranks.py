"""Shared by tests/torch: a standalone job's services, and ranks run as processes.

Each test module starts one :class:`cco.standalone.Standalone` (a rendezvous and an
aggregator on loopback) and runs its ranks as separate Python processes with torchrun's
variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and the job's
CCO_CONFIG.  A rank writes what it checked to a JSON file; :func:`run_ranks` returns
those, or fails naming the ranks that did not finish, with the end of their output.

The services are the launcher's (heartbeats every second, a 15 s liveness window), with a
collective timeout of 2 minutes, so that a check that goes wrong fails in bounded time.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cco.standalone import Job, Standalone, StandaloneSpec

WORKER = Path(__file__).resolve().parent / "torch_worker.py"
OPERATION_TIMEOUT_MS = 120_000


@contextlib.contextmanager
def standalone(directory: Path, endpoints: int = 8) -> Iterator[Job]:
    spec = StandaloneSpec(
        directory=directory,
        listen="127.0.0.1:0",
        endpoints=endpoints,
        operation_timeout_ms=OPERATION_TIMEOUT_MS,
    )
    with Standalone(spec) as services:
        yield services.start()


def free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_ranks(
    job: Job,
    workdir: Path,
    phase: str,
    world: int,
    *args: str,
    timeout: float = 240.0,
    env: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Run ``torch_worker.py PHASE`` as ``world`` ranks; each rank's JSON report, by rank."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = str(free_tcp_port())
    processes = []
    for rank in range(world):
        variables = {
            **os.environ,
            **job.environment(),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        }
        out = workdir / f"{phase}-{rank}.json"
        log = open(workdir / f"{phase}-{rank}.log", "w")  # noqa: SIM115 - the child owns it
        argv = [sys.executable, str(WORKER), phase, "--out", str(out), *args]
        processes.append((out, subprocess.Popen(argv, env=variables, stdout=log, stderr=subprocess.STDOUT)))
        log.close()
    deadline = time.monotonic() + timeout
    failed = []
    try:
        for rank, (_, process) in enumerate(processes):
            try:
                code = process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                failed.append(
                    f"rank {rank} did not finish within {timeout:.0f} s: {tail(workdir, phase, rank)}"
                )
                continue
            if code != 0:
                failed.append(f"rank {rank} exited with {code}: {tail(workdir, phase, rank)}")
    finally:
        for _, process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert not failed, "; ".join(failed)
    return [json.loads(out.read_text()) for out, _ in processes]


def tail(workdir: Path, phase: str, rank: int, lines: int = 6) -> str:
    path = workdir / f"{phase}-{rank}.log"
    text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    kept = [line for line in text if "Warning" not in line and not line.startswith("[W")]
    return " | ".join(kept[-lines:]) or "(no output)"


def failures(reports: list[dict[str, Any]]) -> list[str]:
    """Every check a rank reported as failed, as ``rank r: name: detail``."""
    return [
        f"rank {rank}: {check['name']}: {check['detail']}"
        for rank, report in enumerate(reports)
        for check in report["checks"]
        if not check["ok"]
    ]


def checked(reports: list[dict[str, Any]]) -> set[str]:
    """The names of the checks every rank ran."""
    names = [{check["name"] for check in report["checks"]} for report in reports]
    return set.intersection(*names) if names else set()
