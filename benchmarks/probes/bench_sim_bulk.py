"""The protocol's own CPU in a bulk all-reduce, without QUIC, sockets or an event loop.

On the namespace star every byte of a large all-reduce costs the nodes CPU in two
places: the protocol's own work (quantize, tag, encode; decode, combine, build the
Result; decode, verify, dequantize) and the transport under it (QUIC packets, system
calls, the event loop).  ``profile_star.py`` samples both together; this separates
the first.  Four endpoint machines and an aggregator run in the in-memory cluster of
:mod:`cco.nodes.sim` (every message encoded and decoded, as on the wire) and do
verified float32 SUM all-reduces of ``--elements`` per rank at each chunk size of
``--chunks``; the CPU seconds per round of all five roles together, hot, are fitted
to ``fixed per round + per chunk x chunks``, so that what a chunk costs whatever its
size shows apart from what the bytes cost.

Compare the figure with the whole nodes' CPU per round on the star (``profile_star.py
--no-profile``: the aggregator's plus the four endpoints'): the difference is the
transport's.  Every rank's result is checked against the exact sum of the others'.

    python benchmarks/probes/bench_sim_bulk.py
    python benchmarks/probes/bench_sim_bulk.py --elements 16777216 --chunks 32768 131072
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import numpy as np
from bench_sim_round import one_round  # this directory: a script's own is on sys.path

from cco.nodes.rendezvous import RendezvousConfig
from cco.nodes.sim import Deployment, GroupSpec, build_cluster

GROUP = bytes.fromhex("c1" * 16)
RANKS = 4
RESULTS = Path(__file__).resolve().parent / "results" / "sim_bulk.json"


def deployment(chunk_elements: int) -> Deployment:
    """A joined group of four ranks under one aggregator, messages delivered in order."""
    params = dataclasses.replace(RendezvousConfig().params, chunk_elements=chunk_elements)
    return build_cluster(
        [GroupSpec(GROUP, RANKS)], aggregators=1, params=params, max_fan_in=64, reorder=False
    )


def cpu_per_round(chunk_elements: int, elements: int, rounds: int) -> float:
    """Median process CPU seconds of one hot round, every rank's result checked."""
    rng = np.random.default_rng(chunk_elements)
    # Integers in float32: the sum is exact, so every rank must hold it bit for bit.
    inputs = [rng.integers(-1000, 1000, elements).astype(np.float32) for _ in range(RANKS)]
    expected = np.sum(inputs, axis=0, dtype=np.float64).astype(np.float32)
    outputs = [np.empty(elements, np.float32) for _ in range(RANKS)]
    cluster = deployment(chunk_elements)
    one_round(cluster, GROUP, inputs, outputs)  # warm: compiled loops, caches, pages
    samples = []
    for _ in range(rounds):
        start = time.process_time()
        one_round(cluster, GROUP, inputs, outputs)
        samples.append(time.process_time() - start)
        for out in outputs:
            np.testing.assert_array_equal(out, expected)
    return statistics.median(samples)


def fit(points: dict[int, float], elements: int) -> tuple[float, float]:
    """Least squares of seconds = fixed + per_chunk x (chunks of all ranks)."""
    xs = np.array([RANKS * -(-elements // c) for c in points], dtype=np.float64)
    ys = np.array(list(points.values()))
    per_chunk, fixed = np.polyfit(xs, ys, 1)
    return float(fixed), float(per_chunk)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--elements", type=int, default=4 * 1024 * 1024, help="float32 elements per rank")
    parser.add_argument("--chunks", type=int, nargs="+", default=[16384, 32768, 65536, 131072])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per chunk size (median)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if len(args.chunks) < 2:
        parser.error("--chunks needs at least two sizes to separate per-chunk from per-byte costs")
    moved = args.elements * 4 * RANKS * 2  # the aggregator's N x S in plus N x S out
    points = {}
    mib = args.elements * 4 / 2**20
    print(f"{RANKS} endpoints and an aggregator in one process, {mib:.0f} MiB float32 per rank")
    for chunk_elements in args.chunks:
        seconds = cpu_per_round(chunk_elements, args.elements, args.rounds)
        points[chunk_elements] = seconds
        print(
            f"chunks of {chunk_elements:>7}: {seconds:6.3f} CPU s per round (all five roles), "
            f"{moved / seconds / 1e6:5.0f} MB of the aggregator's in + out per CPU s"
        )
    fixed, per_chunk = fit(points, args.elements)
    print(
        f"fit: {fixed:.3f} CPU s per round whatever the chunking "
        f"({moved / max(fixed, 1e-9) / 1e6:.0f} MB per CPU s), plus {per_chunk * 1e6:.0f} us per chunk "
        "of one rank (its way up, its share of the Result, its way down)"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": "bench_sim_bulk",
        "ranks": RANKS,
        "elements": args.elements,
        "cpu_seconds_per_round": {str(c): s for c, s in points.items()},
        "fixed_cpu_seconds_per_round": fixed,
        "cpu_seconds_per_rank_chunk": per_chunk,
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
