"""Typed, authenticated, aggregatable chunk payloads: the facade the nodes use.

An endpoint turns its tensor into wire integers (:mod:`cco.wire.codec`, or
:mod:`cco.wire.blockscale` for floats under SUM and AVG), cuts them into chunks and
seals each one with a homomorphic tag (:func:`seal`).  Aggregators, which hold no
key, add chunks exactly and add their tags (:func:`combine`; :class:`Aggregate` as
the parts arrive).  A chunk's identity is its :class:`ChunkHeader`, which carries
what checking it found, and :func:`chunk_key` compares a message with it.  An endpoint accepts
a result only after the range, bitmap, tag and attestation checks
(:func:`open_verified`), then turns the integers back into its dtype.  The pieces
live in one module per idea: ``modp`` (exact F_p arithmetic), ``mac`` (keys,
coefficients, pads, tags), ``blockscale``, ``dtypes``, ``ops``, ``codec`` (tensor to
wire integers), ``packing`` (integers to bytes) and ``chunking``.
"""

from __future__ import annotations

import dataclasses
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np

from cco.wire import cbor, kernels
from cco.wire.codec import decode_values, encode_values, wire_length
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.mac import CoefficientCache, GroupKeys, contribution_tag, derive_group_keys, expected_tag
from cco.wire.messages import ChunkMessage, ChunkShape, Contribution
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
    "Aggregate",
    "ChunkHeader",
    "GroupKeys",
    "check_encoding",
    "check_part",
    "chunk_key",
    "combine",
    "contribution_bound",
    "decode_values",
    "derive_group_keys",
    "encode_values",
    "open_verified",
    "retype",
    "seal",
    "wire_length",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkHeader(ChunkShape):
    """The fields that identify a chunk; all of them are bound into its tag.

    ``width``, ``block_elements`` and ``scales`` are set for block-scaled chunks
    only: their width is fixed by the operation, while other chunks are written at
    whatever width their integers need, which is not part of their identity.
    ``members``, ``quorum`` and ``wait_ms`` are set for the chunks of a quorum
    ALL_REDUCE only (its presence pass, and the operations it decides).

    A header carries what :meth:`checked` found, so whoever keeps a header (an
    operation its chunks', an aggregator slot its chunk's) checks it and encodes its
    chunk id once, however many messages of the chunk it seals, combines or opens.
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
    _facts: _Facts | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def of(cls, message: ChunkMessage) -> ChunkHeader:
        """The header of the chunk ``message`` is a part or the result of."""
        width = message.width if message.block_elements is not None else None
        return cls(**dict(zip(_IDENTITY, _identity(message), strict=True)), width=width)

    def checked(self) -> _Facts:
        """This header :meth:`check`-ed, with its chunk id and counts; worked out once
        (a header that fails its checks raises every time)."""
        facts = self._facts
        if facts is None:
            self.check()
            facts = _Facts(
                chunk_key(self),
                dict(zip(_IDENTITY, _identity(self), strict=True)),
                self.chunk_id(),
                self.element_count,
                self.integer_count,
                OPS[self.op].verifiable,
            )
            object.__setattr__(self, "_facts", facts)
        return facts

    def names(self, message: ChunkMessage) -> bool:
        """Whether ``message`` is a part or the result of this header's chunk."""
        facts = self._facts
        return chunk_key(message) == (chunk_key(self) if facts is None else facts.key)

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
_before_kind = attrgetter(*_IDENTITY[:3])
_after_dtype = attrgetter(*_IDENTITY[6:])

ChunkKey = tuple[Any, ...]
"""A chunk's identity as a tuple of plain values: its identifying fields in the order
of ``_IDENTITY`` (kind, op and dtype as their code points), then its width if the
chunk is block-scaled (else None).  A message is a part or the result of the chunk
whose header has the same key."""


