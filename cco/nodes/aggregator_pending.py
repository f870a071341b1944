"""Messages an aggregator cannot place yet, held for a while and bounded.

Two kinds wait: data from a child for a group (or epoch) whose TreeAssignment has not
arrived (the rendezvous's messages and a child's data race each other), *parked* per
connection; and data going down to a child whose connection has not been reported yet
(a broadcast receiver sends nothing before data reaches it), *held* per child.  Each
queue takes at most ``pending_limit`` messages, and each message waits at most
``pending_timeout`` seconds: a parked chunk is then refused with an Abort naming its
operation, a held one dropped (the child times out and asks again).
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

    def __init__(self, limit: int, timeout: float) -> None:
        self.limit = limit
        self.timeout = timeout
        self.bytes = 0
        self._parked: dict[PeerId, deque[Waiting]] = {}
        self._held: dict[str, deque[Waiting]] = {}  # child node_id -> what waits for its connection

    def park(self, peer: PeerId, message: ChunkMessage | Abort, now: float) -> bool:
        """Keep a chunk from ``peer`` until its group's assignment comes; False when the
        peer's queue is full."""
        queue = self._parked.setdefault(peer, deque())
        if len(queue) >= self.limit:
            return False
        queue.append(Waiting(now, message))
        self.bytes += payload_size(message)
        return True

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
            self.bytes -= sum(payload_size(entry.message) for entry in mine)
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
        self.bytes -= sum(payload_size(entry.message) for entry in dropped)

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
                self.bytes -= payload_size(message)
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
