"""What a rendezvous must keep across a restart, and the way back from it (draft section
"Rendezvous Persistence and Restart").

:func:`export` turns the machine's records into a :class:`DurableState`: groups with
members, epochs, secrets, parameters and trees, and aggregator registrations;
connections, heartbeats and timers are not in it.  :func:`load` turns one back into
records in which every member and every aggregator is *away* until it joins or
registers again; it refuses a state no machine could have exported.  Saving and
reading it is the service's business (:mod:`cco.services.store`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cco.nodes.rendezvous_records import GroupRecord, MemberRecord, Registration
from cco.nodes.rendezvous_states import GroupState, MemberState
from cco.nodes.tree import AggregatorInfo, TreePlan
from cco.wire.errors import ErrorCode
from cco.wire.messages import Capabilities, GroupParams
from cco.wire.registries import GROUP_ID_SIZE, GROUP_SECRET_SIZE


@dataclass(frozen=True, slots=True)
class DurableMember:
    """A member as a restart must find it.  ``epoch`` is the last epoch this member
    was told of (in JoinAccept or EpochChange): a member that was away while the
    group moved on is told the rest when it comes back."""

    rank: int
    node_id: str
    labels: tuple[str, ...]
    capabilities: Capabilities | None
    state: MemberState
    epoch: int


@dataclass(frozen=True, slots=True)
class DurableGroup:
    """A group as a restart must find it; ``change_code`` is the code of the
    EpochChange that opened the current epoch (NO_ERROR for the first), ``excluded``
    the aggregators members' Reports took out of its trees, oldest first."""

    group_id: bytes
    world_size: int
    credential: bytes
    secret: bytes
    epoch: int
    params: GroupParams
    max_fan_in: int
    state: GroupState
    change_code: ErrorCode
    members: tuple[DurableMember, ...]
    plan: TreePlan | None
    excluded: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DurableAggregator:
    """An aggregator registration with the capabilities its connection declared."""

    info: AggregatorInfo
    capabilities: Capabilities | None


@dataclass(frozen=True, slots=True)
class DurableState:
    """Everything a rendezvous must keep across a restart: groups with members, epochs,
    secrets and trees, and aggregator registrations.  Connections, heartbeats and
    timers are not in it."""

    groups: tuple[DurableGroup, ...] = ()
    aggregators: tuple[DurableAggregator, ...] = ()


def export(groups: Mapping[bytes, GroupRecord], registrations: Mapping[str, Registration]) -> DurableState:
    """The durable part of the records, in a canonical order (by group id, rank, node id)."""
    return DurableState(
        groups=tuple(
            DurableGroup(
                group_id=g.group_id,
                world_size=g.world_size,
                credential=g.credential,
                secret=g.secret,
                epoch=g.epoch,
                params=g.params,
                max_fan_in=g.max_fan_in,
                state=g.state,
                change_code=g.change_code,
                members=tuple(
                    DurableMember(m.rank, m.node_id, m.labels, m.capabilities, m.state, m.epoch)
                    for _, m in sorted(g.members.items())
                ),
                plan=g.plan,
                excluded=tuple(g.excluded),
            )
            for _, g in sorted(groups.items())
        ),
        aggregators=tuple(
            DurableAggregator(r.info, r.capabilities) for _, r in sorted(registrations.items())
        ),
    )


def load(state: DurableState) -> tuple[dict[bytes, GroupRecord], dict[str, Registration]]:
    """Records from ``state``, every member and aggregator away.  ValueError for a state
    no machine could have exported."""
    registrations: dict[str, Registration] = {}
    for stored in state.aggregators:
        node_id = stored.info.node_id
        if node_id in registrations:
            raise ValueError(f"aggregator {node_id} is registered twice")
        registrations[node_id] = Registration(stored.info, stored.capabilities, away=True)
    groups: dict[bytes, GroupRecord] = {}
    for g in state.groups:
        if len(g.group_id) != GROUP_ID_SIZE or g.group_id in groups:
            raise ValueError(f"group id {g.group_id.hex()} is not {GROUP_ID_SIZE} bytes or not unique")
        if g.state is GroupState.PLANNING or len(g.secret) != GROUP_SECRET_SIZE:
            raise ValueError(
                f"group {g.group_id.hex()}: state {g.state.name} or its secret is not restorable"
            )
        ranks = [m.rank for m in g.members]
        if len(set(ranks)) != len(ranks) or any(not 0 <= r < g.world_size for r in ranks):
            raise ValueError(f"group {g.group_id.hex()}: member ranks {ranks} for world_size {g.world_size}")
        if g.plan is not None and not g.plan.aggregator_ids <= set(registrations):
            raise ValueError(f"group {g.group_id.hex()}: its tree names an aggregator not registered")
        groups[g.group_id] = GroupRecord(
            group_id=g.group_id,
            world_size=g.world_size,
            credential=g.credential,
            params=g.params,
            max_fan_in=g.max_fan_in,
            secret=g.secret,
            epoch=g.epoch,
            state=g.state,
            members={
                m.rank: MemberRecord(m.rank, m.node_id, None, m.labels, m.capabilities, m.state, m.epoch)
                for m in g.members
            },
            plan=g.plan,
            change_code=g.change_code,
            excluded=list(g.excluded),
        )
    return groups, registrations


__all__ = ["DurableAggregator", "DurableGroup", "DurableMember", "DurableState", "export", "load"]
