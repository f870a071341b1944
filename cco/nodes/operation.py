"""One collective call at an endpoint: its record, and its data chunk by chunk.

The endpoint machine (:mod:`cco.nodes.endpoint`) decides when chunks leave and what
to do with what comes back; this module knows what an operation's chunks hold.  An
operation keeps the caller's array, not its encoding: each chunk's wire integers are
encoded when the chunk is sent (again) or compared with the result
(:meth:`Operation.chunk_values`: values, bit patterns, ordered keys, or block-scaled
integers followed by this rank's attestations), and each verified chunk decodes
straight into the result (:meth:`Operation.decode`).  Besides its input and its
result, an operation holds a few chunks' worth of memory, whatever the tensor size.

A float SUM or AVG also holds its :class:`Scaling`: this rank's proposed scale per
block and, once its scale pass (:func:`scale_pass`, a separate wire operation) is
verified, the agreed scales.

An ALL_REDUCE under the :class:`Quorum` policy starts with a presence pass
(:func:`presence_pass`): a one-element SUM that aggregators complete with the ranks
that came within the wait.  Its verified contributors decide the members the
operation (and its scale pass) then runs over, strictly, so every chunk of the
operation has the same contributors and every block's scale is set by one of them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from cco.wire import blockscale, payload
from cco.wire.codec import decode_positions, decode_values, encode_range, positions, wire_length
from cco.wire.dtypes import ELEMENT_TYPES
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import ChunkMessage, chunk_count, chunk_length
from cco.wire.registries import Collective, DType, ReduceOp

# The kinds the per-round paths test: on Python 3.11 ``Collective.MEMBER`` is looked up
# through EnumType.__getattr__ (some 900 instructions); a module constant is a dict lookup.
_BARRIER, _REDUCE = Collective.BARRIER, Collective.REDUCE
_ALL_GATHER, _REDUCE_SCATTER = Collective.ALL_GATHER, Collective.REDUCE_SCATTER


class OperationState(Enum):
    """One collective call."""

    QUEUED = "queued"  # started, or started again in a new tree; no chunk has left yet
    SENDING = "sending"  # some chunks sent, some still held back by the window
    AWAITING = "awaiting"  # everything sent; waiting for verified results
    COMPLETED = "completed"  # every chunk verified and decoded (terminal)
    FAILED = "failed"  # aborted, timed out, failed verification or lost (terminal)


@dataclass(frozen=True, slots=True)
class Quorum:
    """The quorum policy of one ALL_REDUCE (draft section "Stragglers and Quorum").

    The operation completes over at least ``min_ranks`` of the accepted members:
    each aggregator waits ``wait`` seconds from the first presence it sees for the
    rest, then goes on with the ranks it has; later ranks get the result without
    having contributed.  Fewer than ``min_ranks`` in time is the strict case: the
    operation waits for the rest until its timeout, then fails naming them.
    """

    min_ranks: int
    wait: float

    @property
    def wait_ms(self) -> int:
        return max(1, round(self.wait * 1000))


@dataclass(slots=True)
class Scaling:
    """What a block-scaled operation needs besides its input."""

    width: int  # bytes per integer, fixed for the operation
    block_elements: int
    limit: int  # the sum limit Q
    proposals: np.ndarray  # this rank's proposed scale per block (int16)
    agreed: np.ndarray | None = None  # the scale pass's result, once verified

    def blocks(self, chunk_elements: int, index: int, elements: int) -> slice:
        """The blocks of chunk ``index`` (of ``elements`` elements) in the tensor's list."""
        first = index * blockscale.block_count(chunk_elements, self.block_elements)
        return slice(first, first + blockscale.block_count(elements, self.block_elements))


