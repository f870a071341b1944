"""``messages.json``: valid messages, at least one per message type, more where a type
has optional fields or edge values (the catalogue is :mod:`cco.interop.samples`).

The check holds every vector to the equations of interop/README.md with this
implementation's codec: decode(encoded) = fields, encode(fields) = encoded, the body's
own encoding, the frame.
"""

from __future__ import annotations

from cco.interop.jsonform import JsonFormError, from_hex, message_from_json, message_to_json
from cco.interop.samples import samples
from cco.interop.samples.common import Sample
from cco.interop.vectorfiles.common import Vector, checked, run
from cco.wire import cbor
from cco.wire.errors import CcoError
from cco.wire.framing import encode_frame
from cco.wire.messages import MESSAGE_CLASSES, ChunkMessage, decode_message, encode_message
from cco.wire.registries import MessageType

FILE = "messages.json"


def _spec_section(message_type: MessageType) -> str:
    """The draft anchor of the section that defines ``message_type``."""
    if issubclass(MESSAGE_CLASSES[message_type], ChunkMessage):
        return "chunk-messages"
    return "msg-" + message_type.name.lower().replace("_", "-")


def _vector(sample: Sample) -> Vector:
    message = sample.message
    encoded = encode_message(message)
    return {
        "name": sample.name,
        "description": sample.description,
        "spec_section": _spec_section(message.TYPE),
        "message_type": int(message.TYPE),
        "message_name": message.TYPE.name,
        "fields": message_to_json(message),
        "body_cbor": cbor.encode(message.to_map()).hex(),
        "encoded": encoded.hex(),
        "framed": encode_frame(encoded).hex(),
    }


def vectors() -> list[Vector]:
    return checked(FILE, [_vector(s) for s in samples()], check)


def _check_one(vector: Vector) -> list[str]:
    """decode(encoded) = fields, encode(fields) = encoded, framed = varint(len) || encoded."""
    try:
        encoded = from_hex(vector["encoded"], "encoded")
        expected = message_from_json(vector["message_type"], vector["fields"])
        decoded = decode_message(encoded)
        reencoded = encode_message(expected)
        body = cbor.encode(expected.to_map())
        framed = encode_frame(encoded)
    except (KeyError, JsonFormError, CcoError) as exc:
        return [f"{type(exc).__name__}: {exc}"]
    problems: list[str] = []
    if decoded != expected:
        problems.append("decode(encoded) differs from fields")
    if reencoded != encoded:
        problems.append("encode(fields) differs from encoded")
    if message_to_json(decoded) != vector["fields"]:
        problems.append("fields are not in their canonical JSON form")
    if vector.get("message_name") != MessageType(vector["message_type"]).name:
        problems.append("message_name does not match message_type")
    if "body_cbor" in vector and vector["body_cbor"] != body.hex():
        problems.append("body_cbor differs from the encoding of the body map")
    if vector.get("framed") != framed.hex():
        problems.append("framed differs from varint(len(encoded)) || encoded")
    return problems


def check(vectors: list[Vector]) -> list[str]:
    return run(vectors, _check_one)
