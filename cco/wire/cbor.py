"""Deterministic CBOR encoding and a strict decoder for the CBOR subset CCO uses.

CCO messages use only unsigned and negative integers, byte strings, text strings,
arrays, maps, ``false``, ``true`` and ``null`` (draft section "Encoding").  Senders
emit core deterministic encoding (RFC 8949, section 4.2.1).  Receivers accept
nothing else: a message has exactly one encoding, so two implementations that agree
on a message agree on its bytes, and a receiver never needs to canonicalise.

The decoder is written for hostile input.  It checks every claimed length against
the bytes actually present before it allocates anything, bounds nesting depth and
container sizes, and reports every problem as a :class:`DecodeError` with a
protocol error code.  ``cbor2`` is used for encoding only; it cannot be told to
refuse the encodings this decoder refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import cbor2

from cco.wire.errors import DecodeError, EncodeError, ErrorCode

CborKey: TypeAlias = int | str
CborValue: TypeAlias = "int | bytes | str | bool | list[CborValue] | dict[CborKey, CborValue] | None"

_UINT64_MAX = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Bounds a decoder enforces regardless of what the input claims."""

    max_depth: int = 16
    max_container_items: int = 1 << 16
    max_string_bytes: int = 64 * 1024 * 1024


DEFAULT_LIMITS = DecodeLimits()


def encode(value: CborValue) -> bytes:
    """Encode ``value`` in core deterministic encoding (RFC 8949, section 4.2.1).

    cbor2 always writes integers and lengths in their shortest form, and writes a
    map's entries in the dict's order when not asked to be "canonical".  Its
    canonical mode follows the older RFC 7049 rule (shorter keys first), which
    differs from RFC 8949's bytewise order for maps mixing key types, so the map
    order is established here instead, by sorting on each key's encoding.
    """
    return cbor2.dumps(_deterministic(value, depth=0))


def _deterministic(value: object, depth: int) -> CborValue:
    """Check that ``value`` is in the CCO subset and put every map in key order."""
    if depth > DEFAULT_LIMITS.max_depth:
        raise EncodeError(ErrorCode.INVALID_FIELD, "value nests too deeply to encode")
    if isinstance(value, bool) or value is None or isinstance(value, (bytes, str)):
        return value
    if isinstance(value, int):
        if not -(1 << 64) <= value <= _UINT64_MAX:
            raise EncodeError(ErrorCode.INVALID_FIELD, f"integer {value} is outside CBOR's range")
        return value
    if isinstance(value, list):
        return [_deterministic(item, depth + 1) for item in value]
    if isinstance(value, dict):
        entries: list[tuple[bytes, CborKey, CborValue]] = []
        for key, item in value.items():
            if isinstance(key, bool) or not isinstance(key, (int, str)):
                raise EncodeError(ErrorCode.INVALID_FIELD, f"map key {key!r} is not int or text")
            entries.append((cbor2.dumps(key), key, _deterministic(item, depth + 1)))
        entries.sort(key=lambda entry: entry[0])
        return {key: item for _, key, item in entries}
    raise EncodeError(ErrorCode.INVALID_FIELD, f"type {type(value).__name__} is not encodable")


def decode(data: bytes | bytearray | memoryview, limits: DecodeLimits = DEFAULT_LIMITS) -> CborValue:
    """Decode exactly one CBOR item from ``data``; reject anything non-deterministic."""
    reader = _Reader(memoryview(data).cast("B"), limits)
    value = reader.item(depth=0)
    if reader.pos != len(reader.buf):
        raise DecodeError(
            ErrorCode.TRAILING_BYTES,
            f"{len(reader.buf) - reader.pos} bytes follow the top-level item at offset {reader.pos}",
        )
    return value


