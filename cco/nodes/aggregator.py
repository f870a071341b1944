"""The aggregator role as a sans-I/O state machine.

An aggregator combines chunks on their way up a group's tree and fans results back
down.  It holds no key: it adds values, ORs contributor bitmaps and adds tags through
:func:`cco.wire.payload.combine`, and leaves every check that needs the group secret
to the endpoints.  What it *can* check it does, because a wrong partial aggregate
costs every rank of the group an operation:

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

Three transition tables describe the machine (:mod:`cco.nodes.aggregator_states`):
the node's registration with the rendezvous, each group's place in a tree and each
slot.  The draft's diagrams are generated from them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import marshal
import zlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import chain

from cco.nodes.aggregator_states import (
    ABORT,
    ASKED_AGAIN,
    ASSIGNED_CONNECT,
    ASSIGNED_CONNECTED,
    ASSIGNED_ROOT,
    CHUNK_DOWN,
    CHUNK_UP,
    CONFLICT,
    GROUP_TABLE,
    HALF_TIMEOUT,
    LAST_PART,
    LATE_PART,
    NODE_TABLE,
    PARENT_CONNECTED,
    PARENT_LOST,
    PARENT_RETRY,
    PART,
    RENDEZVOUS_CONNECTED,
    RENDEZVOUS_LOST,
    RETRANSMISSION,
    SLOT_TABLE,
    SLOT_TIMEOUT,
    TIMEOUT,
    UNCONFIRMED,
    WAIT_OVER,
    GroupState,
    NodeState,
    SlotState,
)
from cco.nodes.deadlines import earlier
from cco.nodes.events import (
    ClosePeer,
    Command,
    ConnectTo,
    Input,
    MessageMalformed,
    MessageReceived,
    PeerConnected,
    PeerDisconnected,
    PeerId,
    SendMessage,
    TimerFired,
)
from cco.nodes.replies import clip, ranks_text, refuse
from cco.wire import payload
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import (
    Abort,
    Address,
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
)
from cco.wire.registries import Role

# --- configuration ----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AggregatorConfig:
    """What an aggregator offers the rendezvous, and its local resource bounds.

    ``capacity`` is the number of groups it serves at once.  ``pending_limit``
    bounds the chunks one peer may park before the rendezvous has told this node
    about their group; they are refused after ``pending_timeout`` seconds.
    ``record_limit`` bounds the per-group memory of completed slots kept to
    recognise late retransmissions.  ``rendezvous_grace`` is how long the groups
    it serves outlive the loss of the rendezvous: the data plane needs no
    rendezvous, so a restarted one (which keeps its state, draft section
    "Rendezvous Persistence and Restart") finds its trees still working; a group
    whose TreeAssignment has not come again within the grace ends.
    """

    address: Address
    capacity: int = 64
    max_fan_in: int = 64
    labels: tuple[str, ...] = ()
    pending_limit: int = 64
    pending_timeout: float = 5.0
    record_limit: int = 1024
    retry_interval: float = 1.0
    rendezvous_grace: float = 60.0


# --- internal records -------------------------------------------------------------

SlotKey = tuple[int, int]  # (op_id, chunk_index) within one group and epoch


@dataclass(slots=True)
class _Slot:
    opened: float
    deadline: float
    expected: frozenset[int]  # the ranks below this node the chunk waits for
    state: SlotState = SlotState.COLLECTING
    fingerprints: dict[str, bytes] = field(default_factory=dict)  # child node_id -> fingerprint
    received: frozenset[int] = frozenset()
    aggregate: ChunkMessage | None = None
    extended: bool = False  # already waited the extra half timeout for a silent aggregator child
    nudged: bool = False  # already asked the silent children to send again
    quorum: int | None = None  # a presence pass: the fewest contributors it completes with
    release_at: float | None = None  # a presence pass: when its wait for more contributors ends
    wait_over: bool = False  # a presence pass past its wait: it goes on with a quorum
    released: bool = False  # completed at the end of its wait, without every expected rank
    waited_longer: bool = False  # already waited once more for a silent aggregator child
    more: set[bytes] = field(default_factory=set)  # a presence pass: later parts of children that sent one

    def next_timer(self, half_timeout: float) -> float:
        """When the first of this slot's timers is due: its timeout, the end of its quorum
        wait, or (not nudged yet) half its timeout.  One walk over a group's slots asks
        each slot once, since the runner asks for the next deadline after every input."""
        earliest = self.deadline
        if self.release_at is not None and self.release_at < earliest:
            earliest = self.release_at
        if not self.nudged and self.opened + half_timeout < earliest:
            earliest = self.opened + half_timeout
        return earliest


@dataclass(slots=True)
class _Group:
    group_id: bytes
    epoch: int
    assignment: TreeAssignment | None = None
    children: dict[str, frozenset[int]] = field(default_factory=dict)  # node_id -> ranks
    expected: frozenset[int] = frozenset()
    parent_peer: PeerId | None = None  # the connection we dialled for this group
    parent_node: str | None = None  # whom it reaches: down-traffic is accepted from this node
    parent_up: bool = False
    retry_at: float | None = None
    confirmed: bool = True  # False from the loss of the rendezvous until its TreeAssignment comes again
    state: GroupState = GroupState.UNKNOWN
    slots: dict[SlotKey, _Slot] = field(default_factory=dict)
    record: OrderedDict[SlotKey, _Slot] = field(default_factory=OrderedDict)
    aborted: OrderedDict[int, None] = field(default_factory=OrderedDict)
    outbox: list[ChunkMessage | Abort] = field(default_factory=list)
    results: OrderedDict[SlotKey, Result] = field(default_factory=OrderedDict)  # the last Results sent down

    @property
    def window(self) -> int:
        return self.assignment.params.window if self.assignment else 0

    @property
    def timeout(self) -> float:
        return self.assignment.params.operation_timeout_ms / 1000 if self.assignment else 0.0


@dataclass(frozen=True, slots=True)
class _Pending:
    arrived: float
    message: ChunkMessage | Abort


@dataclass(frozen=True, slots=True)
class _Peer:
    node_id: str
    role: Role


_MARSHAL_VERSION = 2  # the last version without references: see fingerprint


def fingerprint(message: ChunkMessage) -> bytes:
    """A short digest of everything a chunk says, to recognise a copy of it.

    Kept instead of the chunk itself, so recognising a retransmission costs 16 or
    20 bytes per child and slot rather than a copy of the data.  The header goes
    through BLAKE2b, serialised by :mod:`marshal`: its fields are integers, bytes
    and None, which marshal writes with their type and length, so two headers
    serialise alike only if they are equal, at a fifth of the cost of ``repr``.
    Format version 2, because later versions write an object met twice in one call
    as a reference to it, by identity, so two equal headers could serialise apart.
    A tagged chunk's header holds its tag, a MAC of the payload and contributors:
    another payload under the same header and tag comes only from a sender that
    forges the MAC, and it gains nothing, since a chunk taken for a copy is not
    combined either; the sender only misses its DUPLICATE_CONTRIBUTION (draft
    section "Aggregator Processing").  So the payload itself is hashed, with
    CRC-32, only for untagged chunks (MIN, MAX and the bitwise ops).  Hashing every
    payload took 5% of an aggregator's CPU in a 64 MiB all-reduce (BLAKE2b before
    it, a sixth).
    """
    header = (
        int(message.TYPE),
        message.group_id,
        message.epoch,
        message.op_id,
        int(message.kind),
        int(message.op),
        int(message.dtype),
        message.scales,
        message.total_elements,
        message.chunk_elements,
        message.chunk_index,
        message.contributors,
        message.width,
        message.tag,
        message.root,
        message.block_elements,
        len(message.payload),
    )
    digest = hashlib.blake2b(marshal.dumps(header, _MARSHAL_VERSION), digest_size=16).digest()
    if message.tag is not None:
        return digest
    return digest + zlib.crc32(message.payload).to_bytes(4, "big")


def _retype(message: ChunkMessage, cls: type[ChunkMessage]) -> ChunkMessage:
    """The same chunk as another message class (a lone part becomes the aggregate)."""
    if type(message) is cls:
        return message
    values = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
    return cls(**values)


def _layout_problem(message: ChunkMessage, params: GroupParams) -> str | None:
    """How the chunk is cut otherwise than the group's parameters say, if it is."""
    if message.chunk_elements != params.chunk_elements:
        name, value, wanted = "chunk_elements", message.chunk_elements, params.chunk_elements
    elif message.block_elements is not None and message.block_elements != params.block_elements:
        name, value, wanted = "block_elements", message.block_elements, params.block_elements
    else:
        return None
    return f"{name} {value} differs from the group's {wanted}"


