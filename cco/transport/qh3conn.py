"""The qh3 backend: qh3's native QUIC core, authenticated with aioquic's TLS.

qh3 2.1 moves packets in Rust, several times cheaper per packet than aioquic, but
its TLS server cannot ask for a client certificate.  :class:`Qh3Connection` gives
link.py the same connection interface as :class:`~cco.transport.connection.
CcoQuicConnection` (see :class:`~cco.transport.backend.QuicLink`), built on:

1. **Client certificates.**  ``_Native._create_tls`` puts aioquic's TLS context
   (:class:`~cco.transport.qh3tls.AioquicTls`) behind qh3's TLS bridge, with the
   server requesting a client certificate; the peer is checked inside the
   handshake (:func:`~cco.transport.peercheck.verified_identity`) and a refusal
   closes the connection with CRYPTO_ERROR plus the alert before qh3 reports
   ``HandshakeCompleted``.
2. **Events.**  qh3's event classes mirror aioquic's field for field; they are
   handed out as aioquic's, so link.py and aioquic's asyncio protocol need no
   second set of ``isinstance`` checks.
3. **Bounded receive credit.**  The native core keeps a connection window of
   ``receive_window`` bytes beyond the stream data *Python has taken from it*:
   qh3 takes every event out of the core as soon as a datagram is processed, so
   credit would follow receipt and never wait for the application.  While
   :attr:`Qh3Connection.credit` is frozen, ``_Native`` leaves events inside the
   core instead, which holds MAX_DATA still; thawing takes them out again.  A
   connection that is closing is always drained, so a close is never missed.
4. **Send progress.**  qh3 reports the stream bytes not yet sent once
   (``get_send_buffer_size``) and the bytes in flight; ``stream_bytes_sent`` is our
   own count of bytes queued minus the unsent ones.
5. **The datagram size we take.**  qh3's client advertises ``max_udp_payload_size``
   1472 whatever its configuration, and a qh3 server keeps to what its peer
   advertises, so every Result left an aggregator in 1443-byte datagrams while the
   endpoints sent at the configured size (16000 on loopback, 8952 on jumbo
   frames).  :class:`_Bridge` advertises the configured ``max_datagram_size`` on
   both sides instead: what the node was set up to receive.
6. **Streams beyond the peer's limit wait.**  qh3 raises ``ValueError`` when data is
   written to a stream the peer does not allow yet (MAX_STREAMS); aioquic queues
   it.  Such writes wait here, in order, until the peer's limit covers the stream,
   as they would with aioquic (link.py relies on it: one stream per group).

7. **Fewer ACK-only packets.**  qh3's core acknowledges a lone ack-eliciting
   packet when a timer runs 1 ms after it arrives, and only then: until that
   timer has made the ACK due, packets it sends carry no ACK frame.  After two
   such packets it acknowledges at once.  The same policy as the aioquic backend
   (item 6 of connection.py) comes from two changes:

   * *Data carries what is owed.*  Stream data queued while the ACK timer is
     pending makes the ACK due at once (the core's timer run at its own
     deadline), so the packet carrying the data carries the ACK.  Without this a
     Result sent within 1 ms of its Contribution left without the ACK, the
     timer then made it due, and it left alone at the next poll, the one after
     the next datagram received: 1.6 ACK-only datagrams per round from the
     aggregator of an 8-byte all-reduce on loopback, each waking an endpoint.
   * *An ACK waits for data.*  When the timer fires with no data queued, the
     core is told (the ACK is then due) but not polled: the ACK leaves with the
     next packet the connection sends for any reason, or alone :data:`ACK_HOLD`
     later, so at most :data:`~cco.transport.connection.ACK_DELAY` after the
     packet, within the 25 ms ``max_ack_delay`` qh3 advertises.  Before this, a
     Contribution's Result or the next round's Contribution seldom came within
     1 ms, and an 8-byte all-reduce sent five ACK-only datagrams per round.

   The core's other timers (loss detection, pacing, idle) are never delayed:
   :meth:`Qh3Connection.get_timer` reports the earlier of the two.

8. **A first flight cut short by the amplification limit.**  Until a server has
   validated its client's address it may send at most three times the bytes it
   received (RFC 9000, section 8.1).  qh3's core credits the bytes of the packets
   it reads, not of the datagram: an aioquic client pads its Initial datagram with
   bytes *after* the packet, so of a 1452-byte datagram the core counts the
   507-byte packet.  Its first flight (ServerHello, then the Handshake packets
   with certificates) then outgrows the credit after one datagram, and instead of
   waiting for more, the core's packet builder fails with "packet builder capacity
   exhausted".  qh3's ``datagrams_to_send`` lets that error out and drops the
   datagram it had already built, which the core counts as sent: the handshake
   waited for the client's probe timeout, twice per connection (about 0.7 s), with
   an asyncio traceback each time.  :meth:`Qh3Connection.datagrams_to_send` polls
   the core itself and, before the handshake completes, keeps what the core built
   and stops there on that error: the rest leaves once the client's next datagram
   (its ACK) has raised the credit.

What qh3 decides natively and we leave to it: when an ACK is due at once, the send
buffer, and stream limits (a peer may open 100 bidirectional and 103
unidirectional streams, more as streams end; aioquic allows 128 of each).

Relies on qh3 internals (checked with 2.1.0, exercised by the transport tests run
with this backend): ``QuicConnection._create_tls``, ``_drain_core``, ``_core``,
``_handshake_complete``, ``_close_event``, ``_record_local_stream``,
``_log_packets``, ``_log_datagram``, ``_quic_logger``, ``_call_core``, ``_normalize_address``,
``QuicTlsBridge.tls``, the arguments
qh3's ``_create_tls`` gives the bridge, and the core's name for its delayed-ACK
timer (``"ack_application"``), its 1 ms delay, and that running it before its time
puts the ACK in the next packet (item 7; tests check all three); the core's
``poll_transmit`` and the text of its amplification failure (item 8); the core's
``receive_gro_buffer`` and ``receive_many_datagrams``, which qh3's methods of those
names call after logging each datagram.
"""

