"""Heartbeats and the loss rule, the same for every role and every connection.

Each side of a control connection sends a Heartbeat every interval and declares the
other lost when nothing at all arrived from it for :data:`LOSS_INTERVALS` intervals
(draft section "Heartbeats and Liveness").  A :class:`Liveness` keeps one
connection's clock: when it last heard from the peer and when its next heartbeat
is due; the machines pass ``now`` in and act on what it answers.  A longer loss
window (a member of a group with a longer interval than the rendezvous's own) is
asked for with ``interval``.
"""

from __future__ import annotations

from dataclasses import dataclass

LOSS_INTERVALS = 3
"""A peer from which nothing arrived for this many heartbeat intervals is lost."""


@dataclass(slots=True)
class Liveness:
    """One connection's heartbeat clock and the loss rule over it."""

    interval: float  # seconds between this side's heartbeats
    last_heard: float
    next_heartbeat: float

    @classmethod
    def starting(cls, interval: float, now: float) -> Liveness:
        """Heard just now; the first heartbeat one interval from now."""
        return cls(interval, now, now + interval)

    def heard(self, now: float) -> None:
        self.last_heard = now

    def retime(self, interval: float, now: float) -> None:
        """Heartbeat every ``interval`` seconds from now on, the next one within it."""
        self.interval = interval
        self.next_heartbeat = min(self.next_heartbeat, now + interval)

    def lost_at(self, interval: float | None = None) -> float:
        """When the peer counts as lost if nothing arrives before then (after
        ``interval`` x LOSS_INTERVALS of silence; the heartbeat interval by default)."""
        return self.last_heard + LOSS_INTERVALS * (self.interval if interval is None else interval)

    def lost(self, now: float, interval: float | None = None) -> bool:
        return now >= self.lost_at(interval)

    def beat_due(self, now: float) -> bool:
        """Whether a heartbeat is due; if so, the next one is scheduled an interval on."""
        if now < self.next_heartbeat:
            return False
        self.next_heartbeat = now + self.interval
        return True

    def deadline(self, interval: float | None = None) -> float:
        """The earlier of the next heartbeat and the loss."""
        lost_at = self.lost_at(interval)
        return self.next_heartbeat if self.next_heartbeat < lost_at else lost_at
