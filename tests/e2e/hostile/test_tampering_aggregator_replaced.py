"""After a malicious aggregator process tampers with a result, the group goes on
without it (issue 41: "the group continues in a new epoch without that aggregator").

Real processes on loopback (benchmarks/support/tamper_trials.py): a rendezvous, an
aggregator that changes an element of every odd call's result ("evil", where the
group forms: it has the most spare capacity), and an honest one.  The tampered call fails on
both ranks with VERIFICATION_FAILED; their Reports take evil out of the group's
trees; the calls after it are exact, the odd one included, which evil would have
tampered with had it still been on the path.  Every wait is on a condition.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks" / "support"))
from hostile_victim import close_all
from tamper_trials import EVIL, HONEST, HOST, TamperCluster, join_group, run_call, trial_names

from cco.wire.errors import CcoError, ErrorCode

pytestmark = pytest.mark.timeout(120)

GROUP = bytes.fromhex("a1" + "00" * 14 + "2a")


def test_the_group_leaves_the_tampering_aggregator_and_its_next_calls_are_exact(tmp_path: Path) -> None:
    nodes = TamperCluster(tmp_path, "change-element", seed=3, trials=2)  # two status questions
    comms = []
    try:
        comms = join_group(f"{HOST}:{nodes.port}", nodes.pki, GROUP, trial_names(0))
        before = nodes.group_view(GROUP, 0)
        assert before is not None and [n.node_id for n in before.tree] == [EVIL]
        assert before.excluded is None
        rng = np.random.default_rng(3)
        outcomes = []
        for _ in range(4):
            arrays = [rng.integers(-1000, 1000, 700).astype(np.int32) for _ in range(2)]
            outcomes.append((arrays, run_call(comms, arrays)))
        after = nodes.group_view(GROUP, 1)
    finally:
        close_all(comms)
        nodes.close()
    tampered = [json.loads(line) for line in nodes.log.read_text().splitlines()]
    assert {line["ordinal"] for line in tampered} == {1}, "evil tampered with call 1 only"
    for call, (arrays, got) in enumerate(outcomes):
        if call == 1:
            assert all(isinstance(g, CcoError) and g.code is ErrorCode.VERIFICATION_FAILED for g in got), got
            continue
        want = (arrays[0].astype(np.int64) + arrays[1]).astype(np.int32)
        for result in got:
            assert isinstance(result, np.ndarray), f"call {call}: {result}"
            assert np.array_equal(result, want), f"call {call} is not exact"
    assert after is not None and after.epoch > before.epoch
    assert [n.node_id for n in after.tree] == [HONEST]
    assert after.excluded == (EVIL,)  # what `cco-node status` shows the operator
    rendezvous_log = (tmp_path / "rendezvous.log").read_text()
    assert "tampering reported" in rendezvous_log
    assert f"excluded from the group's trees: {EVIL}" in rendezvous_log
