"""``cco-node demo``: a local cluster doing verified all-reduces, with a summary.

It starts a rendezvous, aggregators forming a two-level tree and endpoints, all as
separate ``cco-node`` processes on 127.0.0.1 with a fresh development PKI, runs
float32 all-reduce rounds, shows rank 0's progress, and checks that every rank got
bit-identical results in every round.  Exit status 0 means every round completed,
verified, on every rank.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cco.cli import OneLineParser
from cco.localcluster import ClusterSpec, LocalCluster
from cco.transport.config import MAX_DATAGRAM_SIZE, MIN_DATAGRAM_SIZE
from cco.wire.errors import CcoError
from cco.wire.messages import MAX_CHUNK_ELEMENTS


def _count(least: int, most: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from ``least`` (to ``most``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        if most is not None and value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most}, got {value}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def demo_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="cco-node demo",
        description="Run a local CCO cluster (separate processes on 127.0.0.1, fresh certificates) "
        "doing verified float32 all-reduces, and print a summary.",
    )
    parser.add_argument("--endpoints", type=_count(1), default=8, help="endpoint processes (default 8)")
    parser.add_argument("--aggregators", type=_count(1), default=3, help="aggregator processes (default 3)")
    parser.add_argument(
        "--fan-in",
        type=_count(2, 1024),
        default=4,
        help="children per aggregator; 8 endpoints with fan-in 4 "
        "and 3 aggregators form a two-level tree (default 4)",
    )
    parser.add_argument("--rounds", type=_count(1), default=5, help="all-reduce rounds (default 5)")
    parser.add_argument(
        "--elements", type=_count(1), default=1 << 18, help="float32 elements per round (default 262144)"
    )
    parser.add_argument(
        "--chunk-elements",
        type=_count(1, MAX_CHUNK_ELEMENTS),
        default=65536,
        help="elements per chunk (default 65536)",
    )
    parser.add_argument(
        "--max-datagram-size",
        type=_count(MIN_DATAGRAM_SIZE, MAX_DATAGRAM_SIZE),
        default=16000,
        help="QUIC datagram size (default 16000)",
    )
    parser.add_argument(
        "--timeout", type=_seconds, default=300.0, help="seconds before giving up (default 300)"
    )
    parser.add_argument("--workdir", type=Path, help="keep certificates, logs and results here")
    return parser


def demo_main(argv: list[str]) -> int:
    args = demo_parser().parse_args(argv)
    spec = ClusterSpec(
        aggregators=args.aggregators,
        endpoints=args.endpoints,
        max_fan_in=args.fan_in,
        rounds=args.rounds,
        elements=args.elements,
        chunk_elements=args.chunk_elements,
        max_datagram_size=args.max_datagram_size,
    )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cco-demo-"))
    print(
        f"CCO demo: 1 rendezvous, {spec.aggregators} aggregators (fan-in {spec.max_fan_in}), "
        f"{spec.endpoints} endpoints on 127.0.0.1; {spec.rounds} rounds of {spec.elements} float32; "
        f"work dir {workdir}",
        flush=True,
    )
    started = time.perf_counter()
    try:
        with LocalCluster(spec, workdir) as cluster:
            cluster.start()
            print(f"rendezvous and {spec.aggregators} aggregators up; starting endpoints", flush=True)
            result_files = cluster.run_endpoints(args.timeout, progress=sys.stdout)
        ok = _summarise(
            spec, [json.loads(p.read_text()) for p in result_files], time.perf_counter() - started
        )
    except CcoError as exc:
        print(f"cco-node demo: FAILED: {exc} (the nodes' logs are in {workdir})", file=sys.stderr)
        return 1
    if ok and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


def _summarise(spec: ClusterSpec, reports: list[dict[str, object]], wall: float) -> bool:
    rounds: list[list[dict[str, object]]] = [report["rounds"] for report in reports]  # type: ignore[misc]
    identical = all(
        len({str(ranks[i]["sha256"]) for ranks in rounds}) == 1 for i in range(spec.rounds)
    ) and all(len(r) == spec.rounds for r in rounds)
    slowest = [max(float(ranks[i]["seconds"]) for ranks in rounds) for i in range(spec.rounds)]  # type: ignore[arg-type]
    nbytes = spec.elements * 4
    print()
    print("summary")
    print(f"  rounds completed        {spec.rounds} of {spec.rounds} on {len(reports)} ranks, all verified")
    print(
        f"  results bit-identical   {'yes' if identical else 'NO'} (sha256 of every rank's result, per round)"
    )
    print(f"  bytes per rank, round   {nbytes / 1e6:.2f} MB ({spec.elements} float32)")
    print(f"  bytes reduced in total  {nbytes * len(reports) * spec.rounds / 1e6:.1f} MB")
    mean_ms, best_ms = 1e3 * sum(slowest) / len(slowest), 1e3 * min(slowest)
    print(f"  round time              mean {mean_ms:.0f} ms, best {best_ms:.0f} ms")
    print(f"  algorithm bandwidth     {nbytes / min(slowest) / 1e6:.1f} MB/s (size / best round time)")
    print(f"  wall time               {wall:.1f} s including start-up")
    return identical
