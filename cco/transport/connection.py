"""aioquic's sans-I/O ``QuicConnection``, extended with what CCO needs from it.

What aioquic 1.7 does not offer through its public API, and how we get it:

1. **Client certificates.**  aioquic's TLS server never asks for a client
   certificate (``tls.Context._request_client_certificate`` is "for test purposes
   only") and never verifies one.  :class:`CcoQuicConnection` sets that flag when
   the TLS context is created and, when the handshake completes, verifies the chain
   against the group CA with aioquic's own :func:`aioquic.tls.verify_certificate`.
2. **Peer identity.**  Both sides read the peer certificate the TLS context kept
   (``tls._peer_certificate``) and :func:`~cco.transport.peercheck.verified_identity`
   (shared with the qh3 backend) derives a :class:`NodeIdentity` from it.  A client
   also checks that it reached ``expected_node_id``; we do this ourselves instead of
   through ``server_name``, because aioquic treats an all-digit name such as ``"7"``
   as an invalid host name and a dotted-quad one as an IP address.
3. **Bounded receive credit.**  aioquic doubles MAX_DATA whenever half of it is used,
   so the credit a peer holds grows with everything it ever sent.
   :class:`ReceiveCredit` replaces that limit object: credit slides ``window`` bytes
   beyond what was received, and stops growing while ``frozen``.
4. **A send buffer that does not copy.**  Every stream we send on gets a
   :class:`~cco.transport.sendbuffer.SendBuffer` in place of the sender's
   ``bytearray`` (``QuicStreamSender._buffer``), which copied all unacknowledged
   data on each write.
5. **Send progress.**  :attr:`CcoQuicConnection.stream_bytes_sent` and
   :attr:`~CcoQuicConnection.bytes_in_flight` let the adapter wait for queued data
   to leave (``drain()``) and be acknowledged (a flushing close).
6. **Fewer ACK-only packets.**  aioquic acknowledges every ack-eliciting packet
   1 ms after it arrives, in a packet of its own unless data happens to leave at
   that moment.  CCO traffic is mostly request and answer (a Contribution, then
   its Result), so almost every message cost a second, ACK-only packet each way,
   with a timer wake-up for it: on loopback close to half of all packets of an
   8-byte all-reduce, and as much CPU per packet as a data packet.  Here an ACK
   rides on the next data we send (any ``send_stream_data`` makes it due at once),
   is sent at once after every :data:`ACK_EVERY` ack-eliciting packets (RFC 9000,
   section 13.2.2: bulk transfers keep their ACK clock), and otherwise waits at
   most :data:`ACK_DELAY`, within the ``max_ack_delay`` of 25 ms that aioquic
   advertises, so the peer's RTT estimate (which subtracts the delay we report)
   and its probe timeout allow for it.
7. **The datagram size we take.**  aioquic leaves ``max_udp_payload_size`` out of
   its transport parameters, which tells the peer 65527 bytes; a qh3 peer keeps to
   what it is told.  Here it says ``max_datagram_size``, as the qh3 backend does.

Our server passes aioquic no session-ticket handler, so it issues no tickets: a
resumed session would skip the client certificate.  Every connection is a full
handshake, and there is no 0-RTT.

These rely on aioquic internals (checked with 1.7.2, and exercised by the
transport tests): ``QuicConnection._initialize``,
``_get_or_create_stream_for_send``, ``QuicStreamSender._buffer``, ``_local_max_data``,
``_remote_max_data_used``, ``_loss.bytes_in_flight`` (and its RTT fields,
``_rtt_initialized``, ``_rtt_smoothed``, ``_rtt_latest``), ``_close_event``,
``_ack_delay``, ``_spaces``, ``_payload_received``, ``_write_ack_frame``,
``_serialize_transport_parameters``, ``_max_datagram_size`` and the TLS
context's ``_request_client_certificate`` and ``_peer_certificate(_chain)``.

A refused handshake is closed with CRYPTO_ERROR plus the TLS alert (RFC 9001,
section 4.8), exactly as aioquic closes for alerts of its own, and every event after
the refusal except the final ``ConnectionTerminated`` is swallowed: the adapter
never sees an unauthenticated connection as established.
"""

from __future__ import annotations

from typing import Any

from aioquic import tls
from aioquic.buffer import Buffer  # type: ignore[attr-defined]  # re-exported from _buffer
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import Limit, NetworkAddress, QuicConnection, QuicReceiveContext
from aioquic.quic.packet import (
    QuicErrorCode,
    QuicFrameType,
    pull_quic_transport_parameters,
    push_quic_transport_parameters,
)
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.quic.recovery import QuicPacketSpace
from aioquic.quic.stream import QuicStream

from cco.transport.certs import NodeIdentity
from cco.transport.pathstats import PathStats
from cco.transport.peercheck import verified_identity
from cco.transport.sendbuffer import SendBuffer
from cco.transport.udp import split_segments

ACK_DELAY = 0.020
"""Seconds an ACK may wait for data to ride on (aioquic: 1 ms; advertised maximum 25 ms)."""
ACK_EVERY = 2
"""Ack-eliciting 1-RTT packets after which an ACK leaves at once."""


class ReceiveCredit(Limit):
    """Connection-level MAX_DATA: ``received + window``, held still while ``frozen``.

    aioquic computes the new limit as ``value * 2`` and assigns it; the setter turns
    that request into our rule.  Credit is granted in steps of at least a quarter
    window so that MAX_DATA frames stay rare, and it never decreases (RFC 9000,
    section 4.1).
    """

    def __init__(self, original: Limit, window: int) -> None:
        self.window = window
        self.frozen = False
        self._value = 0
        self.used = 0
        super().__init__(frame_type=original.frame_type, name=original.name, value=window)

    @property
    def value(self) -> int:
        return self._value

    @value.setter
    def value(self, requested: int) -> None:
        ceiling = self._value if self.frozen else self.used + self.window
        grant = min(requested, ceiling)
        if grant - self._value >= self.window // 4:
            self._value = grant


