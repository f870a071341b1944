"""Hypothesis strategies for every CCO message, derived from the field declarations.

Because each message declares its fields with typed ``FieldType`` objects, one
function can turn any field into a strategy; a new message type is covered by the
property tests without touching this file.  Chunk messages get a hand-written
strategy because their payload length depends on other fields.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from cco.wire.errors import EncodeError
from cco.wire.fields import (
    Bitmap,
    Bytes,
    Enum,
    FieldType,
    ListOf,
    Nested,
    Struct,
    Text,
    UInt,
    bitmap_from_ranks,
)
from cco.wire.messages import (
    MESSAGE_CLASSES,
    ChunkMessage,
    Message,
    chunk_count,
    chunk_length,
)
from cco.wire.registries import Collective, DType, ReduceOp

# Keep generated sizes small: the properties are about structure, not volume.
_MAX_BYTES = 48
_MAX_ITEMS = 4


def field_strategy(kind: FieldType[Any]) -> st.SearchStrategy[Any]:
    """A strategy producing valid values of one field type."""
    if isinstance(kind, Bitmap):
        return st.frozensets(st.integers(0, min(kind.max_len * 8 - 1, 200)), max_size=6).map(
            bitmap_from_ranks
        )
    if isinstance(kind, Bytes):
        return st.binary(min_size=kind.min_len, max_size=max(kind.min_len, min(kind.max_len, _MAX_BYTES)))
    if isinstance(kind, Text):
        return st.text(min_size=max(1, kind.min_len), max_size=12).filter(
            lambda s: kind.min_len <= len(s.encode("utf-8", "surrogatepass")) <= kind.max_len
        )
    if isinstance(kind, UInt):  # also Int
        return st.integers(kind.minimum, kind.maximum)
    if isinstance(kind, Enum):
        return st.sampled_from(list(kind.enum_type))
    if isinstance(kind, ListOf):
        return st.lists(
            field_strategy(kind.item),
            min_size=kind.min_items,
            max_size=max(kind.min_items, min(kind.max_items, _MAX_ITEMS)),
        ).map(tuple)
    if isinstance(kind, Nested):
        return struct_strategy(kind.struct_type)
    raise TypeError(f"no strategy for {type(kind).__name__}")


def _is_valid(instance: Struct) -> bool:
    try:
        instance.to_map()
    except EncodeError:
        return False
    return True


def struct_strategy(cls: type[Struct]) -> st.SearchStrategy[Any]:
    """Instances of ``cls`` whose fields and cross-field rules are all valid."""
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for name, spec in cls.wire_fields():
        strategy = field_strategy(spec.kind)
        fields[name] = st.none() | strategy if spec.optional else strategy
    return st.builds(cls, **fields).filter(_is_valid)


@st.composite
def chunk_message_strategy(draw: st.DrawFn, cls: type[ChunkMessage]) -> ChunkMessage:
    """A chunk message with a payload of exactly the length its header implies."""
    chunk_elements = draw(st.integers(1, 16))
    total = draw(st.integers(0, 64))
    index = draw(st.integers(0, chunk_count(total, chunk_elements) - 1))
    width = draw(st.sampled_from([1, 2, 4, 8]))
    kind = draw(st.sampled_from(list(Collective)))
    needs_root = kind in (Collective.REDUCE, Collective.BROADCAST)
    size = chunk_length(total, chunk_elements, index) * width
    return cls(
        group_id=draw(st.binary(min_size=16, max_size=16)),
        epoch=draw(st.integers(0, (1 << 64) - 1)),
        op_id=draw(st.integers(0, (1 << 64) - 1)),
        kind=kind,
        op=draw(st.sampled_from(list(ReduceOp))),
        dtype=draw(st.sampled_from(list(DType))),
        scale=draw(st.integers(-2048, 2047)),
        total_elements=total,
        chunk_elements=chunk_elements,
        chunk_index=index,
        contributors=draw(st.frozensets(st.integers(0, 100), min_size=1, max_size=5).map(bitmap_from_ranks)),
        width=width,
        payload=draw(st.binary(min_size=size, max_size=size)),
        tag=draw(st.none() | st.integers(0, (1 << 61) - 2)),
        root=draw(st.integers(0, 65535)) if needs_root else None,
    )


def message_strategy(cls: type[Message]) -> st.SearchStrategy[Message]:
    if issubclass(cls, ChunkMessage):
        return chunk_message_strategy(cls)
    return struct_strategy(cls)


ALL_MESSAGE_CLASSES = sorted(MESSAGE_CLASSES.values(), key=lambda c: int(c.TYPE))
any_message = st.one_of([message_strategy(cls) for cls in ALL_MESSAGE_CLASSES])
