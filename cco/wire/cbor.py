"""Deterministic CBOR encoding and a strict decoder for the CBOR subset CCO uses.

CCO messages use only unsigned and negative integers, byte strings, text strings,
arrays, maps, ``false``, ``true`` and ``null`` (draft section "Encoding").  Senders
emit core deterministic encoding (RFC 8949, section 4.2.1).  Receivers accept
nothing else: a message has exactly one encoding, so two implementations that agree
on a message agree on its bytes, and a receiver never needs to canonicalise.

The decoder is written for hostile input.  It checks every claimed length against
the bytes actually present before it allocates anything, bounds nesting depth and
container sizes, and reports every problem as a :class:`DecodeError` with a
protocol error code.  ``cbor2`` cannot be told to refuse the encodings this decoder
refuses, so it is trusted with one question only: read an input with cbor2's C
decoder, and if what it read is in the subset, within the limits, and encodes back
to exactly the input, the input was the one deterministic encoding of that value
and the strict reader would have returned the same value.  Anything else goes to
the strict reader, which names the problem.  For the small messages of a
latency-bound collective that is under half the strict reader's time.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import cbor2

from cco.wire.errors import DecodeError, EncodeError, ErrorCode

CborKey: TypeAlias = int | str
CborValue: TypeAlias = "int | bytes | str | bool | list[CborValue] | dict[CborKey, CborValue] | None"

_UINT64_MAX = (1 << 64) - 1
_INT_MIN = -(1 << 64)


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
    order is established here instead (see :func:`_key_rank`).  A value already in
    that form, as a message's map built in key order is, goes to cbor2 as it is.
    """
    if _QuickCheck(_UNBOUNDED, DEFAULT_LIMITS).plain(value, 0):
        return cbor2.dumps(value)
    return cbor2.dumps(_deterministic(value, depth=0))


def encode_in_order(value: CborValue) -> bytes:
    """Encode ``value``, whose builder guarantees the form :func:`encode` checks for:
    only the subset's types, integers within CBOR's range, every map in bytewise key
    order, nesting within ``DEFAULT_LIMITS.max_depth``.  cbor2 writes such a value in
    core deterministic encoding as it is, so the walk that establishes the form is
    skipped; :meth:`cco.wire.fields.Struct.to_map` builds such maps, and checking
    again what it established cost a quarter of encoding a chunk message."""
    return cbor2.dumps(value)


def encode_in_order_pieces(value: CborValue, large: int) -> list[bytes]:
    """:func:`encode_in_order`'s bytes for ``value`` (in the same form), as pieces to
    be written one after another: every byte string of at least ``large`` bytes is
    a piece of its own, the very object in ``value``, and the bytes between them are
    joined into as few pieces as they allow.

    A sender that hands the pieces to its transport one by one never copies a large
    payload into an encoded message, only to have the transport copy it again.
    """
    parts: list[bytes] = []
    _gather(value, large, parts)
    pieces: list[bytes] = []
    small: list[bytes] = []
    for part in parts:
        if len(part) < large:
            small.append(part)
            continue
        if small:
            pieces.append(b"".join(small))
            small.clear()
        pieces.append(part)
    if small:
        pieces.append(b"".join(small))
    return pieces


def _gather(value: CborValue, large: int, parts: list[bytes]) -> None:
    """Append the encoding of ``value`` to ``parts``: a large byte string as its head
    and itself, each run of other items of a container as one encoding by cbor2."""
    if type(value) is bytes and len(value) >= large:
        parts += (item_head(2, len(value)), value)
    elif type(value) is list:
        parts.append(item_head(4, len(value)))
        run: list[CborValue] = []
        for item in value:
            if _holds_large(item, large):
                _flush_run(run, 4, parts)
                _gather(item, large, parts)
            else:
                run.append(item)
        _flush_run(run, 4, parts)
    elif type(value) is dict:
        parts.append(item_head(5, len(value)))
        entries: dict[CborKey, CborValue] = {}
        for key, item in value.items():
            if _holds_large(item, large):
                _flush_run(entries, 5, parts)
                parts.append(cbor2.dumps(key))
                _gather(item, large, parts)
            else:
                entries[key] = item
        _flush_run(entries, 5, parts)
    else:
        parts.append(cbor2.dumps(value))


def _flush_run(run: list[CborValue] | dict[CborKey, CborValue], major: int, parts: list[bytes]) -> None:
    """Append the encoding of the items (or entries) in ``run``, without the head
    cbor2 gives their container, and empty ``run``."""
    if run:
        parts.append(cbor2.dumps(run)[len(item_head(major, len(run))) :])
        run.clear()


