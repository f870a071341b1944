"""A peer whose port is closed: ICMP reports read from the socket, believed only when
they keep coming, and a link that ends with PEER_LOST long before any timeout."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path

import pytest
from transport_rig import CAPS

from cco.transport import LocalIdentity, PeerLink, TransportConfig, connect, serve
from cco.transport.link import LinkProtocol
from cco.transport.udp import BatchedUdpTransport, SegmentedDatagramProtocol
from cco.transport.unreachable import (
    CONFIRM_SPAN,
    FORGET_AFTER,
    MAX_SUSPECTS,
    UnreachableTracker,
    drain_error_queue,
    enable_error_queue,
)
from cco.wire.errors import ErrorCode
from cco.wire.messages import Heartbeat
from cco.wire.registries import Role

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="IP_RECVERR is Linux's")

PEER = ("192.0.2.7", 4433)


def test_one_report_or_a_quick_burst_proves_nothing() -> None:
    tracker = UnreachableTracker()
    assert not tracker.report(PEER, 10.0)
    for i in range(10):  # a burst: many reports, but not for long
        assert not tracker.report(PEER, 10.0 + i * (CONFIRM_SPAN / 20))
    assert tracker.report(PEER, 10.0 + CONFIRM_SPAN)
    assert not tracker.suspects  # confirmed and forgotten: the next verdict needs new reports


def test_reports_must_be_several_and_keep_coming() -> None:
    tracker = UnreachableTracker()
    assert not tracker.report(PEER, 0.0)
    assert not tracker.report(PEER, 5.0)  # two reports, five seconds apart: still too few
    assert tracker.report(PEER, 5.1)  # a third, five seconds after the first
    tracker = UnreachableTracker()
    tracker.report(PEER, 0.0)
    tracker.report(PEER, 0.1)
    assert not tracker.report(PEER, FORGET_AFTER + 1)  # the old ones no longer count
    assert tracker.suspects[PEER] == (FORGET_AFTER + 1, 1)


def test_a_datagram_from_the_peer_clears_the_suspicion() -> None:
    tracker = UnreachableTracker()
    tracker.report(PEER, 0.0)
    tracker.report(PEER, 0.2)
    tracker.heard(PEER)
    assert not tracker.report(PEER, 0.4)  # counting again from here


def test_another_address_is_not_the_peer_and_memory_is_bounded() -> None:
    tracker = UnreachableTracker()
    for i in range(MAX_SUSPECTS + 50):
        tracker.report(("192.0.2.8", 1000 + i), 0.0)
    assert len(tracker.suspects) == MAX_SUSPECTS
    assert ("192.0.2.8", 1000) not in tracker.suspects  # the oldest went first
    assert PEER not in tracker.suspects


@linux_only
def test_the_error_queue_names_the_closed_port() -> None:
    closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    closed.bind(("127.0.0.1", 0))
    address = closed.getsockname()
    closed.close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        assert enable_error_queue(sock)
        sock.sendto(b"x", address)
        deadline = time.monotonic() + 5
        reports: list[tuple[str, int]] = []
        while not reports and time.monotonic() < deadline:
            time.sleep(0.01)
            reports = drain_error_queue(sock)
        assert reports == [address]
        assert drain_error_queue(sock) == []


class _Recorder(SegmentedDatagramProtocol):
    def __init__(self) -> None:
        self.reports: list[tuple[str, int]] = []
        self.datagrams: list[bytes] = []

    def ports_unreachable(self, addrs: list[tuple[str, int]]) -> None:
        self.reports += addrs

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        self.datagrams.append(data)


@linux_only
def test_the_transport_reports_closed_ports_and_keeps_sending_and_receiving() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        closed.bind(("127.0.0.1", 0))
        gone = closed.getsockname()
        closed.close()
        listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        listener.bind(("127.0.0.1", 0))
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        recorder = _Recorder()
        transport = BatchedUdpTransport(loop, sock, recorder)
        try:
            for _ in range(3):
                transport.sendto(b"to a closed port", gone)
                await asyncio.sleep(0.05)
                transport.sendto(b"to a live one", listener.getsockname())  # not refused for the other
            listener.sendto(b"back", sock.getsockname())
            deadline = time.monotonic() + 5
            while (len(recorder.reports) < 3 or not recorder.datagrams) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert set(recorder.reports) == {gone} and len(recorder.reports) >= 3
            assert recorder.datagrams == [b"back"]
            listener.settimeout(1)
            assert [listener.recv(100) for _ in range(3)] == [b"to a live one"] * 3
        finally:
            transport.close()
            listener.close()
            await asyncio.sleep(0)

    asyncio.run(scenario())


@linux_only
def test_a_link_whose_peer_vanished_ends_with_peer_lost_within_a_second_or_so(pki: Path) -> None:
    """The client's socket closes without a QUIC close (its process died): the server's
    link, still sending, learns it from ICMP long before its idle timeout (60 s here)."""

    async def scenario() -> None:
        accepted: asyncio.Queue[PeerLink] = asyncio.Queue()
        config = TransportConfig.for_node(pki, "agg-1", idle_timeout=60.0)
        server = await serve(
            "127.0.0.1", 0, config, LocalIdentity("agg-1", Role.AGGREGATOR, CAPS), accepted.put_nowait
        )
        try:
            host, port = server.address
            link = await connect(
                host,
                port,
                TransportConfig.for_node(pki, "ep-1", idle_timeout=60.0),
                LocalIdentity("ep-1", Role.ENDPOINT, CAPS),
                "agg-1",
                timeout=10,
            )
            peer = await asyncio.wait_for(accepted.get(), 10)
            client: LinkProtocol = link._protocol
            udp = client._transport
            assert isinstance(udp, BatchedUdpTransport)
            udp.get_extra_info("socket").close()  # gone, as a killed process's socket is
            start = time.monotonic()
            seq = 0
            while peer.close_reason is None:
                assert time.monotonic() - start < 20, "no verdict long after the port closed"
                seq += 1
                peer.send(Heartbeat(seq=seq))
                await asyncio.sleep(0.05)
            code, detail = peer.close_reason
            assert code is ErrorCode.PEER_LOST and "unreachable" in detail, detail
        finally:
            await server.close()

    asyncio.run(scenario())


def test_reports_about_a_live_peer_do_not_end_its_link(pki: Path) -> None:
    """Forged reports naming a live peer: it keeps talking, so the suspicion never ripens."""

    async def scenario() -> None:
        accepted: asyncio.Queue[PeerLink] = asyncio.Queue()
        server = await serve(
            "127.0.0.1",
            0,
            TransportConfig.for_node(pki, "agg-1"),
            LocalIdentity("agg-1", Role.AGGREGATOR, CAPS),
            accepted.put_nowait,
        )
        try:
            host, port = server.address
            link = await connect(
                host,
                port,
                TransportConfig.for_node(pki, "ep-1"),
                LocalIdentity("ep-1", Role.ENDPOINT, CAPS),
                "agg-1",
                timeout=10,
            )
            peer = await asyncio.wait_for(accepted.get(), 10)
            address = peer._protocol.peer
            assert address is not None
            for seq in range(20):
                server.ports_unreachable([address])  # forged: the peer is alive
                link.send(Heartbeat(seq=seq))
                assert await asyncio.wait_for(peer.receive(), 5) == Heartbeat(seq=seq)
                await asyncio.sleep(CONFIRM_SPAN / 5)
            assert peer.close_reason is None
            link.close()
        finally:
            await server.close()

    asyncio.run(scenario())
