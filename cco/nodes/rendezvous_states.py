"""The rendezvous's states and transition tables: each connection, each group and
each member of a group.

Transitions are data (h2 and h11 style, :mod:`cco.nodes.fsm`): the machine in
:mod:`cco.nodes.rendezvous` moves only along these tables and does what the move
names, and the draft's state diagrams are drawn from them (:func:`diagrams`).
"""

from __future__ import annotations

from enum import Enum, StrEnum

from cco.nodes.fsm import Move, State, TransitionTable
from cco.wire.messages import AggregatorRegister, Error, Heartbeat, JoinRequest, Leave, Message, Report


class PeerState(State):
    """One connection to the rendezvous."""

    ENDPOINT = "endpoint"
    REGISTERING = "registering"
    AGGREGATOR = "aggregator"
    CLOSED = "closed"


class GroupState(State):
    """One group.  PLANNING is transient: handle() never returns in it."""

    FORMING = "forming"
    PLANNING = "planning"
    ACTIVE = "active"
    WAITING = "waiting"
    CLOSED = "closed"


class MemberState(State):
    """One member of one group."""

    JOINED = "joined"
    ASSIGNED = "assigned"
    GONE = "gone"


class PeerEvent(StrEnum):
    """What happens to one connection: a message it sent, or its end."""

    JOIN_REQUEST = "JoinRequest"
    LEAVE = "Leave"
    REPORT = "Report"
    HEARTBEAT = "Heartbeat"
    ERROR = "Error"
    AGGREGATOR_REGISTER = "AggregatorRegister"
    DISCONNECTED = "disconnected"
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"
    MALFORMED = "malformed"


PEER_EVENTS: dict[type[Message], PeerEvent] = {
    JoinRequest: PeerEvent.JOIN_REQUEST,
    Leave: PeerEvent.LEAVE,
    Report: PeerEvent.REPORT,
    Heartbeat: PeerEvent.HEARTBEAT,
    Error: PeerEvent.ERROR,
    AggregatorRegister: PeerEvent.AGGREGATOR_REGISTER,
}
"""The messages a rendezvous takes from a peer, as the events of :data:`PEER_TABLE`;
any other message is not allowed in any state."""


class PeerAction(Enum):
    """What the rendezvous does on a peer's move."""

    JOIN = "join or resume a membership"
    LEAVE = "remove the member"
    REPORT = "check the report; exclude the reported path from the group's trees"
    ECHO = "note the heartbeat's sequence number"
    NOTE = "nothing: a report needs no answer"
    REGISTER = "register the aggregator"
    DROP = "forget the connection, its memberships and its registration"


class GroupEvent(StrEnum):
    """What happens to one group (decided by the rendezvous itself)."""

    JOIN = "join"
    LEAVE = "leave"
    LOST = "lost"
    AGGREGATORS_CHANGED = "aggregators_changed"
    REPORTED = "reported"
    COMPLETE = "complete"
    EMPTY = "empty"
    PLANNED = "planned"
    NO_CAPACITY = "no_capacity"
    REOPEN = "reopen"


class GroupAction(Enum):
    """What the rendezvous does on a group's move."""

    COUNT = "see whether the forming group is complete or empty"
    PLAN = "plan a tree for the current epoch"
    REPLAN = "end the epoch, then plan a tree for the new one"
    INSTALL = "install the tree and send its assignments"
    WAIT = "wait for capacity; the members hear NO_AGGREGATOR"
    FORGET = "nothing to tell: no epoch ran"
    END = "end the epoch: the last member is gone"
    REOPEN = "a new epoch and secret for the returning group"


class MemberEvent(StrEnum):
    ASSIGNED = "assigned"
    NEW_EPOCH = "new_epoch"
    LEAVE = "leave"
    LOST = "lost"


_P, _PA = PeerState, PeerAction
_GONE = {
    PeerEvent.DISCONNECTED: Move(_P.CLOSED, _PA.DROP),
    PeerEvent.HEARTBEAT_TIMEOUT: Move(_P.CLOSED, _PA.DROP),
    PeerEvent.MALFORMED: Move(_P.CLOSED, _PA.DROP),
}

