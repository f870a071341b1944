"""benchmarks/probes/bench_round_trace.py: the steps it reports are the right differences of
the stamps, rounds it cannot line up are left out rather than guessed, and a real
run's stamps line up, so the step table in BENCHMARKS.md stays reproducible."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import bench_round_trace  # benchmarks/ is not a package: found through the path set above
import pytest
from bench_round_trace import Node, Stamp, line_up

RENDEZVOUS_PORT = 9000
RANK_PORTS = (7000, 7001)


def _round(base: float, op: int) -> tuple[list[dict[str, float]], list[list[Stamp]], list[Stamp]]:
    """One round of two ranks at ``base``: each rank's record, stamps, and the aggregator's."""
    calls = [base, base + 0.001]
    returns = [base + 0.0028, base + 0.0030]
    records = [{"started": c, "seconds": r - c} for c, r in zip(calls, returns, strict=True)]
    ranks: list[list[Stamp]] = [
        [(base + 0.0002, "queued", "Contribution", op), (base + 0.0025, "taken", "Result", op)],
        [(base + 0.0012, "queued", "Contribution", op), (base + 0.0026, "taken", "Result", op)],
    ]
    aggregator: list[Stamp] = [
        (base + 0.0005, "taken", "Contribution", op),
        (base + 0.0015, "taken", "Contribution", op),
        (base + 0.0020, "queued", "Result", op),
        (base + 0.00201, "queued", "Result", op),
        (base + 0.0021, "sent", "", RANK_PORTS[0]),
        (base + 0.00211, "sent", "", RENDEZVOUS_PORT),  # a heartbeat, not a Result
        (base + 0.0023, "sent", "", RANK_PORTS[1]),
    ]
    return records, ranks, aggregator


def _rounds(count: int) -> tuple[list[dict[str, Any]], list[Node], Node, list[list[Stamp]]]:
    reports: list[dict[str, Any]] = [{"rank": r, "rounds": []} for r in range(2)]
    rank_stamps: list[list[Stamp]] = [[], []]
    aggregator: list[Stamp] = []
    for i in range(count):
        records, ranks, agg = _round(10.0 + 0.01 * i, op=5 + i)
        for r in range(2):
            reports[r]["rounds"].append(records[r])
            rank_stamps[r] += ranks[r]
        aggregator += agg
    return reports, [Node.of(s) for s in rank_stamps], Node.of(aggregator), rank_stamps


def test_every_step_is_the_difference_of_its_stamps() -> None:
    reports, endpoints, aggregator, _ = _rounds(3)
    steps = line_up(reports, endpoints, aggregator, {RENDEZVOUS_PORT}, warmup=0)
    expected = {
        "spread": 0.001,
        "to_queue": 0.0002,
        "to_aggregator": 0.0005,
        "combine": 0.00051,
        "to_leave": 0.00009,
        "leaving": 0.0002,  # the heartbeat between the two Results is not counted
        "to_arrive": 0.0005,
        "to_return": 0.00035,  # the median of 0.3 and 0.4 ms
        "between": 0.0076,  # the median of 7.2 and 8.0 ms
        "between_least": 0.0072,
        "period": 0.01,
        "from_last_call": 0.002,
        "slowest_rank": 0.0028,
    }
    assert set(steps) == set(expected) == {key for key, _, _ in bench_round_trace.STEPS}
    for key, value in expected.items():
        assert steps[key] == pytest.approx([value, value], abs=1e-9), (
            key
        )  # rounds 0 and 1; 2 has no next call


def test_the_warm_up_is_left_out() -> None:
    reports, endpoints, aggregator, _ = _rounds(5)
    assert len(line_up(reports, endpoints, aggregator, {RENDEZVOUS_PORT}, warmup=2)["period"]) == 2


def test_a_round_that_cannot_be_lined_up_is_left_out() -> None:
    reports, _, aggregator, rank_stamps = _rounds(4)
    # Round 1: rank 1 takes no Result.  Round 2: the ranks' Contributions name different ops.
    rank_stamps[1] = [s for s in rank_stamps[1] if not (s[2] == "Result" and s[3] == 6)]
    rank_stamps[1] = [
        (t, k, n, 99 if (n == "Contribution" and op == 7) else op) for t, k, n, op in rank_stamps[1]
    ]
    steps = line_up(reports, [Node.of(s) for s in rank_stamps], aggregator, {RENDEZVOUS_PORT}, warmup=0)
    assert len(steps["period"]) == 1  # only round 0 (round 3 is the last: no next call)


def test_a_real_run_lines_up(tmp_path: Path) -> None:
    result = bench_round_trace.measure(rounds=25, endpoints=2, warmup=3, workdir=tmp_path)
    steps = result["steps"]
    lined_up = len(steps["period"])
    assert lined_up >= 15  # of the 21 between the warm-up and the last round
    for key, values in steps.items():
        assert len(values) == lined_up
        assert all(v >= 0 for v in values), key
    # The slowest rank waited at least as long as the collective took after the last call.
    assert all(s >= f for s, f in zip(steps["slowest_rank"], steps["from_last_call"], strict=True))
    assert all(p > 0 for p in steps["period"])
