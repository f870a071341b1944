"""Messages an aggregator cannot place yet, held for a while and bounded.

Two kinds wait: data from a child for a group (or epoch) whose TreeAssignment has not
arrived (the rendezvous's messages and a child's data race each other), *parked* per
connection; and data going down to a child whose connection has not been reported yet
(a broadcast receiver sends nothing before data reaches it), *held* per child.  Each
queue takes at most ``pending_limit`` messages, and each message waits at most
``pending_timeout`` seconds: a parked chunk is then refused with an Abort naming its
operation, a held one dropped (the child times out and asks again).  Parked payload
is also bounded in bytes, per peer (``parked_bytes_per_peer``) and for the whole
node (``parked_bytes``), so that a few peers parking large chunks for groups that
never come cannot make the node hold more than that: a chunk beyond either bound is
refused at once (RESOURCE_EXHAUSTED, naming the bound).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain

from cco.nodes.deadlines import earlier
from cco.nodes.events import Command, PeerId, SendMessage
from cco.wire.errors import ErrorCode
from cco.wire.messages import Abort, ChunkMessage, Message


def payload_size(message: Message) -> int:
    """The payload bytes a message holds (0 for an Abort and the control messages)."""
    return len(message.payload) if isinstance(message, ChunkMessage) else 0


@dataclass(frozen=True, slots=True)
class Waiting:
    arrived: float
    message: ChunkMessage | Abort


class Pending:
    """The parked and held queues of one aggregator, with the bytes they hold."""

    def __init__(
        self, limit: int, timeout: float, peer_bytes: int = 1 << 62, node_bytes: int = 1 << 62
    ) -> None:
        self.limit = limit
        self.timeout = timeout
        self.peer_bytes = peer_bytes
        self.node_bytes = node_bytes
        self.bytes = 0
        self.parked_bytes = 0
        self._parked: dict[PeerId, deque[Waiting]] = {}
        self._parked_by: dict[PeerId, int] = {}  # payload bytes each peer has parked
        self._held: dict[str, deque[Waiting]] = {}  # child node_id -> what waits for its connection

    def park(self, peer: PeerId, message: ChunkMessage | Abort, now: float) -> str | None:
        """Keep a chunk from ``peer`` until its group's assignment comes; when a bound
        would be passed, keep nothing and return the bound's description."""
        queue = self._parked.setdefault(peer, deque())
        size = payload_size(message)
        mine = self._parked_by.get(peer, 0)
        if len(queue) >= self.limit:
            return f"limit pending_limit ({self.limit}) reached: the peer's parked chunks"
        if mine + size > self.peer_bytes:
            return f"limit parked_bytes_per_peer ({self.peer_bytes}) reached: the peer's parked payload"
        if self.parked_bytes + size > self.node_bytes:
            return f"limit parked_bytes ({self.node_bytes}) reached: the payload parked by all peers"
        queue.append(Waiting(now, message))
        self._parked_by[peer] = mine + size
        self._count(size)
        return None

    def _count(self, size: int) -> None:
        self.bytes += size
        self.parked_bytes += size

    def _unpark(self, peer: PeerId, size: int) -> None:
        self.bytes -= size
        self.parked_bytes -= size
        left = self._parked_by.get(peer, 0) - size
        if left > 0:
            self._parked_by[peer] = left
        else:
            self._parked_by.pop(peer, None)

    def unpark(self, group_id: bytes, epoch: int) -> Iterator[tuple[PeerId, ChunkMessage | Abort]]:
        """Take out, in arrival order per peer, what was parked for ``group_id`` up to ``epoch``."""
        for peer, queue in list(self._parked.items()):
            mine: list[Waiting] = []
            rest: deque[Waiting] = deque()
            for entry in queue:
                ours = entry.message.group_id == group_id and entry.message.epoch <= epoch
                (mine if ours else rest).append(entry)
            if not mine:
                continue
            self._parked[peer] = rest
            self._unpark(peer, sum(payload_size(entry.message) for entry in mine))
            for entry in mine:
                yield peer, entry.message

    def hold(self, node_id: str, message: ChunkMessage | Abort, now: float) -> None:
        """Keep a message for a child whose connection is not reported yet (dropped
        when its queue is full)."""
        held = self._held.setdefault(node_id, deque())
        if len(held) < self.limit:
            held.append(Waiting(now, message))
            self.bytes += payload_size(message)

    def connected(self, node_id: str) -> list[ChunkMessage | Abort]:
        """What was held for ``node_id``, whose connection is now reported."""
        held = self._held.pop(node_id, deque())
        self.bytes -= sum(payload_size(entry.message) for entry in held)
        return [entry.message for entry in held]

    def disconnected(self, peer: PeerId) -> None:
        """What ``peer`` parked goes with its connection."""
        dropped = self._parked.pop(peer, ())
        self._unpark(peer, sum(payload_size(entry.message) for entry in dropped))

    def deadline(self, earliest: float | None) -> float | None:
        for queue in chain(self._parked.values(), self._held.values()):
            if queue:
                earliest = earlier(earliest, queue[0].arrived + self.timeout)
        return earliest

    def expire(self, now: float) -> list[Command]:
        """Refuse what waited too long: one Abort per parked operation, to its sender."""
        out: list[Command] = []
        for peer, queue in self._parked.items():
            told: set[tuple[bytes, int, int]] = set()
            while queue and queue[0].arrived + self.timeout <= now:
                message = queue.popleft().message
                self._unpark(peer, payload_size(message))
                op = (message.group_id, message.epoch, message.op_id)
                if op in told:
                    continue
                told.add(op)
                abort = Abort(
                    group_id=message.group_id,
                    epoch=message.epoch,
                    op_id=message.op_id,
                    code=ErrorCode.UNKNOWN_GROUP,
                    detail=f"no assignment for group {message.group_id.hex()} epoch {message.epoch} "
                    f"within {self.timeout}s",
                )
                out.append(SendMessage(peer, abort))
        for node_id, held in list(self._held.items()):
            while held and held[0].arrived + self.timeout <= now:
                self.bytes -= payload_size(held.popleft().message)
            if not held:
                del self._held[node_id]
        return out
