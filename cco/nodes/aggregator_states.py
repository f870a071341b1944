"""The aggregator's states and transition tables: its registration with the
rendezvous, each group's place in a tree, and each slot.

Transitions are data (h2 and h11 style, :mod:`cco.nodes.fsm`): every input maps to a
typed event, the table refuses an event the state does not list and names the
action the machine takes on a legal one, and the draft's state diagrams are drawn
from the tables (:func:`diagrams`).
"""

from __future__ import annotations

from enum import Enum, StrEnum

from cco.nodes.fsm import Move, State, TransitionTable
from cco.wire.messages import AggregatorAccept, EpochChange, Error, Heartbeat, Message, TreeAssignment


class NodeState(State):
    """The aggregator's standing with the rendezvous."""

    DETACHED = "detached"  # no rendezvous connection
    REGISTERING = "registering"  # AggregatorRegister sent, no answer yet
    REGISTERED = "registered"  # accepted; receives tree assignments


class GroupState(State):
    """This aggregator's place in one group's tree."""

    UNKNOWN = "unknown"  # no assignment: early data waits in the pending queue
    CONNECTING = "connecting"  # assigned; the connection to the parent is not up
    ACTIVE = "active"  # assigned, and the parent (if any) is connected
    STALE = "stale"  # the epoch changed; waiting for the new epoch's assignment


class SlotState(State):
    """One (group, epoch, op_id, chunk_index) slot."""

    COLLECTING = "collecting"  # some expected ranks have not arrived
    NUDGED = "nudged"  # past half its timeout: the silent children were asked to send again
    EXTENDED = "extended"  # past its timeout: waits half a timeout more for a silent child aggregator
    COMPLETE = "complete"  # combined and sent on; only fingerprints remain
    RELEASED = "released"  # a presence pass sent on at the end of its wait, without every rank
    ABORTED = "aborted"  # the operation was aborted; late parts are dropped


class NodeEvent(StrEnum):
    RENDEZVOUS_CONNECTED = "rendezvous connected"
    AGGREGATOR_ACCEPT = "AggregatorAccept"
    HEARTBEAT = "Heartbeat"
    ERROR = "Error"
    RENDEZVOUS_LOST = "rendezvous lost"
    TREE_ASSIGNMENT = "TreeAssignment"
    EPOCH_CHANGE = "EpochChange"


FROM_RENDEZVOUS: dict[type[Message], NodeEvent] = {
    AggregatorAccept: NodeEvent.AGGREGATOR_ACCEPT,
    Heartbeat: NodeEvent.HEARTBEAT,
    Error: NodeEvent.ERROR,
    TreeAssignment: NodeEvent.TREE_ASSIGNMENT,
    EpochChange: NodeEvent.EPOCH_CHANGE,
}
"""The messages an aggregator takes from the rendezvous; any other is not allowed."""


class NodeAction(Enum):
    REGISTER = "send AggregatorRegister"
    ACCEPTED = "heartbeat the rendezvous"
    NOTE = "nothing more: every message from the rendezvous counts as a sign of life"
    REFUSED = "the registration was refused: close, and say why"
    DETACH = "groups live on without the rendezvous for the grace period"
    ASSIGN = "take the group's place in its tree"
    CHANGE_EPOCH = "the group's epoch ended: abort what is in flight"


class GroupEvent(StrEnum):
    CHUNK_UP = "chunk from child"
    CHUNK_DOWN = "chunk from parent"
    ASSIGNED_ROOT = "TreeAssignment [root]"
    ASSIGNED_CONNECTED = "TreeAssignment [parent connected]"
    ASSIGNED_CONNECT = "TreeAssignment [connect parent]"
    PARENT_CONNECTED = "parent connected"
    PARENT_LOST = "parent lost"
    PARENT_RETRY = "parent retry"
    SLOT_TIMEOUT = "slot timeout"
    EPOCH_CHANGE = "EpochChange"
    UNCONFIRMED = "not confirmed in time"


class GroupAction(Enum):
    NOTE = "nothing beyond the state"
    ROOT = "adopt the assignment as the root: what waited for a parent goes down"
    ADOPT = "adopt the assignment; the parent connection stays"
    DIAL = "adopt the assignment and dial its parent"
    FLUSH = "the parent is up: send what waited for it"
    REDIAL_LATER = "dial the parent again after a pause; abort what is in flight"
    DOWN = "the parent is down; the next epoch's assignment names the next one"
    RETRY = "dial the parent again"
    CHANGE_EPOCH = "abort what is in flight; wait for the new epoch's assignment"
    END = "the group ends here: abort what is in flight, close the parent, forget it"


