"""One authenticated CCO connection over QUIC: handshake, transmission, flow control.

:class:`LinkProtocol` is the asyncio adapter over one QUIC connection of either
backend (:class:`~cco.transport.backend.QuicLink`): it carries CCO messages on the
streams :mod:`cco.transport.streams` maps them to, opens the session with
Hello/HelloAck, and hands the application a
:class:`~cco.transport.peerlink.PeerLink` once it is open.  Connection close
carries the :class:`ErrorCode` as the application error code.

**Transmission.**  Writing only queues data in the QUIC connection.  All datagrams
leave through :meth:`LinkProtocol.transmit`; our own writes and received datagrams
reach it through :meth:`LinkProtocol._schedule_transmit`, which coalesces a burst of
``send()`` calls, or of datagrams read in one batch, into one transmit on the next
loop iteration.

**Flow control.**  Received messages are decoded at once and queued in the link's
:class:`~cco.transport.inbox.Inbox` until the application calls
:meth:`PeerLink.receive` (or handed to its listener).  When the queued bytes exceed
``receive_buffer`` we freeze QUIC connection credit (``credit.frozen``: aioquic's
:class:`ReceiveCredit` stops growing, qh3's core keeps the data it has not handed
over), so a fast peer stalls instead of growing our memory; reading below half the
buffer thaws it.  The freeze only ever waits for the application, never for the peer, so it
cannot deadlock: a frozen link always has a message ready to read.  On the sending
side :meth:`PeerLink.drain` waits while more than ``send_buffer`` bytes are queued
but not yet sent.

**Errors.**  Any protocol error from the peer (bad framing, an undecodable
message, a message on the wrong stream, a lying Hello) closes the connection with
that error's code; the application sees it as :class:`LinkClosed` from
``receive()`` and in ``wait_closed()``.  Nothing a peer sends raises out of the
event loop's callbacks, so other connections are unaffected.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import cast

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic import events
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicErrorCode
from aioquic.tls import AlertDescription

from cco.transport.backend import QuicLink
from cco.transport.config import TransportConfig
from cco.transport.handshake import LocalIdentity, Session, accept_hello_ack, build_hello, negotiate
from cco.transport.inbox import Inbox
from cco.transport.pathstats import PathStats
from cco.transport.peerlink import LinkClosed, Listener, PeerLink
from cco.transport.streams import (
    CONTROL_STREAM_ID,
    DATA_MESSAGES,
    InboundStream,
    InboundStreams,
    UnfinishedFrames,
)
from cco.transport.udp import BatchedUdpTransport, SegmentedDatagramProtocol
from cco.transport.unreachable import CONFIRM_SPAN, UnreachableTracker, peer_key
from cco.wire.errors import CcoError, DecodeError, ErrorCode
from cco.wire.framing import encode_frame, frame_prefix
from cco.wire.messages import (
    Error,
    Hello,
    HelloAck,
    Message,
    decode_message_pieces,
    encode_message,
    encode_message_pieces,
)
from cco.wire.registries import ALPN, MessageType

logger = logging.getLogger(__name__)

JOIN_BELOW = 16 * 1024
"""A byte string of at least this many bytes in a message (a chunk's payload) is
handed to QUIC as a write of its own, not copied into the encoded message; the rest
of the message, with its frame prefix, goes in as few writes as it allows (see
:meth:`LinkProtocol.send_message`)."""

_MAX_DETAIL = 1024  # Error.detail limit (cco.wire.messages)
_MAX_REASON = 256  # bytes of detail copied into CONNECTION_CLOSE


def describe_termination(event: events.ConnectionTerminated) -> tuple[ErrorCode, str]:
    """Map how QUIC ended a connection onto the CCO error registry."""
    reason = event.reason_phrase
    if event.frame_type is None:  # CONNECTION_CLOSE of type 0x1d: a CCO error code
        try:
            return ErrorCode(event.error_code), reason
        except ValueError:
            return ErrorCode.PROTOCOL_VIOLATION, f"unknown application error 0x{event.error_code:x}: {reason}"
    code = event.error_code
    if QuicErrorCode.CRYPTO_ERROR <= code <= QuicErrorCode.CRYPTO_ERROR + 0xFF:
        alert = code - QuicErrorCode.CRYPTO_ERROR
        try:
            name = AlertDescription(alert).name
        except ValueError:
            name = str(alert)
        if alert == AlertDescription.no_application_protocol:
            return ErrorCode.UNSUPPORTED_VERSION, f"TLS alert {name} (ALPN {ALPN} refused): {reason}"
        return ErrorCode.UNAUTHORIZED, f"TLS handshake refused, alert {name}: {reason}"
    if reason == "Idle timeout":
        return ErrorCode.PEER_LOST, "idle timeout: nothing received from the peer"
    if code == QuicErrorCode.NO_ERROR:
        return ErrorCode.NO_ERROR, reason
    return ErrorCode.PROTOCOL_VIOLATION, f"QUIC transport error 0x{code:x}: {reason}"


def _truncate(text: str, limit: int) -> str:
    data = text.encode()
    return text if len(data) <= limit else data[:limit].decode(errors="ignore")


class _Phase(enum.Enum):
    HANDSHAKE = enum.auto()  # TLS in progress
    HELLO = enum.auto()  # TLS done, Hello / HelloAck pending
    OPEN = enum.auto()
    CLOSED = enum.auto()


_last_encoded: tuple[Message, list[bytes]] | None = None


def _encoded(message: Message) -> list[bytes]:
    """``message`` encoded in pieces (:func:`encode_message_pieces`), computed once
    when the same message goes to several peers in a row, as an aggregator's Result
    goes to every child.  Messages are immutable, and the cache is one (message,
    pieces) pair compared by identity, so a stale pair can never be taken for
    another message."""
    global _last_encoded
    last = _last_encoded
    if last is not None and last[0] is message:
        return last[1]
    pieces = encode_message_pieces(message, JOIN_BELOW)
    _last_encoded = (message, pieces)
    return pieces


class LinkProtocol(QuicConnectionProtocol, SegmentedDatagramProtocol):
    """Drives one CCO connection from the TLS handshake to its close.

    ``opened`` resolves to the :class:`PeerLink` once Hello/HelloAck succeeded, or
    fails with :class:`LinkClosed` if the connection ends first.
    """

    def __init__(
        self,
        quic: QuicLink,
        *,
        config: TransportConfig,
        local: LocalIdentity,
        unfinished: UnfinishedFrames | None = None,
    ) -> None:
        super().__init__(cast(QuicConnection, quic))  # aioquic's protocol uses only QuicLink methods
        self._cco = quic
        self._config = config
        self._local = replace(
            local, capabilities=replace(local.capabilities, max_message_size=config.max_message_size)
        )
        self._is_client = quic.configuration.is_client
        self._phase = _Phase.HANDSHAKE
        self._hello: Hello | None = None
        self._hello_timer: asyncio.TimerHandle | None = None
        self._inbound = InboundStreams(
            is_client=self._is_client,
            max_message_size=config.max_message_size,
            per_connection=config.unfinished_bytes_per_connection,
            node=unfinished or UnfinishedFrames(config.unfinished_bytes),
            frame_timeout=config.frame_timeout,
            clock=time.monotonic,
        )
        self._frame_timer: asyncio.TimerHandle | None = None
        self._outbound: dict[bytes, int] = {}
        self._send_limit = config.max_message_size
        self._queued_bytes = 0  # bytes ever handed to QUIC
        self._inbox = Inbox(
            self._loop,
            receive_buffer=config.receive_buffer,
            messages_per_turn=config.messages_per_turn,
            credit=quic.credit,
            on_thaw=self._thaw,
        )
        self._drainers: list[asyncio.Future[None]] = []
        self._transmit_handle: asyncio.Handle | None = None
        self._close_reason: tuple[ErrorCode, str] | None = None
        self._pending_close: tuple[int, str] | None = None  # CONNECTION_CLOSE still to send
        self._close_timer: asyncio.TimerHandle | None = None
        self._terminated = asyncio.Event()
        self._on_terminated: list[Callable[[], None]] = []
        self.on_handshake: Callable[[], None] = lambda: None
        """Called once the QUIC handshake has completed (a server counts half-open connections)."""
        self.peer: tuple[str, int] | None = None  # the address datagrams come from and go to
        self._unreachable = UnreachableTracker()
        self.opened: asyncio.Future[PeerLink] = self._loop.create_future()
        self.opened.add_done_callback(lambda f: f.cancelled() or f.exception())

    # --- the one transmit path ---------------------------------------------------

    def transmit(self) -> None:
        """Send what QUIC has ready; the only place datagrams leave this link.

        aioquic's own ``transmit`` sends datagram by datagram; here the whole batch
        goes to :meth:`BatchedUdpTransport.send_datagrams` (few system calls), and
        the connection timer is re-armed as aioquic does (its ``_timer``,
        ``_timer_at`` and ``_handle_timer``).
        """
        self._transmit_handle = None
        batch: dict[object, list[bytes]] = {}
        for data, addr in self._quic.datagrams_to_send(now=time.monotonic()):
            batch.setdefault(addr, []).append(data)
        transport = cast(BatchedUdpTransport, self._transport)
        for addr, datagrams in batch.items():
            transport.send_datagrams(datagrams, addr)
        timer_at = self._quic.get_timer()
        if self._timer is not None and self._timer_at != timer_at:
            self._timer.cancel()
            self._timer = None
        if self._timer is None and timer_at is not None:
            self._timer = self._loop.call_at(timer_at, self._handle_timer)
        self._timer_at = timer_at
        self._wake_drainers()
        if self._pending_close is not None and self._flushed():
            self._close_quic()

    # QUIC's clock is time.monotonic, read when it is needed, not the loop's time.
    # asyncio's loop.time() is the same clock, but an application may run the library
    # on uvloop, whose loop.time() is the start of the loop turn in whole
    # milliseconds: too coarse for round trips of tens of microseconds, which QUIC
    # measures and paces with.  Both loops' timers run on the same monotonic base.
    # aioquic's protocol reads loop.time() in the two methods below; they are its,
    # clock aside.

    def connect(self, addr: tuple[object, ...], transmit: bool = True) -> None:
        self.peer = peer_key(addr)
        self._quic.connect(addr, now=time.monotonic())
        if transmit:
            self.transmit()

    def _handle_timer(self) -> None:
        now = max(self._timer_at or 0.0, time.monotonic())
        self._timer = None
        self._timer_at = None
        self._quic.handle_timer(now=now)
        self._process_events()
        self.transmit()

    def _schedule_transmit(self) -> None:
        if self._transmit_handle is None:
            self._transmit_handle = self._loop.call_soon(self.transmit)

    def flush(self) -> None:
        """Transmit now what the transmit scheduled for the loop's next turn would send."""
        if self._transmit_handle is not None:
            self._transmit_handle.cancel()
            self.transmit()

    # --- application side ---------------------------------------------------------

    @property
    def close_reason(self) -> tuple[ErrorCode, str] | None:
        return self._close_reason

    def add_termination_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the QUIC connection has fully terminated."""
        self._on_terminated.append(callback)

    def send_message(self, message: Message) -> None:
        if self._close_reason is not None:
            raise LinkClosed(*self._close_reason)
        encoded = _encoded(message)
        prefix = frame_prefix(sum(map(len, encoded)), self._send_limit)
        # A large payload goes as a write of its own, so that it is never copied to
        # join what precedes it; the small pieces are joined, since each write to
        # QUIC costs a call into the stack that is dearer than copying a few KiB.
        first = encoded[0]
        pieces = (prefix + first, *encoded[1:]) if len(first) < JOIN_BELOW else (prefix, *encoded)
        if isinstance(message, DATA_MESSAGES):
            stream_id = self._outbound.get(message.group_id)
            if stream_id is None:
                stream_id = self._quic.get_next_available_stream_id(is_unidirectional=True)
                self._outbound[message.group_id] = stream_id
        else:
            stream_id = CONTROL_STREAM_ID
        self._write(stream_id, *pieces)
        if not self._is_client and self._unsent() > self._config.send_queue_limit:
            self.fail(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"limit send_queue_limit ({self._config.send_queue_limit}) reached: the peer does not read",
                flush=False,
            )

    def _write(self, stream_id: int, *pieces: bytes) -> None:
        """Queue ``pieces``, one after another, on the stream (a frame, or its prefix
        and its message)."""
        for piece in pieces:
            self._quic.send_stream_data(stream_id, piece)
            self._queued_bytes += len(piece)
        self._schedule_transmit()

    def path_stats(self) -> PathStats:
        return self._cco.path_stats()

    def _unsent(self) -> int:
        return self._queued_bytes - self._cco.stream_bytes_sent

    async def drain(self) -> None:
        while True:
            if self._close_reason is not None:
                raise LinkClosed(*self._close_reason)
            if self._unsent() <= self._config.send_buffer:
                return
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._drainers.append(waiter)
            await waiter

    def _wake_drainers(self) -> None:
        if self._drainers and (self._close_reason is not None or self._unsent() <= self._config.send_buffer):
            for waiter in self._drainers:
                if not waiter.done():
                    waiter.set_result(None)
            self._drainers.clear()

    async def receive(self) -> Message:
        return await self._inbox.get()

    def listen(self, listener: Listener) -> None:
        """Hand every message to ``listener`` as soon as it is decoded, instead of
        queueing it for :meth:`receive` (see :meth:`Inbox.listen`)."""
        self._inbox.listen(listener)

    def _thaw(self) -> None:
        """After unfreezing: take the events a backend held back (qh3 does), send the credit."""
        if self._close_reason is None:
            self._process_events()
        self._schedule_transmit()

    def fail(self, code: ErrorCode, detail: str, *, flush: bool = True) -> None:
        """Close the link with ``code``, sent to the peer as the application error code.

        The link counts as closed at once (``send`` and ``receive`` raise), but the
        QUIC CONNECTION_CLOSE waits until every queued message has been sent and
        acknowledged, for at most ``close_flush_timeout`` seconds: a closing QUIC
        connection sends nothing else, so closing at once would silently drop
        messages queued just before, such as the ``Error`` refusing a Hello.
        Without ``flush`` (a peer that does not read) it closes at once.
        """
        if self._close_reason is not None:
            return
        handshake_done = self._phase is not _Phase.HANDSHAKE
        self._mark_closed(code, detail)
        self._pending_close = (int(code), _truncate(detail, _MAX_REASON))
        if handshake_done and flush:
            self._close_timer = self._loop.call_later(self._config.close_flush_timeout, self._close_quic)
            self._schedule_transmit()
        else:
            self._close_quic()

    def _flushed(self) -> bool:
        return self._unsent() == 0 and self._cco.bytes_in_flight == 0

    def _close_quic(self) -> None:
        if self._pending_close is None:
            return
        code, reason = self._pending_close
        self._pending_close = None
        if self._close_timer is not None:
            self._close_timer.cancel()
        self._quic.close(error_code=code, reason_phrase=reason)
        self._schedule_transmit()

    @property
    def terminated(self) -> bool:
        return self._terminated.is_set()

    def abandon(self, code: ErrorCode, detail: str) -> None:
        """Drop a connection whose handshake never completed, sending nothing: its
        Initial may have come from a forged address, and there is nobody to tell.
        It terminates at once, so that what it held goes now."""
        if self._terminated.is_set():
            return
        self._mark_closed(code, detail)
        self._pending_close = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transmit_handle is not None:
            self._transmit_handle.cancel()
            self._transmit_handle = None
        if self._close_timer is not None:
            self._close_timer.cancel()
            self._close_timer = None
        self._terminated.set()
        for callback in self._on_terminated:
            callback()

    async def wait_terminated(self) -> tuple[ErrorCode, str]:
        await self._terminated.wait()
        assert self._close_reason is not None
        return self._close_reason

    def _mark_closed(self, code: ErrorCode, detail: str) -> None:
        if self._close_reason is not None:
            return
        self._close_reason = (code, detail)
        self._phase = _Phase.CLOSED
        self._inbound.release()
        if self._frame_timer is not None:
            self._frame_timer.cancel()
            self._frame_timer = None
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        if not self.opened.done():
            self.opened.set_exception(LinkClosed(code, detail))
        self._inbox.close(code, detail)
        self._wake_drainers()

    # --- QUIC side ----------------------------------------------------------------

    def datagram_received(self, data: bytes | str, addr: tuple[object, ...]) -> None:
        # Unlike aioquic's protocol, no transmit() per datagram: the one scheduled
        # here runs after the whole batch the UDP transport is delivering
        # (cco.transport.udp), so a burst of datagrams costs one transmit.
        assert isinstance(data, bytes)
        if self.peer is None:
            self.peer = peer_key(addr)
        if self._unreachable.suspects:
            self._unreachable.heard(peer_key(addr))
        self._quic.receive_datagram(data, addr, now=time.monotonic())
        self._after_receiving()

    def segments_received(self, data: bytes, segment_size: int, addr: tuple[object, ...]) -> None:
        if self._unreachable.suspects:
            self._unreachable.heard(peer_key(addr))
        self._cco.receive_segments(data, segment_size, addr, now=time.monotonic())
        self._after_receiving()

    def ports_unreachable(self, addrs: list[tuple[str, int]]) -> None:
        """ICMP port-unreachable reports about datagrams sent to ``addrs``.  Once they
        confirm that the peer's port is closed (:class:`UnreachableTracker`), the peer
        is gone: the link ends at once with PEER_LOST, instead of after the liveness
        window.  Only an open session counts: a handshake retries on its own."""
        if self._phase is not _Phase.OPEN:
            return
        now = time.monotonic()
        for addr in addrs:
            if addr == self.peer and self._unreachable.report(addr, now):
                host, port = addr
                self._lose_peer(
                    f"port {host}:{port} unreachable: the peer's process is gone "
                    f"(ICMP reports for {CONFIRM_SPAN:g} s)"
                )
                return

    def _peer_name(self) -> str:
        return self.opened.result().node_id if self.opened.done() and not self.opened.exception() else "?"

    def _lose_peer(self, detail: str) -> None:
        """The peer cannot answer: closed now, without waiting for acknowledgements."""
        logger.warning("%s: link to %s at %s: %s", self._local.node_id, self._peer_name(), self.peer, detail)
        self._mark_closed(ErrorCode.PEER_LOST, detail)
        self._pending_close = (int(ErrorCode.PEER_LOST), _truncate(detail, _MAX_REASON))
        self._close_quic()

    def _after_receiving(self) -> None:
        self._process_events()
        self._schedule_transmit()
        termination = self._cco.termination
        if termination is not None and self._close_reason is None:
            self._mark_closed(*describe_termination(termination))  # the peer closed

    def _process_events(self) -> None:
        """Take the events QUIC has ready; consecutive stream data of one stream as one run.

        The stack reports one event per STREAM frame, so one per datagram of a large
        message.  Handed on one by one, each paid for the whole dispatch (event
        type tests, stream lookup, bounds, frame timer); a run pays for it once, and
        the frame decoder sees its pieces in one call.  Every other event goes the
        way aioquic's protocol takes it, in order.
        """
        next_event = self._quic.next_event
        event = next_event()
        while event is not None:
            if type(event) is not events.StreamDataReceived:
                self._on_quic_event(event)
                event = next_event()
                continue
            stream_id = event.stream_id
            pieces = [event.data]
            end_stream = event.end_stream
            event = next_event()
            while (
                not end_stream and type(event) is events.StreamDataReceived and event.stream_id == stream_id
            ):
                pieces.append(event.data)
                end_stream = event.end_stream
                event = next_event()
            if self._close_reason is None:
                self._guarded(self._on_stream_data, stream_id, pieces, end_stream)

    def _on_quic_event(self, event: events.QuicEvent) -> None:
        """One event other than stream data: aioquic's bookkeeping for it, then ours.
        (Its waiters for ``wait_connected`` and ``ping`` are left out: a link uses
        neither.)"""
        if isinstance(event, events.ConnectionIdIssued):
            self._connection_id_issued_handler(event.connection_id)
        elif isinstance(event, events.ConnectionIdRetired):
            self._connection_id_retired_handler(event.connection_id)
        elif isinstance(event, events.ConnectionTerminated):
            self._connection_terminated_handler()
            self._closed.set()
        self.quic_event_received(event)

    def _guarded(self, handler: Callable[..., None], *args: object) -> None:
        """Run ``handler``: a bug of ours must cost this connection, not the event
        loop's callback (which, on a server, is shared by every connection)."""
        try:
            handler(*args)
        except Exception:
            logger.exception("internal error on CCO link; closing it")
            self.fail(ErrorCode.INTERNAL_ERROR, "internal error")

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.ConnectionTerminated):
            self._mark_closed(*describe_termination(event))
            self._pending_close = None
            if self._close_timer is not None:
                self._close_timer.cancel()
            self._terminated.set()
            for callback in self._on_terminated:
                callback()
        elif self._close_reason is None:
            self._guarded(self._on_event, event)

    def _on_event(self, event: events.QuicEvent) -> None:
        """An event other than stream data (:meth:`_process_events` takes that)."""
        if isinstance(event, events.HandshakeCompleted):
            self._on_handshake_completed(event)
        elif isinstance(event, (events.StreamReset, events.StopSendingReceived)):
            self.fail(ErrorCode.PROTOCOL_VIOLATION, f"stream {event.stream_id} was reset or stopped")

    def _on_handshake_completed(self, event: events.HandshakeCompleted) -> None:
        self.on_handshake()
        if event.alpn_protocol != ALPN:
            self.fail(ErrorCode.UNSUPPORTED_VERSION, f"ALPN {event.alpn_protocol!r} is not {ALPN!r}")
            return
        self._phase = _Phase.HELLO
        if self._is_client:
            self._hello = build_hello(self._local, self._config.versions)
            self._write(CONTROL_STREAM_ID, encode_frame(encode_message(self._hello)))
        else:
            self._hello_timer = self._loop.call_later(
                self._config.hello_timeout,
                self.fail,
                ErrorCode.TIMEOUT,
                f"no Hello within {self._config.hello_timeout} s of the TLS handshake",
            )

    def _on_stream_data(self, stream_id: int, pieces: list[bytes], end_stream: bool) -> None:
        """A run of data received on one stream, in order, ending it if ``end_stream``."""
        try:
            stream = self._inbound.stream(stream_id)
            frames = self._inbound.feed(stream, pieces)
        except CcoError as exc:  # DecodeError too
            detail = f"stream {stream_id}: {exc.detail}" if isinstance(exc, DecodeError) else exc.detail
            self.fail(exc.code, detail)
            return
        if stream.decoder.buffered and self._frame_timer is None:
            self._frame_timer = self._loop.call_later(self._config.frame_timeout, self._check_frames)
        for frame in frames:
            if not self._on_frame(stream, frame):
                return
        if end_stream:
            if not stream.decoder.at_boundary():
                self.fail(ErrorCode.FRAMING_ERROR, f"stream {stream_id} ended inside a frame")
            elif stream.is_control:
                self.fail(ErrorCode.PROTOCOL_VIOLATION, "the control stream was finished")
            else:
                self._inbound.end(stream_id)

    def _check_frames(self) -> None:
        """Fail the connection if a frame made no progress for ``frame_timeout`` seconds;
        otherwise look again when the stalest one would."""
        self._frame_timer = None
        if self._close_reason is not None:
            return
        try:
            again = self._inbound.next_check()
        except CcoError as exc:
            self.fail(exc.code, exc.detail)
            return
        if again is not None:
            self._frame_timer = self._loop.call_later(again - time.monotonic(), self._check_frames)

    def _on_frame(self, stream: InboundStream, frame: list[bytes | memoryview]) -> bool:
        """Handle one complete frame, given as the pieces it arrived in; False once the
        connection has been failed."""
        size = sum(map(len, frame))
        try:
            message = decode_message_pieces(frame)
        except DecodeError as exc:
            if self._config.close_on_decode_error or self._phase is not _Phase.OPEN:
                self.fail(exc.code, exc.detail)
                return False
            self._inbox.put(exc, size)
            return True
        if stream.is_control:
            self._on_control_message(message, size)
        else:
            self._on_data_message(stream, message, size)
        return self._close_reason is None

    def _on_control_message(self, message: Message, size: int) -> None:
        if self._phase is _Phase.HELLO:
            if self._is_client:
                self._on_hello_answer(message)
            elif isinstance(message, Hello):
                self._on_hello(message)
            else:
                self.fail(ErrorCode.PROTOCOL_VIOLATION, f"expected Hello, got {type(message).__name__}")
        elif self._phase is not _Phase.OPEN:
            self.fail(ErrorCode.PROTOCOL_VIOLATION, "control message before the TLS handshake completed")
        elif isinstance(message, (Hello, HelloAck)):
            self.fail(ErrorCode.PROTOCOL_VIOLATION, f"{type(message).__name__} after the session opened")
        elif isinstance(message, DATA_MESSAGES):
            self.fail(ErrorCode.PROTOCOL_VIOLATION, f"{type(message).__name__} on the control stream")
        else:
            self._inbox.put(message, size)

    def _on_data_message(self, stream: InboundStream, message: Message, size: int) -> None:
        if not isinstance(message, DATA_MESSAGES):
            self.fail(ErrorCode.PROTOCOL_VIOLATION, f"{type(message).__name__} on a data stream")
            return
        if stream.group_id is None:
            stream.group_id = message.group_id
        elif message.group_id != stream.group_id:
            self.fail(ErrorCode.PROTOCOL_VIOLATION, "a data stream carries messages of two groups")
            return
        # A client may see data overtake the HelloAck (another stream, another
        # packet), so it queues it; a server has sent no HelloAck yet, so data
        # before Hello is a violation.
        if self._phase is _Phase.OPEN or (self._is_client and self._phase is _Phase.HELLO):
            self._inbox.put(message, size)
        else:
            self.fail(ErrorCode.PROTOCOL_VIOLATION, "data message before the session opened")

    def _on_hello(self, hello: Hello) -> None:
        assert self._cco.peer_identity is not None
        try:
            ack, session = negotiate(hello, self._local, self._cco.peer_identity, self._config.versions)
        except CcoError as exc:
            # Error first, then the close; transmit in between, because a closing
            # QUIC connection sends nothing but CONNECTION_CLOSE.  Both carry the code.
            error = Error(
                code=exc.code, detail=_truncate(exc.detail, _MAX_DETAIL), message_type=MessageType.HELLO
            )
            self._write(CONTROL_STREAM_ID, encode_frame(encode_message(error)))
            self.transmit()
            self.fail(exc.code, exc.detail)
            return
        self._write(CONTROL_STREAM_ID, encode_frame(encode_message(ack)))
        self._open(session)

    def _on_hello_answer(self, message: Message) -> None:
        assert self._hello is not None and self._cco.peer_identity is not None
        if isinstance(message, Error):
            self.fail(message.code, f"the server refused the session: {message.detail}")
        elif isinstance(message, HelloAck):
            try:
                session = accept_hello_ack(message, self._hello, self._cco.peer_identity)
            except CcoError as exc:
                self.fail(exc.code, exc.detail)
                return
            self._open(session)
        else:
            self.fail(ErrorCode.PROTOCOL_VIOLATION, f"expected HelloAck, got {type(message).__name__}")

    def _open(self, session: Session) -> None:
        self._phase = _Phase.OPEN
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self._send_limit = min(self._config.max_message_size, session.capabilities.max_message_size)
        self.opened.set_result(PeerLink(self, session))
