"""The rendezvous's groups: their epochs, and the trees it plans and assigns for them.

A membership change ends the group's epoch: an EpochChange(new epoch, members, code)
goes to the members and to the old tree's aggregators, then the new tree's
TreeAssignments, aggregators root first, then endpoints by rank.  An aggregator
arriving re-plans every group, but only a group whose tree gets *better*
(:meth:`~cco.nodes.tree.TreePlan.better_than`), or leaves the fallback aggregators
(draft section "Fallback to End Hosts"), changes epoch: in-flight operations are
not failed for a tree that is merely different.  A group with no room for a tree
waits (state WAITING) and gets its tree, in its current epoch, as soon as capacity
appears; its members are told at once, by an EpochChange with code NO_AGGREGATOR
(unless the epoch change that brought it there already said so).  The groups
waiting and the trees each aggregator is in are indexed, so a join or a re-plan
visits the waiting groups only, never every group.  An aggregator is placed in a
group's tree only if it accepts the group's chunk_elements (and its block-scaled
operations' largest, scaled_chunk_elements) and lists every dtype,
op and collective that all the group's members list, and no member's Report
excluded it from the group's trees (:mod:`cco.nodes.rendezvous_reports`).  Groups move along
:data:`~cco.nodes.rendezvous_states.GROUP_TABLE` and do what its moves name.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Mapping

from cco.nodes.events import Command, Happening, PeerId, Report, SendMessage
from cco.nodes.fsm import Move, TransitionTable
from cco.nodes.rendezvous_config import FALLBACK_LABEL
from cco.nodes.rendezvous_records import GroupRecord, MemberRecord, Registration, chunk_elements_limit
from cco.nodes.rendezvous_states import (
    GROUP_TABLE,
    MEMBER_TABLE,
    GroupAction,
    GroupEvent,
    GroupState,
    MemberEvent,
)
from cco.nodes.tree import AggregatorInfo, AggregatorPlacement, MemberInfo, TreePlan, plan_tree
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import EpochChange, TreeAssignment


def _internal(
    table: TransitionTable[GroupState, GroupEvent, GroupAction], state: GroupState, event: GroupEvent
) -> Move[GroupState, GroupAction]:
    """A move the rendezvous decides itself: a refusal here is a bug in this module, not peer input."""
    move = table.move(state, event)
    if move is None:
        raise RuntimeError(f"{table.name}: {event.value} in {state.name} is not in the table")
    return move


class Trees:
    """Every group the rendezvous knows, the aggregators registered with it, and the
    work of keeping each group in a tree."""

    def __init__(
        self,
        node_peers: Mapping[str, PeerId],
        changed: Callable[[], None],
        moved: Callable[[GroupRecord], None] = lambda group: None,
    ) -> None:
        self.groups: dict[bytes, GroupRecord] = {}
        self.registrations: dict[str, Registration] = {}
        self._node_peers = node_peers
        self._changed = changed
        self._moved = moved
        self._waiting: set[bytes] = set()  # groups in WAITING: retried when capacity may have appeared
        self._used: Counter[str] = Counter()  # aggregator node id -> trees it is in
        self._released = False  # a tree was released since the waiting groups were last retried

    def adopt(self, groups: Mapping[bytes, GroupRecord]) -> None:
        """Take restored groups, with their trees and waiting states, into the indexes."""
        for group in groups.values():
            self.groups[group.group_id] = group
            if group.state is GroupState.WAITING:
                self._waiting.add(group.group_id)
            self._set_plan(group, group.plan)

    def forget(self, group_id: bytes) -> None:
        """Drop a closed group (it has no tree and is not waiting)."""
        group = self.groups.pop(group_id)
        assert group.state is GroupState.CLOSED and group.plan is None

    def _set_plan(self, group: GroupRecord, plan: TreePlan | None) -> None:
        """Install or clear a group's tree, keeping the count of trees per aggregator."""
        if group.plan is not None:
            self._used.subtract(group.plan.aggregator_ids)
            self._released = True
        group.plan = plan
        if plan is not None:
            self._used.update(plan.aggregator_ids)

    # --- moves --------------------------------------------------------------------

    def group_event(
        self,
        group: GroupRecord,
        event: GroupEvent,
        out: list[Command],
        code: ErrorCode = ErrorCode.NO_ERROR,
        plan: TreePlan | None = None,
    ) -> None:
        """Move ``group`` on ``event`` and do what the move names (``code`` is the
        EpochChange's, ``plan`` a tree already found for it)."""
        move = _internal(GROUP_TABLE, group.state, event)
        if move.target is not group.state:
            group.state = move.target
            if move.target is GroupState.WAITING:
                self._waiting.add(group.group_id)
            else:
                self._waiting.discard(group.group_id)
            self._moved(group)
        match move.action:
            case GroupAction.COUNT:
                if not group.members:
                    self.group_event(group, GroupEvent.EMPTY, out)
                elif len(group.members) == group.world_size:
                    self.group_event(group, GroupEvent.COMPLETE, out)
            case GroupAction.PLAN:
                self._plan(group, out)
            case GroupAction.REPLAN:
                self._end_epoch(group, code, out)
                if plan is None:
                    self._plan(group, out)
                else:
                    self.group_event(group, GroupEvent.PLANNED, out, plan=plan)
            case GroupAction.INSTALL:
                assert plan is not None
                self._install(group, plan, out)
            case GroupAction.WAIT:
                if group.change_code is not ErrorCode.NO_AGGREGATOR:
                    # the members learn at once that no tree can be had, not by a timeout
                    self._end_epoch(group, ErrorCode.NO_AGGREGATOR, out)
                self._changed()
                detail = "no aggregator capacity for a tree; waiting for one"
                out.append(
                    Report(Happening.WAITING, group_id=group.group_id, epoch=group.epoch, detail=detail)
                )
            case GroupAction.END:
                self._end_epoch(group, code, out)
            case GroupAction.REOPEN:
                group.epoch += 1
                group.change_code = ErrorCode.NO_ERROR
                group.excluded.clear()  # a reopened group starts afresh, with a new secret
            case GroupAction.FORGET:
                pass

    @staticmethod
    def member_event(member: MemberRecord, event: MemberEvent) -> None:
        move = MEMBER_TABLE.move(member.state, event)
        if move is None:
            raise RuntimeError(
                f"{MEMBER_TABLE.name}: {event.value} in {member.state.name} is not in the table"
            )
        member.state = move.target

    def membership_changed(
        self, group: GroupRecord, event: GroupEvent, code: ErrorCode, out: list[Command]
    ) -> None:
        """Members joined, left or were lost: a forming group counts them; one that had
        an epoch ends it (when the last member is gone, without a tree after it)."""
        if not group.members and group.state is not GroupState.FORMING:
            event = GroupEvent.EMPTY
        self.group_event(group, event, out, code)

    # --- epochs and assignments ------------------------------------------------------

    def _end_epoch(self, group: GroupRecord, code: ErrorCode, out: list[Command]) -> None:
        """Advance the epoch and tell the members and the old tree's aggregators
        (those connected: an away member hears of it when it joins again)."""
        group.epoch += 1
        group.change_code = code
        self._changed()
        change = EpochChange(
            group_id=group.group_id, epoch=group.epoch, members=group.members_bitmap(), code=code
        )
        members = f"members {sorted(group.members)}"
        out.append(
            Report(Happening.EPOCH, group_id=group.group_id, epoch=group.epoch, code=code, detail=members)
        )
        for _, member in sorted(group.members.items()):
            if member.peer is not None:
                out.append(SendMessage(member.peer, change))
                member.epoch = group.epoch
            self.member_event(member, MemberEvent.NEW_EPOCH)
        if group.plan is not None:
            for placement in group.plan.aggregators:
                peer = self._aggregator_peer(placement.node_id)
                if peer is not None:
                    out.append(SendMessage(peer, change))
        self._set_plan(group, None)

    def _aggregator_peer(self, node_id: str) -> PeerId | None:
        """The connection of a registered aggregator; None if it is away or gone."""
        registration = self.registrations.get(node_id)
        if registration is None or registration.away:
            return None
        return self._node_peers[node_id]

    def _plan(self, group: GroupRecord, out: list[Command]) -> None:
        """PLANNING -> ACTIVE with a tree for the current epoch, or -> WAITING."""
        plan = self._candidate(group)
        self.group_event(
            group, GroupEvent.NO_CAPACITY if plan is None else GroupEvent.PLANNED, out, plan=plan
        )

    def _install(self, group: GroupRecord, plan: TreePlan, out: list[Command]) -> None:
        """Install ``plan`` and send its TreeAssignments to whoever is connected (an
        away node gets its own when it registers or joins again)."""
        self._set_plan(group, plan)
        self._changed()
        out.append(Report(Happening.TREE, group_id=group.group_id, epoch=group.epoch, detail=plan.describe()))
        for placement in plan.aggregators:
            peer = self._aggregator_peer(placement.node_id)
            if peer is not None:
                out.append(SendMessage(peer, self._aggregator_assignment(group, placement)))
        for rank, _ in plan.endpoint_parents:
            member = group.members[rank]
            if member.peer is not None:
                self.assign_member(group, member, out)

    def assign_member(self, group: GroupRecord, member: MemberRecord, out: list[Command]) -> None:
        """Send a connected member its place in the group's tree."""
        assert group.plan is not None and member.peer is not None
        assignment = TreeAssignment(
            group_id=group.group_id,
            epoch=group.epoch,
            world_size=group.world_size,
            expected=bitmap_from_ranks([member.rank]),
            children=(),
            params=group.current_params(),
            parent=group.plan.parent_of(member.rank),
        )
        out.append(SendMessage(member.peer, assignment))
        self.member_event(member, MemberEvent.ASSIGNED)

    def assignments_of(self, node_id: str) -> list[Command]:
        """An aggregator's current TreeAssignment in every tree it is in (for a restored
        registration that is back)."""
        peer = self._node_peers[node_id]
        return [
            SendMessage(peer, self._aggregator_assignment(group, group.plan.placement(node_id)))
            for _, group in sorted(self.groups.items())
            if group.plan is not None and node_id in group.plan.aggregator_ids
        ]

    @staticmethod
    def _aggregator_assignment(group: GroupRecord, placement: AggregatorPlacement) -> TreeAssignment:
        return TreeAssignment(
            group_id=group.group_id,
            epoch=group.epoch,
            world_size=group.world_size,
            expected=placement.expected,
            children=placement.children,
            params=group.current_params(),
            parent=placement.parent,
        )

    # --- planning ----------------------------------------------------------------------

    def _pool(self, group: GroupRecord) -> list[AggregatorInfo]:
        """Registered aggregators able to serve ``group``, with the capacity left for it."""
        params, needs = group.current_params(), group.needs()
        own = group.plan.aggregator_ids if group.plan is not None else frozenset()
        pool = []
        for node_id, registration in sorted(self.registrations.items()):
            if node_id in group.excluded:
                continue
            info, capabilities = registration.info, registration.capabilities
            limit = chunk_elements_limit(capabilities, group.world_size, params.block_elements)
            if limit < max(params.chunk_elements, params.scaled_chunk_limit):
                continue
            if not needs.met_by(capabilities):
                continue
            spare = info.capacity - self._used[node_id] + (node_id in own)
            if spare >= 1:
                pool.append(AggregatorInfo(node_id, info.address, spare, info.max_fan_in, info.labels))
        return pool

    def _candidate(self, group: GroupRecord) -> TreePlan | None:
        """The group's best tree: on dedicated aggregators if they can hold it, else
        with the fallback aggregators that endpoints run, else none."""
        members = {r: MemberInfo(m.node_id, m.labels) for r, m in group.members.items()}
        pool = self._pool(group)
        dedicated = [a for a in pool if FALLBACK_LABEL not in a.labels]
        for aggregators in (dedicated, pool) if len(dedicated) < len(pool) else (pool,):
            with contextlib.suppress(CcoError):
                return plan_tree(members, aggregators, group.max_fan_in)
        return None

    def _on_fallback(self, plan: TreePlan) -> bool:
        """Whether ``plan`` uses an aggregator run by an end host."""
        return any(
            FALLBACK_LABEL in self.registrations[node].info.labels
            for node in plan.aggregator_ids
            if node in self.registrations
        )

    def retry_waiting(self, out: list[Command], *, arrived: bool = False) -> None:
        """Plan the groups waiting for capacity, in group id order, if capacity may
        have appeared: an aggregator ``arrived``, or a tree was released since the
        last retry (a join that creates or completes a group frees none, so it
        costs nothing here however many groups wait)."""
        if not (arrived or self._released):
            return
        self._released = False
        for group_id in sorted(self._waiting):
            group = self.groups[group_id]
            if group.state is GroupState.WAITING:  # an earlier one's tree may have moved it
                self.group_event(group, GroupEvent.AGGREGATORS_CHANGED, out)

    def reported(self, group: GroupRecord, out: list[Command]) -> None:
        """A member's Report excluded aggregators of the group's tree: a new epoch,
        announced VERIFICATION_FAILED so that every member fails what went through the
        reported tree alike, then a tree without them, or (no tree fitting) the
        NO_AGGREGATOR epoch of a waiting group; the capacity it frees goes to waiting
        groups."""
        self.group_event(group, GroupEvent.REPORTED, out, ErrorCode.VERIFICATION_FAILED)
        self.retry_waiting(out)

    def aggregators_changed(self, out: list[Command], lost: str | None) -> None:
        """Re-plan after an aggregator arrived (``lost`` None) or was lost.

        Waiting groups are planned before active ones are improved, so spare
        capacity goes first to groups that have no tree at all.
        """
        for _, group in sorted(self.groups.items()):
            if group.plan is not None and lost is not None and lost in group.plan.aggregator_ids:
                # the members learn whether a new tree follows or none can be placed
                code = ErrorCode.PEER_LOST if self._candidate(group) is not None else ErrorCode.NO_AGGREGATOR
                self.group_event(group, GroupEvent.AGGREGATORS_CHANGED, out, code)
        self.retry_waiting(out, arrived=True)
        if lost is None:
            for _, group in sorted(self.groups.items()):
                if group.state is GroupState.ACTIVE and group.plan is not None:
                    candidate = self._candidate(group)
                    if candidate is None:
                        continue
                    back = self._on_fallback(group.plan) and not self._on_fallback(candidate)
                    if not (back or candidate.better_than(group.plan)):
                        continue
                    self.group_event(
                        group, GroupEvent.AGGREGATORS_CHANGED, out, ErrorCode.NO_ERROR, candidate
                    )
            self.retry_waiting(out, arrived=True)
