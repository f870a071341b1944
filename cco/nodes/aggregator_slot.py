"""One slot of an aggregator: a chunk of one operation, collected from the children.

A slot waits for the ranks below this node that the operation runs over.  It owns
its accumulator (:class:`~cco.wire.payload.Aggregate`: the integers added in place,
the contributor bits, the tag sum), which builds the one message the slot sends on
when it completes, and a fingerprint of each child's part, to recognise a copy: an
identical part is a retransmission and is never added twice, another part in its
place is refused.  Its state (:class:`~cco.nodes.aggregator_states.SlotState`) says
what it still waits for: half its timeout passed (the silent children were asked
again), its timeout passed with a child aggregator silent (it waits half a timeout
more, for that child's Abort, which names the ranks missing below it), complete,
released or aborted.

A presence pass (the one-element SUM that opens a quorum ALL_REDUCE) also has a
:class:`QuorumWait`: how long it waits for more ranks after its first, and the
fewest it may go on with.
"""

from __future__ import annotations

import hashlib
import marshal
import zlib
from dataclasses import dataclass, field
from enum import Enum

from cco.nodes.aggregator_states import SlotEvent, SlotState
from cco.wire.fields import ranks_from_bitmap
from cco.wire.messages import ChunkMessage
from cco.wire.payload import Aggregate, chunk_key

_MARSHAL_VERSION = 2  # the last version without references: see fingerprint


def fingerprint(message: ChunkMessage) -> bytes:
    """A short digest of everything a part says, to recognise a copy of it.

    Kept instead of the part itself, so recognising a retransmission costs 16 or 20
    bytes per child and slot rather than a copy of the data.  What is hashed is the
    part's chunk identity (:func:`~cco.wire.payload.chunk_key`, plain values), its class,
    contributors, width, tag and payload length, serialised by :mod:`marshal`: they
    are integers, bytes and None, which marshal writes with their type and length, so
    two parts serialise alike only if these are equal.  Format version 2, because
    later versions write an object met twice in one call as a reference to it, by
    identity, so two equal parts could serialise apart.  A tagged part's tag is a MAC
    of its payload and contributors: another payload under the same identity and tag
    comes only from a sender that forges the MAC, and it gains nothing, since a part
    taken for a copy is not added either; the sender only misses its
    DUPLICATE_CONTRIBUTION (draft section "Aggregator Processing").  So the payload
    itself is hashed, with CRC-32, only for untagged parts (MIN, MAX and the bitwise
    ops), which keeps hashing off most of an aggregator's data path.
    """
    said = (
        int(message.TYPE),
        *chunk_key(message),
        message.contributors,
        message.width,
        message.tag,
        len(message.payload),
    )
    digest = hashlib.blake2b(marshal.dumps(said, _MARSHAL_VERSION), digest_size=16).digest()
    if message.tag is not None:
        return digest
    return digest + zlib.crc32(message.payload).to_bytes(4, "big")


class WaitState(Enum):
    """Where a presence pass's wait for more ranks stands."""

    WAITING = "waiting"
    WAITING_LONGER = "waiting longer"  # a child aggregator was still silent: once more as long
    OVER = "over"  # it goes on with the ranks it has, once they are a quorum


@dataclass(slots=True)
class QuorumWait:
    """The quorum policy of a presence pass at this node."""

    quorum: int  # the fewest contributors the pass may complete with (at the root)
    started: float
    ends: float
    state: WaitState = WaitState.WAITING
    more: set[bytes] = field(default_factory=set)  # later parts of children that already sent one

    def due(self, now: float) -> bool:
        return self.state is not WaitState.OVER and self.ends <= now

    def extend(self, now: float) -> None:
        """Wait once more as long as the wait was (for a silent child aggregator, whose
        own wait began no earlier than this one)."""
        self.state = WaitState.WAITING_LONGER
        self.ends = now + (self.ends - self.started)


@dataclass(slots=True)
class Slot:
    """One (op_id, chunk_index) of a group in one epoch."""

    opened: float
    half_timeout: float  # when the silent children are asked to send again
    deadline: float
    expected: frozenset[int]  # the ranks below this node the chunk waits for
    state: SlotState = SlotState.COLLECTING
    fingerprints: dict[str, bytes] = field(default_factory=dict)  # child node_id -> its part's
    received: frozenset[int] = frozenset()
    aggregate: Aggregate | None = None
    wait: QuorumWait | None = None  # a presence pass

    @classmethod
    def open(cls, message: ChunkMessage, expected: frozenset[int], timeout: float, now: float) -> Slot:
        """The slot ``message`` is the first part of: it waits for the ranks below this
        node that the operation runs over (``members``, when the chunk names them) and,
        for a presence pass, until its quorum wait ends."""
        if message.members is not None:
            expected &= ranks_from_bitmap(message.members)
        slot = cls(opened=now, half_timeout=now + timeout / 2, deadline=now + timeout, expected=expected)
        if message.quorum is not None and message.wait_ms is not None:
            slot.wait = QuorumWait(message.quorum, now, now + message.wait_ms / 1000)
        return slot

    @property
    def collecting(self) -> bool:
        return (
            self.state is SlotState.COLLECTING
            or self.state is SlotState.NUDGED
            or (self.state is SlotState.EXTENDED)
        )

    def classify(self, child: str, digest: bytes, contributors: frozenset[int]) -> SlotEvent:
        """What a part from ``child`` is to this slot."""
        taken = self.fingerprints.get(child)
        if taken is not None:
            if taken == digest or (self.wait is not None and digest in self.wait.more):
                return SlotEvent.RETRANSMISSION
            if not self._another_part(contributors):
                return SlotEvent.CONFLICT
        if self.state is SlotState.RELEASED:
            return SlotEvent.LATE_PART
        if (self.received | contributors) == self.expected:
            return SlotEvent.LAST_PART
        return SlotEvent.PART

    def _another_part(self, contributors: frozenset[int]) -> bool:
        """A presence pass takes more than one part from a child: a child aggregator sends
        the ranks that came after its own wait as they come.  They are new ranks."""
        return self.wait is not None and not contributors & self.received

    def note(self, child: str, digest: bytes, contributors: frozenset[int]) -> None:
        """``child``'s part is taken (added, or passed on after the release)."""
        if child in self.fingerprints:
            assert self.wait is not None
            self.wait.more.add(digest)
        else:
            self.fingerprints[child] = digest
        self.received |= contributors

    def releasable(self, root: bool) -> bool:
        """A presence pass whose wait is over goes on with the ranks it has: at once
        below the root; at the root once they are a quorum."""
        wait = self.wait
        if wait is None or wait.state is not WaitState.OVER:
            return False
        return not root or len(self.received) >= wait.quorum

    def owing(self, children: dict[str, frozenset[int]]) -> list[str]:
        """The children that have ranks the slot waits for and sent nothing for it."""
        return [
            node_id
            for node_id, ranks in children.items()
            if ranks & self.expected and node_id not in self.fingerprints
        ]

    def next_timer(self) -> float:
        """When the first of this slot's timers is due: its timeout, the end of its quorum
        wait, or (not nudged yet) half its timeout.  One walk over a group's slots asks
        each slot once, since the runner asks for the next deadline after every input."""
        earliest = self.deadline
        wait = self.wait
        if wait is not None and wait.state is not WaitState.OVER and wait.ends < earliest:
            earliest = wait.ends
        if self.state is SlotState.COLLECTING and self.half_timeout < earliest:
            earliest = self.half_timeout
        return earliest
