"""A node's answer to StatusRequest (draft section "Status").

A rendezvous answers from its machine's snapshot (groups, members, trees, the
aggregators and their load); an aggregator and an endpoint from what their flight
recorder heard (each group's epoch and their place in its tree, and an endpoint's
own session).  Every node adds its latest flight-recorder entries.  The reply is cut
to the asker's ``max_message_size``: records go first, oldest first, then
aggregators, then groups, and ``omitted`` says how many entries were left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cco.nodes.endpoint import EndpointMachine
from cco.nodes.rendezvous import RendezvousMachine
from cco.nodes.rendezvous_status import RendezvousStatus
from cco.services.recorder import GroupPlace, Recorder
from cco.services.store import PersistentRendezvous
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import (
    MAX_STATUS_ITEMS,
    AggregatorView,
    GroupView,
    MemberView,
    RecordView,
    StatusReply,
    StatusRequest,
    TreeNodeView,
    encode_message,
)
from cco.wire.registries import Role

FRAME_OVERHEAD = 8
"""Bytes a frame adds to a message (its length prefix), at most."""


def rendezvous_of(machine: object) -> RendezvousMachine | None:
    """The rendezvous machine a runner drives, bare or behind its store; None for another role."""
    if isinstance(machine, PersistentRendezvous):
        return machine.machine
    return machine if isinstance(machine, RendezvousMachine) else None


def rendezvous_groups(status: RendezvousStatus) -> tuple[list[GroupView], list[AggregatorView]]:
    """The groups and aggregators of a rendezvous's snapshot, as the wire has them."""
    groups = [
        GroupView(
            group_id=group.group_id,
            epoch=group.epoch,
            state=group.state.value,
            world_size=group.world_size,
            members=tuple(
                MemberView(rank=m.rank, node_id=m.node_id, state=m.state.value, connected=int(m.connected))
                for m in group.members
            ),
            tree=()
            if group.tree is None
            else tuple(
                TreeNodeView(
                    node_id=p.node_id,
                    ranks=p.node.ranks,
                    parent=p.parent.node_id if p.parent is not None else None,
                )
                for p in group.tree.aggregators
            ),
            excluded=group.excluded or None,
        )
        for group in status.groups
    ]
    aggregators = [
        AggregatorView(
            node_id=a.node_id,
            address=a.address,
            capacity=a.capacity,
            max_fan_in=a.max_fan_in,
            groups=len(a.groups),
            connected=int(a.connected),
            labels=a.labels,
        )
        for a in status.aggregators
    ]
    return groups, aggregators


def _place_view(place: GroupPlace, node_id: str, role: Role, state: str) -> GroupView:
    if role is Role.ENDPOINT:
        members: tuple[MemberView, ...] = ()
        if place.rank is not None:
            members = (MemberView(rank=place.rank, node_id=node_id, state=state, connected=1),)
        tree: tuple[TreeNodeView, ...] = ()
        if place.parent is not None:
            tree = (TreeNodeView(node_id=place.parent, ranks=bitmap_from_ranks(place.parent_ranks)),)
        return GroupView(
            group_id=place.group_id,
            epoch=place.epoch,
            state=state,
            world_size=place.world_size,
            members=members,
            tree=tree,
        )
    own = TreeNodeView(node_id=node_id, ranks=bitmap_from_ranks(place.expected), parent=place.parent)
    return GroupView(
        group_id=place.group_id,
        epoch=place.epoch,
        state=state,
        world_size=place.world_size,
        members=(),
        tree=(own,),
    )


