"""The floors that run.py prints beside the CPU-bound targets (benchmarks/support/barequic.py):
a bare QUIC stream with the CPU each side spent, the share of it a star can reach on a
given number of cores, and a star of round trips over CCO's transport.  Small runs on loopback, so the
harness keeps working; the figures themselves live in BENCHMARKS.md."""

from __future__ import annotations

import socket
from pathlib import Path

import barequic  # benchmarks/ is not a package: found through the path set above
import pytest
import run

from cco.transport.certs import create_dev_pki
from cco.wire.registries import Role


def _port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    create_dev_pki(tmp_path, [("agg-0", Role.AGGREGATOR)])
    return tmp_path


def test_the_star_bound_is_the_cpu_budget_of_twice_the_bytes() -> None:
    """A star moves N S up and N S down: at the stream's CPU per byte, two cores
    that the stream kept both busy reach half its goodput; a cheaper stream, more."""
    busy = barequic.StreamRun(nbytes=1000, seconds=1.0, sender_cpu=1.0, receiver_cpu=1.0)
    assert barequic.star_ingress_bound(busy, cores=2) == pytest.approx(0.5)
    assert barequic.star_ingress_bound(busy, cores=8) == pytest.approx(2.0)
    light = barequic.StreamRun(nbytes=1000, seconds=1.0, sender_cpu=0.5, receiver_cpu=0.5)
    assert barequic.star_ingress_bound(light, cores=2) == pytest.approx(1.0)


@pytest.mark.timeout(60)
def test_a_bare_stream_reports_its_bytes_and_both_sides_cpu(pki: Path) -> None:
    run = barequic.bare_stream(pki, 16000, 1 << 20, "qh3", _port())
    assert run.nbytes == 1 << 20 and run.seconds > 0 and run.goodput > 0
    assert run.sender_cpu > 0 and run.receiver_cpu > 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["qh3", "aioquic"])
def test_the_transport_star_answers_every_leaf_every_round(tmp_path: Path, backend: str) -> None:
    star = barequic.star_round_trips(
        tmp_path, leaves=2, rounds=20, datagram=16000, backend=backend, port=_port()
    )
    assert len(star["round_seconds"]) == 2 * 19  # the first round of each leaf waits for connections
    assert all(s > 0 for s in star["round_seconds"])
    assert star["leaf_cpu_per_round"] > 0 and star["hub_cpu_per_round"] > 0


def test_the_endpoints_bound_is_their_cpu_per_round_shared_by_the_cores() -> None:
    # four endpoints, 4 s of CPU each over a warm-up and one timed round: 8 s of CPU
    # per round, at least 4 s on 2 cores, for 4 x 100 MB of ingress: 100 MB/s
    entry = {"round_seconds": [5.0], "warmup_seconds": [6.0], "endpoint_cpu_seconds": [4.0] * 4}
    share, per_endpoint = run.endpoints_bound(entry, 100_000_000, cores=2, yardstick=200e6)
    assert share == pytest.approx(0.5) and per_endpoint == pytest.approx(2.0)
    share, _ = run.endpoints_bound(entry, 100_000_000, cores=4, yardstick=200e6)
    assert share == pytest.approx(1.0)
