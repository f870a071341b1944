"""Declarative field types: how one message field maps to and from CBOR.

Every message is a frozen dataclass whose fields are declared with :func:`wire`,
naming the field's integer map key and its :class:`FieldType`.  The generic
:class:`Struct` encoder and decoder walk those declarations, so each rule (a range,
a length bound, an enum) is written once and enforced in both directions, and a
decode error always names the message and field at fault.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from enum import IntEnum
from types import MemberDescriptorType
from typing import Any, ClassVar, Generic, TypeAlias, TypeVar

from cco.wire.cbor import CborKey, CborValue
from cco.wire.errors import CcoError, DecodeError, EncodeError, ErrorCode

T = TypeVar("T")
E = TypeVar("E", bound=IntEnum)
S = TypeVar("S", bound="Struct")

UINT64_MAX = (1 << 64) - 1


class FieldType(Generic[T]):
    """Converts one field between its Python value and its CBOR form.

    ``to_cbor`` returns only the CBOR subset's types (or a subclass of ``int``,
    ``bytes`` or ``str`` a caller passed, which cbor2 writes as its base type),
    integers within CBOR's range and maps in key order:
    :func:`cco.wire.cbor.encode_in_order` relies on it for every message.
    """

    def to_cbor(self, value: T, where: str) -> CborValue:
        raise NotImplementedError

    def from_cbor(self, raw: CborValue, where: str) -> T:
        raise NotImplementedError


def _invalid(where: str, detail: str, encoding: bool) -> CcoError:
    cls = EncodeError if encoding else DecodeError
    return cls(ErrorCode.INVALID_FIELD, f"{where}: {detail}")


class UInt(FieldType[int]):
    """An unsigned integer in ``[minimum, maximum]``.

    ``to_cbor`` and ``from_cbor`` first try the common case, a plain ``int`` in range,
    in one test; anything else (an ``IntEnum`` a caller passed, or an error) goes to
    :meth:`_check`, which states the whole rule.  Most fields of a chunk message are
    integers, so this spares a call per field on every message.
    """

    def __init__(self, maximum: int = UINT64_MAX, minimum: int = 0) -> None:
        if not 0 <= minimum <= maximum <= UINT64_MAX:
            raise ValueError(f"[{minimum}, {maximum}] is not a range of unsigned 64-bit integers")
        self.minimum = minimum
        self.maximum = maximum

    def _check(self, value: object, where: str, encoding: bool) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _invalid(where, f"expected an integer, got {type(value).__name__}", encoding)
        if not self.minimum <= value <= self.maximum:
            raise _invalid(where, f"{value} is outside [{self.minimum}, {self.maximum}]", encoding)
        return value

    def to_cbor(self, value: int, where: str) -> CborValue:
        if type(value) is int and self.minimum <= value <= self.maximum:
            return value
        return self._check(value, where, encoding=True)

    def from_cbor(self, raw: CborValue, where: str) -> int:
        if type(raw) is int and self.minimum <= raw <= self.maximum:
            return raw
        return self._check(raw, where, encoding=False)


class Bytes(FieldType[bytes]):
    """A byte string whose length lies in ``[min_len, max_len]``.

    As for :class:`UInt`, a plain ``bytes`` of a valid length is accepted in one test
    and anything else goes to :meth:`_check`.
    """

    def __init__(self, max_len: int, min_len: int = 0) -> None:
        self.min_len = min_len
        self.max_len = max_len

    def _check(self, value: object, where: str, encoding: bool) -> bytes:
        if not isinstance(value, bytes):
            raise _invalid(where, f"expected a byte string, got {type(value).__name__}", encoding)
        if not self.min_len <= len(value) <= self.max_len:
            raise _invalid(
                where, f"length {len(value)} is outside [{self.min_len}, {self.max_len}]", encoding
            )
        return value

    def to_cbor(self, value: bytes, where: str) -> bytes:
        if type(value) is bytes and self.min_len <= len(value) <= self.max_len:
            return value
        return self._check(value, where, encoding=True)

    def from_cbor(self, raw: CborValue, where: str) -> bytes:
        if type(raw) is bytes and self.min_len <= len(raw) <= self.max_len:
            return raw
        return self._check(raw, where, encoding=False)


class Text(FieldType[str]):
    """A UTF-8 text string of at most ``max_len`` bytes."""

    def __init__(self, max_len: int, min_len: int = 0) -> None:
        self.min_len = min_len
        self.max_len = max_len

    def _check(self, value: object, where: str, encoding: bool) -> str:
        if not isinstance(value, str):
            raise _invalid(where, f"expected a text string, got {type(value).__name__}", encoding)
        size = len(value.encode("utf-8", "surrogatepass"))
        if not self.min_len <= size <= self.max_len:
            raise _invalid(where, f"{size} bytes is outside [{self.min_len}, {self.max_len}]", encoding)
        return value

    def to_cbor(self, value: str, where: str) -> CborValue:
        return self._check(value, where, encoding=True)

    def from_cbor(self, raw: CborValue, where: str) -> str:
        return self._check(raw, where, encoding=False)


class Bitmap(Bytes):
    """A contributor bitmap: bit ``r % 8`` of byte ``r // 8`` is set for rank ``r``.

    The deterministic form has no trailing zero byte; an empty bitmap is the empty
    byte string.  A plain ``bytes`` of a valid length that ends in a non-zero byte is
    accepted in one test (every chunk message has a bitmap); anything else goes
    through :class:`Bytes`' checks and then the trailing byte's.
    """

    def to_cbor(self, value: bytes, where: str) -> bytes:
        if type(value) is bytes and self.min_len <= len(value) <= self.max_len and (not value or value[-1]):
            return value
        return self._without_trailing_zero(super().to_cbor(value, where), where, encoding=True)

    def from_cbor(self, raw: CborValue, where: str) -> bytes:
        if type(raw) is bytes and self.min_len <= len(raw) <= self.max_len and (not raw or raw[-1]):
            return raw
        return self._without_trailing_zero(super().from_cbor(raw, where), where, encoding=False)

    @staticmethod
    def _without_trailing_zero(bitmap: bytes, where: str, encoding: bool) -> bytes:
        if bitmap and bitmap[-1] == 0:
            raise _invalid(where, "bitmap has a trailing zero byte", encoding)
        return bitmap


class Enum(FieldType[E]):
    """A registered code point from ``enum_type``; unknown values are invalid."""

    def __init__(self, enum_type: type[E]) -> None:
        if not all(0 <= member <= UINT64_MAX for member in enum_type):
            raise ValueError(f"{enum_type.__name__} has a code point that is not an unsigned 64-bit integer")
        self.enum_type = enum_type
        self._members = {int(member): member for member in enum_type}  # a lookup, not EnumType.__call__

    def to_cbor(self, value: E, where: str) -> CborValue:
        if not isinstance(value, self.enum_type):
            raise _invalid(where, f"expected {self.enum_type.__name__}, got {value!r}", True)
        return int(value)

    def from_cbor(self, raw: CborValue, where: str) -> E:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise _invalid(where, f"expected an integer code, got {type(raw).__name__}", False)
        member = self._members.get(raw)
        if member is None:
            raise _invalid(where, f"{raw} is not a registered {self.enum_type.__name__}", False)
        return member


class ListOf(FieldType[tuple[T, ...]]):
    """An array of ``item`` with ``min_items`` to ``max_items`` entries, as a tuple."""

    def __init__(self, item: FieldType[T], max_items: int, min_items: int = 0) -> None:
        self.item = item
        self.min_items = min_items
        self.max_items = max_items

    def _count(self, n: int, where: str, encoding: bool) -> None:
        if not self.min_items <= n <= self.max_items:
            raise _invalid(where, f"{n} items is outside [{self.min_items}, {self.max_items}]", encoding)

    def to_cbor(self, value: tuple[T, ...], where: str) -> CborValue:
        if not isinstance(value, tuple):
            raise _invalid(where, f"expected a tuple, got {type(value).__name__}", True)
        self._count(len(value), where, True)
        return [self.item.to_cbor(v, f"{where}[{i}]") for i, v in enumerate(value)]

    def from_cbor(self, raw: CborValue, where: str) -> tuple[T, ...]:
        if not isinstance(raw, list):
            raise _invalid(where, f"expected an array, got {type(raw).__name__}", False)
        self._count(len(raw), where, False)
        return tuple(self.item.from_cbor(v, f"{where}[{i}]") for i, v in enumerate(raw))


class Nested(FieldType[S]):
    """A field whose value is itself a :class:`Struct`, encoded as a map."""

    def __init__(self, struct_type: type[S]) -> None:
        self.struct_type = struct_type

    def to_cbor(self, value: S, where: str) -> CborValue:
        if not isinstance(value, self.struct_type):
            raise _invalid(where, f"expected {self.struct_type.__name__}", True)
        return value.to_map(where)

    def from_cbor(self, raw: CborValue, where: str) -> S:
        return self.struct_type.from_map(raw, where)


@dataclasses.dataclass(frozen=True, slots=True)
class FieldSpec:
    """Where a dataclass field lives on the wire."""

    key: int
    kind: FieldType[Any]
    optional: bool


def wire(
    key: int, kind: FieldType[Any], *, optional: bool = False, default: Any = dataclasses.MISSING
) -> Any:
    """Declare a dataclass field with its map key; optional fields default to None.

    ``default`` only spares Python callers an argument: a required field is always
    on the wire, whatever its value.  Keys are unsigned, so a map written in the
    order of its keys is in the bytewise order of their encodings."""
    if key < 0:
        raise ValueError(f"map key {key} is negative")
    spec = FieldSpec(key=key, kind=kind, optional=optional)
    if optional:
        return dataclasses.field(default=None, metadata={"wire": spec})
    return dataclasses.field(default=default, metadata={"wire": spec})


_Setter: TypeAlias = Callable[[Any, Any], None]
_Step: TypeAlias = tuple[str, int, FieldType[Any], bool, str, _Setter]
"""One field as the codec walks it: (attribute name, map key, kind, optional, name in
errors, the ``__set__`` of the field's slot)."""


def _slot_setters(cls: type[Struct], specs: tuple[tuple[str, FieldSpec], ...]) -> dict[str, _Setter]:
    """Each field's slot setter, once :meth:`Struct.from_map` is known to build with
    them exactly the instance the dataclass ``__init__`` of ``cls`` would.

    A frozen dataclass's ``__init__`` stores each argument with ``object.__setattr__``,
    which looks the slot up by name; storing through the slot's descriptor is the same
    store without the lookup, and halves the cost of building a 19-field chunk
    message.  Setting every field is all ``__init__`` does if the class is a slotted
    dataclass, every field is a wire field its ``__init__`` takes, an optional field's
    default is the None an absent key gives, and there is no ``__post_init__``.  A
    class that breaks one of these is refused, at its first encoding or decoding."""
    wired = dict(specs)
    slots = {name: getattr(cls, name, None) for name in wired}
    problem = None
    if not all(isinstance(slot, MemberDescriptorType) for slot in slots.values()):
        problem = "is not a dataclass with slots=True"
    elif hasattr(cls, "__post_init__"):
        problem = "has a __post_init__"
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init or f.name not in wired:
            problem = problem or f"field {f.name} is not a wire field of __init__"
        elif wired[f.name].optional and f.default is not None:
            problem = problem or f"optional field {f.name} does not default to None"
    if problem is not None:
        raise TypeError(f"{cls.__name__} {problem}: from_map could not build it as __init__ does")
    return {name: slot.__set__ for name, slot in slots.items()}  # type: ignore[union-attr]


class _Plan:
    """A structure's fields as its codec walks them, worked out once per class: the
    keys it defines, and its steps in key order, with each field's name in errors of
    a top-level structure built once, not on every call."""

    __slots__ = ("known", "setters", "specs", "steps")

    def __init__(self, cls: type[Struct], specs: tuple[tuple[str, FieldSpec], ...]) -> None:
        self.specs = specs
        self.known = frozenset(spec.key for _, spec in specs)
        self.setters = _slot_setters(cls, specs)
        self.steps = self._named(cls.__name__)

    def steps_in(self, where: str | None) -> tuple[_Step, ...]:
        """The steps with each field named under ``where`` for a nested structure, else
        the top-level steps built once."""
        return self._named(where) if where else self.steps

    def _named(self, where: str) -> tuple[_Step, ...]:
        return tuple(
            (name, spec.key, spec.kind, spec.optional, f"{where}.{name}", self.setters[name])
            for name, spec in self.specs
        )


class Struct:
    """Base of every wire structure: a frozen dataclass encoded as an integer-keyed map.

    Absent optional fields are omitted from the map, never sent as null.  A map
    with a key the structure does not define is refused (``UNKNOWN_FIELD``):
    extensions are negotiated in ``Hello``, not smuggled into existing messages.
    """

    _specs: ClassVar[tuple[tuple[str, FieldSpec], ...]]
    _plan: ClassVar[_Plan]

    @classmethod
    def wire_fields(cls) -> tuple[tuple[str, FieldSpec], ...]:
        """The (attribute name, spec) pairs in key order, computed once per class."""
        cached = cls.__dict__.get("_specs")
        if cached is None:
            pairs = [
                (f.name, f.metadata["wire"])
                for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                if "wire" in f.metadata
            ]
            cached = tuple(sorted(pairs, key=lambda p: p[1].key))
            keys = [spec.key for _, spec in cached]
            if len(set(keys)) != len(keys):
                raise TypeError(f"{cls.__name__} declares a map key twice")
            cls._specs = cached
        return cached

    @classmethod
    def _codec_plan(cls) -> _Plan:
        plan = cls.__dict__.get("_plan")
        if plan is None:
            plan = cls._plan = _Plan(cls, cls.wire_fields())
        return plan

    def to_map(self, where: str | None = None) -> dict[CborKey, CborValue]:
        """The structure's map, after its checks: keys in ascending order (its plan is
        sorted by key, every key unsigned), values as each kind's ``to_cbor`` returns
        them, so in the form :func:`cco.wire.cbor.encode_in_order` takes."""
        steps = self._codec_plan().steps_in(where)
        self.validate(where or type(self).__name__, encoding=True)
        out: dict[CborKey, CborValue] = {}
        for name, key, kind, optional, label, _ in steps:
            value = getattr(self, name)
            if value is None:
                if not optional:
                    raise EncodeError(ErrorCode.MISSING_FIELD, f"{label} is required")
                continue
            out[key] = kind.to_cbor(value, label)
        return out

    @classmethod
    def from_map(cls: type[S], raw: CborValue, where: str | None = None) -> S:
        plan = cls._codec_plan()
        steps = plan.steps_in(where)
        where = where or cls.__name__
        if not isinstance(raw, dict):
            raise DecodeError(ErrorCode.INVALID_FIELD, f"{where}: expected a map, got {type(raw).__name__}")
        if not plan.known.issuperset(raw):
            unknown = next(key for key in raw if key not in plan.known)
            raise DecodeError(ErrorCode.UNKNOWN_FIELD, f"{where}: key {unknown!r} is not defined")
        instance = object.__new__(cls)  # then each field set as __init__ would (see _slot_setters)
        for _, key, kind, optional, label, setter in steps:
            if key in raw:
                setter(instance, kind.from_cbor(raw[key], label))
            elif optional:  # an absent optional field takes its default, None (see wire)
                setter(instance, None)
            else:
                raise DecodeError(ErrorCode.MISSING_FIELD, f"{label} (key {key}) is missing")
        instance.validate(where, encoding=False)
        return instance

    def validate(self, where: str, encoding: bool) -> None:
        """Cross-field checks; subclasses override.  Raises INVALID_FIELD errors."""


def invalid(where: str, detail: str, encoding: bool) -> CcoError:
    """The error a ``validate`` override raises for an inconsistent structure."""
    return _invalid(where, detail, encoding)


def bitmap_from_ranks(ranks: Sequence[int] | set[int] | frozenset[int]) -> bytes:
    """The deterministic bitmap with exactly ``ranks`` set."""
    if not ranks:
        return b""
    out = bytearray(max(ranks) // 8 + 1)
    for r in ranks:
        if r < 0:
            raise ValueError(f"rank {r} is negative")
        out[r // 8] |= 1 << (r % 8)
    return bytes(out)


def ranks_from_bitmap(bitmap: bytes) -> frozenset[int]:
    """The set of ranks whose bit is set in ``bitmap``."""
    return frozenset(
        i * 8 + bit for i, byte in enumerate(bitmap) if byte for bit in range(8) if byte >> bit & 1
    )
