"""A node's session with the rendezvous, the same for an endpoint and an aggregator.

The session knows which connection reaches the rendezvous, greets it (the role's
JoinRequest or AggregatorRegister), heartbeats it once the rendezvous has accepted
this node, declares it lost after the liveness window of silence (the group's, for
an endpoint; :data:`~cco.wire.messages.LOSS_INTERVALS` intervals for an aggregator, or
the longest window of its groups),
and remembers since when this node has been detached: the data path needs no
rendezvous, so a detached node keeps its work for a grace period while the I/O layer
dials again (draft section "Rendezvous Persistence and Restart").  What the
role does on each of these moves is its own table's business
(:mod:`cco.nodes.endpoint_states`, :mod:`cco.nodes.aggregator_states`).
"""

from __future__ import annotations

from enum import Enum

from cco.nodes.events import ClosePeer, Command, PeerId, SendMessage
from cco.nodes.liveness import Liveness
from cco.wire.errors import ErrorCode
from cco.wire.messages import Heartbeat, Message


class Tick(Enum):
    """What the session's clock says when a timer fires."""

    QUIET = "nothing due"
    BEAT = "a heartbeat is due"
    LOST = "the rendezvous was silent for too long"


class RendezvousSession:
    """This node's control connection: which one it is, its heartbeats and the loss rule."""

    def __init__(self) -> None:
        self.peer: PeerId | None = None
        self._liveness: Liveness | None = None  # once the rendezvous accepted this node on this connection
        self._seq = 0
        self.detached_at: float | None = None

    @property
    def accepted(self) -> bool:
        """Whether the rendezvous accepted this node on the current connection."""
        return self._liveness is not None

    def greet(self, peer: PeerId, greeting: Message) -> SendMessage:
        """A connection to the rendezvous is up: greet it with the role's request."""
        self.peer = peer
        self._liveness = None
        return SendMessage(peer, greeting)

    def accept(self, interval: float, now: float, window: float | None = None) -> None:
        """The rendezvous accepted this node: heartbeat it every ``interval`` seconds and
        count it lost after ``window`` seconds of silence (LOSS_INTERVALS intervals by
        default); the node is attached again."""
        self._liveness = Liveness.starting(interval, now, window)
        self.detached_at = None

    def widen(self, window: float) -> None:
        """Count the rendezvous lost only after ``window`` seconds of silence, if that is
        longer than the window in force (an aggregator serving a group with a long one)."""
        if self._liveness is not None and window > self._liveness.window:
            self._liveness.window = window

    def silence(self) -> str:
        """Why a lost rendezvous is lost, for the close and the operations it fails."""
        window = self._liveness.window if self._liveness is not None else 0.0
        return f"no message from the rendezvous for {window:g} s (the liveness window)"

    def heard(self, now: float) -> None:
        """Anything from the rendezvous is a sign of life."""
        if self._liveness is not None:
            self._liveness.heard(now)

    def tick(self, now: float) -> Tick:
        if self.peer is None or self._liveness is None:
            return Tick.QUIET
        if self._liveness.lost(now):
            return Tick.LOST
        return Tick.BEAT if self._liveness.beat_due(now) else Tick.QUIET

    def heartbeat(self) -> SendMessage:
        assert self.peer is not None
        self._seq += 1
        return SendMessage(self.peer, Heartbeat(seq=self._seq))

    def deadline(self) -> float | None:
        """The next heartbeat or the loss, whichever comes first (None before acceptance)."""
        if self.peer is None or self._liveness is None:
            return None
        return self._liveness.deadline()

    def close(self, code: ErrorCode, why: str) -> list[Command]:
        """Close the connection (if any) and stop heartbeating it."""
        peer, self.peer = self.peer, None
        self._liveness = None
        return [ClosePeer(peer, code, why)] if peer is not None else []

    def drop(self) -> None:
        """The connection ended (the I/O layer reported it): forget it."""
        self.peer = None
        self._liveness = None

    def detach(self, now: float) -> None:
        """The rendezvous is lost; the node stays detached from now (or from the first
        of several losses) until the rendezvous accepts it again."""
        self.drop()
        if self.detached_at is None:
            self.detached_at = now

    def grace_over(self, now: float, grace: float) -> bool:
        return self.detached_at is not None and now >= self.detached_at + grace

    def forget_detachment(self) -> None:
        self.detached_at = None
