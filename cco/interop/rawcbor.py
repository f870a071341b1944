"""Hand-built CBOR, including encodings a conforming CCO encoder never emits.

Negative vectors need bytes that :func:`cco.wire.cbor.encode` refuses to produce
(non-shortest arguments, unsorted or repeated map keys, indefinite lengths, tags,
floats).  Writing them as data, with a marker object where the encoding departs
from the deterministic one, keeps each mutation readable and exact: the vector's
``mutation`` text and its bytes come from the same description.

Plain values (int, bytes, str, bool, None, list, dict) encode exactly as
:func:`cco.wire.cbor.encode` would; the generator checks that.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TypeAlias

from cco.wire.cbor import item_head


@dataclass(frozen=True)
class NonShortest:
    """An integer whose argument is written in ``size`` bytes (1, 2, 4 or 8)."""

    value: int
    size: int


@dataclass(frozen=True)
class LongHead:
    """A byte or text string, array or map whose length is written in ``size`` bytes."""

    value: RawValue
    size: int


@dataclass(frozen=True)
class Pairs:
    """A map whose entries are written in the given order, repeats included."""

    entries: tuple[tuple[RawValue, RawValue], ...]


@dataclass(frozen=True)
class Indefinite:
    """An array, map, byte or text string written with an indefinite length.

    Strings become one definite chunk between the indefinite head and the break.
    """

    value: RawValue


@dataclass(frozen=True)
class Tagged:
    """A value wrapped in a CBOR tag."""

    tag: int
    value: RawValue


@dataclass(frozen=True)
class Verbatim:
    """Bytes copied into the encoding as they are (floats, undefined, bad UTF-8)."""

    data: bytes


RawValue: TypeAlias = (
    "int | bytes | str | bool | list[RawValue] | dict[int | str, RawValue] "
    "| NonShortest | LongHead | Pairs | Indefinite | Tagged | Verbatim | None"
)

UNDEFINED = Verbatim(b"\xf7")


def float64(value: float) -> Verbatim:
    """A double-precision float (major type 7, additional info 27)."""
    return Verbatim(b"\xfb" + struct.pack(">d", value))


def encode_raw(value: RawValue) -> bytes:
    """Encode ``value``: deterministic for plain values, as marked for the markers."""
    return _encode(value, None)


def _int_head(value: int, size: int | None) -> bytes:
    return item_head(0, value, size) if value >= 0 else item_head(1, -1 - value, size)


def _encode(value: RawValue, size: int | None) -> bytes:
    if isinstance(value, NonShortest):
        return _int_head(value.value, value.size)
    if isinstance(value, LongHead):
        return _encode(value.value, value.size)
    if isinstance(value, Verbatim):
        return value.data
    if isinstance(value, Tagged):
        return item_head(6, value.tag) + _encode(value.value, None)
    if isinstance(value, Indefinite):
        return _indefinite(value.value)
    if value is False:
        return b"\xf4"
    if value is True:
        return b"\xf5"
    if value is None:
        return b"\xf6"
    if isinstance(value, int):
        return _int_head(value, size)
    if isinstance(value, bytes):
        return item_head(2, len(value), size) + value
    if isinstance(value, str):
        data = value.encode("utf-8")
        return item_head(3, len(data), size) + data
    if isinstance(value, list):
        return item_head(4, len(value), size) + b"".join(_encode(item, None) for item in value)
    if isinstance(value, Pairs):
        return item_head(5, len(value.entries), size) + b"".join(
            _encode(k, None) + _encode(v, None) for k, v in value.entries
        )
    # A plain dict: entries in the bytewise order of their encoded keys (RFC 8949 4.2.1).
    encoded = sorted((_encode(k, None), _encode(v, None)) for k, v in value.items())
    return item_head(5, len(encoded), size) + b"".join(k + v for k, v in encoded)


def _indefinite(value: RawValue) -> bytes:
    if isinstance(value, list):
        return b"\x9f" + b"".join(_encode(item, None) for item in value) + b"\xff"
    if isinstance(value, dict):
        body = b"".join(_encode(k, None) + _encode(v, None) for k, v in value.items())
        return b"\xbf" + body + b"\xff"
    if isinstance(value, bytes):
        return b"\x5f" + _encode(value, None) + b"\xff"
    if isinstance(value, str):
        return b"\x7f" + _encode(value, None) + b"\xff"
    raise TypeError(f"no indefinite-length form for {type(value).__name__}")
