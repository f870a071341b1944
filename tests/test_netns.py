"""The namespace testbed stays working: a verified all-reduce across a shaped star.

Four endpoint namespaces, a hub namespace routing between them and hosting the
rendezvous and the aggregator, veth links at MTU 9000 shaped with tbf each way; real
``cco-node`` processes do two rounds of a 64 KiB float32 all-reduce.  Every rank must
finish (an endpoint exits non-zero if any result fails verification), report the same
digest for each round, and its bytes must have crossed its own shaped link both ways.
Skipped, with the reason, where network namespaces are not permitted.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import netns  # benchmarks/ is not a package: found through the path set above

REASON = netns.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"namespace testbed unavailable: {REASON}")

ENDPOINTS = 4
ELEMENTS = 16384  # 64 KiB of float32 per rank
ROUNDS = 2


def test_tbf_sizes_pass_jumbo_frames_and_queue_bursts() -> None:
    burst, limit = netns.tbf_sizes(40e6, 9000)
    assert burst >= 2 * (9000 + netns.ETHERNET_HEADER)
    assert limit >= 32 * (9000 + netns.ETHERNET_HEADER)
    assert netns.tbf_sizes(1e9, 1500)[0] == 250_000  # 2 ms at 1 Gbit/s
    assert netns.quic_datagram_size(9000) == 8952
    assert netns.quic_datagram_size(1500) == 1452
    with pytest.raises(ValueError):
        netns.tbf_sizes(0, 1500)


@pytest.mark.timeout(120)
def test_allreduce_across_the_star(tmp_path: Path) -> None:
    spec = netns.StarSpec(endpoints=ENDPOINTS, rate_mbit=100, mtu=9000, base="ccotest")
    settings = netns.CcoSettings(max_datagram_size=netns.quic_datagram_size(spec.mtu))
    with netns.Star(spec) as star:
        names = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
        assert {star.hub_ns, *star.endpoint_ns} <= names
        with netns.CcoCluster(star, tmp_path, ENDPOINTS, settings) as cluster:
            cluster.start()
            run = cluster.run(ELEMENTS, ROUNDS, timeout=60)
            stats = star.link_stats()
            for i in range(ENDPOINTS):
                assert cluster.log(f"run1-ep-{i}").count("verified") == ROUNDS
    assert not set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()) & {
        star.hub_ns,
        *star.endpoint_ns,
    }
    assert [report["rank"] for report in run.reports] == list(range(ENDPOINTS))
    assert all(len(report["rounds"]) == ROUNDS for report in run.reports)
    assert all(r["bytes"] == ELEMENTS * 4 for report in run.reports for r in report["rounds"])
    assert run.bit_identical()
    for link in stats:  # each rank's contribution went up and the result came down its link
        assert link["up_bytes"] > ROUNDS * ELEMENTS * 4
        assert link["down_bytes"] > ROUNDS * ELEMENTS * 4


def test_leftovers_of_a_dead_owner_are_removed() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    name = f"ccotest-{dead.pid}-hub"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in netns.remove_leftovers("ccotest")
        assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
