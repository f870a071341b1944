"""Typed, authenticated, aggregatable chunk payloads: the facade the nodes use.

An endpoint turns its tensor into wire integers (:func:`encode_values`), cuts them
into chunks and seals each one with a homomorphic tag (:func:`seal`).  Aggregators,
which hold no key, add chunks exactly and add their tags (:func:`combine`).  An
endpoint accepts a result only after the range, bitmap and tag checks
(:func:`open_verified`), then turns the integers back into its dtype
(:func:`decode_values`).  The pieces live in one module per idea: ``modp`` (exact
F_p arithmetic), ``mac`` (keys, coefficients, pads, tags), ``fixedpoint``,
``dtypes``, ``ops``, ``codec`` (tensor to wire integers), ``packing`` (integers to
bytes) and ``chunking``.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass, fields
from operator import attrgetter

import numpy as np

from cco.wire import cbor
from cco.wire.codec import decode_values, encode_values, wire_length
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.fixedpoint import RANGE_BOUND, contribution_bound, default_scale
from cco.wire.mac import GroupKeys, contribution_tag, derive_group_keys, expected_tag
from cco.wire.messages import ChunkMessage, Contribution, chunk_length
from cco.wire.modp import P
from cco.wire.ops import OPS, check_operation, inconsistency
from cco.wire.packing import WIDTHS, extremes, minimal_width, narrow, unpack, within_bound
from cco.wire.registries import MAX_WORLD_SIZE, Collective, DType, ReduceOp

__all__ = [
    "RANGE_BOUND",
    "ChunkHeader",
    "GroupKeys",
    "combine",
    "contribution_bound",
    "decode_values",
    "default_scale",
    "derive_group_keys",
    "encode_values",
    "open_verified",
    "seal",
    "wire_length",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkHeader:
    """The fields that identify a chunk; all of them are bound into its tag."""

    group_id: bytes
    epoch: int
    op_id: int
    kind: Collective
    op: ReduceOp
    dtype: DType
    scale: int
    total_elements: int
    chunk_elements: int
    chunk_index: int
    root: int | None = None

    @classmethod
    def of(cls, message: ChunkMessage) -> ChunkHeader:
        return cls(**dict(zip(_HEADER_FIELDS, _header_values(message), strict=True)))

    @property
    def element_count(self) -> int:
        """Integers in this chunk."""
        return chunk_length(self.total_elements, self.chunk_elements, self.chunk_index)

    def chunk_id(self) -> bytes:
        """m: the deterministic CBOR array of the header fields, in declaration order."""
        return cbor.encode(
            [
                self.group_id,
                self.epoch,
                self.op_id,
                int(self.kind),
                int(self.op),
                int(self.dtype),
                self.scale,
                self.total_elements,
                self.chunk_elements,
                self.chunk_index,
                self.root,
            ]
        )

    def check(self) -> None:
        """Refuse a kind, op, dtype and scale that do not fit together."""
        check_operation(self.kind, self.op, self.dtype, self.scale, self.total_elements)


_HEADER_FIELDS = tuple(f.name for f in fields(ChunkHeader))
_header_values = attrgetter(*_HEADER_FIELDS)
"""The identifying fields of a header or chunk message, as a tuple (fast to compare)."""


def _message(
    cls: type[ChunkMessage], header: ChunkHeader, ranks: bytes, width: int, payload: bytes, tag: int | None
) -> ChunkMessage:
    message = cls(
        **dict(zip(_HEADER_FIELDS, _header_values(header), strict=True)),
        contributors=ranks,
        width=width,
        payload=payload,
        tag=tag,
    )
    message.validate(cls.__name__, encoding=True)
    return message


def _payload(message: ChunkMessage, header: ChunkHeader) -> np.ndarray:
    """The message's integers, after checking that width and length agree with the header."""
    if message.width not in WIDTHS:
        raise CcoError(ErrorCode.INVALID_FIELD, f"width {message.width} is not one of {WIDTHS}")
    if len(message.payload) != header.element_count * message.width:
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"payload has {len(message.payload)} bytes, chunk needs {header.element_count * message.width}",
        )
    return unpack(message.payload, message.width)


