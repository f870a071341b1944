"""The rendezvous role as a sans-I/O state machine: groups, ranks, trees, keys, epochs.

Usage (the I/O layer, a test or ``cco.nodes.sim`` drives it the same way)::

    rv = RendezvousMachine(RendezvousConfig(groups={gid: GroupConfig(world_size=4, credential=b"pw")}))
    # or, after a restart: RendezvousMachine.restored(durable_state, now, config)
    cmds = rv.handle(PeerConnected(peer="p1", node_id="agg-1", role=Role.AGGREGATOR), now)
    cmds = rv.handle(MessageReceived(peer="p1", message=AggregatorRegister(...)), now)
    ...
    deadline = rv.next_deadline()          # call handle(TimerFired(), t) once t >= deadline

``handle`` returns :class:`~cco.nodes.events.SendMessage` and
:class:`~cco.nodes.events.ClosePeer` commands only; it never raises for peer input.
``status()`` returns a frozen snapshot for the CLI and for tests.  Options:
``RendezvousConfig.create_groups_on_join`` lets the first JoinRequest for an unknown
group id create it with the joiner's world size and credential; ``random_bytes``
(default ``os.urandom``) makes group secrets deterministic in tests.

What peers see (draft section "Membership, Trees and Epochs"):

* An aggregator sends AggregatorRegister and gets AggregatorAccept.  It receives a
  TreeAssignment for each group whose tree includes it, and an EpochChange for each
  group whose tree it was in when that tree ends.  It never receives key material.
* An endpoint sends JoinRequest and gets JoinAccept (rank, epoch ``E``, secret,
  params) or JoinReject.  While the group forms, the first tree arrives as
  TreeAssignment for epoch ``E`` and the members are all ranks.  Joining a group
  that already had a tree is a membership change: JoinAccept names the current
  epoch ``E`` and an EpochChange for ``E + 1`` with the members bitmap follows.
* Every later change (Leave, loss of a member, loss of an aggregator in the tree,
  a better tree after an aggregator arrives) sends EpochChange(new epoch, members,
  code) to the remaining members and to the old tree's aggregators, then new
  TreeAssignments, aggregators root first, then endpoints by rank.  An aggregator
  arriving re-plans every group, but only a group whose tree gets *better*
  (:meth:`~cco.nodes.tree.TreePlan.better_than`) changes epoch: in-flight
  operations are not failed for a tree that is merely different.  A group with
  no room for a tree waits (state WAITING) and gets its tree, in its current
  epoch, as soon as capacity appears.
* An aggregator's children may mix endpoints and aggregators (see
  :mod:`cco.nodes.tree`); an endpoint child's NodeRef carries
  :data:`~cco.nodes.tree.ENDPOINT_ADDRESS`.
* Heartbeat(seq) goes to every peer each interval and echoes the last seq received
  from it; a peer that sent nothing for three intervals is lost and closed.

Restart (draft section "Rendezvous Persistence and Restart"): :meth:`durable_state`
exports what must survive (groups with members, epochs, secrets, parameters and
trees; aggregator registrations) and ``durable_version`` moves whenever it changes,
never on heartbeats; the service saves it before it carries out the commands that
announce the change (:mod:`cco.services.store`).  :meth:`RendezvousMachine.restored`
builds a machine from it in which every member and aggregator is *away*: an away
member that sends its JoinRequest again gets JoinAccept with its rank, the epoch it
was last told of, the same secret and parameters, and nothing else unless the group
moved on meanwhile (then the EpochChange and TreeAssignment it missed); an away
aggregator that registers again as before gets AggregatorAccept and the current
epoch's TreeAssignment of every tree it is in.  Nothing is sent to an away node.
When the grace period (``RendezvousConfig.resume_grace``) ends, away aggregators are
lost (their trees re-planned), then away members (one EpochChange per group, code
PEER_LOST), exactly as if their connections had ended then.

Capabilities (draft section "Hello Exchange, Versions and Extensions"): what each
peer declared in Hello or HelloAck arrives with
:class:`~cco.nodes.events.PeerConnected`.  A group's chunk_elements in an epoch is
its configured value lowered to what every member accepts
(:func:`chunk_elements_limit`: its max_chunk_elements, and a chunk message of 8-byte
elements within its max_message_size); JoinAccept and TreeAssignment carry it.  An
aggregator is placed in a group's tree only if it accepts that chunk_elements too
and lists every dtype, op and collective that all the group's members list;
otherwise the group plans without it (or waits).  A join is refused with
MESSAGE_TOO_LARGE when even a one-element chunk message for the group's world size
exceeds the joiner's max_message_size.

Refusals: a message another role may send is answered with Error(UNAUTHORIZED); a
message not allowed in the peer's state, or one no peer may send to a rendezvous,
with Error(PROTOCOL_VIOLATION); both leave the connection open.  A malformed
message gets an Error with its decode code and the connection is closed.
"""

from __future__ import annotations

import contextlib
import hmac
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TypeVar