@dataclass(slots=True)
class Operation:
    op_id: int
    kind: Collective
    op: ReduceOp
    dtype: DType
    root: int | None
    rank: int  # this endpoint's
    world_size: int  # the group's, as at join (ranks keep their numbers)
    total: int  # element positions
    shape: tuple[int, ...] | None  # the caller's array shape, when known
    source: np.ndarray | None  # this rank's input, flat and not encoded; None when it sends nothing
    placed: range  # the positions that carry source (ALL_GATHER: rank r's slice; else all)
    deadline: float
    timeout: float
    watchdog: bool = False  # the deadline moves on with every completed chunk (no explicit timeout)
    epoch: int | None = None  # fixed by the first chunk sent (or the first received)
    chunk_elements: int = 0
    chunks: int = 0
    state: OperationState = OperationState.QUEUED
    next_chunk: int = 0
    outstanding: dict[int, float] = field(default_factory=dict)  # chunk index -> when last sent
    verified: dict[int, bytes] = field(default_factory=dict)  # chunk index -> digest() of the chunk
    result: np.ndarray | None = None  # flat, in the caller's dtype; verified chunks decode into it
    decode_error: CcoError | None = None  # the first chunk that did not decode (see decode)
    members: frozenset[int] = frozenset()
    scaling: Scaling | None = None  # block-scaled data operations only
    exact: bool = False  # a float SUM or AVG in the EXACT form: limbs, no scale pass
    sums: np.ndarray | None = None  # an EXACT result's verified limb sums, until all are in
    summed: int = 0  # positions of ``sums`` filled
    feeds: int | None = None  # a scale or presence pass: the op_id of the data operation it serves
    interrupted: str | None = None  # why it waits for the next tree before starting again
    quorum: Quorum | None = None  # a presence pass
    decides: tuple[int, ...] = ()  # a presence pass: the operations its contributors decide
    contributors: frozenset[int] = frozenset()  # a presence pass: of its verified result
    gated: bool = False  # waits for its presence pass
    listed: frozenset[int] | None = None  # the members its presence pass decided (quorum only)
    presence: Operation | None = None  # the completed presence pass that decided them
    out: np.ndarray | None = None  # the caller's array for the result (checked at start)
    checked_first: np.ndarray | None = None  # chunk 0's wire integers from check_encodes, until sealed
    headers: dict[int, payload.ChunkHeader] = field(default_factory=dict)
    """Chunk index -> its header as header() built it, so that sealing a chunk and
    checking its result build it once; forgotten when what it depends on changes (the
    size, the decided members, the agreed scales, the tree) and once it is verified."""

    def size(self, total: int, chunk_elements: int, members: frozenset[int]) -> None:
        self.total = total
        self.chunk_elements = chunk_elements
        self.chunks = chunk_count(total, chunk_elements)
        self.headers.clear()
        if not self.members:
            self.members = members

    def decide(self, members: frozenset[int], presence: Operation | None = None) -> None:
        """Its presence pass decided the members: run over exactly those; a rank that
        is not one of them only receives the result."""
        self.members = self.listed = members
        self.headers.clear()
        self.presence = presence
        self.gated = False
        if self.rank not in members:
            self.source = None
            self.placed = range(0)

    def agree(self, scales: np.ndarray | None) -> None:
        """Set the agreed scales (its scale pass's result; None to agree again)."""
        assert self.scaling is not None
        self.scaling.agreed = scales
        self.headers.clear()

    @property
    def receives(self) -> bool:
        """Whether this rank gets a result (REDUCE: only the root; BARRIER: nobody)."""
        return self.kind is not _BARRIER and (self.kind is not _REDUCE or self.root == self.rank)

    def header(self, group_id: bytes, index: int, epoch: int) -> payload.ChunkHeader:
        """The identifying fields of chunk ``index`` in ``epoch`` (built once per epoch)."""
        kept = self.headers.get(index)
        if kept is not None and kept.epoch == epoch and kept.group_id == group_id:
            return kept
        header = self._header(group_id, index, epoch)
        self.headers[index] = header
        return header

    def _header(self, group_id: bytes, index: int, epoch: int) -> payload.ChunkHeader:
        header = payload.ChunkHeader(
            group_id=group_id,
            epoch=epoch,
            op_id=self.op_id,
            kind=self.kind,
            op=self.op,
            dtype=self.dtype,
            total_elements=self.total,
            chunk_elements=self.chunk_elements,
            chunk_index=index,
            root=self.root,
        )
        if self.quorum is not None:
            header = dataclasses.replace(header, quorum=self.quorum.min_ranks, wait_ms=self.quorum.wait_ms)
        if self.listed is not None:
            header = dataclasses.replace(header, members=bitmap_from_ranks(self.listed))
        scaling = self.scaling
        if scaling is None:
            return header
        if scaling.agreed is None:
            raise CcoError(
                ErrorCode.OPERATION_MISMATCH, f"chunk {index} before the operation's scales are agreed"
            )
        blocks = scaling.blocks(self.chunk_elements, index, header.element_count)
        return dataclasses.replace(
            header,
            width=scaling.width,
            block_elements=scaling.block_elements,
            scales=scaling.agreed[blocks].astype("<i2").tobytes(),
        )

    def chunk_values(self, index: int) -> np.ndarray:
        """This rank's wire integers of chunk ``index``, encoded from its input now;
        zeros at the positions its input does not cover (ALL_GATHER); for a
        block-scaled chunk, quantized with the agreed scales and followed by this
        rank's attestations."""
        start = index * self.chunk_elements
        stop = start + chunk_length(self.total, self.chunk_elements, index)
        if self.scaling is not None:
            scaling = self.scaling
            assert self.source is not None and scaling.agreed is not None
            blocks = scaling.blocks(self.chunk_elements, index, stop - start)
            return blockscale.chunk_integers(
                self.source[start:stop],
                ELEMENT_TYPES[self.dtype],
                scaling.agreed[blocks],
                scaling.proposals[blocks],
                scaling.block_elements,
                scaling.limit,
                first=start,
            )
        first, last = max(start, self.placed.start), min(stop, self.placed.stop)
        if (first, last) == (start, stop):
            if index == 0 and self.checked_first is not None:
                values, self.checked_first = self.checked_first, None
                return values
            return self._encode(start - self.placed.start, stop - self.placed.start)
        values = np.zeros(stop - start, dtype=np.int64)
        if first < last:
            values[first - start : last - start] = self._encode(
                first - self.placed.start, last - self.placed.start
            )
        return values

    def _encode(self, start: int, stop: int) -> np.ndarray:
        """Wire integers [start, stop) of this rank's input, counted from its first."""
        assert self.source is not None
        element = ELEMENT_TYPES[self.dtype]
        return encode_range(
            self.source, element, self.kind, self.op, self.world_size, start, stop, self.exact
        )

    def check_encodes(self) -> None:
        """Encode this rank's whole input a chunk at a time, so that an unencodable
        value (NaN, out of range) fails start() before anything is sent, with the
        memory of one chunk.  Chunk 0's integers are kept when this rank's input is
        the whole operation's: its first chunk_values(0), sealing chunk 0 as start()
        does next, takes them instead of encoding them again (for a one-chunk
        operation, an 8-byte all-reduce, that is half of its encoding)."""
        if self.source is None:
            return
        whole = self.placed.start == 0 and len(self.placed) == self.total
        for start in range(0, len(self.placed), self.chunk_elements):
            values = self._encode(start, min(start + self.chunk_elements, len(self.placed)))
            if start == 0 and whole:
                self.checked_first = values

    def decode(self, index: int, values: np.ndarray) -> None:
        """Decode verified chunk ``index`` into the result, allocated when the first chunk
        proved the size genuine.  Decoding is elementwise, so the result is bit for bit
        what decoding the whole array at once gives.  A chunk that does not decode is
        kept in ``decode_error`` for the end of the operation, as whole-array decoding
        would: meanwhile this rank still sends its chunks, so the other ranks finish."""
        if not self.receives or self.decode_error is not None:
            return
        if self.exact:
            self._sum_limbs(index, values)
            return
        if self.result is None:
            elements, split = divmod(self.total, wire_length(self.dtype, self.kind, 1))
            if split:
                detail = f"{self.dtype.name} takes two wire integers per element; {self.total} is odd"
                self.decode_error = CcoError(ErrorCode.INVALID_FIELD, detail)
                return
            self.result = self._result_buffer(elements)
        contributors = 1 if self.kind is Collective.BROADCAST else len(self.members)
        start = index * self.chunk_elements
        try:
            if self.scaling is not None:
                assert self.scaling.agreed is not None
                scales = self.scaling.agreed[self.scaling.blocks(self.chunk_elements, index, values.size)]
                divisor = contributors if self.op is ReduceOp.AVG else 1
                element = ELEMENT_TYPES[self.dtype]
                decoded = blockscale.dequantize(values, scales, self.scaling.block_elements, divisor, element)
            else:
                decoded = decode_positions(values, self.dtype, self.kind, self.op, contributors)
        except CcoError as error:
            self.decode_error = CcoError(error.code, f"chunk {index}: {error.detail}")
            return
        positions(self.result, self.dtype, self.kind)[start : start + values.size] = decoded

    def _result_buffer(self, elements: int) -> np.ndarray:
        """Where verified chunks decode: the caller's ``out`` when it holds the flat
        result as it is (a view, so nothing is copied at the end), else a new array."""
        if self.out is not None and self.out.size == elements and self.kind is not Collective.REDUCE_SCATTER:
            return self.out.reshape(-1)
        return np.empty(elements, dtype=ELEMENT_TYPES[self.dtype].storage)

    def _sum_limbs(self, index: int, values: np.ndarray) -> None:
        """Keep chunk ``index``'s limb sums; once every position is in, round them
        (a chunk may end inside an element's limbs, so no chunk decodes alone).  A
        one-chunk operation (the usual small all-reduce) rounds its chunk as it is."""
        if values.size == self.total:
            sums = values
        else:
            if self.sums is None:
                self.sums = np.zeros(self.total, dtype=np.int64)
            start = index * self.chunk_elements
            self.sums[start : start + values.size] = values
            self.summed += values.size
            if self.summed < self.total:
                return
            sums, self.sums = self.sums, None
        contributors = len(self.members)
        try:
            self.result = decode_values(sums, self.dtype, self.kind, self.op, contributors, exact=True)
        except CcoError as error:
            self.decode_error = error

    def shaped_result(self) -> np.ndarray:
        """The decoded result in the shape the caller expects: ``out`` when the caller
        gave one (copied there unless it was decoded in place)."""
        assert self.result is not None
        shaped = self._shaped(self.result)
        if self.out is None:
            return shaped
        if not np.may_share_memory(shaped, self.out):  # EXACT limbs, or a REDUCE_SCATTER part
            np.copyto(self.out, shaped)
        return self.out

    def _shaped(self, decoded: np.ndarray) -> np.ndarray:
        if self.kind is _ALL_GATHER:
            assert self.shape is not None
            return decoded.reshape((self.world_size, *self.shape))
        if self.kind is _REDUCE_SCATTER:
            part = decoded.size // self.world_size
            return decoded[self.rank * part : (self.rank + 1) * part].copy()
        if self.shape is not None and math.prod(self.shape) == decoded.size:
            return decoded.reshape(self.shape)
        return decoded

    def forget_progress(self) -> None:
        """Back to nothing sent and nothing verified (the tree it ran in failed)."""
        self.outstanding.clear()
        self.next_chunk = 0
        self.verified.clear()
        self.headers.clear()
        self.result = self.decode_error = self.epoch = self.sums = None
        self.summed = 0
        self.members = self.listed if self.listed is not None else frozenset()
        self.contributors = frozenset()


