"""Opening links: :func:`serve` accepts CCO connections, :func:`connect` makes one.

The server is our own small UDP demultiplexer rather than aioquic's ``QuicServer``,
because that class constructs a plain ``QuicConnection`` itself and we need our
own (client certificates, bounded credit; either backend, see
:mod:`cco.transport.backend`) on every connection.  It does what any QUIC server
must: route datagrams by destination connection id, answer unknown versions with
Version Negotiation (RFC 9000, section 6), and start a connection only for a
client Initial in a datagram of at least 1200 bytes (section 14.1).  Past a number
of half-open connections it validates clients' addresses with Retry before it
starts one, caps them, and drops those whose handshake takes too long
(:mod:`cco.transport.admission`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import cast

from aioquic.buffer import Buffer  # type: ignore[attr-defined]  # re-exported from _buffer
from aioquic.quic.packet import (
    QuicHeader,
    QuicPacketType,
    encode_quic_retry,
    encode_quic_version_negotiation,
    pull_quic_header,
)

from cco.transport.admission import RetryTokens
from cco.transport.backend import ConnectionFactory, Diagnostics, connection_factory
from cco.transport.config import MIN_DATAGRAM_SIZE, TransportConfig
from cco.transport.handshake import LocalIdentity
from cco.transport.link import LinkProtocol
from cco.transport.peerlink import PeerLink
from cco.transport.streams import UnfinishedFrames
from cco.transport.udp import SegmentedDatagramProtocol, open_udp
from cco.wire.errors import CcoError, ErrorCode

logger = logging.getLogger(__name__)

ConnectionHandler = Callable[[PeerLink], Awaitable[None] | None]

_CLOSE_GRACE = 3.0
"""Seconds :meth:`Server.close` waits for connections to finish their closing period."""


class Server(SegmentedDatagramProtocol):
    """Accepts CCO connections on one UDP socket; create it with :func:`serve`."""

    def __init__(
        self,
        config: TransportConfig,
        local: LocalIdentity,
        on_connection: ConnectionHandler,
        factory: ConnectionFactory,
        diagnostics: Diagnostics,
    ) -> None:
        self._config = config
        self._local = local
        self._on_connection = on_connection
        self._factory = factory
        self._diagnostics = diagnostics
        self._transport: asyncio.DatagramTransport | None = None
        self._routes: dict[bytes, LinkProtocol] = {}
        self._cids: dict[LinkProtocol, set[bytes]] = {}  # each connection's routes, to forget them
        self._protocols: set[LinkProtocol] = set()
        self._half_open: set[LinkProtocol] = set()  # started, QUIC handshake not complete
        self._tokens = RetryTokens()
        self.refused_initials = 0  # Initials that started no connection (Retry sent, or dropped)
        self._unfinished = UnfinishedFrames(config.unfinished_bytes)  # shared by every accepted link
        self._handlers: set[asyncio.Task[None]] = set()
        self._closing = False
        self.on_connection_ended: Callable[[], None] = lambda: None
        """Called whenever a connection has terminated and its memory is released."""

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) the server is bound to (the real port when 0 was asked for)."""
        assert self._transport is not None
        host, port = self._transport.get_extra_info("sockname")[:2]
        return host, port

    @property
    def links(self) -> list[PeerLink]:
        """Currently open sessions."""
        return [p.opened.result() for p in self._protocols if p.opened.done() and not p.opened.exception()]

    async def close(self) -> None:
        """Close every connection with SHUTTING_DOWN, stop handlers, release the socket."""
        self._closing = True
        for task in self._handlers:
            task.cancel()
        # Keep the socket until every connection has ended its closing (or draining)
        # period: CONNECTION_CLOSE may need repeating, and qlog traces are written then.
        protocols = list(self._protocols)
        for protocol in protocols:
            protocol.fail(ErrorCode.SHUTTING_DOWN, "server shutting down")
        if protocols:
            await asyncio.wait(
                [asyncio.ensure_future(p.wait_terminated()) for p in protocols], timeout=_CLOSE_GRACE
            )
        if self._handlers:
            await asyncio.wait(self._handlers)
        if self._transport is not None:
            self._transport.close()
        self._diagnostics.close()

    # asyncio.DatagramProtocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        assert self._transport is not None
        if data and not data[0] & 0x80:
            # A short header (RFC 9000, section 17.3): nothing but our own connection
            # ID after the first byte.  Nearly every datagram of a running link; no
            # need to parse the whole header to route it.
            known = self._routes.get(data[1 : 1 + self._factory.connection_id_length])
            if known is not None:
                known.datagram_received(data, addr)
                return
        try:
            header = pull_quic_header(Buffer(data=data), host_cid_length=self._factory.connection_id_length)
        except ValueError:
            return
        if (
            header.packet_type != QuicPacketType.VERSION_NEGOTIATION
            and header.version is not None
            and header.version not in self._factory.supported_versions
        ):
            self._transport.sendto(
                encode_quic_version_negotiation(
                    source_cid=header.destination_cid,
                    destination_cid=header.source_cid,
                    supported_versions=self._factory.supported_versions,
                ),
                addr,
            )
            return
        protocol = self._routes.get(header.destination_cid)
        if protocol is None:
            if self._closing or header.packet_type != QuicPacketType.INITIAL or len(data) < MIN_DATAGRAM_SIZE:
                return
            protocol = self._admit(header, addr)
            if protocol is None:
                self.refused_initials += 1
                return
        protocol.datagram_received(data, addr)

    def ports_unreachable(self, addrs: list[tuple[str, int]]) -> None:
        """ICMP reports about datagrams sent to ``addrs``: each to the links with that peer,
        which decide whether to believe them."""
        for protocol in list(self._protocols):
            mine = [addr for addr in addrs if addr == protocol.peer]
            if mine:
                protocol.ports_unreachable(mine)

    def segments_received(self, data: bytes, segment_size: int, addr: tuple[str | object, ...]) -> None:
        """A run of datagrams from one address: whole to its link when every one of
        them has a short header naming the same known connection ID (the usual run
        of a busy link), otherwise one by one."""
        length = self._factory.connection_id_length
        cid = data[1 : 1 + length]
        known = self._routes.get(cid) if not data[0] & 0x80 else None
        if known is not None and all(
            not data[start] & 0x80 and data[start + 1 : start + 1 + length] == cid
            for start in range(segment_size, len(data), segment_size)
        ):
            known.segments_received(data, segment_size, addr)
            return
        super().segments_received(data, segment_size, addr)

    def _admit(self, header: QuicHeader, addr: tuple[str | object, ...]) -> LinkProtocol | None:
        """The connection a client Initial starts, or None: a Retry went back instead
        (many connections are half-open and this one brought no token), or it was
        dropped (too many half-open, or a token that is not good)."""
        config = self._config
        if len(self._half_open) >= config.max_half_open:
            return None
        if header.token:
            original_cid = self._tokens.check(header.token, addr, header.destination_cid)
            if original_cid is None:
                return None
            return self._accept(original_cid, addr, retry_cid=header.destination_cid)
        if len(self._half_open) >= config.retry_threshold:
            assert self._transport is not None and header.version is not None
            retry_cid = os.urandom(self._factory.connection_id_length)
            retry = encode_quic_retry(
                version=header.version,
                source_cid=retry_cid,
                destination_cid=header.source_cid,
                original_destination_cid=header.destination_cid,
                retry_token=self._tokens.issue(addr, header.destination_cid, retry_cid),
            )
            self._transport.sendto(retry, addr)
            return None
        return self._accept(header.destination_cid, addr)

    def _accept(
        self, original_cid: bytes, addr: tuple[str | object, ...], retry_cid: bytes | None = None
    ) -> LinkProtocol:
        """A new connection for a client Initial whose first destination connection id
        was ``original_cid`` (``retry_cid``: the one a Retry gave it, which it now uses)."""
        quic = self._factory.server(original_cid, retry_cid)
        protocol = LinkProtocol(quic, config=self._config, local=self._local, unfinished=self._unfinished)
        protocol.connection_made(cast(asyncio.BaseTransport, self._transport))
        protocol._connection_id_issued_handler = lambda cid: self._route(cid, protocol)
        protocol._connection_id_retired_handler = lambda cid: self._unroute(cid)
        protocol.add_termination_callback(lambda: self._forget(protocol))
        protocol.opened.add_done_callback(self._on_opened)
        self._cids[protocol] = set()
        self._route(retry_cid or original_cid, protocol)
        self._route(quic.host_cid, protocol)
        self._protocols.add(protocol)
        self._half_open.add(protocol)
        protocol.on_handshake = lambda: self._half_open.discard(protocol)
        timeout = self._config.handshake_timeout
        asyncio.get_running_loop().call_later(timeout, self._handshake_over, protocol, addr)
        return protocol

    def _handshake_over(self, protocol: LinkProtocol, addr: tuple[str | object, ...]) -> None:
        """Drop the connection if its handshake has not completed by now."""
        if protocol in self._half_open:
            logger.debug("dropping a connection from %s: no handshake within the timeout", addr)
            protocol.abandon(
                ErrorCode.TIMEOUT, f"limit handshake_timeout ({self._config.handshake_timeout:g} s) reached"
            )

    def _route(self, cid: bytes, protocol: LinkProtocol) -> None:
        self._routes[cid] = protocol
        self._cids[protocol].add(cid)

    def _unroute(self, cid: bytes) -> None:
        protocol = self._routes.pop(cid, None)
        if protocol is not None:
            self._cids[protocol].discard(cid)

    def _forget(self, protocol: LinkProtocol) -> None:
        self._protocols.discard(protocol)
        self._half_open.discard(protocol)
        for cid in self._cids.pop(protocol, ()):
            if self._routes.get(cid) is protocol:
                del self._routes[cid]
        self.on_connection_ended()

    def _on_opened(self, opened: asyncio.Future[PeerLink]) -> None:
        if opened.cancelled() or opened.exception() is not None:
            return
        link = opened.result()
        try:
            result = self._on_connection(link)
        except Exception as exc:
            self._handler_failed(link, exc)
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self._handlers.add(task)
            task.add_done_callback(lambda t: self._handler_done(link, t))

    def _handler_done(self, link: PeerLink, task: asyncio.Task[None]) -> None:
        self._handlers.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._handler_failed(link, task.exception())

    def _handler_failed(self, link: PeerLink, exc: BaseException | None) -> None:
        logger.error("connection handler for %r failed", link, exc_info=exc)
        link.close(ErrorCode.INTERNAL_ERROR, "connection handler failed")


