"""Large verified all-reduce over real processes: time, bandwidth and peak memory.

Starts a local cluster (``cco.localcluster``: separate processes on 127.0.0.1), runs
float32 all-reduce rounds of ``--mib`` MiB per rank, and reports the slowest rank's
round time, the algorithm bandwidth (size / time), every node's peak RSS and the
aggregators' peak slot memory, which the window bounds (window x chunk, per group),
whatever the tensor size.  Prints a table and writes JSON.

    python benchmarks/bench_allreduce.py --mib 64 --endpoints 2 --aggregators 1
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path

from cco.localcluster import ClusterSpec, LocalCluster

RESULTS = Path(__file__).resolve().parent / "results" / "bench_allreduce.json"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=float, default=64.0, help="MiB per rank per round")
    parser.add_argument("--endpoints", type=int, default=2)
    parser.add_argument("--aggregators", type=int, default=1)
    parser.add_argument("--fan-in", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--chunk-elements", type=int, default=65536)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--max-datagram-size", type=int, default=16000)
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument(
        "--dtype", default="float32", help="element type (float32 runs the scale pass; int32 does not)"
    )
    parser.add_argument(
        "--width", type=int, default=None, help="bits per float on the wire (default: the dtype's)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    itemsize = int(args.dtype.lstrip("abcdefghijklmnopqrstuvwxyz")) // 8
    elements = int(args.mib * (1 << 20)) // itemsize
    spec = ClusterSpec(
        aggregators=args.aggregators,
        endpoints=args.endpoints,
        max_fan_in=args.fan_in,
        rounds=args.rounds,
        elements=elements,
        chunk_elements=args.chunk_elements,
        window=args.window,
        max_datagram_size=args.max_datagram_size,
        extra_endpoint_args=("--dtype", args.dtype, *(("--width", str(args.width)) if args.width else ())),
    )
    workdir = Path(tempfile.mkdtemp(prefix="cco-bench-"))
    started = time.perf_counter()
    with LocalCluster(spec, workdir) as cluster:
        cluster.start()
        files = cluster.run_endpoints(args.timeout)
        logs = cluster.infrastructure_logs
    reports = [json.loads(path.read_text()) for path in files]
    aggregator_text = [log.read_text() for log in logs[1:]]
    slot_peaks = [int(m) for t in aggregator_text for m in re.findall(r"peak slot memory (\d+)", t)]
    aggregator_rss = [int(m) for t in aggregator_text for m in re.findall(r"peak RSS (\d+)", t)]
    round_times = [max(r["rounds"][i]["seconds"] for r in reports) for i in range(args.rounds)]
    identical = all(len({r["rounds"][i]["sha256"] for r in reports}) == 1 for i in range(args.rounds))
    nbytes = elements * itemsize
    summary = {
        "command": "python benchmarks/bench_allreduce.py "
        + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out", "timeout")
        ),
        "mib_per_rank": nbytes / (1 << 20),
        "dtype": args.dtype,
        "width": args.width,
        "endpoints": args.endpoints,
        "aggregators": args.aggregators,
        "chunk_elements": args.chunk_elements,
        "window": args.window,
        "max_datagram_size": args.max_datagram_size,
        "round_seconds": round_times,
        "best_round_seconds": min(round_times),
        "algorithm_bandwidth_mb_s": nbytes / min(round_times) / 1e6,
        "bit_identical": identical,
        "endpoint_peak_rss_mib": max(r["peak_rss_bytes"] for r in reports) / (1 << 20),
        "aggregator_peak_rss_mib": max(aggregator_rss, default=0) / (1 << 20),
        "aggregator_peak_slot_mib": max(slot_peaks, default=0) / (1 << 20),
        "wall_seconds": time.perf_counter() - started,
    }
    for key, value in summary.items():
        print(f"{key:28} {value:.3f}" if isinstance(value, float) else f"{key:28} {value}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