def build_reply(
    request: StatusRequest,
    *,
    role: Role,
    node_id: str,
    machine: object,
    recorder: Recorder,
    now: float,
    max_size: int,
) -> StatusReply:
    """The StatusReply ``node_id`` gives, cut to ``max_size`` bytes framed."""
    aggregators: list[AggregatorView] = []
    rendezvous = rendezvous_of(machine)
    if rendezvous is not None:
        groups, aggregators = rendezvous_groups(rendezvous.status())
    else:
        state = "active"
        if isinstance(machine, EndpointMachine):
            state = machine.state.value
        groups = [_place_view(place, node_id, role, state) for _, place in sorted(recorder.groups.items())]
    records = recorder.views(min(request.records, MAX_STATUS_ITEMS))
    return fit(
        role,
        node_id,
        recorder.millis(now),
        groups[:MAX_STATUS_ITEMS],
        aggregators[:MAX_STATUS_ITEMS],
        records,
        max_size,
    )


def fit(
    role: Role,
    node_id: str,
    uptime_ms: int,
    groups: Sequence[GroupView],
    aggregators: Sequence[AggregatorView],
    records: Sequence[RecordView],
    max_size: int,
) -> StatusReply:
    """The reply with as much as fits ``max_size``: records dropped first (oldest
    first), then aggregators, then groups, halving what is left out each time."""
    kept_groups, kept_aggregators, kept_records = list(groups), list(aggregators), list(records)
    omitted = 0
    while True:
        reply = StatusReply(
            role=role,
            node_id=node_id,
            uptime_ms=uptime_ms,
            groups=tuple(kept_groups),
            aggregators=tuple(kept_aggregators),
            records=tuple(kept_records),
            omitted=omitted,
        )
        if len(encode_message(reply)) + FRAME_OVERHEAD <= max_size:
            return reply
        if kept_records:
            cut = max(1, len(kept_records) // 2)
            del kept_records[:cut]  # the oldest
        elif kept_aggregators:
            cut = max(1, len(kept_aggregators) // 2)
            del kept_aggregators[len(kept_aggregators) - cut :]
        elif kept_groups:
            cut = max(1, len(kept_groups) // 2)
            del kept_groups[len(kept_groups) - cut :]
        else:
            return reply  # nothing left to leave out; the link refuses it if it is still too large
        omitted += cut


def reply_json(reply: StatusReply) -> dict[str, Any]:
    """The reply as plain JSON values: ids in hex, rank bitmaps as lists of ranks."""
    return {
        "role": reply.role.name.lower(),
        "node_id": reply.node_id,
        "uptime_ms": reply.uptime_ms,
        "groups": [
            {
                "group_id": group.group_id.hex(),
                "epoch": group.epoch,
                "state": group.state,
                "world_size": group.world_size,
                "members": [
                    {"rank": m.rank, "node_id": m.node_id, "state": m.state, "connected": bool(m.connected)}
                    for m in group.members
                ],
                "tree": [
                    {"node_id": n.node_id, "ranks": sorted(ranks_from_bitmap(n.ranks)), "parent": n.parent}
                    for n in group.tree
                ],
                "excluded": list(group.excluded or ()),
            }
            for group in reply.groups
        ],
        "aggregators": [
            {
                "node_id": a.node_id,
                "address": f"{a.address.host}:{a.address.port}",
                "capacity": a.capacity,
                "max_fan_in": a.max_fan_in,
                "groups": a.groups,
                "connected": bool(a.connected),
                "labels": list(a.labels),
            }
            for a in reply.aggregators
        ],
        "records": [record_json(r) for r in reply.records],
        "omitted": reply.omitted,
    }


def record_json(record: RecordView) -> dict[str, Any]:
    return {
        "group_id": record.group_id.hex(),
        "epoch": record.epoch,
        "op_id": record.op_id,
        "chunk_index": record.chunk_index,
        "kind": record.kind.name.lower(),
        "state": record.state,
        "elements": record.elements,
        "missing": sorted(ranks_from_bitmap(record.missing)),
        "started_ms": record.started_ms,
        "updated_ms": record.updated_ms,
    }


__all__ = ["build_reply", "fit", "record_json", "rendezvous_groups", "rendezvous_of", "reply_json"]
