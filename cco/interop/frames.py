"""The catalogue behind ``framing.json``: frames on a QUIC stream.

A frame is ``varint(len(m)) || m`` with the QUIC variable-length integer in its
shortest form.  The valid frames put real messages at the edges of the varint
size classes (63/64 bytes, 16383/16384 bytes) and at a stated size limit; the
invalid ones use a longer varint form than needed (FRAMING_ERROR) or announce a
length above the receiver's limit (MESSAGE_TOO_LARGE), which a receiver must
refuse as soon as the length prefix is complete, before any body arrives.
"""

from __future__ import annotations

from dataclasses import dataclass

from cco.interop.samples.common import det_bytes, group_id
from cco.wire.errors import ErrorCode
from cco.wire.framing import DEFAULT_MAX_MESSAGE_SIZE, encode_varint
from cco.wire.messages import Contribution, Heartbeat, Message, encode_message
from cco.wire.registries import Collective, DType, ReduceOp


@dataclass(frozen=True, slots=True)
class Frame:
    """One valid frame: a message and the limit it is received under."""

    name: str
    description: str
    message: bytes
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE


@dataclass(frozen=True, slots=True)
class BadFrame:
    """Stream bytes a frame decoder must refuse with ``error``."""

    name: str
    description: str
    mutation: str
    framed: bytes
    error: ErrorCode
    base: bytes | None = None
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE


def _contribution(elements: int) -> Message:
    """A one-chunk int8 SUM contribution of ``elements`` fixed pseudo-random bytes."""
    return Contribution(
        group_id=group_id("training"),
        epoch=3,
        op_id=11,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.INT8,
        total_elements=elements,
        chunk_elements=max(1, elements),
        chunk_index=0,
        contributors=b"\x01",
        width=1,
        payload=det_bytes(f"frame-payload/{elements}", elements),
        tag=0,
    )


def message_of_length(length: int) -> bytes:
    """A valid contribution whose encoding is exactly ``length`` bytes long."""
    # The header grows by a byte or two as the element count crosses CBOR's
    # argument sizes, so search just below the target rather than solving for it.
    for elements in range(max(0, length - 80), length + 1):
        encoded = encode_message(_contribution(elements))
        if len(encoded) == length:
            return encoded
    raise ValueError(f"no contribution encodes to exactly {length} bytes")


def frames() -> list[Frame]:
    smallest = encode_message(Heartbeat(seq=0))
    return [
        Frame("frame-heartbeat", "A 5-byte heartbeat: one-byte length prefix.", smallest),
        Frame(
            "frame-63",
            "A 63-byte message: the largest length with a one-byte varint (6 bits).",
            message_of_length(63),
        ),
        Frame(
            "frame-64",
            "A 64-byte message: the smallest length needing a two-byte varint (prefix 40 40).",
            message_of_length(64),
        ),
        Frame(
            "frame-16383",
            "A 16383-byte message: the largest length with a two-byte varint (prefix 7f ff).",
            message_of_length(16383),
        ),
        Frame(
            "frame-16384",
            "A 16384-byte message: the smallest length needing a four-byte varint (prefix 80 00 40 00).",
            message_of_length(16384),
        ),
        Frame(
            "frame-at-limit",
            "A 1024-byte message received with max_message_size 1024: exactly at the limit.",
            message_of_length(1024),
            max_message_size=1024,
        ),
    ]


def bad_frames() -> list[BadFrame]:
    smallest = encode_message(Heartbeat(seq=0))
    at_63 = message_of_length(63)
    at_1025 = message_of_length(1025)
    return [
        BadFrame(
            "varint-two-byte-for-5",
            "Length 5 in the two-byte varint form (40 05); its shortest form is one byte (05).",
            "rewrite the length prefix 05 as 40 05",
            b"\x40\x05" + smallest,
            ErrorCode.FRAMING_ERROR,
            base=encode_varint(5) + smallest,
        ),
        BadFrame(
            "varint-two-byte-for-0",
            "Length 0 in the two-byte varint form (40 00); the prefix alone must be refused.",
            "the two bytes 40 00 and nothing else",
            b"\x40\x00",
            ErrorCode.FRAMING_ERROR,
        ),
        BadFrame(
            "varint-four-byte-for-63",
            "Length 63 in the four-byte varint form (80 00 00 3f); its shortest form is 3f.",
            "rewrite the length prefix 3f as 80 00 00 3f",
            b"\x80\x00\x00\x3f" + at_63,
            ErrorCode.FRAMING_ERROR,
            base=encode_varint(63) + at_63,
        ),
        BadFrame(
            "varint-eight-byte-for-16383",
            "Length 16383 in the eight-byte varint form; its shortest form is 7f ff.  Only the "
            "prefix is given: it must be refused before any body arrives.",
            "the eight bytes c0 00 00 00 00 00 3f ff",
            b"\xc0\x00\x00\x00\x00\x00\x3f\xff",
            ErrorCode.FRAMING_ERROR,
        ),
        BadFrame(
            "length-over-default-limit",
            "Length 2^24+1 (81 00 00 01) exceeds the default max_message_size of 16 MiB "
            "(2^24 = 16777216).  Only the prefix is given.",
            "the four bytes 81 00 00 01",
            encode_varint(DEFAULT_MAX_MESSAGE_SIZE + 1),
            ErrorCode.MESSAGE_TOO_LARGE,
        ),
        BadFrame(
            "length-eight-byte-class",
            "Length 2^30, the smallest needing an eight-byte varint, exceeds the default "
            "max_message_size of 16 MiB.  Only the prefix is given.",
            "the eight bytes c0 00 00 00 40 00 00 00",
            encode_varint(1 << 30),
            ErrorCode.MESSAGE_TOO_LARGE,
        ),
        BadFrame(
            "length-varint-max",
            "Length 2^62-1, the largest varint, exceeds any limit.  Only the prefix is given.",
            "the eight bytes ff ff ff ff ff ff ff ff",
            encode_varint((1 << 62) - 1),
            ErrorCode.MESSAGE_TOO_LARGE,
        ),
        BadFrame(
            "varint-non-shortest-and-over-limit",
            "Length 2000 in the four-byte varint form (80 00 07 d0) for a receiver whose limit is "
            "1024: both too long a prefix and too large a message.  The shortest-form rule is "
            "checked first, so the code is FRAMING_ERROR.  Only the prefix is given.",
            "the four bytes 80 00 07 d0, limit 1024",
            b"\x80\x00\x07\xd0",
            ErrorCode.FRAMING_ERROR,
            max_message_size=1024,
        ),
        BadFrame(
            "length-over-stated-limit",
            "A complete 1025-byte message received with max_message_size 1024.",
            "frame a 1025-byte message for a receiver whose limit is 1024",
            encode_varint(1025) + at_1025,
            ErrorCode.MESSAGE_TOO_LARGE,
            max_message_size=1024,
        ),
    ]
