"""``cco-node status`` against live nodes: a rendezvous serving two groups over two
aggregators, one of those aggregators, and an endpoint at its status address.

The cluster runs in this process, on an event loop of its own thread, over real QUIC
on 127.0.0.1; the command runs as a subprocess (``python -m cco status``), as an
operator would run it, with a certificate of its own from the group CA.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from quic_cluster import Cluster

from cco.client import Communicator
from cco.transport import create_dev_pki
from cco.wire.messages import GroupParams
from cco.wire.registries import Role

T = TypeVar("T")

GROUP_A = bytes.fromhex("aa" * 16)
GROUP_B = bytes.fromhex("bb" * 16)
RELAXED = GroupParams(chunk_elements=1024, window=4, heartbeat_interval_ms=5000, operation_timeout_ms=60_000)
"""Heartbeats far apart: the cluster shares one thread with this test's subprocesses on a
busy machine, and must not lose a node while a status command starts."""


@dataclass
class Live:
    """A cluster on a loop of its own thread; ``call`` runs a coroutine there."""

    pki: Path
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    cluster: Cluster | None = None
    groups: dict[bytes, list[Communicator]] = field(default_factory=dict)
    endpoint_status: str = ""

    def call(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = 60) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(make(), self.loop)
        return future.result(timeout)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    pki = tmp_path_factory.mktemp("pki")
    nodes = [("rendezvous", Role.RENDEZVOUS), ("agg-0", Role.AGGREGATOR), ("agg-1", Role.AGGREGATOR)]
    nodes += [(f"a-{i}", Role.ENDPOINT) for i in range(4)] + [(f"b-{i}", Role.ENDPOINT) for i in range(2)]
    create_dev_pki(pki, [*nodes, ("operator", Role.ENDPOINT)])
    state = Live(pki)
    thread = threading.Thread(target=state.loop.run_forever, daemon=True)
    thread.start()

    async def start() -> None:
        cluster = Cluster(pki, aggregators=2, max_fan_in=3, params=RELAXED)
        await cluster.start()
        state.cluster = cluster
        state.groups[GROUP_A] = await cluster.join(GROUP_A, [f"a-{i}" for i in range(4)])
        state.groups[GROUP_B] = await cluster.join(GROUP_B, ["b-0", "b-1"])
        comms = state.groups[GROUP_A]
        await asyncio.gather(*(c.all_reduce(np.arange(100, dtype=np.int32)) for c in comms))
        host, port = await comms[0].service.listen_status("127.0.0.1", 0)
        state.endpoint_status = f"{host}:{port}"

    try:
        state.call(start)
        yield state
    finally:
        if state.cluster is not None:
            state.call(state.cluster.close)
        state.loop.call_soon_threadsafe(state.loop.stop)
        thread.join(10)


def status(live: Live, *args: str, node_id: str = "operator") -> subprocess.CompletedProcess[str]:
    assert live.cluster is not None
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CCO_")}
    command = [sys.executable, "-m", "cco", "status", "--pki-dir", str(live.pki), "--node-id", node_id]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=60, env=environ, check=False
    )


def test_rendezvous_status_as_json_names_both_groups_their_members_epochs_and_trees(live: Live) -> None:
    assert live.cluster is not None
    done = status(live, "--rendezvous", live.cluster.rendezvous, "--json")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert (reply["role"], reply["node_id"]) == ("rendezvous", "rendezvous")
    groups = {g["group_id"]: g for g in reply["groups"]}
    assert set(groups) == {GROUP_A.hex(), GROUP_B.hex()}
    a, b = groups[GROUP_A.hex()], groups[GROUP_B.hex()]
    assert (a["world_size"], a["state"], b["world_size"], b["state"]) == (4, "active", 2, "active")
    ranks = {c.rank: c.service.identity.node_id for c in live.groups[GROUP_A]}
    assert [(m["rank"], m["node_id"], m["connected"]) for m in a["members"]] == [
        (rank, ranks[rank], True) for rank in range(4)
    ]
    assert a["epoch"] == live.groups[GROUP_A][0].epoch and b["epoch"] == live.groups[GROUP_B][0].epoch
    # fan-in 3 over 4 ranks: a root with an aggregator below it
    tree = a["tree"]
    assert tree[0]["parent"] is None and sorted(tree[0]["ranks"]) == [0, 1, 2, 3]
    assert all(node["parent"] == tree[0]["node_id"] for node in tree[1:])
    assert [n["node_id"] for n in b["tree"]] and b["tree"][0]["ranks"] == [0, 1]
    load = {agg["node_id"]: agg["groups"] for agg in reply["aggregators"]}
    assert set(load) == {"agg-0", "agg-1"}
    assert sum(load.values()) == len(tree) + len(b["tree"])


def test_rendezvous_status_as_text(live: Live) -> None:
    assert live.cluster is not None
    done = status(live, "--rendezvous", live.cluster.rendezvous)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("rendezvous rendezvous: up ") and lines[0].endswith("2 groups, 2 aggregators")
    assert any(
        line.startswith(f"group {GROUP_A.hex()}: epoch ") and "active, world size 4" in line for line in lines
    )
    assert sum(line.startswith("  rank ") for line in lines) == 6
    assert any(line.startswith("aggregator agg-0 at 127.0.0.1:") for line in lines)


def test_an_aggregator_answers_with_its_place_and_its_flight_recorder(live: Live) -> None:
    assert live.cluster is not None
    leaf = next(
        s for s in live.cluster.services if s.identity.role is Role.AGGREGATOR and s.runner.recorder.entries
    )
    host, port = leaf.server.address if leaf.server is not None else ("", 0)
    done = status(live, "--address", f"{host}:{port}", "--peer-id", leaf.identity.node_id, "--json")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["role"] == "aggregator" and reply["node_id"] == leaf.identity.node_id
    (group,) = [g for g in reply["groups"] if g["group_id"] == GROUP_A.hex()]
    assert group["tree"][0]["node_id"] == leaf.identity.node_id and group["tree"][0]["ranks"]
    operations = [r for r in reply["records"] if r["chunk_index"] is None]
    assert operations and all(r["state"] == "complete" and r["kind"] == "all_reduce" for r in operations)
    assert all(r["missing"] == [] for r in reply["records"])


def test_an_endpoint_answers_at_its_status_address(live: Live) -> None:
    me = live.groups[GROUP_A][0]
    done = status(live, "--address", live.endpoint_status, "--peer-id", me.service.identity.node_id, "--json")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    (group,) = reply["groups"]
    assert group["members"] == [
        {"rank": me.rank, "node_id": me.service.identity.node_id, "state": "ready", "connected": True}
    ]
    assert group["epoch"] == me.epoch and len(group["tree"]) == 1
    assert [r["state"] for r in reply["records"] if r["chunk_index"] is None] == ["complete"]


def test_a_certificate_from_another_ca_gets_no_answer(live: Live, tmp_path: Path) -> None:
    assert live.cluster is not None
    create_dev_pki(tmp_path, [("operator", Role.ENDPOINT)])
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CCO_")}
    credentials = ["--pki-dir", str(tmp_path), "--node-id", "operator", "--timeout", "5"]
    done = subprocess.run(
        [sys.executable, "-m", "cco", "status", "--rendezvous", live.cluster.rendezvous, *credentials],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
        check=False,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("cco-node: "), done.stderr


def test_status_mistakes_are_one_line(live: Live) -> None:
    done = status(live, "--address", "127.0.0.1:1")
    assert done.returncode == 2 and "--address needs --peer-id" in done.stderr
    done = status(live, "--rendezvous", "nowhere")
    assert done.returncode == 2 and done.stderr.startswith("cco-node: --rendezvous: expected HOST:PORT")