def size_socket_buffers(transport: asyncio.BaseTransport, size: int) -> None:
    """Ask for ``size``-byte kernel buffers on the UDP socket; best effort (capped by the kernel)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, size)


async def serve(
    host: str,
    port: int,
    config: TransportConfig,
    local: LocalIdentity,
    on_connection: ConnectionHandler,
) -> Server:
    """Accept CCO connections on ``host``:``port`` (0 picks a free port).

    ``on_connection`` is called with each :class:`PeerLink` once its session is
    open; if it returns an awaitable, that runs as a task, cancelled by
    :meth:`Server.close`.  A handler that raises closes its link with
    INTERNAL_ERROR, never the server.
    """
    diagnostics = Diagnostics(config)
    try:
        factory = connection_factory(config, local, is_client=False, diagnostics=diagnostics)
        server = Server(config, local, on_connection, factory, diagnostics)
        udp = await open_udp(server, host, port)
        size_socket_buffers(udp, config.socket_buffer)
    except BaseException:
        diagnostics.close()
        raise
    return server


async def connect(
    host: str,
    port: int,
    config: TransportConfig,
    local: LocalIdentity,
    expected_node_id: str,
    timeout: float = 10.0,
) -> PeerLink:
    """Open a CCO session with the node ``expected_node_id`` at ``host``:``port``.

    Raises :class:`~cco.wire.errors.CcoError`: ``TIMEOUT`` if TLS and Hello/HelloAck
    do not finish within ``timeout`` seconds, otherwise the reason the connection
    closed (e.g. ``UNAUTHORIZED`` for a certificate the server refused, or one not
    issued to ``expected_node_id``; ``UNSUPPORTED_VERSION``).
    """
    loop = asyncio.get_running_loop()
    family, _, _, _, address = (await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM))[0]
    diagnostics = Diagnostics(config)
    try:
        factory = connection_factory(config, local, is_client=True, diagnostics=diagnostics)
        quic = factory.client(expected_node_id)
        wildcard = "::" if family == socket.AF_INET6 else "0.0.0.0"
        protocol = LinkProtocol(quic, config=config, local=local)
        transport = await open_udp(protocol, wildcard, 0, family=family)
        size_socket_buffers(transport, config.socket_buffer)
    except BaseException:
        diagnostics.close()
        raise
    protocol.add_termination_callback(transport.close)
    protocol.add_termination_callback(diagnostics.close)
    protocol.connect(address)
    try:
        return await asyncio.wait_for(asyncio.shield(protocol.opened), timeout)
    except TimeoutError:
        detail = f"no session with {expected_node_id!r} at {host}:{port} within {timeout} s"
        protocol.fail(ErrorCode.TIMEOUT, detail)
        raise CcoError(ErrorCode.TIMEOUT, detail) from None
    except asyncio.CancelledError:
        protocol.fail(ErrorCode.ABORTED, "connect() was cancelled")
        raise
