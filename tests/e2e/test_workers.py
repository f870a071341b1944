"""``cco-node --role aggregator --workers 2`` as real processes over loopback.

A rendezvous and a supervisor of two aggregator workers (a development PKI, so the
workers' certificates are issued as they start); the endpoints are ``cco.client``
communicators in this process.  Two groups of two ranks land one on each worker (asked
of the rendezvous with ``cco-node status``), a group of four ranks with ``--max-fan-in
3`` gets a tree over both (two workers of fan-in 2 could hold only three ranks), and
every result is the exact sum, bit for bit, on every rank.  SIGUSR1 to the supervisor
makes every worker dump its flight recorder.  Then the supervisor's ways of ending:
SIGTERM stops both workers and exits 0; a worker killed makes the supervisor stop the
other and exit non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from logcheck import log_problems
from proctree import children, running

from cco.client import Communicator, GroupSpec
from cco.localcluster import free_udp_port
from cco.transport import create_dev_pki
from cco.wire.registries import Role

ELEMENTS = 50_000
GROUPS = {"a": 2, "b": 2, "c": 4}  # name -> ranks; the group id is the name's byte, repeated


def _group_id(name: str) -> bytes:
    return name.encode() * 16


class Nodes:
    """The processes this module started, and where they log."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.pki = workdir / "pki"
        self.rendezvous = f"127.0.0.1:{free_udp_port()}"
        self.started: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.workdir / f"{name}.log", "wb") as log:
            env = {**os.environ, "STATE_DIRECTORY": str(self.workdir / "state")}  # flight-recorder dumps
            process = subprocess.Popen([sys.executable, "-m", "cco", *args], stdout=log, stderr=log, env=env)
        self.started.append(process)
        return process

    def supervisor(self, node_id: str) -> subprocess.Popen[bytes]:
        """A node of two workers, once both have registered with the rendezvous."""
        process = self.spawn(
            node_id, "--role", "aggregator", "--node-id", node_id, "--pki-dir", str(self.pki),
            "--listen", f"127.0.0.1:{_two_free_ports()}", "--rendezvous", self.rendezvous,
            "--max-fan-in", "3", "--workers", "2",
        )  # fmt: skip
        for k in range(2):
            self.wait_for(node_id, f"aggregator {node_id}.w{k} registered", process)
        return process

    def wait_for(self, name: str, needle: str, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 90
        while needle not in self.log(name):
            assert process.poll() is None, (
                f"{name} exited with {process.returncode}: {self.log(name)[-2000:]}"
            )
            assert time.monotonic() < deadline, f"no {needle!r} in {name}'s log within 90 s"
            time.sleep(0.1)

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")

    def status(self) -> dict[str, object]:
        done = subprocess.run(
            [sys.executable, "-m", "cco", "status", "--rendezvous", self.rendezvous, "--pki-dir",
             str(self.pki), "--node-id", "ops", "--json", "--records", "0", "--timeout", "60"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        reply: dict[str, object] = json.loads(done.stdout)
        return reply


def _two_free_ports() -> int:
    """A port P with P + 1 also free a moment ago."""
    for _ in range(100):
        port = free_udp_port()
        if port < 65535:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                try:
                    probe.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise AssertionError("no two adjacent free UDP ports")


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    nodes = Nodes(tmp_path_factory.mktemp("workers"))
    endpoints = [f"{name}-{rank}" for name, size in GROUPS.items() for rank in range(size)]
    create_dev_pki(
        nodes.pki,
        [("rendezvous", Role.RENDEZVOUS), ("ops", Role.ENDPOINT)] + [(e, Role.ENDPOINT) for e in endpoints],
    )
    rendezvous = nodes.spawn(
        "rendezvous", "--role", "rendezvous", "--node-id", "rendezvous", "--pki-dir", str(nodes.pki),
        "--listen", nodes.rendezvous, "--store", ":memory:",
    )  # fmt: skip
    try:
        nodes.wait_for("rendezvous", "listening", rendezvous)
        yield nodes
    finally:
        for process in nodes.started:
            pids = [process.pid, *children(process.pid)]
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(30)
            for pid in pids:
                if running(pid):
                    os.kill(pid, signal.SIGKILL)
            process.wait()


def _input(name: str, rank: int) -> np.ndarray:
    seed = int.from_bytes(_group_id(name)[:4], "big") + rank
    return np.random.default_rng(seed).integers(-(1 << 20), 1 << 20, ELEMENTS, dtype=np.int32)


Results = dict[str, list[np.ndarray]]
Trees = dict[str, set[str]]


async def _all_reduce(nodes: Nodes, names: list[str]) -> tuple[Results, Trees]:
    """Every rank of every named group joins and all-reduces its input once: the
    results by group and rank, and each group's tree as the rendezvous tells it while
    the groups are still open (the aggregators in it, by group name)."""
    comms: dict[str, list[Communicator]] = {}
    try:
        for name in names:
            specs = [
                GroupSpec(
                    group_id=_group_id(name), world_size=GROUPS[name], rank=r, rendezvous=nodes.rendezvous
                )
                for r in range(GROUPS[name])
            ]
            joins = (Communicator.from_pki(s, f"{name}-{s.rank}", nodes.pki, timeout=90) for s in specs)
            comms[name] = list(await asyncio.gather(*joins))
        results = {}
        for name, group in comms.items():
            call = asyncio.gather(*(c.all_reduce(_input(name, r)) for r, c in enumerate(group)))
            results[name] = list(await asyncio.wait_for(call, 120))
        return results, _trees(await asyncio.to_thread(nodes.status))
    finally:
        for group in comms.values():
            await asyncio.gather(*(c.close() for c in group))


def _check_exact(name: str, results: list[np.ndarray]) -> None:
    exact = sum(_input(name, r).astype(np.int64) for r in range(GROUPS[name]))
    assert isinstance(exact, np.ndarray) and np.abs(exact).max() < 1 << 31
    for result in results:
        assert result.dtype == np.int32 and result.tobytes() == exact.astype(np.int32).tobytes()


def _trees(status: dict[str, object]) -> Trees:
    """Each group's tree, as the set of aggregators in it, by group name."""
    groups = status["groups"]
    assert isinstance(groups, list)
    return {
        bytes.fromhex(g["group_id"])[:1].decode(): {a["node_id"] for a in g["tree"] or []} for g in groups
    }


def test_groups_spread_over_workers_and_a_large_group_spans_them(nodes: Nodes) -> None:
    supervisor = nodes.supervisor("agg")
    workers = children(supervisor.pid)
    assert len(workers) == 2

    results, trees = asyncio.run(_all_reduce(nodes, ["a", "b"]))
    for name in ("a", "b"):
        _check_exact(name, results[name])
    assert {frozenset(trees["a"]), frozenset(trees["b"])} == {frozenset({"agg.w0"}), frozenset({"agg.w1"})}

    results, trees = asyncio.run(_all_reduce(nodes, ["c"]))
    _check_exact("c", results["c"])
    assert trees["c"] == {"agg.w0", "agg.w1"}, "four ranks at fan-in 3 need both workers"

    supervisor.send_signal(signal.SIGUSR1)  # a dump, from every worker
    nodes.wait_for("agg", "agg.w0-", supervisor)
    nodes.wait_for("agg", "agg.w1-", supervisor)
    assert sorted(p.name.split("-")[1] for p in (nodes.workdir / "state").glob("flight-agg.*")) == [
        "agg.w0",
        "agg.w1",
    ]

    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(60) == 0
    deadline = time.monotonic() + 30
    while any(running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if running(pid)], "a worker outlived its supervisor"
    assert "stopping 2 workers (SIGTERM)" in nodes.log("agg")
    assert log_problems([nodes.workdir / "agg.log"]) == []


def test_a_worker_that_dies_ends_the_node(nodes: Nodes) -> None:
    supervisor = nodes.supervisor("agh")
    victim, other = children(supervisor.pid)
    os.kill(victim, signal.SIGKILL)
    assert supervisor.wait(60) != 0
    deadline = time.monotonic() + 30
    while running(other) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(other), "the other worker outlived its supervisor"
    assert "was killed by SIGKILL; stopping the others" in nodes.log("agh")
