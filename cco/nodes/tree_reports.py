"""An endpoint's side of Report (draft, "Report"): telling the rendezvous that the
tree of an epoch delivered data that failed its checks, and sending nothing more
into that tree while the rendezvous moves the group to a new one.  Its own part
because the hold outlives any one operation: it ends with the epoch, with the
rendezvous's refusal of the Report, or when an operation held back reaches its
deadline (then no new epoch is coming)."""

from __future__ import annotations

from cco.nodes.events import Command, PeerId, SendMessage
from cco.nodes.membership import Membership
from cco.nodes.parent import ParentLink
from cco.nodes.session import RendezvousSession
from cco.wire.errors import ErrorCode
from cco.wire.messages import Report, clip_detail


class TreeReports:
    """The Reports of one membership and the hold they put on its tree."""

    def __init__(self, membership: Membership, parent: ParentLink, rendezvous: RendezvousSession) -> None:
        self._membership = membership
        self._parent = parent
        self._rendezvous = rendezvous
        self._held: tuple[int, PeerId] | None = None
        """An epoch whose tree delivered data that failed verification (this rank's
        check, reported, or the tree's Abort saying so), and the rendezvous connection
        then: no chunk leaves into that tree while that connection lasts."""
        self.failed_epoch: int | None = None
        """The last epoch in which an operation here failed on what its tree delivered
        (a chunk that failed its checks, or the tree's Abort for failed verification)."""

    def report(self, op_id: int, epoch: int, code: ErrorCode, detail: str) -> list[Command]:
        """Tell the rendezvous that the tree of ``epoch`` delivered data that failed
        its checks, naming the parent that delivered it, and hold that tree."""
        rendezvous, parent = self._rendezvous.peer, self._parent.node_id
        if rendezvous is None or not self._rendezvous.accepted or parent is None:
            return []
        membership = self._membership
        report = Report(
            group_id=membership.group_id,
            epoch=epoch,
            op_id=op_id,
            code=code,
            parent=parent,
            detail=clip_detail(f"rank {membership.rank}: {detail}"),
        )
        self.hold(epoch)
        return [SendMessage(rendezvous, report)]

    def hold(self, epoch: int) -> None:
        """Data of the tree of ``epoch`` failed its checks: send nothing more into it
        while the rendezvous, told by a Report, moves the group.  A rank detached from
        the rendezvous holds nothing back for an epoch change that may not come."""
        rendezvous = self._rendezvous.peer
        if rendezvous is not None and self._rendezvous.accepted:
            self._held = (epoch, rendezvous)

    def release(self) -> None:
        """Chunks may leave again: the rendezvous refused this rank's Report, or an
        operation held back reached its deadline and the tree is all there is."""
        self._held = None

    @property
    def holding(self) -> bool:
        return self._held == (self._membership.epoch, self._rendezvous.peer)
