"""Typed, authenticated, aggregatable chunk payloads: the facade the nodes use.

An endpoint turns its tensor into wire integers (:mod:`cco.wire.codec`, or
:mod:`cco.wire.blockscale` for floats under SUM and AVG), cuts them into chunks and
seals each one with a homomorphic tag (:func:`seal`).  Aggregators, which hold no
key, add chunks exactly and add their tags (:func:`combine`).  An endpoint accepts
a result only after the range, bitmap, tag and attestation checks
(:func:`open_verified`), then turns the integers back into its dtype.  The pieces
live in one module per idea: ``modp`` (exact F_p arithmetic), ``mac`` (keys,
coefficients, pads, tags), ``blockscale``, ``dtypes``, ``ops``, ``codec`` (tensor to
wire integers), ``packing`` (integers to bytes) and ``chunking``.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from cco.wire import cbor
from cco.wire.blockscale import block_count
from cco.wire.codec import decode_values, encode_values, wire_length
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.mac import CoefficientCache, GroupKeys, contribution_tag, derive_group_keys, expected_tag
from cco.wire.messages import ChunkMessage, Contribution, chunk_length
from cco.wire.modp import P
from cco.wire.ops import OPS, check_operation, inconsistency, scaling_problem
from cco.wire.packing import (
    RANGE_BOUND,
    WIDTHS,
    contribution_bound,
    extremes,
    fits_width,
    minimal_width,
    narrow,
    unpack,
    within_bound,
)
from cco.wire.registries import MAX_WORLD_SIZE, Collective, DType, ReduceOp

__all__ = [
    "RANGE_BOUND",
    "ChunkHeader",
    "GroupKeys",
    "combine",
    "contribution_bound",
    "decode_values",
    "derive_group_keys",
    "encode_values",
    "open_verified",
    "seal",
    "wire_length",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkHeader:
    """The fields that identify a chunk; all of them are bound into its tag.

    ``width``, ``block_elements`` and ``scales`` are set for block-scaled chunks
    only: their width is fixed by the operation, while other chunks are written at
    whatever width their integers need, which is not part of their identity.
    ``members``, ``quorum`` and ``wait_ms`` are set for the chunks of a quorum
    ALL_REDUCE only (its presence pass, and the operations it decides).
    """

    group_id: bytes
    epoch: int
    op_id: int
    kind: Collective
    op: ReduceOp
    dtype: DType
    total_elements: int
    chunk_elements: int
    chunk_index: int
    root: int | None = None
    width: int | None = None
    block_elements: int | None = None
    scales: bytes | None = None
    members: bytes | None = None
    quorum: int | None = None
    wait_ms: int | None = None

    @classmethod
    def of(cls, message: ChunkMessage) -> ChunkHeader:
        width = message.width if message.block_elements is not None else None
        return _header(_identity(message), width)

    @property
    def element_count(self) -> int:
        """Elements in this chunk."""
        return chunk_length(self.total_elements, self.chunk_elements, self.chunk_index)

    @property
    def block_count(self) -> int:
        """Blocks (and attestation integers) of a block-scaled chunk; 0 otherwise."""
        return 0 if self.block_elements is None else block_count(self.element_count, self.block_elements)

    @property
    def integer_count(self) -> int:
        """Integers in the payload: the elements, then one attestation per block."""
        return self.element_count + self.block_count

    def chunk_id(self) -> bytes:
        """m: the deterministic CBOR array of the identifying fields, with
        [width, block_elements, scales] (or null) in the seventh place; a chunk of a
        quorum ALL_REDUCE appends members (or null) and [quorum, wait_ms] (or null)."""
        scaling: list[cbor.CborValue] | None = None
        if self.width is not None:
            scaling = [self.width, self.block_elements, self.scales]
        fields: list[cbor.CborValue] = [
            self.group_id,
            self.epoch,
            self.op_id,
            int(self.kind),
            int(self.op),
            int(self.dtype),
            scaling,
            self.total_elements,
            self.chunk_elements,
            self.chunk_index,
            self.root,
        ]
        if self.members is not None or self.quorum is not None:
            presence: list[cbor.CborValue] | None = None
            if self.quorum is not None:
                presence = [self.quorum, self.wait_ms]
            fields += [self.members, presence]
        return cbor.encode(fields)

    def check(self) -> None:
        """Refuse a kind, op and dtype that do not fit together, block scaling where
        the form has none, and an EXACT chunk that is not whole elements' limbs."""
        check_operation(self.kind, self.op, self.dtype, self.total_elements)
        present = {self.width is not None, self.block_elements is not None, self.scales is not None}
        if len(present) != 1:
            raise CcoError(ErrorCode.INVALID_FIELD, "width, block_elements and scales go together")
        problem = scaling_problem(
            self.kind, self.op, self.dtype, self.total_elements, self.scales is not None
        )
        if problem is not None:
            raise CcoError(ErrorCode.INVALID_FIELD, problem)
        if self.scales is not None and len(self.scales) != 2 * self.block_count:
            raise CcoError(
                ErrorCode.INVALID_FIELD, f"{len(self.scales)} bytes of scales for {self.block_count} blocks"
            )


