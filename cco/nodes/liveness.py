"""Heartbeats and the loss rule, the same for every role and every connection.

Each side of a control connection sends a Heartbeat every interval and declares the
other lost when nothing at all arrived from it for the liveness window: the group's
``liveness_ms``, or :data:`~cco.wire.messages.LOSS_INTERVALS` intervals where none is
given (draft section "Heartbeats and Loss Detection").  The window is separate from
the interval so that a process stalled for seconds keeps its place without
heartbeating more often.  A :class:`Liveness` keeps one connection's clock: when it
last heard from the peer and when its next heartbeat is due; the machines pass
``now`` in and act on what it answers.  A longer window (a member of a group with a
longer one than the rendezvous's own) is asked for with ``window``.
"""

from __future__ import annotations

from dataclasses import dataclass

from cco.wire.messages import LOSS_INTERVALS


@dataclass(slots=True)
class Liveness:
    """One connection's heartbeat clock and the loss rule over it."""

    interval: float  # seconds between this side's heartbeats
    window: float  # seconds of silence after which the peer is lost
    last_heard: float
    next_heartbeat: float

    @classmethod
    def starting(cls, interval: float, now: float, window: float | None = None) -> Liveness:
        """Heard just now; the first heartbeat one interval from now; lost after
        ``window`` seconds of silence (LOSS_INTERVALS intervals by default)."""
        return cls(interval, LOSS_INTERVALS * interval if window is None else window, now, now + interval)

    def heard(self, now: float) -> None:
        self.last_heard = now

    def retime(self, interval: float, now: float) -> None:
        """Heartbeat every ``interval`` seconds from now on, the next one within it."""
        self.interval = interval
        self.next_heartbeat = min(self.next_heartbeat, now + interval)

    def lost_at(self, window: float | None = None) -> float:
        """When the peer counts as lost if nothing arrives before then (after ``window``
        seconds of silence; this connection's own window by default)."""
        return self.last_heard + (self.window if window is None else window)

    def lost(self, now: float, window: float | None = None) -> bool:
        return now >= self.lost_at(window)

    def beat_due(self, now: float) -> bool:
        """Whether a heartbeat is due; if so, the next one is scheduled an interval on."""
        if now < self.next_heartbeat:
            return False
        self.next_heartbeat = now + self.interval
        return True

    def deadline(self, window: float | None = None) -> float:
        """The earlier of the next heartbeat and the loss."""
        lost_at = self.lost_at(window)
        return self.next_heartbeat if self.next_heartbeat < lost_at else lost_at