class SlotEvent(StrEnum):
    PART = "part"
    LAST_PART = "last part"
    RETRANSMISSION = "retransmission"
    CONFLICT = "conflicting part"
    LATE_PART = "late part"
    HALF_TIMEOUT = "half timeout"
    ASKED_AGAIN = "RetransmitRequest"
    WAIT_OVER = "quorum wait over"
    SILENT_CHILD = "timeout [child aggregator silent]"
    TIMEOUT = "timeout"
    ABORT = "abort"


class SlotAction(Enum):
    ADD = "add the part"
    COMPLETE = "add the last part; send the aggregate on"
    RELEASE = "send the aggregate of the ranks in time on"
    RESEND = "a copy of a part of a finished chunk: send its Result again, if it is kept"
    LATE = "a part after the release: its Result, or up as it is"
    ASK = "ask the children that owe it to send again"
    REOPEN = "collect the chunk again for the parent that lacks it"
    EXTEND = "wait half a timeout more"
    EXPIRE = "abort the operation, naming the missing ranks"
    FREE = "drop what it collected"
    IGNORE = "nothing: a copy of a part already taken, or the slot is over"


_N, _NA, _NE = NodeState, NodeAction, NodeEvent
NODE_TABLE: TransitionTable[NodeState, NodeEvent, NodeAction] = TransitionTable(
    "aggregator",
    {
        _N.DETACHED: {_NE.RENDEZVOUS_CONNECTED: Move(_N.REGISTERING, _NA.REGISTER)},
        _N.REGISTERING: {
            _NE.AGGREGATOR_ACCEPT: Move(_N.REGISTERED, _NA.ACCEPTED),
            _NE.HEARTBEAT: Move(_N.REGISTERING, _NA.NOTE),
            _NE.ERROR: Move(_N.DETACHED, _NA.REFUSED),
            _NE.RENDEZVOUS_LOST: Move(_N.DETACHED, _NA.DETACH),
        },
        _N.REGISTERED: {
            _NE.HEARTBEAT: Move(_N.REGISTERED, _NA.NOTE),
            _NE.TREE_ASSIGNMENT: Move(_N.REGISTERED, _NA.ASSIGN),
            _NE.EPOCH_CHANGE: Move(_N.REGISTERED, _NA.CHANGE_EPOCH),
            _NE.ERROR: Move(_N.REGISTERED, _NA.NOTE),
            _NE.RENDEZVOUS_LOST: Move(_N.DETACHED, _NA.DETACH),
        },
    },
)

_G, _GA, _GE = GroupState, GroupAction, GroupEvent
GROUP_TABLE: TransitionTable[GroupState, GroupEvent, GroupAction] = TransitionTable(
    "aggregator group",
    {
        _G.UNKNOWN: {
            _GE.CHUNK_UP: Move(_G.UNKNOWN, _GA.NOTE),
            _GE.ASSIGNED_ROOT: Move(_G.ACTIVE, _GA.ROOT),
            _GE.ASSIGNED_CONNECT: Move(_G.CONNECTING, _GA.DIAL),
            _GE.EPOCH_CHANGE: Move(_G.UNKNOWN, _GA.CHANGE_EPOCH),
            _GE.UNCONFIRMED: Move(_G.UNKNOWN, _GA.END),
        },
        _G.CONNECTING: {
            _GE.CHUNK_UP: Move(_G.CONNECTING, _GA.NOTE),
            _GE.PARENT_CONNECTED: Move(_G.ACTIVE, _GA.FLUSH),
            _GE.PARENT_LOST: Move(_G.CONNECTING, _GA.REDIAL_LATER),
            _GE.PARENT_RETRY: Move(_G.CONNECTING, _GA.RETRY),
            _GE.SLOT_TIMEOUT: Move(_G.CONNECTING, _GA.NOTE),
            _GE.ASSIGNED_ROOT: Move(_G.ACTIVE, _GA.ROOT),
            _GE.ASSIGNED_CONNECT: Move(_G.CONNECTING, _GA.DIAL),
            _GE.EPOCH_CHANGE: Move(_G.STALE, _GA.CHANGE_EPOCH),
            _GE.UNCONFIRMED: Move(_G.UNKNOWN, _GA.END),
        },
        _G.ACTIVE: {
            _GE.CHUNK_UP: Move(_G.ACTIVE, _GA.NOTE),
            _GE.CHUNK_DOWN: Move(_G.ACTIVE, _GA.NOTE),
            _GE.PARENT_LOST: Move(_G.CONNECTING, _GA.REDIAL_LATER),
            _GE.SLOT_TIMEOUT: Move(_G.ACTIVE, _GA.NOTE),
            _GE.ASSIGNED_ROOT: Move(_G.ACTIVE, _GA.ROOT),
            _GE.ASSIGNED_CONNECT: Move(_G.CONNECTING, _GA.DIAL),
            _GE.ASSIGNED_CONNECTED: Move(_G.ACTIVE, _GA.ADOPT),
            _GE.EPOCH_CHANGE: Move(_G.STALE, _GA.CHANGE_EPOCH),
            _GE.UNCONFIRMED: Move(_G.UNKNOWN, _GA.END),
        },
        _G.STALE: {
            _GE.CHUNK_UP: Move(_G.STALE, _GA.NOTE),
            _GE.CHUNK_DOWN: Move(_G.STALE, _GA.NOTE),
            _GE.PARENT_CONNECTED: Move(_G.STALE, _GA.FLUSH),
            _GE.PARENT_LOST: Move(_G.STALE, _GA.DOWN),
            _GE.ASSIGNED_ROOT: Move(_G.ACTIVE, _GA.ROOT),
            _GE.ASSIGNED_CONNECT: Move(_G.CONNECTING, _GA.DIAL),
            _GE.ASSIGNED_CONNECTED: Move(_G.ACTIVE, _GA.ADOPT),
            _GE.EPOCH_CHANGE: Move(_G.STALE, _GA.CHANGE_EPOCH),
            _GE.UNCONFIRMED: Move(_G.UNKNOWN, _GA.END),
        },
    },
)

