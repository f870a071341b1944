"""The endpoint's states and transition tables: its session, the session's link to
the rendezvous, and each operation.

Transitions are data (h11 style): :class:`~cco.nodes.fsm.TransitionTable` refuses
any event a state does not list, the machine in :mod:`cco.nodes.endpoint` consults
these tables before it acts, and the draft's state diagrams are drawn from them
(:func:`diagrams`), so the three cannot drift apart.
"""

from __future__ import annotations

from enum import Enum

from cco.nodes.fsm import TransitionTable
from cco.nodes.operation import OperationState


class SessionState(Enum):
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


class LinkState(Enum):
    """The joined session's connection to the rendezvous, beside the session state."""

    ATTACHED = "attached"
    DETACHED = "detached"  # lost: the I/O layer dials again; collectives go on
    RESUMING = "resuming"  # connected again, the JoinRequest that resumes sent


RENDEZVOUS_CONNECTED = "rendezvous connected"
RENDEZVOUS_LOST = "rendezvous lost"
RENDEZVOUS_GONE = "rendezvous gone"  # not back within the grace, or back without this membership
RESUMED = "JoinAccept [same membership]"
TREE_CONNECTED = "TreeAssignment [parent up]"
TREE_DIAL = "TreeAssignment [dial parent]"
PARENT_CONNECTED = "parent connected"
PARENT_LOST = "parent lost"
START = "start()"
LEAVE = "leave()"
ERROR_RENDEZVOUS = "Error [rendezvous]"
ERROR_PARENT = "Error [parent]"

_S = SessionState
DATA_EVENTS = {
    "Result": None,
    "BroadcastData": None,
    "Abort": None,
    "RetransmitRequest": None,
    "ChunkAck": None,
    ERROR_PARENT: None,
}
"""What the parent sends about data: allowed, and leaving the state as it is, wherever
collectives run (a dict, so that the tables list them in this order)."""


def _moves(state: SessionState, specific: dict[str, SessionState]) -> dict[str, SessionState]:
    """``specific`` plus what every live state allows: heartbeats, reports, the loss of
    the rendezvous (which only detaches a session that has joined), leave()."""
    common = {
        "Heartbeat": state,
        ERROR_RENDEZVOUS: state,
        RENDEZVOUS_LOST: _S.CLOSED if state is _S.JOINING else state,
        RENDEZVOUS_GONE: _S.CLOSED,
        LEAVE: _S.LEFT,
    }
    return {**common, **specific}


SESSION_TABLE: TransitionTable[SessionState] = TransitionTable(
    "endpoint session",
    {
        _S.IDLE: {RENDEZVOUS_CONNECTED: _S.JOINING, LEAVE: _S.LEFT},
        _S.JOINING: _moves(
            _S.JOINING, {"JoinAccept": _S.ACCEPTED, "JoinReject": _S.REJECTED, ERROR_RENDEZVOUS: _S.REJECTED}
        ),
        _S.ACCEPTED: _moves(_S.ACCEPTED, {TREE_DIAL: _S.CONNECTING, "EpochChange": _S.ACCEPTED}),
        _S.CONNECTING: _moves(
            _S.CONNECTING,
            {
                PARENT_CONNECTED: _S.READY,
                PARENT_LOST: _S.CONNECTING,
                TREE_DIAL: _S.CONNECTING,
                "EpochChange": _S.ACCEPTED,
            },
        ),
        _S.READY: _moves(
            _S.READY,
            {
                START: _S.READY,
                **dict.fromkeys(DATA_EVENTS, _S.READY),
                PARENT_LOST: _S.RECONNECTING,
                TREE_DIAL: _S.RECONNECTING,
                TREE_CONNECTED: _S.READY,
                "EpochChange": _S.REPLANNING,
            },
        ),
        _S.REPLANNING: _moves(
            _S.REPLANNING,
            {
                START: _S.REPLANNING,
                **dict.fromkeys(DATA_EVENTS, _S.REPLANNING),
                PARENT_LOST: _S.REPLANNING,
                TREE_DIAL: _S.RECONNECTING,
                TREE_CONNECTED: _S.READY,
                "EpochChange": _S.REPLANNING,
            },
        ),
        _S.RECONNECTING: _moves(
            _S.RECONNECTING,
            {
                START: _S.RECONNECTING,
                PARENT_CONNECTED: _S.READY,
                PARENT_LOST: _S.RECONNECTING,
                TREE_DIAL: _S.RECONNECTING,
                "EpochChange": _S.REPLANNING,
            },
        ),
        _S.REJECTED: {LEAVE: _S.REJECTED},
        _S.LEFT: {LEAVE: _S.LEFT},
        _S.CLOSED: {LEAVE: _S.CLOSED},
    },
)

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

_O = OperationState
_ENDINGS = {
    BAD_CHUNK: _O.FAILED,
    ABORTED: _O.FAILED,
    DEADLINE: _O.FAILED,
    LOST: _O.FAILED,
    RESTART: _O.QUEUED,
}
OPERATION_TABLE: TransitionTable[OperationState] = TransitionTable(
    "endpoint operation",
    {
        # a presence pass may complete before it sent: a quorum went on without this rank
        _O.QUEUED: {SENT: _O.SENDING, ALL_SENT: _O.AWAITING, LAST_CHUNK: _O.COMPLETED, **_ENDINGS},
        _O.SENDING: {
            SENT: _O.SENDING,
            ALL_SENT: _O.AWAITING,
            CHUNK: _O.SENDING,
            DUPLICATE: _O.SENDING,
            RESENT: _O.SENDING,
            **_ENDINGS,
        },
        _O.AWAITING: {
            CHUNK: _O.AWAITING,
            LAST_CHUNK: _O.COMPLETED,
            DUPLICATE: _O.AWAITING,
            RESENT: _O.AWAITING,
            **_ENDINGS,
        },
    },
)

_L = LinkState
LINK_TABLE: TransitionTable[LinkState] = TransitionTable(
    "endpoint rendezvous link",
    {
        _L.ATTACHED: {RENDEZVOUS_LOST: _L.DETACHED},
        _L.DETACHED: {RENDEZVOUS_CONNECTED: _L.RESUMING, RENDEZVOUS_LOST: _L.DETACHED},
        _L.RESUMING: {RESUMED: _L.ATTACHED, RENDEZVOUS_LOST: _L.DETACHED},
    },
)

TABLES = (SESSION_TABLE, LINK_TABLE, OPERATION_TABLE)


def diagrams() -> str:
    """The endpoint's state diagrams, exactly as the draft shows them."""
    return "\n\n".join(t.to_ascii() for t in TABLES)
