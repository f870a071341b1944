"""Inputs to and outputs of the sans-I/O role state machines, all in one place.

Every role (rendezvous, aggregator, endpoint session) is driven the same way, as
aioquic drives ``QuicConnection``:

* ``machine.handle(event, now) -> list[Command]`` for each input below;
* ``machine.next_deadline() -> float | None``: the earliest time at which the
  machine wants ``handle(TimerFired(), now)``; ``None`` when it waits for nothing.

The machines never open sockets, read a clock or sleep.  A *peer* is an opaque
handle the I/O layer picks for one authenticated connection; the machine learns who
is behind it from :class:`PeerConnected` and names it in the commands it returns.
Inputs are named in the past tense (what happened); commands in the imperative.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Address, Capabilities, Message
from cco.wire.registries import Role

if TYPE_CHECKING:
    import numpy as np

PeerId = str
"""An opaque name for one connection, chosen by whoever created it."""


# --- inputs ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerConnected:
    """A connection completed TLS and the Hello exchange.

    ``node_id`` and ``role`` are authenticated: the I/O layer checked them against
    the peer's certificate before reporting the connection.  ``capabilities`` are
    what the peer declared in Hello or HelloAck; None where there is no handshake
    (in-memory simulations), read as "no limit".
    """

    peer: PeerId
    node_id: str
    role: Role
    capabilities: Capabilities | None = None


@dataclass(frozen=True, slots=True)
class PeerDisconnected:
    """A connection closed or was lost."""

    peer: PeerId
    code: ErrorCode
    detail: str = ""


@dataclass(frozen=True, slots=True)
class MessageReceived:
    """A complete, decoded message arrived from ``peer``."""

    peer: PeerId
    message: Message


@dataclass(frozen=True, slots=True)
class MessageMalformed:
    """Bytes from ``peer`` failed to decode; the machine decides what to tell it."""

    peer: PeerId
    error: CcoError


@dataclass(frozen=True, slots=True)
class TimerFired:
    """Time has reached the machine's deadline; it processes everything due by ``now``."""


Input = PeerConnected | PeerDisconnected | MessageReceived | MessageMalformed | TimerFired


# --- commands ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendMessage:
    """Queue ``message`` on the connection to ``peer``."""

    peer: PeerId
    message: Message


@dataclass(frozen=True, slots=True)
class ConnectTo:
    """Open a connection to ``address``; report it as ``peer`` in PeerConnected.

    The I/O layer refuses the connection unless the certificate names
    ``expected_node_id``.
    """

    peer: PeerId
    address: Address
    expected_node_id: str


@dataclass(frozen=True, slots=True)
class ClosePeer:
    """Close the connection to ``peer`` with an error code."""

    peer: PeerId
    code: ErrorCode
    detail: str


@dataclass(frozen=True, slots=True)
class Joined:
    """Endpoint only: the group admitted this endpoint and assigned its rank."""

    group_id: bytes
    rank: int
    world_size: int
    epoch: int


@dataclass(frozen=True, slots=True)
class JoinFailed:
    """Endpoint only: the group did not admit this endpoint (a JoinReject or Error from
    the rendezvous, or the rendezvous lost before the admission), with the reason."""

    group_id: bytes
    code: ErrorCode
    detail: str


@dataclass(frozen=True, slots=True)
class ChunkAgreement:
    """How a block-scaled operation's data was cut, in elements per chunk: as planned
    (the group's chunk_elements when the call started), as its ranks agreed in its
    scale pass (the smallest proposal, :mod:`cco.nodes.chunking`), and as this rank
    proposed.  What a chunk costs each node depends on its size, so this is what tells
    an operator or a benchmark why the CPU per byte of a run moved."""

    planned: int
    agreed: int
    proposed: int


@dataclass(frozen=True, slots=True)
class OperationCompleted:
    """Endpoint only: an operation finished and its result passed verification."""

    op_id: int
    result: np.ndarray | None  # None for barrier and for non-root ranks of reduce
    contributors: frozenset[int] | None = None  # the ranks a quorum ALL_REDUCE ran over
    chunk_elements: int = 0  # wire integers per chunk of its data, as it was cut
    agreement: ChunkAgreement | None = None  # a block-scaled operation's (float SUM, AVG)


@dataclass(frozen=True, slots=True)
class OperationFailed:
    """Endpoint only: an operation cannot complete; ``error`` says why and who."""

    op_id: int
    error: CcoError


class Happening(Enum):
    """What a :class:`Report` tells the operator about."""

    JOINED = "joined"  # an endpoint was admitted to a group (or came back after a restart)
    JOIN_REJECTED = "join rejected"
    LEFT = "left"  # a member left its group
    LOST = "lost"  # a member's or an aggregator's connection ended without a Leave
    REGISTERED = "registered"  # an aggregator's registration was accepted
    REFUSED = "refused"  # a connection or a message was refused (Error to the peer)
    EPOCH = "epoch"  # a group's epoch ended: new epoch, members and reason
    TREE = "tree"  # a group got its tree for the current epoch
    WAITING = "waiting"  # a group has no aggregator capacity for a tree
    TAMPERING = "tampering reported"  # a member's Report excluded aggregators from its group's trees


@dataclass(frozen=True, slots=True)
class Report:
    """Something an operator wants to know happened, as data: the service logs it (at
    INFO, tampering at WARNING) and counts it (the machines have no logger).  Rare by
    design: membership, registration, refusals and tree changes, never a chunk.

    ``node_id`` is the peer it concerns (empty when it concerns a group as a whole);
    ``code`` the reason a peer was refused or a member lost, or an epoch ended."""

    what: Happening
    node_id: str = ""
    group_id: bytes | None = None
    rank: int | None = None
    epoch: int | None = None
    code: ErrorCode = ErrorCode.NO_ERROR
    detail: str = ""


Command = (
    SendMessage | ConnectTo | ClosePeer | Joined | JoinFailed | OperationCompleted | OperationFailed | Report
)

__all__ = [
    "ChunkAgreement",
    "ClosePeer",
    "Command",
    "ConnectTo",
    "Happening",
    "Input",
    "JoinFailed",
    "Joined",
    "MessageMalformed",
    "MessageReceived",
    "OperationCompleted",
    "OperationFailed",
    "PeerConnected",
    "PeerDisconnected",
    "PeerId",
    "Report",
    "SendMessage",
    "TimerFired",
]
