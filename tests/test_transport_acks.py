"""When a CCO connection acknowledges: with data, after two packets, or after ACK_DELAY.

Two :class:`CcoQuicConnection` objects talk sans-I/O (datagrams handed across by
hand, the clock passed in), so every packet is visible: an ACK has reached the
sender once the sender's bytes in flight fall back to zero.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cco.transport.backend import Diagnostics, aioquic_configuration
from cco.transport.certs import create_dev_pki
from cco.transport.config import TransportConfig
from cco.transport.connection import ACK_DELAY, ACK_EVERY, CcoQuicConnection
from cco.wire.registries import Role

SERVER_ADDR = ("127.0.0.1", 4433)
CLIENT_ADDR = ("127.0.0.1", 5544)
STREAM = 2  # the client's first unidirectional stream
QUIC_BACKENDS = ("aioquic",)
"""The ACK policy tested here is our change to aioquic's; qh3 decides ACKs natively."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    create_dev_pki(directory, [("agg-1", Role.AGGREGATOR), ("ep-1", Role.ENDPOINT)])
    return directory


class Pair:
    """A client (``ep-1``) and a server (``agg-1``) connection with a shared clock."""

    def __init__(self, pki: Path) -> None:
        self.now = 1000.0

        def quic(node_id: str, is_client: bool, **kwargs: str | bytes) -> CcoQuicConnection:
            transport = TransportConfig.for_node(pki, node_id)
            configuration = aioquic_configuration(
                transport, is_client=is_client, diagnostics=Diagnostics(transport)
            )
            return CcoQuicConnection(
                configuration=configuration, receive_window=transport.receive_window, **kwargs
            )

        self.client = quic("ep-1", True, expected_node_id="agg-1")
        self.client.connect(SERVER_ADDR, now=self.now)
        first = self.client._peer_cid.cid  # the Initial's destination connection id
        self.server = quic("agg-1", False, original_destination_connection_id=first)
        for _ in range(10):
            if not self.deliver(self.client, self.server) + self.deliver(self.server, self.client):
                break
        assert self.client._handshake_complete and self.server._handshake_complete
        for _ in range(3):  # every handshake ACK is out and delivered
            self.advance(ACK_DELAY * 2)
            self.deliver(self.client, self.server)
            self.deliver(self.server, self.client)
        assert self.client.bytes_in_flight == self.server.bytes_in_flight == 0

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for connection in (self.client, self.server):
            timer = connection.get_timer()
            if timer is not None and timer <= self.now:
                connection.handle_timer(now=self.now)

    def deliver(self, sender: CcoQuicConnection, receiver: CcoQuicConnection) -> int:
        """Hand everything ``sender`` has ready to ``receiver``; the datagram count."""
        source = CLIENT_ADDR if sender is self.client else SERVER_ADDR
        datagrams = [data for data, _ in sender.datagrams_to_send(now=self.now)]
        for data in datagrams:
            receiver.receive_datagram(data, source, now=self.now)
        return len(datagrams)


def test_an_ack_rides_on_the_next_data_instead_of_a_packet_of_its_own(pki: Path) -> None:
    pair = Pair(pki)
    pair.client.send_stream_data(STREAM, b"contribution")
    assert pair.deliver(pair.client, pair.server) == 1
    pair.advance(ACK_DELAY / 4)
    assert pair.deliver(pair.server, pair.client) == 0  # no ACK-only packet: it waits
    assert pair.client.bytes_in_flight > 0

    pair.server.send_stream_data(3, b"result")  # the server's first unidirectional stream
    assert pair.deliver(pair.server, pair.client) == 1
    assert pair.client.bytes_in_flight == 0  # the result carried the ACK


def test_an_ack_leaves_at_once_after_enough_packets(pki: Path) -> None:
    pair = Pair(pki)
    for index in range(ACK_EVERY):
        pair.client.send_stream_data(STREAM, bytes([index]) * 100)
        assert pair.deliver(pair.client, pair.server) == 1
    assert pair.deliver(pair.server, pair.client) == 1  # an ACK, with no time passing
    assert pair.client.bytes_in_flight == 0


def test_a_lone_packet_is_acknowledged_after_the_ack_delay(pki: Path) -> None:
    pair = Pair(pki)
    pair.client.send_stream_data(STREAM, b"heartbeat")
    assert pair.deliver(pair.client, pair.server) == 1
    timer = pair.server.get_timer()
    assert timer is not None and timer == pytest.approx(pair.now + ACK_DELAY)
    pair.advance(ACK_DELAY * 0.9)
    assert pair.deliver(pair.server, pair.client) == 0
    pair.advance(ACK_DELAY * 0.1 + 1e-6)
    assert pair.deliver(pair.server, pair.client) == 1
    assert pair.client.bytes_in_flight == 0
