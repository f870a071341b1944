"""The endpoint session as a sans-I/O state machine: one membership of one group.

The session joins the group at the rendezvous, connects to the aggregator the
rendezvous names as its parent, and runs collectives over that tree.  It is composed
of parts with one concern each:

* its session with the rendezvous (:mod:`cco.nodes.session`): the JoinRequest,
  heartbeats once admitted, the loss rule;
* its :class:`~cco.nodes.membership.Membership`, which exists only once the
  JoinAccept came: rank, keys, parameters, epoch, members;
* its link to the parent (:mod:`cco.nodes.parent`), dialled as each TreeAssignment
  says and again after a pause when lost;
* the call checks and plans (:mod:`cco.nodes.planning`): :meth:`EndpointMachine.prepare`;
* the operations in flight (:mod:`cco.nodes.engine`): the window, the pump, the
  outstanding chunks, verification, completion.

This module routes each input to them along the session's transition tables
(:mod:`cco.nodes.endpoint_states`): the session's states and the action each move
takes, and the link to the rendezvous beside it.  Membership is explicit: when
members leave, operations fail naming them until the application accepts the new
membership (or at once, with ``elastic``).  The data plane needs no rendezvous:
losing it detaches the session (its :class:`LinkState`) instead of ending it, the
I/O layer dials again, and the JoinRequest on the new connection resumes the
membership if the rendezvous kept the group (draft section "Rendezvous Persistence
and Restart").
"""

from __future__ import annotations

from dataclasses import dataclass

from cco.nodes.calls import CollectiveRequest, EndpointConfig
from cco.nodes.chunking import Goodput
from cco.nodes.deadlines import earlier
from cco.nodes.endpoint_states import (
    ENDED,
    FROM_PARENT,
    FROM_RENDEZVOUS,
    LINK_TABLE,
    SESSION_TABLE,
    LinkEvent,
    LinkState,
    OperationState,
    SessionAction,
    SessionEvent,
    SessionState,
)
from cco.nodes.engine import OperationEngine
from cco.nodes.events import (
    ClosePeer,
    Command,
    Input,
    Joined,
    JoinFailed,
    MessageMalformed,
    MessageReceived,
    PeerConnected,
    PeerDisconnected,
    SendMessage,
    TimerFired,
)
from cco.nodes.membership import Membership
from cco.nodes.parent import Dials, ParentLink
from cco.nodes.planning import Prepared, plan
from cco.nodes.replies import ranks_text, refuse
from cco.nodes.session import RendezvousSession, Tick
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import ranks_from_bitmap
from cco.wire.messages import (
    Abort,
    BroadcastData,
    EpochChange,
    Error,
    Heartbeat,
    JoinAccept,
    JoinReject,
    JoinRequest,
    Leave,
    Message,
    Result,
    RetransmitRequest,
    TreeAssignment,
    clip_detail,
)
from cco.wire.registries import MessageType, Role


@dataclass(slots=True)
class _Joined:
    """What exists once the group admitted this endpoint."""

    membership: Membership
    engine: OperationEngine
    tree: TreeAssignment | None = None  # the current epoch's, once one came
    announced: bool = False  # Joined was reported (on the first parent connection)


@dataclass(frozen=True, slots=True)
class _Owing:
    """The parent in an older epoch's tree, kept connected while operations kept through
    a Leave wait for the results that tree still owes them (they are on their way down
    it: closing the connection would drop them)."""

    link: ParentLink
    epoch: int


