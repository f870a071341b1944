"""Checks a vector file against this implementation, reading only the JSON.

These are the rules of ``interop/README.md`` written as code; another
implementation runs the same equations against its own codec.  Each check
returns a list of problems (empty when every vector holds) rather than stopping
at the first, so one run reports everything that is wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cco.interop.jsonform import JsonFormError, from_hex, message_from_json, message_to_json
from cco.wire import cbor
from cco.wire.cbor import DecodeLimits
from cco.wire.errors import CcoError, DecodeError, ErrorCode
from cco.wire.framing import FrameDecoder, decode_varint, encode_frame
from cco.wire.messages import decode_message, encode_message
from cco.wire.registries import MessageType

Vector = dict[str, Any]
Check = Callable[[list[Vector]], list[str]]


def limits_from_json(value: object) -> DecodeLimits:
    """The ``limits`` object of a decode-failure vector."""
    if not isinstance(value, dict) or set(value) != {"max_depth", "max_container_items", "max_string_bytes"}:
        raise JsonFormError(f"limits must name max_depth, max_container_items, max_string_bytes: {value!r}")
    return DecodeLimits(**value)


def limits_to_json(limits: DecodeLimits) -> dict[str, int]:
    return {
        "max_depth": limits.max_depth,
        "max_container_items": limits.max_container_items,
        "max_string_bytes": limits.max_string_bytes,
    }


def _name(vector: Vector) -> str:
    return str(vector.get("name", "<unnamed>"))


def _unique_names(vectors: list[Vector]) -> list[str]:
    names = [_name(v) for v in vectors]
    return [f"{n}: name is not unique" for n in sorted({n for n in names if names.count(n) > 1})]


def check_message_vector(vector: Vector) -> list[str]:
    """decode(encoded) = fields, encode(fields) = encoded, framed = varint(len) || encoded."""
    name = _name(vector)
    try:
        encoded = from_hex(vector["encoded"], "encoded")
        expected = message_from_json(vector["message_type"], vector["fields"])
        decoded = decode_message(encoded)
        reencoded = encode_message(expected)
        body = cbor.encode(expected.to_map())
        framed = encode_frame(encoded)
    except (KeyError, JsonFormError, CcoError) as exc:
        return [f"{name}: {type(exc).__name__}: {exc}"]
    problems: list[str] = []
    if decoded != expected:
        problems.append(f"{name}: decode(encoded) differs from fields")
    if reencoded != encoded:
        problems.append(f"{name}: encode(fields) differs from encoded")
    if message_to_json(decoded) != vector["fields"]:
        problems.append(f"{name}: fields are not in their canonical JSON form")
    if vector.get("message_name") != MessageType(vector["message_type"]).name:
        problems.append(f"{name}: message_name does not match message_type")
    if "body_cbor" in vector and vector["body_cbor"] != body.hex():
        problems.append(f"{name}: body_cbor differs from the encoding of the body map")
    if vector.get("framed") != framed.hex():
        problems.append(f"{name}: framed differs from varint(len(encoded)) || encoded")
    return problems


def check_messages(vectors: list[Vector]) -> list[str]:
    problems = _unique_names(vectors)
    for vector in vectors:
        problems += check_message_vector(vector)
    return problems


def expect_failure(action: Callable[[], object], code: int) -> str | None:
    """None when ``action`` raises a codec error with ``code``, else what happened."""
    try:
        action()
    except CcoError as exc:
        if exc.code == code:
            return None
        return f"failed with {exc.code.name} ({int(exc.code)}) instead of {code}: {exc.detail}"
    return "was accepted"


def check_failure_vector(vector: Vector) -> list[str]:
    """decode(encoded, limits) MUST fail with error_code; the base decodes."""
    name = _name(vector)
    try:
        encoded = from_hex(vector["encoded"], "encoded")
        base = from_hex(vector["base"], "base")
        limits = limits_from_json(vector["limits"])
        code = ErrorCode(vector["error_code"])
    except (KeyError, ValueError) as exc:
        return [f"{name}: {type(exc).__name__}: {exc}"]
    problems: list[str] = []
    if vector.get("fail") is not True:
        problems.append(f"{name}: a negative vector must have fail: true")
    if vector.get("error_name") != code.name:
        problems.append(f"{name}: error_name does not match error_code")
    outcome = expect_failure(lambda: decode_message(encoded, limits), code)
    if outcome is not None:
        problems.append(f"{name}: encoded {outcome}")
    try:
        decode_message(base)
    except DecodeError as exc:
        problems.append(f"{name}: base does not decode: {exc}")
    return problems


def check_decode_failures(vectors: list[Vector]) -> list[str]:
    problems = _unique_names(vectors)
    for vector in vectors:
        problems += check_failure_vector(vector)
    return problems


def _feed_bytewise(data: bytes, max_message_size: int) -> list[bytes]:
    decoder = FrameDecoder(max_message_size)
    frames: list[bytes] = []
    for i in range(len(data)):
        frames += decoder.feed(data[i : i + 1])
    return frames


def check_frame_vector(vector: Vector) -> list[str]:
    """Positive: framed = varint(len(m)) || m, and a decoder returns m whatever the pieces.

    Negative: a frame decoder with ``max_message_size`` MUST fail with error_code.
    """
    name = _name(vector)
    try:
        framed = from_hex(vector["framed"], "framed")
        limit = vector["max_message_size"]
        if vector.get("fail"):
            code = ErrorCode(vector["error_code"])
        else:
            message = from_hex(vector["message"], "message")
            prefix = from_hex(vector["length_prefix"], "length_prefix")
    except (KeyError, ValueError) as exc:
        return [f"{name}: {type(exc).__name__}: {exc}"]
    if vector.get("fail"):
        problems = []
        if vector.get("error_name") != code.name:
            problems.append(f"{name}: error_name does not match error_code")
        for how, feed in (
            ("whole", lambda: FrameDecoder(limit).feed(framed)),
            ("bytewise", lambda: _feed_bytewise(framed, limit)),
        ):
            outcome = expect_failure(feed, code)
            if outcome is not None:
                problems.append(f"{name}: fed {how}, the stream {outcome}")
        return problems
    problems = []
    if vector.get("message_length") != len(message):
        problems.append(f"{name}: message_length is not len(message)")
    if decode_varint(prefix) != (len(message), len(prefix)) or prefix + message != framed:
        problems.append(f"{name}: framed is not length_prefix || message with the shortest varint")
    try:
        if encode_frame(message, limit) != framed:
            problems.append(f"{name}: encode_frame(message) differs from framed")
        if FrameDecoder(limit).feed(framed) != [message] or _feed_bytewise(framed, limit) != [message]:
            problems.append(f"{name}: a frame decoder does not return exactly the message")
        decode_message(message)
    except CcoError as exc:
        problems.append(f"{name}: {exc}")
    return problems


def check_framing(vectors: list[Vector]) -> list[str]:
    problems = _unique_names(vectors)
    for vector in vectors:
        problems += check_frame_vector(vector)
    return problems


def _payload_checks() -> dict[str, Check]:
    """The payload files' checks, which recompute every value from its definition
    (:mod:`cco.interop.reference`: exact rationals, Python integers, HMAC, AES)."""
    from cco.interop import vectors_blockscale, vectors_payload

    return {**vectors_payload.VECTOR_CHECKS, **vectors_blockscale.VECTOR_CHECKS}


SEMANTIC_CHECKS: dict[str, Check] = {
    "messages.json": check_messages,
    "decode_failures.json": check_decode_failures,
    "framing.json": check_framing,
    **_payload_checks(),
}
"""The vector files whose meaning is checked, by file name."""
