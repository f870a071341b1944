"""Message framing for QUIC streams.

A QUIC stream is a byte stream: one write can arrive in many pieces and several
writes in one.  Every CCO message on a stream is therefore sent as a frame: its
length as a QUIC variable-length integer (RFC 9000, section 16) in its shortest
form, then that many bytes of CBOR (draft section "Framing").

:class:`FrameDecoder` is the receiving half.  It refuses a frame longer than its
limit as soon as the length prefix is complete, so a peer cannot make it buffer
more than ``max_message_size`` plus one prefix, whatever length it claims.
"""

from __future__ import annotations

from collections.abc import Iterable

from cco.wire.errors import DecodeError, EncodeError, ErrorCode

DEFAULT_MAX_MESSAGE_SIZE = 16 * 1024 * 1024
VARINT_MAX = (1 << 62) - 1


def encode_varint(value: int) -> bytes:
    """Encode ``value`` as a QUIC variable-length integer in its shortest form."""
    if value < 0 or value > VARINT_MAX:
        raise EncodeError(ErrorCode.FRAMING_ERROR, f"{value} does not fit a QUIC varint")
    if value < 1 << 6:
        return value.to_bytes(1, "big")
    if value < 1 << 14:
        return (value | 0x4000).to_bytes(2, "big")
    if value < 1 << 30:
        return (value | 0x8000_0000).to_bytes(4, "big")
    return (value | 0xC000_0000_0000_0000).to_bytes(8, "big")


def decode_varint(data: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int] | None:
    """Decode a varint at ``pos``; return (value, next_pos), or None if incomplete.

    A varint that is not in its shortest form is refused: framing, like the CBOR
    inside it, has exactly one encoding.
    """
    if pos >= len(data):
        return None
    first = data[pos]
    size = 1 << (first >> 6)
    if pos + size > len(data):
        return None
    value = first & 0x3F
    for byte in data[pos + 1 : pos + size]:
        value = (value << 8) | byte
    if size > 1 and value < 1 << (8 * (size // 2) - 2):
        raise DecodeError(ErrorCode.FRAMING_ERROR, f"length {value} is not in its shortest varint form")
    return value, pos + size


def frame_prefix(length: int, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> bytes:
    """The length prefix of a frame whose message is ``length`` bytes.

    A sender that writes the prefix and the message as two pieces of one stream
    never copies the message to join them; for a chunk's message that copy was about
    1% of an aggregator's CPU, once per child."""
    if length > max_message_size:
        raise EncodeError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"message of {length} bytes exceeds the limit of {max_message_size}",
        )
    return encode_varint(length)


def encode_frame(message: bytes, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> bytes:
    """Prefix ``message`` with its length."""
    return frame_prefix(len(message), max_message_size) + message


class FrameDecoder:
    """Reassembles frames from stream data received in arbitrary pieces.

    A frame's body is kept as the list of pieces it arrived in: growing one buffer
    piece by piece costs a reallocation and copy of everything buffered so far at
    each step, which for a 1 MiB frame in 16 KB pieces was about 15 times the cost
    of a single join, and a receiver that decodes the pieces where they lie
    (:meth:`feed_run`) copies a large payload once, into the bytes it keeps, instead
    of joining the frame and then copying the payload out of it.

    A receiver takes stream data in runs of pieces (one per QUIC STREAM frame, so
    one per datagram): a piece that only extends the body of the pending frame is
    appended without parsing anything, since most pieces of a large message are
    such pieces (``benchmarks/probes/bench_wire_path.py`` measures the receive path).
    """

    __slots__ = ("_head", "_parts", "_pending_length", "_received", "max_message_size")

    def __init__(self, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> None:
        self.max_message_size = max_message_size
        self._head = b""  # start of a length prefix split across pieces (under 8 bytes)
        self._parts: list[bytes | memoryview] = []
        self._received = 0  # bytes of the pending frame's body in _parts
        self._pending_length: int | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame."""
        return len(self._head) + self._received

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return every frame body now complete, in order."""
        return [b"".join(frame) for frame in self.feed_run((data,))]

    def feed_run(self, pieces: Iterable[bytes]) -> list[list[bytes | memoryview]]:
        """Add received pieces, in order; return every frame body now complete, each
        as the pieces it arrived in (:func:`cco.wire.cbor.decode_pieces` reads them
        without joining them first).

        The pieces are read-only views of the data given, or that data itself: a
        frame keeps alive at most the pieces it came in, and only as long as the
        caller keeps it (a decoder copies what it keeps out of it)."""
        frames: list[list[bytes | memoryview]] = []
        for data in pieces:
            pending = self._pending_length
            if pending is not None and len(data) < pending - self._received:
                self._parts.append(data)  # inside the body: nothing to parse
                self._received += len(data)
            else:
                self._feed(memoryview(data), frames)
        return frames

    def _feed(self, view: memoryview, frames: list[list[bytes | memoryview]]) -> None:
        while True:
            if self._pending_length is None:
                head = self._head + bytes(view[:8])
                parsed = decode_varint(head)
                if parsed is None:
                    self._head = head  # all of view: a prefix is at most 8 bytes
                    return
                length, used = parsed
                if length > self.max_message_size:
                    raise DecodeError(
                        ErrorCode.MESSAGE_TOO_LARGE,
                        f"frame of {length} bytes exceeds the limit of {self.max_message_size}",
                    )
                view = view[used - len(self._head) :]
                self._head = b""
                self._pending_length = length
            take = min(self._pending_length - self._received, len(view))
            if take:
                self._parts.append(view[:take])
                self._received += take
            if self._received < self._pending_length:
                return
            frames.append(self._parts)
            self._parts = []
            view = view[take:]
            self._received = 0
            self._pending_length = None
            if not view:
                return

    def at_boundary(self) -> bool:
        """True when no partial frame is buffered (a clean place for a stream to end)."""
        return not self._head and self._pending_length is None