PEER_TABLE: TransitionTable[PeerState, PeerEvent, PeerAction] = TransitionTable(
    "rendezvous peer",
    {
        _P.ENDPOINT: {
            PeerEvent.JOIN_REQUEST: Move(_P.ENDPOINT, _PA.JOIN),
            PeerEvent.LEAVE: Move(_P.ENDPOINT, _PA.LEAVE),
            PeerEvent.REPORT: Move(_P.ENDPOINT, _PA.REPORT),
            PeerEvent.HEARTBEAT: Move(_P.ENDPOINT, _PA.ECHO),
            PeerEvent.ERROR: Move(_P.ENDPOINT, _PA.NOTE),
            **_GONE,
        },
        _P.REGISTERING: {
            PeerEvent.AGGREGATOR_REGISTER: Move(_P.AGGREGATOR, _PA.REGISTER),
            PeerEvent.HEARTBEAT: Move(_P.REGISTERING, _PA.ECHO),
            PeerEvent.ERROR: Move(_P.REGISTERING, _PA.NOTE),
            **_GONE,
        },
        _P.AGGREGATOR: {
            PeerEvent.HEARTBEAT: Move(_P.AGGREGATOR, _PA.ECHO),
            PeerEvent.ERROR: Move(_P.AGGREGATOR, _PA.NOTE),
            **_GONE,
        },
    },
)

_G, _GA = GroupState, GroupAction
_CHANGES = (GroupEvent.JOIN, GroupEvent.LEAVE, GroupEvent.LOST, GroupEvent.AGGREGATORS_CHANGED)

GROUP_TABLE: TransitionTable[GroupState, GroupEvent, GroupAction] = TransitionTable(
    "rendezvous group",
    {
        _G.FORMING: {
            GroupEvent.JOIN: Move(_G.FORMING, _GA.COUNT),
            GroupEvent.LEAVE: Move(_G.FORMING, _GA.COUNT),
            GroupEvent.LOST: Move(_G.FORMING, _GA.COUNT),
            GroupEvent.COMPLETE: Move(_G.PLANNING, _GA.PLAN),
            GroupEvent.EMPTY: Move(_G.CLOSED, _GA.FORGET),
        },
        _G.PLANNING: {
            GroupEvent.PLANNED: Move(_G.ACTIVE, _GA.INSTALL),
            GroupEvent.NO_CAPACITY: Move(_G.WAITING, _GA.WAIT),
        },
        _G.ACTIVE: {
            **dict.fromkeys(_CHANGES, Move(_G.PLANNING, _GA.REPLAN)),
            # a member reported the tree: only a group with a tree can be reported
            GroupEvent.REPORTED: Move(_G.PLANNING, _GA.REPLAN),
            GroupEvent.EMPTY: Move(_G.CLOSED, _GA.END),
        },
        _G.WAITING: {
            **dict.fromkeys(_CHANGES, Move(_G.PLANNING, _GA.REPLAN)),
            # capacity appeared for a group that had no tree: its epoch goes on
            GroupEvent.AGGREGATORS_CHANGED: Move(_G.PLANNING, _GA.PLAN),
            GroupEvent.EMPTY: Move(_G.CLOSED, _GA.END),
        },
        _G.CLOSED: {GroupEvent.REOPEN: Move(_G.FORMING, _GA.REOPEN)},
    },
)

_M = MemberState
MEMBER_TABLE: TransitionTable[MemberState, MemberEvent, None] = TransitionTable(
    "rendezvous member",
    {
        _M.JOINED: {
            MemberEvent.ASSIGNED: Move(_M.ASSIGNED, None),
            MemberEvent.NEW_EPOCH: Move(_M.JOINED, None),
            MemberEvent.LEAVE: Move(_M.GONE, None),
            MemberEvent.LOST: Move(_M.GONE, None),
        },
        _M.ASSIGNED: {
            MemberEvent.NEW_EPOCH: Move(_M.JOINED, None),
            MemberEvent.LEAVE: Move(_M.GONE, None),
            MemberEvent.LOST: Move(_M.GONE, None),
        },
    },
)
"""A member's moves only record where it stands: which TreeAssignment it has had."""

TABLES = (PEER_TABLE, GROUP_TABLE, MEMBER_TABLE)


def diagrams() -> str:
    """The rendezvous state diagrams, exactly as the draft shows them."""
    return "\n\n".join(t.to_ascii() for t in TABLES)
