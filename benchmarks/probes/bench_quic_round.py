"""The whole 8-byte all-reduce over real QUIC, with every node in one process.

``bench_latency.py`` times the round with the aggregator and four endpoints as
separate processes sharing the host's cores; ``bench_sim_round.py`` counts the
protocol's own work, without QUIC or an event loop.  This one sits between them:
the same round (four ranks, a 2-element float32 SUM, one aggregator) with
everything those processes run per round (the machines, the wire layer, QUIC on
UDP over loopback, asyncio and the :class:`~cco.client.Communicator` API), but with
every node on this process's event loop (``inprocess.py``).  Nothing switches
between processes, so its time per round is what the round's instructions cost on
a warm core: set beside the CPU the separate processes spend per round
(``bench_latency.py`` prints it), it shows how much of that is the work itself and
how much is running it in five processes on shared cores.

Timings on a shared host move by tens of percent; instruction counts move by
about 1% (the order in which datagrams meet the event loop varies).  Under
callgrind, run ``--rounds N`` and ``--rounds 0`` and divide the difference by N::

    python benchmarks/probes/bench_quic_round.py --rounds 2000
    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python benchmarks/probes/bench_quic_round.py --rounds 200        # and --rounds 0
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # the shared support modules
from inprocess import group_in_process

from cco.client import Communicator
from cco.wire.messages import GroupParams
from cco.wire.registries import ReduceOp

GROUP = bytes.fromhex("c1" * 16)
RANKS = 4
WARMUP = 30
PARAMS = GroupParams(
    chunk_elements=65536, window=8, heartbeat_interval_ms=20_000, operation_timeout_ms=600_000
)
"""Heartbeats and timeouts far apart, as in the latency case: no timer fires during the rounds."""


async def rounds(comms: list[Communicator], count: int) -> list[np.ndarray]:
    """``count`` all-reduces of each rank's [rank, 1] into a reused array per rank, each
    checked; the arrays, holding the last round's results."""
    inputs = [np.array([rank, 1], dtype=np.float32) for rank in range(len(comms))]
    outputs = [np.empty(2, dtype=np.float32) for _ in comms]
    expected = [float(sum(range(len(comms)))), float(len(comms))]
    for _ in range(count):
        await asyncio.gather(
            *(
                comm.all_reduce(x, ReduceOp.SUM, out=out)
                for comm, x, out in zip(comms, inputs, outputs, strict=True)
            )
        )
        for rank, out in enumerate(outputs):
            if out.tolist() != expected:  # cheap: the check is part of every round measured
                raise SystemExit(f"rank {rank} got {out.tolist()}, not {expected}")
    return outputs


async def measure(count: int) -> float | None:
    """Seconds per round over ``count`` rounds after the warm-up (None for 0 rounds)."""
    async with group_in_process(RANKS, PARAMS, GROUP) as comms:
        await rounds(comms, WARMUP)  # in both runs of a callgrind pair, so that only the timed rounds differ
        if count == 0:
            return None
        start = time.perf_counter()
        await rounds(comms, count)
        return (time.perf_counter() - start) / count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2000, help="timed rounds (0: set-up only)")
    args = parser.parse_args(argv)
    seconds = asyncio.run(measure(args.rounds))
    if seconds is not None:
        print(
            f"{seconds * 1e6:.1f} us per round: {RANKS} endpoints, an aggregator and the rendezvous "
            "over QUIC on loopback, in one process"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