from cco.nodes.events import (
    ClosePeer,
    Command,
    Input,
    MessageMalformed,
    PeerConnected,
    PeerDisconnected,
    PeerId,
    SendMessage,
    TimerFired,
)
from cco.nodes.fsm import TransitionTable
from cco.nodes.rendezvous_states import (
    GROUP_TABLE,
    MEMBER_TABLE,
    PEER_TABLE,
    GroupState,
    MemberState,
    PeerState,
)
from cco.nodes.replies import clip
from cco.nodes.tree import AggregatorInfo, AggregatorPlacement, MemberInfo, TreePlan, plan_tree
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import (
    MAX_CHUNK_ELEMENTS,
    Address,
    AggregatorAccept,
    AggregatorRegister,
    Capabilities,
    EpochChange,
    Error,
    GroupParams,
    Heartbeat,
    JoinAccept,
    JoinReject,
    JoinRequest,
    Leave,
    Message,
    TreeAssignment,
)
from cco.wire.registries import (
    GROUP_ID_SIZE,
    GROUP_SECRET_SIZE,
    MAX_WORLD_SIZE,
    Collective,
    DType,
    ReduceOp,
    Role,
)

S = TypeVar("S", bound=Enum)

LOSS_INTERVALS = 3
"""A peer from which nothing arrived for this many heartbeat intervals is lost."""

DEFAULT_PARAMS = GroupParams(
    chunk_elements=32768, window=3, heartbeat_interval_ms=1000, operation_timeout_ms=30_000
)
"""Chunks of 32768 elements, 3 in flight per rank: 384 KiB of float32, less than what
a switch port or a 100 ms queue at 20 Mbit/s holds, so the window itself does not
overflow the queue it crosses.  On the namespace testbed it beat 65536 x 8 (2 MiB)
on every link tried, and 32768 x 4 at N = 8 on 20 Mbit/s links (no drops down
instead of hundreds), equal elsewhere (BENCHMARKS.md, "Chunk size and window").
Links much faster than these are better served by larger chunks (each costs every
node a fixed amount of CPU): with 131072, 64 MiB took 3.4 s over loopback against
5.1 to 5.5 s.

Operation timeout 30 s: it bounds a slot at an aggregator and, at an endpoint, the
time without progress of an operation (a watchdog that every completed chunk moves
on), not the whole operation, so that the largest collective on the slowest link
(64 MiB of float32 over 40 Mbit/s at MTU 1500: measured 73 to 127 s here on aioquic,
15 s on qh3) completes, while a stalled one fails within 30 s naming the missing
ranks."""
DEFAULT_FAN_IN = 16
RESUME_REDIAL_GAP = 9.0
"""Seconds of the default grace period after a restart beyond the peers' own loss
detection: the default is ``LOSS_INTERVALS`` heartbeat intervals plus this, 12 s at
the default interval of 1 s.  Why: a peer notices a silent rendezvous after
:data:`LOSS_INTERVALS` intervals (which matters when the restart is quicker than
that) and then dials it again, each attempt lasting up to 10 s, with pauses of 1 s,
2 s, 4 s, 8 s ... between attempts (:class:`cco.services.node.Redialer`).  An
attempt under way when the new process starts completes at QUIC's next
retransmission of its Initial (seconds apart at most); one in a pause starts when
the pause ends.  Within the 60 s for which endpoints and aggregators keep a group
without a rendezvous (their ``rendezvous_grace``), no pause is longer than 8 s, so
every live peer is back within about 8 s plus a handshake of the restart: 9 s covers
that.  A longer grace would only delay the re-planning of groups that lost a member
or an aggregator during the outage."""
FALLBACK_LABEL = "cco:fallback"
"""The label an aggregator run by an end host registers with: planned only when the
dedicated aggregators cannot hold a group, and replaced as soon as they can."""


# --- configuration -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """A group the rendezvous knows before anyone joins; ``None`` means the default."""

    world_size: int
    credential: bytes
    params: GroupParams | None = None
    max_fan_in: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.world_size <= MAX_WORLD_SIZE:
            raise ValueError(f"world_size {self.world_size} is outside 1..{MAX_WORLD_SIZE}")
        if self.max_fan_in is not None and self.max_fan_in < 2:
            raise ValueError("a fan-in bound must be at least 2")


@dataclass(frozen=True, slots=True)
class RendezvousConfig:
    """``params.heartbeat_interval_ms`` is also the rendezvous's own heartbeat interval.

    ``resume_grace_ms`` is how long a restored machine (:meth:`RendezvousMachine.restored`)
    waits for its away members and aggregators to come back; None means
    ``LOSS_INTERVALS`` heartbeat intervals plus :data:`RESUME_REDIAL_GAP` (see there
    for why).
    """

    groups: Mapping[bytes, GroupConfig] = field(default_factory=dict)
    create_groups_on_join: bool = False
    params: GroupParams = DEFAULT_PARAMS
    max_fan_in: int = DEFAULT_FAN_IN
    resume_grace_ms: int | None = None

    def __post_init__(self) -> None:
        if self.max_fan_in < 2:
            raise ValueError("a fan-in bound must be at least 2")
        if any(len(group_id) != GROUP_ID_SIZE for group_id in self.groups):
            raise ValueError(f"group ids are {GROUP_ID_SIZE} bytes")
        if self.resume_grace_ms is not None and self.resume_grace_ms < 0:
            raise ValueError("resume_grace_ms must not be negative")

    @property
    def resume_grace(self) -> float:
        """The grace period after a restart, in seconds."""
        if self.resume_grace_ms is not None:
            return self.resume_grace_ms / 1000.0
        return LOSS_INTERVALS * self.params.heartbeat_interval_ms / 1000.0 + RESUME_REDIAL_GAP


