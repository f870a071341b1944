"""A failure storm in the in-memory cluster (issue 9): many endpoints, three levels of
aggregators, a tenth of the aggregators killed while an all-reduce is in flight.

Every endpoint must still get the same verified, exact result: the rendezvous
re-plans the tree over the surviving aggregators, and the endpoints start the
interrupted operation again in the new epoch from their own inputs.  Prints the
simulated recovery time (from the kill to the last result), the wall time and the
peak memory of the simulation, and writes them as JSON.

    python benchmarks/bench_failure_storm.py --endpoints 1024
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import time
from pathlib import Path

import numpy as np

from cco.nodes.calls import CollectiveRequest
from cco.nodes.events import OperationCompleted
from cco.nodes.sim import GroupSpec, build_cluster
from cco.wire.messages import GroupParams
from cco.wire.registries import Collective

RESULTS = Path(__file__).resolve().parent / "results" / "bench_failure_storm.json"
GROUP = bytes.fromhex("f5" * 16)


def levels(aggregators: list[str], parents: dict[str, str | None]) -> int:
    """Depth of the deepest aggregator (the root is level 1)."""

    def depth(node: str) -> int:
        parent = parents[node]
        return 1 if parent is None else 1 + depth(parent)

    return max(depth(a) for a in aggregators)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoints", type=int, default=1024)
    parser.add_argument("--fan-in", type=int, default=12)
    parser.add_argument("--spare", type=float, default=0.3, help="extra aggregators beyond the tree's needs")
    parser.add_argument("--kill", type=float, default=0.1, help="fraction of the tree's aggregators killed")
    parser.add_argument("--elements", type=int, default=256)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    started = time.perf_counter()
    n, fan_in = args.endpoints, args.fan_in
    leaves = -(-n // fan_in)
    middle = -(-leaves // fan_in)
    needed = leaves + middle + (1 if middle > 1 else 0)
    count = int(needed * (1 + args.spare)) + 1
    params = GroupParams(
        chunk_elements=args.elements, window=4, heartbeat_interval_ms=500, operation_timeout_ms=20_000
    )
    d = build_cluster(
        [GroupSpec(GROUP, n)], aggregators=count, params=params, max_fan_in=fan_in, seed=args.seed
    )
    built = time.perf_counter()
    parents = {a: d.aggregator(a).group_parent(GROUP) for a in d.aggregators}
    in_tree = [a for a in d.aggregators if d.aggregator(a).group_epoch(GROUP) is not None]
    depth = levels(in_tree, {a: parents[a] for a in in_tree})

    rng = np.random.default_rng(args.seed)
    data = {r: rng.integers(-1000, 1000, args.elements).astype(np.int32) for r in range(n)}
    exact = np.sum([data[r].astype(np.int64) for r in range(n)], axis=0)
    op_ids = d.start(
        GROUP, {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=data[r]) for r in range(n)}
    )
    # let contributions climb part of the way, then kill a tenth of the tree
    for _ in range(n // 2):
        d.cluster.step()
    victims = random.Random(args.seed).sample(in_tree, max(1, round(args.kill * len(in_tree))))
    killed_at = d.cluster.now
    for victim in victims:
        d.cluster.kill(victim)
    d.cluster.run(lambda: len(d.outcomes(GROUP, op_ids)) == n, duration=60.0)
    outcomes = d.outcomes(GROUP, op_ids)
    completed = [o for o in outcomes.values() if isinstance(o, OperationCompleted) and o.result is not None]
    identical = len({o.result.tobytes() for o in completed if o.result is not None}) == 1
    correct = bool(completed) and all(
        o.result is not None and o.result.astype(np.int64).tolist() == exact.tolist() for o in completed
    )
    wall = time.perf_counter() - started
    summary = {
        "endpoints": n,
        "aggregators": count,
        "aggregators_in_tree": len(in_tree),
        "levels": depth,
        "killed": len(victims),
        "killed_in_tree_fraction": len(victims) / len(in_tree),
        "completed": len(completed),
        "bit_identical": identical,
        "exact": correct,
        "simulated_recovery_seconds": d.cluster.now - killed_at,
        "epochs": d.endpoint(GROUP, 0).epoch,
        "build_seconds": built - started,
        "wall_seconds": wall,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    for key, value in summary.items():
        print(f"{key:26} {value:.3f}" if isinstance(value, float) else f"{key:26} {value}")
    problems = [
        *([f"{n - len(completed)} endpoints got no result"] if len(completed) != n else []),
        *(["the results differ between endpoints"] if not identical else []),
        *(["the result is not exact"] if not correct else []),
        *(
            [f"the tree has {depth} levels, not 3 (more endpoints, or a smaller --fan-in)"]
            if depth < 3
            else []
        ),
    ]
    print("every endpoint got the same exact result" if not problems else f"FAILED: {'; '.join(problems)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