from __future__ import annotations

import ssl
from dataclasses import fields

from aioquic import tls as aio_tls
from aioquic.quic import events as aio_events
from cryptography import x509
from qh3._hazmat import Buffer, QuicConnectionCore
from qh3.quic import events as qh3_events
from qh3.quic.configuration import QuicConfiguration
from qh3.quic.connection import NetworkAddress, QuicConnection, QuicConnectionError
from qh3.quic.packet import QuicErrorCode, pull_quic_transport_parameters, push_quic_transport_parameters
from qh3.quic.tls_bridge import QuicTlsBridge

from cco.transport.certs import Credentials, NodeIdentity
from cco.transport.connection import ACK_DELAY
from cco.transport.pathstats import PathStats
from cco.transport.peercheck import verified_identity
from cco.transport.qh3tls import AioquicTls

_ENDING_STATES = frozenset({"closing", "draining", "terminated"})
"""Native core states in which held events are released (the connection is ending)."""

QH3_ACK_TIMER = 0.001
"""Seconds after a lone ack-eliciting packet at which qh3's core wants its ACK sent."""
ACK_HOLD = ACK_DELAY - QH3_ACK_TIMER
"""Seconds an ACK the core wants sent waits here for data to carry it (item 7)."""
_ACK_TIMER = "ack_application"
"""The kind qh3's core gives its delayed-ACK timer (``get_timer`` returns kind and time)."""
_BUILDER_EXHAUSTED = "packet builder capacity exhausted"
"""What qh3's core raises when its next packet does not fit the room it has (item 8)."""


_EventClass = type[qh3_events.QuicEvent]
_AIOQUIC_EVENTS: dict[_EventClass, tuple[type[aio_events.QuicEvent], tuple[str, ...]]] = {
    cls: (getattr(aio_events, cls.__name__), tuple(f.name for f in fields(cls)))
    for cls in (
        qh3_events.ConnectionIdIssued,
        qh3_events.ConnectionIdRetired,
        qh3_events.ConnectionTerminated,
        qh3_events.DatagramFrameReceived,
        qh3_events.HandshakeCompleted,
        qh3_events.PingAcknowledged,
        qh3_events.ProtocolNegotiated,
        qh3_events.StopSendingReceived,
        qh3_events.StreamDataReceived,
        qh3_events.StreamReset,
    )
}
"""Each qh3 event class: the aioquic class of the same name, and their (common) fields."""


def as_aioquic_event(event: qh3_events.QuicEvent) -> aio_events.QuicEvent:
    """The aioquic event with the same class name and fields as ``event``."""
    if type(event) is qh3_events.StreamDataReceived:  # nearly every event: no lookups
        return aio_events.StreamDataReceived(event.data, event.end_stream, event.stream_id)
    cls, names = _AIOQUIC_EVENTS[type(event)]
    return cls(*(getattr(event, name) for name in names))


