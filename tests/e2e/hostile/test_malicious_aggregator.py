"""A malicious aggregator process tampers with a group's results (issue 41, third
bullet): a short version of benchmarks/bench_hostile.py's 200 trials per attack.

Each attack of :mod:`cco.interop.hostile` runs live on loopback
(benchmarks/support/tamper_trials.py), each trial in a group of its own formed on the
malicious aggregator, an honest one beside it: every call the aggregator tampered
with must fail on every rank with a typed error, no rank may get data from it, every
honest call between them must return the exact (for floats: bit-identical) result,
and after each tampering the group must go on without the malicious aggregator, its
next call exact.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks" / "support"))
from tamper_trials import run_trials

from cco.interop.hostile import ATTACKS

pytestmark = pytest.mark.timeout(240)

TRIALS = 3


@pytest.mark.parametrize("attack", ATTACKS)
def test_every_tampered_call_fails_on_every_rank(attack: str, tmp_path: Path) -> None:
    trials = run_trials(attack, TRIALS, tmp_path / attack, seed=7)
    assert trials.tampered_calls >= TRIALS, trials.as_dict()
    assert trials.detected == trials.tampered_calls, trials.undetected
    assert not trials.undetected, trials.undetected
    assert not trials.honest_refused, trials.honest_refused
    assert trials.continued == trials.tampered_calls, trials.stuck
