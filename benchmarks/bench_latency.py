"""Small-operation latency on loopback, by element type, with the CPU each round costs.

The 8-byte case of ``run.py --quick`` (four endpoints, or ``--endpoints``, and one
aggregator as separate ``cco-node`` processes on 127.0.0.1, the endpoints'
``allreduce`` workload, times the slowest rank's per round), run for several dtypes
and group sizes in turn so their figures come from the same minutes: a float SUM of
at most 16 elements is EXACT (one pass), int32 its integer counterpart.  Prints p50
and p99 over the rounds after the first ``run.LATENCY_WARMUP`` (as ``run.py`` does),
the p50 of the same rounds from the last rank's call to the last result, and the
aggregator's and each endpoint's CPU per round (a run of 10 rounds subtracted
from the measured one, which removes start-up and joining), and writes JSON.

    python benchmarks/bench_latency.py --dtypes float32 int32 --rounds 300 --repeats 2
    python benchmarks/bench_latency.py --dtypes float32 --endpoints 1 2 4   # how it scales
    python benchmarks/bench_latency.py --dtypes float32 --busy-poll-us 0 1000  # polling's share

With busy polling (the aggregator's and the endpoints' default), a node's CPU per
round includes the time it polled for the next datagram.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))  # the shared support modules
import netns
from run import LATENCY_WARMUP, percentile

RESULTS = Path(__file__).resolve().parent / "results"
BASELINE_ROUNDS = 10


def measure(
    dtype: str, elements: int, rounds: int, endpoints: int, busy_poll_us: int | None, workdir: Path
) -> dict[str, Any]:
    """One cluster: a short run, then ``rounds`` rounds; per-round figures of the second."""
    settings = netns.CcoSettings(
        max_datagram_size=16000,
        operation_timeout_ms=600_000,
        heartbeat_ms=20_000,
        dtype=dtype,
        busy_poll_us=busy_poll_us,
    )
    with netns.CcoCluster(None, workdir, endpoints, settings) as cluster:
        cluster.start()

        def timed(count: int) -> tuple[netns.EndpointRun, float]:
            before = cluster.aggregator_usage()["cpu_seconds"]
            run = cluster.run(elements, count, timeout=600)
            return run, cluster.aggregator_usage()["cpu_seconds"] - before

        short, agg_short = timed(BASELINE_ROUNDS)
        run, agg_long = timed(rounds)
    extra = rounds - BASELINE_ROUNDS
    times = run.round_seconds()[LATENCY_WARMUP:]  # fresh endpoint processes settle first
    from_last_call = run.from_last_call()[LATENCY_WARMUP:]
    return {
        "dtype": dtype,
        "endpoints": endpoints,
        "busy_poll_us": busy_poll_us,
        "elements": elements,
        "rounds": rounds,
        "p50_seconds": percentile(times, 50),
        "p99_seconds": percentile(times, 99),
        "from_last_call_p50_seconds": percentile(from_last_call, 50),
        "aggregator_cpu_per_round": (agg_long - agg_short) / extra,
        "endpoint_cpu_per_round": (sum(run.cpu_seconds) - sum(short.cpu_seconds)) / endpoints / extra,
    }


def _label(dtype: str, endpoints: int, busy_poll_us: int | None) -> str:
    polling = "" if busy_poll_us is None else f"  busy-poll {busy_poll_us:>4} us"
    return f"{dtype:8} N={endpoints}{polling}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtypes", nargs="+", default=["float32", "int32"], help="workload element types")
    parser.add_argument("--elements", type=int, default=2, help="elements per rank (2 float32: 8 bytes)")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument(
        "--endpoints", type=int, nargs="+", default=[4], help="group sizes (endpoint processes), alternated"
    )
    parser.add_argument(
        "--busy-poll-us",
        type=int,
        nargs="+",
        default=[None],
        help="every node's --busy-poll-us, alternated (default: the nodes' own)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="passes over the dtypes, alternated")
    parser.add_argument("--out", type=Path, default=RESULTS / "latency.json")
    args = parser.parse_args(argv)
    cases = [(d, n, b) for d in args.dtypes for n in args.endpoints for b in args.busy_poll_us]
    results = []
    with tempfile.TemporaryDirectory(prefix="cco-latency-") as tmp:
        for repeat in range(args.repeats):
            for dtype, endpoints, polling in cases:
                workdir = Path(tmp) / f"{dtype}-{endpoints}-{polling}-{repeat}"
                result = measure(dtype, args.elements, args.rounds, endpoints, polling, workdir)
                results.append(result)
                print(
                    f"{_label(dtype, endpoints, polling)}  p50 {result['p50_seconds'] * 1e3:6.2f} ms"
                    f"  p99 {result['p99_seconds'] * 1e3:6.2f} ms"
                    f"  from the last call p50 {result['from_last_call_p50_seconds'] * 1e3:5.2f} ms"
                    f"  CPU per round:"
                    f" aggregator {result['aggregator_cpu_per_round'] * 1e3:5.2f} ms,"
                    f" endpoint {result['endpoint_cpu_per_round'] * 1e3:5.2f} ms",
                    flush=True,
                )
    for case in cases:
        p50s = [
            r["p50_seconds"] * 1e3 for r in results if (r["dtype"], r["endpoints"], r["busy_poll_us"]) == case
        ]
        print(f"{_label(*case)}  median p50 over {len(p50s)} runs: {statistics.median(p50s):.2f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
