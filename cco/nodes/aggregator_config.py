"""What an aggregator offers the rendezvous, and its local resource bounds."""

from __future__ import annotations

from dataclasses import dataclass

from cco.wire.messages import Address


@dataclass(frozen=True, slots=True, kw_only=True)
class AggregatorConfig:
    """What an aggregator offers the rendezvous, and its local resource bounds.

    ``capacity`` is the number of groups it serves at once.  ``pending_limit``
    bounds the chunks one peer may park before the rendezvous has told this node
    about their group; they are refused after ``pending_timeout`` seconds.
    ``record_limit`` bounds the per-group memory of completed slots kept to
    recognise late retransmissions.  ``retry_interval`` is the pause before a lost
    parent is dialled again.  ``rendezvous_grace`` is how long the groups it serves
    outlive the loss of the rendezvous: the data plane needs no rendezvous, so a
    restarted one (which keeps its state, draft section "Rendezvous Persistence and
    Restart") finds its trees still working; a group whose TreeAssignment has not
    come again within the grace ends.
    """

    address: Address
    capacity: int = 64
    max_fan_in: int = 64
    labels: tuple[str, ...] = ()
    pending_limit: int = 64
    pending_timeout: float = 5.0
    record_limit: int = 1024
    retry_interval: float = 1.0
    rendezvous_grace: float = 60.0
