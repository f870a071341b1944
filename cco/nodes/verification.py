"""What an endpoint checks in every chunk that comes back from its tree, before a
single value of it is used: that it is one of the operation's chunks (its header),
that a second copy of a verified chunk carries the same integers, and that it
verifies (:func:`cco.wire.payload.open_verified`).  Pure functions of the operation,
the membership and the chunk, so that the engine keeps only the bookkeeping."""

from __future__ import annotations

import numpy as np

from cco.nodes.membership import Membership
from cco.nodes.operation import WireOperation, digest
from cco.nodes.passes import PresencePass
from cco.wire import payload
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import BroadcastData, ChunkMessage, Result
from cco.wire.ops import CONSISTENCY_OPS


def expected_header(op: WireOperation, message: ChunkMessage, membership: Membership) -> payload.ChunkHeader:
    """The operation's header of the chunk; refuses a chunk that is not one of this
    operation's (another op, epoch or shape)."""
    expected_type = BroadcastData if op.broadcast else Result
    wanted = op.header(membership.group_id, message.chunk_index, message.epoch)
    if not isinstance(message, expected_type) or not wanted.names(message):
        header = payload.ChunkHeader.of(message)
        raise CcoError(
            ErrorCode.OPERATION_MISMATCH,
            f"{type(message).__name__} {header} does not match the operation {wanted}",
        )
    return wanted


def check_copy(op: WireOperation, message: ChunkMessage, membership: Membership) -> None:
    """A second copy of a verified chunk must carry the same integers (compared by
    digest: the verified integers themselves are not kept)."""
    payload.check_encoding(message, expected_header(op, message, membership))
    if digest(message) != op.verified[message.chunk_index]:
        raise CcoError(
            ErrorCode.DUPLICATE_CONTRIBUTION, f"a different copy of verified chunk {message.chunk_index}"
        )


def open_chunk(op: WireOperation, message: ChunkMessage, membership: Membership) -> np.ndarray:
    """The chunk's integers if it is the chunk this operation expects and it verifies."""
    header = expected_header(op, message, membership)
    expected = op.members
    if op.broadcast:
        assert op.root is not None
        expected = frozenset({op.root})
    own = None
    if op.op in CONSISTENCY_OPS and op.source is not None:
        own = (membership.rank, op.chunk_values(message.chunk_index))
    at_least = op.quorum.min_ranks if isinstance(op, PresencePass) else None
    values = payload.open_verified(
        membership.keys, message, expected, own, at_least, membership.coefficients, header
    )
    if isinstance(op, PresencePass):
        op.note_contributors(message)
    return values


def tampered(code: ErrorCode, chunk: ChunkMessage) -> bool:
    """Whether a chunk that failed with ``code`` shows that the tree lied: it failed
    verification, or it is a Result (which includes this rank's own chunk) that does
    not match its operation.  BroadcastData of another shape may be the application's
    mistake (a receiver sized differently from the root), not the tree's."""
    return code is ErrorCode.VERIFICATION_FAILED or (
        code is ErrorCode.OPERATION_MISMATCH and isinstance(chunk, Result)
    )
