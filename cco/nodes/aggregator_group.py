"""One group an aggregator serves: its place in the group's tree, and what travels
along that tree through this node.

The group follows :data:`~cco.nodes.aggregator_states.GROUP_TABLE`: a
TreeAssignment names its children (the ranks each may speak for), the ranks this
node waits for and its parent, which it dials (:class:`~cco.nodes.parent.ParentLink`);
an EpochChange ends the tree.  Chunks go up to the parent (held in an outbox while
the parent is not connected) and down to every child (held for a child whose
connection is not reported yet); the last 2 x window Results are kept, for a child
that sends its chunk again because its Result was lost.  Ending an operation (an
Abort) frees its slots and tells the tree once.  The slots themselves are
:class:`~cco.nodes.aggregator_slots.GroupSlots`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from cco.nodes.aggregator_config import AggregatorConfig
from cco.nodes.aggregator_pending import Pending, payload_size
from cco.nodes.aggregator_slots import GroupSlots, SlotKey
from cco.nodes.aggregator_states import GROUP_TABLE, GroupAction, GroupEvent, GroupState
from cco.nodes.events import ClosePeer, Command, PeerId, SendMessage
from cco.nodes.parent import Dials, ParentLink
from cco.wire.errors import ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import (
    Abort,
    BroadcastData,
    ChunkMessage,
    EpochChange,
    Message,
    PartialAggregate,
    Result,
    TreeAssignment,
    clip_detail,
)
from cco.wire.payload import retype
from cco.wire.registries import Role


@dataclass(slots=True)
class Usage:
    """The payload bytes an aggregator holds: its memory bound, and what it reports."""

    slots: int = 0  # open slots' sums and aggregates waiting for a parent
    peak_slots: int = 0
    kept: int = 0  # Results kept for children that lost theirs

    def hold(self, delta: int) -> None:
        self.slots += delta
        if self.slots > self.peak_slots:
            self.peak_slots = self.slots


@dataclass(frozen=True, slots=True)
class Owed:
    """The tree of an epoch that ended with NO_ERROR (members left on purpose, or a
    re-plan): the Results, broadcast data and Aborts of that epoch still coming down
    from its parent go on to its children until ``until`` (an operation timeout after
    the change), over the parent connection kept open for them.  A member that left
    right after its last collective had its result, so the root had sent every
    Result of it; the other members, which keep such an operation, still need theirs."""

    epoch: int
    parent: str  # node id
    peer: PeerId
    children: frozenset[str]
    until: float


@dataclass(frozen=True, slots=True)
class PeerInfo:
    node_id: str
    role: Role


@dataclass(slots=True)
class Context:
    """What every group of one aggregator shares: its connections and its bounds."""

    config: AggregatorConfig
    peers: dict[PeerId, PeerInfo]
    node_peer: dict[str, PeerId]  # node_id -> its latest connection
    parent_peers: dict[PeerId, bytes]  # connections dialled to a parent -> their group
    pending: Pending
    usage: Usage
    dials: Dials
    node_id: str | None = None
    now: float = 0.0  # of the input being handled


class AggregatorGroup:
    """One group's tree at this node, its traffic, and its slots."""

    def __init__(self, context: Context, group_id: bytes, epoch: int) -> None:
        self.context = context
        self.group_id = group_id
        self.epoch = epoch
        self.state = GroupState.UNKNOWN
        self.assignment: TreeAssignment | None = None
        self.children: dict[str, frozenset[int]] = {}  # node_id -> ranks
        self.expected: frozenset[int] = frozenset()
        self.parent = ParentLink()
        self.confirmed = True  # False from the loss of the rendezvous until its TreeAssignment comes again
        self.slots = GroupSlots(self)
        self.outbox: list[ChunkMessage | Abort] = []
        self.results: OrderedDict[SlotKey, Result] = OrderedDict()  # the last Results sent down
        self.owed: Owed | None = None

    @property
    def window(self) -> int:
        return self.assignment.params.window if self.assignment else 0

    @property
    def timeout(self) -> float:
        return self.assignment.params.operation_timeout_ms / 1000 if self.assignment else 0.0

    @property
    def root(self) -> bool:
        """Whether this node is the root of the group's tree (it has no parent)."""
        assert self.assignment is not None
        return self.assignment.parent is None

    @property
    def outgoing(self) -> type[PartialAggregate | Result]:
        """What a complete aggregate travels as: up as a PartialAggregate, or at the root
        down as the Result."""
        return Result if self.root else PartialAggregate

    # --- moves ----------------------------------------------------------------------

    def event(
        self,
        event: GroupEvent,
        now: float,
        *,
        assignment: TreeAssignment | None = None,
        change: EpochChange | None = None,
        detail: str = "",
    ) -> list[Command]:
        """Apply one group-level event; one the table does not allow changes nothing."""
        move = GROUP_TABLE.move(self.state, event)
        if move is None:
            return []
        self.state = move.target
        match move.action:
            case GroupAction.NOTE:  # first: chunks up and down, the per-message events
                pass
            case GroupAction.ROOT | GroupAction.ADOPT | GroupAction.DIAL:
                assert assignment is not None
                return self._adopt(assignment, move.action, now)
            case GroupAction.FLUSH:
                self.parent.connected()
                return self._flush_outbox()
            case GroupAction.REDIAL_LATER:
                self.parent.lost(now, self.context.config.retry_interval)
                return self.abort_all(ErrorCode.PEER_LOST, detail, None)
            case GroupAction.DOWN:
                self.parent.lost(now, None)
            case GroupAction.RETRY:
                return self._dial_parent()
            case GroupAction.CHANGE_EPOCH:
                assert change is not None
                return self._change_epoch(change)
            case GroupAction.END:
                why = "the rendezvous did not assign this group again after it was lost"
                out = self.abort_all(ErrorCode.PEER_LOST, why, None)
                out += self._close_parent("the group ended here") + self._close_owed()
                self._forget_results()
                return out
        return []

    def _adopt(self, assignment: TreeAssignment, action: GroupAction, now: float) -> list[Command]:
        out: list[Command] = []
        if assignment.epoch > self.epoch or self.assignment is None:
            if self.slots.open or self.outbox:
                out += self.abort_all(ErrorCode.STALE_EPOCH, "superseded by a new epoch", None)
            self._forget_epoch()
        self.epoch = assignment.epoch
        self.assignment = assignment
        self.children = {c.node_id: ranks_from_bitmap(c.ranks) for c in assignment.children}
        self.expected = ranks_from_bitmap(assignment.expected)
        if action is GroupAction.ROOT:
            out += self._retire_parent()
            out += self._flush_outbox()
        elif action is GroupAction.DIAL:
            out += self._retire_parent()
            out += self._dial_parent()
        return out

    def _retire_parent(self) -> list[Command]:
        """Leave the parent of the tree being replaced: close the connection, unless the
        older tree still owes Results over it (:class:`Owed`)."""
        owed = self.owed
        if owed is not None and owed.peer == self.parent.peer:
            self.parent.hand_over()  # stays open, and in parent_peers, until _close_owed
            return []
        return self._close_parent()

    def _close_parent(self, why: str = "parent changed") -> list[Command]:
        if self.parent.peer is not None:
            self.context.parent_peers.pop(self.parent.peer, None)
        return self.parent.close(why)

    def _dial_parent(self) -> list[Command]:
        assert self.assignment is not None and self.assignment.parent is not None
        peer = self.context.dials.peer(self.group_id.hex(), self.epoch)
        self.context.parent_peers[peer] = self.group_id
        return [self.parent.dial(peer, self.assignment.parent)]

    def _change_epoch(self, change: EpochChange) -> list[Command]:
        lost = self.expected - ranks_from_bitmap(change.members)
        code = ErrorCode.PEER_LOST if change.code is ErrorCode.NO_ERROR else change.code
        out = self.abort_all(code, f"epoch changed to {change.epoch}", lost or None)
        out += self._close_owed()
        parent = self.parent
        if change.code is ErrorCode.NO_ERROR and parent.up and parent.peer is not None and parent.node_id:
            until = self.context.now + self.timeout
            self.owed = Owed(self.epoch, parent.node_id, parent.peer, frozenset(self.children), until)
        self.epoch = change.epoch
        self.assignment = None
        self.parent.retry_at = None
        self._forget_epoch()
        return out

    def _forget_epoch(self) -> None:
        """What this node remembers of the group's operations belongs to one epoch."""
        self.slots.forget()
        self._forget_results()

    # --- what an older tree owes -------------------------------------------------------

    def owes(self, node_id: str, message: Message) -> bool:
        """Whether ``message``, from ``node_id``, comes down the older tree (:class:`Owed`)."""
        owed = self.owed
        return (
            owed is not None
            and node_id == owed.parent
            and isinstance(message, Result | BroadcastData | Abort)
            and message.epoch == owed.epoch
        )

    def pass_owed(self, message: ChunkMessage | Abort) -> list[Command]:
        """Send what the older tree owes to its children that are still connected."""
        assert self.owed is not None
        node_peer = self.context.node_peer
        return [SendMessage(node_peer[c], message) for c in sorted(self.owed.children) if c in node_peer]

    def expire_owed(self, now: float) -> list[Command]:
        owed = self.owed
        return self._close_owed() if owed is not None and now >= owed.until else []

    def _close_owed(self) -> list[Command]:
        owed, self.owed = self.owed, None
        if owed is None or owed.peer == self.parent.peer:
            return []  # none, or the connection to the new tree's parent too
        self.context.parent_peers.pop(owed.peer, None)
        return [ClosePeer(owed.peer, ErrorCode.NO_ERROR, "the older tree's results are delivered")]

    # --- traffic --------------------------------------------------------------------

    def send_up(self, message: ChunkMessage | Abort) -> list[Command]:
        if self.parent.up and self.parent.peer is not None:
            return [SendMessage(self.parent.peer, message)]
        self.outbox.append(message)
        self.context.usage.hold(payload_size(message))
        return []

    def _flush_outbox(self) -> list[Command]:
        queued, self.outbox = self.outbox, []
        self.context.usage.hold(-sum(payload_size(m) for m in queued))
        if self.assignment is None or self.assignment.parent is None:
            # Now the root: what was waiting for a parent goes to the children instead.
            out: list[Command] = []
            for message in queued:
                if isinstance(message, PartialAggregate):
                    out += self.send_down(retype(message, Result))
                elif isinstance(message, BroadcastData):
                    out += self.send_down(message)
            return out
        assert self.parent.peer is not None
        return [SendMessage(self.parent.peer, m) for m in queued]

    def send_down(self, message: ChunkMessage | Abort, skip: PeerId | None = None) -> list[Command]:
        """To every child; a child whose connection is not reported yet gets it on arrival.

        (A broadcast receiver sends nothing before data reaches it, so its connection
        may be reported after the first chunk for it; the hold is bounded like the
        pending queue.)  The last 2 x window Results are kept, for a child that sends
        its chunk again because its Result was lost (a connection that broke)."""
        if isinstance(message, Result):
            self._keep_result(message)
        context = self.context
        out: list[Command] = []
        for node_id in self.children:
            peer = context.node_peer.get(node_id)
            if peer is None:
                context.pending.hold(node_id, message, context.now)
            elif peer != skip:
                out.append(SendMessage(peer, message))
        return out

    def _keep_result(self, result: Result) -> None:
        key = (result.op_id, result.chunk_index)
        if key in self.results:
            return
        self.results[key] = result
        usage = self.context.usage
        usage.kept += len(result.payload)
        while len(self.results) > 2 * self.window:
            usage.kept -= len(self.results.popitem(last=False)[1].payload)

    def _forget_results(self, op_id: int | None = None) -> None:
        """Drop the kept Results of one operation (None: of every operation)."""
        for key in [k for k in self.results if op_id is None or k[0] == op_id]:
            self.context.usage.kept -= len(self.results.pop(key).payload)

    # --- aborts ---------------------------------------------------------------------

    def abort_op(
        self,
        op_id: int,
        code: ErrorCode,
        detail: str,
        missing: frozenset[int] | None,
        *,
        origin: PeerId | None = None,
        up: bool = True,
    ) -> list[Command]:
        """End one operation in this group: free its slots, tell the tree once: every
        child but ``origin`` and, with ``up``, the parent."""
        if not self.slots.abort(op_id):
            return []
        self._forget_results(op_id)
        self.context.usage.hold(-sum(payload_size(m) for m in self.outbox if m.op_id == op_id))
        self.outbox = [m for m in self.outbox if m.op_id != op_id]
        abort = Abort(
            group_id=self.group_id,
            epoch=self.epoch,
            op_id=op_id,
            code=code,
            detail=clip_detail(detail),
            missing=bitmap_from_ranks(missing) if missing else None,
        )
        out = self.send_down(abort, skip=origin)
        if up and self.assignment is not None and self.assignment.parent is not None:
            out += self.send_up(abort)
        return out

    def abort_all(self, code: ErrorCode, detail: str, missing: frozenset[int] | None) -> list[Command]:
        """End every operation with an open slot or a message waiting for the parent."""
        ops = sorted(self.slots.open_ops() | {m.op_id for m in self.outbox})
        out: list[Command] = []
        for op_id in ops:
            out += self.abort_op(op_id, code, detail, missing, up=False)
        return out
