"""The JSON field form of a message, as written in the ``fields`` of a vector.

The form is derived from each message's wire declarations, so it cannot drift
from the codec: every field appears under its attribute name (snake_case, as in
the specification), integers and enum code points as JSON numbers, byte strings
as lowercase hex without ``0x``, text as JSON strings, nested structures as
objects and lists as arrays.  An absent optional field is omitted, as on the wire.

The parser is strict (unknown names, uppercase hex, booleans for integers are
refused) because a vector file that another implementation reads must mean one
thing only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import IntEnum
from typing import Any, TypeVar

from cco.wire.cbor import DecodeLimits
from cco.wire.fields import Bytes, Enum, FieldType, ListOf, Nested, Struct, Text, UInt
from cco.wire.messages import MESSAGE_CLASSES, Message
from cco.wire.payload import ChunkHeader
from cco.wire.registries import Collective, DType, MessageType, ReduceOp

S = TypeVar("S", bound=Struct)

_HEX = re.compile(r"(?:[0-9a-f]{2})*")


class JsonFormError(ValueError):
    """A ``fields`` object that does not describe a message of the named type."""


def to_hex(data: bytes) -> str:
    """Lowercase hex without a prefix: the vectors' only spelling of bytes."""
    return data.hex()


def from_hex(text: object, where: str = "value") -> bytes:
    """Parse lowercase hex; anything else is a :class:`JsonFormError`."""
    if not isinstance(text, str) or _HEX.fullmatch(text) is None:
        raise JsonFormError(f"{where}: expected lowercase hex, got {text!r}")
    return bytes.fromhex(text)


def struct_to_json(value: Struct) -> dict[str, Any]:
    """The JSON form of a message or nested structure."""
    out: dict[str, Any] = {}
    for name, spec in value.wire_fields():
        item = getattr(value, name)
        if item is not None:
            out[name] = _value_to_json(spec.kind, item)
    return out


def _value_to_json(kind: FieldType[Any], value: Any) -> Any:
    if isinstance(kind, Nested):
        return struct_to_json(value)
    if isinstance(kind, ListOf):
        return [_value_to_json(kind.item, v) for v in value]
    if isinstance(kind, Enum):
        return int(value)
    if isinstance(kind, Bytes):
        return to_hex(value)
    if isinstance(kind, (Text, UInt)):
        return value
    raise TypeError(f"no JSON form for field type {type(kind).__name__}")


def struct_from_json(cls: type[S], fields: object, where: str | None = None) -> S:
    """Build ``cls`` from its JSON form (no range checks: encoding does those)."""
    where = where or cls.__name__
    if not isinstance(fields, Mapping):
        raise JsonFormError(f"{where}: expected an object, got {type(fields).__name__}")
    specs = dict(cls.wire_fields())
    unknown = sorted(set(fields) - set(specs))
    if unknown:
        raise JsonFormError(f"{where}: unknown field(s) {', '.join(map(str, unknown))}")
    values = {
        name: _value_from_json(spec.kind, fields[name], f"{where}.{name}")
        for name, spec in specs.items()
        if name in fields
    }
    try:
        return cls(**values)
    except TypeError as exc:  # a required field is missing
        raise JsonFormError(f"{where}: {exc}") from None


def _value_from_json(kind: FieldType[Any], value: object, where: str) -> Any:
    if isinstance(kind, Nested):
        return struct_from_json(kind.struct_type, value, where)
    if isinstance(kind, ListOf):
        if not isinstance(value, list):
            raise JsonFormError(f"{where}: expected an array, got {type(value).__name__}")
        return tuple(_value_from_json(kind.item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(kind, Enum):
        return _enum_from_json(kind.enum_type, value, where)
    if isinstance(kind, Bytes):
        return from_hex(value, where)
    if isinstance(kind, Text):
        if not isinstance(value, str):
            raise JsonFormError(f"{where}: expected a string, got {type(value).__name__}")
        return value
    if isinstance(kind, UInt):
        if isinstance(value, bool) or not isinstance(value, int):
            raise JsonFormError(f"{where}: expected an integer, got {type(value).__name__}")
        return value
    raise TypeError(f"no JSON form for field type {type(kind).__name__}")


def _enum_from_json(enum_type: type[IntEnum], value: object, where: str) -> IntEnum:
    if isinstance(value, bool) or not isinstance(value, int):
        raise JsonFormError(f"{where}: expected an integer code point, got {type(value).__name__}")
    try:
        return enum_type(value)
    except ValueError:
        raise JsonFormError(f"{where}: {value} is not a registered {enum_type.__name__}") from None


def message_to_json(message: Message) -> dict[str, Any]:
    """The ``fields`` object of a message vector."""
    return struct_to_json(message)


def message_from_json(message_type: int, fields: object) -> Message:
    """The message a vector's ``message_type`` and ``fields`` describe."""
    try:
        cls = MESSAGE_CLASSES[MessageType(message_type)]
    except ValueError:
        raise JsonFormError(f"message type {message_type} is not registered") from None
    return struct_from_json(cls, fields)


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


def header_from_json(header: dict[str, Any]) -> ChunkHeader:
    """A chunk header in the vectors' JSON form (interop/payload.md)."""
    scales = header.get("scales")
    return ChunkHeader(
        group_id=from_hex(header["group_id"]),
        epoch=header["epoch"],
        op_id=header["op_id"],
        kind=Collective(header["kind"]),
        op=ReduceOp(header["op"]),
        dtype=DType(header["dtype"]),
        total_elements=header["total_elements"],
        chunk_elements=header["chunk_elements"],
        chunk_index=header["chunk_index"],
        root=header.get("root"),
        width=header.get("width") if scales is not None else None,
        block_elements=header.get("block_elements"),
        scales=from_hex(scales) if scales is not None else None,
        members=from_hex(header["members"]) if "members" in header else None,
        quorum=header.get("quorum"),
        wait_ms=header.get("wait_ms"),
    )
