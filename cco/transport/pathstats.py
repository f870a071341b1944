"""What QUIC measures of a connection's path, as either backend reports it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PathStats:
    """What QUIC has measured of one connection's path, for sizing what is in flight.

    A node that adapts its chunk size and window to the path (rather than taking
    fixed ones) needs the round trip and the rate the congestion controller allows:
    the bandwidth-delay product ``send_rate * smoothed_rtt`` is what must be in
    flight to keep the link busy, and no more is useful.
    """

    smoothed_rtt: float | None
    """Seconds; None before the first RTT sample."""
    latest_rtt: float | None
    congestion_window: int
    """Bytes the congestion controller lets be in flight."""
    bytes_in_flight: int
    lost_packets: int | None = None
    """Packets declared lost on this connection so far; None where the QUIC stack does
    not count them (aioquic)."""

    @property
    def send_rate(self) -> float | None:
        """Bytes per second the congestion window allows over one round trip (None
        before the first RTT sample)."""
        if not self.smoothed_rtt:
            return None
        return self.congestion_window / self.smoothed_rtt
