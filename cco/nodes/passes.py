"""The wire operations a collective call runs before its data.

A float SUM or AVG is two operations on the wire (draft section "Block Scales"):
first its :class:`ScalePass`, a MIN all-reduce of this rank's proposed scale per
block and its proposed chunk size, whose result is the agreed scales and chunk size;
then the data, cut and quantized with them.

An ALL_REDUCE under the :class:`~cco.nodes.operation.Quorum` policy starts with a
:class:`PresencePass` (draft section "Stragglers and Quorum"): a one-element SUM that
aggregators complete with the ranks that came within the wait.  Its verified
contributors decide the members the operation (and its scale pass) then runs over,
strictly, so every chunk of the operation has the same contributors and every
block's scale is set by one of them.

A pass lives within its data operation's deadline (one per call, which every verified
chunk of the call moves on), is sized like it and fails with it; the caller sees only
the data operation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from cco.nodes.data_operation import DataOperation
from cco.nodes.operation import Quorum, WireOperation
from cco.wire.fields import ranks_from_bitmap
from cco.wire.messages import ChunkMessage
from cco.wire.payload import ChunkHeader
from cco.wire.registries import Collective, DType, ReduceOp


@dataclass(slots=True, eq=False, kw_only=True)
class ScalePass(WireOperation):
    """The MIN all-reduce of this rank's proposals that agrees ``data``'s scales and,
    in its last element, its chunk size (:mod:`cco.nodes.chunking`)."""

    data: DataOperation

    @classmethod
    def of(cls, op_id: int, data: DataOperation) -> ScalePass:
        scaling = data.scaling
        assert scaling is not None
        source = np.append(scaling.proposals, np.int16(scaling.chunk_proposal))
        return _serving(cls, op_id, data, ReduceOp.MIN, DType.INT16, source)


@dataclass(slots=True, eq=False, kw_only=True)
class PresencePass(WireOperation):
    """The one-element SUM whose verified contributors decide ``data``'s members."""

    data: DataOperation
    quorum: Quorum
    decides: tuple[int, ...] = ()  # the op_ids of the operations its contributors decide
    contributors: frozenset[int] = frozenset()  # of its verified result

    @classmethod
    def of(cls, op_id: int, data: DataOperation, quorum: Quorum, members: frozenset[int]) -> PresencePass:
        """The pass over the accepted ``members``, at least ``quorum.min_ranks`` of them."""
        one = np.ones(1, dtype=np.int8)
        return _serving(cls, op_id, data, ReduceOp.SUM, DType.INT8, one, quorum=quorum, members=members)

    def _header(self, group_id: bytes, index: int, epoch: int) -> ChunkHeader:
        header = super(PresencePass, self)._header(group_id, index, epoch)
        return dataclasses.replace(header, quorum=self.quorum.min_ranks, wait_ms=self.quorum.wait_ms)

    def note_contributors(self, message: ChunkMessage) -> None:
        self.contributors = ranks_from_bitmap(message.contributors)

    def forget_progress(self) -> None:
        super(PresencePass, self).forget_progress()
        self.contributors = frozenset()


Pass = ScalePass | PresencePass


P = TypeVar("P", ScalePass, PresencePass)


def _serving(
    cls: type[P], op_id: int, data: DataOperation, op: ReduceOp, dtype: DType, source: np.ndarray, **more: Any
) -> P:
    """An ALL_REDUCE of ``source`` that serves ``data``: within its deadline, sized
    like it, failing with it (``more``: the kind's own fields)."""
    wire_pass = cls(
        op_id=op_id,
        kind=Collective.ALL_REDUCE,
        op=op,
        dtype=dtype,
        root=None,
        rank=data.rank,
        world_size=data.world_size,
        source=source,
        placed=range(len(source)),
        timeout=data.timeout,
        data=data,
        **more,
    )
    wire_pass.size(len(source), data.pass_chunk_elements, data.members)
    return wire_pass
