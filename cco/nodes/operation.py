"""One operation on the wire at an endpoint: its chunks, and what each has done.

Every collective call runs as one or more wire operations, each its own op_id: the
call's data (:class:`~cco.nodes.data_operation.DataOperation`), and before it, where
the call needs them, its scale pass and its presence pass
(:mod:`cco.nodes.passes`).  What they share lives here: the operation's header per
chunk, which chunks were sent and are outstanding, which were verified (by a digest),
the members it runs over, and its state
(:class:`~cco.nodes.endpoint_states.OperationState`).  The plain encoding of a chunk
from this rank's input, and the plain decoding of a verified chunk into the result,
are here too; a data operation adds its block-scaled and exact forms.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

import numpy as np

from cco.nodes.endpoint_states import OperationState
from cco.wire.codec import decode_positions, encode_range, positions, wire_length
from cco.wire.dtypes import ELEMENT_TYPES
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import ChunkMessage, chunk_count, chunk_length
from cco.wire.payload import ChunkHeader
from cco.wire.registries import Collective, DType, ReduceOp


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


@dataclass(slots=True, eq=False, kw_only=True)
class WireOperation:
    """One op_id's chunks at this rank."""

    op_id: int
    kind: Collective
    op: ReduceOp
    dtype: DType
    root: int | None
    rank: int  # this endpoint's
    world_size: int  # the group's, as at join (ranks keep their numbers)
    source: np.ndarray | None  # this rank's input, flat and not encoded; None when it sends nothing
    placed: range  # the positions that carry source (ALL_GATHER: rank r's slice; else all)
    timeout: float  # the call's (its resend interval is half of it)
    total: int = -1  # element positions; -1 until known (a broadcast receiver learns it)
    chunk_elements: int = 0
    chunks: int = 0
    epoch: int | None = None  # fixed by the first chunk sent (or the first received)
    state: OperationState = OperationState.QUEUED
    next_chunk: int = 0
    outstanding: dict[int, float] = field(default_factory=dict)  # chunk index -> when last sent
    verified: dict[int, bytes] = field(default_factory=dict)  # chunk index -> digest() of the chunk
    result: np.ndarray | None = None  # flat, in the dtype's storage; verified chunks decode into it
    decode_error: CcoError | None = None  # the first chunk that did not decode (see decode)
    members: frozenset[int] = frozenset()
    listed: frozenset[int] | None = None  # the members its presence pass decided (quorum only)
    presence: WireOperation | None = None  # the completed presence pass that decided them
    gated: bool = False  # waits for its presence pass
    interrupted: str | None = None  # why it waits for the next tree before starting again
    aborted_in: int | None = None  # the epoch of the Abort that interrupted it (restart only after it)
    headers: dict[int, ChunkHeader] = field(default_factory=dict)
    """Chunk index -> its header as :meth:`header` built it, so that sealing a chunk and
    checking its result build and check it once; forgotten when what it depends on
    changes (the size, the decided members, the agreed scales, the tree) and once it
    is verified."""
    receives: bool = field(init=False)
    """Whether this rank gets a result (REDUCE: only the root; BARRIER: nobody)."""
    broadcast: bool = field(init=False)
    """The data travels from the root unchanged (BROADCAST): as BroadcastData, from one rank."""

    def __post_init__(self) -> None:
        kind = self.kind
        self.receives = kind is not Collective.BARRIER and (
            kind is not Collective.REDUCE or self.root == self.rank
        )
        self.broadcast = kind is Collective.BROADCAST

    @property
    def ready(self) -> bool:
        """Whether its chunks may leave: not waiting for a tree or for another pass."""
        return self.interrupted is None and not self.gated

    def size(self, total: int, chunk_elements: int, members: frozenset[int]) -> None:
        self.total = total
        self.chunk_elements = chunk_elements
        self.chunks = chunk_count(total, chunk_elements)
        self.headers.clear()
        if not self.members:
            self.members = members

    def decide(self, members: frozenset[int], presence: WireOperation | None = None) -> None:
        """Its presence pass decided the members: run over exactly those; a rank that
        is not one of them only receives the result."""
        self.members = self.listed = members
        self.headers.clear()
        self.presence = presence
        self.gated = False
        if self.rank not in members:
            self.source = None
            self.placed = range(0)

    # --- chunk headers -------------------------------------------------------------

    def header(self, group_id: bytes, index: int, epoch: int) -> ChunkHeader:
        """The identifying fields of chunk ``index`` in ``epoch`` (built once per epoch)."""
        kept = self.headers.get(index)
        if kept is not None and kept.epoch == epoch and kept.group_id == group_id:
            return kept
        header = self._header(group_id, index, epoch)
        self.headers[index] = header
        return header

    def _header(self, group_id: bytes, index: int, epoch: int) -> ChunkHeader:
        header = ChunkHeader(
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
        if self.listed is not None:
            header = dataclasses.replace(header, members=bitmap_from_ranks(self.listed))
        return header

    # --- encoding and decoding -----------------------------------------------------

    def chunk_values(self, index: int) -> np.ndarray:
        """This rank's wire integers of chunk ``index``, encoded from its input now;
        zeros at the positions its input does not cover (ALL_GATHER)."""
        start = index * self.chunk_elements
        stop = start + chunk_length(self.total, self.chunk_elements, index)
        first, last = max(start, self.placed.start), min(stop, self.placed.stop)
        if (first, last) == (start, stop):
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
        return encode_range(self.source, element, self.kind, self.op, self.world_size, start, stop, False)

    def decode(self, index: int, values: np.ndarray) -> None:
        """Decode verified chunk ``index`` into the result, allocated when the first chunk
        proved the size genuine.  Decoding is elementwise, so the result is bit for bit
        what decoding the whole array at once gives.  A chunk that does not decode is
        kept in ``decode_error`` for the end of the operation, as whole-array decoding
        would: meanwhile this rank still sends its chunks, so the other ranks finish."""
        if not self.receives or self.decode_error is not None:
            return
        if self.result is None:
            elements, split = divmod(self.total, wire_length(self.dtype, self.kind, 1))
            if split:
                detail = f"{self.dtype.name} takes two wire integers per element; {self.total} is odd"
                self.decode_error = CcoError(ErrorCode.INVALID_FIELD, detail)
                return
            self.result = self._result_buffer(elements)
        start = index * self.chunk_elements
        out = positions(self.result, self.dtype, self.kind)[start : start + values.size]
        try:
            self._decode_into(index, values, out)
        except CcoError as error:
            self.decode_error = CcoError(error.code, f"chunk {index}: {error.detail}")

    def _decode_into(self, index: int, values: np.ndarray, out: np.ndarray) -> None:
        """Write chunk ``index``'s decoded ``values`` to ``out``, its positions in the
        result (which a chunk that fails to decode may leave half written: the
        operation then fails)."""
        out[...] = decode_positions(values, self.dtype, self.kind, self.op, self.contributors_count)

    @property
    def contributors_count(self) -> int:
        """How many ranks each result integer sums (what AVG divides by)."""
        return 1 if self.broadcast else len(self.members)

    def _result_buffer(self, elements: int) -> np.ndarray:
        return np.empty(elements, dtype=ELEMENT_TYPES[self.dtype].storage)

    def forget_progress(self) -> None:
        """Back to nothing sent and nothing verified (the tree it ran in failed)."""
        self.outstanding.clear()
        self.next_chunk = 0
        self.verified.clear()
        self.headers.clear()
        self.result = self.decode_error = self.epoch = None
        self.members = self.listed if self.listed is not None else frozenset()

    def missing_chunks(self) -> list[int]:
        return [i for i in range(self.chunks) if i not in self.verified]


def digest(message: ChunkMessage) -> bytes:
    """A verified chunk in 16 bytes: enough to tell a different copy apart.

    A tagged chunk is its tag with its contributors and width: another payload under
    the same chunk identifier, contributors and tag would be a forgery of the MAC, so
    the payload itself need not be hashed, which keeps hashing off the endpoint's data
    path.  An untagged chunk is a hash of its payload, whose bytes are a unique
    encoding of its integers (smallest or fixed width)."""
    h = hashlib.blake2b(digest_size=16)
    if message.tag is not None:
        h.update(message.tag.to_bytes(8, "big") + bytes([message.width]) + message.contributors)
    else:
        h.update(message.payload)
    return h.digest()
