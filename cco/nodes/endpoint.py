"""The endpoint session as a sans-I/O state machine: one membership of one group.

The session joins the group at the rendezvous, connects to the aggregator the
rendezvous names as its parent, and runs collectives over that tree:

* :meth:`EndpointMachine.start` turns a :class:`CollectiveRequest` into an
  operation that keeps the caller's array, not its encoding: the array is encoded
  chunk by chunk once and the integers dropped (so an unencodable value fails the
  call before anything is sent), and each chunk is encoded again when it is needed:
  sealed when the window lets it leave, under the epoch current at that moment,
  sent again on request, or compared with the result;
* at most ``GroupParams.window`` chunks of the session are outstanding at a time,
  across all its operations in call order; a chunk stops being outstanding when
  its result comes back, so the tree's memory per group stays bounded by
  window x chunk size (SwitchML's self-clocking);
* every Result or BroadcastData chunk is verified (:func:`payload.open_verified`)
  against the ranks that must have contributed and against this rank's own
  contribution, then decoded straight into the result array and remembered by a
  digest of its payload; the operation completes once every chunk is verified;
* a float SUM or AVG is two operations on the wire (draft section "Block Scales"):
  first the scale pass, a MIN all-reduce of this rank's proposed scale per block,
  then the data, quantized with the agreed scales and carrying this rank's
  attestations.  The caller sees one operation, the data's; the scale pass is
  internal, and its failure is the data operation's;
* a tree that fails (a re-planned epoch, a lost parent, an Abort saying so)
  interrupts operations instead of failing them: they start again from this
  rank's input in the next tree, within their deadline; a chunk whose result is
  half a timeout overdue is sent again, and an aggregator answers with the Result
  it kept;
* membership is explicit: when members leave, operations fail naming them until
  the application accepts the new membership (or at once, with ``elastic``);
* the data plane needs no rendezvous: losing it detaches the session (its
  :class:`LinkState`) instead of ending it, the I/O layer dials again, and the
  JoinRequest on the new connection resumes the membership if the rendezvous kept
  the group (draft section "Rendezvous Persistence and Restart").

What an operation holds and how its chunks are encoded and decoded lives in
:mod:`cco.nodes.operation`: besides the caller's array and the result, a few
chunks' worth of memory, whatever the tensor size.  The states and transition
tables are in :mod:`cco.nodes.endpoint_states`, the caller's request and failure
types in :mod:`cco.nodes.calls`.

Every failure reaches the caller as :class:`OperationFailed` carrying an
:class:`OperationError`, which names the group, the operation, the collective and,
when anyone knows them, the ranks that did not contribute.
"""

from __future__ import annotations

import dataclasses
import hmac
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from cco.nodes.calls import TREE_FAILURES, CollectiveRequest, EndpointConfig, OperationError
from cco.nodes.deadlines import earlier
from cco.nodes.endpoint_states import (
    ABORTED,
    ALL_SENT,
    BAD_CHUNK,
    CHUNK,
    DATA_EVENTS,
    DEADLINE,
    DUPLICATE,
    ERROR_PARENT,
    ERROR_RENDEZVOUS,
    LAST_CHUNK,
    LEAVE,
    LINK_TABLE,
    LOST,
    OPERATION_TABLE,
    PARENT_CONNECTED,
    PARENT_LOST,
    RENDEZVOUS_CONNECTED,
    RENDEZVOUS_GONE,
    RENDEZVOUS_LOST,
    RESENT,
    RESTART,
    RESUMED,
    SENT,
    SESSION_TABLE,
    START,
    TREE_CONNECTED,
    TREE_DIAL,
    LinkState,
    SessionState,
)
from cco.nodes.events import (
    ClosePeer,
    Command,
    ConnectTo,
    Input,
    Joined,
    JoinFailed,
    MessageMalformed,
    MessageReceived,
    OperationCompleted,
    OperationFailed,
    PeerConnected,
    PeerDisconnected,
    PeerId,
    SendMessage,
    TimerFired,
)
from cco.nodes.operation import (
    Operation,
    OperationState,
    Quorum,
    digest,
    placement,
    presence_pass,
    propose,
    scale_pass,
    source_of,
)
from cco.nodes.replies import clip, ranks_text, refuse
from cco.wire import blockscale, payload
from cco.wire.dtypes import ELEMENT_TYPES
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.mac import CoefficientCache
from cco.wire.messages import (
    MAX_TOTAL_ELEMENTS,
    ROOTED_KINDS,
    Abort,
    BroadcastData,
    ChunkAck,
    ChunkMessage,
    Contribution,
    EpochChange,
    Error,
    GroupParams,
    Heartbeat,
    JoinAccept,
    JoinReject,
    JoinRequest,
    Leave,
    Message,
    Result,
    RetransmitRequest,
    TreeAssignment,
)
from cco.wire.ops import CONSISTENCY_OPS, SUM_KINDS, Form, check_operation, form, sums_exactly
from cco.wire.packing import WIDTHS, unpack
from cco.wire.registries import Collective, DType, ReduceOp, Role

_FINISHED = (OperationState.COMPLETED, OperationState.FAILED)
_TERMINAL = (SessionState.REJECTED, SessionState.LEFT, SessionState.CLOSED)
_HELD_BACK = (OperationState.QUEUED, OperationState.SENDING)

# Per-call constants, built once: on Python 3.11 every ``Enum.MEMBER`` lookup goes through
# EnumType.__getattr__, and a plain Enum hashes in Python, so the per-round checks test
# identity against these tuples instead of building tuples or consulting the table.
_STARTABLE = tuple(state for state in SessionState if SESSION_TABLE.allows(state, START))
_WHOLE_GROUP = (Collective.ALL_GATHER, Collective.REDUCE_SCATTER)  # need every rank
# The members the per-round paths test, for the same reason: a lookup through
# EnumType.__getattr__ costs some 900 instructions, a module constant a dict lookup.
_READY = SessionState.READY
_BARRIER, _BROADCAST = Collective.BARRIER, Collective.BROADCAST
_ALL_GATHER, _REDUCE_SCATTER = Collective.ALL_GATHER, Collective.REDUCE_SCATTER
_BLOCK_SCALED = Form.BLOCK_SCALED
# What _on_parent narrows a data message to, as tuples: ``A | B`` builds a union object per call.
_FROM_PARENT = (Result, BroadcastData, Abort, RetransmitRequest, ChunkAck)
_FOR_AN_OPERATION = (Result, BroadcastData, Abort)


