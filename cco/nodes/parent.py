"""The connection a node dials to its parent in a group's tree, the same for an
endpoint (one parent) and an aggregator (one per group it serves).

The node dials the parent its TreeAssignment names; once the I/O layer reports the
connection, authenticated as that node, the parent is *up*.  A lost parent is dialled
again after a pause (``retry_interval``, the dial backoff), for as long as the tree
still names it.  Each dial gets a fresh peer id, so a late report about an older
connection is never taken for the current one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from cco.nodes.events import ClosePeer, Command, ConnectTo, PeerId
from cco.wire.errors import ErrorCode
from cco.wire.messages import NodeRef


class Dials:
    """Fresh peer ids for the connections one node dials."""

    def __init__(self) -> None:
        self._count = itertools.count(1)

    def peer(self, *labels: object) -> PeerId:
        return "/".join(["parent", *(str(label) for label in labels), str(next(self._count))])


@dataclass(slots=True)
class ParentLink:
    """The dialled connection to one parent: who it reaches, whether it is up, and when
    to dial again after losing it."""

    peer: PeerId | None = None
    node_id: str | None = None  # whom it reaches
    up: bool = False
    retry_at: float | None = None

    def dial(self, peer: PeerId, parent: NodeRef) -> ConnectTo:
        """Dial ``parent`` as ``peer`` (the connection dialled before is forgotten)."""
        self.peer, self.node_id, self.up, self.retry_at = peer, parent.node_id, False, None
        return ConnectTo(peer, parent.address, parent.node_id)

    def reaches(self, node_id: str) -> bool:
        """Whether the parent is up and is ``node_id``."""
        return self.up and self.node_id == node_id

    def connected(self) -> None:
        self.up = True
        self.retry_at = None

    def lost(self, now: float, retry_interval: float | None) -> None:
        """The connection is gone; with ``retry_interval``, dial again after that pause."""
        self.up = False
        if retry_interval is not None:
            self.retry_at = now + retry_interval

    def retry_due(self, now: float) -> bool:
        """Whether the pause after a loss is over (it is then over for good)."""
        if self.retry_at is None or now < self.retry_at:
            return False
        self.retry_at = None
        return True

    def hand_over(self) -> ParentLink:
        """Move the connection, still open, to a new link (whose owner closes it later),
        leaving this one empty, ready to dial another parent."""
        kept = ParentLink(self.peer, self.node_id, self.up)
        self.peer, self.node_id, self.up, self.retry_at = None, None, False, None
        return kept

    def close(self, why: str) -> list[Command]:
        """Forget the parent, closing the connection if there is one."""
        peer = self.peer
        self.peer, self.node_id, self.up, self.retry_at = None, None, False, None
        return [ClosePeer(peer, ErrorCode.NO_ERROR, why)] if peer is not None else []
