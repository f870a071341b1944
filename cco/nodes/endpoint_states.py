"""The endpoint's states and transition tables: its session, the session's link to
the rendezvous, and each operation.

Transitions are data (h2 and h11 style, :mod:`cco.nodes.fsm`): every input maps to a
typed event, the table refuses an event the state does not list and names the
action the machine takes on a legal one, and the draft's state diagrams are drawn
from the tables (:func:`diagrams`), so the three cannot drift apart.
"""

from __future__ import annotations

from enum import Enum, StrEnum

from cco.nodes.fsm import Move, State, TransitionTable
from cco.wire.messages import (
    Abort,
    BroadcastData,
    ChunkAck,
    EpochChange,
    Heartbeat,
    JoinAccept,
    JoinReject,
    Message,
    Result,
    RetransmitRequest,
)


class SessionState(State):
    """One group membership, from the rendezvous connection to leaving."""

    IDLE = "idle"  # waiting for the rendezvous connection
    JOINING = "joining"  # JoinRequest sent
    ACCEPTED = "accepted"  # JoinAccept received; waiting for the first tree
    CONNECTING = "connecting"  # first tree received; dialling the parent
    READY = "ready"  # parent connected: collectives run
    REPLANNING = "replanning"  # the epoch changed; waiting for the new tree
    RECONNECTING = "reconnecting"  # new tree or lost parent; dialling the parent
    REJECTED = "rejected"  # JoinReject (terminal)
    LEFT = "left"  # leave() (terminal)
    CLOSED = "closed"  # the rendezvous is gone for good (terminal)


ENDED = frozenset({SessionState.REJECTED, SessionState.LEFT, SessionState.CLOSED})
"""The states a session never leaves."""


class LinkState(State):
    """The joined session's connection to the rendezvous, beside the session state."""

    ATTACHED = "attached"
    DETACHED = "detached"  # lost: the I/O layer dials again; collectives go on
    RESUMING = "resuming"  # connected again, the JoinRequest that resumes sent


class OperationState(State):
    """One collective call (and each scale or presence pass it runs on the wire)."""

    QUEUED = "queued"  # started, or started again in a new tree; no chunk has left yet
    SENDING = "sending"  # some chunks sent, some still held back by the window
    AWAITING = "awaiting"  # everything sent; waiting for verified results
    COMPLETED = "completed"  # every chunk verified and decoded (terminal)
    FAILED = "failed"  # aborted, timed out, failed verification or lost (terminal)


class SessionEvent(StrEnum):
    """What happens to the session: a message from the rendezvous or the parent, a
    connection coming or going, or a call of the application."""

    RENDEZVOUS_CONNECTED = "rendezvous connected"
    HEARTBEAT = "Heartbeat"
    ERROR_RENDEZVOUS = "Error [rendezvous]"
    RENDEZVOUS_LOST = "rendezvous lost"
    RENDEZVOUS_GONE = "rendezvous gone"  # not back within the grace, or back without this membership
    LEAVE = "leave()"
    JOIN_ACCEPT = "JoinAccept"
    JOIN_REJECT = "JoinReject"
    TREE_DIAL = "TreeAssignment [dial parent]"
    TREE_CONNECTED = "TreeAssignment [parent up]"
    EPOCH_CHANGE = "EpochChange"
    PARENT_CONNECTED = "parent connected"
    PARENT_LOST = "parent lost"
    START = "start()"
    RESULT = "Result"
    BROADCAST_DATA = "BroadcastData"
    ABORT = "Abort"
    RETRANSMIT_REQUEST = "RetransmitRequest"
    CHUNK_ACK = "ChunkAck"
    ERROR_PARENT = "Error [parent]"


class SessionAction(Enum):
    """What the session does on a move of :data:`SESSION_TABLE`."""

    JOIN = "send the JoinRequest"
    NOTE = "nothing more: every message from the rendezvous counts as a sign of life"
    REFUSED = "the join failed: report it and close the rendezvous connection"
    ADOPT = "the membership begins"
    JOIN_LOST = "the join failed: the rendezvous went before it answered"
    DETACH = "detach from the rendezvous; collectives go on over the current tree"
    CLOSE = "the rendezvous will not have this membership again: the session ends"
    LEAVE = "tell the rendezvous, fail what is in flight, close"
    STAY = "nothing: the session is already over"
    DIAL = "adopt the tree and dial its parent"
    RESUME = "adopt the tree; operations go on over the connected parent"
    CHANGE_EPOCH = "adopt the new members; fail or restart what is in flight"
    PARENT_UP = "the parent is connected: operations run"
    REDIAL_LATER = "dial the parent again after a pause; operations wait for it"
    AWAIT_TREE = "operations wait for the new epoch's tree, which names the parent"
    START = "start an operation"
    CHUNK = "verify a chunk of an operation"
    ABORT = "end or restart the operation the tree aborted"
    RESEND = "send the chunks the parent asks for again"
    PARENT_REFUSED = "the parent refused our data: fail what is in flight"


class LinkEvent(StrEnum):
    RENDEZVOUS_LOST = "rendezvous lost"
    RENDEZVOUS_CONNECTED = "rendezvous connected"
    RESUMED = "JoinAccept [same membership]"