def chunk_key(chunk: ChunkMessage | ChunkHeader) -> ChunkKey:
    """The identity of the chunk ``chunk`` is (a message) or names (a header)."""
    return (
        *_before_kind(chunk),
        int(chunk.kind),
        int(chunk.op),
        int(chunk.dtype),
        *_after_dtype(chunk),
        chunk.width if chunk.block_elements is not None else None,
    )


@dataclass(frozen=True, slots=True)
class _Facts:
    """What the payload functions need of a header that passed :meth:`ChunkHeader.check`."""

    key: ChunkKey
    fields: dict[str, Any]
    """The identifying fields, as keyword arguments of a chunk message."""
    chunk_id: bytes
    element_count: int
    integer_count: int
    verifiable: bool


def _message(
    cls: type[ChunkMessage], facts: _Facts, ranks: bytes, width: int, payload: bytes, tag: int | None
) -> ChunkMessage:
    message = cls(**facts.fields, contributors=ranks, width=width, payload=payload, tag=tag)
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
    its width.  A block-scaled chunk's values may also come as signed integers of
    its fixed width below 8 bytes (:func:`~cco.wire.blockscale.chunk_integers`
    writes them so): they are then the payload's integers as they are, within the
    width and [-B, B] by their type, so no pass measures or narrows them.  The tag's
    coefficients are kept in ``coefficients``, for verifying the chunk's aggregate
    with :func:`open_verified`."""
    checked = header.checked()
    if not 0 <= rank < MAX_WORLD_SIZE:
        raise CcoError(ErrorCode.INVALID_FIELD, f"rank {rank} is out of range")
    if header.kind is Collective.BROADCAST and rank != header.root:
        raise CcoError(ErrorCode.INVALID_FIELD, f"only the root {header.root} seals BROADCAST data")
    values = np.asarray(values)
    fixed = header.width is not None and header.width < 8 and values.dtype == np.dtype(f"<i{header.width}")
    if not (values.dtype == np.int64 or fixed) or values.shape != (checked.integer_count,):
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"a chunk is {checked.integer_count} int64 values (block-scaled: or of its width), "
            f"got {values.dtype} {values.shape}",
        )
    verifiable = checked.verifiable
    if fixed:
        assert header.width is not None
        width, packed = header.width, values
    else:
        lo, hi = extremes(values)
        if verifiable and (error := _range_error(lo, hi, header.width, "a value")) is not None:
            raise error
        width = header.width if header.width is not None else minimal_width(lo, hi)
        packed = narrow(values, width)
    tag = contribution_tag(keys, checked.chunk_id, rank, packed, coefficients) if verifiable else None
    return _message(cls, checked, bitmap_from_ranks([rank]), width, packed.tobytes(), tag)


def combine(parts: Sequence[ChunkMessage], cls: type[ChunkMessage]) -> ChunkMessage:
    """The exact combination of chunks with disjoint contributors, keyless, in one go.

    Integers combine with the op (exactly; a sum never wraps), tags add mod p,
    bitmaps OR.  The result is the same bytes whatever the order of ``parts``.  Every
    part is checked before any is added; an aggregator that takes parts as they come
    builds the same message with :class:`Aggregate`.
    """
    if not parts:
        raise CcoError(ErrorCode.INVALID_FIELD, "nothing to combine")
    key = chunk_key(parts[0])[:-1]
    for part in parts[1:]:
        other = chunk_key(part)[:-1]
        if other != key:
            differ = [name for name, a, b in zip(_IDENTITY, key, other, strict=True) if a != b]
            raise CcoError(ErrorCode.OPERATION_MISMATCH, f"chunks differ in {', '.join(differ)}")
    header = ChunkHeader.of(parts[0])
    checked = header.checked()
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
    """What :func:`combine` checks of each part (header, contributors, tag, input
    range), for a chunk that goes on as it is: the child at fault is the one refused."""
    Aggregate(message)


class Aggregate:
    """The exact combination of one chunk's parts, built as they arrive: what
    :func:`combine` returns for the same parts, whatever their order.

    The first part is kept as it is (a chunk with one part goes on unchanged); from
    the second, the integers are added into one array in place, the tags into their
    sum and the contributors into one bitmap, and :meth:`message` packs them once,
    when the chunk is complete.  Each part is refused as :func:`combine` would
    refuse it, and a refused part leaves the aggregate as it was: another chunk, or
    another width of a block-scaled one (OPERATION_MISMATCH), contributors already in
    (DUPLICATE_CONTRIBUTION), a missing or stray tag, a payload that does not fit
    the header (INVALID_FIELD), an input or a running combination outside [-B, B] or
    the fixed width (OVERFLOW).  The range of the running combination is known from
    a bound on it (the parts' widths, or their measured extremes where the width is
    fixed), so it is measured only when the bound alone cannot clear it.

    The array of sums is int64, except for a block-scaled chunk of a fixed width
    below 8 bytes while the bound clears every sum at that width (always, for honest
    parts: the sum limit makes a whole group's sum fit it).  Then the integers add at
    the payload's own width, with no widening pass, and the array is the message's
    integers as they are, with no narrowing pass either.  A part the bound cannot
    clear widens the array to int64 for good.
    """

    __slots__ = ("_bits", "_bound", "_facts", "_first", "_header", "_limit", "_sums", "_tag", "_total")

    def __init__(self, first: ChunkMessage) -> None:
        header = ChunkHeader.of(first)
        facts = header.checked()
        self._bits = _contributor_bits(first)
        _check_tag(first, header)
        self._bound = 0  # of |every integer| of the running combination, once there is one
        if facts.verifiable:
            values = _payload(first, facts.integer_count)
            _check_input_range(values)
            self._bound = self._part_bound(values, header.width)
        self._header = header
        self._facts = facts
        self._first: ChunkMessage | None = first
        self._total: np.ndarray | None = None
        self._tag = first.tag
        width = header.width
        self._limit = RANGE_BOUND if width is None else min(RANGE_BOUND, (1 << (8 * width - 1)) - 1)
        # what the running sum is kept in while the bound clears it
        self._sums = np.dtype(np.int64 if width is None else f"<i{width}")

    @property
    def header(self) -> ChunkHeader:
        return self._header

    @property
    def contributors(self) -> int:
        """The ranks in so far, as the integer of their bitmap."""
        return self._bits

    @property
    def held_bytes(self) -> int:
        """Memory held for the chunk: the first part's payload, then the running sums."""
        if self._total is not None:
            return int(self._total.nbytes)
        assert self._first is not None
        return len(self._first.payload)

    def add(self, part: ChunkMessage) -> None:
        """Combine ``part`` in, or refuse it (CcoError) and change nothing."""
        header, facts = self._header, self._facts
        key = chunk_key(part)
        if key[:-1] != facts.key[:-1]:
            differ = [name for name, a, b in zip(_IDENTITY, facts.key, key, strict=False) if a != b]
            raise CcoError(ErrorCode.OPERATION_MISMATCH, f"chunks differ in {', '.join(differ)}")
        if header.width is not None and part.width != header.width:
            raise CcoError(ErrorCode.OPERATION_MISMATCH, "block-scaled chunks differ in width")
        bits = _contributor_bits(part)
        if self._bits & bits:
            twice = sorted(ranks_from_bitmap((self._bits & bits).to_bytes(len(part.contributors), "little")))
            raise CcoError(ErrorCode.DUPLICATE_CONTRIBUTION, f"ranks {twice} are in two chunks")
        _check_tag(part, header)
        total = self._total
        if total is None:
            assert self._first is not None
            total_values = _payload(self._first, facts.integer_count)
        values = _payload(part, facts.integer_count)
        semantics = OPS[header.op]
        if not semantics.verifiable:  # MIN, MAX and the bitwise ops never leave the range of their inputs
            if total is None:
                total = total_values.astype(np.int64)
            semantics.combine(total, values, out=total)
        else:  # SUM and AVG: integers add
            _check_input_range(values)
            bound = self._bound + self._part_bound(values, header.width)
            if bound <= self._limit and total is None:  # the first part, copied once a second comes
                total = np.add(total_values, values, dtype=self._sums)
            elif total is not None and bound <= self._limit:
                np.add(total, values, out=total)  # no sum leaves the bound, so none wraps
            else:  # the bound cannot clear it: the combination itself decides, in int64
                if total is None:
                    total = total_values.astype(np.int64)
                elif total.dtype != np.int64:
                    total = total.astype(np.int64)  # kept only if the part is taken
                lo, hi = kernels.accumulate(total, values)
                if (error := _range_error(lo, hi, header.width, "the combination")) is not None:
                    np.subtract(total, values, out=total)  # exact: both within 2^62
                    raise error
                bound = max(-lo, hi)
            self._bound = bound
        self._total = total
        self._first = None
        self._bits |= bits
        if part.tag is not None and self._tag is not None:
            self._tag = (self._tag + part.tag) % P

    def message(self, cls: type[ChunkMessage]) -> ChunkMessage:
        """The combination as one message of class ``cls``, built once."""
        if self._total is None:
            assert self._first is not None
            return retype(self._first, cls)
        header, total = self._header, self._total
        width = header.width if header.width is not None else minimal_width(*extremes(total))
        ranks = self._bits.to_bytes((self._bits.bit_length() + 7) // 8, "little")
        return _message(cls, self._facts, ranks, width, narrow(total, width).tobytes(), self._tag)

    @staticmethod
    def _part_bound(values: np.ndarray, width: int | None) -> int:
        """A bound on |every integer| of a part: its width's, or measured where the
        chunk's width is fixed (the width alone would not clear a sum of two)."""
        if width is None and values.dtype.itemsize < 8:
            return 1 << (8 * values.dtype.itemsize - 1)
        lo, hi = extremes(values)
        return max(-lo, hi)


def retype(message: ChunkMessage, cls: type[ChunkMessage]) -> ChunkMessage:
    """The same chunk as another message class (a lone part goes on as the aggregate)."""
    if type(message) is cls:
        return message
    return cls(**{f.name: getattr(message, f.name) for f in dataclasses.fields(message)})


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
    header: ChunkHeader | None = None,
) -> np.ndarray:
    """The chunk's element integers once every check passed: a read-only view of the
    payload, signed integers of its width (no widened copy: whoever needs int64
    widens as it reads them, as the decoding and scaling back do).

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
    ``coefficients`` when :func:`seal` kept them there.  ``header`` is the header of
    the chunk the caller expects, if it keeps one (its checks and chunk id are then
    not worked out again); a message of another chunk is ``OPERATION_MISMATCH``.
    """
    if header is None:
        header = ChunkHeader.of(message)
    elif not header.names(message):
        raise CcoError(ErrorCode.OPERATION_MISMATCH, "the chunk is not the one expected")
    checked = header.checked()
    ranks = ranks_from_bitmap(message.contributors)
    extra, missing = sorted(ranks - expected), sorted(expected - ranks)
    if extra or (missing and (at_least is None or len(ranks) < at_least)):
        quorum = "" if at_least is None else f" (a quorum of {at_least} needed)"
        detail = f"bitmap: unexpected ranks {extra}, missing ranks {missing}{quorum}"
        raise CcoError(ErrorCode.VERIFICATION_FAILED, detail)

    verifiable = checked.verifiable
    if header.width is not None and message.width == header.width and header.width < 8:
        # a block-scaled payload at its fixed width, narrower than 8 bytes: its
        # encoding is unique and every integer within [-B, B] by its type alone
        values = _payload(message, checked.integer_count)
    else:
        values, (lo, hi) = _checked_encoding(message, header.width is not None, checked.integer_count)
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
    result = values[:elements]
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