_IDENTITY = (
    "group_id",
    "epoch",
    "op_id",
    "kind",
    "op",
    "dtype",
    "total_elements",
    "chunk_elements",
    "chunk_index",
    "root",
    "block_elements",
    "scales",
    "members",
    "quorum",
    "wait_ms",
)
_identity = attrgetter(*_IDENTITY)
"""The identifying fields of a header or chunk message besides width, as a tuple
(fast to compare)."""

HEADERS_KEPT = 64
"""Headers :func:`_header` and :func:`_checked` remember.  Every part of a chunk and
its Result repeat the chunk's header, and a process has a few windows of chunks in
flight at most; a header not remembered is only built and checked again."""


@functools.lru_cache(maxsize=HEADERS_KEPT)
def _header(identity: tuple[Any, ...], width: int | None) -> ChunkHeader:
    """The header of the chunks whose identifying fields are ``identity``, built once
    for all the messages of a chunk: building a frozen dataclass of 16 fields costs
    about 4 us, as much as checking a small chunk's tag."""
    return ChunkHeader(**dict(zip(_IDENTITY, identity, strict=True)), width=width)


@dataclass(frozen=True, slots=True)
class _Checked:
    """What the payload functions need of a header that passed :meth:`ChunkHeader.check`."""

    fields: dict[str, Any]
    """The identifying fields, as keyword arguments of a chunk message."""
    chunk_id: bytes
    element_count: int
    integer_count: int
    verifiable: bool


@functools.lru_cache(maxsize=HEADERS_KEPT)
def _checked(header: ChunkHeader) -> _Checked:
    """``header`` checked, and its chunk id and counts, once per header.

    The checks and the chunk id are functions of the header's fields alone, and a
    chunk's header comes back with each of its parts (the aggregator checks it in
    every combine) and its Result, so the work is done for the first of them only.
    A header that fails its checks is not remembered: it raises every time."""
    header.check()
    return _Checked(
        dict(zip(_IDENTITY, _identity(header), strict=True)),
        header.chunk_id(),
        header.element_count,
        header.integer_count,
        OPS[header.op].verifiable,
    )


def _message(
    cls: type[ChunkMessage], checked: _Checked, ranks: bytes, width: int, payload: bytes, tag: int | None
) -> ChunkMessage:
    message = cls(**checked.fields, contributors=ranks, width=width, payload=payload, tag=tag)
    message.validate(cls.__name__, encoding=True)
    return message


def _payload(message: ChunkMessage, integer_count: int) -> np.ndarray:
    """The message's integers, after checking that width and length agree with the
    header's ``integer_count``."""
    if message.width not in WIDTHS:
        raise CcoError(ErrorCode.INVALID_FIELD, f"width {message.width} is not one of {WIDTHS}")
    if len(message.payload) != integer_count * message.width:
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"payload has {len(message.payload)} bytes, chunk needs {integer_count * message.width}",
        )
    return unpack(message.payload, message.width)


def _range_error(lo: int, hi: int, width: int | None, what: str) -> CcoError | None:
    """OVERFLOW when integers in [lo, hi] break the range bound or the fixed width."""
    if not within_bound(lo, hi):
        return CcoError(ErrorCode.OVERFLOW, f"{what} in [{lo}, {hi}] leaves [-B, B]")
    if width is not None and not fits_width(lo, hi, width):
        return CcoError(ErrorCode.OVERFLOW, f"{what} in [{lo}, {hi}] does not fit {width} bytes")
    return None


