"""Busy polling (:mod:`cco.services.polling`): when the selector polls, when it
sleeps, that it never keeps the loop's timers waiting, and nodes running with it."""

from __future__ import annotations

import asyncio
import json
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from logcheck import log_problems

from cco.localcluster import ClusterSpec, LocalCluster
from cco.services import polling
from cco.services.polling import MAX_BUSY_POLL_US, PollingSelector, event_loop_factory


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def gave_way(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When the selector yielded its core between polls (each a poll that found nothing)."""
    calls: list[float] = []
    real = polling.give_way

    def counted() -> None:
        calls.append(time.monotonic())
        real()

    monkeypatch.setattr(polling, "give_way", counted)
    return calls


def _watching(budget: float, sock: socket.socket) -> PollingSelector:
    selector = PollingSelector(budget)
    selector.register(sock, selectors.EVENT_READ)
    return selector


def _ready(ready: list[tuple[selectors.SelectorKey, int]]) -> list[object]:
    return [key.fileobj for key, _ in ready]


def test_a_datagram_already_waiting_is_returned_at_once(
    pair: tuple[socket.socket, socket.socket], gave_way: list[float]
) -> None:
    a, b = pair
    b.send(b"x")
    with _watching(1.0, a) as selector:
        assert _ready(selector.select(timeout=5)) == [a]
    assert gave_way == []


def test_a_datagram_arriving_while_it_polls_is_returned_by_the_polling(
    pair: tuple[socket.socket, socket.socket], gave_way: list[float]
) -> None:
    a, b = pair
    sender = threading.Timer(0.05, b.send, args=(b"x",))
    with _watching(1.0, a) as selector:
        start = time.monotonic()
        sender.start()
        ready = selector.select(timeout=None)
        elapsed = time.monotonic() - start
    sender.join()
    assert _ready(ready) == [a]
    assert gave_way, "it polled, yielding the core between polls, instead of sleeping"
    assert elapsed < 0.9, "found within the budget"


def test_polling_ends_with_the_loops_timeout(
    pair: tuple[socket.socket, socket.socket], gave_way: list[float]
) -> None:
    """A timer due within the budget is not kept waiting for it."""
    a, _ = pair
    with _watching(1.0, a) as selector:
        start = time.monotonic()
        assert selector.select(timeout=0.05) == []
        elapsed = time.monotonic() - start
    assert 0.05 <= elapsed < 0.9
    assert gave_way


def test_after_the_budget_it_sleeps_for_the_rest_of_the_timeout(
    pair: tuple[socket.socket, socket.socket], gave_way: list[float]
) -> None:
    a, _ = pair
    with _watching(0.02, a) as selector:
        start = time.monotonic()
        assert selector.select(timeout=0.3) == []
        elapsed = time.monotonic() - start
    assert elapsed >= 0.3
    assert gave_way and gave_way[-1] - start < 0.15, "it polled only at first, then slept"


def test_a_datagram_arriving_while_it_sleeps_wakes_it(
    pair: tuple[socket.socket, socket.socket], gave_way: list[float]
) -> None:
    a, b = pair
    sender = threading.Timer(0.2, b.send, args=(b"x",))
    with _watching(0.01, a) as selector:
        sender.start()
        ready = selector.select(timeout=None)
    sender.join()
    assert _ready(ready) == [a]
    assert gave_way[-1] < time.monotonic() - 0.05, "it was asleep when the datagram came"


def test_a_zero_timeout_only_looks(pair: tuple[socket.socket, socket.socket], gave_way: list[float]) -> None:
    a, _ = pair
    with _watching(1.0, a) as selector:
        assert selector.select(timeout=0) == []
    assert gave_way == []


@pytest.mark.parametrize("budget", [0.0, -0.001, MAX_BUSY_POLL_US / 1e6 + 1e-6])
def test_a_budget_outside_its_range_is_refused(budget: float) -> None:
    with pytest.raises(ValueError, match="busy-poll budget"):
        PollingSelector(budget)


@pytest.mark.parametrize("busy_poll_us", [-1, MAX_BUSY_POLL_US + 1])
def test_the_factory_refuses_a_budget_outside_its_range(busy_poll_us: int) -> None:
    with pytest.raises(ValueError, match="busy_poll_us"):
        event_loop_factory(busy_poll_us)


def test_no_budget_is_the_standard_event_loop() -> None:
    assert event_loop_factory(0) is asyncio.new_event_loop


def test_a_polling_loop_runs_datagrams_and_timers() -> None:
    """A UDP echo on loopback and a timer, on the loop a node gets with a budget."""

    class Echo(asyncio.DatagramProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.DatagramTransport, transport)

        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
            self.transport.sendto(data.upper(), addr)

    class Client(asyncio.DatagramProtocol):
        def __init__(self) -> None:
            self.answers: asyncio.Queue[bytes] = asyncio.Queue()

        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
            self.answers.put_nowait(data)

    async def main() -> tuple[list[bytes], float]:
        loop = asyncio.get_running_loop()
        server, _ = await loop.create_datagram_endpoint(Echo, local_addr=("127.0.0.1", 0))
        client, protocol = await loop.create_datagram_endpoint(
            Client, remote_addr=server.get_extra_info("sockname")
        )
        answers = []
        for word in (b"one", b"two", b"three"):
            client.sendto(word)
            answers.append(await asyncio.wait_for(protocol.answers.get(), 5))
        start = loop.time()
        await asyncio.sleep(0.05)  # a timer within the 0.5 s budget
        slept = loop.time() - start
        client.close()
        server.close()
        return answers, slept

    with asyncio.Runner(loop_factory=event_loop_factory(500_000)) as runner:
        answers, slept = runner.run(main())
        assert isinstance(runner.get_loop(), asyncio.SelectorEventLoop)
    assert answers == [b"ONE", b"TWO", b"THREE"]
    assert 0.05 <= slept < 0.45


def test_nodes_that_busy_poll_complete_verified_all_reduces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every node of a real cluster (rendezvous, aggregator, endpoints) started with
    ``CCO_BUSY_POLL_US``: they say so, and every rank gets the same verified results."""
    monkeypatch.setenv("CCO_BUSY_POLL_US", "2000")
    spec = ClusterSpec(aggregators=1, endpoints=3, rounds=20, elements=64, chunk_elements=64)
    with LocalCluster(spec, tmp_path) as cluster:
        cluster.start()
        files = cluster.run_endpoints(timeout=120)
    logs = sorted(tmp_path.glob("*.log"))
    assert log_problems(logs) == []
    assert all("event loop polls 2000 us before it sleeps" in path.read_text() for path in logs)
    digests = [[entry["sha256"] for entry in json.loads(path.read_text())["rounds"]] for path in files]
    assert len(digests) == 3 and len(digests[0]) == 20
    assert digests[0] == digests[1] == digests[2], "bit-identical results on every rank"
