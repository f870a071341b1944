"""A rendezvous SIGKILLed and restarted in the middle of a run loses no group (issue 9).

Real processes on loopback: a rendezvous with its store in the work directory,
three aggregators in a two-level tree and four endpoints running verified
all-reduce rounds.  The rendezvous is killed with SIGKILL after a few rounds and
started again on the same port from its store.  Then, with nobody's help:

* every aggregator registers again and is given its tree again, in the same epoch;
* every endpoint resumes its membership (same rank, same epoch);
* after the rendezvous's grace period, no member or aggregator was declared lost:
  no node ever saw an epoch other than the first, and every rank keeps completing
  verified all-reduces;
* every endpoint then stops on SIGTERM with status 0, and no node logged an error.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from logcheck import log_problems
from rendezvous_harness import formed

from cco.localcluster import ClusterSpec, LocalCluster
from cco.nodes.rendezvous_config import RESUME_REDIAL_GAP
from cco.services.store import RendezvousStore
from cco.wire.messages import LOSS_INTERVALS

RANKS = 4
AGGREGATORS = 3
GRACE = LOSS_INTERVALS * 1.0 + RESUME_REDIAL_GAP  # the rendezvous's default, heartbeats of 1 s


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def _rounds(cluster: LocalCluster, rank: int) -> int:
    """The last verified round endpoint ``rank`` reported."""
    done = re.findall(r"round (\d+)/\d+ verified", cluster.log(f"ep-{rank}"))
    return int(done[-1]) if done else 0


@pytest.mark.timeout(60)  # about 25 s here
def test_a_rendezvous_killed_and_restarted_mid_run_loses_no_group(tmp_path: Path) -> None:
    spec = ClusterSpec(
        aggregators=AGGREGATORS,
        endpoints=RANKS,
        max_fan_in=2,
        rounds=1_000_000,  # stopped by SIGTERM at the end
        elements=4096,
        chunk_elements=1024,
    )
    with LocalCluster(spec, tmp_path) as cluster:
        cluster.start()
        ranks = [cluster.start_endpoint(i, tmp_path / f"r{i}.json") for i in range(RANKS)]
        _wait_for(lambda: all(_rounds(cluster, r) >= 3 for r in range(RANKS)), 30, "every rank runs rounds")

        cluster.restart_rendezvous(signal.SIGKILL)
        restarted = time.monotonic()
        assert cluster.store.exists()
        assert "restored 1 groups and 3 aggregator registrations" in cluster.log("rendezvous")

        aggregators = [f"agg-{i}" for i in range(AGGREGATORS)]
        _wait_for(
            lambda: all(cluster.log(a).count("registered with") == 2 for a in aggregators),
            20,
            "every aggregator registers again",
        )
        _wait_for(
            lambda: all("resuming the membership" in cluster.log(f"ep-{r}") for r in range(RANKS)),
            20,
            "every endpoint resumes its membership",
        )
        # past the grace period: anyone still away would now be lost, in a new epoch
        time.sleep(max(0.0, restarted + GRACE + 1.0 - time.monotonic()))
        after_grace = [_rounds(cluster, r) for r in range(RANKS)]
        _wait_for(
            lambda: all(_rounds(cluster, r) >= after_grace[r] + 5 for r in range(RANKS)),
            20,
            "every rank completes five more verified all-reduces after the grace period",
        )
        assert all(rank.poll() is None for rank in ranks), "no endpoint failed"

        for name in aggregators:
            tree_lines = re.findall(r"group \w+ epoch (\d+): tree parent", cluster.log(name))
            assert set(tree_lines) <= {"1"}, f"{name} saw only the first epoch: {tree_lines}"
        assert sum(len(re.findall(r"epoch 1: tree parent", cluster.log(a))) for a in aggregators) == 2 * 3, (
            "each aggregator got its TreeAssignment once before and once after the restart"
        )
        for r in range(RANKS):
            log = cluster.log(f"ep-{r}")
            assert not re.search(r"epoch [2-9]", log), f"ep-{r} saw a new epoch"
            assert "PEER_LOST" not in log and "rendezvous gone" not in log

        for rank in ranks:
            rank.send_signal(signal.SIGTERM)
        statuses = [rank.wait(15) for rank in ranks]
        tails = {r: cluster.log(f"ep-{r}")[-600:] for r in range(RANKS) if statuses[r] != 0}
        assert statuses == [0] * RANKS, f"every rank stops with status 0; the others' logs end: {tails}"
    assert log_problems(sorted(tmp_path.glob("*.log"))) == [], "no node logged an ERROR or a traceback"


def test_a_new_local_cluster_does_not_restore_an_earlier_run_in_its_work_dir(tmp_path: Path) -> None:
    earlier = RendezvousStore(tmp_path / "rendezvous.sqlite3")
    earlier.save(formed().rv.durable_state())  # groups and registrations of an earlier run
    earlier.close()
    with LocalCluster(ClusterSpec(aggregators=1, endpoints=0), tmp_path) as cluster:
        cluster.start()
        assert "listening" in cluster.log("rendezvous") and "restored" not in cluster.log("rendezvous")
        cluster.restart_rendezvous(signal.SIGKILL)  # a restart of the same cluster does restore
        assert "restored 0 groups and 1 aggregator registrations" in cluster.log("rendezvous")
