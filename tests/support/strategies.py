"""Hypothesis strategies for every CCO message, derived from the field declarations.

Because each message declares its fields with typed ``FieldType`` objects, one
function can turn any field into a strategy; a new message type is covered by the
property tests without touching this file.  Chunk messages get a hand-written
strategy because their payload length, scales and block_elements depend on other
fields (their wire form); every form is drawn equally often.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from cco.wire.errors import EncodeError
from cco.wire.exact import MAX_ELEMENTS, limb_count
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
    ELEMENT_WIDTHS,
    MAC_MODULUS,
    MAX_BLOCK_ELEMENTS,
    MESSAGE_CLASSES,
    MIN_BLOCK_ELEMENTS,
    REPORT_CODES,
    ChunkMessage,
    Message,
    Report,
    chunk_count,
    chunk_length,
)
from cco.wire.ops import SUM_KINDS, Form, form
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


_NARROWED: dict[tuple[type[Struct], str], st.SearchStrategy[Any]] = {
    (Report, "code"): st.sampled_from(REPORT_CODES),
}
"""Fields whose cross-field rule admits so few of their declared values that filtering
would discard nearly every draw."""


def struct_strategy(cls: type[Struct]) -> st.SearchStrategy[Any]:
    """Instances of ``cls`` whose fields and cross-field rules are all valid."""
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for name, spec in cls.wire_fields():
        narrowed = _NARROWED.get((cls, name))
        strategy = field_strategy(spec.kind) if narrowed is None else narrowed
        fields[name] = st.none() | strategy if spec.optional else strategy
    return st.builds(cls, **fields).filter(_is_valid)


@st.composite
def chunk_message_strategy(draw: st.DrawFn, cls: type[ChunkMessage]) -> ChunkMessage:
    """A valid chunk message of any wire form: its scales, block_elements and payload
    length follow from the header (block-scaled chunks carry one attestation integer
    per block after their elements, at their width; EXACT ones whole elements' limbs)."""
    target = draw(st.sampled_from(list(Form)))
    exact = target is Form.EXACT
    kind, op, dtype = draw(_operations[Form.BLOCK_SCALED if exact else target])
    assert form(kind, op, dtype, exact) is target
    barrier = kind is Collective.BARRIER
    dtype = DType.INT8 if barrier else dtype
    chunk_elements = draw(st.integers(1, 40))
    # EXACT: whole elements of limbs, at most MAX_ELEMENTS of them; a BARRIER: none
    total = limb_count(dtype) * draw(st.integers(0, MAX_ELEMENTS)) if exact else draw(st.integers(0, 100))
    total = 0 if barrier else total
    index = draw(st.integers(0, chunk_count(total, chunk_elements) - 1))
    width = draw(st.sampled_from(list(ELEMENT_WIDTHS)))
    elements = chunk_length(total, chunk_elements, index)
    contributors = draw(st.frozensets(st.integers(0, 100), min_size=1, max_size=5))
    block_elements = scales = None
    attestations = b""
    if target is Form.BLOCK_SCALED:
        block_elements = draw(
            st.integers(MIN_BLOCK_ELEMENTS, 24) | st.sampled_from([256, MAX_BLOCK_ELEMENTS])
        )
        blocks = -(-elements // block_elements)
        scales = b"".join(
            draw(st.integers(-(1 << 15), (1 << 15) - 1)).to_bytes(2, "little", signed=True)
            for _ in range(blocks)
        )
        attestations = b"".join(
            draw(st.integers(1, len(contributors))).to_bytes(width, "little", signed=True)
            for _ in range(blocks)
        )
    needs_root = kind in (Collective.REDUCE, Collective.BROADCAST)
    return cls(
        group_id=draw(st.binary(min_size=16, max_size=16)),
        epoch=draw(st.integers(0, (1 << 64) - 1)),
        op_id=draw(st.integers(0, (1 << 64) - 1)),
        kind=kind,
        op=op,
        dtype=dtype,
        scales=scales,
        total_elements=total,
        chunk_elements=chunk_elements,
        chunk_index=index,
        contributors=bitmap_from_ranks(contributors),
        width=width,
        payload=draw(st.binary(min_size=elements * width, max_size=elements * width)) + attestations,
        tag=draw(st.none() | st.integers(0, MAC_MODULUS - 1)),
        root=draw(st.integers(0, 65535)) if needs_root else None,
        block_elements=block_elements,
    )


_REDUCTIONS = [Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER]
_FLOATS = [DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64]
_INTEGERS = [DType.INT8, DType.INT16, DType.INT32, DType.INT64]
_operations: dict[Form, st.SearchStrategy[tuple[Collective, ReduceOp, DType]]] = {
    Form.VALUES: st.tuples(
        st.sampled_from(_REDUCTIONS), st.sampled_from(list(ReduceOp)), st.sampled_from(_INTEGERS)
    ),
    # op SUM (a decoding rule for these kinds), and a BARRIER of INT8 (see the draw)
    Form.PATTERNS: st.tuples(
        st.sampled_from(sorted(SUM_KINDS)), st.just(ReduceOp.SUM), st.sampled_from(list(DType))
    ),
    Form.ORDERED: st.tuples(
        st.sampled_from(_REDUCTIONS), st.sampled_from([ReduceOp.MIN, ReduceOp.MAX]), st.sampled_from(_FLOATS)
    ),
    Form.BLOCK_SCALED: st.tuples(
        st.sampled_from(_REDUCTIONS), st.sampled_from([ReduceOp.SUM, ReduceOp.AVG]), st.sampled_from(_FLOATS)
    ),
}
"""(kind, op, dtype) of each wire form.  The message layer checks only what the form
implies, so a PATTERNS kind with an op other than SUM is still a valid message (the
payload layer refuses it)."""


def message_strategy(cls: type[Message]) -> st.SearchStrategy[Message]:
    if issubclass(cls, ChunkMessage):
        return chunk_message_strategy(cls)
    return struct_strategy(cls)


ALL_MESSAGE_CLASSES = sorted(MESSAGE_CLASSES.values(), key=lambda c: int(c.TYPE))
any_message = st.one_of([message_strategy(cls) for cls in ALL_MESSAGE_CLASSES])