def _alert_code(alert: tls.Alert) -> int:
    return int(QuicErrorCode.CRYPTO_ERROR) + int(alert.description)


class CcoQuicConnection(QuicConnection):
    """A ``QuicConnection`` with mutual certificate authentication and bounded credit.

    ``expected_node_id`` (clients only) is the node the client means to reach.
    After ``HandshakeCompleted`` has been returned by :meth:`next_event`,
    :attr:`peer_identity` names the authenticated peer.
    """

    def __init__(
        self,
        *,
        configuration: QuicConfiguration,
        receive_window: int,
        expected_node_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(configuration=configuration, **kwargs)
        self.credit = ReceiveCredit(self._local_max_data, receive_window)
        self._local_max_data = self.credit
        self.peer_identity: NodeIdentity | None = None
        self._expected_node_id = expected_node_id
        self._refused = False
        self._ack_delay = ACK_DELAY
        self._unacknowledged = 0  # ack-eliciting 1-RTT packets received since our last ACK

    @property
    def stream_bytes_sent(self) -> int:
        """Stream bytes sent at least once, over all streams (aioquic's own count)."""
        return int(self._remote_max_data_used)

    def receive_segments(self, data: bytes, segment_size: int, addr: NetworkAddress, now: float) -> None:
        """A kernel-coalesced run of datagrams, one by one (aioquic takes no runs)."""
        for datagram in split_segments(data, segment_size):
            self.receive_datagram(datagram, addr, now)

    @property
    def bytes_in_flight(self) -> int:
        """Bytes in sent packets that are neither acknowledged nor declared lost."""
        return int(self._loss.bytes_in_flight)

    def path_stats(self) -> PathStats:
        """aioquic's recovery state: RTTs (zero until the first sample) and window."""
        loss = self._loss
        sampled = loss._rtt_initialized
        return PathStats(
            smoothed_rtt=float(loss._rtt_smoothed) if sampled else None,
            latest_rtt=float(loss._rtt_latest) if sampled else None,
            congestion_window=int(loss.congestion_window),
            bytes_in_flight=int(loss.bytes_in_flight),
        )

    @property
    def termination(self) -> events.ConnectionTerminated | None:
        """Why the connection is closing, as soon as that is known.

        aioquic reports ``ConnectionTerminated`` only when the closing or draining
        period ends (three PTOs later); the adapter wants to know at once.
        """
        result: events.ConnectionTerminated | None = self._close_event
        return result

    def send_stream_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        """Queue stream data; an ACK we owe the peer leaves with it, not after it."""
        super().send_stream_data(stream_id, data, end_stream)
        space = self._spaces.get(tls.Epoch.ONE_RTT)
        if space is not None and space.ack_at is not None:
            space.ack_at = 0.0  # due: the next packet built carries it

    def _payload_received(
        self, context: QuicReceiveContext, plain: bytes, crypto_frame_required: bool = False
    ) -> tuple[bool, bool]:
        is_ack_eliciting, is_probing = super()._payload_received(
            context, plain, crypto_frame_required=crypto_frame_required
        )
        if is_ack_eliciting and context.epoch == tls.Epoch.ONE_RTT:
            self._unacknowledged += 1
            if self._unacknowledged >= ACK_EVERY:
                self._spaces[tls.Epoch.ONE_RTT].ack_at = context.time
        return is_ack_eliciting, is_probing

    def _write_ack_frame(self, builder: QuicPacketBuilder, space: QuicPacketSpace, now: float) -> None:
        super()._write_ack_frame(builder=builder, space=space, now=now)
        if space is self._spaces.get(tls.Epoch.ONE_RTT):
            self._unacknowledged = 0

    def _get_or_create_stream_for_send(self, stream_id: int) -> QuicStream:
        stream: QuicStream = super()._get_or_create_stream_for_send(stream_id)
        sender = stream.sender
        if not isinstance(sender._buffer, SendBuffer):
            sender._buffer = SendBuffer(sender._buffer)  # type: ignore[assignment]  # same three operations
        return stream

    def _serialize_transport_parameters(self) -> bytes:
        parameters = pull_quic_transport_parameters(Buffer(data=super()._serialize_transport_parameters()))
        parameters.max_udp_payload_size = self._configuration.max_datagram_size
        buffer = Buffer(capacity=3 * self._max_datagram_size)
        push_quic_transport_parameters(buffer, parameters)
        return buffer.data

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        if not self._is_client:
            self.tls._request_client_certificate = True

    def next_event(self) -> events.QuicEvent | None:
        while True:
            event: events.QuicEvent | None = super().next_event()
            if event is None or isinstance(event, events.ConnectionTerminated):
                return event
            if isinstance(event, events.HandshakeCompleted) and not self._refused:
                self._authenticate_peer()
            if not self._refused:
                return event

    def _authenticate_peer(self) -> None:
        try:
            self.peer_identity = self._verified_identity()
        except tls.Alert as alert:
            self._refused = True
            self.close(
                error_code=_alert_code(alert), frame_type=QuicFrameType.CRYPTO, reason_phrase=str(alert)
            )

    def _verified_identity(self) -> NodeIdentity:
        return verified_identity(
            self.tls._peer_certificate,
            self.tls._peer_certificate_chain,
            is_client=self._is_client,
            cafile=self.configuration.cafile,
            expected_node_id=self._expected_node_id,
        )
