"""The aggregator role as a sans-I/O state machine.

An aggregator combines chunks on their way up a group's tree and fans results back
down.  It holds no key: it adds values, ORs contributor bitmaps and adds tags
(:class:`~cco.wire.payload.Aggregate`), and leaves every check that needs the group
secret to the endpoints.  What it *can* check it does, because a wrong partial
aggregate costs every rank of the group an operation:

* a child may only speak for the ranks the rendezvous placed under it, from the
  connection authenticated as that child's node (``UNAUTHORIZED`` otherwise);
* a chunk it has already taken from a child is recognised when it arrives again
  (kept as a fingerprint, also for a while after the slot completed) and ignored,
  so a retransmission is never added twice; a *different* chunk in its place is
  refused with ``DUPLICATE_CONTRIBUTION``; if the slot completed and its Result
  is among the last few sent down, the child gets that Result again (a child
  sends again only when it lacks the result);
* the number of slots a group holds open is bounded by the group's window, so its
  memory is bounded by window x chunk size, never by the size of the tensor.

The machine is composed of parts with one concern each: its session with the
rendezvous (:mod:`cco.nodes.session`: registration, heartbeats, the loss rule),
each group it serves (:mod:`cco.nodes.aggregator_group`: its tree, parent and
traffic), each group's slots (:mod:`cco.nodes.aggregator_slots`), and what waits
for an assignment or a connection (:mod:`cco.nodes.aggregator_pending`).  Three
transition tables describe it (:mod:`cco.nodes.aggregator_states`): the node's
registration, each group's place in a tree and each slot; the draft's diagrams are
generated from them.
"""

from __future__ import annotations

from cco.nodes.aggregator_config import AggregatorConfig
from cco.nodes.aggregator_group import AggregatorGroup, Context, PeerInfo, Usage
from cco.nodes.aggregator_pending import Pending
from cco.nodes.aggregator_states import (
    FROM_RENDEZVOUS,
    GROUP_TABLE,
    NODE_TABLE,
    GroupEvent,
    GroupState,
    NodeAction,
    NodeEvent,
    NodeState,
    SlotState,
)
from cco.nodes.deadlines import earlier
from cco.nodes.events import (
    ClosePeer,
    Command,
    Input,
    MessageMalformed,
    MessageReceived,
    PeerConnected,
    PeerDisconnected,
    PeerId,
    SendMessage,
    TimerFired,
)
from cco.nodes.parent import Dials
from cco.nodes.replies import ranks_text, refuse
from cco.nodes.session import RendezvousSession, Tick
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import ranks_from_bitmap
from cco.wire.messages import (
    Abort,
    AggregatorAccept,
    AggregatorRegister,
    BroadcastData,
    ChunkAck,
    ChunkMessage,
    Contribution,
    EpochChange,
    Error,
    GroupParams,
    Heartbeat,
    Message,
    PartialAggregate,
    Result,
    RetransmitRequest,
    TreeAssignment,
    clip_detail,
)
from cco.wire.registries import Role

_UP = (Contribution, PartialAggregate, BroadcastData, Abort)
_DOWN = (Result, BroadcastData, Abort, RetransmitRequest)
_REPORTS = (Heartbeat, Error, ChunkAck)  # a tuple, not a union that every data message would build again


def _layout_problem(message: ChunkMessage, params: GroupParams) -> str | None:
    """How the chunk is cut otherwise than the group's parameters say, if it is: a
    block-scaled chunk may also be cut in any whole number of blocks up to the group's
    scaled_chunk_limit (its ranks agreed the size in the scale pass)."""
    blocks = message.block_elements
    if blocks is not None and blocks != params.block_elements:
        return f"block_elements {blocks} differs from the group's {params.block_elements}"
    chunk = message.chunk_elements
    if chunk == params.chunk_elements:
        return None
    if blocks is None:
        return f"chunk_elements {chunk} differs from the group's {params.chunk_elements}"
    limit = params.scaled_chunk_limit
    if chunk % blocks or chunk > limit:
        return (
            f"chunk_elements {chunk} is neither the group's {params.chunk_elements} nor a "
            f"multiple of block_elements {blocks} up to {limit}"
        )
    return None


