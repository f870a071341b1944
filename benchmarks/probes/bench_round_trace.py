"""Where the time of an 8-byte all-reduce goes, step by step, from stamps in every node.

Starts the loopback cluster of ``run.py``'s latency case (four endpoints, one
aggregator and the rendezvous as separate ``cco-node`` processes on 127.0.0.1, the
endpoints' ``allreduce`` workload) with every node run through this file.  Before
``cco-node``'s own main, a node wraps, in its process only, three functions: the
link queueing a chunk message, the link taking one in, and the UDP transport
handing datagrams to the kernel; each call is stamped on ``time.monotonic()``
(CLOCK_MONOTONIC, one clock for every process of the host) and the stamps are
written out as the node exits.  The wrappers add a few microseconds per message.

The stamps are then lined up, round by round (the op id of each rank's
Contribution), with the endpoints' own records of when each rank called and when
its call returned, and the median of every step over the rounds after the warm-up
is printed: how far apart the ranks call, how long a call takes to queue its
Contribution, how long the aggregator holds the last one, how long its Results
take to leave and arrive, and how long a rank spends between rounds.  JSON goes to
``results/round_trace.json``.

    python benchmarks/probes/bench_round_trace.py --rounds 2000
"""

from __future__ import annotations

import argparse
import atexit
import bisect
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRACE_DIR = "CCOBENCH_ROUND_TRACE_DIR"
"""Set in a process started through this file: it is a node, and writes its stamps there."""

RESULTS = Path(__file__).resolve().parent / "results" / "round_trace.json"

Stamp = tuple[float, str, str, int]
"""(time, kind, message type or "", op id or destination port).  Kinds: "queued" and
"taken" for chunk messages (with their op id), "sent" for datagrams (with the port)."""


# --- in a node -------------------------------------------------------------------------------


def _install_stamps(out_dir: Path) -> None:
    """Wrap the link's and the UDP transport's functions in this process (see module doc)."""
    from cco.transport import link, udp

    stamps: list[Stamp] = []
    send_message = link.LinkProtocol.send_message
    on_data_message = link.LinkProtocol._on_data_message
    send_datagrams = udp.BatchedUdpTransport.send_datagrams

    def queued(self: link.LinkProtocol, message: Any) -> None:
        op_id = getattr(message, "op_id", None)
        if op_id is not None:
            stamps.append((time.monotonic(), "queued", type(message).__name__, op_id))
        send_message(self, message)

    def taken(self: link.LinkProtocol, stream: Any, message: Any, size: int) -> None:
        op_id = getattr(message, "op_id", None)
        if op_id is not None:
            stamps.append((time.monotonic(), "taken", type(message).__name__, op_id))
        on_data_message(self, stream, message, size)

    def sent(self: udp.BatchedUdpTransport, datagrams: list[bytes], addr: Any) -> None:
        stamps.append((time.monotonic(), "sent", "", int(addr[1])))
        send_datagrams(self, datagrams, addr)

    link.LinkProtocol.send_message = queued  # type: ignore[method-assign]
    link.LinkProtocol._on_data_message = taken  # type: ignore[method-assign]
    udp.BatchedUdpTransport.send_datagrams = sent  # type: ignore[method-assign]

    def write() -> None:
        argv = sys.argv[1:]
        node_id = argv[argv.index("--node-id") + 1] if "--node-id" in argv else str(os.getpid())
        record = {"argv": argv, "stamps": stamps}
        (out_dir / f"{node_id}.json").write_text(json.dumps(record))

    atexit.register(write)