class _Bridge(QuicTlsBridge):
    """qh3's TLS bridge, advertising the datagram size the node is configured for.

    qh3 writes ``max_udp_payload_size`` 1472 into a client's transport parameters
    (and none into a server's); here both carry ``configuration.max_datagram_size``.
    qlog's local ``parameters_set`` event still shows qh3's own value: qh3 logs the
    parameters before they are returned here.
    """

    def serialize_transport_parameters(self) -> bytes:
        parameters = pull_quic_transport_parameters(Buffer(data=super().serialize_transport_parameters()))
        parameters.max_udp_payload_size = self.configuration.max_datagram_size
        buffer = Buffer(capacity=3 * self.configuration.max_datagram_size)
        push_quic_transport_parameters(buffer, parameters)
        return buffer.data


class _Native(QuicConnection):
    """qh3's connection with aioquic's TLS, and events held back on request."""

    def __init__(
        self,
        *,
        configuration: QuicConfiguration,
        credentials: Credentials,
        cafile: str,
        expected_node_id: str | None,
        original_destination_connection_id: bytes | None,
        retry_source_connection_id: bytes | None = None,
    ) -> None:
        super().__init__(
            configuration=configuration,
            original_destination_connection_id=original_destination_connection_id,
            retry_source_connection_id=retry_source_connection_id,
        )
        self._credentials = credentials
        self._cafile = cafile
        self._expected_node_id = expected_node_id
        self.peer_identity: NodeIdentity | None = None
        self.hold_events = False

    def _create_tls(self, remote_source_cid: bytes | None) -> QuicTlsBridge:
        assert self._version is not None  # known once a handshake starts, on either side
        bridge = _Bridge(  # what qh3's own _create_tls passes
            self._configuration,
            version=self._version,
            local_initial_source_connection_id=self.host_cid,
            remote_initial_source_connection_id=remote_source_cid,
            original_destination_connection_id=self._original_destination_connection_id,
            retry_source_connection_id=self._retry_source_connection_id,
            session_ticket_fetcher=self._session_ticket_fetcher,
            session_ticket_handler=self._session_ticket_handler,
            quic_logger=self._quic_logger,
            version_change_handler=self._set_version,
        )
        self._tls = bridge
        is_client = self.configuration.is_client
        context = aio_tls.Context(
            is_client=is_client,
            alpn_protocols=self.configuration.alpn_protocols,
            cafile=self._cafile,
            verify_mode=ssl.CERT_REQUIRED,
        )
        context.certificate = self._credentials.certificate
        context.certificate_private_key = self._credentials.private_key
        context._request_client_certificate = not is_client
        native = bridge.tls
        adapter = AioquicTls(context, self._verify_peer)
        adapter.handshake_extensions = native.handshake_extensions
        adapter.alpn_cb = native.alpn_cb
        adapter.update_traffic_key_cb = native.update_traffic_key_cb
        bridge.tls = adapter  # type: ignore[assignment]  # the subset of tls.Context the bridge uses
        return bridge

    def _verify_peer(self, certificate: x509.Certificate | None, chain: list[x509.Certificate]) -> None:
        self.peer_identity = verified_identity(
            certificate,
            chain,
            is_client=self.configuration.is_client,
            cafile=self._cafile,
            expected_node_id=self._expected_node_id,
        )

    def _drain_core(self) -> None:
        if (
            self.hold_events
            and self._handshake_complete
            and self._core is not None
            and self._core.state not in _ENDING_STATES
        ):
            return
        super()._drain_core()

    def poll_datagrams(self, now: float) -> list[tuple[bytes, NetworkAddress]]:
        """qh3's ``datagrams_to_send``, but keeping what the core built before its
        amplification failure during the handshake (item 8)."""
        core = self._core
        if core is None:
            return []
        datagrams = []
        logged = self._quic_logger is not None
        while True:
            try:
                transmit = core.poll_transmit(now)
            except RuntimeError as exc:
                if self._handshake_complete or str(exc) != _BUILDER_EXHAUSTED:
                    raise QuicConnectionError(QuicErrorCode.INTERNAL_ERROR, None, str(exc)) from exc
                break  # the rest of the flight waits for more credit
            if transmit is None:
                break
            if logged:
                self._log_datagram("datagrams_sent", transmit[0])
                self._log_packets("packet_sent", transmit[0])
            datagrams.append((transmit[0], transmit[1]))
        return datagrams

    def _log_packets(self, event: str, data: bytes) -> None:
        # qh3 parses every outgoing packet's header in Python to log it, and only then
        # finds that there is no logger: 3% of an aggregator's CPU in a bulk transfer.
        if self._quic_logger is not None:
            super()._log_packets(event, data)

    def ready_for_runs(self) -> bool:
        """Whether :meth:`receive_run` may take what arrives: the handshake is done and
        nothing is logged (qlog records every datagram of a run)."""
        return self._handshake_complete and self._core is not None and self._quic_logger is None

    def receive_run(self, data: bytes, segment_size: int | None, addr: NetworkAddress, now: float) -> None:
        """qh3's ``receive_gro_buffer`` (a run of datagrams of ``segment_size`` bytes)
        or ``receive_many_datagrams`` (one datagram: ``segment_size`` None) without
        their walk over the datagrams, which only logs them: for a run it sliced, so
        copied, every datagram received to find that there was no logger."""
        core = self._core
        assert core is not None  # ready_for_runs
        address = self._normalize_address(addr)
        if segment_size is None:
            self._call_core(core.receive_many_datagrams, [data], address, now)
        else:
            self._call_core(core.receive_gro_buffer, data, segment_size, address, now)
        self._drain_core()

    def release_events(self) -> None:
        """Take what the core holds, now that events are no longer held."""
        if self._core is not None:
            self._drain_core()