class AggregatorMachine:
    """The aggregator: ``handle(event, now) -> commands`` and ``next_deadline()``.

    Registration: on ``PeerConnected(role=RENDEZVOUS)`` it sends
    ``AggregatorRegister`` and, once accepted, exchanges heartbeats with the
    rendezvous every interval; three silent intervals mean the rendezvous is lost, or
    the longest liveness window of the groups it was assigned, if longer (a machine
    busy enough to stall its members for that long may stall it too).
    Groups are served independently; nothing one group's peers send can touch
    another group's slots.
    """

    def __init__(self, config: AggregatorConfig) -> None:
        self.config = config
        self.refusal: CcoError | None = None
        """Why the rendezvous refused this node's registration (it will not be accepted
        by asking again: its node id is taken, or its offer is invalid)."""
        self._state = NodeState.DETACHED
        self._session = RendezvousSession()
        self._unconfirmed_until: float | None = None  # when groups the rendezvous did not confirm end
        self._context = Context(
            config,
            {},
            {},
            {},
            Pending(
                config.pending_limit,
                config.pending_timeout,
                config.parked_bytes_per_peer,
                config.parked_bytes,
            ),
            Usage(),
            Dials(),
        )
        self._groups: dict[bytes, AggregatorGroup] = {}

    # --- observation ----------------------------------------------------------

    @property
    def state(self) -> NodeState:
        return self._state

    @property
    def node_id(self) -> str | None:
        """The node id the rendezvous accepted this node under."""
        return self._context.node_id

    def group_state(self, group_id: bytes) -> GroupState:
        group = self._groups.get(group_id)
        return group.state if group else GroupState.UNKNOWN

    def group_epoch(self, group_id: bytes) -> int | None:
        group = self._groups.get(group_id)
        return group.epoch if group else None

    def group_parent(self, group_id: bytes) -> str | None:
        """The node id of this group's parent here; None at the root or without an assignment."""
        group = self._groups.get(group_id)
        if group is None or group.assignment is None or group.assignment.parent is None:
            return None
        return group.assignment.parent.node_id

    def slot_state(self, group_id: bytes, op_id: int, chunk_index: int) -> SlotState | None:
        group = self._groups.get(group_id)
        return None if group is None else group.slots.state_of(op_id, chunk_index)

    def open_slots(self, group_id: bytes) -> int:
        group = self._groups.get(group_id)
        return len(group.slots.open) if group else 0

    @property
    def slot_bytes(self) -> int:
        """Bytes held for open slots (their parts, then their sums) and for aggregates
        waiting for the parent."""
        return self._context.usage.slots

    @property
    def peak_slot_bytes(self) -> int:
        """The largest value :attr:`slot_bytes` has had."""
        return self._context.usage.peak_slots

    @property
    def kept_result_bytes(self) -> int:
        """Payload bytes of the Results kept for children that lost theirs: at most
        2 x window Results per group."""
        return self._context.usage.kept

    @property
    def pending_bytes(self) -> int:
        """Payload bytes held in pending queues: data ahead of its TreeAssignment, and
        data for a child whose connection has not been reported yet."""
        return self._context.pending.bytes

    # --- driving --------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """The earliest timer.  The I/O layer asks after every input (four times per
        round of a four-rank group), so this is one pass that builds no lists."""
        earliest = self._unconfirmed_until
        heartbeat = self._session.deadline()
        if heartbeat is not None:
            earliest = earlier(earliest, heartbeat)
        earliest = self._context.pending.deadline(earliest)
        for group in self._groups.values():
            if group.parent.retry_at is not None:
                earliest = earlier(earliest, group.parent.retry_at)
            if group.owed is not None:
                earliest = earlier(earliest, group.owed.until)
            if group.slots.open:
                earliest = group.slots.deadline(earliest)
        return earliest

    def handle(self, event: Input, now: float) -> list[Command]:
        """Process one input; never raises for anything a peer can send."""
        self._context.now = now
        if isinstance(event, MessageReceived):  # first: nearly every input is one
            if event.peer == self._session.peer:
                self._session.heard(now)
                return self._on_rendezvous_message(event.message, now)
            return self._on_data_message(event.peer, event.message, now)
        if isinstance(event, PeerConnected):
            return self._on_connected(event, now)
        if isinstance(event, PeerDisconnected):
            return self._on_disconnected(event.peer, event.code, now)
        if isinstance(event, MessageMalformed):  # a connection error: report it, close, forget the peer
            code, detail = event.error.code, clip_detail(event.error.detail)
            closing: list[Command] = [
                SendMessage(event.peer, Error(code=code, detail=detail)),
                ClosePeer(event.peer, code, detail),
            ]
            return closing + self._on_disconnected(event.peer, code, now)
        if isinstance(event, TimerFired):
            return self._on_timer(now)
        raise CcoError(ErrorCode.INTERNAL_ERROR, f"not an input: {event!r}")

    # --- connections ------------------------------------------------------------

    def _on_connected(self, event: PeerConnected, now: float) -> list[Command]:
        context = self._context
        if event.role is Role.RENDEZVOUS:
            move = NODE_TABLE.move(self._state, NodeEvent.RENDEZVOUS_CONNECTED)
            if move is None:
                return [
                    ClosePeer(event.peer, ErrorCode.PROTOCOL_VIOLATION, "already attached to a rendezvous")
                ]
            self._state = move.target
            register = AggregatorRegister(
                address=self.config.address,
                capacity=self.config.capacity,
                max_fan_in=self.config.max_fan_in,
                labels=self.config.labels,
            )
            return [self._session.greet(event.peer, register)]
        context.peers[event.peer] = PeerInfo(event.node_id, event.role)
        context.node_peer[event.node_id] = event.peer
        out: list[Command] = [SendMessage(event.peer, m) for m in context.pending.connected(event.node_id)]
        group_id = context.parent_peers.get(event.peer)
        if group_id is None:
            return out
        group = self._groups[group_id]
        if group.parent.peer != event.peer:
            return out  # a connection for an assignment that has since been replaced
        return out + group.event(GroupEvent.PARENT_CONNECTED, now)

    def _on_disconnected(self, peer: PeerId, code: ErrorCode, now: float) -> list[Command]:
        if peer == self._session.peer:
            return self._node_event(NodeEvent.RENDEZVOUS_LOST, None, now)
        context = self._context
        info = context.peers.pop(peer, None)
        if info is not None and context.node_peer.get(info.node_id) == peer:
            del context.node_peer[info.node_id]
        context.pending.disconnected(peer)
        group_id = context.parent_peers.pop(peer, None)
        if group_id is None:
            return []
        group = self._groups[group_id]
        if group.owed is not None and group.owed.peer == peer:
            group.owed = None  # what it owed is lost with it
        if group.parent.peer != peer:
            return []
        return group.event(GroupEvent.PARENT_LOST, now, detail=f"parent connection lost ({code.name})")

    # --- control plane ----------------------------------------------------------

    def _on_rendezvous_message(self, message: Message, now: float) -> list[Command]:
        event = FROM_RENDEZVOUS.get(type(message))
        if event is None or not NODE_TABLE.allows(self._state, event):
            assert self._session.peer is not None
            why = f"{type(message).__name__} is not allowed in state {self._state.name}"
            return [refuse(self._session.peer, message, ErrorCode.PROTOCOL_VIOLATION, why)]
        return self._node_event(event, message, now)

    def _node_event(self, event: NodeEvent, message: Message | None, now: float) -> list[Command]:
        """Do what the node table says ``event`` does."""
        move = NODE_TABLE.fire(self._state, event)
        self._state = move.target
        match move.action:
            case NodeAction.ACCEPTED:
                assert isinstance(message, AggregatorAccept)
                self._context.node_id = message.node_id
                self._session.accept(message.heartbeat_interval_ms / 1000, now)
            case NodeAction.REFUSED:  # an Error answered the registration
                assert isinstance(message, Error)
                self.refusal = CcoError(message.code, f"registration refused: {message.detail}")
                return self._session.close(message.code, "registration refused")
            case NodeAction.ASSIGN:
                assert isinstance(message, TreeAssignment)
                return self._on_assignment(message, now)
            case NodeAction.CHANGE_EPOCH:
                assert isinstance(message, EpochChange)
                group = self._groups.get(message.group_id)
                if group is None or message.epoch <= group.epoch:
                    return []  # not ours, or already known
                return group.event(GroupEvent.EPOCH_CHANGE, now, change=message)
            case NodeAction.DETACH:
                self._detach(now)
        return []  # a Heartbeat, or a report: liveness already noted

    def _detach(self, now: float) -> None:
        """Without its rendezvous the node keeps serving its groups, for
        ``rendezvous_grace`` seconds: a rendezvous that restarts keeps its groups and
        assigns this node its trees again (each TreeAssignment confirms a group);
        one that re-planned without this node never will."""
        self._session.detach(now)
        for group in self._groups.values():
            group.confirmed = False
        if self._groups:
            self._unconfirmed_until = now + self.config.rendezvous_grace

    def _end_unconfirmed(self, now: float) -> list[Command]:
        """The grace is over: every group the rendezvous did not assign again ends here."""
        self._unconfirmed_until = None
        out: list[Command] = []
        for group in [g for g in self._groups.values() if not g.confirmed]:
            out += group.event(GroupEvent.UNCONFIRMED, now)
            del self._groups[group.group_id]
        return out

    def _on_assignment(self, message: TreeAssignment, now: float) -> list[Command]:
        peer = self._session.peer
        assert peer is not None
        problem = self._check_assignment(message)
        if problem is not None:
            code, detail = problem
            return [refuse(peer, message, code, detail)]
        group = self._groups.get(message.group_id)
        if group is None:
            group = AggregatorGroup(self._context, message.group_id, message.epoch)
        elif message.epoch < group.epoch:
            return [
                refuse(
                    peer, message, ErrorCode.STALE_EPOCH, f"epoch {message.epoch} is older than {group.epoch}"
                )
            ]
        group.confirmed = True
        self._session.widen(message.params.loss_window)  # as long as its groups' members
        parent = message.parent
        if parent is None:
            event = GroupEvent.ASSIGNED_ROOT
        elif group.parent.reaches(parent.node_id):
            event = GroupEvent.ASSIGNED_CONNECTED
        else:
            event = GroupEvent.ASSIGNED_CONNECT
        self._groups[group.group_id] = group
        if not GROUP_TABLE.allows(group.state, event):
            return []
        out = group.event(event, now, assignment=message)
        for sender, waiting in self._context.pending.unpark(group.group_id, group.epoch):
            out += self._on_data_message(sender, waiting, now)
        return out

    def _check_assignment(self, message: TreeAssignment) -> tuple[ErrorCode, str] | None:
        seen: set[int] = set()
        for child in message.children:
            ranks = ranks_from_bitmap(child.ranks)
            if not ranks or seen & ranks:
                return ErrorCode.INVALID_FIELD, f"child {child.node_id} has empty or overlapping ranks"
            seen |= ranks
        if not message.children or seen != ranks_from_bitmap(message.expected):
            return ErrorCode.INVALID_FIELD, "children's ranks do not partition expected"
        if len(message.children) > self.config.max_fan_in:
            return ErrorCode.RESOURCE_EXHAUSTED, f"{len(message.children)} children exceed max_fan_in"
        active = sum(1 for g in self._groups.values() if g.assignment is not None)
        if message.group_id not in self._groups and active >= self.config.capacity:
            return ErrorCode.RESOURCE_EXHAUSTED, f"already serving {active} groups (capacity)"
        return None

    # --- data plane -------------------------------------------------------------

    def _on_data_message(self, peer: PeerId, message: Message, now: float) -> list[Command]:
        info = self._context.peers.get(peer)
        if isinstance(message, _REPORTS):
            return []  # liveness and reports need no answer; a Result is the acknowledgement
        if info is None:
            return [refuse(peer, message, ErrorCode.UNAUTHORIZED, "peer is not identified")]
        group = self._groups.get(getattr(message, "group_id", b""))
        if group is not None and group.owes(info.node_id, message):
            assert isinstance(message, Result | BroadcastData | Abort)
            return group.pass_owed(message)
        if group is not None and group.parent.reaches(info.node_id):
            # any connection authenticated as the parent node: a node may reach its
            # children over a connection they opened for another group
            if isinstance(message, _DOWN):
                return self._on_chunk_down(group, peer, message, now)
        elif isinstance(message, _UP):
            return self._on_chunk_up(group, peer, info, message, now)
        where = "down from the parent" if isinstance(message, _UP) else "up the tree"
        why = f"{type(message).__name__} does not travel {where}"
        return [refuse(peer, message, ErrorCode.PROTOCOL_VIOLATION, why)]

    def _on_chunk_up(
        self,
        group: AggregatorGroup | None,
        peer: PeerId,
        info: PeerInfo,
        message: Contribution | PartialAggregate | BroadcastData | Abort,
        now: float,
    ) -> list[Command]:
        if group is None or group.assignment is None or message.epoch > group.epoch:
            if group is not None and message.epoch < group.epoch:
                return [self._stale(peer, message, group.epoch)]
            return self._park(peer, message, now)
        if message.epoch < group.epoch:
            return [self._stale(peer, message, group.epoch)]
        ranks = group.children.get(info.node_id)
        if ranks is None:
            why = f"node {info.node_id} is not a child in group {group.group_id.hex()}"
            return [refuse(peer, message, ErrorCode.UNAUTHORIZED, why)]
        group.event(GroupEvent.CHUNK_UP, now)
        self._context.node_peer[info.node_id] = peer
        if isinstance(message, Abort):
            missing = ranks_from_bitmap(message.missing) & ranks if message.missing is not None else None
            return group.abort_op(message.op_id, message.code, message.detail, missing, origin=peer)
        contributors = ranks_from_bitmap(message.contributors)
        if not contributors <= ranks:
            why = (
                f"node {info.node_id} may speak for ranks {ranks_text(ranks)} only, "
                f"not {ranks_text(contributors - ranks)}"
            )
            return [refuse(peer, message, ErrorCode.UNAUTHORIZED, why)]
        if isinstance(message, BroadcastData):
            if contributors != {message.root}:
                return [
                    refuse(
                        peer, message, ErrorCode.UNAUTHORIZED, "broadcast data must come from its root only"
                    )
                ]
            return group.send_down(message) if group.root else group.send_up(message)
        problem = _layout_problem(message, group.assignment.params)
        if problem is not None:
            return [refuse(peer, message, ErrorCode.OPERATION_MISMATCH, problem)]
        return group.slots.part(peer, info.node_id, message, contributors, now)

    def _on_chunk_down(
        self,
        group: AggregatorGroup,
        peer: PeerId,
        message: Result | BroadcastData | Abort | RetransmitRequest,
        now: float,
    ) -> list[Command]:
        group.event(GroupEvent.CHUNK_DOWN, now)  # the parent is up: the group is ACTIVE or STALE
        if group.assignment is None or message.epoch != group.epoch:
            return []  # an old epoch's traffic, already aborted locally
        if isinstance(message, Abort):
            missing = ranks_from_bitmap(message.missing) if message.missing is not None else None
            return group.abort_op(message.op_id, message.code, message.detail, missing, up=False)
        if isinstance(message, RetransmitRequest):
            return group.slots.asked_again(message, now)
        return group.send_down(message)

    def _stale(self, peer: PeerId, message: ChunkMessage | Abort, epoch: int) -> Command:
        return SendMessage(
            peer,
            Abort(
                group_id=message.group_id,
                epoch=message.epoch,
                op_id=message.op_id,
                code=ErrorCode.STALE_EPOCH,
                detail=f"epoch {message.epoch} is over; the group is in epoch {epoch}",
            ),
        )

    def _park(self, peer: PeerId, message: ChunkMessage | Abort, now: float) -> list[Command]:
        bound = self._context.pending.park(peer, message, now)
        if bound is None:
            return []
        why = f"{bound}, for group {message.group_id.hex()} epoch {message.epoch}"
        return [refuse(peer, message, ErrorCode.RESOURCE_EXHAUSTED, why)]

    # --- timers -----------------------------------------------------------------

    def _on_timer(self, now: float) -> list[Command]:
        out: list[Command] = []
        tick = self._session.tick(now)
        if tick is Tick.LOST:
            peer = self._session.peer
            assert peer is not None
            out.append(ClosePeer(peer, ErrorCode.PEER_LOST, self._session.silence()))
            out += self._node_event(NodeEvent.RENDEZVOUS_LOST, None, now)
        elif tick is Tick.BEAT:
            out.append(self._session.heartbeat())
        if self._unconfirmed_until is not None and now >= self._unconfirmed_until:
            out += self._end_unconfirmed(now)
        out += self._context.pending.expire(now)
        for group in list(self._groups.values()):
            if group.parent.retry_due(now):
                out += group.event(GroupEvent.PARENT_RETRY, now)
            out += group.slots.on_timer(now)
            out += group.expire_owed(now)
        return out


__all__ = ["AggregatorConfig", "AggregatorMachine"]
