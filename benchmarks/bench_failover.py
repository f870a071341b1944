"""Aggregator failover with real processes (issue 9): SIGKILL a leaf aggregator in
the middle of a multi-MiB all-reduce, repeatedly, and check that every rank still
gets the verified result, bit for bit the one an undisturbed run gives.

Each trial starts a fresh local cluster (a rendezvous, four aggregators of which
three form a two-level tree and one is spare, four endpoints), starts one all-reduce
round on every endpoint, kills a leaf aggregator ``--kill-after`` seconds after the
endpoints joined, and waits.  The rendezvous notices the loss (three missed
heartbeats), re-plans the tree over the spare, and the endpoints start the
interrupted operation again in the new epoch from their own inputs.

Prints per trial the round time and the recovery time (from the kill to the last
rank's result) and, at the end, failures, median and maximum, against the target:
every trial exact and within the operation timeout plus 3 s.

    python benchmarks/bench_failover.py --trials 20
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import tempfile
import time
from pathlib import Path

from cco.localcluster import ClusterSpec, LocalCluster

RESULTS = Path(__file__).resolve().parent / "results" / "bench_failover.json"
OPERATION_TIMEOUT = 30.0  # the rendezvous's default operation timeout (cco-node --operation-timeout-ms)


def _wait_for(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def trial(spec: ClusterSpec, workdir: Path, kill_after: float | None) -> dict[str, object]:
    """One run; with ``kill_after`` None, the undisturbed reference."""
    with LocalCluster(spec, workdir) as cluster:
        cluster.start()
        results = [workdir / f"ep-{i}.json" for i in range(spec.endpoints)]
        ranks = [cluster.start_endpoint(i, results[i]) for i in range(spec.endpoints)]
        joined = _wait_for(
            lambda: all("joined as rank" in cluster.log(f"ep-{i}") for i in range(spec.endpoints)), 60
        )
        killed_at = None
        victim = None
        if kill_after is not None and joined:
            time.sleep(kill_after)
            logs = {f"agg-{i}": cluster.log(f"agg-{i}") for i in range(spec.aggregators)}
            leaves = [name for name, text in logs.items() if re.search(r"epoch 1: tree parent agg-", text)]
            victim = leaves[0] if leaves else None
            if victim is not None:
                cluster.infrastructure(victim).send_signal(signal.SIGKILL)
                killed_at = time.monotonic()
        codes = [rank.wait(OPERATION_TIMEOUT + 60) for rank in ranks]
        finished = time.monotonic()
        reports = [json.loads(path.read_text()) if path.exists() else None for path in results]
    digests = {r["rounds"][0]["sha256"] for r in reports if r is not None}
    rounds = [r["rounds"][0]["seconds"] for r in reports if r is not None]
    return {
        "victim": victim,
        "exit_codes": codes,
        "sha256": digests.pop() if len(digests) == 1 and all(reports) else None,
        "round_seconds": max(rounds) if rounds else None,
        "recovery_seconds": None if killed_at is None else finished - killed_at,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--mib", type=float, default=8.0, help="MiB of float32 per rank")
    parser.add_argument("--kill-after", type=float, default=0.3, help="seconds after joining")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    spec = ClusterSpec(
        aggregators=4, endpoints=4, max_fan_in=2, rounds=1, elements=int(args.mib * (1 << 20)) // 4
    )
    with tempfile.TemporaryDirectory(prefix="cco-failover-") as tmp:
        reference = trial(spec, Path(tmp) / "reference", None)
        print(f"reference: round {reference['round_seconds']:.2f} s, sha256 {str(reference['sha256'])[:16]}")
        rows = []
        for index in range(args.trials):
            row = trial(spec, Path(tmp) / f"trial-{index}", args.kill_after)
            exact = row["sha256"] == reference["sha256"] and row["sha256"] is not None
            in_time = row["round_seconds"] is not None and row["round_seconds"] <= OPERATION_TIMEOUT + 3  # type: ignore[operator]
            row.update(exact=exact, within_target=bool(exact and in_time and row["victim"]))
            rows.append(row)
            recovery = row["recovery_seconds"]
            print(
                f"trial {index + 1:2}: killed {row['victim']}, exit codes {row['exit_codes']}, "
                f"round {row['round_seconds']} s, recovery "
                f"{'-' if recovery is None else f'{recovery:.2f} s'}, exact {exact}"
            )
    failures = sum(not r["within_target"] for r in rows)
    recoveries = [float(r["recovery_seconds"]) for r in rows if r["recovery_seconds"] is not None]  # type: ignore[arg-type]
    summary = {
        "trials": len(rows),
        "failures": failures,
        "recovery_median_seconds": statistics.median(recoveries) if recoveries else None,
        "recovery_max_seconds": max(recoveries) if recoveries else None,
        "target": f"every trial exact and its round within {OPERATION_TIMEOUT:g} + 3 s",
        "rows": rows,
    }
    print(
        f"{len(rows)} trials, {failures} failures; recovery median "
        f"{summary['recovery_median_seconds']} s, max {summary['recovery_max_seconds']} s "
        f"({'met' if failures == 0 else 'MISSED'}: {summary['target']})"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
