"""The live test cases, and how each is judged from what its nodes left behind.

Each case starts a group (a rendezvous, aggregators, endpoints running a
:class:`Workload`), may disturb it (loss, a killed aggregator, a restarted
rendezvous, a frozen endpoint, a tampering aggregator, malformed input), and judges
from exit codes, results files (against the results recomputed from the
deterministic inputs of :mod:`cco.interop.expected`), logs and key logs.
:data:`CASES` lists them with the criteria ``interop/README.md`` states.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cco.interop import expected
from cco.interop.live.nodes import CREDENTIAL, HOST, CaseFailed, Node, Relays, Run, free_port
from cco.interop.probe import probe
from cco.interop.relay import Relay
from cco.wire.errors import ErrorCode
from cco.wire.framing import encode_frame
from cco.wire.messages import Error
from cco.wire.registries import ALPN

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
