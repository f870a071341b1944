"""The aggregator's states and transition tables: its registration with the
rendezvous, each group's place in a tree, and each slot.

Transitions are data (h11 style): the machine in :mod:`cco.nodes.aggregator`
consults these tables before it acts, a transition a state does not list is
refused in one place (:class:`~cco.nodes.fsm.TransitionTable`), and the draft's
state diagrams are drawn from them (:func:`diagrams`).
"""

from __future__ import annotations

from enum import Enum

from cco.nodes.fsm import TransitionTable


class NodeState(Enum):
    """The aggregator's standing with the rendezvous."""

    DETACHED = "detached"  # no rendezvous connection
    REGISTERING = "registering"  # AggregatorRegister sent, no answer yet
    REGISTERED = "registered"  # accepted; receives tree assignments


class GroupState(Enum):
    """This aggregator's place in one group's tree."""

    UNKNOWN = "unknown"  # no assignment: early data waits in the pending queue
    CONNECTING = "connecting"  # assigned; the connection to the parent is not up
    ACTIVE = "active"  # assigned, and the parent (if any) is connected
    STALE = "stale"  # the epoch changed; waiting for the new epoch's assignment


class SlotState(Enum):
    """One (group, epoch, op_id, chunk_index) slot."""

    COLLECTING = "collecting"  # some expected ranks have not arrived
    COMPLETE = "complete"  # combined and sent on; only fingerprints remain
    ABORTED = "aborted"  # the operation was aborted; late parts are dropped


# Event names shared by the tables and the code that classifies inputs.
RENDEZVOUS_CONNECTED = "rendezvous connected"
RENDEZVOUS_LOST = "rendezvous lost"
UNCONFIRMED = "not confirmed in time"
CHUNK_UP = "chunk from child"
CHUNK_DOWN = "chunk from parent"
ASSIGNED_ROOT = "TreeAssignment [root]"
ASSIGNED_CONNECTED = "TreeAssignment [parent connected]"
ASSIGNED_CONNECT = "TreeAssignment [connect parent]"
PARENT_CONNECTED = "parent connected"
PARENT_LOST = "parent lost"
PARENT_RETRY = "parent retry"
SLOT_TIMEOUT = "slot timeout"
PART = "part"
LAST_PART = "last part"
RETRANSMISSION = "retransmission"
CONFLICT = "conflicting part"
HALF_TIMEOUT = "half timeout"
WAIT_OVER = "quorum wait over"
LATE_PART = "late part"
ASKED_AGAIN = "RetransmitRequest"
TIMEOUT = "timeout"
ABORT = "abort"

_R = NodeState.REGISTERED
NODE_TABLE: TransitionTable[NodeState] = TransitionTable(
    "aggregator",
    {
        NodeState.DETACHED: {RENDEZVOUS_CONNECTED: NodeState.REGISTERING},
        NodeState.REGISTERING: {
            "AggregatorAccept": _R,
            "Heartbeat": NodeState.REGISTERING,
            "Error": NodeState.DETACHED,
            RENDEZVOUS_LOST: NodeState.DETACHED,
        },
        _R: {
            "Heartbeat": _R,
            "TreeAssignment": _R,
            "EpochChange": _R,
            "Error": _R,
            RENDEZVOUS_LOST: NodeState.DETACHED,
        },
    },
)

_DIAL = {ASSIGNED_ROOT: GroupState.ACTIVE, ASSIGNED_CONNECT: GroupState.CONNECTING}
_ASSIGNED = {**_DIAL, ASSIGNED_CONNECTED: GroupState.ACTIVE}
GROUP_TABLE: TransitionTable[GroupState] = TransitionTable(
    "aggregator group",
    {
        GroupState.UNKNOWN: {
            CHUNK_UP: GroupState.UNKNOWN,
            **_DIAL,
            "EpochChange": GroupState.UNKNOWN,
            UNCONFIRMED: GroupState.UNKNOWN,
        },
        GroupState.CONNECTING: {
            CHUNK_UP: GroupState.CONNECTING,
            PARENT_CONNECTED: GroupState.ACTIVE,
            PARENT_LOST: GroupState.CONNECTING,
            PARENT_RETRY: GroupState.CONNECTING,
            SLOT_TIMEOUT: GroupState.CONNECTING,
            **_DIAL,
            "EpochChange": GroupState.STALE,
            UNCONFIRMED: GroupState.UNKNOWN,
        },
        GroupState.ACTIVE: {
            CHUNK_UP: GroupState.ACTIVE,
            CHUNK_DOWN: GroupState.ACTIVE,
            PARENT_LOST: GroupState.CONNECTING,
            SLOT_TIMEOUT: GroupState.ACTIVE,
            **_ASSIGNED,
            "EpochChange": GroupState.STALE,
            UNCONFIRMED: GroupState.UNKNOWN,
        },
        GroupState.STALE: {
            CHUNK_UP: GroupState.STALE,
            CHUNK_DOWN: GroupState.STALE,
            PARENT_CONNECTED: GroupState.STALE,
            PARENT_LOST: GroupState.STALE,
            **_ASSIGNED,
            "EpochChange": GroupState.STALE,
            UNCONFIRMED: GroupState.UNKNOWN,
        },
    },
)

_C, _A = SlotState.COLLECTING, SlotState.ABORTED
SLOT_TABLE: TransitionTable[SlotState] = TransitionTable(
    "aggregator slot",
    {
        _C: {
            PART: _C,
            LAST_PART: SlotState.COMPLETE,
            RETRANSMISSION: _C,
            HALF_TIMEOUT: _C,
            ASKED_AGAIN: _C,
            WAIT_OVER: SlotState.COMPLETE,
            TIMEOUT: _A,
            ABORT: _A,
        },
        SlotState.COMPLETE: {
            RETRANSMISSION: SlotState.COMPLETE,
            LATE_PART: SlotState.COMPLETE,
            ASKED_AGAIN: _C,
            ABORT: SlotState.COMPLETE,
        },
        _A: {PART: _A, LAST_PART: _A, RETRANSMISSION: _A, ASKED_AGAIN: _A, ABORT: _A},
    },
)

TABLES = (NODE_TABLE, GROUP_TABLE, SLOT_TABLE)


def diagrams() -> str:
    """The aggregator's state diagrams, exactly as the draft shows them."""
    return "\n\n".join(t.to_ascii() for t in TABLES)