def seal(
    keys: GroupKeys,
    header: ChunkHeader,
    rank: int,
    values: np.ndarray,
    cls: type[ChunkMessage] = Contribution,
) -> ChunkMessage:
    """Rank ``rank``'s chunk: its int64 ``values`` packed at the smallest width, tagged
    when the op is verifiable.  OVERFLOW if a value leaves [-B, B]."""
    header.check()
    if not 0 <= rank < MAX_WORLD_SIZE:
        raise CcoError(ErrorCode.INVALID_FIELD, f"rank {rank} is out of range")
    if header.kind is Collective.BROADCAST and rank != header.root:
        raise CcoError(ErrorCode.INVALID_FIELD, f"only the root {header.root} seals BROADCAST data")
    values = np.asarray(values)
    if values.dtype != np.int64 or values.shape != (header.element_count,):
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"a chunk is {header.element_count} int64 values, got {values.dtype} {values.shape}",
        )
    lo, hi = extremes(values)
    if not within_bound(lo, hi):
        raise CcoError(ErrorCode.OVERFLOW, f"a value in [{lo}, {hi}] leaves [-B, B]")
    width = minimal_width(lo, hi)
    packed = narrow(values, width)
    tag = contribution_tag(keys, header.chunk_id(), rank, packed) if OPS[header.op].verifiable else None
    return _message(cls, header, bitmap_from_ranks([rank]), width, packed.tobytes(), tag)


