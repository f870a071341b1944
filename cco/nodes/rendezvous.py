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
``status()`` returns a frozen snapshot for the CLI and for tests
(:mod:`cco.nodes.rendezvous_status`); ``random_bytes`` (default ``os.urandom``)
makes group secrets deterministic in tests.

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
  a better tree after an aggregator arrives, a member's Report of tampering) sends
  EpochChange(new epoch, members, code) to the remaining members and to the old
  tree's aggregators, then new TreeAssignments, aggregators root first, then
  endpoints by rank (:mod:`cco.nodes.rendezvous_trees`).
* A member's Report that stands takes its rank's path to the root out of its
  group's trees, for that group alone, and the epoch ends with VERIFICATION_FAILED
  (NO_AGGREGATOR if no tree fits without them); one that does not stand is refused
  with an Error and changes nothing (:mod:`cco.nodes.rendezvous_reports`).
* Heartbeat(seq) goes to every peer each interval and echoes the last seq received
  from it; a peer that sent nothing for three intervals is lost and closed
  (:mod:`cco.nodes.liveness`).

Restart (draft section "Rendezvous Persistence and Restart"): :meth:`durable_state`
exports what must survive (:mod:`cco.nodes.rendezvous_durable`) and
``durable_version`` moves whenever it changes, never on heartbeats; the service
saves it before it carries out the commands that announce the change
(:mod:`cco.services.store`).  :meth:`RendezvousMachine.restored` builds a machine
from it in which every member and aggregator is *away*: an away member that sends
its JoinRequest again gets JoinAccept with its rank, the epoch it was last told
of, the same secret and parameters, and nothing else unless the group moved on
meanwhile (then the EpochChange and TreeAssignment it missed); an away aggregator
that registers again as before gets AggregatorAccept and the current epoch's
TreeAssignment of every tree it is in.  Nothing is sent to an away node.  When the
grace period (``RendezvousConfig.resume_grace``) ends, away aggregators are lost
(their trees re-planned), then away members (one EpochChange per group, code
PEER_LOST), exactly as if their connections had ended then.

Capabilities: a group's chunk_elements in an epoch is its configured value lowered to
what every member accepts (:func:`~cco.nodes.rendezvous_records.chunk_elements_limit`);
a join is refused with MESSAGE_TOO_LARGE when even a one-element chunk message for
the group's world size exceeds the joiner's max_message_size.

Refusals: a message another role may send is answered with Error(UNAUTHORIZED); a
message not allowed in the peer's state, or one no peer may send to a rendezvous,
with Error(PROTOCOL_VIOLATION); both leave the connection open.  A malformed
message gets an Error with its decode code and the connection is closed.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from cco.nodes.events import (
    ClosePeer,
    Command,
    Happening,
    Input,
    MessageMalformed,
    PeerConnected,
    PeerDisconnected,
    Report,
    SendMessage,
    TimerFired,
)
from cco.nodes.liveness import Liveness
from cco.nodes.rendezvous_admission import Admission
from cco.nodes.rendezvous_config import FALLBACK_LABEL, GroupConfig, RendezvousConfig
from cco.nodes.rendezvous_durable import DurableState, export, load
from cco.nodes.rendezvous_joins import check_credentials, check_join, check_message_size
from cco.nodes.rendezvous_records import (
    GroupRecord,
    MemberRecord,
    PeerRecord,
    Registration,
)
from cco.nodes.rendezvous_reports import exclude, path_to_root, reporting_rank
from cco.nodes.rendezvous_states import (
    PEER_EVENTS,
    PEER_TABLE,
    GroupEvent,
    GroupState,
    MemberEvent,
    MemberState,
    PeerAction,
    PeerEvent,
    PeerState,
)
from cco.nodes.rendezvous_status import RendezvousStatus, snapshot
from cco.nodes.rendezvous_trees import Trees
from cco.nodes.tree import AggregatorInfo
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import (
    AggregatorAccept,
    AggregatorRegister,
    EpochChange,
    Error,
    Heartbeat,
    JoinAccept,
    JoinReject,
    JoinRequest,
    Leave,
    Message,
    clip_detail,
)
from cco.wire.messages import Report as ReportMessage
from cco.wire.registries import GROUP_SECRET_SIZE, Role