class LinkAction(Enum):
    DETACH = "stop heartbeating; the grace period runs"
    RESUME = "send the JoinRequest that resumes the membership"
    ATTACH = "heartbeat again; the grace period is over"


class OperationEvent(StrEnum):
    SENT = "chunk sent"
    ALL_SENT = "all chunks sent"
    CHUNK = "chunk verified"
    LAST_CHUNK = "last chunk verified"
    DUPLICATE = "duplicate chunk"
    RESENT = "chunk sent again"
    BAD_CHUNK = "chunk refused"
    ABORTED = "Abort"
    DEADLINE = "deadline"
    LOST = "members lost or session over"
    RESTART = "tree lost"


class OperationAction(Enum):
    KEEP = "nothing more"
    RELEASE = "it ends here: forget it, and its chunks leave the window"
    RESTART = "forget its progress; it starts again from its input in the next tree"


FROM_RENDEZVOUS: dict[type[Message], SessionEvent] = {
    JoinAccept: SessionEvent.JOIN_ACCEPT,
    JoinReject: SessionEvent.JOIN_REJECT,
    EpochChange: SessionEvent.EPOCH_CHANGE,
    Heartbeat: SessionEvent.HEARTBEAT,
}
"""Messages of the rendezvous whose event is their kind alone (a TreeAssignment is
classified by its parent, an Error is ERROR_RENDEZVOUS)."""

FROM_PARENT: dict[type[Message], SessionEvent] = {
    Result: SessionEvent.RESULT,
    BroadcastData: SessionEvent.BROADCAST_DATA,
    Abort: SessionEvent.ABORT,
    RetransmitRequest: SessionEvent.RETRANSMIT_REQUEST,
    ChunkAck: SessionEvent.CHUNK_ACK,
}
"""The data messages a parent sends (an Error is ERROR_PARENT; a Heartbeat needs no event)."""

_S, _A, _E = SessionState, SessionAction, SessionEvent
DATA_MOVES = {
    _E.RESULT: _A.CHUNK,
    _E.BROADCAST_DATA: _A.CHUNK,
    _E.ABORT: _A.ABORT,
    _E.RETRANSMIT_REQUEST: _A.RESEND,
    _E.CHUNK_ACK: _A.NOTE,  # a Result is the acknowledgement
    _E.ERROR_PARENT: _A.PARENT_REFUSED,
}
"""What the parent sends about data, wherever collectives run (leaving the state as it is)."""


def _moves(
    state: SessionState, specific: dict[SessionEvent, Move[SessionState, SessionAction]]
) -> dict[SessionEvent, Move[SessionState, SessionAction]]:
    """``specific`` plus what every live state allows: heartbeats, reports, the loss of
    the rendezvous (which only detaches a session that has joined), leave()."""
    lost: Move[SessionState, SessionAction] = (
        Move(_S.CLOSED, _A.JOIN_LOST) if state is _S.JOINING else Move(state, _A.DETACH)
    )
    common: dict[SessionEvent, Move[SessionState, SessionAction]] = {
        _E.HEARTBEAT: Move(state, _A.NOTE),
        _E.ERROR_RENDEZVOUS: Move(state, _A.NOTE),
        _E.RENDEZVOUS_LOST: lost,
        _E.RENDEZVOUS_GONE: Move(_S.CLOSED, _A.CLOSE),
        _E.LEAVE: Move(_S.LEFT, _A.LEAVE),
    }
    return {**common, **specific}


def _data(state: SessionState) -> dict[SessionEvent, Move[SessionState, SessionAction]]:
    return {event: Move(state, action) for event, action in DATA_MOVES.items()}


