"""The data of one collective call at an endpoint: the caller's array in, the result out.

An operation keeps the caller's array, not its encoding: each chunk's wire integers
are encoded when the chunk is sent (again) or compared with the result
(:meth:`DataOperation.chunk_values`: values, bit patterns, ordered keys, or
block-scaled integers followed by this rank's attestations), and each verified chunk
decodes straight into the result (:meth:`DataOperation.decode`), the caller's
``out`` when it can hold it.  Besides its input and its result, an operation holds a
few chunks' worth of memory, whatever the tensor size.

A float SUM or AVG also holds its :class:`Scaling`: this rank's proposed scale per
block and, once its scale pass (:class:`~cco.nodes.passes.ScalePass`) is verified,
the agreed scales.  In the EXACT form (a small float sum) it holds the verified limb
sums until every position is in, then rounds them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from cco.nodes.chunking import agreed_chunk_elements
from cco.nodes.events import ChunkAgreement
from cco.nodes.operation import WireOperation
from cco.wire import blockscale
from cco.wire.codec import decode_values, encode_range, wire_length
from cco.wire.dtypes import ELEMENT_TYPES
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import chunk_length
from cco.wire.payload import ChunkHeader
from cco.wire.registries import Collective, DType, ReduceOp


@dataclass(slots=True)
class Scaling:
    """What a block-scaled operation needs besides its input."""

    width: int  # bytes per integer, fixed for the operation
    block_elements: int
    limit: int  # the sum limit Q
    proposals: np.ndarray  # this rank's proposed scale per block (int16)
    planned_chunk_elements: int  # the group's when the call was planned: its passes keep it
    chunk_proposal: int = 0  # this rank's proposed chunk size in blocks (cco.nodes.chunking)
    agreed: np.ndarray | None = None  # the scale pass's result, once verified

    def blocks(self, chunk_elements: int, index: int, elements: int) -> slice:
        """The blocks of chunk ``index`` (of ``elements`` elements) in the tensor's list."""
        first = index * blockscale.block_count(chunk_elements, self.block_elements)
        return slice(first, first + blockscale.block_count(elements, self.block_elements))


