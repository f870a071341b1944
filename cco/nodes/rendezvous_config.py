"""What a rendezvous is configured with, and the defaults a group gets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cco.nodes.rendezvous_admission import AdmissionLimits
from cco.wire.messages import DEFAULT_LIVENESS_MS, GroupParams
from cco.wire.registries import GROUP_ID_SIZE, MAX_WORLD_SIZE

DEFAULT_PARAMS = GroupParams(
    chunk_elements=32768,
    scaled_chunk_elements=131072,
    window=3,
    heartbeat_interval_ms=1000,
    operation_timeout_ms=30_000,
    liveness_ms=DEFAULT_LIVENESS_MS,
)
"""Chunks of 32768 elements, 3 in flight per rank: 384 KiB of float32, less than what
a switch port or a 100 ms queue at 20 Mbit/s holds, so the window itself does not
overflow the queue it crosses; on the namespace testbed no other size and window
did better on shaped links (``benchmarks/probes/bench_window.py``).  Links much
faster than these are better served by larger chunks, since each chunk costs every
node a fixed amount of CPU: a float SUM or AVG (block-scaled) may agree chunks up to
131072 elements, which its ranks do when their paths are fast enough
(:mod:`cco.nodes.chunking`).

Operation timeout 30 s: it bounds a slot at an aggregator and, at an endpoint, the
time without progress of an operation (a watchdog that every completed chunk moves
on), not the whole operation, so that the largest collective on the slowest link
completes, however long it takes in all, while a stalled one fails within 30 s
naming the missing ranks."""

DEFAULT_FAN_IN = 16

RESUME_REDIAL_GAP = 9.0
"""Seconds of the default grace period after a restart beyond the peers' own loss
detection: the default is the liveness window plus this, 24 s with the default
window of 15 s.  Why: a peer notices a silent rendezvous after the liveness window
(which matters when the restart is quicker than that) and then dials it again, each
attempt lasting up to 10 s, with pauses of 1 s, 2 s, 4 s, 8 s ... between attempts
(:class:`cco.services.node.Redialer`).
An attempt under way when the new process starts completes at QUIC's next
retransmission of its Initial (seconds apart at most); one in a pause starts when
the pause ends.  Within the 60 s for which endpoints and aggregators keep a group
without a rendezvous (their ``rendezvous_grace``), no pause is longer than 8 s, so
every live peer is back within about 8 s plus a handshake of the restart: 9 s covers
that.  A longer grace would only delay the re-planning of groups that lost a member
or an aggregator during the outage."""

FALLBACK_LABEL = "cco:fallback"
"""The label an aggregator run by an end host registers with: planned only when the
dedicated aggregators cannot hold a group, and replaced as soon as they can."""


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """A group the rendezvous knows before anyone joins; ``None`` means the default."""

    world_size: int
    credential: bytes
    params: GroupParams | None = None
    max_fan_in: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.world_size <= MAX_WORLD_SIZE:
            raise ValueError(f"world_size {self.world_size} is outside 1..{MAX_WORLD_SIZE}")
        if self.max_fan_in is not None and self.max_fan_in < 2:
            raise ValueError("a fan-in bound must be at least 2")


@dataclass(frozen=True, slots=True)
class RendezvousConfig:
    """``params.heartbeat_interval_ms`` is also the rendezvous's own heartbeat interval.

    ``resume_grace_ms`` is how long a restored machine
    (:meth:`~cco.nodes.rendezvous.RendezvousMachine.restored`) waits for its away
    members and aggregators to come back; None means the liveness window
    (``params.loss_window``) plus :data:`RESUME_REDIAL_GAP` (see there for why).  Options:
    ``create_groups_on_join`` lets the first JoinRequest for an unknown group id
    create it with the joiner's world size and credential.  ``limits`` bound what
    peers may make the rendezvous hold (:mod:`cco.nodes.rendezvous_admission`).
    """

    groups: Mapping[bytes, GroupConfig] = field(default_factory=dict)
    create_groups_on_join: bool = False
    params: GroupParams = DEFAULT_PARAMS
    max_fan_in: int = DEFAULT_FAN_IN
    resume_grace_ms: int | None = None
    limits: AdmissionLimits = field(default_factory=AdmissionLimits)

    def __post_init__(self) -> None:
        if self.max_fan_in < 2:
            raise ValueError("a fan-in bound must be at least 2")
        if any(len(group_id) != GROUP_ID_SIZE for group_id in self.groups):
            raise ValueError(f"group ids are {GROUP_ID_SIZE} bytes")
        if self.resume_grace_ms is not None and self.resume_grace_ms < 0:
            raise ValueError("resume_grace_ms must not be negative")

    @property
    def heartbeat_interval(self) -> float:
        """The rendezvous's own heartbeat interval, in seconds."""
        return self.params.heartbeat_interval_ms / 1000.0

    @property
    def loss_window(self) -> float:
        """Seconds of silence after which the rendezvous counts a peer as lost (a member
        of a group with a longer window is given that one)."""
        return self.params.loss_window

    @property
    def resume_grace(self) -> float:
        """The grace period after a restart, in seconds."""
        if self.resume_grace_ms is not None:
            return self.resume_grace_ms / 1000.0
        return self.params.loss_window + RESUME_REDIAL_GAP

    def group_params(self, group_id: bytes) -> tuple[GroupParams, int]:
        """The parameters and fan-in bound a group starts with: its own, else the defaults."""
        cfg = self.groups.get(group_id)
        params = cfg.params if cfg and cfg.params else self.params
        return params, cfg.max_fan_in if cfg and cfg.max_fan_in else self.max_fan_in


__all__ = [
    "DEFAULT_FAN_IN",
    "DEFAULT_PARAMS",
    "FALLBACK_LABEL",
    "RESUME_REDIAL_GAP",
    "AdmissionLimits",
    "GroupConfig",
    "RendezvousConfig",
]