SESSION_TABLE: TransitionTable[SessionState, SessionEvent, SessionAction] = TransitionTable(
    "endpoint session",
    {
        _S.IDLE: {_E.RENDEZVOUS_CONNECTED: Move(_S.JOINING, _A.JOIN), _E.LEAVE: Move(_S.LEFT, _A.LEAVE)},
        _S.JOINING: _moves(
            _S.JOINING,
            {
                _E.JOIN_ACCEPT: Move(_S.ACCEPTED, _A.ADOPT),
                _E.JOIN_REJECT: Move(_S.REJECTED, _A.REFUSED),
                _E.ERROR_RENDEZVOUS: Move(_S.REJECTED, _A.REFUSED),
            },
        ),
        _S.ACCEPTED: _moves(
            _S.ACCEPTED,
            {
                _E.TREE_DIAL: Move(_S.CONNECTING, _A.DIAL),
                _E.EPOCH_CHANGE: Move(_S.ACCEPTED, _A.CHANGE_EPOCH),
            },
        ),
        _S.CONNECTING: _moves(
            _S.CONNECTING,
            {
                _E.PARENT_CONNECTED: Move(_S.READY, _A.PARENT_UP),
                _E.PARENT_LOST: Move(_S.CONNECTING, _A.REDIAL_LATER),
                _E.TREE_DIAL: Move(_S.CONNECTING, _A.DIAL),
                _E.EPOCH_CHANGE: Move(_S.ACCEPTED, _A.CHANGE_EPOCH),
            },
        ),
        _S.READY: _moves(
            _S.READY,
            {
                _E.START: Move(_S.READY, _A.START),
                **_data(_S.READY),
                _E.PARENT_LOST: Move(_S.RECONNECTING, _A.REDIAL_LATER),
                _E.TREE_DIAL: Move(_S.RECONNECTING, _A.DIAL),
                _E.TREE_CONNECTED: Move(_S.READY, _A.RESUME),
                _E.EPOCH_CHANGE: Move(_S.REPLANNING, _A.CHANGE_EPOCH),
            },
        ),
        _S.REPLANNING: _moves(
            _S.REPLANNING,
            {
                _E.START: Move(_S.REPLANNING, _A.START),
                **_data(_S.REPLANNING),
                _E.PARENT_LOST: Move(_S.REPLANNING, _A.AWAIT_TREE),
                _E.TREE_DIAL: Move(_S.RECONNECTING, _A.DIAL),
                _E.TREE_CONNECTED: Move(_S.READY, _A.RESUME),
                _E.EPOCH_CHANGE: Move(_S.REPLANNING, _A.CHANGE_EPOCH),
            },
        ),
        _S.RECONNECTING: _moves(
            _S.RECONNECTING,
            {
                _E.START: Move(_S.RECONNECTING, _A.START),
                _E.PARENT_CONNECTED: Move(_S.READY, _A.PARENT_UP),
                _E.PARENT_LOST: Move(_S.RECONNECTING, _A.REDIAL_LATER),
                _E.TREE_DIAL: Move(_S.RECONNECTING, _A.DIAL),
                _E.EPOCH_CHANGE: Move(_S.REPLANNING, _A.CHANGE_EPOCH),
            },
        ),
        _S.REJECTED: {_E.LEAVE: Move(_S.REJECTED, _A.STAY)},
        _S.LEFT: {_E.LEAVE: Move(_S.LEFT, _A.STAY)},
        _S.CLOSED: {_E.LEAVE: Move(_S.CLOSED, _A.STAY)},
    },
)

_L, _LA = LinkState, LinkAction
LINK_TABLE: TransitionTable[LinkState, LinkEvent, LinkAction] = TransitionTable(
    "endpoint rendezvous link",
    {
        _L.ATTACHED: {LinkEvent.RENDEZVOUS_LOST: Move(_L.DETACHED, _LA.DETACH)},
        _L.DETACHED: {
            LinkEvent.RENDEZVOUS_CONNECTED: Move(_L.RESUMING, _LA.RESUME),
            LinkEvent.RENDEZVOUS_LOST: Move(_L.DETACHED, _LA.DETACH),
        },
        _L.RESUMING: {
            LinkEvent.RESUMED: Move(_L.ATTACHED, _LA.ATTACH),
            LinkEvent.RENDEZVOUS_LOST: Move(_L.DETACHED, _LA.DETACH),
        },
    },
)

_O, _OE, _OA = OperationState, OperationEvent, OperationAction
_ENDINGS = {
    _OE.BAD_CHUNK: Move(_O.FAILED, _OA.RELEASE),
    _OE.ABORTED: Move(_O.FAILED, _OA.RELEASE),
    _OE.DEADLINE: Move(_O.FAILED, _OA.RELEASE),
    _OE.LOST: Move(_O.FAILED, _OA.RELEASE),
    _OE.RESTART: Move(_O.QUEUED, _OA.RESTART),
}
OPERATION_TABLE: TransitionTable[OperationState, OperationEvent, OperationAction] = TransitionTable(
    "endpoint operation",
    {
        # a presence pass may complete before it sent: a quorum went on without this rank
        _O.QUEUED: {
            _OE.SENT: Move(_O.SENDING, _OA.KEEP),
            _OE.ALL_SENT: Move(_O.AWAITING, _OA.KEEP),
            _OE.LAST_CHUNK: Move(_O.COMPLETED, _OA.RELEASE),
            **_ENDINGS,
        },
        _O.SENDING: {
            _OE.SENT: Move(_O.SENDING, _OA.KEEP),
            _OE.ALL_SENT: Move(_O.AWAITING, _OA.KEEP),
            _OE.CHUNK: Move(_O.SENDING, _OA.KEEP),
            _OE.DUPLICATE: Move(_O.SENDING, _OA.KEEP),
            _OE.RESENT: Move(_O.SENDING, _OA.KEEP),
            **_ENDINGS,
        },
        _O.AWAITING: {
            _OE.CHUNK: Move(_O.AWAITING, _OA.KEEP),
            _OE.LAST_CHUNK: Move(_O.COMPLETED, _OA.RELEASE),
            _OE.DUPLICATE: Move(_O.AWAITING, _OA.KEEP),
            _OE.RESENT: Move(_O.AWAITING, _OA.KEEP),
            **_ENDINGS,
        },
    },
)

TABLES = (SESSION_TABLE, LINK_TABLE, OPERATION_TABLE)


def diagrams() -> str:
    """The endpoint's state diagrams, exactly as the draft shows them."""
    return "\n\n".join(t.to_ascii() for t in TABLES)
