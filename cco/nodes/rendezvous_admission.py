"""Admission at the rendezvous: how much one peer, and all peers together, may make
the rendezvous hold, and when a group that peers created and left half-formed or
empty is let go (draft section "Resource Limits").

Only groups that a JoinRequest created (``create_groups_on_join``) count against the
node's limits and expire: the groups of the configuration are the operator's, bounded
by the configuration itself.  Every peer's memberships count against its own limits,
whatever the group.  A JoinRequest beyond a limit is answered with
JoinReject(RESOURCE_EXHAUSTED) whose detail names the limit; nothing else changes,
so a peer that floods the rendezvous with joins holds no more than its limits and
costs it a refusal per message.

Expiry is kept as a heap of (deadline, stamp, group): each time a created group
enters FORMING or CLOSED it gets a new stamp and one entry; an entry whose stamp is
no longer the group's is stale and skipped when it comes due.  So noting a change
and finding the next deadline cost the same whatever the number of groups.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable
from dataclasses import dataclass, fields

from cco.nodes.rendezvous_records import GroupRecord
from cco.nodes.rendezvous_states import GroupState
from cco.wire.errors import CcoError, ErrorCode


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionLimits:
    """What peers may make a rendezvous hold; the draft's table "Resource limits"
    gives each with its default (a test checks the two agree).

    Per peer (one connection): ``groups_per_peer`` memberships, of which at most
    ``pending_per_peer`` in groups still forming.  Per node, among groups created by
    a JoinRequest: ``groups`` groups (closed ones included until they are forgotten),
    ``pending`` of them still forming; and ``members`` memberships in all groups.
    ``forming_timeout``: seconds a created group may stay forming before its members
    are removed with Error(TIMEOUT); ``idle_timeout``: seconds a created group stays
    known after its last member left (it reopens with the next epoch if joined
    meanwhile), then it is forgotten.  ``exclusions_per_group``: aggregators that
    members' Reports took out of one group's trees; a new one beyond it forgets the
    oldest (:mod:`cco.nodes.rendezvous_reports`).
    """

    groups_per_peer: int = 16
    pending_per_peer: int = 4
    groups: int = 10_000
    pending: int = 1_000
    members: int = 65_536
    forming_timeout: float = 120.0
    idle_timeout: float = 300.0
    exclusions_per_group: int = 16

    def __post_init__(self) -> None:
        for item in fields(self):
            if not getattr(self, item.name) > 0:
                raise ValueError(f"admission limit {item.name} must be positive")


def exhausted(limit: str, value: int, what: str) -> CcoError:
    """The refusal for a limit reached: RESOURCE_EXHAUSTED naming the limit."""
    return CcoError(ErrorCode.RESOURCE_EXHAUSTED, f"limit {limit} ({value}) reached: {what}")


class Admission:
    """The counts the limits are checked against, and the expiry of created groups."""

    def __init__(self, limits: AdmissionLimits, configured: Collection[bytes]) -> None:
        self.limits = limits
        self._configured = frozenset(configured)
        self.members = 0
        self.created = 0  # groups a JoinRequest created, still known
        self.forming: set[bytes] = set()  # of those, the ones still forming
        self._expiry: list[tuple[float, int, bytes]] = []
        self._stamps: dict[bytes, int] = {}
        self._next_stamp = 0

    def restore(self, groups: Iterable[GroupRecord], now: float) -> None:
        """Count the groups of a restored state and start their clocks at ``now``."""
        for group in groups:
            self.members += len(group.members)
            if group.group_id not in self._configured:
                self.created += 1
                self.state_changed(group, now)

    def check_join(
        self, group: GroupRecord | None, peer_groups: Iterable[GroupRecord], now_forming: bool
    ) -> None:
        """Raise RESOURCE_EXHAUSTED if a peer in ``peer_groups`` may not join ``group``
        (None: a group this join would create); ``now_forming`` says whether the group
        is (or will be) forming once joined."""
        limits = self.limits
        memberships = list(peer_groups)
        if len(memberships) >= limits.groups_per_peer:
            raise exhausted("groups_per_peer", limits.groups_per_peer, "this peer is in as many groups")
        if now_forming:
            pending = sum(1 for g in memberships if g.state is GroupState.FORMING)
            if pending >= limits.pending_per_peer:
                what = "this peer has as many joins in groups still forming"
                raise exhausted("pending_per_peer", limits.pending_per_peer, what)
        if self.members >= limits.members:
            raise exhausted("members", limits.members, "the rendezvous holds as many memberships")
        if group is None:
            if self.created >= limits.groups:
                raise exhausted("groups", limits.groups, "the rendezvous holds as many created groups")
            if len(self.forming) >= limits.pending:
                raise exhausted("pending", limits.pending, "as many created groups are still forming")
        elif (
            group.state is GroupState.CLOSED
            and group.group_id not in self._configured
            and len(self.forming) >= limits.pending
        ):
            raise exhausted("pending", limits.pending, "as many created groups are still forming")

    def group_created(self) -> None:
        self.created += 1

    def group_forgotten(self, group_id: bytes) -> None:
        self.created -= 1
        self._stamps.pop(group_id, None)
        self.forming.discard(group_id)

    def state_changed(self, group: GroupRecord, now: float) -> None:
        """Note that a group moved: a created group entering FORMING or CLOSED starts
        the clock of its expiry."""
        group_id = group.group_id
        if group_id in self._configured:
            return
        if group.state is GroupState.FORMING:
            self.forming.add(group_id)
            self._arm(group_id, now + self.limits.forming_timeout)
        else:
            self.forming.discard(group_id)
            if group.state is GroupState.CLOSED:
                self._arm(group_id, now + self.limits.idle_timeout)
            else:
                self._stamps.pop(group_id, None)

    def _arm(self, group_id: bytes, deadline: float) -> None:
        self._next_stamp += 1
        self._stamps[group_id] = self._next_stamp
        heapq.heappush(self._expiry, (deadline, self._next_stamp, group_id))

    def deadline(self) -> float | None:
        """When the next created group may expire (possibly a stale entry: harmless)."""
        return self._expiry[0][0] if self._expiry else None

    def due(self, now: float) -> list[bytes]:
        """The created groups whose clock ran out by ``now`` (forming or closed since)."""
        expiry, found = self._expiry, []
        while expiry and expiry[0][0] <= now:
            _, stamp, group_id = heapq.heappop(expiry)
            if self._stamps.get(group_id) == stamp:
                del self._stamps[group_id]
                found.append(group_id)
        return found


__all__ = ["Admission", "AdmissionLimits", "exhausted"]
