"""One hostile peer against real nodes on loopback: short versions of
benchmarks/bench_hostile.py's attacks (issue 41, "What it must show").

Each attack runs once on a fresh cluster (a rendezvous, two aggregators, a victim
group of two all-reducing without pause), for a few seconds and at a fraction of
the benchmark's counts; the tests then judge what the benchmark measures, without
its timing targets (a test must pass on a busy machine: the victim's round time
and the two seconds for a new group are the benchmark's to judge):

* the victim group's every result is exact, and none of its operations fails;
* a new group forms while the attack runs;
* no node's RSS grows by more than ``GROWTH_MIB`` over its baseline;
* every node's RSS comes back within 10% of its baseline before the test ends;
* every hostile input gets an Error or a close.

Where a protection of issue 41 does not exist yet the test is marked xfail with
what is missing (:data:`MISSING`); phase 2 builds it and removes the mark (the
strict marks turn an unexpected pass into a failure; a harm that a quiet, fast
machine may escape is marked non-strict).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks" / "support"))
from hostile_cluster import RSS_RETURN_FRACTION, Outcome, Plan, measure

pytestmark = pytest.mark.timeout(400)

GROWTH_MIB = 16.0
"""The most a node's RSS may grow during one of these short attacks (the attacks
that hold nothing grow a node by 1 to 3 MiB here)."""

PLANS = {
    "join-flood": Plan("join-flood", duration=6.0, scale=0.2),
    "capacity": Plan("capacity", duration=10.0, scale=1.0, newcomer_after=4.0),
    "spoofed-initials": Plan("spoofed-initials", duration=6.0, scale=0.1),
    "slow-reader": Plan("slow-reader", duration=6.0, scale=0.25),
    "parked-chunks": Plan("parked-chunks", duration=6.0, scale=0.25),
    "unfinished-frames": Plan("unfinished-frames", duration=6.0, scale=0.25),
    "garbage-frames": Plan("garbage-frames", duration=10.0, scale=1.0),
}
SHORT: dict[str, float | int] = {
    "warmup_rounds": 10,
    "startup": 3.0,
    "unloaded": 2.0,
    "settle": 6.0,
    "heartbeat_ms": 3000,
}
"""Every plan's phases, shortened; heartbeats at 3 s so that a CPU-starved machine
does not lose the victim's members for reasons of its own."""

MISSING: dict[tuple[str, str], tuple[str, bool]] = {
    ("victim", "join-flood"): (
        "no per-connection throttle at the rendezvous (issue 41 item 1): while it answers the "
        "flood it answers nobody's heartbeats, loses the victim's members and their sessions end",
        False,
    ),
    ("newcomer", "join-flood"): (
        "no per-connection throttle or pending-join quota at the rendezvous (issue 41 item 1): "
        "1,000 JoinRequests on one connection keep its loop busy, a new connection gets no session",
        False,
    ),
    ("newcomer", "capacity"): (
        "no groups-per-peer quota (issue 41 item 1): one peer's one-member groups take every "
        "aggregator slot, and the newcomers hear TIMEOUT instead of NO_AGGREGATOR",
        False,
    ),
    ("victim", "spoofed-initials"): (
        "no handshake flood protection (issue 41 item 2: Retry past a threshold, a cap on half-open "
        "connections): the Initials starve the event loops, the victim's members are lost",
        False,
    ),
    ("newcomer", "spoofed-initials"): ("no handshake flood protection (issue 41 item 2)", False),
    ("growth", "spoofed-initials"): (
        "every undecryptable Initial creates a connection (issue 41 item 2: Retry, a half-open cap)",
        True,
    ),
    ("returns", "spoofed-initials"): (
        "half-open connections are not dropped and their memory stays (issue 41 item 2: short "
        "handshake timeouts)",
        True,
    ),
    ("growth", "slow-reader"): (
        "no bounded per-connection send queue (issue 41 item 3): the Results owed to a peer "
        "that never reads pile up at its aggregator",
        True,
    ),
    ("growth", "parked-chunks"): (
        "parked chunks are bounded per connection only (64 messages of up to 16 MiB), not in bytes "
        "nor per node (issue 41 item 1: parked chunks per node)",
        True,
    ),
    ("returns", "parked-chunks"): ("the memory of parked chunks does not come back (issue 41 item 1)", False),
    ("returns", "slow-reader"): (
        "what was queued for the peer that never read does not come back when it leaves (issue 41 item 3)",
        False,
    ),
    ("returns", "unfinished-frames"): (
        "no bound on unfinished frames per connection and per node (issue 41 item 1): the "
        "partial frames stay buffered while the connection lives",
        False,
    ),
}


def _expect(request: pytest.FixtureRequest, check: str, attack: str) -> None:
    missing = MISSING.get((check, attack))
    if missing is not None:
        reason, strict = missing
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=strict))


@pytest.fixture(scope="module", params=sorted(PLANS))
def outcome(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    plan = dataclasses.replace(PLANS[request.param], **SHORT)
    return measure(plan, tmp_path_factory.mktemp(plan.attack), sys.stderr)


def test_the_attack_ran(outcome: Outcome) -> None:
    attacker = outcome.attacker
    assert attacker.get("error") is None, attacker
    assert sum(attacker.get("sent", {}).values()) or attacker.get("hostile_inputs"), attacker


def test_the_victims_results_stay_exact(outcome: Outcome) -> None:
    assert outcome.victim_inexact == 0


def test_no_victim_operation_fails(outcome: Outcome, request: pytest.FixtureRequest) -> None:
    _expect(request, "victim", outcome.attack)
    assert outcome.victim_rounds_attacked > 0
    assert outcome.victim_failed == 0, outcome.victim_first_error


def test_a_new_group_forms_during_the_attack(outcome: Outcome, request: pytest.FixtureRequest) -> None:
    _expect(request, "newcomer", outcome.attack)
    assert outcome.newcomer_formed_during_attack, outcome.newcomer


def test_memory_stays_bounded(outcome: Outcome, request: pytest.FixtureRequest) -> None:
    _expect(request, "growth", outcome.attack)
    grown = {name: m.peak_mib - m.baseline_mib for name, m in outcome.memory.items()}
    assert all(growth <= GROWTH_MIB for growth in grown.values()), grown


def test_memory_comes_back(outcome: Outcome, request: pytest.FixtureRequest) -> None:
    _expect(request, "returns", outcome.attack)
    settled = {name: (m.baseline_mib, m.settled_mib) for name, m in outcome.memory.items()}
    assert all(m.returned_after_seconds is not None for m in outcome.memory.values()), settled
    assert all(s <= b * (1 + RSS_RETURN_FRACTION) for b, s in settled.values()), settled


def test_every_hostile_input_is_answered(outcome: Outcome) -> None:
    if outcome.attack != "garbage-frames":
        pytest.skip("only the garbage-frames attack sends the catalogue of hostile inputs")
    inputs = outcome.attacker["hostile_inputs"]
    assert len(inputs) == 19
    assert outcome.attacker["unanswered"] == [], outcome.attacker["unanswered"]
