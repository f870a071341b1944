"""A frozen view of a rendezvous for the CLI, the logs and tests: its groups with
their members and trees, its aggregators, and the grace period after a restart."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cco.nodes.rendezvous_records import GroupRecord, Registration
from cco.nodes.rendezvous_states import GroupState, MemberState
from cco.nodes.tree import TreePlan
from cco.wire.messages import Address, GroupParams


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """``connected`` is False for a member restored from a store that has not joined again."""

    rank: int
    node_id: str
    state: MemberState
    labels: tuple[str, ...]
    connected: bool = True


@dataclass(frozen=True, slots=True)
class GroupStatus:
    group_id: bytes
    state: GroupState
    epoch: int
    world_size: int
    max_fan_in: int
    params: GroupParams
    members: tuple[MemberStatus, ...]
    tree: TreePlan | None
    excluded: tuple[str, ...] = ()
    """Aggregators that members' Reports took out of the group's trees, oldest first."""


@dataclass(frozen=True, slots=True)
class AggregatorStatus:
    node_id: str
    address: Address
    capacity: int
    max_fan_in: int
    labels: tuple[str, ...]
    groups: tuple[bytes, ...]
    connected: bool = True


@dataclass(frozen=True, slots=True)
class RendezvousStatus:
    groups: tuple[GroupStatus, ...]
    aggregators: tuple[AggregatorStatus, ...]
    peers: int
    grace_ends: float | None = None


def snapshot(
    groups: Mapping[bytes, GroupRecord],
    registrations: Mapping[str, Registration],
    peers: int,
    grace_ends: float | None,
) -> RendezvousStatus:
    """The records as they are now, in a canonical order (by group id, rank, node id)."""
    group_status = tuple(
        GroupStatus(
            group_id=g.group_id,
            state=g.state,
            epoch=g.epoch,
            world_size=g.world_size,
            max_fan_in=g.max_fan_in,
            params=g.current_params(),
            members=tuple(
                MemberStatus(
                    rank=m.rank,
                    node_id=m.node_id,
                    state=m.state,
                    labels=m.labels,
                    connected=m.peer is not None,
                )
                for _, m in sorted(g.members.items())
            ),
            tree=g.plan,
            excluded=tuple(g.excluded),
        )
        for _, g in sorted(groups.items())
    )
    aggregators = tuple(
        AggregatorStatus(
            node_id=r.info.node_id,
            address=r.info.address,
            capacity=r.info.capacity,
            max_fan_in=r.info.max_fan_in,
            labels=r.info.labels,
            groups=tuple(
                g.group_id for g in group_status if g.tree and r.info.node_id in g.tree.aggregator_ids
            ),
            connected=not r.away,
        )
        for _, r in sorted(registrations.items())
    )
    return RendezvousStatus(groups=group_status, aggregators=aggregators, peers=peers, grace_ends=grace_ends)


__all__ = ["AggregatorStatus", "GroupStatus", "MemberStatus", "RendezvousStatus", "snapshot"]
