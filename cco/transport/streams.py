"""How CCO messages map onto one connection's QUIC streams, and each stream's
receive state (draft section "QUIC Mapping"):

* The client's first bidirectional stream (id 0) is the **control stream**:
  ``Hello`` / ``HelloAck`` first, then ``Error``, ``Heartbeat``, membership and
  control messages in both directions.
* **Data messages** (chunks, ``ChunkAck``, ``RetransmitRequest``, ``Abort``) travel
  on unidirectional streams, one per (direction, group): opened on first use and
  kept, so the messages of one group stay in order and a loss in one group never
  stalls another.  Every message on a data stream carries the same ``group_id``.
  (aioquic lets a peer open 128 unidirectional streams, qh3 103, and raises that
  limit only as streams end, so one connection carries at most 128 (qh3: 103)
  groups' data in each direction; the next group's data waits.)
* Every message is a frame (:mod:`cco.wire.framing`); each stream has its own
  :class:`FrameDecoder`, since QUIC keeps no message boundaries.

:class:`~cco.transport.link.LinkProtocol` drives these over the connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from cco.wire.errors import CcoError, ErrorCode
from cco.wire.framing import FrameDecoder
from cco.wire.messages import Abort, ChunkAck, ChunkMessage, RetransmitRequest

CONTROL_STREAM_ID = 0
DATA_MESSAGES = (ChunkMessage, ChunkAck, RetransmitRequest, Abort)
"""Message classes that travel on per-group data streams; all others use the control stream."""


def is_control_stream(stream_id: int, is_client: bool) -> bool:
    """Whether a stream the peer started using is the control stream (True) or one of
    its data streams (False); PROTOCOL_VIOLATION for any other stream.

    Stream id bits (RFC 9000, section 2.1): 0x1 is set on server-initiated
    streams, 0x2 on unidirectional ones.
    """
    peer_initiated = bool(stream_id & 0x1) == is_client
    if stream_id == CONTROL_STREAM_ID:
        return True
    if peer_initiated and stream_id & 0x2:
        return False
    raise CcoError(
        ErrorCode.PROTOCOL_VIOLATION, f"stream {stream_id} is neither the control nor a data stream"
    )


class InboundStream:
    """Receive state of one stream: its decoder, for data streams its group, and when
    its unfinished frame last grew."""

    __slots__ = ("decoder", "group_id", "is_control", "progress")

    def __init__(self, max_message_size: int, is_control: bool) -> None:
        self.decoder = FrameDecoder(max_message_size)
        self.is_control = is_control
        self.group_id: bytes | None = None
        self.progress = 0.0


class UnfinishedFrames:
    """Bytes of frames received in part, held by all the connections of one node
    (a server shares one among the links it accepts), and the node's bound on them."""

    __slots__ = ("bytes", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0


class InboundStreams:
    """One connection's streams as received, and its share of the bounds on frames
    received in part (draft section "Resource Limits"): at most ``per_connection``
    bytes held in part on this connection, the node's :class:`UnfinishedFrames` across
    all its connections, and no frame left without progress for ``frame_timeout``
    seconds.  No loop: ``clock`` is read only when a frame is held in part (most
    stream data completes its frames), and a bound reached is a :class:`CcoError` that
    the link closes the connection with."""

    __slots__ = (
        "_clock",
        "_frame_timeout",
        "_is_client",
        "_max_message_size",
        "_node",
        "_per_connection",
        "streams",
        "unfinished",
    )

    def __init__(
        self,
        *,
        is_client: bool,
        max_message_size: int,
        per_connection: int,
        node: UnfinishedFrames,
        frame_timeout: float,
        clock: Callable[[], float],
    ) -> None:
        self._clock = clock
        self._is_client = is_client
        self._max_message_size = max_message_size
        self._per_connection = max(per_connection, max_message_size)  # one whole frame always fits
        self._node = node
        self._frame_timeout = frame_timeout
        self.streams: dict[int, InboundStream] = {}
        self.unfinished = 0
        """Bytes of frames received in part on this connection."""

    def stream(self, stream_id: int) -> InboundStream:
        """The receive state of ``stream_id``, made when the peer first uses it;
        PROTOCOL_VIOLATION for a stream that is neither the control nor a data stream."""
        stream = self.streams.get(stream_id)
        if stream is None:
            stream = InboundStream(self._max_message_size, is_control_stream(stream_id, self._is_client))
            self.streams[stream_id] = stream
        return stream

    def feed(self, stream: InboundStream, pieces: Iterable[bytes]) -> list[list[bytes | memoryview]]:
        """The frames ``pieces`` (a run of stream data, in order) complete on ``stream``,
        each as its pieces (:meth:`FrameDecoder.feed_run`).
        DecodeError for bad framing; RESOURCE_EXHAUSTED once what this connection or the
        node holds in part passes its bound (counted first, so that :meth:`release`
        gives it all back)."""
        decoder = stream.decoder
        held = decoder.buffered
        frames = decoder.feed_run(pieces)
        if held or decoder.buffered:
            self._count(stream, decoder.buffered - held)
        return frames

    def _count(self, stream: InboundStream, grown: int) -> None:
        self.unfinished += grown
        node = self._node
        node.bytes += grown
        if stream.decoder.buffered:
            stream.progress = self._clock()
        if self.unfinished > self._per_connection:
            raise CcoError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"limit unfinished_bytes_per_connection ({self._per_connection}) reached: "
                "frames received in part",
            )
        if node.bytes > node.limit:
            raise CcoError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"limit unfinished_bytes ({node.limit}) reached: frames received in part by all connections",
            )

    def next_check(self) -> float | None:
        """When, by ``clock``, the stalest frame held in part would stall (None: none
        is held); TIMEOUT if it already has."""
        waiting = [(s.progress, stream_id) for stream_id, s in self.streams.items() if s.decoder.buffered]
        if not waiting:
            return None
        progress, stream_id = min(waiting)
        if self._clock() - progress >= self._frame_timeout:
            raise CcoError(
                ErrorCode.TIMEOUT,
                f"limit frame_timeout ({self._frame_timeout:g} s) reached: "
                f"the frame on stream {stream_id} stalled",
            )
        return progress + self._frame_timeout

    def end(self, stream_id: int) -> None:
        """The peer finished a data stream at a frame boundary: nothing of it is held."""
        del self.streams[stream_id]

    def release(self) -> None:
        """The connection is closed: what it held in part goes back to the node at once,
        not when the connection object goes."""
        self._node.bytes -= self.unfinished
        self.unfinished = 0
        self.streams.clear()
