"""``cco-interop live``: test cases between running implementations, judged from artifacts.

For each case the runner writes a PKI, starts the nodes the case needs (each from
the implementation chosen for its role, as a command given the environment
contract of ``interop/README.md``), on loopback, waits for the endpoints, stops
the servers, and judges from what the nodes left behind: exit codes, the results
files endpoints write (compared with results the runner recomputes from the
deterministic inputs of :mod:`cco.workload`), logs, TLS key logs and qlog files.
An implementation's own claim of success is never taken.  A node exiting with
127 makes the case *unsupported* for that combination.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cco.interop import expected
from cco.interop.probe import probe
from cco.interop.relay import Profile, Relay
from cco.interop.relay import start as start_relay
from cco.transport.certs import create_dev_pki
from cco.wire.errors import ErrorCode
from cco.wire.framing import encode_frame
from cco.wire.messages import Error
from cco.wire.registries import ALPN, Role

PASSED, FAILED, UNSUPPORTED = "passed", "failed", "unsupported"
UNSUPPORTED_EXIT = 127
OUR_ADAPTER = f"{shlex.quote(sys.executable)} -m cco.interop.live_adapter"
GROUP_ID = "c0ffee00" * 4
CREDENTIAL = "interop-secret"
HOST = "127.0.0.1"


class Unsupported(Exception):
    """A node said (exit code 127) that it does not support its role in this case."""


class CaseFailed(Exception):
    """The artifacts show that the case did not do what it must."""


# --- relays (loss, and evidence of which aggregator carried traffic) ------------------------


class Relays:
    """UDP relays running in a background event loop thread; their counters are live."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._relays: list[Relay] = []

    def start(
        self, listen: tuple[str, int], target: tuple[str, int], loss: float = 0.0, seed: int = 1
    ) -> Relay:
        profile = Profile(delay_ms=0.0, loss=loss, seed=seed)
        future = asyncio.run_coroutine_threadsafe(start_relay(listen, target, profile), self._loop)
        running = future.result(timeout=10)
        self._relays.append(running)
        return running

    def close(self) -> None:
        for running in self._relays:
            self._loop.call_soon_threadsafe(running.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


# --- nodes ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def udp_bound(port: int) -> bool:
    """Whether some socket listens on UDP ``port`` (from /proc, so any implementation counts)."""
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as f:
            for line in f.readlines()[1:]:
                local = line.split()[1]
                if int(local.rsplit(":", 1)[1], 16) == port:
                    return True
    return False


@dataclass
class Node:
    name: str
    role: str
    impl: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ended: float | None = None
    log: Path | None = None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode


@dataclass
class Run:
    """One case in one combination of implementations: its directory and nodes."""

    case: str
    directory: Path
    impls: dict[str, str]  # role -> implementation name
    commands: dict[str, str]  # implementation name -> command
    tool: str  # command of the runner's own bad aggregator (our adapter)
    nodes: list[Node] = field(default_factory=list)
    relays: Relays | None = None

    def __post_init__(self) -> None:
        for sub in ("pki", "logs", "qlog", "keys", "results"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)

    def pki(self, nodes: list[tuple[str, str]]) -> None:
        roles = {"rendezvous": Role.RENDEZVOUS, "aggregator": Role.AGGREGATOR, "endpoint": Role.ENDPOINT}
        create_dev_pki(self.directory / "pki", [(n, roles[r]) for n, r in nodes])

    def node_env(self, name: str, role: str, **extra: Any) -> dict[str, str]:
        pki = self.directory / "pki"
        qlog = self.directory / "qlog" / name
        qlog.mkdir(exist_ok=True)
        env = {
            "ROLE": role,
            "TESTCASE": self.case,
            "NODE_ID": name,
            "CERTS": str(pki),
            "CA": str(pki / "ca.pem"),
            "CERT": str(pki / f"{name}.pem"),
            "KEY": str(pki / f"{name}.key"),
            "SSLKEYLOGFILE": str(self.directory / "keys" / f"{name}.log"),
            "QLOGDIR": str(qlog),
            "GROUP_ID": GROUP_ID,
            "CREDENTIAL": CREDENTIAL,
            "RENDEZVOUS_ID": "rendezvous",
        }
        env.update({k.upper(): str(v) for k, v in extra.items()})
        return env

    def start(self, name: str, role: str, env: dict[str, str], bad: bool = False) -> Node:
        impl = "runner" if bad else self.impls[role]
        command = self.tool if bad else self.commands[impl]
        node = Node(name, role, impl, env, log=self.directory / "logs" / f"{name}.log")
        full = {**os.environ, **env}
        if bad:
            full["CCO_INTEROP_FAULT"] = "flip-result"
        assert node.log is not None
        with open(node.log, "ab") as log:  # a node started again (a restart) keeps its first log
            node.proc = subprocess.Popen(
                shlex.split(command), env=full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        node.started = time.monotonic()
        self.nodes.append(node)
        return node

    def start_server(
        self, name: str, role: str, env: dict[str, str], bad: bool = False, timeout: float = 15
    ) -> Node:
        node = self.start(name, role, env, bad)
        port = int(env["LISTEN"].rsplit(":", 1)[1])
        deadline = time.monotonic() + timeout
        while not udp_bound(port):
            assert node.proc is not None
            if node.proc.poll() is not None:
                self.check_supported(node)
                raise CaseFailed(f"{name} exited with {node.proc.returncode} before listening")
            if time.monotonic() > deadline:
                raise CaseFailed(f"{name} does not listen on UDP port {port} after {timeout} s")
            time.sleep(0.05)
        return node

    def check_supported(self, node: Node) -> None:
        if node.returncode == UNSUPPORTED_EXIT:
            raise Unsupported(f"{node.name} ({node.impl}) does not support role {node.role} in {self.case}")

    def wait(self, nodes: list[Node], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for node in nodes:
            assert node.proc is not None
            try:
                node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                node.ended = time.monotonic()
            except subprocess.TimeoutExpired:
                self.kill(node)
                raise CaseFailed(f"{node.name} did not finish within {timeout} s") from None
            self.check_supported(node)

    def kill(self, node: Node, sig: int = signal.SIGKILL) -> None:
        if node.proc is not None and node.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=5)
            node.ended = time.monotonic()

    def stop(self) -> None:
        """SIGTERM every node still running (servers), SIGKILL what does not stop."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, signal.SIGTERM)
        for node in self.nodes:
            if node.proc is not None:
                try:
                    node.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.kill(node)
        if self.relays is not None:
            self.relays.close()

    def results(self, node: Node) -> dict[str, Any]:
        path = Path(node.env["RESULTS"])
        if not path.is_file():
            raise CaseFailed(f"{node.name} wrote no results file")
        try:
            data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise CaseFailed(f"{node.name}: results file is not JSON: {error}") from error
        return data

    def log_text(self, node: Node) -> str:
        assert node.log is not None
        return node.log.read_text(encoding="utf-8", errors="replace")


# --- building blocks of the cases ------------------------------------------------------------


def _endpoint_names(count: int) -> list[str]:
    return [f"ep-{i}" for i in range(count)]


@dataclass(frozen=True)
class Workload:
    kind: str = "allreduce"  # or "collectives"
    dtype: str = "int32"
    elements: int = 1000
    rounds: int = 1


def start_group(
    run: Run,
    *,
    endpoints: int,
    aggregators: int = 1,
    workload: Workload = Workload(),
    rendezvous_env: dict[str, Any] | None = None,
    aggregator_env: dict[str, Any] | None = None,
    ranks: bool = True,
    bad_aggregator: bool = False,
    relay_loss: float | None = None,
    start_endpoints: bool = True,
    endpoint_env: dict[str, Any] | None = None,
) -> tuple[list[Node], list[Node], list[Relay]]:
    """A rendezvous, aggregators (each behind a relay when ``relay_loss`` is given) and
    endpoints; returns (aggregators, endpoints, relays)."""
    aggs = [f"agg-{i}" for i in range(aggregators)]
    eps = _endpoint_names(endpoints)
    run.pki(
        [("rendezvous", "rendezvous"), *[(a, "aggregator") for a in aggs], *[(e, "endpoint") for e in eps]]
    )
    rv_port = free_port()
    rv_env = run.node_env(
        "rendezvous",
        "rendezvous",
        listen=f"{HOST}:{rv_port}",
        world_size=endpoints,
        chunk_elements=expected.CHUNK_ELEMENTS,
        **(rendezvous_env or {}),
    )
    run.start_server("rendezvous", "rendezvous", rv_env)
    agg_nodes, relays = [], []
    for name in aggs:
        port = free_port()
        extra: dict[str, Any] = {
            "listen": f"{HOST}:{port}",
            "rendezvous": f"{HOST}:{rv_port}",
            **(aggregator_env or {}),
        }
        if relay_loss is not None:
            if run.relays is None:
                run.relays = Relays()
            relay_port = free_port()
            relays.append(run.relays.start((HOST, relay_port), (HOST, port), loss=relay_loss))
            extra["advertise"] = f"{HOST}:{relay_port}"
        agg_nodes.append(
            run.start_server(name, "aggregator", run.node_env(name, "aggregator", **extra), bad_aggregator)
        )
    ep_nodes = []
    if start_endpoints:
        ep_nodes = start_endpoints_of(run, eps, rv_port, endpoints, workload, ranks, extra=endpoint_env)
    return agg_nodes, ep_nodes, relays


def start_endpoints_of(
    run: Run,
    names: list[str],
    rv_port: int | None,
    world: int,
    workload: Workload,
    ranks: bool,
    credential: str = CREDENTIAL,
    extra: dict[str, Any] | None = None,
) -> list[Node]:
    if rv_port is None:
        rv_port = int(run.nodes[0].env["LISTEN"].rsplit(":", 1)[1])
    nodes = []
    for rank, name in enumerate(names):
        env = run.node_env(
            name,
            "endpoint",
            rendezvous=f"{HOST}:{rv_port}",
            world_size=world,
            workload=workload.kind,
            dtype=workload.dtype,
            elements=workload.elements,
            rounds=workload.rounds,
            results=run.directory / "results" / f"{name}.json",
            credential=credential,
            **(extra or {}),
        )
        if ranks:
            env["RANK"] = str(rank)
        nodes.append(run.start(name, "endpoint", env))
    return nodes


def judge_exact(run: Run, endpoints: list[Node], workload: Workload) -> None:
    """Every endpoint exited 0 and wrote exactly the results the runner recomputes."""
    world = len(endpoints)
    for node in endpoints:
        if node.returncode != 0:
            tail = run.log_text(node).strip().splitlines()[-3:]
            raise CaseFailed(f"{node.name} exited with {node.returncode}: {' | '.join(tail)}")
    seen_ranks = []
    for node in endpoints:
        data = run.results(node)
        rank = data.get("rank")
        if not isinstance(rank, int):
            raise CaseFailed(f"{node.name}: results file names no rank")
        seen_ranks.append(rank)
        want = expected.digests(
            workload.kind, workload.dtype, workload.elements, workload.rounds, rank, world
        )
        got = data.get("results", {})
        if got != want:
            wrong = sorted(k for k in set(want) | set(got) if got.get(k) != want.get(k))
            raise CaseFailed(f"{node.name} (rank {rank}): results differ from the exact ones: {wrong[:6]}")
    if sorted(seen_ranks) != list(range(world)):
        raise CaseFailed(f"ranks {sorted(seen_ranks)} are not 0..{world - 1}")


# --- the cases -----------------------------------------------------------------------------


def case_handshake(run: Run) -> None:
    work = Workload(elements=256)
    _, eps, _ = start_group(run, endpoints=2, workload=work)
    run.wait(eps, 60)
    run.pki([("probe", "endpoint")])
    servers = [n for n in run.nodes if n.role != "endpoint"]
    for server in servers:
        port = int(server.env["LISTEN"].rsplit(":", 1)[1])
        outcome = asyncio.run(_probe(run, port, b""))
        if outcome.alpn != ALPN:
            raise CaseFailed(f"{server.name} negotiated ALPN {outcome.alpn!r}, not {ALPN!r}")
        other = asyncio.run(_probe(run, port, b"", alpn="cco/1"))
        if other.alpn is not None or other.messages:
            raise CaseFailed(f"{server.name} accepted a client offering only cco/1 (ALPN {other.alpn!r})")
    run.stop()
    judge_exact(run, eps, work)
    for node in run.nodes:
        keylog = Path(node.env["SSLKEYLOGFILE"])
        if not keylog.is_file() or "CLIENT_TRAFFIC_SECRET_0" not in keylog.read_text(errors="replace"):
            raise CaseFailed(f"{node.name}: no TLS 1.3 traffic secret in SSLKEYLOGFILE")
        if node.role != "endpoint" and not list(Path(node.env["QLOGDIR"]).glob("*.qlog")):
            # servers only: see interop/README.md (endpoints exit before their client traces end)
            raise CaseFailed(f"{node.name}: no qlog file in QLOGDIR")


def case_join(run: Run) -> None:
    work = Workload(elements=100)
    _, eps, _ = start_group(run, endpoints=4, workload=work, ranks=False)
    run.wait(eps, 60)
    run.stop()
    judge_exact(run, eps, work)
    for node in eps:
        if run.results(node).get("world_size") != 4:
            raise CaseFailed(f"{node.name}: world_size is not 4")


def case_join_refused(run: Run) -> None:
    run.pki([("rendezvous", "rendezvous"), ("ep-0", "endpoint")])
    rv_port = free_port()
    run.start_server(
        "rendezvous",
        "rendezvous",
        run.node_env("rendezvous", "rendezvous", listen=f"{HOST}:{rv_port}", world_size=2),
    )
    (ep,) = start_endpoints_of(run, ["ep-0"], rv_port, 2, Workload(), True, credential="wrong-credential")
    try:
        run.wait([ep], 10)
    except CaseFailed as error:
        raise CaseFailed(f"a refused join must end promptly: {error}") from None
    run.stop()
    if ep.returncode == 0:
        raise CaseFailed("the endpoint with a wrong credential exited 0")
    results = Path(ep.env["RESULTS"])
    if results.is_file() and json.loads(results.read_text() or "{}").get("results"):
        raise CaseFailed("the refused endpoint wrote results")


def _simple(workload: Workload, endpoints: int, timeout: float = 120, **kwargs: Any) -> Callable[[Run], None]:
    def case(run: Run) -> None:
        _, eps, _ = start_group(run, endpoints=endpoints, workload=workload, **kwargs)
        run.wait(eps, timeout)
        run.stop()
        judge_exact(run, eps, workload)

    return case


def case_multilevel(run: Run) -> None:
    work = Workload(elements=5000, rounds=2)
    aggs, eps, relays = start_group(
        run, endpoints=4, aggregators=3, workload=work, aggregator_env={"max_fan_in": 2}, relay_loss=0.0
    )
    run.wait(eps, 120)
    run.stop()
    judge_exact(run, eps, work)
    carrying = [a.name for a, r in zip(aggs, relays, strict=True) if r.counters.forwarded_up > 0]
    if len(carrying) < 3:
        raise CaseFailed(f"only {carrying} carried traffic: the tree was not multi-level")


def case_loss(run: Run) -> None:
    work = Workload(elements=50_000, rounds=2)
    _, eps, relays = start_group(run, endpoints=2, workload=work, relay_loss=0.03)
    run.wait(eps, 120)
    run.stop()
    judge_exact(run, eps, work)
    dropped = relays[0].counters.dropped_up + relays[0].counters.dropped_down
    if dropped == 0:
        raise CaseFailed("the relay dropped nothing: loss was not exercised")


def case_failover(run: Run) -> None:
    work = Workload(elements=20_000, rounds=40)
    aggs, eps, relays = start_group(
        run,
        endpoints=2,
        aggregators=2,
        workload=work,
        relay_loss=0.0,
        rendezvous_env={"heartbeat_ms": 200, "operation_timeout_ms": 20000},
    )
    deadline = time.monotonic() + 60
    victim = None
    while victim is None:
        if time.monotonic() > deadline or any(e.proc is not None and e.proc.poll() is not None for e in eps):
            raise CaseFailed("no aggregator carried traffic while the endpoints ran")
        for agg, relay in zip(aggs, relays, strict=True):
            if relay.counters.bytes_up > 3 * len(eps) * 4 * work.elements:  # about 3 rounds in
                victim = (agg, relay)
        time.sleep(0.02)
    agg, relay = victim
    run.kill(agg)
    spare = next(r for a, r in zip(aggs, relays, strict=True) if a is not agg)
    before = spare.counters.forwarded_up
    run.wait(eps, 120)
    run.stop()
    if any(e.ended is not None and e.ended < (agg.ended or 0) for e in eps):
        raise CaseFailed("an endpoint had finished before the aggregator was killed")
    judge_exact(run, eps, work)
    if spare.counters.forwarded_up <= before:
        raise CaseFailed("the spare aggregator carried nothing after the failover")


def case_rendezvous_restart(run: Run) -> None:
    work = Workload(elements=20_000, rounds=300)
    store = run.directory / "rendezvous.store"
    rv_env = {"heartbeat_ms": 200, "operation_timeout_ms": 20000, "store": str(store)}
    aggs, eps, relays = start_group(
        run, endpoints=2, aggregators=1, workload=work, relay_loss=0.0, rendezvous_env=rv_env
    )
    deadline = time.monotonic() + 60
    while relays[0].counters.bytes_up < 3 * len(eps) * 4 * work.elements:  # about 3 rounds in
        if time.monotonic() > deadline or any(e.proc is not None and e.proc.poll() is not None for e in eps):
            raise CaseFailed("the endpoints carried no traffic before the rendezvous was to be killed")
        time.sleep(0.02)
    rendezvous = next(n for n in run.nodes if n.role == "rendezvous")
    run.kill(rendezvous)
    time.sleep(1.0)
    run.start_server("rendezvous", "rendezvous", rendezvous.env)
    restarted = time.monotonic()
    run.wait(eps, 180)
    run.stop()
    if any(e.ended is not None and e.ended < restarted for e in eps):
        raise CaseFailed("an endpoint had finished before the rendezvous was back")
    judge_exact(run, eps, work)
    if any(a.ended is not None and a.ended < restarted for a in aggs):
        raise CaseFailed("the aggregator exited while the rendezvous was away")


def case_quorum(run: Run) -> None:
    # A straggler frozen while it waits for a round's presence decision, or for its
    # Result, is left out of the next round; frozen between its presence and its data
    # it was already decided in, and that round waits for it (draft section "Stragglers
    # and Quorum").  Which of the two a freeze hits depends on timing the runner cannot
    # see, so the straggler is frozen six times, each long enough for the quorum wait;
    # plenty of rounds keep the run going through all six.  The first freeze waits
    # until about three rounds of every rank's data went up (counted in bytes: a
    # stack's handshakes, ACKs and probes are many datagrams and few bytes).
    work = Workload(dtype="int32", elements=20_000, rounds=300)
    _, eps, relays = start_group(
        run,
        endpoints=3,
        workload=work,
        relay_loss=0.0,
        endpoint_env={"quorum": 2, "quorum_wait_ms": 200},
        rendezvous_env={"heartbeat_ms": 1000, "operation_timeout_ms": 20000},
    )
    deadline = time.monotonic() + 60
    while relays[0].counters.bytes_up < 3 * 3 * 4 * work.elements:
        if time.monotonic() > deadline or any(e.proc is not None and e.proc.poll() is not None for e in eps):
            raise CaseFailed("the endpoints carried no traffic before one was to be frozen")
        time.sleep(0.02)
    straggler = eps[2]
    assert straggler.proc is not None
    for _ in range(6):
        if straggler.proc.poll() is not None:
            break
        os.killpg(straggler.proc.pid, signal.SIGSTOP)
        time.sleep(0.5)
        os.killpg(straggler.proc.pid, signal.SIGCONT)
        time.sleep(0.25)
    run.wait(eps, 180)
    run.stop()
    judge_quorum(run, eps, work, quorum=2)


def judge_quorum(run: Run, endpoints: list[Node], workload: Workload, quorum: int) -> None:
    """Every endpoint exited 0; every round names the same contributors on every rank,
    at least ``quorum`` of them, and its result is the exact sum over them; some round
    went on without a rank."""
    rounds: dict[str, set[tuple[int, ...]]] = {}
    for node in endpoints:
        if node.returncode != 0:
            tail = run.log_text(node).strip().splitlines()[-3:]
            raise CaseFailed(f"{node.name} exited with {node.returncode}: {' | '.join(tail)}")
        data = run.results(node)
        named = data.get("contributors", {})
        for index in range(workload.rounds):
            key = f"round-{index}"
            ranks = named.get(key)
            if not isinstance(ranks, list) or len(ranks) < quorum:
                raise CaseFailed(f"{node.name}: {key} names no quorum of contributors ({ranks})")
            want = expected.quorum_digest(workload.dtype, workload.elements, index, sorted(ranks))
            if data.get("results", {}).get(key) != want:
                raise CaseFailed(f"{node.name}: {key} is not the exact sum over ranks {ranks}")
            rounds.setdefault(key, set()).add(tuple(sorted(ranks)))
    disagree = sorted(k for k, v in rounds.items() if len(v) > 1)
    if disagree:
        raise CaseFailed(f"ranks name different contributors for {disagree[:5]}")
    if all(len(next(iter(v))) == len(endpoints) for v in rounds.values()):
        raise CaseFailed("every round counted every rank: the frozen rank was never left out")


def case_tamper(run: Run) -> None:
    work = Workload(elements=300)
    _, eps, _ = start_group(run, endpoints=2, workload=work, bad_aggregator=True)
    run.wait(eps, 60)
    run.stop()
    for node in eps:
        if node.returncode == 0:
            raise CaseFailed(f"{node.name} exited 0 with a tampered Result")
        if "VERIFICATION_FAILED" not in run.log_text(node):
            raise CaseFailed(f"{node.name}'s log does not report VERIFICATION_FAILED")
        results = Path(node.env["RESULTS"])
        if results.is_file() and json.loads(results.read_text() or "{}").get("results"):
            raise CaseFailed(f"{node.name} wrote results from a tampered Result")


MALFORMED = encode_frame(bytes.fromhex("8204a101"))  # [4, {1: <missing>}]: truncated CBOR


async def _probe(run: Run, port: int, payload: bytes, alpn: str = ALPN) -> Any:
    pki = run.directory / "pki"
    return await probe(
        HOST,
        port,
        str(pki / "ca.pem"),
        str(pki / "probe.pem"),
        str(pki / "probe.key"),
        "probe",
        payload,
        alpn=alpn,
    )


def case_bad_input(run: Run) -> None:
    work = Workload(elements=500)
    aggs, _, _ = start_group(run, endpoints=2, workload=work, start_endpoints=False)
    run.pki([("probe", "endpoint")])
    for server in [run.nodes[0], *aggs]:
        port = int(server.env["LISTEN"].rsplit(":", 1)[1])
        outcome = asyncio.run(_probe(run, port, MALFORMED))
        errors = [m for m in outcome.messages if isinstance(m, Error)]
        if any(e.code is not ErrorCode.MALFORMED_CBOR for e in errors):
            raise CaseFailed(f"{server.name} answered a malformed message with {errors!r}")
        if outcome.close_code != int(ErrorCode.MALFORMED_CBOR):
            raise CaseFailed(
                f"{server.name} closed with {outcome.close_code} ({outcome.close_reason!r}), "
                "not MALFORMED_CBOR (0x02)"
            )
    eps = start_endpoints_of(run, _endpoint_names(2), None, 2, work, True)
    run.wait(eps, 60)
    run.stop()
    judge_exact(run, eps, work)


@dataclass(frozen=True)
class Case:
    name: str
    roles: tuple[str, ...]
    run: Callable[[Run], None]
    criteria: str
    ci: bool = True


CASES: list[Case] = [
    Case(
        "handshake",
        ("rendezvous", "aggregator", "endpoint"),
        case_handshake,
        "endpoints exit 0 with exact results; the probe negotiates ALPN cco/2 with every server, and "
        "every server refuses a probe offering only cco/1 (so the clients that got through offered "
        "cco/2); every node's SSLKEYLOGFILE holds a TLS 1.3 traffic secret; every server's QLOGDIR "
        "holds qlogs",
    ),
    Case(
        "join",
        ("rendezvous", "aggregator", "endpoint"),
        case_join,
        "4 endpoints without a requested rank: ranks in the results files are exactly 0..3, world_size 4, "
        "results exact",
    ),
    Case(
        "join-refused",
        ("rendezvous", "endpoint"),
        case_join_refused,
        "an endpoint with a wrong credential exits non-zero within 10 s and writes no results",
    ),
    Case(
        "allreduce-small",
        ("rendezvous", "aggregator", "endpoint"),
        _simple(Workload(dtype="float32", elements=1000, rounds=2), 3),
        "3 endpoints, float32 SUM of 1000 elements, 2 rounds: results bit-exact against the block-scaled "
        "reference (width 32, blocks of 256) recomputed from the inputs",
    ),
    Case(
        "allreduce-large",
        ("rendezvous", "aggregator", "endpoint"),
        _simple(Workload(dtype="int32", elements=1 << 20), 2),
        "2 endpoints, int32 SUM of 2^20 elements (4 MiB): results exact",
    ),
    Case(
        "collectives",
        ("rendezvous", "aggregator", "endpoint"),
        _simple(Workload(kind="collectives", elements=64), 4),
        "4 endpoints run every collective (all-reduce SUM/AVG/MAX, reduce, broadcast, all-gather, "
        "reduce-scatter on int32 and float32, barrier): every result exact",
    ),
    Case(
        "multilevel",
        ("rendezvous", "aggregator", "endpoint"),
        case_multilevel,
        "3 aggregators with max fan-in 2 under 4 endpoints: results exact and all 3 aggregators carried "
        "traffic (counted by a relay in front of each)",
    ),
    Case(
        "loss",
        ("rendezvous", "aggregator", "endpoint"),
        case_loss,
        "a relay dropping 3% of datagrams each way in front of the aggregator: results exact and the relay "
        "dropped at least one datagram",
    ),
    Case(
        "failover",
        ("rendezvous", "aggregator", "endpoint"),
        case_failover,
        "2 aggregators; the one carrying traffic is killed mid-run (40 rounds): endpoints exit 0 after it, "
        "every round exact, and the spare carried traffic after the kill",
    ),
    Case(
        "rendezvous-restart",
        ("rendezvous", "aggregator", "endpoint"),
        case_rendezvous_restart,
        "the rendezvous (STORE set) is SIGKILLed while 2 endpoints run 300 rounds and started again "
        "1 s later on the same port and store: the aggregator keeps running, every endpoint exits 0 "
        "after the restart, every round exact",
    ),
    Case(
        "quorum",
        ("rendezvous", "aggregator", "endpoint"),
        case_quorum,
        "3 endpoints run 300 int32 all-reduce rounds under the quorum policy (QUORUM 2, QUORUM_WAIT_MS "
        "200); one is frozen (SIGSTOP) for 0.5 s six times: every endpoint exits 0, every round names "
        "the same contributors (at least 2) on every rank and its result is the exact sum over them, "
        "and some round went on without a rank",
    ),
    Case(
        "tamper",
        ("rendezvous", "endpoint"),
        case_tamper,
        "the runner's aggregator flips a bit in every Result: every endpoint exits non-zero, its log says "
        "VERIFICATION_FAILED, and it writes no results",
    ),
    Case(
        "bad-input",
        ("rendezvous", "aggregator", "endpoint"),
        case_bad_input,
        "a probe sends truncated CBOR after Hello to the rendezvous and the aggregator: each closes the "
        "connection with CCO error code MALFORMED_CBOR (an Error message, if sent first, carries the same "
        "code); then an all-reduce through them is exact",
    ),
]
CASE_NAMES = [c.name for c in CASES]


# --- running and the matrix ----------------------------------------------------------------


@dataclass
class Outcome:
    case: str
    impls: dict[str, str]
    outcome: str
    reason: str = ""
    seconds: float = 0.0

    def label(self) -> str:
        return ",".join(f"{role[:2]}={impl}" for role, impl in self.impls.items())


def run_case(
    case: Case, impls: dict[str, str], commands: dict[str, str], directory: Path, tool: str = OUR_ADAPTER
) -> Outcome:
    run = Run(case.name, directory, impls, commands, tool)
    start = time.monotonic()
    try:
        case.run(run)
        result = Outcome(case.name, impls, PASSED)
    except Unsupported as why:
        result = Outcome(case.name, impls, UNSUPPORTED, str(why))
    except CaseFailed as why:
        result = Outcome(case.name, impls, FAILED, str(why))
    except Exception as why:  # a broken node can break the runner's tools too: still a failure
        result = Outcome(case.name, impls, FAILED, f"{type(why).__name__}: {why}")
    finally:
        run.stop()
    result.seconds = time.monotonic() - start
    return result


def combinations(case: Case, names: list[str]) -> Iterator[dict[str, str]]:
    """Every assignment of implementations to the case's roles; with several
    implementations, only those that put at least two of them together (or one alone)."""
    for choice in itertools.product(names, repeat=len(case.roles)):
        yield dict(zip(case.roles, choice, strict=True))


def run_matrix(
    cases: list[Case],
    commands: dict[str, str],
    directory: Path,
    tool: str = OUR_ADAPTER,
    report: Callable[[Outcome], None] = lambda o: None,
) -> list[Outcome]:
    outcomes = []
    for case in cases:
        for index, impls in enumerate(combinations(case, list(commands))):
            outcome = run_case(case, impls, commands, directory / f"{case.name}-{index}", tool)
            report(outcome)
            outcomes.append(outcome)
    return outcomes


def matrix_text(outcomes: list[Outcome]) -> str:
    rows = [("case", "roles", "outcome", "seconds", "reason")]
    rows += [(o.case, o.label(), o.outcome, f"{o.seconds:.1f}", o.reason[:100]) for o in outcomes]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + ("  " + r[4] if r[4] else "")
        for r in rows
    )


def matrix_json(outcomes: list[Outcome]) -> dict[str, Any]:
    return {
        "cases": [
            {
                "case": o.case,
                "roles": o.impls,
                "outcome": o.outcome,
                "reason": o.reason,
                "seconds": round(o.seconds, 2),
            }
            for o in outcomes
        ],
        "summary": {k: sum(1 for o in outcomes if o.outcome == k) for k in (PASSED, FAILED, UNSUPPORTED)},
    }


def add_parser(commands: Any) -> None:
    live = commands.add_parser(
        "live",
        help="run the live test cases between implementations",
        description="Start the nodes of each case from the configured implementations (every role "
        "combination), judge from their artifacts, print a results matrix; exit 1 if any case failed.",
    )
    live.add_argument(
        "--impl",
        action="append",
        default=[],
        metavar="NAME=CMD",
        help=f"an implementation's live adapter command (default: cco={OUR_ADAPTER})",
    )
    live.add_argument(
        "--case",
        action="append",
        default=[],
        choices=CASE_NAMES,
        metavar="CASE",
        help=f"run only these cases (repeatable): {', '.join(CASE_NAMES)}",
    )
    live.add_argument("--ci", action="store_true", help="only the cases CI runs")
    live.add_argument(
        "--workdir", type=Path, help="keep every run's artifacts here (default: a temporary dir)"
    )
    live.add_argument("--json", type=Path, metavar="FILE", help="write the results matrix as JSON")
    live.set_defaults(run=lambda args: main(args))


def main(args: argparse.Namespace) -> int:
    commands: dict[str, str] = {}
    for item in args.impl or [f"cco={OUR_ADAPTER}"]:
        name, sep, command = item.partition("=")
        if not sep or not name or not command:
            print(f"cco-interop live: --impl wants NAME=CMD, got {item!r}", file=sys.stderr)
            return 2
        commands[name] = command
    cases = [c for c in CASES if (not args.case or c.name in args.case) and (not args.ci or c.ci)]

    def show(outcome: Outcome) -> None:
        print(
            f"{outcome.outcome.upper():11} {outcome.case} [{outcome.label()}] {outcome.seconds:.1f} s"
            + (f": {outcome.reason}" if outcome.reason else ""),
            flush=True,
        )

    with contextlib.ExitStack() as stack:
        import tempfile

        directory = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cco-live-")))
        outcomes = run_matrix(cases, commands, directory, report=show)
    print()
    print(matrix_text(outcomes))
    if args.json is not None:
        args.json.write_text(json.dumps(matrix_json(outcomes), indent=2) + "\n", encoding="utf-8")
    return 1 if any(o.outcome == FAILED for o in outcomes) else 0