MAY_SEND: dict[Role, frozenset[type[Message]]] = {
    Role.ENDPOINT: frozenset({JoinRequest, Leave, ReportMessage, Heartbeat, Error}),
    Role.AGGREGATOR: frozenset({AggregatorRegister, Heartbeat, Error}),
}
"""What each role may send to a rendezvous; another role's message is UNAUTHORIZED."""


class RendezvousMachine:
    """The rendezvous: see the module docstring for what it sends and when."""

    def __init__(
        self, config: RendezvousConfig | None = None, *, random_bytes: Callable[[int], bytes] = os.urandom
    ) -> None:
        self.config = config or RendezvousConfig()
        self._random = random_bytes
        self._peers: dict[str, PeerRecord] = {}
        self._node_peers: dict[str, str] = {}
        self._grace_ends: float | None = None
        self._version = 0
        self._now = 0.0  # the time of the input being handled
        self._admission = Admission(self.config.limits, self.config.groups)
        self._trees = Trees(self._node_peers, self._changed, self._moved)
        for group_id, cfg in sorted(self.config.groups.items()):
            self._trees.groups[group_id] = self._new_group(group_id, cfg.world_size, cfg.credential, epoch=1)

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
        groups, registrations = load(state)
        machine._trees.adopt(groups)
        machine._trees.registrations.update(registrations)
        machine._admission.restore(machine._trees.groups.values(), now)
        if any(g.members for g in state.groups) or state.aggregators:
            machine._grace_ends = now + machine.config.resume_grace
        return machine

    # --- driving interface ------------------------------------------------------

    def handle(self, event: Input, now: float) -> list[Command]:
        """Process one input at time ``now`` (seconds); returns what to send or close."""
        out: list[Command] = []
        self._now = now
        if self._grace_ends is not None and now >= self._grace_ends:
            self._end_grace(out)
        if isinstance(event, PeerConnected):
            self._connected(event, now, out)
        elif isinstance(event, TimerFired):
            self._timers(now, out)
        elif event.peer not in self._peers:
            pass  # late input for a connection this machine already closed
        elif isinstance(event, PeerDisconnected):
            self._peer_event(self._peers[event.peer], PeerEvent.DISCONNECTED, None, out)
        elif isinstance(event, MessageMalformed):
            peer = self._peers[event.peer]
            out.append(
                SendMessage(peer.peer, Error(code=event.error.code, detail=clip_detail(event.error.detail)))
            )
            out.append(ClosePeer(peer.peer, event.error.code, "malformed message"))
            out.append(
                Report(Happening.REFUSED, peer.node_id, code=event.error.code, detail=event.error.detail)
            )
            self._peer_event(peer, PeerEvent.MALFORMED, None, out)
        else:
            peer = self._peers[event.peer]
            peer.liveness.heard(now)
            try:
                event.message.to_map()  # field ranges: the codec checked them, a direct caller may not
                self._message(peer, event.message, out)
                peer.liveness.retime(self._beat_interval(peer), now)
            except CcoError as exc:
                error = Error(
                    code=exc.code, detail=clip_detail(exc.detail), message_type=int(event.message.TYPE)
                )
                out.append(SendMessage(peer.peer, error))
                out.append(Report(Happening.REFUSED, peer.node_id, code=exc.code, detail=exc.detail))
        return out

    def next_deadline(self) -> float | None:
        """The earliest heartbeat to send, loss to declare, expiry of a created group
        or end of the grace period after a restart; None when there is none of them."""
        times = [p.liveness.deadline(self._loss_window(p)) for p in self._peers.values()]
        if self._grace_ends is not None:
            times.append(self._grace_ends)
        expiry = self._admission.deadline()
        if expiry is not None:
            times.append(expiry)
        return min(times, default=None)

    @property
    def durable_version(self) -> int:
        """A counter that moves whenever :meth:`durable_state` would return something
        new (never on heartbeats): the service saves the state when it moved, before
        it carries out the commands that announce the change."""
        return self._version

    def durable_state(self) -> DurableState:
        """What a restart must find (see :class:`DurableState`)."""
        return export(self._trees.groups, self._trees.registrations)

    def status(self) -> RendezvousStatus:
        """A frozen snapshot of groups, members, aggregators and epochs."""
        return snapshot(self._trees.groups, self._trees.registrations, len(self._peers), self._grace_ends)

    # --- restart ----------------------------------------------------------------

    def _end_grace(self, out: list[Command]) -> None:
        """The grace period after a restart is over: whoever is still away is lost,
        as if its connection had ended now (aggregators first, so that members are
        re-planned onto aggregators that are really there)."""
        self._grace_ends = None
        trees = self._trees
        lost = sorted(node_id for node_id, r in trees.registrations.items() if r.away)
        for node_id in lost:
            del trees.registrations[node_id]
            out.append(
                Report(
                    Happening.LOST, node_id, code=ErrorCode.PEER_LOST, detail="aggregator not back in time"
                )
            )
        for node_id in lost:
            trees.aggregators_changed(out, lost=node_id)
        for _, group in sorted(trees.groups.items()):
            away = group.away()
            if away:
                self._remove_members(group, away, MemberEvent.LOST, ErrorCode.PEER_LOST, out)
        trees.retry_waiting(out, arrived=True)
        self._changed()

    def _changed(self) -> None:
        self._version += 1

    def _moved(self, group: GroupRecord) -> None:
        self._admission.state_changed(group, self._now)

    def _expire(self, now: float, out: list[Command]) -> None:
        """Created groups whose time ran out: one still forming loses its members
        (each told with Error(TIMEOUT)), one closed for ``idle_timeout`` is forgotten."""
        limits = self.config.limits
        for group_id in self._admission.due(now):
            group = self._trees.groups.get(group_id)
            if group is None:
                continue
            if group.state is GroupState.FORMING:
                detail = (
                    f"group {group_id.hex()} did not form within {limits.forming_timeout:g} s "
                    f"({len(group.members)} of {group.world_size} members joined): its members are removed"
                )
                for _, member in sorted(group.members.items()):
                    if member.peer is not None:
                        error = Error(code=ErrorCode.TIMEOUT, detail=clip_detail(detail))
                        out.append(SendMessage(member.peer, error))
                self._remove_members(group, sorted(group.members), MemberEvent.LOST, ErrorCode.TIMEOUT, out)
            elif group.state is GroupState.CLOSED:
                self._trees.forget(group_id)
                self._admission.group_forgotten(group_id)
                self._changed()

    # --- connections and liveness -----------------------------------------------

    def _connected(self, event: PeerConnected, now: float, out: list[Command]) -> None:
        if event.peer in self._peers:
            return  # the I/O layer reported the same connection twice
        if event.role not in MAY_SEND:
            detail = f"role {event.role.name} has no business here"
            out.append(ClosePeer(event.peer, ErrorCode.UNAUTHORIZED, detail))
            out.append(Report(Happening.REFUSED, event.node_id, code=ErrorCode.UNAUTHORIZED, detail=detail))
            return
        if event.node_id in self._node_peers:
            # an Error first: the refused node learns why and does not try again blindly
            detail = f"{event.node_id} is already connected"
            out.append(SendMessage(event.peer, Error(code=ErrorCode.UNAUTHORIZED, detail=detail)))
            out.append(ClosePeer(event.peer, ErrorCode.UNAUTHORIZED, detail))
            out.append(Report(Happening.REFUSED, event.node_id, code=ErrorCode.UNAUTHORIZED, detail=detail))
            return
        state = PeerState.ENDPOINT if event.role is Role.ENDPOINT else PeerState.REGISTERING
        liveness = Liveness.starting(self.config.heartbeat_interval, now, self.config.loss_window)
        self._peers[event.peer] = PeerRecord(
            event.peer, event.node_id, event.role, state, liveness, capabilities=event.capabilities
        )
        self._node_peers[event.node_id] = event.peer

    def _beat_interval(self, peer: PeerRecord) -> float:
        """A member of groups with a shorter heartbeat interval hears from the rendezvous
        at that one: it knows only its groups' intervals and times the rendezvous out by
        them (draft section "Heartbeats and Loss Detection")."""
        return min(self._intervals(peer))

    def _loss_window(self, peer: PeerRecord) -> float:
        """A member of a group with a longer liveness window is given that one."""
        return max(
            [self.config.loss_window, *(self._trees.groups[g].params.loss_window for g in peer.groups)]
        )

    def _intervals(self, peer: PeerRecord) -> list[float]:
        """The rendezvous's own heartbeat interval and those of the peer's groups."""
        return [
            self.config.heartbeat_interval,
            *(self._trees.groups[g].params.heartbeat_interval_ms / 1000.0 for g in peer.groups),
        ]

    def _timers(self, now: float, out: list[Command]) -> None:
        self._expire(now, out)
        for peer in sorted(self._peers.values(), key=lambda p: p.peer):
            if peer.liveness.lost(now, self._loss_window(peer)):
                silence = f"no message for {self._loss_window(peer):g} s (the liveness window)"
                out.append(ClosePeer(peer.peer, ErrorCode.PEER_LOST, silence))
                self._peer_event(peer, PeerEvent.HEARTBEAT_TIMEOUT, None, out)
            elif peer.liveness.beat_due(now):
                out.append(SendMessage(peer.peer, Heartbeat(seq=peer.echo_seq)))

    # --- messages ---------------------------------------------------------------

    def _message(self, peer: PeerRecord, message: Message, out: list[Command]) -> None:
        kind = type(message)
        if kind not in MAY_SEND[peer.role] and any(kind in allowed for allowed in MAY_SEND.values()):
            raise CcoError(ErrorCode.UNAUTHORIZED, f"role {peer.role.name} may not send {kind.__name__}")
        event = PEER_EVENTS.get(kind)
        if event is None or not PEER_TABLE.allows(peer.state, event):
            raise CcoError(
                ErrorCode.PROTOCOL_VIOLATION,
                f"{PEER_TABLE.name}: {kind.__name__} is not allowed in state {peer.state.name}",
            )
        self._peer_event(peer, event, message, out)

    def _peer_event(
        self, peer: PeerRecord, event: PeerEvent, message: Message | None, out: list[Command]
    ) -> None:
        """Do what the peer table says ``event`` does; the peer moves once it is done."""
        move = PEER_TABLE.fire(peer.state, event)
        match move.action:
            case PeerAction.ECHO:
                assert isinstance(message, Heartbeat)
                peer.echo_seq = message.seq
            case PeerAction.JOIN:
                assert isinstance(message, JoinRequest)
                self._join(peer, message, out)
            case PeerAction.LEAVE:
                assert isinstance(message, Leave)
                self._leave(peer, message, out)
            case PeerAction.REPORT:
                assert isinstance(message, ReportMessage)
                self._report(peer, message, out)
            case PeerAction.REGISTER:
                assert isinstance(message, AggregatorRegister)
                self._register(peer, message, out)
            case PeerAction.DROP:
                self._drop(peer, out)
        peer.state = move.target

    def _drop(self, peer: PeerRecord, out: list[Command]) -> None:
        """The connection ended: its memberships or its aggregator go with it."""
        del self._peers[peer.peer]
        del self._node_peers[peer.node_id]
        trees = self._trees
        for group_id in sorted(peer.groups):
            group = trees.groups[group_id]
            (rank,) = [r for r, m in group.members.items() if m.peer == peer.peer]
            self._remove_members(group, [rank], MemberEvent.LOST, ErrorCode.PEER_LOST, out)
        registration = trees.registrations.get(peer.node_id)
        if registration is not None and not registration.away:
            del trees.registrations[peer.node_id]
            out.append(Report(Happening.LOST, peer.node_id, code=ErrorCode.PEER_LOST, detail="aggregator"))
            self._changed()
            trees.aggregators_changed(out, lost=peer.node_id)
        else:
            trees.retry_waiting(out)

    def _register(self, peer: PeerRecord, message: AggregatorRegister, out: list[Command]) -> None:
        node_id = peer.node_id
        trees = self._trees
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
        known = trees.registrations.get(node_id)
        if known is not None and known.away:
            if info == known.info and peer.capabilities == known.capabilities:
                # a restored registration is back: its trees are what it had
                known.away = False
                out.append(SendMessage(peer.peer, accept))
                out.append(
                    Report(Happening.REGISTERED, node_id, detail=_offer(info) + ", back after a restart")
                )
                out += trees.assignments_of(node_id)
                return
            # registered differently (another address, capacity...): the old one is lost
            del trees.registrations[node_id]
            trees.aggregators_changed(out, lost=node_id)
        trees.registrations[node_id] = Registration(info, peer.capabilities)
        self._changed()
        out.append(SendMessage(peer.peer, accept))
        out.append(Report(Happening.REGISTERED, node_id, detail=_offer(info)))
        trees.aggregators_changed(out, lost=None)

    def _join(self, peer: PeerRecord, request: JoinRequest, out: list[Command]) -> None:
        trees = self._trees
        group = trees.groups.get(request.group_id)
        if group is not None:
            away = [m for m in group.members.values() if m.node_id == peer.node_id and m.peer is None]
            if away:
                self._resume(group, away[0], peer, request, out)
                return
        try:
            created = group is None
            if group is None:
                if not self.config.create_groups_on_join:
                    raise CcoError(ErrorCode.UNKNOWN_GROUP, "no such group")
                self._admit(None, peer, request.world_size)
                group = self._new_group(request.group_id, request.world_size, request.credential, epoch=1)
            else:
                self._admit(group, peer, request.world_size)
            if group.state is GroupState.CLOSED and request.group_id not in self.config.groups:
                group.world_size, group.credential = request.world_size, request.credential
                self._changed()
            check_join(group, peer, request)
        except CcoError as exc:
            reject = JoinReject(group_id=request.group_id, code=exc.code, detail=exc.detail)
            out.append(SendMessage(peer.peer, reject))
            out.append(_rejected(peer, request, exc))
            return
        if created:  # a group created by this join exists from now on
            trees.groups[group.group_id] = group
            self._admission.group_created()
            self._moved(group)
        if group.state is GroupState.CLOSED:
            trees.group_event(group, GroupEvent.REOPEN, out)
            group.secret = self._secret()
        free = [r for r in range(group.world_size) if r not in group.members]
        rank = request.rank if request.rank is not None else free[0]
        member = MemberRecord(
            rank, peer.node_id, peer.peer, request.labels, peer.capabilities, epoch=group.epoch
        )
        group.members[rank] = member
        self._admission.members += 1
        peer.groups.add(group.group_id)
        self._changed()
        out.append(SendMessage(peer.peer, self._accept(group, rank, group.epoch)))
        out.append(Report(Happening.JOINED, peer.node_id, group.group_id, rank, group.epoch))
        trees.membership_changed(group, GroupEvent.JOIN, ErrorCode.NO_ERROR, out)
        trees.retry_waiting(out)

    def _accept(self, group: GroupRecord, rank: int, epoch: int) -> JoinAccept:
        return JoinAccept(
            group_id=group.group_id,
            rank=rank,
            world_size=group.world_size,
            epoch=epoch,
            group_secret=group.secret,
            params=group.current_params(),
        )

    def _resume(
        self,
        group: GroupRecord,
        member: MemberRecord,
        peer: PeerRecord,
        request: JoinRequest,
        out: list[Command],
    ) -> None:
        """An away member of a restored group joins again: it gets its own rank, the
        epoch it was last told of, the same secret and parameters; and only if the
        group moved on while it was away, the EpochChange and TreeAssignment it missed."""
        try:
            check_credentials(group, request)
            if request.rank is not None and request.rank != member.rank:
                raise CcoError(
                    ErrorCode.RANK_UNAVAILABLE, f"{peer.node_id} is rank {member.rank}, not {request.rank}"
                )
            check_message_size(group, peer)
        except CcoError as exc:
            out.append(
                SendMessage(peer.peer, JoinReject(group_id=group.group_id, code=exc.code, detail=exc.detail))
            )
            out.append(_rejected(peer, request, exc))
            return
        if member.capabilities != peer.capabilities:
            member.capabilities = peer.capabilities
            self._changed()
        member.peer = peer.peer
        peer.groups.add(group.group_id)
        out.append(SendMessage(peer.peer, self._accept(group, member.rank, member.epoch)))
        out.append(
            Report(Happening.JOINED, peer.node_id, group.group_id, member.rank, member.epoch, detail="again")
        )
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
            self._trees.assign_member(group, member, out)
            self._changed()

    def _admit(self, group: GroupRecord | None, peer: PeerRecord, world_size: int) -> None:
        """Raise RESOURCE_EXHAUSTED if ``peer`` may not join ``group`` (None: create
        it) within the admission limits (:mod:`cco.nodes.rendezvous_admission`); a
        join that completes its group is not a pending one."""
        if group is not None and group.group_id in peer.groups:
            return  # refused as a second join of the same group, by check_join
        if group is None or group.state is GroupState.CLOSED:
            forming = world_size > 1
        else:
            forming = group.state is GroupState.FORMING and len(group.members) + 1 < group.world_size
        groups = self._trees.groups
        self._admission.check_join(group, (groups[g] for g in peer.groups), forming)

    def _leave(self, peer: PeerRecord, message: Leave, out: list[Command]) -> None:
        group = self._trees.groups.get(message.group_id)
        if group is None:
            raise CcoError(ErrorCode.UNKNOWN_GROUP, "no such group")
        member = group.members.get(message.rank)
        if member is None or member.peer != peer.peer:
            raise CcoError(ErrorCode.NOT_A_MEMBER, f"{peer.node_id} is not rank {message.rank}")
        self._remove_members(group, [message.rank], MemberEvent.LEAVE, message.code, out)
        self._trees.retry_waiting(out)

    def _report(self, peer: PeerRecord, message: ReportMessage, out: list[Command]) -> None:
        """A member reports data of its tree that failed verification: if the Report
        stands, the path from its rank to the root leaves the group's trees, and the
        group goes on in a new epoch (:mod:`cco.nodes.rendezvous_reports`)."""
        group = self._trees.groups.get(message.group_id)
        rank = reporting_rank(group, peer.peer, message)
        assert group is not None and group.plan is not None
        path = path_to_root(group.plan, rank)
        exclude(group, path, self.config.limits.exclusions_per_group)
        self._changed()
        detail = (
            f"op {message.op_id} from parent {message.parent}: {message.detail}; "
            f"excluded from the group's trees: {', '.join(path)}"
        )
        out.append(
            Report(
                Happening.TAMPERING, peer.node_id, group.group_id, rank, message.epoch, message.code, detail
            )
        )
        self._trees.reported(group, out)

    # --- members ----------------------------------------------------------------

    def _new_group(self, group_id: bytes, world_size: int, credential: bytes, epoch: int) -> GroupRecord:
        params, max_fan_in = self.config.group_params(group_id)
        return GroupRecord(
            group_id=group_id,
            world_size=world_size,
            credential=credential,
            params=params,
            max_fan_in=max_fan_in,
            secret=self._secret(),
            epoch=epoch,
        )

    def _secret(self) -> bytes:
        secret = self._random(GROUP_SECRET_SIZE)
        if len(secret) != GROUP_SECRET_SIZE:
            raise ValueError(f"random source returned {len(secret)} bytes, not {GROUP_SECRET_SIZE}")
        return secret

    def _remove_members(
        self, group: GroupRecord, ranks: list[int], event: MemberEvent, code: ErrorCode, out: list[Command]
    ) -> None:
        """Members gone at once: one membership change (one epoch) for all of them."""
        self._admission.members -= len(ranks)
        what = Happening.LEFT if event is MemberEvent.LEAVE else Happening.LOST
        for rank in ranks:
            member = group.members.pop(rank)
            out.append(Report(what, member.node_id, group.group_id, rank, group.epoch, code))
            self._trees.member_event(member, event)
            peer = self._peers.get(member.peer) if member.peer is not None else None
            if peer is not None:
                peer.groups.discard(group.group_id)
        self._changed()
        group_event = GroupEvent.LEAVE if event is MemberEvent.LEAVE else GroupEvent.LOST
        self._trees.membership_changed(group, group_event, code, out)


def _offer(info: AggregatorInfo) -> str:
    return (
        f"at {info.address.host}:{info.address.port}, capacity {info.capacity}, "
        f"fan-in {info.max_fan_in}, labels {list(info.labels)}"
    )


def _rejected(peer: PeerRecord, request: JoinRequest, error: CcoError) -> Report:
    return Report(
        Happening.JOIN_REJECTED,
        peer.node_id,
        request.group_id,
        request.rank,
        code=error.code,
        detail=error.detail,
    )


__all__ = ["FALLBACK_LABEL", "MAY_SEND", "GroupConfig", "RendezvousConfig", "RendezvousMachine"]
