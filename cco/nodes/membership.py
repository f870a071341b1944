"""An endpoint's membership of a group: what the JoinAccept gave it and what the
epochs since have changed.

A :class:`Membership` exists only once the rendezvous has admitted the endpoint, so
code that needs a rank, the group's keys or its parameters holds one instead of
checking that the session has joined.  It keeps the rank, the world size and the
group secret (to recognise the same membership when the session resumes), the keys
derived from the secret, the group's current parameters and epoch, the members of
the current epoch as the rendezvous announced them, and the members collectives run
over: the group at join, or as the application last accepted (draft section
"Membership, Trees and Epochs").
"""

from __future__ import annotations

import hmac

from cco.nodes.calls import OperationError
from cco.nodes.replies import ranks_text
from cco.wire import payload
from cco.wire.errors import ErrorCode
from cco.wire.mac import CoefficientCache
from cco.wire.messages import GroupParams, JoinAccept
from cco.wire.registries import Collective


class Membership:
    """One admitted membership of one group."""

    def __init__(self, accept: JoinAccept) -> None:
        self.group_id = accept.group_id
        self.rank = accept.rank
        self.world_size = accept.world_size
        self.epoch = accept.epoch
        self.params = accept.params
        self.members = frozenset(range(accept.world_size))
        self.accepted = self.members
        self.no_tree: str | None = None  # why no tree can be had (NO_AGGREGATOR), until one is assigned
        self._secret = accept.group_secret
        self.keys = payload.derive_group_keys(accept.group_secret, accept.group_id)
        self.coefficients = CoefficientCache(accept.params.window + 1)
        """The MAC coefficients of the chunks sealed last (window + 1 of them), so that
        verifying each chunk's Result does not derive them again."""

    def same_as(self, accept: JoinAccept) -> bool:
        """Whether a JoinAccept answering a resuming JoinRequest is this membership: the
        same rank, world size, group secret and epoch."""
        return (
            accept.rank == self.rank
            and accept.world_size == self.world_size
            and hmac.compare_digest(accept.group_secret, self._secret)
            and accept.epoch == self.epoch
        )

    @property
    def heartbeat_interval(self) -> float:
        return self.params.heartbeat_interval_ms / 1000

    @property
    def default_timeout(self) -> float:
        """An operation's watchdog: the group's operation timeout plus one heartbeat
        interval, so that the tree's Abort, which names the missing ranks, normally
        arrives first."""
        return self.params.operation_timeout_ms / 1000 + self.heartbeat_interval

    def new_members(self, members: frozenset[int], epoch: int, elastic: bool) -> frozenset[int]:
        """An EpochChange: the members of ``epoch``; the ranks lost since the last one."""
        lost = self.members - members
        self.members = members
        if elastic:
            self.accepted = members
        self.epoch = epoch
        return lost

    def accept_members(self) -> frozenset[int]:
        """The application accepts the current members: later collectives run over them."""
        self.accepted = self.members
        return self.accepted

    def refusal(self, op_id: int, kind: Collective) -> OperationError | None:
        """Why an operation cannot run now, if it cannot: the members changed and were
        not accepted, or no aggregator can serve the group."""
        if self.members != self.accepted:
            lost, joined = self.accepted - self.members, self.members - self.accepted
            changes = [f"ranks {ranks_text(lost)} left"] if lost else []
            changes += [f"ranks {ranks_text(joined)} joined"] if joined else []
            detail = (
                f"the membership changed in epoch {self.epoch} ({', '.join(changes)}): accept the new "
                f"membership ({ranks_text(self.members)}) to run collectives over it"
            )
            group_id = self.group_id
            return OperationError(
                ErrorCode.PEER_LOST, detail, group_id=group_id, op_id=op_id, kind=kind, missing_ranks=lost
            )
        if self.no_tree is not None:
            return OperationError(
                ErrorCode.NO_AGGREGATOR, self.no_tree, group_id=self.group_id, op_id=op_id, kind=kind
            )
        return None

    def adopt(self, params: GroupParams, epoch: int) -> None:
        """A TreeAssignment for ``epoch``: its parameters hold from now; a tree exists."""
        self.params = params
        self.epoch = epoch
        self.no_tree = None
