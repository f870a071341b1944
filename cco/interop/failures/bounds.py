"""Invalid messages that put one field just outside its declared range.

Derived from the field declarations of :mod:`cco.wire.messages` rather than written
out: :data:`_BOUNDS` names the fields, and each value, key path, description and
mutation is computed from the field's declared type and bounds, so the schema is
stated once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cco.interop.failures.mutation import Failure, Path, base_value, samples_by_name, walk, with_field
from cco.interop.rawcbor import RawValue
from cco.wire.errors import ErrorCode as E
from cco.wire.fields import Bitmap, Bytes, FieldType, ListOf, Nested, Struct, Text, UInt


@dataclass(frozen=True, slots=True)
class _Bound:
    """One declared bound of one field, broken by one step: the vector ``name`` starts
    from the sample ``base`` and sets ``field`` (field names joined by dots, ``[0]``
    for a list's first entry) just ``below`` or ``above`` the range its declaration
    in :mod:`cco.wire.messages` gives, or (``utf8``) above it with two-byte characters,
    so that it is over in UTF-8 bytes but not in characters.  The value, the map keys,
    the description and the mutation all come from the declaration."""

    name: str
    base: str
    field: str
    side: str


_BOUNDS = (
    _Bound("world-size-zero", "join-request-any-rank", "world_size", "below"),
    _Bound("world-size-over", "join-request-any-rank", "world_size", "above"),
    _Bound("rank-over", "leave", "rank", "above"),
    _Bound("port-zero", "aggregator-register", "address.port", "below"),
    _Bound("port-over", "aggregator-register", "address.port", "above"),
    _Bound("capacity-zero", "aggregator-register", "capacity", "below"),
    _Bound("fan-in-one", "aggregator-register", "max_fan_in", "below"),
    _Bound("heartbeat-interval-short", "aggregator-accept", "heartbeat_interval_ms", "below"),
    _Bound("max-message-size-small", "hello-minimal", "capabilities.max_message_size", "below"),
    _Bound("version-over-u32", "hello-ack-rendezvous", "version", "above"),
    _Bound("message-type-over", "error-with-type", "message_type", "above"),
    _Bound("window-zero", "join-accept", "params.window", "below"),
    _Bound("liveness-over", "join-accept-bounds", "params.liveness_ms", "above"),
    _Bound("block-elements-under", "contribution-reduce-root", "block_elements", "below"),
    _Bound("block-elements-over", "contribution-reduce-root", "block_elements", "above"),
    _Bound("block-elements-in-params-under", "join-accept", "params.block_elements", "below"),
    _Bound("tag-equals-modulus", "contribution-all-reduce-sum", "tag", "above"),
    _Bound("width-zero", "contribution-all-reduce-sum", "width", "below"),
    _Bound("chunk-elements-zero", "contribution-all-reduce-sum", "chunk_elements", "below"),
    _Bound("total-elements-over", "contribution-barrier", "total_elements", "above"),
    _Bound("root-over", "contribution-reduce-root", "root", "above"),
    _Bound("group-id-short", "join-reject", "group_id", "below"),
    _Bound("group-id-long", "join-reject", "group_id", "above"),
    _Bound("group-secret-short", "join-accept", "group_secret", "below"),
    _Bound("credential-long", "join-request-rank", "credential", "above"),
    _Bound("node-id-empty", "aggregator-accept", "node_id", "below"),
    _Bound("node-id-long", "aggregator-accept", "node_id", "above"),
    _Bound("node-id-long-utf8", "aggregator-accept", "node_id", "utf8"),
    _Bound("report-parent-empty", "report", "parent", "below"),
    _Bound("report-detail-long", "report", "detail", "above"),
    _Bound("detail-long", "error-without-type", "detail", "above"),
    _Bound("label-empty", "join-request-any-rank", "labels[0]", "below"),
    _Bound("versions-empty", "hello-endpoint", "versions", "below"),
    _Bound("versions-too-many", "hello-endpoint", "versions", "above"),
    _Bound("labels-too-many", "join-request-any-rank", "labels", "above"),
    _Bound("chunks-empty", "chunk-ack", "chunks", "below"),
    _Bound("chunks-too-many", "chunk-ack", "chunks", "above"),
    _Bound("bitmap-too-long", "epoch-change", "members", "above"),
)
"""The field bounds the vectors break: at least one of each kind of field (integer,
byte string, bitmap, text, list), in messages and in nested structures."""


def _number(n: int) -> str:
    """An integer as the draft writes it: 2^k, 2^k-1 or 2^k+1 near a large power of two."""
    for k in range(16, 65):
        offset = n - (1 << k)
        if -2 <= offset <= 1:
            return f"2^{k}{offset:+d}" if offset else f"2^{k}"
    return str(n)


def _count(n: int, unit: str) -> str:
    """``n`` bytes or entries, in English."""
    return f"{n} {unit}" if n == 1 else f"{n} {'entries' if unit == 'entry' else unit + 's'}"


def _declared(struct: type[Struct], field: str) -> tuple[Path, str, FieldType[Any]]:
    """The map keys and list indices that lead to ``field`` of ``struct``, the same as
    the mutations name them ("key 4, index 0, key 3"), and the field's type."""
    path: list[int | str] = []
    steps: list[str] = []
    kind: FieldType[Any] | None = None
    for step in field.split("."):
        name, _, index = step.partition("[")
        if kind is not None:
            assert isinstance(kind, Nested), f"{field}: {name} is not inside a structure"
            struct = kind.struct_type
        spec = dict(struct.wire_fields())[name]
        path.append(spec.key)
        steps.append(f"key {spec.key}")
        kind = spec.kind
        if index:
            assert isinstance(kind, ListOf), f"{field}: {name} is not a list"
            path.append(int(index.rstrip("]")))
            steps.append(f"index {path[-1]}")
            kind = kind.item
    assert kind is not None
    return tuple(path), ", ".join(steps), kind


def _outside(bound: _Bound) -> Failure:
    """The vector of one broken bound, every detail read from the field's declaration."""
    message = samples_by_name()[bound.base].message
    path, keys, kind = _declared(type(message), bound.field)
    old = walk(base_value(bound.base)[1], path)
    below = bound.side == "below"
    if isinstance(kind, UInt):
        value, state, change = _integer_outside(kind, below)
    elif isinstance(kind, ListOf):
        value, state, change = _list_outside(kind, below, old)
    elif isinstance(kind, Text):
        value, state, change = _text_outside(kind, bound.side, old)
    else:
        assert isinstance(kind, Bytes), f"{bound.field}: {type(kind).__name__} has no range"
        value, state, change = _bytes_outside(kind, below, old)
    description = f"{bound.field} {state}."
    mutation = change.format(f"{bound.field} ({keys})")
    return Failure(
        bound.name,
        bound.base,
        E.INVALID_FIELD,
        False,
        description,
        mutation,
        with_field(bound.base, path, value),
    )


_Outside = tuple[RawValue, str, str]
"""A value just outside a range, what the description says of it, and the mutation
(``{}`` stands for the field)."""


def _integer_outside(kind: UInt, below: bool) -> _Outside:
    value = kind.minimum - 1 if below else kind.maximum + 1
    span = f"range {_number(kind.minimum)}..{_number(kind.maximum)}"
    return value, f"is {_number(value)} ({span})", f"set {{}} to {value}"


def _list_outside(kind: ListOf[Any], below: bool, old: list[Any]) -> _Outside:
    count = kind.min_items - 1 if below else kind.max_items + 1
    state = f"has {_count(count, 'entry')} ({kind.min_items}..{kind.max_items} entries)"
    if not below:
        return [old[0]] * count, state, f"set {{}} to {count} copies of its first entry"
    return old[:count], state, f"keep the first {_count(count, 'entry')} of {{}}" if count else "set {} to []"


def _text_outside(kind: Text, side: str, old: str) -> _Outside:
    span = f"{kind.min_len}..{kind.max_len} bytes"
    if side == "below":
        size = kind.min_len - 1
        cut = f"keep the first {_count(size, 'byte')} of {{}}" if size else 'set {} to ""'
        return old.encode()[:size].decode(), f"has {_count(size, 'byte')} ({span})", cut
    size = kind.max_len + 1
    if side == "above":
        return "x" * size, f"has {size} bytes ({span})", f'set {{}} to {size} times "x"'
    wide = "\u00e9" * -(-size // 2)  # two UTF-8 bytes each
    state = (
        f"has {len(wide)} characters but {len(wide.encode())} UTF-8 bytes ({span}): text limits count bytes"
    )
    return wide, state, f"set {{}} to {len(wide)} times U+00E9"


def _bytes_outside(kind: Bytes, below: bool, old: bytes) -> _Outside:
    size = kind.min_len - 1 if below else kind.max_len + 1
    span = f"exactly {kind.min_len}" if kind.min_len == kind.max_len else f"{kind.min_len}..{kind.max_len}"
    state = f"has {_count(size, 'byte')} ({span} bytes)"
    if below:
        return (
            old[:size],
            state,
            f"keep the first {_count(size, 'byte')} of {{}}" if size else "set {} to h''",
        )
    last = b"\x01" if isinstance(kind, Bitmap) else b"\x00"  # a bitmap's last byte is never zero
    change = f"extend {{}} to {size} bytes with zero bytes, the last one {last.hex()}"
    return old.ljust(size - 1, b"\x00") + last, state, change


def range_failures() -> list[Failure]:
    return [_outside(bound) for bound in _BOUNDS]
