"""What the rendezvous keeps about each connection, group and member, and what a
group's members can take: the chunk size that fits them all, and the dtypes, ops
and collectives every member lists (draft section "Hello Exchange, Versions and
Extensions")."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from cco.nodes.events import PeerId
from cco.nodes.liveness import Liveness
from cco.nodes.rendezvous_states import GroupState, MemberState, PeerState
from cco.nodes.tree import AggregatorInfo, TreePlan
from cco.wire.errors import ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import MAX_CHUNK_ELEMENTS, Capabilities, GroupParams
from cco.wire.registries import Collective, DType, ReduceOp, Role

CHUNK_HEADER_BOUND = 256
"""Bytes of a chunk message beyond its payload, scales and contributors bitmap, at
most (every other field at its largest); a test checks it against the codec."""


def chunk_elements_limit(capabilities: Capabilities | None, world_size: int, block_elements: int) -> int:
    """The largest chunk_elements a node with ``capabilities`` accepts in a group of
    ``world_size``: at most its max_chunk_elements, and small enough that a chunk
    message of 8-byte elements fits its max_message_size, counting for each block of
    ``block_elements`` its attestation (8 bytes) and scale (2 bytes), as a
    block-scaled chunk carries them.  Below 1: no chunk fits."""
    if capabilities is None:
        return MAX_CHUNK_ELEMENTS
    room = capabilities.max_message_size - CHUNK_HEADER_BOUND - (world_size + 7) // 8
    full_blocks, rest = divmod(room, 8 * block_elements + 10)
    partial = max(0, (rest - 10) // 8)  # below block_elements, as rest < 8 * block_elements + 10
    return min(capabilities.max_chunk_elements, full_blocks * block_elements + partial)


@dataclass(frozen=True, slots=True)
class Needs:
    """What a group's tree must handle: the dtypes, ops and collectives every member lists."""

    dtypes: frozenset[DType]
    ops: frozenset[ReduceOp]
    collectives: frozenset[Collective]

    def met_by(self, capabilities: Capabilities | None) -> bool:
        return capabilities is None or (
            self.dtypes <= set(capabilities.dtypes)
            and self.ops <= set(capabilities.ops)
            and self.collectives <= set(capabilities.collectives)
        )


@dataclass(slots=True)
class PeerRecord:
    """One connection: who is behind it, its heartbeats, and the groups it is a member of."""

    peer: PeerId
    node_id: str
    role: Role
    state: PeerState
    liveness: Liveness
    capabilities: Capabilities | None = None
    echo_seq: int = 0
    groups: set[bytes] = field(default_factory=set)


@dataclass(slots=True)
class MemberRecord:
    """``peer`` is None while the member is away (restored, not joined again)."""

    rank: int
    node_id: str
    peer: PeerId | None
    labels: tuple[str, ...]
    capabilities: Capabilities | None = None
    state: MemberState = MemberState.JOINED
    epoch: int = 0


@dataclass(slots=True)
class GroupRecord:
    group_id: bytes
    world_size: int
    credential: bytes
    params: GroupParams
    max_fan_in: int
    secret: bytes
    epoch: int
    state: GroupState = GroupState.FORMING
    members: dict[int, MemberRecord] = field(default_factory=dict)
    plan: TreePlan | None = None
    change_code: ErrorCode = ErrorCode.NO_ERROR  # of the EpochChange that opened the current epoch
    excluded: list[str] = field(default_factory=list)
    """Aggregators that members' Reports took out of this group's trees, oldest first
    (:mod:`cco.nodes.rendezvous_reports`)."""

    def members_bitmap(self) -> bytes:
        return bitmap_from_ranks(set(self.members))

    def current_params(self) -> GroupParams:
        """The configured parameters, chunk_elements and scaled_chunk_elements lowered
        to what every member accepts (the latter to a whole number of blocks, or absent)."""
        params = self.params
        limit = min(
            (
                chunk_elements_limit(m.capabilities, self.world_size, params.block_elements)
                for m in self.members.values()
            ),
            default=MAX_CHUNK_ELEMENTS,
        )
        if params.chunk_elements > limit:
            params = replace(params, chunk_elements=limit)
        scaled = params.scaled_chunk_elements
        if scaled is not None and scaled > limit:
            whole = limit - limit % params.block_elements
            params = replace(params, scaled_chunk_elements=whole or None)
        return params

    def needs(self) -> Needs:
        dtypes, ops, collectives = set(DType), set(ReduceOp), set(Collective)
        for member in self.members.values():
            if member.capabilities is not None:
                dtypes &= set(member.capabilities.dtypes)
                ops &= set(member.capabilities.ops)
                collectives &= set(member.capabilities.collectives)
        return Needs(frozenset(dtypes), frozenset(ops), frozenset(collectives))

    def away(self) -> list[int]:
        """The ranks of members that have not come back since a restart."""
        return [rank for rank, m in sorted(self.members.items()) if m.peer is None]


@dataclass(slots=True)
class Registration:
    """An aggregator's registration; ``away`` while a restored one has not registered again."""

    info: AggregatorInfo
    capabilities: Capabilities | None
    away: bool = False
