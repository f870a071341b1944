"""Vector provider for the wire layer: messages, decode failures and framing.

``vector_files()`` turns the catalogues in :mod:`cco.interop.samples`,
:mod:`cco.interop.failures` and :mod:`cco.interop.frames` into the JSON arrays
written to ``interop/vectors/``, then checks them with :mod:`cco.interop.verify`
so that a vector this implementation does not satisfy is never written.
"""

from __future__ import annotations

from typing import Any

from cco.interop.failures import Failure, base_bytes, failures
from cco.interop.frames import BadFrame, Frame, bad_frames, frames
from cco.interop.jsonform import message_to_json
from cco.interop.samples import Sample, samples
from cco.interop.verify import SEMANTIC_CHECKS, limits_to_json
from cco.wire import cbor
from cco.wire.framing import encode_frame, encode_varint
from cco.wire.messages import MESSAGE_CLASSES, ChunkMessage, encode_message
from cco.wire.registries import MessageType

Vector = dict[str, Any]


def spec_section(message_type: MessageType) -> str:
    """The draft anchor of the section that defines ``message_type``."""
    if issubclass(MESSAGE_CLASSES[message_type], ChunkMessage):
        return "chunk-messages"
    return "msg-" + message_type.name.lower().replace("_", "-")


def message_vector(sample: Sample) -> Vector:
    message = sample.message
    encoded = encode_message(message)
    return {
        "name": sample.name,
        "description": sample.description,
        "spec_section": spec_section(message.TYPE),
        "message_type": int(message.TYPE),
        "message_name": message.TYPE.name,
        "fields": message_to_json(message),
        "body_cbor": cbor.encode(message.to_map()).hex(),
        "encoded": encoded.hex(),
        "framed": encode_frame(encoded).hex(),
    }


def failure_vector(failure: Failure) -> Vector:
    return {
        "name": failure.name,
        "fail": True,
        "description": failure.description,
        "spec_section": "decoding",
        "mutation": failure.mutation,
        "base_vector": failure.base,
        "base": base_bytes(failure.base).hex(),
        "encoded": failure.encoded.hex(),
        "limits": limits_to_json(failure.limits),
        "error_code": int(failure.error),
        "error_name": failure.error.name,
        "cddl_valid": failure.cddl_valid,
    }


def frame_vector(frame: Frame) -> Vector:
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


def bad_frame_vector(frame: BadFrame) -> Vector:
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


def vector_files() -> dict[str, list[Vector]]:
    """File name -> array of vector objects, each checked before it is returned."""
    files = {
        "messages.json": [message_vector(s) for s in samples()],
        "decode_failures.json": [failure_vector(f) for f in failures()],
        "framing.json": [frame_vector(f) for f in frames()] + [bad_frame_vector(f) for f in bad_frames()],
    }
    for file_name, vectors in files.items():
        problems = SEMANTIC_CHECKS[file_name](vectors)
        if problems:
            raise AssertionError(f"{file_name}: generated vectors do not hold:\n" + "\n".join(problems))
    return files
