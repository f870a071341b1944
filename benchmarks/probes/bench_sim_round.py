"""The protocol's own work in one 8-byte all-reduce, without sockets or an event loop.

Four endpoint machines and an aggregator in the in-memory cluster of
:mod:`cco.nodes.sim` (every message encoded and decoded, as on the wire) run rounds
of a 2-element float32 SUM, one EXACT chunk of 18 limbs per rank: what each process
of the loopback latency case does per round besides QUIC and asyncio.  Prints the
time per round (hot, all roles in one process; timings on a shared host move by
tens of percent) and checks every rank's result.  Instruction counts do not move:
run it under callgrind with ``--rounds N`` and with ``--rounds 0`` and divide the
difference by N::

    python benchmarks/probes/bench_sim_round.py --rounds 3000
    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python benchmarks/probes/bench_sim_round.py --rounds 200        # and --rounds 0
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from cco.nodes.calls import CollectiveRequest
from cco.nodes.events import OperationCompleted
from cco.nodes.rendezvous import RendezvousConfig
from cco.nodes.sim import Deployment, GroupSpec, build_cluster
from cco.wire.registries import Collective, ReduceOp

GROUP = bytes.fromhex("c0" * 16)
RANKS = 4
WARMUP = 100


def deployment() -> Deployment:
    """A joined group of four ranks and one aggregator; messages delivered in order."""
    return build_cluster(
        [GroupSpec(GROUP, RANKS)],
        aggregators=1,
        params=RendezvousConfig().params,
        max_fan_in=64,
        reorder=False,
    )


def rounds(cluster: Deployment, count: int) -> list[np.ndarray]:
    """``count`` all-reduces of each rank's [rank, 1] into a reused array per rank, each
    checked; the arrays, holding the last round's results."""
    inputs = [np.array([rank, 1], dtype=np.float32) for rank in range(RANKS)]
    outputs = [np.empty(2, dtype=np.float32) for _ in range(RANKS)]
    expected = np.array([sum(range(RANKS)), RANKS], dtype=np.float32)
    for _ in range(count):
        one_round(cluster, GROUP, inputs, outputs)
        for out in outputs:
            np.testing.assert_array_equal(out, expected)
    return outputs


def one_round(cluster: Deployment, group: bytes, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
    """One all-reduce SUM of each rank's input into its output (rank = list index);
    SystemExit if a rank's call did not complete."""
    for node_id in cluster.endpoint_ids(group):
        cluster.cluster.nodes[node_id].outputs.clear()  # what outcomes() searches: this round's
    requests = {
        rank: CollectiveRequest(kind=Collective.ALL_REDUCE, op=ReduceOp.SUM, array=x, out=out)
        for rank, (x, out) in enumerate(zip(inputs, outputs, strict=True))
    }
    outcomes = cluster.collective(group, requests)
    if len(outcomes) != len(inputs) or not all(isinstance(o, OperationCompleted) for o in outcomes.values()):
        raise SystemExit(f"a round failed: {outcomes}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3000, help="timed rounds (0: set-up only)")
    args = parser.parse_args(argv)
    cluster = deployment()
    rounds(cluster, WARMUP)  # in both runs of a callgrind pair, so that only the timed rounds differ
    if args.rounds == 0:
        return 0
    start = time.perf_counter()
    rounds(cluster, args.rounds)
    seconds = (time.perf_counter() - start) / args.rounds
    print(f"{seconds * 1e6:.1f} us per round: {RANKS} endpoints and an aggregator, hot, in one process")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