def seal(
    keys: GroupKeys,
    header: ChunkHeader,
    rank: int,
    values: np.ndarray,
    cls: type[ChunkMessage] = Contribution,
    coefficients: CoefficientCache | None = None,
) -> ChunkMessage:
    """Rank ``rank``'s chunk: its int64 ``values`` (for a block-scaled chunk, the
    elements then the attestations) packed at the chunk's width, tagged when the op
    is verifiable.  OVERFLOW if a tagged value leaves [-B, B] or a block-scaled one
    its width.  The tag's coefficients are kept in ``coefficients``, for verifying
    the chunk's aggregate with :func:`open_verified`."""
    checked = _checked(header)
    if not 0 <= rank < MAX_WORLD_SIZE:
        raise CcoError(ErrorCode.INVALID_FIELD, f"rank {rank} is out of range")
    if header.kind is Collective.BROADCAST and rank != header.root:
        raise CcoError(ErrorCode.INVALID_FIELD, f"only the root {header.root} seals BROADCAST data")
    values = np.asarray(values)
    if values.dtype != np.int64 or values.shape != (checked.integer_count,):
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"a chunk is {checked.integer_count} int64 values, got {values.dtype} {values.shape}",
        )
    lo, hi = extremes(values)
    verifiable = checked.verifiable
    if verifiable and (error := _range_error(lo, hi, header.width, "a value")) is not None:
        raise error
    width = header.width if header.width is not None else minimal_width(lo, hi)
    packed = narrow(values, width)
    tag = contribution_tag(keys, checked.chunk_id, rank, packed, coefficients) if verifiable else None
    return _message(cls, checked, bitmap_from_ranks([rank]), width, packed.tobytes(), tag)


