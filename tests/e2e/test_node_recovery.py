"""Nodes that recover by themselves and stop cleanly (issue 9), as real processes.

* an aggregator that loses its rendezvous registers again, with backoff, once a
  rendezvous listens there again, and serves the groups formed after that;
* an aggregator whose registration is refused (its node id is taken) exits with
  status 3 at once instead of running on uselessly;
* SIGTERM or SIGINT stops the rendezvous and an aggregator with status 0, without a
  traceback; SIGTERM on an endpoint in the middle
  of its workload makes it leave the group and exit 0, and the other rank's next
  collective fails naming it instead of hanging.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path

import pytest

from cco.localcluster import ClusterSpec, LocalCluster


def _wait_for(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


@pytest.fixture
def cluster(tmp_path: Path) -> LocalCluster:
    spec = ClusterSpec(aggregators=1, endpoints=2, rounds=1, elements=1024, chunk_elements=1024)
    with LocalCluster(spec, tmp_path) as running:
        running.start()
        yield running  # type: ignore[misc]


def test_an_aggregator_registers_again_after_the_rendezvous_restarts(cluster: LocalCluster) -> None:
    cluster.restart_rendezvous(signal.SIGKILL)
    _wait_for(lambda: "registering again" in cluster.log("agg-0"), 40, "agg-0 registers again")
    _wait_for(lambda: cluster.log("agg-0").count("registered with") == 2, 20, "agg-0 accepted again")
    files = cluster.run_endpoints(timeout=60)  # a group formed after the restart is served
    assert all(path.exists() for path in files)
    assert cluster.infrastructure("agg-0").poll() is None


def test_an_aggregator_whose_node_id_is_taken_exits_with_status_3(cluster: LocalCluster) -> None:
    twin = cluster.start_aggregator("agg-0")
    assert twin.wait(20) == 3
    assert "already connected" in cluster.log("agg-0")


def test_sigterm_stops_an_aggregator_with_status_0(cluster: LocalCluster) -> None:
    aggregator = cluster.infrastructure("agg-0")
    started = time.monotonic()
    aggregator.send_signal(signal.SIGTERM)
    assert aggregator.wait(10) == 0 and time.monotonic() - started < 10


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_rendezvous_and_an_aggregator_with_status_0(
    cluster: LocalCluster, sig: signal.Signals
) -> None:
    started = time.monotonic()
    for name in ("rendezvous", "agg-0"):
        cluster.infrastructure(name).send_signal(sig)
    assert [cluster.infrastructure(n).wait(10) for n in ("rendezvous", "agg-0")] == [0, 0]
    assert time.monotonic() - started < 10
    assert "Traceback" not in cluster.log("rendezvous") + cluster.log("agg-0")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])  # SIGINT: Ctrl-C
def test_a_signal_on_an_endpoint_leaves_the_group_and_the_other_rank_is_told(
    cluster: LocalCluster, tmp_path: Path, sig: signal.Signals
) -> None:
    cluster.spec = dataclasses.replace(cluster.spec, rounds=10_000)
    ranks = [cluster.start_endpoint(i, tmp_path / f"r{i}.json") for i in range(2)]
    _wait_for(lambda: "round 2/" in cluster.log("ep-1"), 60, "rank 1 runs its rounds")
    started = time.monotonic()
    ranks[1].send_signal(sig)
    assert ranks[1].wait(10) == 0 and time.monotonic() - started < 10
    assert ranks[0].wait(20) != 0  # its collective failed, naming rank 1, instead of hanging
    assert "PEER_LOST" in cluster.log("ep-0") and "ranks {1} left" in cluster.log("ep-0")