class EndpointMachine:
    """One group membership: ``handle(event, now)``, ``start``, ``leave``, ``next_deadline``."""

    def __init__(self, config: EndpointConfig) -> None:
        self.config = config
        self._state = SessionState.IDLE
        self._link = LinkState.ATTACHED
        self._session = RendezvousSession()
        self._parent = ParentLink()
        self._dials = Dials()
        self._joined: _Joined | None = None
        self._owing: _Owing | None = None

    # --- observation ----------------------------------------------------------

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def link(self) -> LinkState:
        """The connection to the rendezvous; DETACHED asks the I/O layer to dial again."""
        return self._link

    @property
    def rank(self) -> int | None:
        return None if self._joined is None else self._joined.membership.rank

    @property
    def epoch(self) -> int:
        return 0 if self._joined is None else self._joined.membership.epoch

    @property
    def no_tree(self) -> str | None:
        """Why the group has no tree, when the rendezvous said no aggregator can serve it
        (EpochChange with NO_AGGREGATOR); None once a tree is assigned."""
        return None if self._joined is None else self._joined.membership.no_tree

    @property
    def members(self) -> frozenset[int]:
        """The group's members in the current epoch, as the rendezvous announced them."""
        return frozenset() if self._joined is None else self._joined.membership.members

    @property
    def accepted_members(self) -> frozenset[int]:
        """The members collectives run over: the group at join, or as last accepted."""
        return frozenset() if self._joined is None else self._joined.membership.accepted

    def accept_membership(self) -> frozenset[int]:
        """Accept the current membership: later collectives run over these ranks."""
        return frozenset() if self._joined is None else self._joined.membership.accept_members()

    @property
    def group_id(self) -> bytes:
        return self.config.group_id

    @property
    def kept_chunks(self) -> list[tuple[int, int]]:
        """(op_id, chunk_index) of the sealed chunks kept to seal again for a rank that
        restarts an operation this one completed: the last 2 x window, oldest first."""
        return [] if self._joined is None else self._joined.engine.kept_chunks

    @property
    def outstanding(self) -> int:
        """Chunks sent whose result has not come back, across all operations."""
        return 0 if self._joined is None else self._joined.engine.outstanding

    @property
    def next_op_id(self) -> int:
        """The op_id the next call's first wire operation takes."""
        return 0 if self._joined is None else self._joined.engine.next_op_id

    @property
    def goodput(self) -> Goodput | None:
        """The payload bytes per second, one way, of this rank's last large block-scaled
        operation, which its chunk proposals follow (:mod:`cco.nodes.chunking`)."""
        return None if self._joined is None else self._joined.engine.goodput

    def operation_state(self, op_id: int) -> OperationState | None:
        return None if self._joined is None else self._joined.engine.state_of(op_id)

    # --- local API ------------------------------------------------------------

    def prepare(self, request: CollectiveRequest) -> Prepared:
        """Check a call and plan it, without starting it: what :meth:`start` does before
        the operation gets its op_ids.  The whole-tensor work (:meth:`Prepared.compute`)
        reads only the array and the plan, so the I/O layer may run it on another thread
        and pass the result to :meth:`start`, which the machine's own thread calls.

        Raises :class:`CcoError` for misuse (not joined, bad arguments).
        """
        return plan(request, self._startable().membership)

    def start(
        self, request: CollectiveRequest, now: float, prepared: Prepared | None = None
    ) -> tuple[int, list[Command]]:
        """Begin a collective; returns its op_id and what to send now.  ``prepared`` is
        this request's :meth:`prepare`, computed or not; one made under other group
        parameters is made again.

        Raises :class:`CcoError` for misuse only (not joined, bad arguments); a
        value that cannot be encoded consumes the op_id and fails the operation,
        so that every rank's op_id sequence stays aligned.
        """
        joined = self._startable()
        if prepared is None or prepared.request is not request or prepared.params != joined.membership.params:
            prepared = plan(request, joined.membership)
        return joined.engine.start(prepared, now)

    def _startable(self) -> _Joined:
        joined = self._joined
        if joined is None or not SESSION_TABLE.allows(self._state, SessionEvent.START):
            raise CcoError(
                ErrorCode.PROTOCOL_VIOLATION, f"start() is not allowed in state {self._state.name}"
            )
        return joined

    def leave(self, now: float) -> list[Command]:
        """Leave the group: tell the rendezvous, fail what is in flight, close.  Every
        state allows it (in the terminal ones it does nothing)."""
        move = SESSION_TABLE.fire(self._state, SessionEvent.LEAVE)
        self._enter(move.target)
        if move.action is SessionAction.STAY:
            return []
        joined = self._joined
        out = (
            []
            if joined is None
            else joined.engine.fail_all(ErrorCode.ABORTED, "this rank left the group", None)
        )
        rendezvous = self._session.peer
        if rendezvous is not None and joined is not None:
            leave = Leave(group_id=self.config.group_id, rank=joined.membership.rank, code=ErrorCode.NO_ERROR)
            out.append(SendMessage(rendezvous, leave))
        out += self._session.close(ErrorCode.NO_ERROR, "left the group")
        out += self._parent.close("left the group")
        out += self._close_owing("left the group")
        self._session.forget_detachment()
        return out

    # --- driving --------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """The earliest timer: an operation's deadline or resend time, the heartbeat or
        the rendezvous's silence, the parent's redial, the detached link's grace.  The
        I/O layer asks after every input, so this is one pass that builds no lists."""
        earliest = self._parent.retry_at
        heartbeat = self._session.deadline()
        if heartbeat is not None:
            earliest = earlier(earliest, heartbeat)
        if self._session.detached_at is not None:
            earliest = earlier(earliest, self._session.detached_at + self.config.rendezvous_grace)
        if self._joined is not None:
            earliest = self._joined.engine.deadline(earliest)
        return earliest

    def handle(self, event: Input, now: float) -> list[Command]:
        """Process one input; never raises for anything a peer can send."""
        if isinstance(event, MessageReceived):  # first: the input of every round
            if event.peer == self._parent.peer:
                return self._on_parent(event.message, now)
            if event.peer == self._session.peer:
                self._session.heard(now)
                return self._on_rendezvous(event.message, now)
            if self._owing is not None and event.peer == self._owing.link.peer:
                return self._on_old_parent(event.message, now)
            return [refuse(event.peer, event.message, ErrorCode.UNAUTHORIZED, "not a peer of this session")]
        if isinstance(event, PeerConnected):
            return self._on_connected(event, now)
        if isinstance(event, PeerDisconnected):
            return self._on_disconnected(event, now)
        if isinstance(event, MessageMalformed):  # a connection error: report it, close, forget the peer
            code, detail = event.error.code, clip_detail(event.error.detail)
            closing: list[Command] = [
                SendMessage(event.peer, Error(code=code, detail=detail)),
                ClosePeer(event.peer, code, detail),
            ]
            return closing + self._on_disconnected(PeerDisconnected(event.peer, code, detail), now)
        if isinstance(event, TimerFired):
            return self._on_timer(now)
        raise CcoError(ErrorCode.INTERNAL_ERROR, f"not an input: {event!r}")

    def _enter(self, state: SessionState) -> None:
        """The session moves to ``state``; chunks leave only while it is READY."""
        if state is not self._state:
            self._state = state
            if self._joined is not None:
                self._joined.engine.ready = state is SessionState.READY

    # --- connections --------------------------------------------------------------

    def _on_connected(self, event: PeerConnected, now: float) -> list[Command]:
        if event.role is Role.RENDEZVOUS:
            if self._joined is not None:
                return self._resume(event, self._joined)
            move = SESSION_TABLE.move(self._state, SessionEvent.RENDEZVOUS_CONNECTED)
            if move is None:
                return [ClosePeer(event.peer, ErrorCode.PROTOCOL_VIOLATION, f"session is {self._state.name}")]
            self._enter(move.target)
            return [self._session.greet(event.peer, self._join_request(self.config.rank))]
        joined = self._joined
        parent = self._parent
        if event.peer == parent.peer and event.role is Role.AGGREGATOR and event.node_id == parent.node_id:
            move = SESSION_TABLE.move(self._state, SessionEvent.PARENT_CONNECTED)
            if move is None or joined is None:
                return []
            self._enter(move.target)
            parent.connected()
            joined.engine.resume_all()
            out: list[Command] = []
            if not joined.announced:
                joined.announced = True
                membership = joined.membership
                out.append(
                    Joined(self.config.group_id, membership.rank, membership.world_size, membership.epoch)
                )
            return out + joined.engine.pump(now)
        return [ClosePeer(event.peer, ErrorCode.UNAUTHORIZED, "this session did not ask for this connection")]

    def _join_request(self, rank: int | None) -> JoinRequest:
        return JoinRequest(
            group_id=self.config.group_id,
            world_size=self.config.world_size,
            credential=self.config.credential,
            rank=rank,
            labels=self.config.labels,
        )

    def _on_disconnected(self, event: PeerDisconnected, now: float) -> list[Command]:
        if event.peer == self._session.peer:
            self._session.drop()
            return self._lose_rendezvous(f"rendezvous connection closed ({event.code.name})", now)
        if self._owing is not None and event.peer == self._owing.link.peer:
            self._owing = None  # what it owed is lost with it: the operations' deadlines end them
            return []
        parent = self._parent
        if event.peer != parent.peer or self._joined is None:
            return []
        move = SESSION_TABLE.move(self._state, SessionEvent.PARENT_LOST)
        if move is None:
            return []
        self._enter(move.target)
        parent.lost(now, self.config.retry_interval if move.action is SessionAction.REDIAL_LATER else None)
        self._joined.engine.interrupt_all(f"connection to parent {parent.node_id} lost ({event.code.name})")
        return []

    def _lose_rendezvous(self, why: str, now: float) -> list[Command]:
        """Before the JoinAccept the join fails; after it the session detaches and the
        collectives go on over the current tree (see ``rendezvous_grace``)."""
        move = SESSION_TABLE.move(self._state, SessionEvent.RENDEZVOUS_LOST)
        if move is None:
            return []
        self._enter(move.target)
        out = self._session.close(ErrorCode.PEER_LOST, why)
        if move.action is SessionAction.JOIN_LOST:
            return [*out, JoinFailed(self.config.group_id, ErrorCode.PEER_LOST, why), *self._end(why)]
        self._link = LINK_TABLE.next(self._link, LinkEvent.RENDEZVOUS_LOST)
        self._session.detach(now)
        return out

    def _resume(self, event: PeerConnected, joined: _Joined) -> list[Command]:
        """A new rendezvous connection of a joined session: ask for the same rank."""
        move = LINK_TABLE.move(self._link, LinkEvent.RENDEZVOUS_CONNECTED)
        if move is None or self._state in ENDED:
            why = f"the rendezvous link is {self._link.name} in session state {self._state.name}"
            return [ClosePeer(event.peer, ErrorCode.PROTOCOL_VIOLATION, why)]
        self._link = move.target
        return [self._session.greet(event.peer, self._join_request(joined.membership.rank))]

    def _on_resume_answer(
        self, message: JoinAccept | JoinReject | Error, joined: _Joined, now: float
    ) -> list[Command]:
        """The rendezvous's answer to the resuming JoinRequest: the same rank, group
        secret, world size and epoch resume the membership (if the group moved on
        meanwhile, the EpochChange and TreeAssignment this rank missed follow).  A newer
        epoch means messages of the old rendezvous process never arrived, so this rank
        cannot know the members or the tree of that epoch; like any other answer, it
        means the rendezvous no longer has this membership."""
        membership = joined.membership
        if isinstance(message, JoinAccept):
            if membership.same_as(message):
                self._link = LINK_TABLE.next(self._link, LinkEvent.RESUMED)
                self._session.accept(membership.heartbeat_interval, now, membership.params.loss_window)
                return []
            why = (
                f"the rendezvous came back without this membership (rank {message.rank}, epoch "
                f"{message.epoch} where this rank has {membership.epoch}, "
                "or another group secret or world size)"
            )
        else:
            why = f"the rendezvous refused to resume this membership: {message.detail}"
        return self._gone(why)

    def _gone(self, why: str) -> list[Command]:
        """The rendezvous will not have this membership again: the session closes."""
        self._session.forget_detachment()
        move = SESSION_TABLE.move(self._state, SessionEvent.RENDEZVOUS_GONE)
        if move is None:
            return []
        self._enter(move.target)
        return self._session.close(ErrorCode.PEER_LOST, why) + self._end(why)

    def _end(self, why: str) -> list[Command]:
        """The membership is over: fail what is in flight and close the parent."""
        failed = [] if self._joined is None else self._joined.engine.fail_all(ErrorCode.PEER_LOST, why, None)
        return failed + self._parent.close(why) + self._close_owing(why)

    # --- the rendezvous's messages ---------------------------------------------

    def _on_rendezvous(self, message: Message, now: float) -> list[Command]:
        rendezvous = self._session.peer
        assert rendezvous is not None
        joined = self._joined
        if self._link is LinkState.RESUMING and isinstance(message, JoinAccept | JoinReject | Error):
            assert joined is not None
            return self._on_resume_answer(message, joined, now)
        if isinstance(message, TreeAssignment):
            event: SessionEvent | None = self._classify_tree(message)
        elif isinstance(message, Error):
            event = SessionEvent.ERROR_RENDEZVOUS
            if message.message_type == MessageType.REPORT and joined is not None:
                joined.engine.reports.release()
        else:
            event = FROM_RENDEZVOUS.get(type(message))
        if isinstance(message, JoinAccept | JoinReject | TreeAssignment | EpochChange) and (
            message.group_id != self.config.group_id
        ):
            return [refuse(rendezvous, message, ErrorCode.UNKNOWN_GROUP, "not this session's group")]
        if isinstance(message, TreeAssignment) and message.parent is None:
            return [refuse(rendezvous, message, ErrorCode.INVALID_FIELD, "an endpoint needs a parent")]
        if isinstance(message, TreeAssignment | EpochChange) and message.epoch < self.epoch:
            why = f"epoch {message.epoch} is older than {self.epoch}"
            return [refuse(rendezvous, message, ErrorCode.STALE_EPOCH, why)]
        move = None if event is None else SESSION_TABLE.move(self._state, event)
        if move is None:
            name = type(message).__name__ if event is None else event.value
            why = f"{name} is not allowed in state {self._state.name}"
            return [refuse(rendezvous, message, ErrorCode.PROTOCOL_VIOLATION, why)]
        self._enter(move.target)
        match move.action:
            case SessionAction.ADOPT:
                assert isinstance(message, JoinAccept)
                membership = Membership(message)
                self._joined = _Joined(
                    membership, OperationEngine(self.config, membership, self._parent, self._session)
                )
                self._session.accept(membership.heartbeat_interval, now, membership.params.loss_window)
            case SessionAction.REFUSED:
                assert isinstance(message, JoinReject | Error)
                why = f"join {'rejected' if isinstance(message, JoinReject) else 'refused'}: {message.detail}"
                return [
                    JoinFailed(self.config.group_id, message.code, why),
                    ClosePeer(rendezvous, message.code, why),
                ]
            case SessionAction.DIAL | SessionAction.RESUME:
                assert isinstance(message, TreeAssignment) and joined is not None
                return self._on_tree(message, move.action, joined, now)
            case SessionAction.CHANGE_EPOCH:
                assert isinstance(message, EpochChange) and joined is not None
                return self._on_epoch_change(message, joined)
        return []  # a Heartbeat or a report: liveness already noted

    def _classify_tree(self, message: TreeAssignment) -> SessionEvent:
        parent = message.parent
        if parent is not None and self._parent.reaches(parent.node_id):
            return SessionEvent.TREE_CONNECTED
        return SessionEvent.TREE_DIAL

    def _on_tree(
        self, message: TreeAssignment, action: SessionAction, joined: _Joined, now: float
    ) -> list[Command]:
        membership, engine = joined.membership, joined.engine
        if message.epoch > membership.epoch:
            engine.interrupt_all(f"the tree changed to epoch {message.epoch}")
        membership.adopt(message.params, message.epoch)
        old, joined.tree = joined.tree, message
        if action is SessionAction.RESUME:
            engine.resume_all()
            return engine.pump(now)
        assert message.parent is not None
        out = self._retire_parent(old, engine)
        return [*out, self._parent.dial(self._dials.peer(membership.epoch), message.parent)]

    def _retire_parent(self, old: TreeAssignment | None, engine: OperationEngine) -> list[Command]:
        """Close the connection to the parent being replaced, unless operations kept
        through a Leave still wait for results of its tree: then it stays open until
        they have them (or end otherwise).  One older tree at most is kept."""
        out = self._close_owing("a newer tree replaced it")
        if old is not None and self._parent.up and engine.awaits_epoch(old.epoch):
            self._owing = _Owing(self._parent.hand_over(), old.epoch)
            return out
        return out + self._parent.close("parent changed")

    def _on_old_parent(self, message: Message, now: float) -> list[Command]:
        """Traffic from the parent of an older tree: its results and aborts for the
        operations kept in that epoch; nothing else is taken from it."""
        owing, joined = self._owing, self._joined
        assert owing is not None
        out: list[Command] = []
        if (
            joined is not None
            and isinstance(message, Result | BroadcastData | Abort)
            and message.group_id == self.config.group_id
            and message.epoch == owing.epoch
        ):
            out = joined.engine.on_message(message, now)
        return out + self._settle_owing()

    def _settle_owing(self) -> list[Command]:
        """Close the older tree's parent once no operation waits for it any more."""
        owing, joined = self._owing, self._joined
        if owing is None or (joined is not None and joined.engine.awaits_epoch(owing.epoch)):
            return []
        return self._close_owing("the older tree delivered what it owed")

    def _close_owing(self, why: str) -> list[Command]:
        owing, self._owing = self._owing, None
        return [] if owing is None else owing.link.close(why)

    def _on_epoch_change(self, message: EpochChange, joined: _Joined) -> list[Command]:
        membership, engine = joined.membership, joined.engine
        lost = membership.new_members(ranks_from_bitmap(message.members), message.epoch, self.config.elastic)
        if lost:
            why = f"epoch changed to {message.epoch} ({message.code.name}); ranks {ranks_text(lost)} left"
            if message.code is ErrorCode.NO_ERROR:
                # Ranks that left on purpose may have done so right after their last
                # collective, which they could complete only once every rank had sent:
                # this rank's copy may still be on its way, and stays awaited.
                return engine.fail_all(ErrorCode.PEER_LOST, why, lost, keep_sent=True)
            return engine.fail_all(ErrorCode.PEER_LOST, why, lost)
        if message.code is ErrorCode.NO_AGGREGATOR:
            membership.no_tree = f"epoch changed to {message.epoch}: no aggregator can serve the group"
            return engine.fail_all(ErrorCode.NO_AGGREGATOR, membership.no_tree, None)
        out: list[Command] = []
        if message.code is ErrorCode.VERIFICATION_FAILED:
            out = engine.fail_reported(
                f"epoch changed to {message.epoch} (VERIFICATION_FAILED): a rank reported data of the "
                "tree this operation ran in; call again to run it in the new tree"
            )
        # the same members in a new tree: every operation in flight starts again there
        engine.interrupt_all(
            f"epoch changed to {message.epoch} ({message.code.name}); the tree was re-planned"
        )
        return out

    # --- data from the parent ---------------------------------------------------

    def _on_parent(self, message: Message, now: float) -> list[Command]:
        parent = self._parent.peer
        assert parent is not None
        if isinstance(message, Heartbeat):
            return []
        event = SessionEvent.ERROR_PARENT if isinstance(message, Error) else FROM_PARENT.get(type(message))
        move = None if event is None else SESSION_TABLE.move(self._state, event)
        joined = self._joined
        if move is None or joined is None:
            why = f"{type(message).__name__} is not allowed from the parent in state {self._state.name}"
            return [refuse(parent, message, ErrorCode.PROTOCOL_VIOLATION, why)]
        match move.action:
            case SessionAction.CHUNK | SessionAction.ABORT | SessionAction.RESEND:
                assert isinstance(message, Result | BroadcastData | Abort | RetransmitRequest)
                if message.group_id != self.config.group_id:
                    return []  # another session's traffic
                if isinstance(message, RetransmitRequest):
                    return joined.engine.resend(message, now)
                return joined.engine.on_message(message, now)
            case SessionAction.PARENT_REFUSED:
                assert isinstance(message, Error)
                why = f"parent {self._parent.node_id} refused our data: {message.detail}"
                return joined.engine.fail_all(message.code, why, None)
        return []  # a ChunkAck: the Result is the acknowledgement

    # --- timers -----------------------------------------------------------------

    def _on_timer(self, now: float) -> list[Command]:
        out: list[Command] = []
        tick = self._session.tick(now)
        if tick is Tick.LOST:
            out += self._lose_rendezvous(self._session.silence(), now)
        elif tick is Tick.BEAT:
            out.append(self._session.heartbeat())
        grace = self.config.rendezvous_grace
        if self._session.grace_over(now, grace):
            out += self._gone(f"the rendezvous was not back within {grace:g}s")
        joined = self._joined
        if self._parent.retry_due(now) and joined is not None:
            tree = joined.tree
            if (
                tree is not None
                and tree.parent is not None
                and self._parent.node_id is not None
                and not self._parent.up
            ):
                out.append(self._parent.dial(self._dials.peer(joined.membership.epoch), tree.parent))
        if joined is not None:
            out += joined.engine.on_timer(now)
        return out + self._settle_owing()


__all__ = ["EndpointMachine", "Prepared"]