def source_of(array: np.ndarray | None) -> np.ndarray:
    """What an operation keeps of this rank's input: the array itself, flattened (a
    copy only if it is not C-contiguous); a BARRIER sends no elements."""
    if array is None:
        return np.zeros(0, dtype=ELEMENT_TYPES[DType.INT8].storage)
    return array.ravel()  # a view when C-contiguous, else a C-order copy


def placement(kind: Collective, dtype: DType, source: np.ndarray | None, rank: int, exact: bool) -> range:
    """The positions that carry this rank's input: for ALL_GATHER, rank r's n integers
    go at r x n (the other ranks fill the rest); otherwise all of them."""
    if source is None:
        return range(0)
    length = wire_length(dtype, kind, source.size, exact)
    first = rank * length if kind is _ALL_GATHER else 0
    return range(first, first + length)


def propose(op: Operation, width: int, limit: int, block_elements: int) -> Scaling:
    """This rank's proposed scale for every block of ``op``, chunk by chunk (OVERFLOW
    for a value that is not finite, before anything is sent)."""
    assert op.source is not None
    element = ELEMENT_TYPES[op.dtype]
    parts = [np.zeros(0, dtype=np.int16)]
    for index in range(op.chunks):
        start = index * op.chunk_elements
        stop = start + chunk_length(op.total, op.chunk_elements, index)
        parts.append(blockscale.propose(op.source[start:stop], element, block_elements, limit, first=start))
    return Scaling(width=width, block_elements=block_elements, limit=limit, proposals=np.concatenate(parts))