def _holds_large(value: CborValue, large: int) -> bool:
    """Whether ``value`` is, or holds, a byte string of at least ``large`` bytes."""
    if type(value) is bytes:
        return len(value) >= large
    if type(value) is list:
        return any(_holds_large(item, large) for item in value)
    if type(value) is dict:
        return any(_holds_large(item, large) for item in value.values())
    return False


def item_head(major: int, argument: int, size: int | None = None) -> bytes:
    """The head of an item of major type ``major`` with ``argument`` (a value or a
    length); ``size`` forces the argument's width in bytes (1, 2, 4 or 8, as the
    interop vectors' non-shortest forms need), None gives the shortest form."""
    if size is None:
        if argument < 24:
            return bytes((major << 5 | argument,))
        size = 1 if argument < 1 << 8 else 2 if argument < 1 << 16 else 4 if argument < 1 << 32 else 8
    info = {1: 24, 2: 25, 4: 26, 8: 27}[size]
    return bytes((major << 5 | info,)) + argument.to_bytes(size, "big")


def _key_rank(key: CborKey) -> tuple[int, int, bytes]:
    """Where ``key``'s encoding sorts bytewise, without encoding it.

    An encoded integer or text string starts with its major type and then its
    argument (the value, or the byte length) in shortest big-endian form, so its
    bytes sort like (major type, argument, then a string's bytes)."""
    if isinstance(key, int):
        return (0, key, b"") if key >= 0 else (1, -1 - key, b"")
    raw = key.encode()
    return (3, len(raw), raw)


def _deterministic(value: object, depth: int) -> CborValue:
    """Check that ``value`` is in the CCO subset and put every map in key order.

    Only values :class:`_QuickCheck` does not pass come here: those of other
    types (an IntEnum, say), with a map out of order, or in error."""
    if depth > DEFAULT_LIMITS.max_depth:
        raise EncodeError(ErrorCode.INVALID_FIELD, "value nests too deeply to encode")
    if isinstance(value, bool) or value is None or isinstance(value, (bytes, str)):
        return value
    if isinstance(value, int):
        if not _INT_MIN <= value <= _UINT64_MAX:
            raise EncodeError(ErrorCode.INVALID_FIELD, f"integer {value} is outside CBOR's range")
        return value
    if isinstance(value, list):
        return [_deterministic(item, depth + 1) for item in value]
    if isinstance(value, dict):
        entries: list[tuple[tuple[int, int, bytes], CborKey, CborValue]] = []
        for key, item in value.items():
            if isinstance(key, bool) or not isinstance(key, (int, str)):
                raise EncodeError(ErrorCode.INVALID_FIELD, f"map key {key!r} is not int or text")
            entries.append((_key_rank(key), key, _deterministic(item, depth + 1)))
        entries.sort(key=lambda entry: entry[0])
        return {key: item for _, key, item in entries}
    raise EncodeError(ErrorCode.INVALID_FIELD, f"type {type(value).__name__} is not encodable")


def decode(data: bytes | bytearray | memoryview, limits: DecodeLimits = DEFAULT_LIMITS) -> CborValue:
    """Decode exactly one CBOR item from ``data``; reject anything non-deterministic."""
    quick = _decode_quickly(data, limits)
    if quick is not _NOT_QUICK:
        return quick  # type: ignore[return-value]
    return _decode_strictly(data, limits)


def decode_pieces(pieces: Sequence[bytes | memoryview], limits: DecodeLimits = DEFAULT_LIMITS) -> CborValue:
    """:func:`decode` of the concatenation of ``pieces`` (a message as its stream data
    arrived), without joining them first.

    Joining a large message and then taking its payload out of the joined bytes
    copied the payload twice; here a byte string that spans pieces is joined once,
    straight into the bytes returned, and the items around it are read where they
    lie.  A message small enough for the quick path is joined: that costs little."""
    if len(pieces) == 1:
        return decode(pieces[0], limits)
    source = _Pieces(pieces)
    if source.total <= _QUICK_MAX_BYTES:
        return decode(b"".join(pieces), limits)
    return _read_whole(_Reader(memoryview(b""), limits, source), source.total)


def _decode_strictly(data: bytes | bytearray | memoryview, limits: DecodeLimits) -> CborValue:
    """The reader that names every rule an input breaks, byte by byte in Python."""
    buf = memoryview(data).cast("B")
    return _read_whole(_Reader(buf, limits), len(buf))


