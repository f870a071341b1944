"""What each aggregator process does when a node runs ``--workers 2``: CPU per round.

Two groups of two ranks each all-reduce ``--elements`` float32 at once, ``--rounds``
times, through one aggregator node started as ``cco-node --role aggregator
--workers W``: once with W = 1 (both groups on one process) and once with W = 2
(the rendezvous puts one group on each worker).  The endpoints are ``cco.client``
communicators in this process, the rendezvous and the aggregators ``cco-node``
processes on loopback.  For every aggregator process this reads its CPU time
(``/proc/<pid>/schedstat``) before and after the measured rounds (after one warm-up
round) and prints CPU seconds per round and the bytes it moved (in plus out) per CPU
second; with two workers each should do about half of what the single process does.
CPU time, not wall time: on a machine with fewer free cores than processes the
wall-clock gain cannot show (see docs/deployment.md, "Using several cores").

    python benchmarks/probes/bench_workers.py --elements 1048576 --rounds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from cco.client import Communicator, GroupSpec
from cco.localcluster import free_udp_port
from cco.transport import create_dev_pki
from cco.wire.registries import Role

RESULTS = Path(__file__).resolve().parent / "results" / "bench_workers.json"
GROUPS = (b"\x0a" * 16, b"\x0b" * 16)
RANKS = 2


def cpu_seconds(pid: int) -> float:
    """A process's CPU time, from the scheduler's nanosecond count."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def _spawn(workdir: Path, name: str, *args: str) -> subprocess.Popen[bytes]:
    with open(workdir / f"{name}.log", "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "cco", *args], stdout=log, stderr=log)


def _wait_for(
    workdir: Path, name: str, pattern: str, count: int, process: subprocess.Popen[bytes]
) -> list[str]:
    """The first ``count`` matches of ``pattern`` in ``name``'s log, once there are that many."""
    deadline = time.monotonic() + 120
    while True:
        found = re.findall(pattern, (workdir / f"{name}.log").read_text(errors="replace"))
        if len(found) >= count:
            return found[:count]
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{name}: no {count} x {pattern!r} (see {workdir / name}.log)")
        time.sleep(0.1)


async def _rounds(pki: Path, rendezvous: str, elements: int, rounds: int, pids: list[int]) -> list[float]:
    """Join both groups, run one warm-up round, then ``rounds`` measured ones: the CPU
    seconds each of ``pids`` spent over the measured rounds."""
    comms = []
    for index, group_id in enumerate(GROUPS):
        specs = [
            GroupSpec(group_id=group_id, world_size=RANKS, rank=r, rendezvous=rendezvous)
            for r in range(RANKS)
        ]
        joins = (Communicator.from_pki(s, f"ep-{index}-{s.rank}", pki, timeout=120) for s in specs)
        comms += list(await asyncio.gather(*joins))
    data = np.ones(elements, dtype=np.float32)
    try:
        await asyncio.gather(*(c.all_reduce(data) for c in comms))
        before = [cpu_seconds(pid) for pid in pids]
        for _ in range(rounds):
            await asyncio.gather(*(c.all_reduce(data) for c in comms))
        return [cpu_seconds(pid) - b for pid, b in zip(pids, before, strict=True)]
    finally:
        await asyncio.gather(*(c.close() for c in comms))


def measure(workers: int, elements: int, rounds: int, busy_poll_us: int, workdir: Path) -> dict[str, Any]:
    pki = workdir / "pki"
    endpoints = [(f"ep-{g}-{r}", Role.ENDPOINT) for g in range(len(GROUPS)) for r in range(RANKS)]
    create_dev_pki(pki, [("rendezvous", Role.RENDEZVOUS), ("agg", Role.AGGREGATOR), *endpoints])
    rendezvous = f"127.0.0.1:{free_udp_port()}"
    common = ["--pki-dir", str(pki), "--max-datagram-size", "16000"]
    rendezvous_args = ["--role", "rendezvous", "--node-id", "rendezvous", "--listen", rendezvous]
    started = [_spawn(workdir, "rendezvous", *rendezvous_args, "--store", ":memory:", *common)]
    try:
        _wait_for(workdir, "rendezvous", "listening", 1, started[0])
        listen = f"127.0.0.1:{free_udp_port()}"
        node_args = [
            "--role",
            "aggregator",
            "--node-id",
            "agg",
            "--rendezvous",
            rendezvous,
            "--listen",
            listen,
        ]
        node_args += ["--workers", str(workers), "--busy-poll-us", str(busy_poll_us)]
        node = _spawn(workdir, "agg", *node_args, *common)
        started.append(node)
        if workers == 1:
            pids = {"agg": node.pid}
        else:
            found = _wait_for(workdir, "agg", r"worker (\S+) started \(pid (\d+)\)", workers, node)
            pids = {name: int(pid) for name, pid in found}
        _wait_for(workdir, "agg", r"aggregator \S+ registered", workers, node)
        spent = asyncio.run(_rounds(pki, rendezvous, elements, rounds, list(pids.values())))
    finally:
        for process in reversed(started):
            process.terminate()
            process.wait(60)
    moved = len(GROUPS) * 2 * RANKS * elements * 4 * rounds  # each group: every rank's part in, the sum out
    return {
        "workers": workers,
        "busy_poll_us": busy_poll_us,
        "elements": elements,
        "rounds": rounds,
        "cpu_s_per_round": {name: s / rounds for name, s in zip(pids, spent, strict=True)},
        "total_cpu_s_per_round": sum(spent) / rounds,
        "mb_per_cpu_s": moved / 1e6 / sum(spent),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--elements", type=int, default=1 << 20, help="float32 per rank and round")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--busy-poll-us", type=int, default=1000, help="the aggregators' (their CPU includes polling)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="cco-workers-") as tmp:
        for workers in (1, 2):
            workdir = Path(tmp) / f"w{workers}"
            workdir.mkdir()
            result = measure(workers, args.elements, args.rounds, args.busy_poll_us, workdir)
            results.append(result)
            each = ", ".join(f"{name} {s * 1e3:.1f} ms" for name, s in result["cpu_s_per_round"].items())
            print(
                f"--workers {workers}: CPU per round {each}; all aggregators "
                f"{result['total_cpu_s_per_round'] * 1e3:.1f} ms, {result['mb_per_cpu_s']:.0f} MB per CPU s",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