MAY_SEND: dict[Role, frozenset[type[Message]]] = {
    Role.ENDPOINT: frozenset({JoinRequest, Leave, Heartbeat, Error}),
    Role.AGGREGATOR: frozenset({AggregatorRegister, Heartbeat, Error}),
}
"""What each role may send to a rendezvous; another role's message is UNAUTHORIZED."""


def _move(table: TransitionTable[S], state: S, event: str) -> S:
    """An internal transition: a refusal here is a bug in this module, not peer input."""
    if not table.allows(state, event):
        raise RuntimeError(f"{table.name}: {event} in {state.name} is not in the table")
    return table.next(state, event)


CHUNK_HEADER_BOUND = 256
"""Bytes of a chunk message beyond its payload, scales and contributors bitmap, at
most (every other field at its largest); a test checks it against the codec."""


def chunk_elements_limit(capabilities: Capabilities | None, world_size: int, block_elements: int) -> int:
    """The largest chunk_elements a node with ``capabilities`` accepts in a group of
    ``world_size``: at most its max_chunk_elements, and small enough that a chunk
    message of 8-byte elements fits its max_message_size, counting for each block of
    ``block_elements`` its attestation (8 bytes) and scale (2 bytes), as a
    block-scaled chunk carries them.  Below 1: no chunk fits."""
    if capabilities is None:
        return MAX_CHUNK_ELEMENTS
    room = capabilities.max_message_size - CHUNK_HEADER_BOUND - (world_size + 7) // 8
    full_blocks, rest = divmod(room, 8 * block_elements + 10)
    partial = max(0, (rest - 10) // 8)  # below block_elements, as rest < 8 * block_elements + 10
    return min(capabilities.max_chunk_elements, full_blocks * block_elements + partial)


@dataclass(frozen=True, slots=True)
class Needs:
    """What a group's tree must handle: the dtypes, ops and collectives every member lists."""

    dtypes: frozenset[DType]
    ops: frozenset[ReduceOp]
    collectives: frozenset[Collective]

    def met_by(self, capabilities: Capabilities | None) -> bool:
        return capabilities is None or (
            self.dtypes <= set(capabilities.dtypes)
            and self.ops <= set(capabilities.ops)
            and self.collectives <= set(capabilities.collectives)
        )


# --- status snapshot ---------------------------------------------------------------


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


# --- durable state -----------------------------------------------------------------


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
    EpochChange that opened the current epoch (NO_ERROR for the first)."""

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


@dataclass(frozen=True, slots=True)
class DurableAggregator:
    """An aggregator registration with the capabilities its connection declared."""

    info: AggregatorInfo
    capabilities: Capabilities | None


@dataclass(frozen=True, slots=True)
class DurableState:
    """Everything a rendezvous must keep across a restart (draft section "Rendezvous
    Persistence and Restart"): groups with members, epochs, secrets and trees, and
    aggregator registrations.  Connections, heartbeats and timers are not in it."""

    groups: tuple[DurableGroup, ...] = ()
    aggregators: tuple[DurableAggregator, ...] = ()


# --- records -----------------------------------------------------------------------


@dataclass(slots=True)
class _Peer:
    peer: PeerId
    node_id: str
    role: Role
    state: PeerState
    last_heard: float
    next_heartbeat: float
    capabilities: Capabilities | None = None
    echo_seq: int = 0
    groups: set[bytes] = field(default_factory=set)


@dataclass(slots=True)
class _Member:
    """``peer`` is None while the member is away (restored, not joined again)."""

    rank: int
    node_id: str
    peer: PeerId | None
    labels: tuple[str, ...]
    capabilities: Capabilities | None = None
    state: MemberState = MemberState.JOINED
    epoch: int = 0


@dataclass(slots=True)
class _Group:
    group_id: bytes
    world_size: int
    credential: bytes
    params: GroupParams
    max_fan_in: int
    secret: bytes
    epoch: int
    state: GroupState = GroupState.FORMING
    members: dict[int, _Member] = field(default_factory=dict)
    plan: TreePlan | None = None
    change_code: ErrorCode = ErrorCode.NO_ERROR

    def members_bitmap(self) -> bytes:
        return bitmap_from_ranks(set(self.members))

    def current_params(self) -> GroupParams:
        """The configured parameters, chunk_elements lowered to what every member accepts."""
        limit = min(
            (
                chunk_elements_limit(m.capabilities, self.world_size, self.params.block_elements)
                for m in self.members.values()
            ),
            default=MAX_CHUNK_ELEMENTS,
        )
        if self.params.chunk_elements <= limit:
            return self.params
        return replace(self.params, chunk_elements=limit)

    def needs(self) -> Needs:
        dtypes, ops, collectives = set(DType), set(ReduceOp), set(Collective)
        for member in self.members.values():
            if member.capabilities is not None:
                dtypes &= set(member.capabilities.dtypes)
                ops &= set(member.capabilities.ops)
                collectives &= set(member.capabilities.collectives)
        return Needs(frozenset(dtypes), frozenset(ops), frozenset(collectives))


class RendezvousMachine:
    """The rendezvous: see the module docstring for what it sends and when."""

    def __init__(
        self, config: RendezvousConfig | None = None, *, random_bytes: Callable[[int], bytes] = os.urandom
    ) -> None:
        self.config = config or RendezvousConfig()
        self._random = random_bytes
        self._interval = self.config.params.heartbeat_interval_ms / 1000.0
        self._peers: dict[PeerId, _Peer] = {}
        self._node_peers: dict[str, PeerId] = {}
        self._aggregators: dict[str, AggregatorInfo] = {}
        self._aggregator_capabilities: dict[str, Capabilities | None] = {}
        self._away_aggregators: set[str] = set()
        self._grace_ends: float | None = None
        self._version = 0
        self._groups: dict[bytes, _Group] = {}
        for group_id, cfg in sorted(self.config.groups.items()):
            self._groups[group_id] = self._new_group(group_id, cfg.world_size, cfg.credential, epoch=1)

    @classmethod
    def restored(
        cls,
        state: DurableState,
        now: float,
        config: RendezvousConfig | None = None,
        *,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> RendezvousMachine:
        """A machine that carries on from ``state`` (what :meth:`durable_state` returned
        before a restart) at time ``now``.

        Groups come back as they were, but every member and every aggregator is away
        until it joins or registers again; the grace period
        (``config.resume_grace``) starts at ``now``.  A group of ``config`` that is in
        ``state`` comes back as stored (its epoch and secret are what the members
        hold).  Raises ValueError for a state no machine could have exported.
        """
        machine = cls(config, random_bytes=random_bytes)
        machine._load(state)
        if any(g.members for g in state.groups) or state.aggregators:
            machine._grace_ends = now + machine.config.resume_grace
        return machine

    # --- driving interface ------------------------------------------------------

    def handle(self, event: Input, now: float) -> list[Command]:
        """Process one input at time ``now`` (seconds); returns what to send or close."""
        out: list[Command] = []
        if self._grace_ends is not None and now >= self._grace_ends:
            self._end_grace(out)
        if isinstance(event, PeerConnected):
            self._connected(event, now, out)
        elif isinstance(event, TimerFired):
            self._timers(now, out)
        elif event.peer not in self._peers:
            pass  # late input for a connection this machine already closed
        elif isinstance(event, PeerDisconnected):
            self._gone(self._peers[event.peer], "disconnected", ErrorCode.PEER_LOST, out)
        elif isinstance(event, MessageMalformed):
            peer = self._peers[event.peer]
            out.append(SendMessage(peer.peer, Error(code=event.error.code, detail=clip(event.error.detail))))
            out.append(ClosePeer(peer.peer, event.error.code, "malformed message"))
            self._gone(peer, "malformed", ErrorCode.PEER_LOST, out)
        else:
            peer = self._peers[event.peer]
            peer.last_heard = now
            try:
                event.message.to_map()  # field ranges: the codec checked them, a direct caller may not
                self._message(peer, event.message, out)
            except CcoError as exc:
                error = Error(code=exc.code, detail=clip(exc.detail), message_type=int(event.message.TYPE))
                out.append(SendMessage(peer.peer, error))
        return out

    def next_deadline(self) -> float | None:
        """The earliest heartbeat to send, loss to declare or end of the grace period
        after a restart; None when there is none of them."""
        times = [min(p.next_heartbeat, p.last_heard + self._loss_after(p)) for p in self._peers.values()]
        if self._grace_ends is not None:
            times.append(self._grace_ends)
        return min(times, default=None)

    @property
    def durable_version(self) -> int:
        """A counter that moves whenever :meth:`durable_state` would return something
        new (never on heartbeats): the service saves the state when it moved, before
        it carries out the commands that announce the change."""
        return self._version

    def durable_state(self) -> DurableState:
        """What a restart must find (see :class:`DurableState`)."""
        groups = tuple(
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
            )
            for _, g in sorted(self._groups.items())
        )
        aggregators = tuple(
            DurableAggregator(info, self._aggregator_capabilities.get(node_id))
            for node_id, info in sorted(self._aggregators.items())
        )
        return DurableState(groups=groups, aggregators=aggregators)

    def status(self) -> RendezvousStatus:
        """A frozen snapshot of groups, members, aggregators and epochs."""
        groups = tuple(
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
            )
            for _, g in sorted(self._groups.items())
        )
        aggregators = tuple(
            AggregatorStatus(
                node_id=a.node_id,
                address=a.address,
                capacity=a.capacity,
                max_fan_in=a.max_fan_in,
                labels=a.labels,
                groups=tuple(g.group_id for g in groups if g.tree and a.node_id in g.tree.aggregator_ids),
                connected=a.node_id not in self._away_aggregators,
            )
            for _, a in sorted(self._aggregators.items())
        )
        return RendezvousStatus(
            groups=groups, aggregators=aggregators, peers=len(self._peers), grace_ends=self._grace_ends
        )

    # --- restart ----------------------------------------------------------------

    def _load(self, state: DurableState) -> None:
        for stored in state.aggregators:
            node_id = stored.info.node_id
            if node_id in self._aggregators:
                raise ValueError(f"aggregator {node_id} is registered twice")
            self._aggregators[node_id] = stored.info
            self._aggregator_capabilities[node_id] = stored.capabilities
            self._away_aggregators.add(node_id)
        seen: set[bytes] = set()
        for g in state.groups:
            if len(g.group_id) != GROUP_ID_SIZE or g.group_id in seen:
                raise ValueError(f"group id {g.group_id.hex()} is not {GROUP_ID_SIZE} bytes or not unique")
            seen.add(g.group_id)
            if g.state is GroupState.PLANNING or len(g.secret) != GROUP_SECRET_SIZE:
                raise ValueError(
                    f"group {g.group_id.hex()}: state {g.state.name} or its secret is not restorable"
                )
            ranks = [m.rank for m in g.members]
            if len(set(ranks)) != len(ranks) or any(not 0 <= r < g.world_size for r in ranks):
                raise ValueError(
                    f"group {g.group_id.hex()}: member ranks {ranks} for world_size {g.world_size}"
                )
            if g.plan is not None and not g.plan.aggregator_ids <= set(self._aggregators):
                raise ValueError(f"group {g.group_id.hex()}: its tree names an aggregator not registered")
            self._groups[g.group_id] = _Group(
                group_id=g.group_id,
                world_size=g.world_size,
                credential=g.credential,
                params=g.params,
                max_fan_in=g.max_fan_in,
                secret=g.secret,
                epoch=g.epoch,
                state=g.state,
                members={
                    m.rank: _Member(m.rank, m.node_id, None, m.labels, m.capabilities, m.state, m.epoch)
                    for m in g.members
                },
                plan=g.plan,
                change_code=g.change_code,
            )

    def _end_grace(self, out: list[Command]) -> None:
        """The grace period after a restart is over: whoever is still away is lost,
        as if its connection had ended now (aggregators first, so that members are
        re-planned onto aggregators that are really there)."""
        self._grace_ends = None
        lost_aggregators = sorted(self._away_aggregators)
        self._away_aggregators.clear()
        for node_id in lost_aggregators:
            del self._aggregators[node_id]
            del self._aggregator_capabilities[node_id]
        for node_id in lost_aggregators:
            self._aggregators_changed(out, lost=node_id)
        for _, group in sorted(self._groups.items()):
            away = [rank for rank, m in sorted(group.members.items()) if m.peer is None]
            if away:
                self._remove_members(group, away, "lost", ErrorCode.PEER_LOST, out)
        self._retry_waiting(out)
        self._changed()

    def _changed(self) -> None:
        self._version += 1

    # --- connections and liveness -----------------------------------------------

    def _connected(self, event: PeerConnected, now: float, out: list[Command]) -> None:
        if event.peer in self._peers:
            return  # the I/O layer reported the same connection twice
        if event.role not in MAY_SEND:
            out.append(
                ClosePeer(event.peer, ErrorCode.UNAUTHORIZED, f"role {event.role.name} has no business here")
            )
            return
        if event.node_id in self._node_peers:
            # an Error first: the refused node learns why and does not try again blindly
            detail = f"{event.node_id} is already connected"
            out.append(SendMessage(event.peer, Error(code=ErrorCode.UNAUTHORIZED, detail=detail)))
            out.append(ClosePeer(event.peer, ErrorCode.UNAUTHORIZED, detail))
            return
        state = PeerState.ENDPOINT if event.role is Role.ENDPOINT else PeerState.REGISTERING
        self._peers[event.peer] = _Peer(
            event.peer,
            event.node_id,
            event.role,
            state,
            last_heard=now,
            next_heartbeat=now + self._interval,
            capabilities=event.capabilities,
        )
        self._node_peers[event.node_id] = event.peer

    def _loss_after(self, peer: _Peer) -> float:
        intervals = [
            self._interval,
            *(self._groups[g].params.heartbeat_interval_ms / 1000.0 for g in peer.groups),
        ]
        return LOSS_INTERVALS * max(intervals)

    def _timers(self, now: float, out: list[Command]) -> None:
        for peer in sorted(self._peers.values(), key=lambda p: p.peer):
            if now >= peer.last_heard + self._loss_after(peer):
                out.append(ClosePeer(peer.peer, ErrorCode.PEER_LOST, "no message for 3 heartbeat intervals"))
                self._gone(peer, "heartbeat_timeout", ErrorCode.PEER_LOST, out)
            elif now >= peer.next_heartbeat:
                out.append(SendMessage(peer.peer, Heartbeat(seq=peer.echo_seq)))
                peer.next_heartbeat = now + self._interval

    def _gone(self, peer: _Peer, event: str, code: ErrorCode, out: list[Command]) -> None:
        """The connection ended: its memberships or its aggregator go with it."""
        peer.state = _move(PEER_TABLE, peer.state, event)
        del self._peers[peer.peer]
        del self._node_peers[peer.node_id]
        for group_id in sorted(peer.groups):
            group = self._groups[group_id]
            (rank,) = [r for r, m in group.members.items() if m.peer == peer.peer]
            self._remove_member(group, rank, "lost", code, out)
        if peer.node_id not in self._away_aggregators and peer.node_id in self._aggregators:
            del self._aggregators[peer.node_id]
            del self._aggregator_capabilities[peer.node_id]
            self._changed()
            self._aggregators_changed(out, lost=peer.node_id)
        else:
            self._retry_waiting(out)

    # --- messages ---------------------------------------------------------------

    def _message(self, peer: _Peer, message: Message, out: list[Command]) -> None:
        kind = type(message)
        if kind not in MAY_SEND[peer.role] and any(kind in allowed for allowed in MAY_SEND.values()):
            raise CcoError(ErrorCode.UNAUTHORIZED, f"role {peer.role.name} may not send {kind.__name__}")
        next_state = PEER_TABLE.next(peer.state, kind.__name__)
        if isinstance(message, Heartbeat):
            peer.echo_seq = message.seq
        elif isinstance(message, JoinRequest):
            self._join(peer, message, out)
        elif isinstance(message, Leave):
            self._leave(peer, message, out)
        elif isinstance(message, AggregatorRegister):
            self._register(peer, message, out)
        peer.state = next_state

    def _register(self, peer: _Peer, message: AggregatorRegister, out: list[Command]) -> None:
        node_id = peer.node_id
        info = AggregatorInfo(
            node_id=node_id,
            address=message.address,
            capacity=message.capacity,
            max_fan_in=message.max_fan_in,
            labels=message.labels,
        )
        accept = AggregatorAccept(
            node_id=node_id, heartbeat_interval_ms=self.config.params.heartbeat_interval_ms
        )
        if node_id in self._away_aggregators:
            self._away_aggregators.discard(node_id)
            if (
                info == self._aggregators[node_id]
                and peer.capabilities == self._aggregator_capabilities[node_id]
            ):
                # a restored registration is back: its trees are what it had
                out.append(SendMessage(peer.peer, accept))
                for _, group in sorted(self._groups.items()):
                    if group.plan is not None and node_id in group.plan.aggregator_ids:
                        placement = group.plan.placement(node_id)
                        out.append(SendMessage(peer.peer, self._aggregator_assignment(group, placement)))
                return
            # registered differently (another address, capacity...): the old one is lost
            del self._aggregators[node_id]
            del self._aggregator_capabilities[node_id]
            self._aggregators_changed(out, lost=node_id)
        self._aggregators[node_id] = info
        self._aggregator_capabilities[node_id] = peer.capabilities
        self._changed()
        out.append(SendMessage(peer.peer, accept))
        self._aggregators_changed(out, lost=None)

    def _join(self, peer: _Peer, request: JoinRequest, out: list[Command]) -> None:
        group = self._groups.get(request.group_id)
        if group is not None:
            away = [m for m in group.members.values() if m.node_id == peer.node_id and m.peer is None]
            if away:
                self._resume(group, away[0], peer, request, out)
                return
        try:
            if group is None:
                if not self.config.create_groups_on_join:
                    raise CcoError(ErrorCode.UNKNOWN_GROUP, "no such group")
                group = self._new_group(request.group_id, request.world_size, request.credential, epoch=1)
            elif group.state is GroupState.CLOSED and request.group_id not in self.config.groups:
                group.world_size, group.credential = request.world_size, request.credential
                self._changed()
            self._check_join(group, peer, request)
        except CcoError as exc:
            out.append(
                SendMessage(
                    peer.peer, JoinReject(group_id=request.group_id, code=exc.code, detail=exc.detail)
                )
            )
            return
        self._groups.setdefault(group.group_id, group)  # a group created by this join exists from now on
        if group.state is GroupState.CLOSED:
            group.state = _move(GROUP_TABLE, group.state, "reopen")
            group.epoch += 1
            group.secret = self._secret()
            group.change_code = ErrorCode.NO_ERROR
        free = [r for r in range(group.world_size) if r not in group.members]
        rank = request.rank if request.rank is not None else free[0]
        member = _Member(rank, peer.node_id, peer.peer, request.labels, peer.capabilities, epoch=group.epoch)
        group.members[rank] = member
        peer.groups.add(group.group_id)
        self._changed()
        accept = JoinAccept(
            group_id=group.group_id,
            rank=rank,
            world_size=group.world_size,
            epoch=group.epoch,
            group_secret=group.secret,
            params=group.current_params(),
        )
        out.append(SendMessage(peer.peer, accept))
        self._membership_changed(group, "join", ErrorCode.NO_ERROR, out)
        self._retry_waiting(out)

    def _resume(
        self, group: _Group, member: _Member, peer: _Peer, request: JoinRequest, out: list[Command]
    ) -> None:
        """An away member of a restored group joins again: it gets its own rank, the
        epoch it was last told of, the same secret and parameters; and only if the
        group moved on while it was away, the EpochChange and TreeAssignment it missed."""
        try:
            self._check_credentials(group, request)
            if request.rank is not None and request.rank != member.rank:
                raise CcoError(
                    ErrorCode.RANK_UNAVAILABLE, f"{peer.node_id} is rank {member.rank}, not {request.rank}"
                )
            self._check_message_size(group, peer)
        except CcoError as exc:
            out.append(
                SendMessage(peer.peer, JoinReject(group_id=group.group_id, code=exc.code, detail=exc.detail))
            )
            return
        if member.capabilities != peer.capabilities:
            member.capabilities = peer.capabilities
            self._changed()
        member.peer = peer.peer
        peer.groups.add(group.group_id)
        accept = JoinAccept(
            group_id=group.group_id,
            rank=member.rank,
            world_size=group.world_size,
            epoch=member.epoch,
            group_secret=group.secret,
            params=group.current_params(),
        )
        out.append(SendMessage(peer.peer, accept))
        if member.epoch != group.epoch:
            change = EpochChange(
                group_id=group.group_id,
                epoch=group.epoch,
                members=group.members_bitmap(),
                code=group.change_code,
            )
            out.append(SendMessage(peer.peer, change))
            member.epoch = group.epoch
            self._changed()
        if group.plan is not None and member.state is MemberState.JOINED:
            out.append(SendMessage(peer.peer, self._endpoint_assignment(group, member.rank)))
            member.state = _move(MEMBER_TABLE, member.state, "assigned")
            self._changed()

    def _check_credentials(self, group: _Group, request: JoinRequest) -> None:
        if not hmac.compare_digest(group.credential, request.credential):
            raise CcoError(ErrorCode.BAD_CREDENTIAL, "credential does not match the group's")
        if request.world_size != group.world_size:
            raise CcoError(
                ErrorCode.WORLD_SIZE_MISMATCH,
                f"group has world_size {group.world_size}, not {request.world_size}",
            )

    def _check_message_size(self, group: _Group, peer: _Peer) -> None:
        if chunk_elements_limit(peer.capabilities, group.world_size, group.params.block_elements) < 1:
            assert peer.capabilities is not None
            raise CcoError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"a chunk message for world_size {group.world_size} exceeds max_message_size "
                f"{peer.capabilities.max_message_size}",
            )

    def _check_join(self, group: _Group, peer: _Peer, request: JoinRequest) -> None:
        self._check_credentials(group, request)
        if group.group_id in peer.groups:
            raise CcoError(ErrorCode.PROTOCOL_VIOLATION, f"{peer.node_id} is already a member")
        if len(group.members) >= group.world_size:
            raise CcoError(ErrorCode.GROUP_FULL, f"all {group.world_size} ranks are taken")
        if request.rank is not None and (request.rank in group.members or request.rank >= group.world_size):
            raise CcoError(ErrorCode.RANK_UNAVAILABLE, f"rank {request.rank} is taken")
        self._check_message_size(group, peer)

    def _leave(self, peer: _Peer, message: Leave, out: list[Command]) -> None:
        group = self._groups.get(message.group_id)
        if group is None:
            raise CcoError(ErrorCode.UNKNOWN_GROUP, "no such group")
        member = group.members.get(message.rank)
        if member is None or member.peer != peer.peer:
            raise CcoError(ErrorCode.NOT_A_MEMBER, f"{peer.node_id} is not rank {message.rank}")
        self._remove_member(group, message.rank, "leave", message.code, out)
        self._retry_waiting(out)

    # --- groups, epochs and trees ----------------------------------------------

    def _new_group(self, group_id: bytes, world_size: int, credential: bytes, epoch: int) -> _Group:
        cfg = self.config.groups.get(group_id)
        return _Group(
            group_id=group_id,
            world_size=world_size,
            credential=credential,
            params=cfg.params if cfg and cfg.params else self.config.params,
            max_fan_in=cfg.max_fan_in if cfg and cfg.max_fan_in else self.config.max_fan_in,
            secret=self._secret(),
            epoch=epoch,
        )

    def _secret(self) -> bytes:
        secret = self._random(GROUP_SECRET_SIZE)
        if len(secret) != GROUP_SECRET_SIZE:
            raise ValueError(f"random source returned {len(secret)} bytes, not {GROUP_SECRET_SIZE}")
        return secret

    def _remove_member(
        self, group: _Group, rank: int, event: str, code: ErrorCode, out: list[Command]
    ) -> None:
        self._remove_members(group, [rank], event, code, out)

    def _remove_members(
        self, group: _Group, ranks: list[int], event: str, code: ErrorCode, out: list[Command]
    ) -> None:
        """Members gone at once: one membership change (one epoch) for all of them."""
        for rank in ranks:
            member = group.members.pop(rank)
            member.state = _move(MEMBER_TABLE, member.state, event)
            peer = self._peers.get(member.peer) if member.peer is not None else None
            if peer is not None:
                peer.groups.discard(group.group_id)
        self._changed()
        self._membership_changed(group, event, code, out)

    def _membership_changed(self, group: _Group, event: str, code: ErrorCode, out: list[Command]) -> None:
        if group.state is GroupState.FORMING:
            group.state = _move(GROUP_TABLE, group.state, event)
            if not group.members:
                group.state = _move(GROUP_TABLE, group.state, "empty")
            elif len(group.members) == group.world_size:
                group.state = _move(GROUP_TABLE, group.state, "complete")
                self._plan(group, out)
            return
        if not group.members:
            group.state = _move(GROUP_TABLE, group.state, "empty")
            self._end_epoch(group, code, out)
            return
        group.state = _move(GROUP_TABLE, group.state, event)
        self._end_epoch(group, code, out)
        self._plan(group, out)

    def _end_epoch(self, group: _Group, code: ErrorCode, out: list[Command]) -> None:
        """Advance the epoch and tell the members and the old tree's aggregators
        (those connected: an away member hears of it when it joins again)."""
        group.epoch += 1
        group.change_code = code
        self._changed()
        change = EpochChange(
            group_id=group.group_id, epoch=group.epoch, members=group.members_bitmap(), code=code
        )
        for _, member in sorted(group.members.items()):
            if member.peer is not None:
                out.append(SendMessage(member.peer, change))
                member.epoch = group.epoch
            member.state = _move(MEMBER_TABLE, member.state, "new_epoch")
        if group.plan is not None:
            for placement in group.plan.aggregators:
                peer = self._aggregator_peer(placement.node_id)
                if peer is not None:
                    out.append(SendMessage(peer, change))
        group.plan = None

    def _aggregator_peer(self, node_id: str) -> PeerId | None:
        """The connection of a registered aggregator; None if it is away or gone."""
        if node_id not in self._aggregators or node_id in self._away_aggregators:
            return None
        return self._node_peers[node_id]

    def _pool(self, group: _Group) -> list[AggregatorInfo]:
        """Registered aggregators able to serve ``group``, with the capacity left for it."""
        params, needs = group.current_params(), group.needs()
        used: dict[str, int] = {}
        for other in self._groups.values():
            if other is not group and other.plan is not None:
                for node_id in other.plan.aggregator_ids:
                    used[node_id] = used.get(node_id, 0) + 1
        pool = []
        for node_id, info in sorted(self._aggregators.items()):
            capabilities = self._aggregator_capabilities[node_id]
            limit = chunk_elements_limit(capabilities, group.world_size, params.block_elements)
            if limit < params.chunk_elements:
                continue
            if not needs.met_by(capabilities):
                continue
            spare = info.capacity - used.get(node_id, 0)
            if spare >= 1:
                pool.append(AggregatorInfo(node_id, info.address, spare, info.max_fan_in, info.labels))
        return pool

    def _candidate(self, group: _Group) -> TreePlan | None:
        """The group's best tree: on dedicated aggregators if they can hold it, else
        with the fallback aggregators that endpoints run (draft section "Fallback to
        End Hosts"), else none."""
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
            FALLBACK_LABEL in self._aggregators[node].labels
            for node in plan.aggregator_ids
            if node in self._aggregators
        )

    def _plan(self, group: _Group, out: list[Command]) -> None:
        """PLANNING -> ACTIVE with a tree for the current epoch, or -> WAITING."""
        plan = self._candidate(group)
        if plan is None:
            group.state = _move(GROUP_TABLE, group.state, "no_capacity")
            self._changed()
            return
        self._assign(group, plan, out)

    def _assign(self, group: _Group, plan: TreePlan, out: list[Command]) -> None:
        """Install ``plan`` and send its TreeAssignments to whoever is connected (an
        away node gets its own when it registers or joins again)."""
        group.plan = plan
        group.state = _move(GROUP_TABLE, group.state, "planned")
        self._changed()
        for placement in plan.aggregators:
            peer = self._aggregator_peer(placement.node_id)
            if peer is not None:
                out.append(SendMessage(peer, self._aggregator_assignment(group, placement)))
        for rank, _ in plan.endpoint_parents:
            member = group.members[rank]
            if member.peer is not None:
                out.append(SendMessage(member.peer, self._endpoint_assignment(group, rank)))
                member.state = _move(MEMBER_TABLE, member.state, "assigned")

    def _aggregator_assignment(self, group: _Group, placement: AggregatorPlacement) -> TreeAssignment:
        return TreeAssignment(
            group_id=group.group_id,
            epoch=group.epoch,
            world_size=group.world_size,
            expected=placement.expected,
            children=placement.children,
            params=group.current_params(),
            parent=placement.parent,
        )

    def _endpoint_assignment(self, group: _Group, rank: int) -> TreeAssignment:
        assert group.plan is not None
        return TreeAssignment(
            group_id=group.group_id,
            epoch=group.epoch,
            world_size=group.world_size,
            expected=bitmap_from_ranks([rank]),
            children=(),
            params=group.current_params(),
            parent=group.plan.parent_of(rank),
        )

    def _retry_waiting(self, out: list[Command]) -> None:
        for _, group in sorted(self._groups.items()):
            if group.state is GroupState.WAITING:
                group.state = _move(GROUP_TABLE, group.state, "aggregators_changed")
                self._plan(group, out)

    def _aggregators_changed(self, out: list[Command], lost: str | None) -> None:
        """Re-plan after an aggregator arrived (``lost`` None) or was lost.

        Waiting groups are planned before active ones are improved, so spare
        capacity goes first to groups that have no tree at all.
        """
        for _, group in sorted(self._groups.items()):
            if group.plan is not None and lost is not None and lost in group.plan.aggregator_ids:
                group.state = _move(GROUP_TABLE, group.state, "aggregators_changed")
                # the members learn whether a new tree follows or none can be placed
                code = ErrorCode.PEER_LOST if self._candidate(group) is not None else ErrorCode.NO_AGGREGATOR
                self._end_epoch(group, code, out)
                self._plan(group, out)
        self._retry_waiting(out)
        if lost is None:
            for _, group in sorted(self._groups.items()):
                if group.state is GroupState.ACTIVE and group.plan is not None:
                    candidate = self._candidate(group)
                    if candidate is None:
                        continue
                    back = self._on_fallback(group.plan) and not self._on_fallback(candidate)
                    if not (back or candidate.better_than(group.plan)):
                        continue
                    group.state = _move(GROUP_TABLE, group.state, "aggregators_changed")
                    self._end_epoch(group, ErrorCode.NO_ERROR, out)
                    self._assign(group, candidate, out)
            self._retry_waiting(out)


__all__ = [
    "CHUNK_HEADER_BOUND",
    "DEFAULT_FAN_IN",
    "DEFAULT_PARAMS",
    "FALLBACK_LABEL",
    "LOSS_INTERVALS",
    "MAY_SEND",
    "RESUME_REDIAL_GAP",
    "AggregatorStatus",
    "DurableAggregator",
    "DurableGroup",
    "DurableMember",
    "DurableState",
    "GroupConfig",
    "GroupStatus",
    "MemberStatus",
    "Needs",
    "RendezvousConfig",
    "RendezvousMachine",
    "RendezvousStatus",
    "chunk_elements_limit",
]