def _read_whole(reader: _Reader, total: int) -> CborValue:
    """The one item of ``total`` bytes ``reader`` is at the start of."""
    value = reader.item(depth=0)
    end = reader.offset
    if end != total:
        raise DecodeError(
            ErrorCode.TRAILING_BYTES,
            f"{total - end} bytes follow the top-level item at offset {end}",
        )
    return value


_NOT_QUICK = object()
# Above this size the strict reader is faster: cbor2 reads a long byte string in
# 64 KiB pieces, the strict reader slices it once (a message with a 32 KiB payload:
# quick 17 us, strict 30 us; 128 KiB: quick 164 us, strict 35 us).  No string is
# longer than its input, so only an input longer than max_string_bytes is checked
# for that limit, by the strict reader.
_QUICK_MAX_BYTES = 32 * 1024
_UNBOUNDED = 1 << 62  # encoding walks values this code built: no budget needed


def _decode_quickly(data: bytes | bytearray | memoryview, limits: DecodeLimits) -> object:
    """``data``'s value if cbor2 reads it and it is a deterministic encoding in the
    subset and within ``limits``; otherwise ``_NOT_QUICK`` (the strict reader decides).

    The round trip is what makes this safe: cbor2 may accept tags, floats,
    indefinite lengths, repeated keys or long arguments, but the value it builds
    from them never encodes back to the same bytes.  The walk bounds the work
    first: cbor2 can build a value larger than its input (shared references), and a
    genuine encoding has at least one byte per item."""
    if len(data) > _QUICK_MAX_BYTES or len(data) > limits.max_string_bytes:
        return _NOT_QUICK
    try:
        value = cbor2.loads(data)
    except Exception:  # any refusal: the strict reader says which rule was broken
        return _NOT_QUICK
    if not _QuickCheck(len(data), limits).plain(value, 0):
        return _NOT_QUICK
    if cbor2.dumps(value) != data:
        return _NOT_QUICK
    return value


class _QuickCheck:
    """Is a value cbor2 decoded in the subset, within the limits, with every map in
    bytewise key order (so that cbor2, writing dicts in their order, re-encodes it
    deterministically)?  Containers count themselves and their items against
    ``budget``: a genuine encoding of ``n`` bytes stays within 2n (a map's entries
    count twice, key and value)."""

    __slots__ = ("budget", "max_depth", "max_items")

    def __init__(self, size: int, limits: DecodeLimits) -> None:
        self.budget = 2 * size
        self.max_depth = limits.max_depth
        self.max_items = limits.max_container_items

    def plain(self, value: object, depth: int) -> bool:
        """``value``, found at ``depth``, and everything in it."""
        if depth > self.max_depth:
            return False
        kind = type(value)
        if kind in _SCALARS:
            return True
        if kind is int:  # cbor2 reads a bignum tag as an int and writes it back as one
            return _INT_MIN <= value <= _UINT64_MAX  # type: ignore[operator]
        items: Collection[object]
        if kind is list:
            items = value  # type: ignore[assignment]
            self.budget -= 1 + len(items)
        elif kind is dict:
            entries: dict[object, object] = value  # type: ignore[assignment]
            if not _keys_in_order(list(entries)):
                return False
            items = entries.values()
            self.budget -= 1 + 2 * len(items)
        else:
            return False
        if self.budget < 0 or len(items) > self.max_items:
            return False
        if items and depth + 1 > self.max_depth:
            return False
        for item in items:
            kind = type(item)
            if kind is int:
                if not _INT_MIN <= item <= _UINT64_MAX:  # type: ignore[operator]
                    return False
            elif kind not in _SCALARS and not self.plain(item, depth + 1):
                return False
        return True


_SCALARS = frozenset({bytes, str, bool, type(None)})


def _is_key(key: object) -> bool:
    return type(key) is str or (type(key) is int and _INT_MIN <= key <= _UINT64_MAX)


def _keys_in_order(keys: list[object]) -> bool:
    """Integer or text keys, in bytewise order of their encodings (strictly)."""
    previous = -1
    for key in keys:  # the messages' case first: unsigned integers, ascending
        if type(key) is not int or key <= previous:
            break
        previous = key
    else:
        return previous <= _UINT64_MAX  # the largest key
    if not all(_is_key(key) for key in keys):
        return False
    ranks = [_key_rank(key) for key in keys]  # type: ignore[arg-type]
    return all(a < b for a, b in itertools.pairwise(ranks))


