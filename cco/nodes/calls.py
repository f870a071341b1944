"""What a caller asks of an endpoint session, and how a call that failed says why.

:class:`EndpointConfig` names the membership, :class:`CollectiveRequest` is one
collective call, and :class:`OperationError` is the reason every failed call
carries: the group, the operation, the collective and, when anyone knows them, the
ranks that did not contribute.  The machine that runs them is
:mod:`cco.nodes.endpoint`; ``cco`` itself exports the request and the error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cco.nodes.operation import Quorum
from cco.nodes.replies import ranks_text
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.registries import Collective, DType, ReduceOp


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointConfig:
    """Who this session is in which group.

    ``early_limit`` bounds the chunks kept for operations this rank has not started
    yet (a broadcast root may run ahead of a receiver); ``retry_interval`` is the
    pause before dialling a lost parent again.

    ``elastic`` chooses what happens when members leave or die.  By default
    (strict) the operations in flight fail naming the lost ranks, and so does every
    later operation until the application calls
    :meth:`EndpointMachine.accept_membership`: nothing is ever computed over fewer
    ranks than the caller agreed to.  With ``elastic`` the new membership is
    accepted at the epoch change itself: the operations in flight still fail (that
    failure is how the application learns the new members), later ones run over the
    survivors, and AVG divides by their number.

    ``rendezvous_grace`` is how long a joined session outlives the loss of the
    rendezvous: collectives go on over the current tree meanwhile, and a rendezvous
    back within it that kept the group resumes the membership; after it, or when
    the rendezvous answers the resuming JoinRequest with another membership, the
    session closes and everything in flight fails with PEER_LOST.
    """

    group_id: bytes
    world_size: int
    credential: bytes
    rank: int | None = None
    labels: tuple[str, ...] = ()
    early_limit: int = 1 << 16
    retry_interval: float = 1.0
    elastic: bool = False
    rendezvous_grace: float = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveRequest:
    """One collective call.

    ``array`` is the rank's input (for a broadcast receiver, optional: its shape is
    used for the result).  The operation reads it until it completes, encoding each
    chunk when the chunk is sent (again) or checked against the result, so the caller
    must not modify it before then, as with torch.distributed's asynchronous
    operations (a value changed to one that does not encode fails the operation);
    only an array that is not C-contiguous is copied, once, at start.
    ``root`` names the root of REDUCE and BROADCAST.  ``width`` is the bits per
    element on the wire of a float SUM or AVG (8, 16, 32 or 64; default: the
    group's ``float_width``, else the dtype's own width; every rank must pass the
    same one): narrower is exact, deterministic compression, each element of the
    result within about c x M / Q of the exact sum, M being the largest magnitude in
    its block of ``block_elements`` elements on any rank, c the contributors and
    Q = floor(min(2^(width-1) - 1, B) / world_size) (draft section "Block Scales").

    ``quorum`` chooses the quorum policy for an ALL_REDUCE (default: strict, every
    accepted member contributes): the result is over at least ``quorum.min_ranks``
    members, those that came within ``quorum.wait`` seconds, and
    :class:`~cco.nodes.events.OperationCompleted` names them; AVG divides by their
    number.  Every rank must pass the same policy.

    ``out`` receives the result instead of a new array, as MPI's receive buffer
    does: an array of exactly the result's shape and dtype (ALL_GATHER: world_size x
    the input's shape; REDUCE_SCATTER: this rank's part), C-contiguous, writeable and
    sharing no memory with ``array`` (which the operation reads until it
    completes); the result is then ``out`` itself, its chunks decoded straight into
    it.  A loop that reuses one ``out`` skips a new array per call, whose first
    writes fault in fresh memory, a large part of a large all-reduce's CPU
    (``benchmarks/bench_allreduce.py`` measures it).  A rank that gets no result
    (REDUCE, not the root) leaves it untouched.  If the collective fails, ``out``
    holds no result: its contents are unspecified (chunks verified before the
    failure hold their part of the result, a chunk that failed to decode may hold
    anything, the others what they held before), as with MPI and torch.distributed.
    Keeping it whole would take a second result-sized buffer on every call; ``array``
    is only read, so calling again with the same arrays gets the whole result.

    ``timeout`` in seconds bounds the whole operation.  None (the default) is a
    watchdog instead: the operation fails when none of its chunks completes for the
    group's operation timeout plus one heartbeat interval (so that the tree's Abort,
    which names the missing ranks, normally arrives first), however long a large
    operation on a slow link takes in all.  ``dtype`` is needed only for BFLOAT16
    (carried in float32 arrays); otherwise it follows ``array.dtype``.
    """

    kind: Collective
    op: ReduceOp = ReduceOp.SUM
    array: np.ndarray | None = None
    root: int | None = None
    width: int | None = None
    timeout: float | None = None
    dtype: DType | None = None
    quorum: Quorum | None = None
    out: np.ndarray | None = None


TREE_FAILURES = frozenset({ErrorCode.PEER_LOST, ErrorCode.STALE_EPOCH})
"""Abort codes that say the tree failed, not the data: the operation starts again in
the next tree instead of failing."""


class OperationError(CcoError):
    """Why one collective failed, with who and what was missing."""

    def __init__(
        self,
        code: ErrorCode,
        detail: str,
        *,
        group_id: bytes,
        op_id: int,
        kind: Collective,
        missing_ranks: frozenset[int] | None = None,
        missing_chunks: tuple[int, ...] = (),
    ) -> None:
        ranks = "unknown" if missing_ranks is None else ranks_text(missing_ranks)
        super().__init__(
            code, f"group {group_id.hex()} op {op_id} {kind.name}: {detail}; missing ranks {ranks}"
        )
        self.group_id = group_id
        self.op_id = op_id
        self.kind = kind
        self.missing_ranks = missing_ranks
        self.missing_chunks = missing_chunks


__all__ = ["TREE_FAILURES", "CollectiveRequest", "EndpointConfig", "OperationError"]
