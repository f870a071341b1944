"""Tensors of any size as a sequence of chunks, and their reassembly at a receiver.

An operation's wire integers are cut into chunks of ``chunk_elements`` (the last
one shorter; an empty tensor is one empty chunk).  Each chunk has its own id
(the header with its ``chunk_index``) and its own tag, so it is sealed, combined
and verified on its own.  The sender encodes a chunk only when it is asked for
(:func:`wire_chunks`), and the receiver decodes each verified chunk straight into
the output tensor (:class:`Reassembler`): apart from the output itself, memory
depends only on the chunk size, never on the tensor size.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from cco.wire.codec import decode_positions, encode_range, positions, wire_length
from cco.wire.dtypes import element_type, require_storage
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import chunk_count, chunk_length
from cco.wire.registries import Collective, DType, ReduceOp


def wire_chunks(
    array: np.ndarray,
    dtype: DType,
    kind: Collective,
    op: ReduceOp,
    world_size: int,
    chunk_elements: int,
) -> Iterator[np.ndarray]:
    """The int64 wire integers of each chunk of ``array`` in chunk order, encoded
    lazily (every form but block scaling, whose chunks also need agreed scales)."""
    element = element_type(dtype)
    flat = require_storage(array, element)
    total = wire_length(dtype, kind, len(flat))
    for index in range(chunk_count(total, chunk_elements)):
        start = index * chunk_elements
        stop = start + chunk_length(total, chunk_elements, index)
        yield encode_range(flat, element, kind, op, world_size, start, stop)


class Reassembler:
    """Collects an operation's verified chunks, in any order, into the output tensor.

    A chunk delivered twice with the same integers is ignored (a retransmission);
    with different integers it is a ``DUPLICATE_CONTRIBUTION``.
    """

    def __init__(
        self,
        dtype: DType,
        kind: Collective,
        op: ReduceOp,
        shape: tuple[int, ...],
        chunk_elements: int,
    ) -> None:
        self.dtype = dtype
        self.kind = kind
        self.op = op
        self.shape = shape
        self.chunk_elements = chunk_elements
        self._out = np.zeros(int(np.prod(shape, dtype=np.int64)), dtype=element_type(dtype).storage)
        self.total_elements = wire_length(dtype, kind, len(self._out))
        self._received = bytearray(chunk_count(self.total_elements, chunk_elements))

    def add(self, chunk_index: int, values: np.ndarray, contributor_count: int) -> None:
        """Place the verified int64 integers of chunk ``chunk_index``."""
        if not 0 <= chunk_index < len(self._received):
            raise CcoError(ErrorCode.INVALID_FIELD, f"chunk {chunk_index} is not below {len(self._received)}")
        expected = chunk_length(self.total_elements, self.chunk_elements, chunk_index)
        if len(values) != expected:
            raise CcoError(
                ErrorCode.INVALID_FIELD, f"chunk {chunk_index} has {len(values)} integers, not {expected}"
            )
        start = chunk_index * self.chunk_elements
        target = positions(self._out, self.dtype, self.kind)[start : start + expected]
        decoded = decode_positions(values, self.dtype, self.kind, self.op, contributor_count)
        if self._received[chunk_index]:
            if target.tobytes() != decoded.tobytes():
                raise CcoError(
                    ErrorCode.DUPLICATE_CONTRIBUTION, f"chunk {chunk_index} arrived twice, differently"
                )
            return
        target[...] = decoded
        self._received[chunk_index] = 1

    def missing(self) -> list[int]:
        """Indices of the chunks not yet placed."""
        return [i for i, done in enumerate(self._received) if not done]

    @property
    def complete(self) -> bool:
        return all(self._received)

    def result(self) -> np.ndarray:
        """The output tensor; ``PROTOCOL_VIOLATION`` while chunks are missing."""
        if not self.complete:
            missing = self.missing()
            raise CcoError(ErrorCode.PROTOCOL_VIOLATION, f"{len(missing)} chunks missing, first {missing[0]}")
        return self._out.reshape(self.shape)