# --- lining the stamps up --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Node:
    """One node's stamps, by kind."""

    queued: dict[tuple[str, int], list[float]]
    taken: dict[tuple[str, int], list[float]]
    sent: list[tuple[float, int]]

    @classmethod
    def of(cls, stamps: list[Stamp]) -> Node:
        queued: dict[tuple[str, int], list[float]] = {}
        taken: dict[tuple[str, int], list[float]] = {}
        sent: list[tuple[float, int]] = []
        for at, kind, name, value in stamps:
            if kind == "sent":
                sent.append((at, value))
            else:
                (queued if kind == "queued" else taken).setdefault((name, value), []).append(at)
        return cls(queued, taken, sorted(sent))

    def contributions(self) -> list[int]:
        """The op ids of this endpoint's Contributions, in the order it queued them."""
        ops = [(times[0], op) for (name, op), times in self.queued.items() if name == "Contribution"]
        return [op for _, op in sorted(ops)]


STEPS = (
    ("spread", "the first rank's call", "the last rank's call"),
    ("to_queue", "a rank's call", "its Contribution queued"),
    ("to_aggregator", "the last rank's call", "the last Contribution taken by the aggregator"),
    ("combine", "the last Contribution taken", "the last Result queued"),
    ("to_leave", "the last Result queued", "the first Result sent"),
    ("leaving", "the first Result sent", "the last Result sent"),
    ("to_arrive", "the first Result sent", "the last Result taken by a rank"),
    ("to_return", "a rank's Result taken", "its call returning"),
    ("between", "a rank's return", "its next call"),
    ("between_least", "the return of the rank quickest to call again", "its next call"),
    ("period", "a round's first call", "the next round's first call"),
    ("from_last_call", "the last rank's call", "the last rank's return"),
    ("slowest_rank", "the slowest rank's call", "its return (the p50 figure)"),
)
"""Each step's key, and where it starts and ends (medians over ranks where a step is per rank)."""


def line_up(
    reports: list[dict[str, Any]], endpoints: list[Node], aggregator: Node, skip_ports: set[int], warmup: int
) -> dict[str, list[float]]:
    """Every step's duration in each round after ``warmup`` (and before the last, which
    has no next call), from the endpoints' reports and stamps (both by rank) and the
    aggregator's stamps; datagrams to ``skip_ports`` (the rendezvous) are not Results."""
    ops = [node.contributions() for node in endpoints]
    rounds = min(len(report["rounds"]) for report in reports)
    steps: dict[str, list[float]] = {key: [] for key, _, _ in STEPS}
    sends = [(at, port) for at, port in aggregator.sent if port not in skip_ports]
    send_times = [at for at, _ in sends]
    for i in range(warmup, rounds - 1):
        if any(i >= len(node_ops) for node_ops in ops) or len({node_ops[i] for node_ops in ops}) != 1:
            continue  # the ranks' i-th Contributions are not of one operation
        op = ops[0][i]
        calls = [report["rounds"][i]["started"] for report in reports]
        returns = [c + report["rounds"][i]["seconds"] for c, report in zip(calls, reports, strict=True)]
        following = [report["rounds"][i + 1]["started"] for report in reports]
        arrived = aggregator.taken.get(("Contribution", op), [])
        results = aggregator.queued.get(("Result", op), [])
        received = [node.taken.get(("Result", op)) for node in endpoints]
        if len(arrived) != len(reports) or not results or any(r is None for r in received):
            continue  # not one Contribution per rank through this aggregator, or a Result missing
        taken = [r[0] for r in received if r is not None]
        leaving: dict[int, float] = {}  # the first datagram to each rank after the Results were queued
        for at, port in sends[bisect.bisect_left(send_times, max(results)) :]:
            leaving.setdefault(port, at)
            if len(leaving) == len(reports):
                break
        if len(leaving) < len(reports):
            continue
        queued = [node.queued[("Contribution", op)][0] for node in endpoints]
        gaps = [n - r for n, r in zip(following, returns, strict=True)]
        durations = {
            "spread": max(calls) - min(calls),
            "to_queue": statistics.median(q - c for q, c in zip(queued, calls, strict=True)),
            "to_aggregator": max(arrived) - max(calls),
            "combine": max(results) - max(arrived),
            "to_leave": min(leaving.values()) - max(results),
            "leaving": max(leaving.values()) - min(leaving.values()),
            "to_arrive": max(taken) - min(leaving.values()),
            "to_return": statistics.median(r - t for r, t in zip(returns, taken, strict=True)),
            "between": statistics.median(gaps),
            "between_least": min(gaps),
            "period": min(following) - min(calls),
            "from_last_call": max(returns) - max(calls),
            "slowest_rank": max(r - c for r, c in zip(returns, calls, strict=True)),
        }
        for key, value in durations.items():
            steps[key].append(value)
    return steps


