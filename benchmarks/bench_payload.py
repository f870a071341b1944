"""Throughput of the payload layer on one core: tagging, combining and verifying.

For each chunk size from 4 Ki to 1 Mi elements, with int32 data:

* tag:     ``seal`` of one contribution (range check, packing, tag);
* combine: ``combine`` of two contributions into a partial aggregate;
* verify:  ``open_verified`` of an aggregate of ``--world`` contributors (bitmap,
           range and tag checks, one pad per contributor).

MB/s counts int32 payload bytes processed: n * 4 for tag and verify, and the bytes
of both inputs (2 * n * 4) for combine, which is what an aggregator receives.
Each figure is the best of ``--repeat`` timed runs of at least ``--seconds``.
BLAS is pinned to one thread so the figures are per core.

    .venv/bin/python benchmarks/bench_payload.py
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cco.wire.messages import PartialAggregate, Result
from cco.wire.payload import ChunkHeader, combine, derive_group_keys, open_verified, seal
from cco.wire.registries import Collective, DType, ReduceOp

SIZES = [1 << k for k in range(12, 21, 2)]  # 4 Ki, 16 Ki, 64 Ki, 256 Ki, 1 Mi
RESULTS = Path(__file__).resolve().parent / "results" / "bench_payload.json"


def best_seconds(action: Callable[[], object], seconds: float, repeat: int) -> float:
    """The best per-call time over ``repeat`` runs of at least ``seconds`` each."""
    action()
    best = float("inf")
    for _ in range(repeat):
        calls = 0
        start = time.perf_counter()
        while True:
            action()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        best = min(best, elapsed / calls)
    return best


def measure(n: int, world: int, seconds: float, repeat: int) -> dict[str, float]:
    keys = derive_group_keys(bytes(range(32)), bytes(16))
    header = ChunkHeader(
        group_id=bytes(16),
        epoch=1,
        op_id=1,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.INT32,
        total_elements=n,
        chunk_elements=n,
        chunk_index=0,
    )
    rng = np.random.default_rng(n)
    bound = (1 << 31) // world
    inputs = [rng.integers(-bound, bound, n).astype(np.int64) for _ in range(world)]
    parts = [seal(keys, header, rank, x) for rank, x in enumerate(inputs)]
    aggregate = combine(parts, Result)
    assert aggregate.width == 4
    expected = frozenset(range(world))
    t_tag = best_seconds(lambda: seal(keys, header, 0, inputs[0]), seconds, repeat)
    t_combine = best_seconds(lambda: combine(parts[:2], PartialAggregate), seconds, repeat)
    t_verify = best_seconds(lambda: open_verified(keys, aggregate, expected), seconds, repeat)
    mb = n * 4 / 1e6
    return {
        "elements": n,
        "tag_mb_s": mb / t_tag,
        "combine_mb_s": 2 * mb / t_combine,
        "verify_mb_s": mb / t_verify,
        "tag_us": t_tag * 1e6,
        "combine_us": t_combine * 1e6,
        "verify_us": t_verify * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--world", type=int, default=8, help="contributors in the verified aggregate")
    parser.add_argument("--seconds", type=float, default=0.3, help="minimum duration of one timed run")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per figure (best is kept)")
    args = parser.parse_args()

    rows = [measure(n, args.world, args.seconds, args.repeat) for n in SIZES]
    print(f"payload throughput, one core, int32 data, {args.world} contributors verified")
    print(f"{'elements':>9} {'tag MB/s':>10} {'combine MB/s':>13} {'verify MB/s':>12}")
    for row in rows:
        tag, comb, verify = row["tag_mb_s"], row["combine_mb_s"], row["verify_mb_s"]
        print(f"{row['elements']:>9} {tag:>10.0f} {comb:>13.0f} {verify:>12.0f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "bench_payload",
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        },
        "numpy": np.__version__,
        "world": args.world,
        "rows": rows,
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
