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