def combine(parts: Sequence[ChunkMessage], cls: type[ChunkMessage]) -> ChunkMessage:
    """The exact combination of chunks with disjoint contributors, keyless.

    Integers combine with the op (exactly; a sum never wraps), tags add mod p,
    bitmaps OR.  The result is the same bytes whatever the order of ``parts``.
    """
    if not parts:
        raise CcoError(ErrorCode.INVALID_FIELD, "nothing to combine")
    identity = _header_values(parts[0])
    for part in parts[1:]:
        other = _header_values(part)
        if other != identity:
            differ = [name for name, a, b in zip(_HEADER_FIELDS, identity, other, strict=True) if a != b]
            raise CcoError(ErrorCode.OPERATION_MISMATCH, f"chunks differ in {', '.join(differ)}")
    header = ChunkHeader.of(parts[0])
    header.check()
    semantics = OPS[header.op]

    seen = 0
    for part in parts:
        bits = int.from_bytes(part.contributors, "little")
        if bits == 0:
            raise CcoError(ErrorCode.INVALID_FIELD, "a chunk has no contributors")
        if seen & bits:
            twice = sorted(ranks_from_bitmap((seen & bits).to_bytes(len(part.contributors), "little")))
            raise CcoError(ErrorCode.DUPLICATE_CONTRIBUTION, f"ranks {twice} are in two chunks")
        seen |= bits

    tag: int | None = None
    if semantics.verifiable:
        if any(part.tag is None or not 0 <= part.tag < P for part in parts):
            raise CcoError(ErrorCode.INVALID_FIELD, f"{header.op.name} chunks carry a tag in [0, p)")
        tag = sum(part.tag for part in parts if part.tag is not None) % P
    elif any(part.tag is not None for part in parts):
        raise CcoError(ErrorCode.INVALID_FIELD, f"{header.op.name} chunks carry no tag")

    arrays = [_payload(part, header) for part in parts]
    for array in arrays:
        if array.dtype.itemsize == 8 and not within_bound(*extremes(array)):
            raise CcoError(ErrorCode.OVERFLOW, "an input value leaves [-B, B]")
    total = _accumulate(arrays, semantics.combine)
    lo, hi = extremes(total)
    if not within_bound(lo, hi):
        raise CcoError(ErrorCode.OVERFLOW, f"the combination leaves [-B, B]: [{lo}, {hi}]")
    width = minimal_width(lo, hi)
    ranks = seen.to_bytes((seen.bit_length() + 7) // 8, "little")
    return _message(cls, header, ranks, width, narrow(total, width).tobytes(), tag)


def _accumulate(arrays: list[np.ndarray], ufunc: np.ufunc) -> np.ndarray:
    """Fold ``arrays`` with ``ufunc`` in int64 without ever overflowing int64.

    ``reach`` bounds |accumulator| by the sum of the inputs' widths' ranges; only when
    that bound passes B is the accumulator measured (and checked against B), so
    the usual narrow inputs never pay for an extra pass.
    """
    reach = sum(1 << (8 * a.dtype.itemsize - 1) for a in arrays[:2])
    # The first two inputs combine in one pass, widened to int64 on the fly.
    total = ufunc(arrays[0], arrays[1], dtype=np.int64) if len(arrays) > 1 else arrays[0].astype(np.int64)
    for array in arrays[2:]:
        if reach > RANGE_BOUND:
            lo, hi = extremes(total)
            if not within_bound(lo, hi):
                raise CcoError(ErrorCode.OVERFLOW, f"the combination leaves [-B, B]: [{lo}, {hi}]")
            reach = max(-lo, hi)
        ufunc(total, array, out=total)
        reach += 1 << (8 * array.dtype.itemsize - 1)
    return total


def open_verified(
    keys: GroupKeys,
    message: ChunkMessage,
    expected: frozenset[int],
    own: tuple[int, np.ndarray] | None = None,
) -> np.ndarray:
    """The chunk's int64 integers once every check passed.

    Checks: the contributors are exactly ``expected`` (detail "bitmap"), every
    integer is within [-B, B] ("range"), the tag matches for verifiable ops
    ("tag"), and for MIN, MAX, BAND and BOR the result is consistent with the
    caller's own values ``own = (rank, values)`` ("consistency").  Failures raise
    ``VERIFICATION_FAILED`` with that word first in the detail.
    """
    header = ChunkHeader.of(message)
    header.check()
    values = _payload(message, header)

    ranks = ranks_from_bitmap(message.contributors)
    if ranks != expected:
        extra, missing = sorted(ranks - expected), sorted(expected - ranks)
        raise CcoError(
            ErrorCode.VERIFICATION_FAILED, f"bitmap: unexpected ranks {extra}, missing ranks {missing}"
        )

    lo, hi = extremes(values)
    if not within_bound(lo, hi):
        bad = int(np.argmax(np.abs(values.astype(np.int64)) > RANGE_BOUND))
        raise CcoError(ErrorCode.VERIFICATION_FAILED, f"range: element {bad} leaves [-B, B]")
    if minimal_width(lo, hi) != message.width:
        raise CcoError(
            ErrorCode.INVALID_FIELD, f"width {message.width} is not the smallest that holds the chunk"
        )

    if OPS[header.op].verifiable:
        if message.tag is None:
            raise CcoError(ErrorCode.VERIFICATION_FAILED, "tag: missing")
        if not 0 <= message.tag < P:
            raise CcoError(ErrorCode.VERIFICATION_FAILED, "tag: not an element of F_p")
        want = expected_tag(keys, header.chunk_id(), sorted(ranks), values)
        if not hmac.compare_digest(want.to_bytes(8, "big"), message.tag.to_bytes(8, "big")):
            raise CcoError(ErrorCode.VERIFICATION_FAILED, "tag: does not match the integers and contributors")
    elif message.tag is not None:
        raise CcoError(ErrorCode.INVALID_FIELD, f"{header.op.name} chunks carry no tag")

    result = values.astype(np.int64)
    if own is not None:
        rank, own_values = own
        if rank not in ranks:
            raise CcoError(
                ErrorCode.VERIFICATION_FAILED, f"consistency: own rank {rank} is not a contributor"
            )
        if np.shape(own_values) != result.shape:
            raise CcoError(ErrorCode.INVALID_FIELD, "own values do not have the chunk's length")
        reason = inconsistency(header.op, result, np.asarray(own_values, dtype=np.int64))
        if reason is not None:
            raise CcoError(ErrorCode.VERIFICATION_FAILED, f"consistency: {reason}")
    return result
