"""When a CCO connection acknowledges: with data, after two packets, or after ACK_DELAY.

Both backends keep the same policy: aioquic by our change to its connection
(``connection.py``, item 6), qh3 by holding back its native core's delayed ACK
(``qh3conn.py``, item 7).  Two connections of one backend talk sans-I/O (datagrams
handed across by hand, the clock passed in, timers run as the link runs them; the
``quic_backend`` fixture runs each test on both), so
every packet is visible: an ACK has reached the sender once the sender's bytes in
flight fall back to zero.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from aioquic.buffer import Buffer  # type: ignore[attr-defined]  # re-exported from _buffer
from aioquic.quic import events
from aioquic.quic.packet import pull_quic_header
from transport_rig import CAPS

from cco.transport.backend import ConnectionFactory, Diagnostics, QuicLink, connection_factory
from cco.transport.config import TransportConfig
from cco.transport.connection import ACK_DELAY, ACK_EVERY
from cco.transport.handshake import LocalIdentity
from cco.transport.qh3conn import QH3_ACK_TIMER
from cco.wire.registries import Role

pytestmark = pytest.mark.quic_backends()

SERVER_ADDR = ("127.0.0.1", 4433)
CLIENT_ADDR = ("127.0.0.1", 5544)
STREAM = 2  # the client's first unidirectional stream
SERVER_STREAM = 3  # the server's


class Pair:
    """A client (``ep-1``) and a server (``agg-1``) connection with a shared clock."""

    def __init__(self, pki: Path, quic_backend: str) -> None:
        self.now = 1000.0
        self.received: list[bytes] = []  # stream data either side took, in order

        def factory(node_id: str, role: Role, is_client: bool) -> ConnectionFactory:
            transport = TransportConfig.for_node(pki, node_id, quic_backend=quic_backend)
            local = LocalIdentity(node_id, role, CAPS)
            diagnostics = Diagnostics(transport)
            return connection_factory(transport, local, is_client=is_client, diagnostics=diagnostics)

        self.client: QuicLink = factory("ep-1", Role.ENDPOINT, True).client(expected_node_id="agg-1")
        self.client.connect(SERVER_ADDR, now=self.now)
        first = [data for data, _ in self.client.datagrams_to_send(now=self.now)]
        servers = factory("agg-1", Role.AGGREGATOR, False)
        initial = pull_quic_header(Buffer(data=first[0]), host_cid_length=servers.connection_id_length)
        self.server: QuicLink = servers.server(initial.destination_cid)
        for data in first:
            self.server.receive_datagram(data, CLIENT_ADDR, now=self.now)
        for _ in range(10):
            if not self.deliver(self.server, self.client) + self.deliver(self.client, self.server):
                break
        for _ in range(3):  # every handshake ACK is out and delivered
            self.advance(ACK_DELAY * 2)
            self.deliver(self.client, self.server)
            self.deliver(self.server, self.client)
        assert self.client.peer_identity is not None and self.server.peer_identity is not None
        assert self.client.bytes_in_flight == self.server.bytes_in_flight == 0

    def advance(self, seconds: float) -> None:
        """Move the clock, running each connection's due timers as the link does."""
        self.now += seconds
        for connection in (self.client, self.server):
            for _ in range(10):
                timer = connection.get_timer()
                if timer is None or timer > self.now:
                    break
                connection.handle_timer(now=self.now)

    def deliver(self, sender: QuicLink, receiver: QuicLink) -> int:
        """Hand everything ``sender`` has ready to ``receiver``; the datagram count."""
        source = CLIENT_ADDR if sender is self.client else SERVER_ADDR
        datagrams = [data for data, _ in sender.datagrams_to_send(now=self.now)]
        for data in datagrams:
            receiver.receive_datagram(data, source, now=self.now)
        while (event := receiver.next_event()) is not None:  # as the link takes them
            if isinstance(event, events.StreamDataReceived):
                self.received.append(event.data)
        return len(datagrams)


def test_an_ack_rides_on_the_next_data_instead_of_a_packet_of_its_own(pki: Path, quic_backend: str) -> None:
    pair = Pair(pki, quic_backend)
    pair.client.send_stream_data(STREAM, b"contribution")
    assert pair.deliver(pair.client, pair.server) == 1
    pair.advance(ACK_DELAY / 4)
    assert pair.deliver(pair.server, pair.client) == 0  # no ACK-only packet: it waits
    assert pair.client.bytes_in_flight > 0

    pair.server.send_stream_data(SERVER_STREAM, b"result")
    assert pair.deliver(pair.server, pair.client) == 1
    assert pair.client.bytes_in_flight == 0  # the result carried the ACK


def test_data_sent_before_the_ack_timer_runs_carries_the_ack(pki: Path, quic_backend: str) -> None:
    """The request-and-answer pace of an 8-byte all-reduce: a result sent within
    qh3's 1 ms of its contribution carries the ACK, so none is owed afterwards and
    the next contribution is answered by nothing (qh3's core writes ACK frames only
    once its timer made them due; without the ACK made due with the data, it left
    alone, after the next contribution arrived)."""
    pair = Pair(pki, quic_backend)
    pair.client.send_stream_data(STREAM, b"contribution")
    assert pair.deliver(pair.client, pair.server) == 1
    pair.advance(QH3_ACK_TIMER / 4)
    pair.server.send_stream_data(SERVER_STREAM, b"result")
    assert pair.deliver(pair.server, pair.client) == 1
    assert pair.client.bytes_in_flight == 0  # the result carried the ACK

    pair.advance(QH3_ACK_TIMER * 2)  # past the ACK timer the contribution started
    pair.client.send_stream_data(STREAM, b"next contribution")
    assert pair.deliver(pair.client, pair.server) == 1
    assert pair.deliver(pair.server, pair.client) == 0  # no ACK-only packet in answer
    pair.server.send_stream_data(SERVER_STREAM, b"next result")
    assert pair.deliver(pair.server, pair.client) == 1
    assert pair.client.bytes_in_flight == 0
    assert pair.received[-4:] == [b"contribution", b"result", b"next contribution", b"next result"]