def _wire_pass(op_id: int, data: Operation, op: ReduceOp, dtype: DType, source: np.ndarray) -> Operation:
    """An ALL_REDUCE of ``source`` that serves ``data`` (a scale or presence pass):
    within its deadline, sized like it, failing with it."""
    wire_pass = Operation(
        op_id=op_id,
        kind=Collective.ALL_REDUCE,
        op=op,
        dtype=dtype,
        root=None,
        rank=data.rank,
        world_size=data.world_size,
        total=len(source),
        shape=source.shape,
        source=source,
        placed=range(len(source)),
        deadline=data.deadline,
        timeout=data.timeout,
        watchdog=data.watchdog,
        feeds=data.op_id,
    )
    wire_pass.size(len(source), data.chunk_elements, data.members)
    return wire_pass


def scale_pass(op_id: int, data: Operation) -> Operation:
    """The MIN all-reduce of this rank's proposals that agrees ``data``'s scales."""
    assert data.scaling is not None
    return _wire_pass(op_id, data, ReduceOp.MIN, DType.INT16, data.scaling.proposals)


def presence_pass(op_id: int, data: Operation, quorum: Quorum, members: frozenset[int]) -> Operation:
    """The one-element SUM whose verified contributors decide ``data``'s members (the
    accepted ``members``, at least ``quorum.min_ranks`` of them)."""
    presence = _wire_pass(op_id, data, ReduceOp.SUM, DType.INT8, np.ones(1, dtype=np.int8))
    presence.members = members
    presence.quorum = quorum
    return presence


def digest(message: ChunkMessage) -> bytes:
    """A verified chunk in 16 bytes: enough to tell a different copy apart.

    A tagged chunk is its tag with its contributors and width: another payload under
    the same chunk identifier, contributors and tag would be a forgery of the MAC, so
    the payload itself need not be hashed (that was about 7% of an endpoint's CPU in
    a 64 MiB all-reduce).  An untagged chunk is a hash of its payload, whose bytes are
    a unique encoding of its integers (smallest or fixed width)."""
    h = hashlib.blake2b(digest_size=16)
    if message.tag is not None:
        h.update(message.tag.to_bytes(8, "big") + bytes([message.width]) + message.contributors)
    else:
        h.update(message.payload)
    return h.digest()