@dataclass(slots=True)
class Prepared:
    """A call checked and planned by :meth:`EndpointMachine.prepare`, not yet started.

    :meth:`compute` does its whole-tensor work: a block-scaled operation's proposed
    scale for every block, or, for the other forms, encoding every chunk once so that
    an unencodable value fails the call before anything is sent.  It reads only the
    caller's array and this plan, so it may run on another thread (numpy releases the
    GIL for the large parts) while the machine's thread serves every connection.
    """

    request: CollectiveRequest
    operation: Operation
    params: GroupParams
    width: int | None  # bytes per element of a block-scaled operation; None for the other forms
    limit: int  # the block-scaled sum limit Q
    error: CcoError | None = None
    computed: bool = False

    def compute(self) -> None:
        if self.computed:
            return
        try:
            if self.width is not None:
                block_elements = self.params.block_elements
                self.operation.scaling = propose(self.operation, self.width, self.limit, block_elements)
            else:
                self.operation.check_encodes()
        except CcoError as error:
            self.error = error
        self.computed = True


_NUMPY_DTYPES: dict[np.dtype[np.generic], DType] = {
    t.storage: code for code, t in ELEMENT_TYPES.items() if code is not DType.BFLOAT16
}


# --- the machine ------------------------------------------------------------------


class EndpointMachine:
    """One group membership: ``handle(event, now)``, ``start``, ``leave``, ``next_deadline``."""

    def __init__(self, config: EndpointConfig) -> None:
        self.config = config
        self._state = SessionState.IDLE
        self._link = LinkState.ATTACHED
        self._detached_at: float | None = None
        self._rendezvous: PeerId | None = None
        self._parent: PeerId | None = None
        self._parent_node: str | None = None
        self._parent_up = False
        self._dials = 0
        self._retry_at: float | None = None
        self._rank: int | None = None
        self._world_size = config.world_size
        self._epoch = 0
        self._members: frozenset[int] = frozenset()
        self._accepted: frozenset[int] = frozenset()
        self._recent: OrderedDict[tuple[int, int], ChunkMessage] = OrderedDict()
        """The last 2 x window chunks this rank sealed (their payload at its width: a few
        MiB at most), to seal again for a rank that restarts an operation this one
        completed (see _send_again)."""
        self._no_tree: str | None = None  # why no tree can be had (NO_AGGREGATOR), until one is assigned
        self._coefficients: CoefficientCache | None = None
        """The MAC coefficients of the chunks sealed last (window + 1 of them, 16 bytes
        per element, 16 MiB at most), so that verifying each chunk's Result does not
        derive them again."""
        self._params: GroupParams | None = None
        self._keys: payload.GroupKeys | None = None
        self._secret = b""  # to recognise the same group when resuming
        self._assignment: TreeAssignment | None = None
        self._joined = False
        self._heartbeat_seq = 0
        self._next_heartbeat: float | None = None
        self._last_heard = 0.0
        self._next_op_id = 0
        self._ops: OrderedDict[int, Operation] = OrderedDict()
        self._early: dict[int, list[ChunkMessage | Abort]] = {}
        self._early_count = 0
        self._outstanding = 0

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
        return self._rank

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def members(self) -> frozenset[int]:
        """The group's members in the current epoch, as the rendezvous announced them."""
        return self._members

    @property
    def accepted_members(self) -> frozenset[int]:
        """The members collectives run over: the group at join, or as last accepted."""
        return self._accepted

    def accept_membership(self) -> frozenset[int]:
        """Accept the current membership: later collectives run over these ranks."""
        self._accepted = self._members
        return self._accepted

    @property
    def group_id(self) -> bytes:
        return self.config.group_id

    @property
    def kept_chunks(self) -> list[tuple[int, int]]:
        """(op_id, chunk_index) of the sealed chunks kept to seal again for a rank that
        restarts an operation this one completed: the last 2 x window, oldest first."""
        return list(self._recent)

    @property
    def outstanding(self) -> int:
        """Chunks sent whose result has not come back, across all operations."""
        return self._outstanding

    def operation_state(self, op_id: int) -> OperationState | None:
        op = self._ops.get(op_id)
        return op.state if op else None

    # --- local API ------------------------------------------------------------

    def prepare(self, request: CollectiveRequest) -> Prepared:
        """Check a call and plan it, without starting it: what :meth:`start` does before
        the operation gets its op_ids.  The whole-tensor work (:meth:`Prepared.compute`)
        reads only the array and the plan, so the I/O layer may run it on another thread
        and pass the result to :meth:`start`, which the machine's own thread calls.

        Raises :class:`CcoError` for misuse (not joined, bad arguments).
        """
        self._check_startable()
        assert self._params is not None and self._rank is not None
        dtype, op, root, array = self._check_request(request)
        element = ELEMENT_TYPES[dtype]
        if array is not None and array.dtype != element.storage:
            raise CcoError(ErrorCode.INVALID_FIELD, f"{dtype.name} arrays are numpy {element.storage}")
        if request.out is not None:
            self._check_out(request, array, element.storage)
        check_operation(request.kind, op, dtype, 0 if array is None else array.size)
        exact = array is not None and sums_exactly(request.kind, op, dtype, array.size)
        scaled = form(request.kind, op, dtype, exact) is _BLOCK_SCALED
        width = self._wire_width(request, dtype, op, scaled or exact)  # checked; unused when EXACT
        sending = request.kind is not _BROADCAST or root == self._rank
        source = source_of(array) if sending else None
        placed = placement(request.kind, dtype, source, self._rank, exact)
        if source is not None:
            total = len(placed) * (self._world_size if request.kind is _ALL_GATHER else 1)
        elif array is not None:  # a broadcast receiver that knows the shape
            total = array.size * element.patterns_per_element
        else:  # learnt from the first verified chunk
            total = -1
        timeout = request.timeout if request.timeout is not None else self._default_timeout()
        operation = Operation(
            op_id=-1,  # given by start()
            kind=request.kind,
            op=op,
            dtype=dtype,
            root=root,
            rank=self._rank,
            world_size=self._world_size,
            total=total,
            shape=array.shape if array is not None else None,
            source=source,
            placed=placed,
            deadline=0.0,  # from start()'s now
            timeout=timeout,
            watchdog=request.timeout is None,
            exact=exact,
            out=request.out,
        )
        if total >= 0:
            operation.size(total, self._params.chunk_elements, frozenset())
        limit = blockscale.sum_limit(width, self._world_size) if scaled else 0
        return Prepared(request, operation, self._params, width if scaled else None, limit)

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
        if prepared is None or prepared.request is not request or prepared.params != self._params:
            prepared = self.prepare(request)  # which checks that the session can start
        else:
            self._check_startable()
        if len(self._members) < self._world_size and request.kind in _WHOLE_GROUP:
            raise CcoError(
                ErrorCode.UNSUPPORTED_FEATURE,
                f"{request.kind.name} needs every rank of {self._world_size}; "
                f"members are {ranks_text(self._members)}",
            )
        operation = prepared.operation
        scaled = prepared.width is not None
        first = self._next_op_id  # the call's first wire operation: its presence or scale pass, if any
        presence_id = first if request.quorum is not None else None
        scale_id = first + (presence_id is not None) if scaled else None
        self._next_op_id += 1 + (presence_id is not None) + (scale_id is not None)
        op_id = self._next_op_id - 1
        refusal = self._refusal(op_id, request.kind)
        if refusal is not None:
            return op_id, [OperationFailed(op_id, refusal)]
        operation.op_id = op_id
        operation.deadline = now + operation.timeout
        if operation.total >= 0 and not operation.members:
            # prepare() sized it under these parameters; only the members are of now
            operation.members = self._members
        prepared.compute()
        if prepared.error is not None:
            return op_id, self._refuse_start(first, op_id, request.kind, prepared.error)
        out: list[Command] = []
        passes: list[Operation] = []
        if operation.scaling is not None:
            assert scale_id is not None
            passes.append(scale_pass(scale_id, operation))
        if request.quorum is not None:
            assert presence_id is not None
            presence = presence_pass(presence_id, operation, request.quorum, self._accepted)
            presence.decides = tuple(p.op_id for p in [*passes, operation])
            for gated in [*passes, operation]:
                gated.gated = True
            passes.insert(0, presence)
        out += self._begin([*passes, operation], now)
        if operation.state not in _FINISHED:
            out += self._pump(now)
        return op_id, out

    def _check_startable(self) -> None:
        if self._state not in _STARTABLE:
            raise CcoError(
                ErrorCode.PROTOCOL_VIOLATION, f"start() is not allowed in state {self._state.name}"
            )

    def _refusal(self, op_id: int, kind: Collective) -> OperationError | None:
        """Why an operation cannot run now, if it cannot: the members changed and were
        not accepted, or no aggregator can serve the group."""
        group_id = self.config.group_id
        if self._members != self._accepted:
            lost, joined = self._accepted - self._members, self._members - self._accepted
            changes = [f"ranks {ranks_text(lost)} left"] if lost else []
            changes += [f"ranks {ranks_text(joined)} joined"] if joined else []
            detail = (
                f"the membership changed in epoch {self._epoch} ({', '.join(changes)}): accept the new "
                f"membership ({ranks_text(self._members)}) to run collectives over it"
            )
            return OperationError(
                ErrorCode.PEER_LOST, detail, group_id=group_id, op_id=op_id, kind=kind, missing_ranks=lost
            )
        if self._no_tree is not None:
            return OperationError(
                ErrorCode.NO_AGGREGATOR, self._no_tree, group_id=group_id, op_id=op_id, kind=kind
            )
        return None

    def _begin(self, operations: list[Operation], now: float) -> list[Command]:
        """Register a call's wire operations, then replay what arrived for them before
        they started (a presence pass that completes so decides the ones after it)."""
        for operation in operations:
            self._ops[operation.op_id] = operation
            if operation.source is None:
                self._op_event(operation, ALL_SENT)
        out: list[Command] = []
        for operation in operations:
            early = self._early.pop(operation.op_id, [])
            self._early_count -= len(early)
            for message in early:
                if operation.state in _FINISHED:
                    break
                out += self._on_op_message(operation, message, now)
        return out

    def leave(self, now: float) -> list[Command]:
        """Leave the group: tell the rendezvous, fail what is in flight, close.  Every
        state allows it (in the terminal ones it does nothing)."""
        was = self._state
        self._state = SESSION_TABLE.next(self._state, LEAVE)
        if was is self._state:
            return []
        out = self._fail_all(ErrorCode.ABORTED, "this rank left the group", None)
        if self._rendezvous is not None:
            if self._rank is not None and was is not SessionState.JOINING:
                leave = Leave(group_id=self.config.group_id, rank=self._rank, code=ErrorCode.NO_ERROR)
                out.append(SendMessage(self._rendezvous, leave))
            out.append(ClosePeer(self._rendezvous, ErrorCode.NO_ERROR, "left the group"))
        out += self._drop_parent("left the group")
        self._rendezvous = None
        self._next_heartbeat = None
        self._detached_at = None
        return out

    # --- driving --------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """The earliest timer: an operation's deadline or resend time, the heartbeat or
        the rendezvous's silence, the parent's redial, the detached link's grace.  The
        I/O layer asks after every input, so this is one pass that builds no lists."""
        earliest = self._retry_at
        if self._rendezvous is not None and self._next_heartbeat is not None and self._params is not None:
            earliest = earlier(earliest, self._next_heartbeat)
            earliest = earlier(earliest, self._last_heard + 3 * self._heartbeat_interval)
        if self._detached_at is not None:
            earliest = earlier(earliest, self._detached_at + self.config.rendezvous_grace)
        for op in self._ops.values():
            earliest = earlier(earliest, op.deadline)
            if op.outstanding:
                earliest = earlier(earliest, min(op.outstanding.values()) + op.timeout / 2)
        return earliest

    def handle(self, event: Input, now: float) -> list[Command]:
        """Process one input; never raises for anything a peer can send."""
        if isinstance(event, MessageReceived):  # first: the input of every round
            if event.peer == self._rendezvous:
                self._last_heard = now
                return self._on_rendezvous(event.message, now)
            if event.peer == self._parent:
                return self._on_parent(event.message, now)
            return [refuse(event.peer, event.message, ErrorCode.UNAUTHORIZED, "not a peer of this session")]
        if isinstance(event, PeerConnected):
            return self._on_connected(event, now)
        if isinstance(event, PeerDisconnected):
            return self._on_disconnected(event, now)
        if isinstance(event, MessageMalformed):  # a connection error: report it, close, forget the peer
            code, detail = event.error.code, clip(event.error.detail)
            closing: list[Command] = [
                SendMessage(event.peer, Error(code=code, detail=detail)),
                ClosePeer(event.peer, code, detail),
            ]
            return closing + self._on_disconnected(PeerDisconnected(event.peer, code, detail), now)
        if isinstance(event, TimerFired):
            return self._on_timer(now)
        raise CcoError(ErrorCode.INTERNAL_ERROR, f"not an input: {event!r}")

    # --- session transitions -------------------------------------------------

    def _session_event(self, event: str) -> bool:
        """Move the session if ``event`` is legal now; False means refuse it."""
        moved = SESSION_TABLE.after(self._state, event)
        if moved is None:
            return False
        self._state = moved
        return True

    def _on_connected(self, event: PeerConnected, now: float) -> list[Command]:
        if event.role is Role.RENDEZVOUS and self._rank is not None:
            return self._resume(event, now)
        if event.role is Role.RENDEZVOUS:
            if not self._session_event(RENDEZVOUS_CONNECTED):
                return [ClosePeer(event.peer, ErrorCode.PROTOCOL_VIOLATION, f"session is {self._state.name}")]
            self._rendezvous = event.peer
            self._last_heard = now
            return [SendMessage(event.peer, self._join_request(self.config.rank))]
        if (
            event.peer == self._parent
            and event.role is Role.AGGREGATOR
            and event.node_id == self._parent_node
        ):
            if not self._session_event(PARENT_CONNECTED):
                return []
            self._parent_up = True
            self._retry_at = None
            self._resume_all()
            out: list[Command] = []
            if not self._joined:
                self._joined = True
                assert self._rank is not None
                out.append(Joined(self.config.group_id, self._rank, self._world_size, self._epoch))
            return out + self._pump(now)
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
        if event.peer == self._rendezvous:
            self._rendezvous = None
            return self._lose_rendezvous(f"rendezvous connection closed ({event.code.name})", now)
        if event.peer != self._parent or not self._session_event(PARENT_LOST):
            return []
        self._parent_up = False
        if self._state in (SessionState.CONNECTING, SessionState.RECONNECTING):
            self._retry_at = now + self.config.retry_interval
        self._interrupt_all(f"connection to parent {self._parent_node} lost ({event.code.name})")
        return []

    def _lose_rendezvous(self, why: str, now: float) -> list[Command]:
        """Before the JoinAccept the join fails; after it the session detaches and the
        collectives go on over the current tree (see ``rendezvous_grace``)."""
        joining = self._state in (SessionState.IDLE, SessionState.JOINING)
        if not self._session_event(RENDEZVOUS_LOST):
            return []
        out = self._close_rendezvous(why)
        if joining:
            return [*out, JoinFailed(self.config.group_id, ErrorCode.PEER_LOST, why), *self._end(why)]
        self._link = LINK_TABLE.next(self._link, RENDEZVOUS_LOST)
        if self._detached_at is None:
            self._detached_at = now
        return out

    def _resume(self, event: PeerConnected, now: float) -> list[Command]:
        """A new rendezvous connection of a joined session: ask for the same rank."""
        if not LINK_TABLE.allows(self._link, RENDEZVOUS_CONNECTED) or self._state in _TERMINAL:
            why = f"the rendezvous link is {self._link.name} in session state {self._state.name}"
            return [ClosePeer(event.peer, ErrorCode.PROTOCOL_VIOLATION, why)]
        self._link = LINK_TABLE.next(self._link, RENDEZVOUS_CONNECTED)
        self._rendezvous = event.peer
        self._last_heard = now
        return [SendMessage(event.peer, self._join_request(self._rank))]

    def _on_resume_answer(self, message: JoinAccept | JoinReject | Error, now: float) -> list[Command]:
        """The rendezvous's answer to the resuming JoinRequest: the same rank, group
        secret, world size and epoch resume the membership (if the group moved on
        meanwhile, the EpochChange and TreeAssignment this rank missed follow).  A newer
        epoch means messages of the old rendezvous process never arrived, so this rank
        cannot know the members or the tree of that epoch; like any other answer, it
        means the rendezvous no longer has this membership."""
        assert self._rendezvous is not None and self._params is not None
        if isinstance(message, JoinAccept):
            same = (
                message.rank == self._rank
                and message.world_size == self._world_size
                and hmac.compare_digest(message.group_secret, self._secret)
                and message.epoch == self._epoch
            )
            if same:
                self._link = LINK_TABLE.next(self._link, RESUMED)
                self._detached_at = None
                self._next_heartbeat = now + self._heartbeat_interval
                return []
            why = (
                f"the rendezvous came back without this membership (rank {message.rank}, epoch "
                f"{message.epoch} where this rank has {self._epoch}, or another group secret or world size)"
            )
        else:
            why = f"the rendezvous refused to resume this membership: {message.detail}"
        return self._gone(why)

    def _gone(self, why: str) -> list[Command]:
        """The rendezvous will not have this membership again: the session closes."""
        self._detached_at = None
        if not self._session_event(RENDEZVOUS_GONE):
            return []
        return self._close_rendezvous(why) + self._end(why)

    def _close_rendezvous(self, why: str) -> list[Command]:
        """Close the rendezvous connection (if any) and stop heartbeating it."""
        peer, self._rendezvous = self._rendezvous, None
        self._next_heartbeat = None
        return [ClosePeer(peer, ErrorCode.PEER_LOST, why)] if peer is not None else []

    def _end(self, why: str) -> list[Command]:
        """The membership is over: fail what is in flight and close the parent."""
        return self._fail_all(ErrorCode.PEER_LOST, why, None) + self._drop_parent(why)

    def _drop_parent(self, why: str) -> list[Command]:
        peer, self._parent = self._parent, None
        self._parent_node = None
        self._parent_up = False
        self._retry_at = None
        return [ClosePeer(peer, ErrorCode.NO_ERROR, why)] if peer is not None else []

    def _on_rendezvous(self, message: Message, now: float) -> list[Command]:
        assert self._rendezvous is not None
        if self._link is LinkState.RESUMING and isinstance(message, JoinAccept | JoinReject | Error):
            return self._on_resume_answer(message, now)
        name = ERROR_RENDEZVOUS if isinstance(message, Error) else type(message).__name__
        if isinstance(message, TreeAssignment):
            name = self._classify_tree(message)
        if isinstance(message, JoinAccept | JoinReject | TreeAssignment | EpochChange) and (
            message.group_id != self.config.group_id
        ):
            return [refuse(self._rendezvous, message, ErrorCode.UNKNOWN_GROUP, "not this session's group")]
        if isinstance(message, TreeAssignment) and message.parent is None:
            return [refuse(self._rendezvous, message, ErrorCode.INVALID_FIELD, "an endpoint needs a parent")]
        if isinstance(message, TreeAssignment | EpochChange) and message.epoch < self._epoch:
            return [
                refuse(
                    self._rendezvous,
                    message,
                    ErrorCode.STALE_EPOCH,
                    f"epoch {message.epoch} is older than {self._epoch}",
                )
            ]
        if not self._session_event(name):
            return [
                refuse(
                    self._rendezvous,
                    message,
                    ErrorCode.PROTOCOL_VIOLATION,
                    f"{name} is not allowed in state {self._state.name}",
                )
            ]
        if isinstance(message, JoinAccept):
            return self._on_accept(message, now)
        if isinstance(message, JoinReject):
            why = f"join rejected: {message.detail}"
            return [
                JoinFailed(self.config.group_id, message.code, why),
                ClosePeer(self._rendezvous, message.code, why),
            ]
        if isinstance(message, TreeAssignment):
            return self._on_tree(message, name, now)
        if isinstance(message, EpochChange):
            return self._on_epoch_change(message)
        if self._state is SessionState.REJECTED:  # an Error answered the JoinRequest
            assert isinstance(message, Error)
            why = f"join refused: {message.detail}"
            return [
                JoinFailed(self.config.group_id, message.code, why),
                ClosePeer(self._rendezvous, message.code, why),
            ]
        return []  # Heartbeat or a report: liveness already noted

    def _on_accept(self, message: JoinAccept, now: float) -> list[Command]:
        self._rank = message.rank
        self._world_size = message.world_size
        self._epoch = message.epoch
        self._members = frozenset(range(message.world_size))
        self._accepted = self._members
        self._params = message.params
        self._keys = payload.derive_group_keys(message.group_secret, message.group_id)
        self._coefficients = CoefficientCache(message.params.window + 1)
        self._secret = message.group_secret
        self._next_heartbeat = now + self._heartbeat_interval
        return []

    def _classify_tree(self, message: TreeAssignment) -> str:
        parent = message.parent
        if parent is not None and self._parent_up and parent.node_id == self._parent_node:
            return TREE_CONNECTED
        return TREE_DIAL

    def _on_tree(self, message: TreeAssignment, event: str, now: float) -> list[Command]:
        out: list[Command] = []
        if message.epoch > self._epoch:
            self._interrupt_all(f"the tree changed to epoch {message.epoch}")
        self._no_tree = None
        self._epoch = message.epoch
        self._params = message.params
        self._assignment = message
        if event == TREE_CONNECTED:
            self._resume_all()
            return out + self._pump(now)
        out += self._drop_parent("parent changed")
        assert message.parent is not None
        self._dials += 1
        self._parent = f"parent/{self._epoch}/{self._dials}"
        self._parent_node = message.parent.node_id
        return [*out, ConnectTo(self._parent, message.parent.address, message.parent.node_id)]

    def _on_epoch_change(self, message: EpochChange) -> list[Command]:
        members = ranks_from_bitmap(message.members)
        lost = self._members - members
        self._members = members
        if self.config.elastic:
            self._accepted = members
        self._epoch = message.epoch
        if lost:
            why = f"epoch changed to {message.epoch} ({message.code.name}); ranks {ranks_text(lost)} left"
            return self._fail_all(ErrorCode.PEER_LOST, why, lost)
        if message.code is ErrorCode.NO_AGGREGATOR:
            self._no_tree = f"epoch changed to {message.epoch}: no aggregator can serve the group"
            return self._fail_all(ErrorCode.NO_AGGREGATOR, self._no_tree, None)
        # the same members in a new tree: every operation in flight starts again there
        self._interrupt_all(
            f"epoch changed to {message.epoch} ({message.code.name}); the tree was re-planned"
        )
        return []

    # --- data from the parent ---------------------------------------------------

    def _on_parent(self, message: Message, now: float) -> list[Command]:
        assert self._parent is not None
        if isinstance(message, Heartbeat):
            return []
        name = ERROR_PARENT if isinstance(message, Error) else type(message).__name__
        if name not in DATA_EVENTS or not self._session_event(name):
            return [
                refuse(
                    self._parent,
                    message,
                    ErrorCode.PROTOCOL_VIOLATION,
                    f"{type(message).__name__} is not allowed from the parent in state {self._state.name}",
                )
            ]
        if isinstance(message, Error):
            return self._fail_all(
                message.code, f"parent {self._parent_node} refused our data: {message.detail}", None
            )
        assert isinstance(message, _FROM_PARENT)
        if isinstance(message, ChunkAck) or message.group_id != self.config.group_id:
            return []  # a Result is the acknowledgement; another session's traffic
        if isinstance(message, RetransmitRequest):
            return self._send_again(message, now)
        assert isinstance(message, _FOR_AN_OPERATION)
        op = self._ops.get(message.op_id)
        if op is None:
            if message.op_id >= self._next_op_id and self._early_count < self.config.early_limit:
                self._early.setdefault(message.op_id, []).append(message)
                self._early_count += 1
            return []  # finished operations ignore late traffic
        return self._on_op_message(op, message, now)

    def _on_op_message(self, op: Operation, message: ChunkMessage | Abort, now: float) -> list[Command]:
        if message.epoch != (op.epoch if op.epoch is not None else self._epoch):
            return []  # another epoch's traffic: the operation runs (again) in this one
        if isinstance(message, Abort):
            if message.code in TREE_FAILURES:
                self._interrupt(op, f"aborted by the tree: {message.detail}")
                return []
            missing = ranks_from_bitmap(message.missing) if message.missing is not None else None
            return self._finish_failed(
                op, ABORTED, message.code, f"aborted by the tree: {message.detail}", missing, tell_tree=False
            )
        return self._on_chunk(op, message, now)

    def _on_chunk(self, op: Operation, message: ChunkMessage, now: float) -> list[Command]:
        index = message.chunk_index
        if op.epoch is None and message.epoch != self._epoch:
            return []
        if op.chunks == 0:  # a broadcast receiver without an array learns the size here
            self._size(op, message.total_elements)
        try:
            if index in op.verified:
                self._check_copy(op, message)
                del op.headers[index]  # built again by _check_header: verified chunks keep none
                self._op_event(op, DUPLICATE)
                return []
            values = self._verify(op, message)
        except CcoError as error:
            return self._finish_failed(
                op, BAD_CHUNK, error.code, f"chunk {index}: {error.detail}", None, tell_tree=True
            )
        op.epoch = message.epoch
        op.verified[index] = digest(message)
        del op.headers[index]  # built by _check_header, if not already by _seal
        self._progress(op, now)
        op.decode(index, values)
        if index in op.outstanding:
            del op.outstanding[index]
            self._outstanding -= 1
        if len(op.verified) < op.chunks:
            self._op_event(op, CHUNK)
            return self._pump(now)
        return self._complete(op) + self._pump(now)

    def _check_header(self, op: Operation, message: ChunkMessage) -> None:
        """Refuse a chunk that is not one of this operation's (another op, epoch or shape)."""
        expected_type = BroadcastData if op.kind is _BROADCAST else Result
        header = payload.ChunkHeader.of(message)
        wanted = op.header(self.config.group_id, message.chunk_index, message.epoch)
        if not isinstance(message, expected_type) or header != wanted:
            raise CcoError(
                ErrorCode.OPERATION_MISMATCH,
                f"{type(message).__name__} {header} does not match the operation {wanted}",
            )

    def _check_copy(self, op: Operation, message: ChunkMessage) -> None:
        """A second copy of a verified chunk must carry the same integers (compared by
        digest: the verified integers themselves are not kept)."""
        self._check_header(op, message)
        payload.check_encoding(message)
        if digest(message) != op.verified[message.chunk_index]:
            raise CcoError(
                ErrorCode.DUPLICATE_CONTRIBUTION, f"a different copy of verified chunk {message.chunk_index}"
            )

    def _verify(self, op: Operation, message: ChunkMessage) -> np.ndarray:
        """The chunk's integers if it is the chunk this operation expects and it verifies."""
        self._check_header(op, message)
        assert self._keys is not None and self._rank is not None
        expected = op.members
        if op.kind is _BROADCAST:
            assert op.root is not None
            expected = frozenset({op.root})
        own = None
        if op.op in CONSISTENCY_OPS and op.source is not None:
            own = (self._rank, op.chunk_values(message.chunk_index))
        at_least = None if op.quorum is None else op.quorum.min_ranks
        values = payload.open_verified(self._keys, message, expected, own, at_least, self._coefficients)
        if op.quorum is None:
            return values
        op.contributors = ranks_from_bitmap(message.contributors)
        return values

    def _complete(self, op: Operation) -> list[Command]:
        result: np.ndarray | None = None
        if op.receives:
            if op.decode_error is not None:
                detail = f"decoding: {op.decode_error.detail}"
                return self._finish_failed(op, BAD_CHUNK, op.decode_error.code, detail, None, tell_tree=False)
            assert op.result is not None
            if op.quorum is not None:  # a presence pass: its contributors decide the members
                self._release(op, LAST_CHUNK)
                for decided in op.decides:
                    if (gated := self._ops.get(decided)) is not None:
                        gated.decide(op.contributors, op)
                        if gated.source is None:
                            self._op_event(gated, ALL_SENT)
                return []
            if op.feeds is not None:  # a scale pass: its result is the data operation's scales
                self._release(op, LAST_CHUNK)
                data = self._ops.get(op.feeds)
                if data is not None and data.scaling is not None:
                    data.agree(op.result)
                return []
            result = op.shaped_result()
        self._op_event(op, LAST_CHUNK)
        del self._ops[op.op_id]
        return [OperationCompleted(op.op_id, result, op.listed)]

    def _progress(self, op: Operation, now: float) -> None:
        """A chunk completed: a watchdog deadline (no explicit timeout) moves on, for
        this operation and for the data operation its scale pass feeds."""
        for moving in (op, self._ops.get(op.feeds) if op.feeds is not None else None):
            if moving is not None and moving.watchdog:
                moving.deadline = max(moving.deadline, now + moving.timeout)

    def _send_again(self, request: RetransmitRequest, now: float) -> list[Command]:
        """Send the listed chunks again: sealing is deterministic, so each copy is
        identical to the first and an aggregator that has it recognises it.

        A chunk of an operation this rank already completed is asked for when the
        tree failed after this rank got its result but before another rank did:
        that rank starts the operation again in the new epoch and cannot finish
        without this rank's part.  The last sealed chunks are kept for that and
        sealed again, the same integers under the new epoch's chunk ids."""
        op = self._ops.get(request.op_id)
        if op is None:
            return self._seal_again(request)
        if op.epoch != request.epoch:
            return []
        return self._resend(op, set(request.chunks), now)

    def _seal_again(self, request: RetransmitRequest) -> list[Command]:
        if self._parent is None or not self._parent_up or request.epoch != self._epoch:
            return []
        assert self._keys is not None and self._rank is not None
        out: list[Command] = []
        for index in sorted(set(request.chunks)):
            kept = self._recent.get((request.op_id, index))
            if kept is None or kept.epoch >= request.epoch:
                continue
            header = dataclasses.replace(payload.ChunkHeader.of(kept), epoch=request.epoch)
            values = unpack(kept.payload, kept.width).astype(np.int64)
            out.append(
                SendMessage(self._parent, payload.seal(self._keys, header, self._rank, values, type(kept)))
            )
        return out

    def _resend(self, op: Operation, chunks: set[int], now: float) -> list[Command]:
        if self._parent is None or not self._parent_up:
            return []
        out: list[Command] = []
        for index in sorted(chunks & op.outstanding.keys()):
            op.outstanding[index] = now
            try:
                message = self._seal(op, index)
            except CcoError as error:
                return out + self._input_changed(op, index, error)
            out.append(SendMessage(self._parent, message))
            self._op_event(op, RESENT)
        return out

    # --- sending ----------------------------------------------------------------

    def _pump(self, now: float) -> list[Command]:
        """Send chunks, oldest operation first, while the window has room."""
        if self._state is not _READY or self._params is None or self._parent is None:
            return []
        out: list[Command] = []
        for op in list(self._ops.values()):
            out += self._send_chunks(op, self._parent, self._params.window, now)
            if op.state in _HELD_BACK:
                break  # later operations wait behind this one: chunks leave in call order
        return out

    def _send_chunks(self, op: Operation, parent: PeerId, window: int, now: float) -> list[Command]:
        """Send ``op``'s next chunks while the window has room."""
        out: list[Command] = []
        if op.interrupted is not None or op.gated or (op.scaling is not None and op.scaling.agreed is None):
            return []  # waiting for the next tree, the presence pass or the scale pass
        while op.source is not None and op.next_chunk < op.chunks and self._outstanding < window:
            try:
                message = self._seal(op, op.next_chunk)
            except CcoError as error:
                return out + self._input_changed(op, op.next_chunk, error)
            out.append(SendMessage(parent, message))
            op.outstanding[op.next_chunk] = now
            self._outstanding += 1
            op.next_chunk += 1
            self._op_event(op, SENT if op.next_chunk < op.chunks else ALL_SENT)
        return out

    def _seal(self, op: Operation, index: int) -> ChunkMessage:
        assert self._keys is not None and self._rank is not None
        if op.epoch is None:
            op.epoch = self._epoch
            op.members = op.listed if op.listed is not None else self._members
        cls: type[ChunkMessage] = BroadcastData if op.kind is _BROADCAST else Contribution
        sealed = payload.seal(
            self._keys,
            op.header(self.config.group_id, index, op.epoch),
            self._rank,
            op.chunk_values(index),
            cls,
            self._coefficients,
        )
        self._recent[(op.op_id, index)] = sealed
        self._recent.move_to_end((op.op_id, index))
        while len(self._recent) > 2 * self._window:
            self._recent.popitem(last=False)
        return sealed

    @property
    def _window(self) -> int:
        assert self._params is not None
        return self._params.window

    def _wire_width(self, request: CollectiveRequest, dtype: DType, op: ReduceOp, scaled: bool) -> int:
        """Bytes per integer of a block-scaled operation (0 for the other forms)."""
        if request.width is not None:
            if not scaled:
                raise CcoError(
                    ErrorCode.INVALID_FIELD,
                    f"width applies to float SUM and AVG reductions, not {dtype.name} {op.name} "
                    f"in {request.kind.name}",
                )
            if request.width not in tuple(8 * w for w in WIDTHS):
                raise CcoError(ErrorCode.INVALID_FIELD, f"width {request.width} is not 8, 16, 32 or 64 bits")
            return request.width // 8
        if not scaled:
            return 0
        assert self._params is not None
        if self._params.float_width is not None:
            return self._params.float_width
        return ELEMENT_TYPES[dtype].bits // 8

    def _size(self, op: Operation, total: int) -> None:
        assert self._params is not None
        op.size(total, self._params.chunk_elements, self._members)

    # --- failures ---------------------------------------------------------------

    def _refuse_start(self, first: int, op_id: int, kind: Collective, error: CcoError) -> list[Command]:
        """An operation whose input cannot be encoded: fail it, and tell the tree so
        the other ranks fail at once instead of waiting for this rank.  The Abort names
        ``first``, the first wire operation of the call (its scale pass, if any)."""
        assert self._rank is not None
        out: list[Command] = []
        if self._state is SessionState.READY and self._parent is not None:
            abort = Abort(
                group_id=self.config.group_id,
                epoch=self._epoch,
                op_id=first,
                code=error.code,
                detail=clip(f"rank {self._rank}: {error.detail}"),
                missing=bitmap_from_ranks([self._rank]),
            )
            out.append(SendMessage(self._parent, abort))
        failure = OperationError(
            error.code,
            error.detail,
            group_id=self.config.group_id,
            op_id=op_id,
            kind=kind,
            missing_ranks=frozenset({self._rank}),
        )
        return [*out, OperationFailed(op_id, failure)]

    def _input_changed(self, op: Operation, index: int, error: CcoError) -> list[Command]:
        """Chunk ``index`` encoded at start() but no longer does: the caller changed the
        array before the operation completed.  Fail the operation, and tell the tree so
        the other ranks fail at once instead of waiting for this rank."""
        assert self._rank is not None
        detail = f"chunk {index}: the input changed before the operation completed: {error.detail}"
        missing = frozenset({self._rank})
        return self._finish_failed(op, BAD_CHUNK, error.code, detail, missing, tell_tree=True)

    def _finish_failed(
        self,
        op: Operation,
        event: str,
        code: ErrorCode,
        detail: str,
        missing: frozenset[int] | None,
        *,
        tell_tree: bool,
    ) -> list[Command]:
        """Fail one operation; release its window share; optionally tell the tree.

        A scale pass fails the data operation it feeds (which is what the caller
        sees); a data operation takes its unfinished scale pass with it."""
        if self._ops.get(op.op_id) is not op:
            return []  # already ended, with its scale pass or its data operation
        self._release(op, event)
        out: list[Command] = []
        if tell_tree and self._parent_up and self._parent is not None and op.epoch is not None:
            abort = Abort(
                group_id=self.config.group_id,
                epoch=op.epoch,
                op_id=op.op_id,
                code=code,
                detail=clip(f"rank {self._rank}: {detail}"),
                missing=bitmap_from_ranks(missing) if missing else None,
            )
            out.append(SendMessage(self._parent, abort))
        if op.feeds is not None:
            data = self._ops.get(op.feeds)
            if data is None:
                return out
            # Other ranks may have finished their scale pass already: they hear of this
            # failure through an Abort of the data operation.
            data.epoch = op.epoch
            failure = f"{'presence' if op.quorum is not None else 'scale'} pass: {detail}"
            return out + self._finish_failed(data, event, code, failure, missing, tell_tree=tell_tree)
        for wire_pass in [p for p in self._ops.values() if p.feeds == op.op_id]:
            self._release(wire_pass, LOST)
        out.append(OperationFailed(op.op_id, self._error(op, code, detail, missing)))
        return out

    def _release(self, op: Operation, event: str) -> None:
        """End ``op`` here: forget it and give its outstanding chunks back to the window."""
        self._op_event(op, event)
        del self._ops[op.op_id]
        self._outstanding -= len(op.outstanding)
        op.outstanding.clear()

    def _interrupt_all(self, why: str) -> None:
        for op in list(self._ops.values()):
            self._interrupt(op, why)

    def _interrupt(self, op: Operation, why: str) -> None:
        """The tree ``op`` ran in failed: forget its progress and wait for the next tree,
        where it starts again from this rank's own input (new epoch, new chunk ids: no
        integer of the old tree is counted or accepted again).  Its deadline stands.

        A block-scaled operation also runs its scale pass again, so that every rank
        agrees on its scales in the same tree, whatever it had received before."""
        if op.interrupted is not None:
            return
        op.interrupted = why
        self._op_event(op, RESTART)
        self._outstanding -= len(op.outstanding)
        op.forget_progress()
        if op.scaling is not None and op.scaling.agreed is not None:
            op.agree(None)
            agreement = scale_pass(op.op_id - 1, op)
            if op.listed is not None:
                agreement.decide(op.listed, op.presence)
            self._again(agreement, why)
        presence = op.presence
        if presence is not None and presence.op_id not in self._ops and self._rank in (op.listed or ()):
            # A rank that lost the decision with the tree starts its presence pass again:
            # this rank, a member of the decided set, takes part again, so that the
            # new pass decides the same members (the decision itself is kept here).
            assert presence.quorum is not None
            data = op if op.feeds is None else self._ops.get(op.feeds, op)
            self._again(presence_pass(presence.op_id, data, presence.quorum, presence.members), why)

    def _again(self, wire_pass: Operation, why: str) -> None:
        """A pass this rank had completed, to run again in the next tree, in call order."""
        wire_pass.interrupted = why
        self._ops[wire_pass.op_id] = wire_pass
        self._ops = OrderedDict(sorted(self._ops.items()))  # call order, for the window

    def _resume_all(self) -> None:
        """A tree is ready: interrupted operations start again (in the current epoch)."""
        for op in self._ops.values():
            if op.interrupted is not None:
                op.interrupted = None
                if op.source is None:
                    self._op_event(op, ALL_SENT)  # a broadcast receiver only waits

    def _fail_all(self, code: ErrorCode, detail: str, missing: frozenset[int] | None) -> list[Command]:
        """Fail every operation in flight (the tree they used is gone) and forget early data."""
        out: list[Command] = []
        for op in list(self._ops.values()):
            out += self._finish_failed(op, LOST, code, detail, missing, tell_tree=False)
        for queued in self._early.values():
            self._early_count -= len(queued)
        self._early.clear()
        return out

    def _error(
        self, op: Operation, code: ErrorCode, detail: str, missing: frozenset[int] | None
    ) -> OperationError:
        missing_chunks = tuple(i for i in range(op.chunks) if i not in op.verified)
        return OperationError(
            code,
            detail,
            group_id=self.config.group_id,
            op_id=op.op_id,
            kind=op.kind,
            missing_ranks=missing,
            missing_chunks=missing_chunks,
        )

    def _op_event(self, op: Operation, event: str) -> None:
        op.state = OPERATION_TABLE.next(op.state, event)

    # --- timers -----------------------------------------------------------------

    @property
    def _heartbeat_interval(self) -> float:
        assert self._params is not None
        return self._params.heartbeat_interval_ms / 1000

    def _default_timeout(self) -> float:
        assert self._params is not None
        return self._params.operation_timeout_ms / 1000 + self._heartbeat_interval

    def _on_timer(self, now: float) -> list[Command]:
        out: list[Command] = []
        if self._rendezvous is not None and self._next_heartbeat is not None and self._params is not None:
            if now >= self._last_heard + 3 * self._heartbeat_interval:
                out += self._lose_rendezvous(
                    "no message from the rendezvous for three heartbeat intervals", now
                )
            elif now >= self._next_heartbeat:
                self._heartbeat_seq += 1
                out.append(SendMessage(self._rendezvous, Heartbeat(seq=self._heartbeat_seq)))
                self._next_heartbeat = now + self._heartbeat_interval
        if self._detached_at is not None and now >= self._detached_at + self.config.rendezvous_grace:
            out += self._gone(f"the rendezvous was not back within {self.config.rendezvous_grace:g}s")
        if self._retry_at is not None and now >= self._retry_at:
            self._retry_at = None
            if self._assignment is not None and self._parent_node is not None and not self._parent_up:
                out += self._redial()
        for op in list(self._ops.values()):
            # A result overdue by half the timeout may have been lost with a connection:
            # ask again by sending the chunk again (an aggregator answers a copy of a
            # completed chunk with its Result), and again every half timeout after.
            overdue = {i for i, sent in op.outstanding.items() if sent + op.timeout / 2 <= now}
            if overdue:
                out += self._resend(op, overdue, now)
        for op in [op for op in self._ops.values() if op.deadline <= now]:
            missing = sorted(set(range(op.chunks)) - op.verified.keys())
            detail = f"no verified result for chunks {missing} after {op.timeout:g}s"
            if op.interrupted is not None:
                detail += f" (waiting for a new tree since: {op.interrupted})"
            out += self._finish_failed(op, DEADLINE, ErrorCode.TIMEOUT, detail, None, tell_tree=True)
        return out

    def _redial(self) -> list[Command]:
        assert self._assignment is not None and self._assignment.parent is not None
        parent = self._assignment.parent
        self._dials += 1
        self._parent = f"parent/{self._epoch}/{self._dials}"
        return [ConnectTo(self._parent, parent.address, parent.node_id)]

    # --- argument checks --------------------------------------------------------

    def _check_request(
        self, request: CollectiveRequest
    ) -> tuple[DType, ReduceOp, int | None, np.ndarray | None]:
        """The call's dtype, op and root, and its array as numpy (None if it has none)."""
        kind = request.kind
        world = self._world_size
        needs_root = kind in ROOTED_KINDS
        if needs_root != (request.root is not None):
            raise CcoError(
                ErrorCode.INVALID_FIELD, f"{kind.name} {'needs' if needs_root else 'takes no'} root"
            )
        if request.root is not None and not 0 <= request.root < world:
            raise CcoError(ErrorCode.INVALID_FIELD, f"root {request.root} is not a rank of {world}")
        if kind in SUM_KINDS and request.op is not ReduceOp.SUM:
            raise CcoError(ErrorCode.INVALID_FIELD, f"{kind.name} takes no reduction op")
        if request.timeout is not None and request.timeout <= 0:
            raise CcoError(ErrorCode.INVALID_FIELD, f"timeout {request.timeout} is not positive")
        if request.quorum is not None:
            self._check_quorum(kind, request.quorum)
        if kind is _BARRIER:
            barrier_array = None if request.array is None else np.asarray(request.array)
            return DType.INT8, ReduceOp.SUM, None, barrier_array  # prepare() refuses any but int8
        array = request.array
        receiver = kind is _BROADCAST and request.root != self._rank
        if array is None:
            if not receiver or request.dtype is None:
                raise CcoError(ErrorCode.INVALID_FIELD, f"{kind.name} needs an array (or a dtype to receive)")
            return request.dtype, request.op, request.root, None
        array = np.asarray(array)
        dtype = request.dtype if request.dtype is not None else _NUMPY_DTYPES.get(array.dtype)
        if dtype is None:
            raise CcoError(ErrorCode.UNSUPPORTED_FEATURE, f"numpy dtype {array.dtype} is not a CCO dtype")
        size = array.size * (world if kind is _ALL_GATHER else 1)
        if size > MAX_TOTAL_ELEMENTS:
            raise CcoError(ErrorCode.MESSAGE_TOO_LARGE, f"{size} elements exceed {MAX_TOTAL_ELEMENTS}")
        if kind is _REDUCE_SCATTER and array.size % world:
            raise CcoError(ErrorCode.INVALID_FIELD, f"{array.size} elements do not split into {world} parts")
        return dtype, request.op, request.root, array

    def _check_out(self, request: CollectiveRequest, array: np.ndarray | None, storage: np.dtype) -> None:
        """``out`` must take exactly the result, and never overlap the input."""
        out = request.out
        kind = request.kind
        if not isinstance(out, np.ndarray):
            raise CcoError(ErrorCode.INVALID_FIELD, f"out is a {type(out).__name__}, not a numpy array")
        if kind is _BARRIER:
            raise CcoError(ErrorCode.INVALID_FIELD, "BARRIER has no result to write to out")
        if array is None:
            raise CcoError(ErrorCode.INVALID_FIELD, f"{kind.name} with out needs the array too (its shape)")
        if kind is _ALL_GATHER:
            shape: tuple[int, ...] = (self._world_size, *array.shape)
        elif kind is _REDUCE_SCATTER:
            shape = (array.size // self._world_size,)
        else:
            shape = array.shape
        if out.shape != shape or out.dtype != storage:
            raise CcoError(
                ErrorCode.INVALID_FIELD,
                f"out is {out.dtype} of shape {out.shape}; "
                f"the {kind.name} result is {storage} of shape {shape}",
            )
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise CcoError(ErrorCode.INVALID_FIELD, "out must be C-contiguous and writeable")
        if np.may_share_memory(out, array):
            raise CcoError(
                ErrorCode.INVALID_FIELD,
                "out shares memory with the input array, which the operation reads until it completes",
            )

    def _check_quorum(self, kind: Collective, quorum: Quorum) -> None:
        if kind is not Collective.ALL_REDUCE:
            raise CcoError(
                ErrorCode.UNSUPPORTED_FEATURE, f"the quorum policy is for ALL_REDUCE, not {kind.name}"
            )
        members = len(self._accepted)
        if not 1 <= quorum.min_ranks <= members:
            raise CcoError(
                ErrorCode.INVALID_FIELD,
                f"a quorum of {quorum.min_ranks} is not between 1 and the {members} members",
            )
        if not 0 < quorum.wait <= 86_400:
            raise CcoError(ErrorCode.INVALID_FIELD, f"quorum wait {quorum.wait} s is not in (0, 86400]")


__all__ = ["EndpointMachine", "Prepared"]