_C, _SA, _SE = SlotState, SlotAction, SlotEvent


def _collecting(state: SlotState) -> dict[SlotEvent, Move[SlotState, SlotAction]]:
    """What a slot still collecting takes, in each of its phases."""
    return {
        _SE.PART: Move(state, _SA.ADD),
        _SE.LAST_PART: Move(_C.COMPLETE, _SA.COMPLETE),
        _SE.RETRANSMISSION: Move(state, _SA.IGNORE),
        _SE.ASKED_AGAIN: Move(state, _SA.ASK),
        _SE.WAIT_OVER: Move(_C.RELEASED, _SA.RELEASE),
        _SE.ABORT: Move(_C.ABORTED, _SA.FREE),
    }


SLOT_TABLE: TransitionTable[SlotState, SlotEvent, SlotAction] = TransitionTable(
    "aggregator slot",
    {
        _C.COLLECTING: {**_collecting(_C.COLLECTING), _SE.HALF_TIMEOUT: Move(_C.NUDGED, _SA.ASK)},
        _C.NUDGED: {
            **_collecting(_C.NUDGED),
            _SE.SILENT_CHILD: Move(_C.EXTENDED, _SA.EXTEND),
            _SE.TIMEOUT: Move(_C.ABORTED, _SA.EXPIRE),
        },
        _C.EXTENDED: {**_collecting(_C.EXTENDED), _SE.TIMEOUT: Move(_C.ABORTED, _SA.EXPIRE)},
        _C.COMPLETE: {
            _SE.RETRANSMISSION: Move(_C.COMPLETE, _SA.RESEND),
            _SE.ASKED_AGAIN: Move(_C.COLLECTING, _SA.REOPEN),
            _SE.ABORT: Move(_C.COMPLETE, _SA.IGNORE),
        },
        _C.RELEASED: {
            _SE.RETRANSMISSION: Move(_C.RELEASED, _SA.RESEND),
            _SE.LATE_PART: Move(_C.RELEASED, _SA.LATE),
            _SE.ABORT: Move(_C.RELEASED, _SA.IGNORE),
        },
        _C.ABORTED: {
            _SE.PART: Move(_C.ABORTED, _SA.IGNORE),
            _SE.LAST_PART: Move(_C.ABORTED, _SA.IGNORE),
            _SE.RETRANSMISSION: Move(_C.ABORTED, _SA.IGNORE),
            _SE.ASKED_AGAIN: Move(_C.ABORTED, _SA.IGNORE),
            _SE.ABORT: Move(_C.ABORTED, _SA.IGNORE),
        },
    },
)
"""A conflicting part (another chunk in place of one already taken from the same
child) has no move: it is refused with DUPLICATE_CONTRIBUTION in every state."""

TABLES = (NODE_TABLE, GROUP_TABLE, SLOT_TABLE)


def diagrams() -> str:
    """The aggregator's state diagrams, exactly as the draft shows them."""
    return "\n\n".join(t.to_ascii() for t in TABLES)