class _Reader:
    """A cursor over one buffer.  Each method consumes what it decodes."""

    __slots__ = ("buf", "limits", "pos")

    def __init__(self, buf: memoryview, limits: DecodeLimits) -> None:
        self.buf = buf
        self.pos = 0
        self.limits = limits

    def _need(self, n: int, what: str) -> None:
        if n > len(self.buf) - self.pos:
            raise DecodeError(
                ErrorCode.MALFORMED_CBOR,
                f"{what} at offset {self.pos} needs {n} bytes, {len(self.buf) - self.pos} remain",
            )

    def _head(self) -> tuple[int, int, int]:
        """Read an initial byte and its argument; return (major, info, argument)."""
        start = self.pos
        self._need(1, "item head")
        initial = self.buf[self.pos]
        self.pos += 1
        major, info = initial >> 5, initial & 0x1F
        if info < 24:
            return major, info, info
        if info > 27:
            if info == 31:
                raise DecodeError(ErrorCode.MALFORMED_CBOR, f"indefinite length or break at offset {start}")
            raise DecodeError(ErrorCode.MALFORMED_CBOR, f"reserved additional info {info} at offset {start}")
        size = 1 << (info - 24)
        self._need(size, "item argument")
        argument = int.from_bytes(self.buf[self.pos : self.pos + size], "big")
        self.pos += size
        if major != 7:
            shortest = (
                24 if argument < 256 else 25 if argument < 1 << 16 else 26 if argument < 1 << 32 else 27
            )
            if argument < 24 or info != shortest:
                raise DecodeError(
                    ErrorCode.NON_DETERMINISTIC_ENCODING,
                    f"argument {argument} at offset {start} is not in its shortest form",
                )
        return major, info, argument

    def item(self, depth: int) -> CborValue:
        if depth > self.limits.max_depth:
            raise DecodeError(ErrorCode.MESSAGE_TOO_LARGE, f"nesting deeper than {self.limits.max_depth}")
        start = self.pos
        major, info, arg = self._head()
        if major == 0:
            return arg
        if major == 1:
            return -1 - arg
        if major in (2, 3):
            if arg > self.limits.max_string_bytes:
                raise DecodeError(
                    ErrorCode.MESSAGE_TOO_LARGE,
                    f"string of {arg} bytes at offset {start} exceeds limit",
                )
            self._need(arg, "string body")
            raw = self.buf[self.pos : self.pos + arg]
            self.pos += arg
            if major == 2:
                return raw.tobytes()
            try:
                return str(raw, "utf-8")
            except UnicodeDecodeError as exc:
                raise DecodeError(ErrorCode.MALFORMED_CBOR, f"invalid UTF-8 at offset {start}") from exc
        if major in (4, 5):
            if arg > self.limits.max_container_items:
                raise DecodeError(
                    ErrorCode.MESSAGE_TOO_LARGE,
                    f"container of {arg} items at offset {start} exceeds limit",
                )
            # Every item takes at least one byte: refuse claims the buffer cannot hold
            # before building anything.
            self._need(arg * (2 if major == 5 else 1), "container items")
            if major == 4:
                return [self.item(depth + 1) for _ in range(arg)]
            return self._map(arg, depth, start)
        if major == 6:
            raise DecodeError(ErrorCode.MALFORMED_CBOR, f"tag {arg} at offset {start} is not allowed")
        # major 7: simple values and floats
        if info < 24:
            if arg == 20:
                return False
            if arg == 21:
                return True
            if arg == 22:
                return None
        raise DecodeError(
            ErrorCode.MALFORMED_CBOR,
            f"simple value or float (additional info {info}) at offset {start} is not allowed",
        )

    def _map(self, count: int, depth: int, start: int) -> dict[CborKey, CborValue]:
        result: dict[CborKey, CborValue] = {}
        previous: bytes | None = None
        for _ in range(count):
            key_start = self.pos
            key = self.item(depth + 1)
            key_bytes = self.buf[key_start : self.pos].tobytes()
            if isinstance(key, bool) or not isinstance(key, (int, str)):
                raise DecodeError(
                    ErrorCode.MALFORMED_CBOR, f"map key at offset {key_start} is not int or text"
                )
            if key in result:
                raise DecodeError(
                    ErrorCode.DUPLICATE_MAP_KEY, f"map key {key!r} repeated at offset {key_start}"
                )
            if previous is not None and key_bytes < previous:
                raise DecodeError(
                    ErrorCode.NON_DETERMINISTIC_ENCODING,
                    f"map key {key!r} at offset {key_start} is out of bytewise order",
                )
            previous = key_bytes
            result[key] = self.item(depth + 1)
        return result
