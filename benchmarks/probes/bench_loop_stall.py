"""How long starting a large all-reduce holds the event loop (issues 8 and 9).

A float SUM proposes a scale for every block of the whole tensor before anything is
sent, and other forms encode every chunk once to refuse an unencodable value.  Done
on the event loop, that work stops every connection of the process, heartbeats
included: on a loaded machine, long enough for the rendezvous to declare a rank
lost.  The client does it on a worker thread for arrays of
``cco.client.communicator.OFF_LOOP_ELEMENTS`` elements or more.

Measured here: a rendezvous, one aggregator and ``--ranks`` endpoints in this
process's event loop, over real QUIC on loopback; a 1 ms ticker task records the
loop's lag while every rank starts a ``--mib`` MiB float32 all-reduce, with the work
off the loop (the default) and, for comparison, on it.  Figures: how long the start
calls held the loop, and the largest lag the ticker saw until the results were in.

    python benchmarks/probes/bench_loop_stall.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # the shared support modules
from inprocess import group_in_process

from cco.client import communicator
from cco.wire.messages import GroupParams

RESULTS = Path(__file__).resolve().parent / "results" / "bench_loop_stall.json"
GROUP = bytes.fromhex("5a" * 16)
PARAMS = GroupParams(chunk_elements=65536, window=8, heartbeat_interval_ms=1000, operation_timeout_ms=60_000)


async def measure(ranks: int, mib: int, off_loop: bool) -> dict[str, float]:
    communicator.OFF_LOOP_ELEMENTS = 1 << 20 if off_loop else 1 << 62
    async with group_in_process(ranks, PARAMS, GROUP) as comms:
        data = np.random.default_rng(0).standard_normal(mib << 18).astype(np.float32)
        lags: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            while not done.is_set():
                started = time.perf_counter()
                await asyncio.sleep(0.001)
                lags.append(time.perf_counter() - started - 0.001)

        tick = asyncio.ensure_future(ticker())
        await asyncio.sleep(0.05)
        started = time.perf_counter()
        futures = [c.start_all_reduce(data) for c in comms]
        held = time.perf_counter() - started
        await asyncio.gather(*futures)
        done.set()
        await tick
    return {"start_calls_ms": held * 1000, "max_lag_ms": max(lags) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--mib", type=int, default=64, help="float32 MiB per rank")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    results = {}
    for off_loop in (False, True):
        figures = asyncio.run(measure(args.ranks, args.mib, off_loop))
        where = "off the loop" if off_loop else "on the loop"
        results[where] = figures
        print(
            f"{args.ranks} ranks start {args.mib} MiB float32, work {where}: the start calls held the "
            f"loop {figures['start_calls_ms']:.0f} ms, largest lag {figures['max_lag_ms']:.0f} ms"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