# --- the run ---------------------------------------------------------------------------------


def measure(rounds: int, endpoints: int, warmup: int, workdir: Path) -> dict[str, Any]:
    """Run the cluster with every node stamped; every step's durations, round by round."""
    import netns  # here, not at the top: a node started through this file does not need it

    traces = workdir / "stamps"
    traces.mkdir(parents=True, exist_ok=True)
    os.environ[TRACE_DIR] = str(traces)  # the nodes inherit it
    settings = netns.CcoSettings(
        max_datagram_size=16000,
        operation_timeout_ms=600_000,
        heartbeat_ms=20_000,
        launcher=Path(__file__).resolve(),
    )
    try:
        with netns.CcoCluster(None, workdir, endpoints, settings) as cluster:
            cluster.start()
            run = cluster.run(2, rounds, timeout=600)
            rendezvous_port = int(cluster.rendezvous.rsplit(":", 1)[1])
    finally:
        del os.environ[TRACE_DIR]
    records = {path.stem: json.loads(path.read_text()) for path in traces.glob("*.json")}
    by_rank = sorted(run.reports, key=lambda report: report["rank"])
    nodes = {
        name: Node.of([(s[0], s[1], s[2], s[3]) for s in record["stamps"]])
        for name, record in records.items()
    }
    endpoint_ids = sorted((n for n in nodes if "-ep-" in n), key=lambda n: int(n.rsplit("-", 1)[1]))
    aggregator = next(nodes[n] for n, r in records.items() if "aggregator" in r["argv"])
    steps = line_up(by_rank, [nodes[n] for n in endpoint_ids], aggregator, {rendezvous_port}, warmup)
    return {"rounds": rounds, "endpoints": endpoints, "warmup": warmup, "steps": steps}


def summary(steps: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """p10, p50 and p90 of every step that has rounds, in seconds (as ``run.py`` takes
    percentiles)."""
    from run import percentile  # here, not at the top: a node started through this file does not need it

    return {
        key: {f"p{pct}": percentile(values, pct) for pct in (10, 50, 90)}
        for key, values in steps.items()
        if values
    }


def main() -> None:
    from run import LATENCY_WARMUP

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument(
        "--warmup", type=int, default=LATENCY_WARMUP, help="rounds left out at the start, as run.py does"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.rounds <= args.warmup + 1:
        parser.error("--rounds must exceed --warmup by at least 2")
    with tempfile.TemporaryDirectory(prefix="cco-trace-") as tmp:
        result = measure(args.rounds, args.endpoints, args.warmup, Path(tmp))
    figures = summary(result["steps"])
    counted = len(result["steps"]["period"])
    print(
        f"8-byte all-reduce, {args.endpoints} ranks on loopback: {counted} of {args.rounds} rounds lined up"
    )
    print(f"{'from':44} {'to':48} {'p10':>8} {'p50':>8} {'p90':>8}  (ms)")
    for key, start, end in STEPS:
        if key in figures:
            f = figures[key]
            print(f"{start:44} {end:48} {f['p10'] * 1e3:8.3f} {f['p50'] * 1e3:8.3f} {f['p90'] * 1e3:8.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**result, "summary": figures}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    if os.environ.get(TRACE_DIR):  # a node started by measure()
        from cco import cli

        cli.single_threaded_numerics()  # as cli.main() would, before numpy is first imported
        _install_stamps(Path(os.environ[TRACE_DIR]))
        sys.exit(cli.main())
    main()
