"""The rendezvous's states and transition tables: each connection, each group and
each member of a group.

Transitions are data (h11 style): the machine in :mod:`cco.nodes.rendezvous`
moves only along these tables, and the draft's state diagrams are drawn from them
(:func:`diagrams`).
"""

from __future__ import annotations

from enum import Enum

from cco.nodes.fsm import TransitionTable


class PeerState(Enum):
    """One connection to the rendezvous."""

    ENDPOINT = "endpoint"
    REGISTERING = "registering"
    AGGREGATOR = "aggregator"
    CLOSED = "closed"


class GroupState(Enum):
    """One group.  PLANNING is transient: handle() never returns in it."""

    FORMING = "forming"
    PLANNING = "planning"
    ACTIVE = "active"
    WAITING = "waiting"
    CLOSED = "closed"


class MemberState(Enum):
    """One member of one group."""

    JOINED = "joined"
    ASSIGNED = "assigned"
    GONE = "gone"


_GONE = {
    "disconnected": PeerState.CLOSED,
    "heartbeat_timeout": PeerState.CLOSED,
    "malformed": PeerState.CLOSED,
}

PEER_TABLE: TransitionTable[PeerState] = TransitionTable(
    "rendezvous peer",
    {
        PeerState.ENDPOINT: {
            "JoinRequest": PeerState.ENDPOINT,
            "Leave": PeerState.ENDPOINT,
            "Heartbeat": PeerState.ENDPOINT,
            "Error": PeerState.ENDPOINT,
            **_GONE,
        },
        PeerState.REGISTERING: {
            "AggregatorRegister": PeerState.AGGREGATOR,
            "Heartbeat": PeerState.REGISTERING,
            "Error": PeerState.REGISTERING,
            **_GONE,
        },
        PeerState.AGGREGATOR: {
            "Heartbeat": PeerState.AGGREGATOR,
            "Error": PeerState.AGGREGATOR,
            **_GONE,
        },
    },
)

_CHANGES = ("join", "leave", "lost", "aggregators_changed")

GROUP_TABLE: TransitionTable[GroupState] = TransitionTable(
    "rendezvous group",
    {
        GroupState.FORMING: {
            "join": GroupState.FORMING,
            "leave": GroupState.FORMING,
            "lost": GroupState.FORMING,
            "complete": GroupState.PLANNING,
            "empty": GroupState.CLOSED,
        },
        GroupState.PLANNING: {"planned": GroupState.ACTIVE, "no_capacity": GroupState.WAITING},
        GroupState.ACTIVE: {**dict.fromkeys(_CHANGES, GroupState.PLANNING), "empty": GroupState.CLOSED},
        GroupState.WAITING: {**dict.fromkeys(_CHANGES, GroupState.PLANNING), "empty": GroupState.CLOSED},
        GroupState.CLOSED: {"reopen": GroupState.FORMING},
    },
)

MEMBER_TABLE: TransitionTable[MemberState] = TransitionTable(
    "rendezvous member",
    {
        MemberState.JOINED: {
            "assigned": MemberState.ASSIGNED,
            "new_epoch": MemberState.JOINED,
            "leave": MemberState.GONE,
            "lost": MemberState.GONE,
        },
        MemberState.ASSIGNED: {
            "new_epoch": MemberState.JOINED,
            "leave": MemberState.GONE,
            "lost": MemberState.GONE,
        },
    },
)

TABLES = (PEER_TABLE, GROUP_TABLE, MEMBER_TABLE)


def diagrams() -> str:
    """The rendezvous state diagrams, exactly as the draft shows them."""
    return "\n\n".join(t.to_ascii() for t in TABLES)