def test_an_ack_leaves_at_once_after_enough_packets(pki: Path, quic_backend: str) -> None:
    pair = Pair(pki, quic_backend)
    for index in range(ACK_EVERY):
        pair.client.send_stream_data(STREAM, bytes([index]) * 100)
        assert pair.deliver(pair.client, pair.server) == 1
    assert pair.deliver(pair.server, pair.client) == 1  # an ACK, with no time passing
    assert pair.client.bytes_in_flight == 0


def test_a_lone_packet_is_acknowledged_after_the_ack_delay(pki: Path, quic_backend: str) -> None:
    pair = Pair(pki, quic_backend)
    pair.client.send_stream_data(STREAM, b"heartbeat")
    assert pair.deliver(pair.client, pair.server) == 1
    pair.advance(ACK_DELAY * 0.9)
    assert pair.deliver(pair.server, pair.client) == 0
    timer = pair.server.get_timer()
    assert timer is not None and timer == pytest.approx(pair.now + ACK_DELAY * 0.1)
    pair.advance(ACK_DELAY * 0.1 + 1e-6)
    assert pair.deliver(pair.server, pair.client) == 1
    assert pair.client.bytes_in_flight == 0


def test_data_queued_while_an_ack_waits_leaves_at_once(pki: Path, quic_backend: str) -> None:
    """A held ACK never holds data back, whichever comes first: the data written
    before the ACK timer runs, or after it."""
    pair = Pair(pki, quic_backend)
    pair.client.send_stream_data(STREAM, b"contribution")
    assert pair.deliver(pair.client, pair.server) == 1
    pair.server.send_stream_data(SERVER_STREAM, b"result")  # queued, not yet sent
    pair.advance(ACK_DELAY / 2)  # the ACK timer runs with the result still queued
    assert pair.deliver(pair.server, pair.client) == 1
    assert pair.client.bytes_in_flight == 0

    pair.client.send_stream_data(STREAM, b"contribution")
    assert pair.deliver(pair.client, pair.server) == 1
    pair.advance(ACK_DELAY / 2)  # the ACK is held ...
    pair.server.send_stream_data(SERVER_STREAM, b"result")  # ... and data comes after
    assert pair.deliver(pair.server, pair.client) == 1
    assert pair.client.bytes_in_flight == 0


def test_qh3_acks_a_lone_packet_after_the_delay_the_hold_assumes(pki: Path) -> None:
    """ACK_HOLD is ACK_DELAY less qh3's own ACK timer: if a qh3 release changed that
    timer, the hold would no longer end ACK_DELAY after the packet."""
    pair = Pair(pki, "qh3")
    pair.client.send_stream_data(STREAM, b"heartbeat")
    assert pair.deliver(pair.client, pair.server) == 1
    core = pair.server._native._core  # type: ignore[attr-defined]
    kind, at = core.get_timer()
    assert kind == "ack_application" and at == pytest.approx(pair.now + QH3_ACK_TIMER)


def test_a_retransmission_due_with_the_ack_timer_is_not_held(pki: Path, quic_backend: str) -> None:
    """When loss recovery comes due in the same timer run as the ACK, both leave."""
    pair = Pair(pki, quic_backend)
    pair.server.send_stream_data(SERVER_STREAM, b"lost")
    assert len(pair.server.datagrams_to_send(now=pair.now)) == 1  # and dropped
    probe_at = pair.server.get_timer()
    assert probe_at is not None
    pair.client.send_stream_data(STREAM, b"contribution")
    assert pair.deliver(pair.client, pair.server) == 1
    pair.advance(probe_at - pair.now + 1e-4)  # the ACK and the probe are due together
    assert pair.deliver(pair.server, pair.client) >= 1
    assert pair.received[-1] == b"lost"
    assert pair.client.bytes_in_flight == 0


def test_loss_recovery_runs_on_time_while_an_ack_is_held(pki: Path, quic_backend: str) -> None:
    pair = Pair(pki, quic_backend)
    pair.server.send_stream_data(SERVER_STREAM, b"lost")
    assert len(pair.server.datagrams_to_send(now=pair.now)) == 1  # and dropped
    probe_at = pair.server.get_timer()
    assert probe_at is not None and probe_at - pair.now > ACK_DELAY
    pair.client.send_stream_data(STREAM, b"contribution")
    assert pair.deliver(pair.client, pair.server) == 1
    pair.advance(ACK_DELAY / 2)
    assert pair.deliver(pair.server, pair.client) == 0  # the ACK waits
    pair.advance(probe_at - pair.now + 1e-4)
    assert pair.deliver(pair.server, pair.client) >= 1
    assert pair.received[-1] == b"lost"