def combine(parts: Sequence[ChunkMessage], cls: type[ChunkMessage]) -> ChunkMessage:
    """The exact combination of chunks with disjoint contributors, keyless.

    Integers combine with the op (exactly; a sum never wraps), tags add mod p,
    bitmaps OR.  The result is the same bytes whatever the order of ``parts``.
    """
    if not parts:
        raise CcoError(ErrorCode.INVALID_FIELD, "nothing to combine")
    identity = _identity(parts[0])
    for part in parts[1:]:
        other = _identity(part)
        if other != identity:
            differ = [name for name, a, b in zip(_IDENTITY, identity, other, strict=True) if a != b]
            raise CcoError(ErrorCode.OPERATION_MISMATCH, f"chunks differ in {', '.join(differ)}")
    header = ChunkHeader.of(parts[0])
    checked = _checked(header)
    if header.width is not None and any(part.width != header.width for part in parts):
        raise CcoError(ErrorCode.OPERATION_MISMATCH, "block-scaled chunks differ in width")
    semantics = OPS[header.op]

    seen = 0
    for part in parts:
        bits = _contributor_bits(part)
        if seen & bits:
            twice = sorted(ranks_from_bitmap((seen & bits).to_bytes(len(part.contributors), "little")))
            raise CcoError(ErrorCode.DUPLICATE_CONTRIBUTION, f"ranks {twice} are in two chunks")
        seen |= bits

    for part in parts:
        _check_tag(part, header)
    tag = sum(part.tag for part in parts if part.tag is not None) % P if semantics.verifiable else None

    arrays = [_payload(part, checked.integer_count) for part in parts]
    if semantics.verifiable:
        for array in arrays:
            _check_input_range(array)
        total = _accumulate(arrays, semantics.combine)
    else:  # MIN, MAX and the bitwise ops never leave the range of their inputs
        total = arrays[0].astype(np.int64)
        for array in arrays[1:]:
            semantics.combine(total, array, out=total)
    lo, hi = extremes(total)
    if semantics.verifiable and (error := _range_error(lo, hi, header.width, "the combination")) is not None:
        raise error
    width = header.width if header.width is not None else minimal_width(lo, hi)
    ranks = seen.to_bytes((seen.bit_length() + 7) // 8, "little")
    return _message(cls, checked, ranks, width, narrow(total, width).tobytes(), tag)


def check_part(message: ChunkMessage) -> None:
    """What :func:`combine` checks of each part, for a chunk combined later: an
    aggregator keeps the first part of a slot as it is, and refuses here what combine
    would refuse (header, contributors, tag, input range), so that the child at fault
    is the one refused."""
    header = ChunkHeader.of(message)
    checked = _checked(header)
    _contributor_bits(message)
    _check_tag(message, header)
    if checked.verifiable:
        _check_input_range(_payload(message, checked.integer_count))


def _contributor_bits(part: ChunkMessage) -> int:
    bits = int.from_bytes(part.contributors, "little")
    if bits == 0:
        raise CcoError(ErrorCode.INVALID_FIELD, "a chunk has no contributors")
    return bits


def _check_tag(part: ChunkMessage, header: ChunkHeader) -> None:
    if OPS[header.op].verifiable:
        if part.tag is None or not 0 <= part.tag < P:
            raise CcoError(ErrorCode.INVALID_FIELD, f"{header.op.name} chunks carry a tag in [0, p)")
    elif part.tag is not None:
        raise CcoError(ErrorCode.INVALID_FIELD, f"{header.op.name} chunks carry no tag")


def _check_input_range(array: np.ndarray) -> None:
    """Only 8-byte integers can leave [-B, B]."""
    if array.dtype.itemsize == 8 and not within_bound(*extremes(array)):
        raise CcoError(ErrorCode.OVERFLOW, "an input value leaves [-B, B]")


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


def check_encoding(message: ChunkMessage, header: ChunkHeader | None = None) -> np.ndarray:
    """The payload's integers once its length fits the header and its width is the
    smallest that holds them (a block-scaled chunk's width is fixed instead, and part
    of its header): a unique encoding, so equal chunks are equal bytes.
    ``INVALID_FIELD`` otherwise."""
    header = header or ChunkHeader.of(message)
    return _checked_encoding(message, header.width is not None, header.integer_count)[0]


def _checked_encoding(
    message: ChunkMessage, scaled: bool, integer_count: int
) -> tuple[np.ndarray, tuple[int, int]]:
    """:func:`check_encoding` (``scaled``: of a block-scaled chunk, whose width is
    fixed), with the integers' (min, max) found on the way."""
    values = _payload(message, integer_count)
    lo, hi = extremes(values)
    if not scaled and minimal_width(lo, hi) != message.width:
        raise CcoError(
            ErrorCode.INVALID_FIELD, f"width {message.width} is not the smallest that holds the chunk"
        )
    return values, (lo, hi)


def open_verified(
    keys: GroupKeys,
    message: ChunkMessage,
    expected: frozenset[int],
    own: tuple[int, np.ndarray] | None = None,
    at_least: int | None = None,
    coefficients: CoefficientCache | None = None,
) -> np.ndarray:
    """The chunk's int64 element integers once every check passed.

    Checks: the contributors are exactly ``expected`` (detail "bitmap"), or with
    ``at_least`` (the presence pass of a quorum ALL_REDUCE) at least that many of
    ``expected``; for
    verifiable ops every integer is within [-B, B] ("range") and the tag matches
    ("tag"); for block-scaled chunks every block's attestations sum to between 1
    and the number of contributors ("attestation": the block's agreed scale was
    somebody's proposal); and for MIN, MAX, BAND and BOR the result is consistent
    with the caller's own values ``own = (rank, values)`` ("consistency").  Failures
    raise ``VERIFICATION_FAILED`` with that word first in the detail.  A chunk not
    written at its smallest width (other than a block-scaled one, whose width is
    fixed) is ``INVALID_FIELD``.  The tag's coefficients are taken from
    ``coefficients`` when :func:`seal` kept them there.
    """
    header = ChunkHeader.of(message)
    checked = _checked(header)
    ranks = ranks_from_bitmap(message.contributors)
    extra, missing = sorted(ranks - expected), sorted(expected - ranks)
    if extra or (missing and (at_least is None or len(ranks) < at_least)):
        quorum = "" if at_least is None else f" (a quorum of {at_least} needed)"
        detail = f"bitmap: unexpected ranks {extra}, missing ranks {missing}{quorum}"
        raise CcoError(ErrorCode.VERIFICATION_FAILED, detail)

    values, (lo, hi) = _checked_encoding(message, header.width is not None, checked.integer_count)
    verifiable = checked.verifiable
    if verifiable and not within_bound(lo, hi):
        bad = int(np.argmax(np.abs(values.astype(np.int64)) > RANGE_BOUND))
        raise CcoError(ErrorCode.VERIFICATION_FAILED, f"range: integer {bad} leaves [-B, B]")

    if verifiable:
        if message.tag is None:
            raise CcoError(ErrorCode.VERIFICATION_FAILED, "tag: missing")
        if not 0 <= message.tag < P:
            raise CcoError(ErrorCode.VERIFICATION_FAILED, "tag: not an element of F_p")
        want = expected_tag(keys, checked.chunk_id, sorted(ranks), values, coefficients)
        if not hmac.compare_digest(want.to_bytes(8, "big"), message.tag.to_bytes(8, "big")):
            raise CcoError(ErrorCode.VERIFICATION_FAILED, "tag: does not match the integers and contributors")
    elif message.tag is not None:
        raise CcoError(ErrorCode.INVALID_FIELD, f"{header.op.name} chunks carry no tag")

    elements = checked.element_count
    result = values[:elements].astype(np.int64)
    attested = values[elements:]  # empty unless block-scaled
    if len(attested):
        unattested = (attested < 1) | (attested > len(ranks))
        if unattested.any():
            bad = int(np.argmax(unattested))
            raise CcoError(
                ErrorCode.VERIFICATION_FAILED,
                f"attestation: block {bad} has {int(attested[bad])} attestations for {len(ranks)} "
                "contributors (its scale is nobody's proposal)",
            )
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
