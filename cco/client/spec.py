"""Which group to join and how: :class:`GroupSpec`, the default rank and
rendezvous, and the :class:`FallbackAggregator` an endpoint may run beside it.

Plain settings, apart from any session: a :class:`GroupSpec` is checked when it is
made, so a mistake shows at the line that made it, before any connection is tried.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from cco.config import parse_hostport
from cco.transport import TransportConfig
from cco.transport.certs import is_valid_node_id
from cco.wire.registries import GROUP_ID_SIZE, MAX_WORLD_SIZE

DEFAULT_RENDEZVOUS = "127.0.0.1:4433"
RENDEZVOUS_ENV = "CCO_RENDEZVOUS"
"""The variable ``cco-node`` itself reads for ``--rendezvous`` (and ``cco-node standalone``
sets for the command it runs): also :class:`GroupSpec`'s default."""


def _default_rendezvous() -> str:
    return os.environ.get(RENDEZVOUS_ENV, DEFAULT_RENDEZVOUS)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupSpec:
    """Which group to join and how to reach its rendezvous; checked when it is made
    (``ValueError`` naming the field), so a mistake shows at the line that made it."""

    group_id: bytes
    """16 bytes, the same on every rank."""
    world_size: int
    credential: bytes = b""
    rank: int | None = None
    """This member's rank.  None: the number that ends the node id (``ep-3`` is rank 3),
    else the ``RANK`` environment variable (torchrun's), when below ``world_size``;
    else the rendezvous gives one (see :func:`default_rank`)."""
    labels: tuple[str, ...] = ()
    rendezvous: str = field(default_factory=_default_rendezvous)
    """``HOST:PORT``; default: ``CCO_RENDEZVOUS``, else 127.0.0.1:4433."""
    rendezvous_id: str = "rendezvous"
    elastic: bool = False
    """When members leave or die: strict (False) fails every collective, naming the
    lost ranks, until :meth:`Communicator.accept_membership`; elastic (True) fails
    only those in flight and continues over the survivors."""

    def __post_init__(self) -> None:
        if not isinstance(self.group_id, bytes) or len(self.group_id) != GROUP_ID_SIZE:
            raise ValueError(f"group_id must be {GROUP_ID_SIZE} bytes, got {self.group_id!r}")
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int):
            raise ValueError(f"world_size must be an int, got {self.world_size!r}")
        if not 1 <= self.world_size <= MAX_WORLD_SIZE:
            raise ValueError(f"world_size {self.world_size} is outside [1, {MAX_WORLD_SIZE}]")
        if self.rank is not None and not (isinstance(self.rank, int) and 0 <= self.rank < self.world_size):
            raise ValueError(f"rank {self.rank!r} is not in [0, {self.world_size})")
        if not isinstance(self.credential, bytes):
            raise ValueError(f"credential must be bytes (b'...' or text.encode()), got {self.credential!r}")
        if isinstance(self.labels, str) or not all(isinstance(label, str) for label in self.labels):
            raise ValueError(f"labels must be a tuple of strings, got {self.labels!r}")
        parse_hostport(self.rendezvous)  # ValueError: expected HOST:PORT
        if not is_valid_node_id(self.rendezvous_id):
            raise ValueError(f"rendezvous_id {self.rendezvous_id!r} is not a node id")


_NUMBERED = re.compile(r".*-([0-9]+)")


def default_rank(node_id: str, world_size: int, environ: Mapping[str, str] = os.environ) -> int | None:
    """The rank a member takes when its :class:`GroupSpec` names none: the number ending
    ``node_id`` after a dash (``ep-3``: 3), else ``RANK`` from the environment, if it is
    below ``world_size``; else None (the rendezvous gives one)."""
    numbered = _NUMBERED.fullmatch(node_id)
    for text in (numbered.group(1) if numbered else None, environ.get("RANK")):
        if text is not None and text.isdigit() and int(text) < world_size:
            return int(text)
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class FallbackAggregator:
    """An aggregator this endpoint runs beside it, so that its group keeps working when
    no dedicated aggregator can serve it (draft section "Fallback to End Hosts").

    It registers with the rendezvous under the fallback label: the rendezvous places
    it in a tree only when the dedicated aggregators cannot hold the group, and moves
    the group back to dedicated ones as soon as they can.  It has its own identity
    (``node_id`` and ``transport``: a certificate with the aggregator role) and
    listens on ``host`` and ``port`` (0: any free port), an address the group's
    other endpoints must be able to reach.
    """

    node_id: str
    transport: TransportConfig
    host: str = "127.0.0.1"
    port: int = 0
    max_fan_in: int = 64