@dataclass(slots=True, eq=False, kw_only=True)
class DataOperation(WireOperation):
    """The caller's collective: its array, its result, and the form it travels in."""

    shape: tuple[int, ...] | None  # the caller's array shape, when known
    deadline: float
    """The call's deadline, which its passes share (draft section "Timeouts and Abort")."""
    watchdog: bool = False  # moved on by every verified chunk of the call (no explicit timeout)
    exact: bool = False  # a float SUM or AVG in the EXACT form: limbs, no scale pass
    scaling: Scaling | None = None  # block-scaled operations only
    out: np.ndarray | None = None  # the caller's array for the result (checked at start)
    sums: np.ndarray | None = None  # an EXACT result's verified limb sums, until all are in
    summed: int = 0  # positions of ``sums`` filled
    checked_first: np.ndarray | None = None  # chunk 0's wire integers from check_encodes, until sealed
    first_sent: float | None = None  # when its first chunk left (its goodput, once complete)

    @property
    def ready(self) -> bool:
        """Not waiting for a tree, its presence pass or its scale pass."""
        return (
            self.interrupted is None
            and not self.gated
            and (self.scaling is None or self.scaling.agreed is not None)
        )

    @property
    def pass_chunk_elements(self) -> int:
        """The chunk_elements of its passes: the one it was planned with, whatever its
        scale pass agrees for the data, so that a pass run again in a new tree is cut
        (and identified) as it was the first time."""
        return self.scaling.planned_chunk_elements if self.scaling is not None else self.chunk_elements

    def agree(self, agreed: np.ndarray | None) -> None:
        """Set the agreed scales and chunk size (its scale pass's result: a scale per
        block, then the smallest chunk proposal); None to agree again."""
        scaling = self.scaling
        assert scaling is not None
        self.headers.clear()
        if agreed is None:
            scaling.agreed = None
            return
        scaling.agreed = agreed[:-1]
        chunk_elements = agreed_chunk_elements(
            scaling.planned_chunk_elements, int(agreed[-1]), scaling.block_elements
        )
        if chunk_elements != self.chunk_elements:
            self.size(self.total, chunk_elements, self.members)

    def chunk_agreement(self) -> ChunkAgreement | None:
        """How its data was cut, once its scale pass agreed (block-scaled only)."""
        scaling = self.scaling
        if scaling is None or scaling.agreed is None:
            return None
        planned = scaling.planned_chunk_elements
        proposed = agreed_chunk_elements(planned, scaling.chunk_proposal, scaling.block_elements)
        return ChunkAgreement(planned=planned, agreed=self.chunk_elements, proposed=proposed)

    def _header(self, group_id: bytes, index: int, epoch: int) -> ChunkHeader:
        header = super(DataOperation, self)._header(group_id, index, epoch)
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

    # --- encoding --------------------------------------------------------------------

    def chunk_values(self, index: int) -> np.ndarray:
        """This rank's wire integers of chunk ``index``; for a block-scaled chunk,
        quantized with the agreed scales and followed by this rank's attestations,
        written at the operation's width (the payload's integers as they are)."""
        if self.scaling is not None:
            scaling = self.scaling
            start = index * self.chunk_elements
            stop = start + chunk_length(self.total, self.chunk_elements, index)
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
                width=scaling.width,
            )
        if index == 0 and self.checked_first is not None:
            values, self.checked_first = self.checked_first, None
            return values
        return super(DataOperation, self).chunk_values(index)

    def _encode(self, start: int, stop: int) -> np.ndarray:
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
        operation, the usual small all-reduce, that is half of its encoding)."""
        if self.source is None:
            return
        whole = self.placed.start == 0 and len(self.placed) == self.total
        for start in range(0, len(self.placed), self.chunk_elements):
            values = self._encode(start, min(start + self.chunk_elements, len(self.placed)))
            if start == 0 and whole:
                self.checked_first = values

    # --- decoding --------------------------------------------------------------------

    def decode(self, index: int, values: np.ndarray) -> None:
        if self.exact and self.receives and self.decode_error is None:
            self._sum_limbs(index, values)
            return
        super(DataOperation, self).decode(index, values)

    def _decode_into(self, index: int, values: np.ndarray, out: np.ndarray) -> None:
        """A block-scaled chunk is scaled back straight into the result: no decoded copy."""
        scaling = self.scaling
        if scaling is None:
            super(DataOperation, self)._decode_into(index, values, out)
            return
        assert scaling.agreed is not None
        scales = scaling.agreed[scaling.blocks(self.chunk_elements, index, values.size)]
        divisor = self.contributors_count if self.op is ReduceOp.AVG else 1
        element = ELEMENT_TYPES[self.dtype]
        blockscale.dequantize(values, scales, scaling.block_elements, divisor, element, out=out)

    def _result_buffer(self, elements: int) -> np.ndarray:
        """Where verified chunks decode: the caller's ``out`` when it holds the flat
        result as it is (a view, so nothing is copied at the end), else a new array."""
        if self.out is not None and self.out.size == elements and self.kind is not Collective.REDUCE_SCATTER:
            return self.out.reshape(-1)
        return super(DataOperation, self)._result_buffer(elements)

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
        try:
            self.result = decode_values(sums, self.dtype, self.kind, self.op, len(self.members), exact=True)
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
        if self.kind is Collective.ALL_GATHER:
            assert self.shape is not None
            return decoded.reshape((self.world_size, *self.shape))
        if self.kind is Collective.REDUCE_SCATTER:
            part = decoded.size // self.world_size
            return decoded[self.rank * part : (self.rank + 1) * part].copy()
        if self.shape is not None and math.prod(self.shape) == decoded.size:
            return decoded.reshape(self.shape)
        return decoded

    def forget_progress(self) -> None:
        super(DataOperation, self).forget_progress()
        self.sums = None
        self.summed = 0


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
    first = rank * length if kind is Collective.ALL_GATHER else 0
    return range(first, first + length)


def propose(op: DataOperation, width: int, limit: int, block_elements: int) -> Scaling:
    """This rank's proposed scale for every block of ``op``, chunk by chunk (OVERFLOW
    for a value that is not finite, before anything is sent)."""
    assert op.source is not None
    element = ELEMENT_TYPES[op.dtype]
    parts = [np.zeros(0, dtype=np.int16)]
    for index in range(op.chunks):
        start = index * op.chunk_elements
        stop = start + chunk_length(op.total, op.chunk_elements, index)
        parts.append(blockscale.propose(op.source[start:stop], element, block_elements, limit, first=start))
    return Scaling(
        width=width,
        block_elements=block_elements,
        limit=limit,
        proposals=np.concatenate(parts),
        planned_chunk_elements=op.chunk_elements,
    )