def _outgoing(group: _Group) -> type[PartialAggregate | Result]:
    """What a complete aggregate travels as: up as a PartialAggregate, or at the root
    down as the Result.  The last part is combined straight into it, so the aggregate
    is not built a second time to change its class."""
    assert group.assignment is not None
    return PartialAggregate if group.assignment.parent is not None else Result


# --- the machine ------------------------------------------------------------------


class AggregatorMachine:
    """The aggregator: ``handle(event, now) -> commands`` and ``next_deadline()``.

    Registration: on ``PeerConnected(role=RENDEZVOUS)`` it sends
    ``AggregatorRegister`` and, once accepted, exchanges heartbeats with the
    rendezvous every interval; three silent intervals mean the rendezvous is lost.
    Groups are served independently; nothing one group's peers send can touch
    another group's slots.
    """

    def __init__(self, config: AggregatorConfig) -> None:
        self.config = config
        self.node_id: str | None = None
        self.refusal: CcoError | None = None
        """Why the rendezvous refused this node's registration (it will not be accepted
        by asking again: its node id is taken, or its offer is invalid)."""
        self._state = NodeState.DETACHED
        self._rendezvous: PeerId | None = None
        self._heartbeat_interval = 0.0
        self._heartbeat_seq = 0
        self._next_heartbeat: float | None = None
        self._last_heard = 0.0
        self._grace_until: float | None = None  # when groups the rendezvous did not confirm end
        self._peers: dict[PeerId, _Peer] = {}
        self._node_peer: dict[str, PeerId] = {}  # node_id -> its latest connection
        self._groups: dict[bytes, _Group] = {}
        self._parent_peers: dict[PeerId, bytes] = {}  # our ConnectTo peers -> group
        self._dials = 0
        self._pending: dict[PeerId, deque[_Pending]] = {}
        self._unconnected: dict[str, deque[_Pending]] = {}  # child node_id -> what waits for it
        self._now = 0.0
        self._slot_bytes = 0
        self._peak_slot_bytes = 0
        self._pending_bytes = 0
        self._kept_bytes = 0

    # --- observation ----------------------------------------------------------

    @property
    def state(self) -> NodeState:
        return self._state

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
        if group is None:
            return None
        slot = group.slots.get((op_id, chunk_index)) or group.record.get((op_id, chunk_index))
        if slot is not None:
            return slot.state
        return SlotState.ABORTED if op_id in group.aborted else None

    def open_slots(self, group_id: bytes) -> int:
        group = self._groups.get(group_id)
        return len(group.slots) if group else 0

    @property
    def slot_bytes(self) -> int:
        """Payload bytes held for open slots and for aggregates waiting for the parent."""
        return self._slot_bytes

    @property
    def peak_slot_bytes(self) -> int:
        """The largest value :attr:`slot_bytes` has had."""
        return self._peak_slot_bytes

    @property
    def kept_result_bytes(self) -> int:
        """Payload bytes of the Results kept for children that lost theirs: at most
        2 x window Results per group."""
        return self._kept_bytes

    @property
    def pending_bytes(self) -> int:
        """Payload bytes held in pending queues: data ahead of its TreeAssignment, and
        data for a child whose connection has not been reported yet."""
        return self._pending_bytes

    # --- driving --------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """The earliest timer.  The I/O layer asks after every input (four times per
        round of a four-rank group), so this is one pass that builds no lists."""
        earliest = self._grace_until
        if self._rendezvous is not None and self._heartbeat_interval:
            earliest = earlier(earliest, self._last_heard + 3 * self._heartbeat_interval)
            if self._next_heartbeat is not None:
                earliest = earlier(earliest, self._next_heartbeat)
        for queue in chain(self._pending.values(), self._unconnected.values()):
            if queue:
                earliest = earlier(earliest, queue[0].arrived + self.config.pending_timeout)
        for group in self._groups.values():
            if group.retry_at is not None:
                earliest = earlier(earliest, group.retry_at)
            if group.slots:
                half_timeout = group.timeout / 2
                for slot in group.slots.values():
                    earliest = earlier(earliest, slot.next_timer(half_timeout))
        return earliest

    def handle(self, event: Input, now: float) -> list[Command]:
        """Process one input; never raises for anything a peer can send."""
        self._now = now
        if isinstance(event, MessageReceived):  # first: nearly every input is one
            if event.peer == self._rendezvous:
                self._last_heard = now
                return self._on_rendezvous_message(event.message, now)
            return self._on_data_message(event.peer, event.message, now)
        if isinstance(event, PeerConnected):
            return self._on_connected(event, now)
        if isinstance(event, PeerDisconnected):
            return self._on_disconnected(event.peer, event.code, now)
        if isinstance(event, MessageMalformed):  # a connection error: report it, close, forget the peer
            code, detail = event.error.code, clip(event.error.detail)
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
        if event.role is Role.RENDEZVOUS:
            if not NODE_TABLE.allows(self._state, RENDEZVOUS_CONNECTED):
                return [
                    ClosePeer(event.peer, ErrorCode.PROTOCOL_VIOLATION, "already attached to a rendezvous")
                ]
            self._state = NODE_TABLE.next(self._state, RENDEZVOUS_CONNECTED)
            self._rendezvous = event.peer
            self._last_heard = now
            register = AggregatorRegister(
                address=self.config.address,
                capacity=self.config.capacity,
                max_fan_in=self.config.max_fan_in,
                labels=self.config.labels,
            )
            return [SendMessage(event.peer, register)]
        self._peers[event.peer] = _Peer(event.node_id, event.role)
        self._node_peer[event.node_id] = event.peer
        held = self._unconnected.pop(event.node_id, deque())
        self._pending_bytes -= sum(_payload_size(p.message) for p in held)
        out: list[Command] = [SendMessage(event.peer, p.message) for p in held]
        group_id = self._parent_peers.get(event.peer)
        if group_id is None:
            return out
        group = self._groups[group_id]
        if group.parent_peer != event.peer:
            return out  # a connection for an assignment that has since been replaced
        return out + self._group_event(group, PARENT_CONNECTED, now)

    def _on_disconnected(self, peer: PeerId, code: ErrorCode, now: float) -> list[Command]:
        if peer == self._rendezvous:
            return self._lose_rendezvous(None, now)
        info = self._peers.pop(peer, None)
        if info is not None and self._node_peer.get(info.node_id) == peer:
            del self._node_peer[info.node_id]
        dropped = self._pending.pop(peer, ())
        self._pending_bytes -= sum(_payload_size(p.message) for p in dropped)
        group_id = self._parent_peers.pop(peer, None)
        if group_id is None:
            return []
        group = self._groups[group_id]
        if group.parent_peer != peer:
            return []
        return self._group_event(group, PARENT_LOST, now, detail=f"parent connection lost ({code.name})")

    def _lose_rendezvous(self, close: str | None, now: float) -> list[Command]:
        """Without its rendezvous the node keeps serving its groups, for
        ``rendezvous_grace`` seconds: a rendezvous that restarts keeps its groups and
        assigns this node its trees again (each TreeAssignment confirms a group);
        one that re-planned without this node never will."""
        out: list[Command] = []
        if close is not None and self._rendezvous is not None:
            out.append(ClosePeer(self._rendezvous, ErrorCode.PEER_LOST, close))
        self._state = NODE_TABLE.next(self._state, RENDEZVOUS_LOST)
        self._rendezvous = None
        self._heartbeat_interval = 0.0
        self._next_heartbeat = None
        for group in self._groups.values():
            group.confirmed = False
        if self._groups:
            self._grace_until = now + self.config.rendezvous_grace
        return out

    def _end_unconfirmed(self) -> list[Command]:
        """The grace is over: every group the rendezvous did not assign again ends here."""
        self._grace_until = None
        out: list[Command] = []
        for group in [g for g in self._groups.values() if not g.confirmed]:
            group.state = GROUP_TABLE.next(group.state, UNCONFIRMED)
            why = "the rendezvous did not assign this group again after it was lost"
            out += self._abort_all(group, ErrorCode.PEER_LOST, why, None, 0.0)
            out += self._close_parent(group, "the group ended here")
            self._forget_results(group)
            del self._groups[group.group_id]
        return out

    # --- control plane ----------------------------------------------------------

    def _on_rendezvous_message(self, message: Message, now: float) -> list[Command]:
        assert self._rendezvous is not None
        name = type(message).__name__
        if not NODE_TABLE.allows(self._state, name):
            return [
                refuse(
                    self._rendezvous,
                    message,
                    ErrorCode.PROTOCOL_VIOLATION,
                    f"{name} is not allowed in state {self._state.name}",
                )
            ]
        self._state = NODE_TABLE.next(self._state, name)
        if isinstance(message, AggregatorAccept):
            self.node_id = message.node_id
            self._heartbeat_interval = message.heartbeat_interval_ms / 1000
            self._next_heartbeat = now + self._heartbeat_interval
            return []
        if isinstance(message, Error):
            if self._state is NodeState.DETACHED:  # registration refused
                peer, self._rendezvous = self._rendezvous, None
                self.refusal = CcoError(message.code, f"registration refused: {message.detail}")
                return [ClosePeer(peer, message.code, "registration refused")]
            return []
        if isinstance(message, TreeAssignment):
            return self._on_assignment(message, now)
        if isinstance(message, EpochChange):
            group = self._groups.get(message.group_id)
            if group is None or message.epoch <= group.epoch:
                return []  # not ours, or already known
            return self._group_event(group, "EpochChange", now, epoch_change=message)
        return []  # Heartbeat: liveness already noted

    def _on_assignment(self, message: TreeAssignment, now: float) -> list[Command]:
        assert self._rendezvous is not None
        problem = self._check_assignment(message)
        if problem is not None:
            code, detail = problem
            return [refuse(self._rendezvous, message, code, detail)]
        group = self._groups.get(message.group_id)
        if group is None:
            group = _Group(group_id=message.group_id, epoch=message.epoch)
        elif message.epoch < group.epoch:
            return [
                refuse(
                    self._rendezvous,
                    message,
                    ErrorCode.STALE_EPOCH,
                    f"epoch {message.epoch} is older than {group.epoch}",
                )
            ]
        group.confirmed = True
        parent = message.parent
        if parent is None:
            event = ASSIGNED_ROOT
        elif group.parent_up and group.parent_node == parent.node_id:
            event = ASSIGNED_CONNECTED
        else:
            event = ASSIGNED_CONNECT
        self._groups[group.group_id] = group
        return self._group_event(group, event, now, assignment=message)

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

    # --- group transitions ------------------------------------------------------

    def _group_event(
        self,
        group: _Group,
        event: str,
        now: float,
        *,
        assignment: TreeAssignment | None = None,
        epoch_change: EpochChange | None = None,
        detail: str = "",
    ) -> list[Command]:
        """Apply one group-level event; one the table does not allow changes nothing."""
        if not GROUP_TABLE.allows(group.state, event):
            return []
        group.state = GROUP_TABLE.next(group.state, event)
        out: list[Command] = []
        if assignment is not None:
            out += self._adopt(group, assignment, event, now)
        elif event == PARENT_CONNECTED:
            group.parent_up = True
            group.retry_at = None
            out += self._flush_outbox(group)
        elif event == PARENT_LOST:
            group.parent_up = False
            if group.state is GroupState.CONNECTING:
                group.retry_at = now + self.config.retry_interval
                out += self._abort_all(group, ErrorCode.PEER_LOST, detail, None, now)
        elif event == PARENT_RETRY:
            out += self._connect_parent(group)
        elif epoch_change is not None:
            out += self._change_epoch(group, epoch_change, now)
        return out

    def _adopt(self, group: _Group, assignment: TreeAssignment, event: str, now: float) -> list[Command]:
        out: list[Command] = []
        if assignment.epoch > group.epoch or group.assignment is None:
            if group.slots or group.outbox:
                out += self._abort_all(group, ErrorCode.STALE_EPOCH, "superseded by a new epoch", None, now)
            self._forget_epoch(group)
        group.epoch = assignment.epoch
        group.assignment = assignment
        group.children = {c.node_id: ranks_from_bitmap(c.ranks) for c in assignment.children}
        group.expected = ranks_from_bitmap(assignment.expected)
        if event == ASSIGNED_ROOT:
            out += self._close_parent(group)
            out += self._flush_outbox(group)
        elif event == ASSIGNED_CONNECT:
            out += self._close_parent(group)
            out += self._connect_parent(group)
        out += self._release_pending(group, now)
        return out

    def _close_parent(self, group: _Group, why: str = "parent changed") -> list[Command]:
        peer, group.parent_peer = group.parent_peer, None
        group.parent_node = None
        group.parent_up = False
        group.retry_at = None
        if peer is None:
            return []
        self._parent_peers.pop(peer, None)
        return [ClosePeer(peer, ErrorCode.NO_ERROR, why)]

    def _connect_parent(self, group: _Group) -> list[Command]:
        assert group.assignment is not None and group.assignment.parent is not None
        parent = group.assignment.parent
        self._dials += 1
        peer = f"parent/{group.group_id.hex()}/{group.epoch}/{self._dials}"
        group.parent_peer = peer
        group.parent_node = parent.node_id
        self._parent_peers[peer] = group.group_id
        return [ConnectTo(peer, parent.address, parent.node_id)]

    def _change_epoch(self, group: _Group, change: EpochChange, now: float) -> list[Command]:
        lost = group.expected - ranks_from_bitmap(change.members)
        code = ErrorCode.PEER_LOST if change.code is ErrorCode.NO_ERROR else change.code
        out = self._abort_all(group, code, f"epoch changed to {change.epoch}", lost or None, now)
        group.epoch = change.epoch
        group.assignment = None
        group.retry_at = None
        self._forget_epoch(group)
        return out

    # --- data plane -------------------------------------------------------------

    def _on_data_message(self, peer: PeerId, message: Message, now: float) -> list[Command]:
        info = self._peers.get(peer)
        if isinstance(message, _REPORTS):
            return []  # liveness and reports need no answer; a Result is the acknowledgement
        if info is None:
            return [refuse(peer, message, ErrorCode.UNAUTHORIZED, "peer is not identified")]
        group = self._groups.get(getattr(message, "group_id", b""))
        if group is not None and group.parent_up and info.node_id == group.parent_node:
            # any connection authenticated as the parent node: a node may reach its
            # children over a connection they opened for another group
            if isinstance(message, _DOWN):
                return self._on_chunk_down(group, peer, message, now)
        elif isinstance(message, _UP_TYPES):
            return self._on_chunk_up(group, peer, info, message, now)
        where = "down from the parent" if isinstance(message, _UP_TYPES) else "up the tree"
        return [
            refuse(
                peer,
                message,
                ErrorCode.PROTOCOL_VIOLATION,
                f"{type(message).__name__} does not travel {where}",
            )
        ]

    def _on_chunk_up(
        self,
        group: _Group | None,
        peer: PeerId,
        info: _Peer,
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
            return [
                refuse(
                    peer,
                    message,
                    ErrorCode.UNAUTHORIZED,
                    f"node {info.node_id} is not a child in group {group.group_id.hex()}",
                )
            ]
        group.state = GROUP_TABLE.next(group.state, CHUNK_UP)
        self._node_peer[info.node_id] = peer
        if isinstance(message, Abort):
            missing = ranks_from_bitmap(message.missing) & ranks if message.missing is not None else None
            return self._abort_op(group, message.op_id, message.code, message.detail, missing, origin=peer)
        contributors = ranks_from_bitmap(message.contributors)
        if not contributors <= ranks:
            return [
                refuse(
                    peer,
                    message,
                    ErrorCode.UNAUTHORIZED,
                    f"node {info.node_id} may speak for ranks {ranks_text(ranks)} only, "
                    f"not {ranks_text(contributors - ranks)}",
                )
            ]
        if isinstance(message, BroadcastData):
            return self._on_broadcast_up(group, peer, message)
        assert group.assignment is not None
        problem = _layout_problem(message, group.assignment.params)
        if problem is not None:
            return [refuse(peer, message, ErrorCode.OPERATION_MISMATCH, problem)]
        return self._on_part(group, peer, info.node_id, message, contributors, now)

    def _on_broadcast_up(self, group: _Group, peer: PeerId, message: BroadcastData) -> list[Command]:
        if ranks_from_bitmap(message.contributors) != {message.root}:
            return [
                refuse(peer, message, ErrorCode.UNAUTHORIZED, "broadcast data must come from its root only")
            ]
        if group.assignment is not None and group.assignment.parent is not None:
            return self._send_up(group, message)
        return self._send_down(group, message)

    def _on_part(
        self,
        group: _Group,
        peer: PeerId,
        child: str,
        message: ChunkMessage,
        contributors: frozenset[int],
        now: float,
    ) -> list[Command]:
        key = (message.op_id, message.chunk_index)
        slot = group.slots.get(key) or group.record.get(key)
        if slot is None and message.op_id in group.aborted:
            return []  # the operation is over: a late part changes nothing
        if slot is None:
            if len(group.slots) >= group.window:
                return [
                    refuse(
                        peer,
                        message,
                        ErrorCode.RESOURCE_EXHAUSTED,
                        f"group {group.group_id.hex()} already has {len(group.slots)} open slots "
                        f"(window {group.window})",
                    )
                ]
            slot = self._open_slot(group, message, now)
            group.slots[key] = slot
        digest = fingerprint(message)
        if child in slot.fingerprints and (slot.fingerprints[child] == digest or digest in slot.more):
            event = RETRANSMISSION
        elif child in slot.fingerprints and not self._another_part(slot, contributors):
            event = CONFLICT
        elif slot.released:
            event = LATE_PART
        elif (slot.received | contributors) == slot.expected:
            event = LAST_PART
        else:
            event = PART
        if not SLOT_TABLE.allows(slot.state, event):
            return [
                refuse(
                    peer,
                    message,
                    ErrorCode.DUPLICATE_CONTRIBUTION,
                    f"op {message.op_id} chunk {message.chunk_index}: node {child} sent a different "
                    f"chunk in place of one already taken",
                )
            ]
        if event == LATE_PART:
            slot.state = SLOT_TABLE.next(slot.state, event)
            return self._late(group, key, slot, peer, child, message, digest)
        if event == RETRANSMISSION or slot.state is SlotState.ABORTED:
            slot.state = SLOT_TABLE.next(slot.state, event)
            result = group.results.get(key) if slot.state is SlotState.COMPLETE else None
            return [] if result is None else [SendMessage(peer, result)]
        try:
            if slot.aggregate is None:
                payload.check_part(message)  # kept as it is: checked now, not when the next part comes
                merged = message
            else:
                merged = payload.combine(
                    [slot.aggregate, message], _outgoing(group) if event == LAST_PART else _UP
                )
        except CcoError as error:
            if not slot.fingerprints:  # the slot this part opened holds nothing: close it again
                del group.slots[key]
            if error.code is ErrorCode.OPERATION_MISMATCH and slot.fingerprints:
                # the children disagree on what this operation is: it cannot complete, so
                # every rank learns why at once instead of waiting for its timeout
                detail = (
                    f"aggregator {self.node_id}: op {message.op_id} chunk {message.chunk_index}: "
                    f"ranks {ranks_text(contributors)} (via {child}) and ranks {ranks_text(slot.received)} "
                    f"called different operations ({error.detail})"
                )
                return self._abort_op(group, message.op_id, error.code, detail, None)
            return [refuse(peer, message, error.code, error.detail)]
        self._account(len(merged.payload) - (len(slot.aggregate.payload) if slot.aggregate else 0))
        slot.aggregate = merged
        self._note(slot, child, digest)
        slot.received |= contributors
        slot.state = SLOT_TABLE.next(slot.state, event)
        if event == PART:
            return self._release(group, key, slot) if self._releasable(group, slot) else []
        return self._complete(group, key, slot)

    @staticmethod
    def _another_part(slot: _Slot, contributors: frozenset[int]) -> bool:
        """A presence pass takes more than one part from a child: a child aggregator sends
        the ranks that came after its own wait as they come.  They are new ranks."""
        return slot.quorum is not None and not contributors & slot.received

    @staticmethod
    def _note(slot: _Slot, child: str, digest: bytes) -> None:
        if child in slot.fingerprints:
            slot.more.add(digest)
        else:
            slot.fingerprints[child] = digest

    def _late(
        self,
        group: _Group,
        key: SlotKey,
        slot: _Slot,
        peer: PeerId,
        child: str,
        message: ChunkMessage,
        digest: bytes,
    ) -> list[Command]:
        """A part of a presence pass that went on without it.  The root does not count
        it: the rank gets the Result without having contributed.  Below the root it goes
        up as it is, in case the root is still short of its quorum (a rank that was
        early at this node makes the others late here, not necessarily at the root)."""
        result = group.results.get(key)
        if result is not None:
            return [SendMessage(peer, result)]
        assert group.assignment is not None
        if group.assignment.parent is None:
            return []
        try:
            payload.check_part(message)
        except CcoError as error:
            return [refuse(peer, message, error.code, error.detail)]
        self._note(slot, child, digest)
        slot.received |= ranks_from_bitmap(message.contributors)
        return self._send_up(group, _retype(message, PartialAggregate))

    def _open_slot(self, group: _Group, message: ChunkMessage, now: float) -> _Slot:
        """A slot for the chunk ``message`` is the first part of: it waits for the ranks
        below this node that the operation runs over (``members``, when the chunk
        names them) and, for a presence pass, until its quorum wait ends."""
        expected = group.expected
        if message.members is not None:
            expected &= ranks_from_bitmap(message.members)
        slot = _Slot(opened=now, deadline=now + group.timeout, expected=expected)
        if message.quorum is not None and message.wait_ms is not None:
            slot.quorum = message.quorum
            slot.release_at = now + message.wait_ms / 1000
        return slot

    def _releasable(self, group: _Group, slot: _Slot) -> bool:
        """A presence pass whose wait is over goes on with the ranks it has: at once
        below the root; at the root once they are a quorum."""
        if slot.quorum is None or not slot.wait_over:
            return False
        assert group.assignment is not None
        return group.assignment.parent is not None or len(slot.received) >= slot.quorum

    def _release_due(self, group: _Group, now: float) -> list[Command]:
        """Release the presence passes whose wait is over.  A slot still missing a whole
        child aggregator waits once more as long: that child releases what its own
        ranks sent at the end of its wait, which began no earlier than this one."""
        out: list[Command] = []
        for key, slot in list(group.slots.items()):
            if slot.release_at is None or slot.release_at > now or slot.state is not SlotState.COLLECTING:
                continue
            if not slot.waited_longer and self._silent_aggregator_child(group, slot):
                slot.waited_longer = True
                slot.release_at = now + (slot.release_at - slot.opened)
                continue
            slot.wait_over, slot.release_at = True, None
            if self._releasable(group, slot):
                out += self._release(group, key, slot)
        return out

    def _release(self, group: _Group, key: SlotKey, slot: _Slot) -> list[Command]:
        slot.state = SLOT_TABLE.next(slot.state, WAIT_OVER)
        slot.released = True
        return self._complete(group, key, slot)

    def _complete(self, group: _Group, key: SlotKey, slot: _Slot) -> list[Command]:
        assert slot.aggregate is not None
        aggregate = slot.aggregate
        self._account(-len(aggregate.payload))
        slot.aggregate = None
        del group.slots[key]
        self._remember(group, key, slot)
        outgoing = _retype(aggregate, _outgoing(group))
        if isinstance(outgoing, Result):
            return self._send_down(group, outgoing)
        return self._send_up(group, outgoing)

    def _remember(self, group: _Group, key: SlotKey, slot: _Slot) -> None:
        group.record[key] = slot
        while len(group.record) > self.config.record_limit:
            group.record.popitem(last=False)

    def _on_chunk_down(
        self,
        group: _Group,
        peer: PeerId,
        message: Result | BroadcastData | Abort | RetransmitRequest,
        now: float,
    ) -> list[Command]:
        if not GROUP_TABLE.allows(group.state, CHUNK_DOWN):
            return [refuse(peer, message, ErrorCode.UNKNOWN_GROUP, "group is not assigned here")]
        group.state = GROUP_TABLE.next(group.state, CHUNK_DOWN)
        if group.assignment is None or message.epoch != group.epoch:
            return []  # an old epoch's traffic, already aborted locally
        if isinstance(message, Abort):
            missing = ranks_from_bitmap(message.missing) if message.missing is not None else None
            return self._abort_op(group, message.op_id, message.code, message.detail, missing, up=False)
        if isinstance(message, RetransmitRequest):
            return self._asked_again(group, message, now)
        return self._send_down(group, message)

    # --- retransmission ---------------------------------------------------------

    def _nudge(self, group: _Group, now: float) -> list[Command]:
        """At half the timeout, ask each child that has not sent a chunk to send it again.

        Sealing is deterministic, so what comes back is identical to anything that
        did arrive and is recognised as a retransmission; what was lost is replaced.
        """
        wanted: dict[tuple[str, int], list[int]] = {}
        for (op_id, index), slot in group.slots.items():
            if slot.nudged or slot.opened + group.timeout / 2 > now:
                continue
            slot.nudged = True
            slot.state = SLOT_TABLE.next(slot.state, HALF_TIMEOUT)
            for node_id in self._owing(group, slot):
                wanted.setdefault((node_id, op_id), []).append(index)
        return self._ask(group, wanted)

    def _asked_again(self, group: _Group, request: RetransmitRequest, now: float) -> list[Command]:
        """The parent lacks chunks: pass the request on to the children that can supply them.

        A chunk this node already completed is reopened: its children's copies, all
        identical, rebuild the identical aggregate, which goes up again.  A presence
        pass released at the end of its wait is not: what it sent up was the ranks in
        time, and every later one went up on its own.
        """
        wanted: dict[tuple[str, int], list[int]] = {}
        for index in request.chunks:
            key = (request.op_id, index)
            slot = group.slots.get(key) or group.record.get(key)
            if slot is None or slot.released or not SLOT_TABLE.allows(slot.state, ASKED_AGAIN):
                continue
            if slot.state is SlotState.COMPLETE:
                if len(group.slots) >= group.window:
                    continue
                del group.record[key]
                slot = _Slot(
                    opened=now, deadline=now + group.timeout, expected=slot.expected, state=SlotState.COMPLETE
                )
                group.slots[key] = slot
            slot.state = SLOT_TABLE.next(slot.state, ASKED_AGAIN)
            if slot.state is SlotState.COLLECTING:
                for node_id in self._owing(group, slot):
                    wanted.setdefault((node_id, request.op_id), []).append(index)
        return self._ask(group, wanted)

    def _ask(self, group: _Group, wanted: dict[tuple[str, int], list[int]]) -> list[Command]:
        out: list[Command] = []
        for (node_id, op_id), chunks in sorted(wanted.items()):
            peer = self._node_peer.get(node_id)
            if peer is None:
                continue
            for start in range(0, len(chunks), 4096):
                request = RetransmitRequest(
                    group_id=group.group_id,
                    epoch=group.epoch,
                    op_id=op_id,
                    chunks=tuple(sorted(chunks)[start : start + 4096]),
                    missing=bitmap_from_ranks(group.children[node_id]),
                )
                out.append(SendMessage(peer, request))
        return out

    # --- sending ----------------------------------------------------------------

    def _send_up(self, group: _Group, message: ChunkMessage | Abort) -> list[Command]:
        if group.parent_up and group.parent_peer is not None:
            return [SendMessage(group.parent_peer, message)]
        group.outbox.append(message)
        self._account(_payload_size(message))
        return []

    def _flush_outbox(self, group: _Group) -> list[Command]:
        queued, group.outbox = group.outbox, []
        self._account(-sum(_payload_size(m) for m in queued))
        if group.assignment is None or group.assignment.parent is None:
            # Now the root: what was waiting for a parent goes to the children instead.
            out: list[Command] = []
            for message in queued:
                if isinstance(message, PartialAggregate):
                    out += self._send_down(group, _retype(message, Result))
                elif isinstance(message, BroadcastData):
                    out += self._send_down(group, message)
            return out
        assert group.parent_peer is not None
        return [SendMessage(group.parent_peer, m) for m in queued]

    def _send_down(
        self, group: _Group, message: ChunkMessage | Abort, skip: PeerId | None = None
    ) -> list[Command]:
        """To every child; a child whose connection is not reported yet gets it on arrival.

        (A broadcast receiver sends nothing before data reaches it, so its connection
        may be reported after the first chunk for it; the hold is bounded like the
        pending queue.)  The last 2 x window Results are kept, for a child that sends
        its chunk again because its Result was lost (a connection that broke)."""
        if isinstance(message, Result):
            self._keep_result(group, message)
        out: list[Command] = []
        for node_id in group.children:
            peer = self._node_peer.get(node_id)
            if peer is None:
                held = self._unconnected.setdefault(node_id, deque())
                if len(held) < self.config.pending_limit:
                    held.append(_Pending(self._now, message))
                    self._pending_bytes += _payload_size(message)
            elif peer != skip:
                out.append(SendMessage(peer, message))
        return out

    def _keep_result(self, group: _Group, result: Result) -> None:
        key = (result.op_id, result.chunk_index)
        if key in group.results:
            return
        group.results[key] = result
        self._kept_bytes += len(result.payload)
        while len(group.results) > 2 * group.window:
            self._kept_bytes -= len(group.results.popitem(last=False)[1].payload)

    def _forget_epoch(self, group: _Group) -> None:
        """What this node remembers of the group's operations belongs to one epoch."""
        group.record.clear()
        group.aborted.clear()
        self._forget_results(group)

    def _forget_results(self, group: _Group, op_id: int | None = None) -> None:
        """Drop the kept Results of one operation (None: of every operation)."""
        for key in [k for k in group.results if op_id is None or k[0] == op_id]:
            self._kept_bytes -= len(group.results.pop(key).payload)

    # --- aborts -----------------------------------------------------------------

    def _abort_op(
        self,
        group: _Group,
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
        if op_id in group.aborted:
            return []
        group.aborted[op_id] = None
        self._forget_results(group, op_id)
        while len(group.aborted) > self.config.record_limit:
            group.aborted.popitem(last=False)
        for key in [k for k in group.slots if k[0] == op_id]:
            slot = group.slots.pop(key)
            slot.state = SLOT_TABLE.next(slot.state, ABORT)
            if slot.aggregate is not None:
                self._account(-len(slot.aggregate.payload))
                slot.aggregate = None
            self._remember(group, key, slot)
        for key, slot in group.record.items():
            if key[0] == op_id:
                slot.state = SLOT_TABLE.next(slot.state, ABORT)
        kept = [m for m in group.outbox if m.op_id != op_id]
        self._account(-sum(_payload_size(m) for m in group.outbox if m.op_id == op_id))
        group.outbox = kept
        abort = Abort(
            group_id=group.group_id,
            epoch=group.epoch,
            op_id=op_id,
            code=code,
            detail=clip(detail),
            missing=bitmap_from_ranks(missing) if missing else None,
        )
        out = self._send_down(group, abort, skip=origin)
        if up and group.assignment is not None and group.assignment.parent is not None:
            out += self._send_up(group, abort)
        return out

    def _abort_all(
        self, group: _Group, code: ErrorCode, detail: str, missing: frozenset[int] | None, now: float
    ) -> list[Command]:
        ops = sorted({k[0] for k in group.slots} | {m.op_id for m in group.outbox})
        out: list[Command] = []
        for op_id in ops:
            out += self._abort_op(group, op_id, code, detail, missing, up=False)
        return out

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

    # --- pending queue ----------------------------------------------------------

    def _park(self, peer: PeerId, message: ChunkMessage | Abort, now: float) -> list[Command]:
        queue = self._pending.setdefault(peer, deque())
        if len(queue) >= self.config.pending_limit:
            return [
                refuse(
                    peer,
                    message,
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"pending queue full ({self.config.pending_limit} messages) for group "
                    f"{message.group_id.hex()} epoch {message.epoch}",
                )
            ]
        queue.append(_Pending(now, message))
        self._pending_bytes += _payload_size(message)
        return []

    def _release_pending(self, group: _Group, now: float) -> list[Command]:
        out: list[Command] = []
        for peer, queue in list(self._pending.items()):
            mine: list[_Pending] = []
            rest: deque[_Pending] = deque()
            for entry in queue:
                ours = entry.message.group_id == group.group_id and entry.message.epoch <= group.epoch
                (mine if ours else rest).append(entry)
            if not mine:
                continue
            self._pending[peer] = rest
            self._pending_bytes -= sum(_payload_size(p.message) for p in mine)
            for entry in mine:
                out += self._on_data_message(peer, entry.message, now)
        return out

    def _expire_pending(self, now: float) -> list[Command]:
        out: list[Command] = []
        for peer, queue in self._pending.items():
            told: set[tuple[bytes, int, int]] = set()
            while queue and queue[0].arrived + self.config.pending_timeout <= now:
                message = queue.popleft().message
                self._pending_bytes -= _payload_size(message)
                op = (message.group_id, message.epoch, message.op_id)
                if op in told:
                    continue
                told.add(op)
                abort = Abort(
                    group_id=message.group_id,
                    epoch=message.epoch,
                    op_id=message.op_id,
                    code=ErrorCode.UNKNOWN_GROUP,
                    detail=f"no assignment for group {message.group_id.hex()} epoch {message.epoch} "
                    f"within {self.config.pending_timeout}s",
                )
                out.append(SendMessage(peer, abort))
        for node_id, held in list(self._unconnected.items()):
            while held and held[0].arrived + self.config.pending_timeout <= now:
                self._pending_bytes -= _payload_size(held.popleft().message)
            if not held:
                del self._unconnected[node_id]
        return out

    # --- timers -----------------------------------------------------------------

    def _on_timer(self, now: float) -> list[Command]:
        out: list[Command] = []
        if self._rendezvous is not None and self._heartbeat_interval:
            if now >= self._last_heard + 3 * self._heartbeat_interval:
                out += self._lose_rendezvous("no message for three heartbeat intervals", now)
            elif self._next_heartbeat is not None and now >= self._next_heartbeat:
                self._heartbeat_seq += 1
                out.append(SendMessage(self._rendezvous, Heartbeat(seq=self._heartbeat_seq)))
                self._next_heartbeat = now + self._heartbeat_interval
        if self._grace_until is not None and now >= self._grace_until:
            out += self._end_unconfirmed()
        out += self._expire_pending(now)
        for group in list(self._groups.values()):
            if group.retry_at is not None and group.retry_at <= now:
                group.retry_at = None
                out += self._group_event(group, PARENT_RETRY, now)
            out += self._release_due(group, now)
            out += self._nudge(group, now)
            out += self._expire_slots(group, now)
        return out

    def _expire_slots(self, group: _Group, now: float) -> list[Command]:
        """Abort operations with a slot open too long, naming the ranks that are missing.

        A slot that misses a whole child *aggregator* first waits half a timeout
        more: that child, which saw which of its own ranks are missing, times out
        first and its Abort names them; this node could only name all its ranks.
        """
        for slot in group.slots.values():
            if slot.deadline <= now and not slot.extended and self._silent_aggregator_child(group, slot):
                slot.extended = True
                slot.deadline = now + group.timeout / 2
        late = sorted({key[0] for key, slot in group.slots.items() if slot.deadline <= now})
        out: list[Command] = []
        for op_id in late:
            group.state = GROUP_TABLE.next(group.state, SLOT_TIMEOUT)
            open_slots = [(k, s) for k, s in group.slots.items() if k[0] == op_id]
            missing: set[int] = set()
            for _, slot in open_slots:
                missing |= slot.expected - slot.received
            chunks = sorted(k[1] for k, _ in open_slots)
            for _, slot in open_slots:
                slot.state = SLOT_TABLE.next(slot.state, TIMEOUT)
            detail = (
                f"aggregator {self.node_id}: group {group.group_id.hex()} op {op_id} chunks {chunks} "
                f"incomplete after {group.timeout:g}s; missing ranks {ranks_text(missing)}"
            )
            out += self._abort_op(group, op_id, ErrorCode.TIMEOUT, detail, frozenset(missing))
        return out

    def _owing(self, group: _Group, slot: _Slot) -> list[str]:
        """The children that have ranks the slot waits for and sent nothing for it."""
        return [
            node_id
            for node_id, ranks in group.children.items()
            if ranks & slot.expected and node_id not in slot.fingerprints
        ]

    def _silent_aggregator_child(self, group: _Group, slot: _Slot) -> bool:
        for node_id in self._owing(group, slot):
            peer = self._node_peer.get(node_id)
            if peer is not None and self._peers[peer].role is Role.AGGREGATOR:
                return True
        return False

    # --- accounting -------------------------------------------------------------

    def _account(self, delta: int) -> None:
        self._slot_bytes += delta
        self._peak_slot_bytes = max(self._peak_slot_bytes, self._slot_bytes)


_UP = PartialAggregate
_UP_TYPES = (Contribution, PartialAggregate, BroadcastData, Abort)
_DOWN = (Result, BroadcastData, Abort, RetransmitRequest)
_REPORTS = (Heartbeat, Error, ChunkAck)  # a tuple, not a union that every data message would build again


def _payload_size(message: Message) -> int:
    return len(message.payload) if isinstance(message, ChunkMessage) else 0


__all__ = ["AggregatorConfig", "AggregatorMachine", "fingerprint"]
