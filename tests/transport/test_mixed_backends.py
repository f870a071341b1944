"""A handshake between the two backends, sans I/O: an aioquic client, a qh3 server.

An aioquic client pads its Initial datagram with bytes after the packet, and qh3's
core credits only the packet against the server's amplification limit, so the
server's first flight outgrows its credit after one datagram (``qh3conn.py``, item
8).  Datagrams are handed across by hand on a simulated clock, timers run when due:
the handshake completes well before the first probe timeout (a third of a second at
the least, three initial RTTs) only if no datagram the server built was dropped on
the way out, since a lost one waits for that timeout.
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
from cco.transport.handshake import LocalIdentity
from cco.wire.registries import Role

SERVER_ADDR = ("127.0.0.1", 4433)
CLIENT_ADDR = ("127.0.0.1", 5544)
PROBE_TIMEOUT = 0.3
"""Seconds of simulated time before either side's first probe timeout can fire."""


def factory(pki: Path, node_id: str, role: Role, is_client: bool, backend: str) -> ConnectionFactory:
    transport = TransportConfig.for_node(pki, node_id, quic_backend=backend)
    diagnostics = Diagnostics(transport)
    return connection_factory(
        transport, LocalIdentity(node_id, role, CAPS), is_client=is_client, diagnostics=diagnostics
    )


def completed(connection: QuicLink, seen: list[events.QuicEvent]) -> bool:
    while (event := connection.next_event()) is not None:
        seen.append(event)
    return any(isinstance(event, events.HandshakeCompleted) for event in seen)


@pytest.mark.parametrize(("client_backend", "server_backend"), [("aioquic", "qh3"), ("qh3", "aioquic")])
def test_a_handshake_across_backends_needs_no_retransmission(
    pki: Path, client_backend: str, server_backend: str
) -> None:
    now = 1000.0
    client = factory(pki, "ep-1", Role.ENDPOINT, True, client_backend).client(expected_node_id="agg-1")
    client.connect(SERVER_ADDR, now=now)
    to_server = [data for data, _ in client.datagrams_to_send(now=now)]
    servers = factory(pki, "agg-1", Role.AGGREGATOR, False, server_backend)
    initial = pull_quic_header(Buffer(data=to_server[0]), host_cid_length=servers.connection_id_length)
    server = servers.server(initial.destination_cid)
    client_events: list[events.QuicEvent] = []
    server_events: list[events.QuicEvent] = []
    start = now
    while now - start < PROBE_TIMEOUT and not (
        completed(client, client_events) and completed(server, server_events)
    ):
        for data in to_server:
            server.receive_datagram(data, CLIENT_ADDR, now=now)
        to_client = [data for data, _ in server.datagrams_to_send(now=now)]
        for data in to_client:
            client.receive_datagram(data, SERVER_ADDR, now=now)
        to_server = [data for data, _ in client.datagrams_to_send(now=now)]
        if not to_server and not to_client:  # quiet: the next timer, as a link runs it
            timers = [t for t in (client.get_timer(), server.get_timer()) if t is not None]
            now = max(now, min(timers))
            for connection in (client, server):
                timer = connection.get_timer()
                if timer is not None and timer <= now:
                    connection.handle_timer(now)
            to_server = [data for data, _ in client.datagrams_to_send(now=now)]
    assert completed(client, client_events) and completed(server, server_events), (
        f"not done at {now - start} s"
    )
    assert client.peer_identity is not None and client.peer_identity.node_id == "agg-1"
    assert server.peer_identity is not None and server.peer_identity.node_id == "ep-1"
    assert client.termination is None and server.termination is None
