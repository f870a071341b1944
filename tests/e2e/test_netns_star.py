"""The namespace testbed stays working: a verified all-reduce across a shaped star.

Four endpoint namespaces, a hub namespace routing between them and hosting the
rendezvous and the aggregator, veth links at MTU 9000 shaped with tbf each way; real
``cco-node`` processes do two rounds of a 64 KiB float32 all-reduce.  Every rank must
finish (an endpoint exits non-zero if any result fails verification), report the same
digest for each round, and its bytes must have crossed its own shaped link both ways.
The namespace tests are skipped, with the reason, where namespaces are not permitted;
the tbf sizing and the delay/loss relay are checked everywhere.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import netns  # benchmarks/support, on the suite's pythonpath (pyproject.toml)
import pytest
import relay
from proctree import sigterm_stops_everything

REASON = netns.unavailable_reason()
needs_namespaces = pytest.mark.skipif(REASON is not None, reason=f"namespace testbed unavailable: {REASON}")

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


def test_from_the_last_call_leaves_out_the_early_ranks_wait() -> None:
    # rank 0 called first and waited longest; rank 2 called last, at 11.0, and the
    # last result (rank 0's) came at 12.0
    assert netns.last_call_to_last_result([10.0, 10.5, 11.0], [2.0, 1.0, 0.4]) == pytest.approx(1.0)
    round_ = [{"started": t, "seconds": s} for t, s in ((5.0, 0.3), (5.2, 0.2))]
    run = netns.EndpointRun(
        reports=[{"rounds": [r]} for r in round_], wall_seconds=1.0, cpu_seconds=[0.1, 0.1]
    )
    assert run.from_last_call() == [pytest.approx(0.2)]
    assert run.round_seconds() == [0.3]


def test_the_usage_of_a_process_that_has_exited_is_a_value_error() -> None:
    # A node that died before the harness read its usage is a zombie until reaped: its
    # /proc status has no VmHWM, and closing the cluster must still stop the others.
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while "State:\tZ" not in Path(f"/proc/{process.pid}/status").read_text():
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.01)
        with pytest.raises(ValueError, match="has exited"):
            netns._proc_usage(process.pid)
    finally:
        process.wait()


@needs_namespaces
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
    for waited, slowest in zip(run.from_last_call(), run.round_seconds(), strict=True):
        assert 0 < waited <= slowest  # the ranks' "started" share one clock
    for link in stats:  # each rank's contribution went up and the result came down its link
        assert link["up_bytes"] > ROUNDS * ELEMENTS * 4
        assert link["down_bytes"] > ROUNDS * ELEMENTS * 4


@needs_namespaces
@pytest.mark.timeout(120)
def test_an_unshaped_star_with_gro_switched_carries_an_allreduce(tmp_path: Path) -> None:
    if shutil.which("ethtool") is None:
        pytest.skip("ethtool is not installed (apt-get install ethtool): veth GRO cannot be set")
    spec = netns.StarSpec(endpoints=2, rate_mbit=None, mtu=9000, gro=True, base="ccotest")
    settings = netns.CcoSettings(max_datagram_size=netns.quic_datagram_size(spec.mtu))
    with netns.Star(spec) as star:
        assert [star.gro_state(i) for i in range(2)] == [(True, True)] * 2
        assert star.link_stats() == [{key: 0 for key in star.link_stats()[0]}] * 2  # no tbf anywhere
        with netns.CcoCluster(star, tmp_path, 2, settings) as cluster:
            cluster.start()
            run = cluster.run(ELEMENTS, ROUNDS, timeout=60)
        star.set_gro(False)
        assert [star.gro_state(i) for i in range(2)] == [(False, False)] * 2
    assert run.bit_identical()
    cpu = run.rounds_cpu(1)  # the trace followed every node through the rounds
    assert cpu is not None
    aggregator, endpoints = cpu
    assert aggregator >= 0 and len(endpoints) == 2 and all(c >= 0 for c in endpoints)


def test_nodes_import_the_named_cco_not_the_callers_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started from a directory holding another ``cco`` (a checkout, in an A/B of two
    versions) and given a relative workdir, the nodes still import the cco that
    PYTHONPATH or the installation names: ``python -m`` would put the caller's
    directory first on sys.path."""
    decoy = tmp_path / "checkout" / "cco"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text('raise ImportError("the caller\'s checkout was imported")\n')
    monkeypatch.chdir(decoy.parent)
    settings = netns.CcoSettings(max_datagram_size=16000)
    with netns.CcoCluster(None, Path("work"), 1, settings) as cluster:
        cluster.start(timeout=30)  # both services reach "listening"
        assert cluster.workdir == decoy.parent / "work"


HARNESS = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import netns
settings = netns.CcoSettings(max_datagram_size=16000)
with netns.CcoCluster(None, Path(sys.argv[2]), 2, settings) as cluster:
    cluster.start(timeout=30)
    cluster.run(elements=2, rounds=100000, timeout=600)
"""


def test_a_harness_stopped_with_sigterm_stops_its_loopback_nodes(tmp_path: Path) -> None:
    """A benchmark on loopback killed by a timeout ended at once and left its nodes
    running (the namespace star already unwound on SIGTERM; the loopback cluster did
    not), and an endpoint it was waiting for outlived it too."""
    benchmarks = Path(netns.__file__).parent
    harness = subprocess.Popen(
        [sys.executable, "-c", HARNESS, str(benchmarks), str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    logs = [tmp_path / f"run1-ep-{i}.log" for i in range(2)]
    # the rendezvous, the aggregator and two endpoints, once the endpoints are at work
    sigterm_stops_everything(
        harness, lambda: all(log.exists() and "round 1/" in log.read_text() for log in logs), started=4
    )


@needs_namespaces
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


class _Echo(asyncio.DatagramProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.transport.sendto(data, addr)


async def _round_trip(profile: relay.Profile) -> tuple[float | None, relay.Counters]:
    """Send one datagram through a relay to an echo server; seconds until it returns."""
    loop = asyncio.get_running_loop()
    echo, _ = await loop.create_datagram_endpoint(_Echo, local_addr=("127.0.0.1", 0))
    target = echo.get_extra_info("sockname")[:2]
    port = netns._free_port()
    running = await relay.start(("127.0.0.1", port), target, profile)
    replies: asyncio.Queue[bytes] = asyncio.Queue()
    client, _ = await loop.create_datagram_endpoint(
        lambda: _Collect(replies), remote_addr=("127.0.0.1", port)
    )
    try:
        start = time.perf_counter()
        client.sendto(b"ping")
        try:
            assert await asyncio.wait_for(replies.get(), 2) == b"ping"
        except TimeoutError:
            return None, running.counters
        return time.perf_counter() - start, running.counters
    finally:
        client.close()
        running.close()
        echo.close()


class _Collect(asyncio.DatagramProtocol):
    def __init__(self, queue: asyncio.Queue[bytes]) -> None:
        self.queue = queue

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.queue.put_nowait(data)


def test_relay_adds_delay_each_way_and_drops() -> None:
    seconds, counters = asyncio.run(_round_trip(relay.Profile(delay_ms=40)))
    assert seconds is not None and seconds >= 0.080
    assert (counters.forwarded_up, counters.forwarded_down, counters.clients) == (1, 1, 1)
    seconds, counters = asyncio.run(_round_trip(relay.Profile(loss=1.0)))
    assert seconds is None
    assert (counters.forwarded_up, counters.dropped_up) == (0, 1)