class _Pieces:
    """Consecutive buffers read as one, joined only where a reader asks."""

    __slots__ = ("ends", "pieces", "total")

    def __init__(self, pieces: Sequence[bytes | memoryview]) -> None:
        self.pieces = [piece if type(piece) is bytes else memoryview(piece).cast("B") for piece in pieces]
        self.ends = list(itertools.accumulate(map(len, self.pieces)))
        self.total = self.ends[-1] if self.ends else 0

    def join(self, start: int, stop: int) -> bytes:
        """Bytes ``start`` to ``stop`` (``start < stop <= total``) of the whole, copied
        once: the pieces between the first and the last are joined as they are."""
        pieces, ends = self.pieces, self.ends
        first = bisect.bisect_right(ends, start)  # the piece holding byte start
        last = bisect.bisect_left(ends, stop)  # the piece holding byte stop - 1
        head = memoryview(pieces[first])[start - ends[first] + len(pieces[first]) :]
        if first == last:
            return head[: stop - start].tobytes()
        tail = memoryview(pieces[last])[: stop - ends[last] + len(pieces[last])]
        return b"".join([head, *pieces[first + 1 : last], tail])


_WINDOW = 4096
"""Bytes joined at a time from pieces for the small items a reader reads in place."""


class _Reader:
    """A cursor over one buffer, or over pieces read through a window of joined bytes.
    Each method consumes what it decodes; offsets in errors count from the start of
    the whole input."""

    __slots__ = ("base", "buf", "limits", "pos", "source")

    def __init__(self, buf: memoryview, limits: DecodeLimits, source: _Pieces | None = None) -> None:
        self.buf = buf  # the whole input, or the window of source read now
        self.pos = 0  # in buf
        self.base = 0  # offset of buf in the whole input
        self.limits = limits
        self.source = source

    @property
    def offset(self) -> int:
        """Where the cursor is in the whole input."""
        return self.base + self.pos

    def _remaining(self) -> int:
        """Bytes of the whole input after the cursor."""
        if self.source is None:
            return len(self.buf) - self.pos
        return self.source.total - self.base - self.pos

    def _check(self, n: int, what: str) -> None:
        """Refuse a claim of ``n`` more bytes that the input does not hold."""
        if n > self._remaining():
            raise DecodeError(
                ErrorCode.MALFORMED_CBOR,
                f"{what} at offset {self.offset} needs {n} bytes, {self._remaining()} remain",
            )

    def _need(self, n: int, what: str) -> None:
        """Make the next ``n`` bytes readable in ``buf`` at ``pos``, or refuse them."""
        if n <= len(self.buf) - self.pos:
            return
        self._check(n, what)
        assert self.source is not None  # a whole buffer holds all it has
        start = self.offset
        self.buf = memoryview(self.source.join(start, min(self.source.total, start + max(n, _WINDOW))))
        self.base = start
        self.pos = 0

    def _string(self, length: int) -> memoryview | bytes:
        """The next ``length`` bytes, consumed: a view of ``buf`` where it holds them,
        else joined from the pieces into bytes (once)."""
        if length <= len(self.buf) - self.pos or self.source is None:
            self._need(length, "string body")
            raw = self.buf[self.pos : self.pos + length]
            self.pos += length
            return raw
        self._check(length, "string body")
        start = self.offset
        joined = self.source.join(start, start + length)
        self.buf = memoryview(b"")
        self.base = start + length
        self.pos = 0
        return joined

    def _head(self) -> tuple[int, int, int]:
        """Read an initial byte and its argument; return (major, info, argument)."""
        start = self.offset
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
        start = self.offset
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
            raw = self._string(arg)
            if major == 2:
                return raw if type(raw) is bytes else bytes(raw)
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
            self._check(arg * (2 if major == 5 else 1), "container items")
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
        previous: tuple[int, int, bytes] | None = None
        for _ in range(count):
            key_start = self.offset
            key = self.item(depth + 1)
            if isinstance(key, bool) or not isinstance(key, (int, str)):
                raise DecodeError(
                    ErrorCode.MALFORMED_CBOR, f"map key at offset {key_start} is not int or text"
                )
            if key in result:
                raise DecodeError(
                    ErrorCode.DUPLICATE_MAP_KEY, f"map key {key!r} repeated at offset {key_start}"
                )
            # The key was read in its shortest form, so its rank sorts as its bytes do.
            rank = _key_rank(key)
            if previous is not None and rank < previous:
                raise DecodeError(
                    ErrorCode.NON_DETERMINISTIC_ENCODING,
                    f"map key {key!r} at offset {key_start} is out of bytewise order",
                )
            previous = rank
            result[key] = self.item(depth + 1)
        return result
