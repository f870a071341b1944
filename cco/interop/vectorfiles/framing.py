"""``framing.json``: valid and invalid frames (length-prefixed messages on a QUIC
stream; the catalogue is :mod:`cco.interop.frames`).

The check frames and unframes each vector with this implementation, whole and one
byte at a time.
"""

from __future__ import annotations

from cco.interop.frames import BadFrame, Frame, bad_frames, frames
from cco.interop.jsonform import from_hex
from cco.interop.vectorfiles.common import Vector, checked, run
from cco.interop.vectorfiles.decode_failures import expect_failure
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.framing import FrameDecoder, decode_varint, encode_frame, encode_varint
from cco.wire.messages import decode_message

FILE = "framing.json"


def _frame(frame: Frame) -> Vector:
    prefix = encode_varint(len(frame.message))
    return {
        "name": frame.name,
        "description": frame.description,
        "spec_section": "framing",
        "max_message_size": frame.max_message_size,
        "message_length": len(frame.message),
        "length_prefix": prefix.hex(),
        "message": frame.message.hex(),
        "framed": (prefix + frame.message).hex(),
    }


def _bad_frame(frame: BadFrame) -> Vector:
    vector: Vector = {
        "name": frame.name,
        "fail": True,
        "description": frame.description,
        "spec_section": "framing",
        "mutation": frame.mutation,
        "max_message_size": frame.max_message_size,
    }
    if frame.base is not None:
        vector["base"] = frame.base.hex()
    vector |= {"framed": frame.framed.hex(), "error_code": int(frame.error), "error_name": frame.error.name}
    return vector


def vectors() -> list[Vector]:
    return checked(FILE, [_frame(f) for f in frames()] + [_bad_frame(f) for f in bad_frames()], check)


def _feed_bytewise(data: bytes, max_message_size: int) -> list[bytes]:
    decoder = FrameDecoder(max_message_size)
    frames: list[bytes] = []
    for i in range(len(data)):
        frames += decoder.feed(data[i : i + 1])
    return frames


def _check_one(vector: Vector) -> list[str]:
    """Positive: framed = varint(len(m)) || m, and a decoder returns m whatever the pieces.

    Negative: a frame decoder with ``max_message_size`` MUST fail with error_code.
    """
    try:
        framed = from_hex(vector["framed"], "framed")
        limit = vector["max_message_size"]
        if vector.get("fail"):
            code = ErrorCode(vector["error_code"])
        else:
            message = from_hex(vector["message"], "message")
            prefix = from_hex(vector["length_prefix"], "length_prefix")
    except (KeyError, ValueError) as exc:
        return [f"{type(exc).__name__}: {exc}"]
    if vector.get("fail"):
        problems = []
        if vector.get("error_name") != code.name:
            problems.append("error_name does not match error_code")
        for how, feed in (
            ("whole", lambda: FrameDecoder(limit).feed(framed)),
            ("bytewise", lambda: _feed_bytewise(framed, limit)),
        ):
            outcome = expect_failure(feed, code)
            if outcome is not None:
                problems.append(f"fed {how}, the stream {outcome}")
        return problems
    problems = []
    if vector.get("message_length") != len(message):
        problems.append("message_length is not len(message)")
    if decode_varint(prefix) != (len(message), len(prefix)) or prefix + message != framed:
        problems.append("framed is not length_prefix || message with the shortest varint")
    try:
        if encode_frame(message, limit) != framed:
            problems.append("encode_frame(message) differs from framed")
        if FrameDecoder(limit).feed(framed) != [message] or _feed_bytewise(framed, limit) != [message]:
            problems.append("a frame decoder does not return exactly the message")
        decode_message(message)
    except CcoError as exc:
        problems.append(f"{exc}")
    return problems


def check(vectors: list[Vector]) -> list[str]:
    return run(vectors, _check_one)
