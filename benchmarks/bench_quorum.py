"""What the quorum policy costs (issue 9: stragglers), against a strict all-reduce.

A quorum ALL_REDUCE is a presence pass (one int8 element per rank, up and down the
tree) before the operation itself.  Measured here:

* bytes: the presence pass's Contribution and Result as encoded and framed on one
  endpoint's link, for N ranks (exact, from the messages);
* time: the latency of a small all-reduce (``--elements`` float32) strict and under
  quorum, with every rank on time, over real QUIC connections on loopback: a
  rendezvous, one aggregator and ``--ranks`` endpoints in this process's event loop,
  ``--rounds`` rounds each, medians.

Expectation (no target in the issue): the quorum adds one round trip of a one-element
chunk, so its latency is about that of a one-element int8 all-reduce more than the
strict one, and its bytes are a few dozen per rank and direction.

    python benchmarks/bench_quorum.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))  # the shared support modules
from inprocess import group_in_process

from cco.wire import payload
from cco.wire.fields import bitmap_from_ranks
from cco.wire.framing import encode_frame
from cco.wire.messages import Contribution, GroupParams, Result, encode_message
from cco.wire.registries import Collective, DType, ReduceOp

RESULTS = Path(__file__).resolve().parent / "results" / "bench_quorum.json"
GROUP = bytes.fromhex("b7" * 16)
PARAMS = GroupParams(chunk_elements=65536, window=8, heartbeat_interval_ms=1000, operation_timeout_ms=30_000)
WAIT = 1.0  # every rank is on time: the wait is never waited


def presence_bytes(world: int) -> tuple[int, int]:
    """(up, down): one endpoint's framed presence Contribution and the Result of all ranks."""
    keys = payload.derive_group_keys(bytes(32), GROUP)
    header = payload.ChunkHeader(
        group_id=GROUP,
        epoch=1,
        op_id=0,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.INT8,
        total_elements=1,
        chunk_elements=PARAMS.chunk_elements,
        chunk_index=0,
        quorum=world,
        wait_ms=round(WAIT * 1000),
    )
    parts = [payload.seal(keys, header, r, np.ones(1, dtype=np.int64)) for r in range(world)]
    result = payload.combine(parts, Result)
    assert result.contributors == bitmap_from_ranks(range(world))
    assert isinstance(parts[0], Contribution)
    return len(encode_frame(encode_message(parts[0]))), len(encode_frame(encode_message(result)))


async def latencies(ranks: int, rounds: int, elements: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"strict": [], "quorum": []}
    async with group_in_process(ranks, PARAMS, GROUP) as comms:
        data = [np.full(elements, c.rank + 1, dtype=np.float32) for c in comms]
        for _ in range(rounds):
            for policy in ("strict", "quorum"):
                started = time.perf_counter()
                if policy == "strict":
                    await asyncio.gather(*[c.all_reduce(d) for c, d in zip(comms, data, strict=True)])
                else:
                    calls = [
                        c.all_reduce_quorum(d, min_ranks=ranks, wait=WAIT)
                        for c, d in zip(comms, data, strict=True)
                    ]
                    results = await asyncio.gather(*calls)
                    assert all(r.contributors == frozenset(range(ranks)) for r in results)
                times[policy].append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--elements", type=int, default=2, help="float32 elements per rank")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    sizes = {world: presence_bytes(world) for world in (4, 64, 1024)}
    for world, (up, down) in sizes.items():
        print(f"presence pass, {world:4d} ranks: {up} bytes up, {down} bytes down per endpoint link (framed)")
    times = asyncio.run(latencies(args.ranks, args.rounds, args.elements))
    medians = {policy: statistics.median(values) * 1000 for policy, values in times.items()}
    print(
        f"{args.elements} float32 x {args.ranks} ranks, {args.rounds} rounds, one process: strict "
        f"{medians['strict']:.2f} ms, quorum {medians['quorum']:.2f} ms median "
        f"(+{medians['quorum'] - medians['strict']:.2f} ms: the presence pass's round trip)"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "presence_bytes": {str(w): {"up": u, "down": d} for w, (u, d) in sizes.items()},
        "median_ms": medians,
        "ranks": args.ranks,
        "rounds": args.rounds,
        "elements": args.elements,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