class HeldCredit:
    """``credit.frozen`` for qh3: while frozen, the core keeps its events and its credit."""

    def __init__(self, native: _Native) -> None:
        self._native = native

    @property
    def frozen(self) -> bool:
        return self._native.hold_events

    @frozen.setter
    def frozen(self, frozen: bool) -> None:
        self._native.hold_events = frozen
        if not frozen:
            self._native.release_events()


class Qh3Connection:
    """One CCO connection on qh3; the interface of :class:`~cco.transport.backend.QuicLink`."""

    def __init__(
        self,
        *,
        configuration: QuicConfiguration,
        credentials: Credentials,
        cafile: str,
        expected_node_id: str | None = None,
        original_destination_connection_id: bytes | None = None,
        retry_source_connection_id: bytes | None = None,
    ) -> None:
        self._native = _Native(
            configuration=configuration,
            credentials=credentials,
            cafile=cafile,
            expected_node_id=expected_node_id,
            original_destination_connection_id=original_destination_connection_id,
            retry_source_connection_id=retry_source_connection_id,
        )
        self.credit = HeldCredit(self._native)
        self._queued = 0  # stream bytes handed to send_stream_data
        self._waiting: dict[int, list[tuple[bytes, bool]]] = {}  # stream id -> writes, in order
        self._waiting_bytes = 0
        self._termination: aio_events.ConnectionTerminated | None = None
        self._ack_held_until: float | None = None  # an ACK the core wants sent waits till then
        self._skip_poll = False  # the ACK timer just fired: the next transmit sends nothing

    @property
    def configuration(self) -> QuicConfiguration:
        return self._native.configuration

    @property
    def host_cid(self) -> bytes:
        return self._native.host_cid

    @property
    def peer_identity(self) -> NodeIdentity | None:
        return self._native.peer_identity

    @property
    def stream_bytes_sent(self) -> int:
        """Stream bytes sent at least once."""
        return self._queued - self._waiting_bytes - self._native.get_send_buffer_size()

    @property
    def bytes_in_flight(self) -> int:
        core = self._native._core
        return 0 if core is None else core.bytes_in_flight

    def path_stats(self) -> PathStats:
        """The native core's recovery state (its RTTs are None before a sample)."""
        core = self._native._core
        if core is None:
            return PathStats(smoothed_rtt=None, latest_rtt=None, congestion_window=0, bytes_in_flight=0)
        return PathStats(
            smoothed_rtt=core.smoothed_rtt,
            latest_rtt=core.latest_rtt,
            congestion_window=core.congestion_window,
            bytes_in_flight=core.bytes_in_flight,
            lost_packets=core.loss_total,
        )

    @property
    def termination(self) -> aio_events.ConnectionTerminated | None:
        """Why the connection is closing, as soon as that is known."""
        if self._termination is None and self._native._close_event is not None:
            closing = self._native._close_event
            frame_type = None if closing.frame_type is None else int(closing.frame_type)
            self._termination = aio_events.ConnectionTerminated(
                error_code=int(closing.error_code), frame_type=frame_type, reason_phrase=closing.reason_phrase
            )
        return self._termination

    def connect(self, addr: NetworkAddress, now: float) -> None:
        self._native.connect(addr, now)

    def receive_datagram(self, data: bytes, addr: NetworkAddress, now: float) -> None:
        """Hand one datagram to qh3; once the handshake is done, straight to its core.

        qh3's ``receive_datagram`` splits every datagram into its packets in Python
        (for key installation during the handshake) and logs each packet; its core
        takes the datagram whole, which qh3 itself does only after the handshake.
        With qlog on, every datagram takes qh3's own path, which logs its packets
        (:meth:`_Native.ready_for_runs`).
        """
        if self._native.ready_for_runs():
            self._native.receive_run(data, None, addr, now)
        else:
            self._native.receive_datagram(data, addr, now)

    def receive_segments(self, data: bytes, segment_size: int, addr: NetworkAddress, now: float) -> None:
        """A kernel-coalesced run of datagrams: to qh3's core in one call (qh3 itself
        takes a run datagram by datagram until the handshake is done)."""
        if self._native.ready_for_runs():
            self._native.receive_run(data, segment_size, addr, now)
        else:
            self._native.receive_gro_buffer(data, segment_size, addr, now)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, NetworkAddress]]:
        if self._skip_poll:
            self._skip_poll = False
            return []
        if self._waiting:
            self._send_waiting()
        self._ack_held_until = None  # a held ACK leaves in what the core sends now
        return self._native.poll_datagrams(now)

    def get_timer(self) -> float | None:
        at = self._native.get_timer()
        held = self._ack_held_until
        return held if held is not None and (at is None or held < at) else at

    def handle_timer(self, now: float) -> None:
        """Run the core's due timer, except that its delayed-ACK timer only makes the
        ACK due, for the next packet sent to carry (item 7)."""
        self._skip_poll = False
        core = self._native._core
        timer = None if core is None else core.get_timer()
        if self._ack_held_until is not None and (timer is None or timer[1] > now):
            self._ack_held_until = None  # the hold is over: the next poll sends the ACK
            return
        if core is None or timer is None or timer[0] != _ACK_TIMER:
            self._native.handle_timer(now)
            return
        recovery = (core.pto_total, core.loss_total)
        self._native.handle_timer(now)
        if self._only_an_ack_is_due(core, now, recovery):
            self._ack_held_until = timer[1] + ACK_HOLD
            self._skip_poll = True

    def _only_an_ack_is_due(self, core: QuicConnectionCore, now: float, recovery: tuple[int, int]) -> bool:
        """After the ACK timer ran: whether a poll now would send nothing but the ACK.

        The core's other timers may have expired in the same call (pacing releasing
        queued data, loss detection queueing a retransmission or a probe); then the
        poll must happen."""
        after = core.get_timer()
        return (
            (after is None or after[1] > now)
            and (core.pto_total, core.loss_total) == recovery
            and core.get_send_buffer_size() == 0
            and not self._waiting
            and core.state not in _ENDING_STATES
        )

    def next_event(self) -> aio_events.QuicEvent | None:
        event = self._native.next_event()
        return None if event is None else as_aioquic_event(event)

    def get_next_available_stream_id(self, is_unidirectional: bool = False) -> int:
        return self._native.get_next_available_stream_id(is_unidirectional)

    def send_stream_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        self._skip_poll = False
        self._queued += len(data)
        if stream_id in self._waiting or not self._peer_allows(stream_id):
            self._native._record_local_stream(stream_id)  # the id is taken, as a send would take it
            self._waiting.setdefault(stream_id, []).append((data, end_stream))
            self._waiting_bytes += len(data)
        else:
            self._native.send_stream_data(stream_id, data, end_stream)
            self._ack_with_data()

    def _ack_with_data(self) -> None:
        """Make an ACK whose timer is pending due now, so that the data just queued
        carries it (item 7).  The ACK timer is the core's earliest when it is the
        one ``get_timer`` names, so running timers up to its deadline runs no other."""
        core = self._native._core
        timer = None if core is None else core.get_timer()
        if timer is not None and timer[0] == _ACK_TIMER:
            self._native.handle_timer(timer[1])

    def _peer_allows(self, stream_id: int) -> bool:
        """Whether the peer's MAX_STREAMS covers ``stream_id`` (always, for its own streams).

        Before the handshake qh3 stages writes itself; afterwards ``stream_limits``
        starts with the peer's cumulative limits (bidirectional, unidirectional).
        """
        core = self._native._core
        if core is None or not self._native._handshake_complete:
            return True
        if (stream_id & 1) != (0 if self.configuration.is_client else 1):
            return True  # opened by the peer
        return stream_id >> 2 < core.stream_limits[1 if stream_id & 2 else 0]

    def _send_waiting(self) -> None:
        for stream_id in [s for s in self._waiting if self._peer_allows(s)]:
            for data, end_stream in self._waiting.pop(stream_id):
                self._native.send_stream_data(stream_id, data, end_stream)
                self._waiting_bytes -= len(data)

    def close(self, error_code: int = 0, frame_type: int | None = None, reason_phrase: str = "") -> None:
        self._skip_poll = False
        self._native.close(error_code=error_code, frame_type=frame_type, reason_phrase=reason_phrase)
