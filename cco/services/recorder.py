"""The flight recorder: what a node's last operations and chunks were doing.

Every node keeps, in bounded memory, its most recent operations and their chunks:
group, epoch, op id, chunk index, collective, elements, state, the ranks it still
waits for, and when each was first seen and last changed.  A hang is then diagnosed
from the nodes' own accounts (``cco-node trace-analyze``, :mod:`cco.trace`): the
aggregator deepest in the tree that still waits for a chunk names the rank that owes
it.  The recorder reads the messages a :class:`~cco.services.runner.MachineRunner`
hands its machine and sends for it, so the machines stay free of it; it costs a few
dictionary operations per chunk message, never per byte.

What each node can say (draft section "Flight Recorder"):

* an aggregator learns from each TreeAssignment which ranks are below it
  (``expected``), so a chunk it collects names the ranks whose parts have not come;
* an endpoint records which of its chunks it sent and which Results came back, and
  when each operation completed or failed (it waits for its parent, not for ranks).

The recorder also keeps each group's place in the tree as the node last heard it,
which is what an aggregator or an endpoint answers in a StatusReply.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from cco.nodes.events import Command, OperationCompleted, OperationFailed
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import (
    Abort,
    BroadcastData,
    ChunkMessage,
    Contribution,
    EpochChange,
    JoinAccept,
    Message,
    PartialAggregate,
    RecordView,
    Result,
    TreeAssignment,
    chunk_count,
)
from cco.wire.registries import Collective

DEFAULT_ENTRIES = 4096
"""Operations and chunks a node remembers, oldest forgotten first (a few hundred
bytes each)."""

RecordKey = tuple[bytes, int, int, int | None]  # group, epoch, op id, chunk index (None: the operation)

COLLECTING = "collecting"
SENT = "sent"
SENT_UP = "sent up"
COMPLETE = "complete"
RECEIVED = "received"
RUNNING = "running"
FAILED = "failed"
ABORTED = "aborted"
OPEN_STATES = frozenset({COLLECTING, SENT, SENT_UP, RUNNING})
"""States of an entry that still waits for something."""


def _mask(bitmap: bytes) -> int:
    """A rank bitmap as an integer whose bit r is rank r (the draft's bit order)."""
    return int.from_bytes(bitmap, "little")


def _bitmap(mask: int) -> bytes:
    return mask.to_bytes((mask.bit_length() + 7) // 8, "little")


@dataclass(slots=True)
class Entry:
    """One operation (``chunk_index`` None) or one chunk, as this node saw it."""

    group_id: bytes
    epoch: int
    op_id: int
    chunk_index: int | None
    kind: Collective
    elements: int
    state: str
    started: float
    updated: float
    expected: int = 0  # ranks the entry waits for (a bit per rank); 0 if not known
    received: int = 0  # ranks whose data has come
    chunks: int = 1  # chunks of the operation (operation entries)
    done: int = 0  # of them, complete

    @property
    def missing(self) -> frozenset[int]:
        """The ranks it still waits for (none once it no longer waits)."""
        if self.state not in OPEN_STATES:
            return frozenset()
        return ranks_from_bitmap(_bitmap(self.expected & ~self.received))


@dataclass(slots=True)
class GroupPlace:
    """A group as this node last heard of it: its epoch and its place in the tree."""

    group_id: bytes
    epoch: int
    world_size: int | None = None
    rank: int | None = None  # an endpoint's own rank
    expected: frozenset[int] = frozenset()  # the ranks below this node (an aggregator)
    parent: str | None = None
    parent_ranks: frozenset[int] = frozenset()
    children: dict[int, str] = field(default_factory=dict)  # rank -> node id of endpoint children


class Recorder:
    """Watches one runner's messages; keeps the last ``capacity`` entries."""

    def __init__(self, started: float, capacity: int = DEFAULT_ENTRIES) -> None:
        if capacity < 1:
            raise ValueError(f"a flight recorder keeps at least 1 entry, not {capacity}")
        self.started = started
        self.capacity = capacity
        self.entries: OrderedDict[RecordKey, Entry] = OrderedDict()
        self.groups: dict[bytes, GroupPlace] = {}
        self._ops: dict[int, RecordKey] = {}  # an endpoint's op id -> its entry (one group per endpoint)

    def resize(self, capacity: int) -> None:
        """Keep at most ``capacity`` entries from now on (the oldest go first)."""
        if capacity < 1:
            raise ValueError(f"a flight recorder keeps at least 1 entry, not {capacity}")
        self.capacity = capacity
        self._trim()

    def _trim(self) -> None:
        while len(self.entries) > self.capacity:
            _, old = self.entries.popitem(last=False)
            if old.chunk_index is None:
                self._ops.pop(old.op_id, None)

    # --- what the runner reports ------------------------------------------------------

    def received(self, message: Message, now: float) -> None:
        """A message the machine is about to handle."""
        if isinstance(message, ChunkMessage):
            if isinstance(message, Contribution | PartialAggregate):
                self._part(message, now)
            else:
                self._chunk(message, COMPLETE if isinstance(message, Result) else RECEIVED, now)
        elif isinstance(message, Abort):
            self._abort(message, now)
        elif isinstance(message, TreeAssignment):
            self._assigned(message)
        elif isinstance(message, EpochChange):
            place = self.groups.get(message.group_id)
            if place is not None and message.epoch > place.epoch:
                place.epoch = message.epoch
        elif isinstance(message, JoinAccept):
            self.groups[message.group_id] = GroupPlace(
                message.group_id, message.epoch, message.world_size, rank=message.rank
            )

    def sent(self, message: Message, now: float) -> None:
        """A message the machine sent."""
        if isinstance(message, ChunkMessage):
            if isinstance(message, Contribution):
                state = SENT
            elif isinstance(message, PartialAggregate):
                state = SENT_UP
            elif isinstance(message, BroadcastData):
                state = SENT
            else:
                state = COMPLETE
            self._chunk(message, state, now)
        elif isinstance(message, Abort):
            self._abort(message, now)

    def command(self, command: Command, now: float) -> None:
        """An application command (an endpoint's operation completed or failed)."""
        if isinstance(command, OperationCompleted | OperationFailed):
            key = self._ops.pop(command.op_id, None)
            entry = self.entries.get(key) if key is not None else None
            if entry is not None:
                entry.state = COMPLETE if isinstance(command, OperationCompleted) else FAILED
                entry.updated = now

    # --- entries --------------------------------------------------------------------

    def _entry(self, message: ChunkMessage, chunk_index: int | None, now: float) -> Entry:
        key = (message.group_id, message.epoch, message.op_id, chunk_index)
        entry = self.entries.get(key)
        if entry is None:
            elements = message.total_elements if chunk_index is None else message.element_count
            entry = Entry(
                message.group_id,
                message.epoch,
                message.op_id,
                chunk_index,
                message.kind,
                elements,
                RUNNING if chunk_index is None else COLLECTING,
                now,
                now,
            )
            if chunk_index is None:
                entry.chunks = chunk_count(message.total_elements, message.chunk_elements)
                self._ops[message.op_id] = key
            else:
                place = self.groups.get(message.group_id)
                expected = _mask(bitmap_from_ranks(place.expected)) if place is not None else 0
                if message.members is not None:
                    expected &= _mask(message.members)
                entry.expected = expected
            self.entries[key] = entry
            self._trim()
        return entry

    def _operation(self, message: ChunkMessage, now: float) -> Entry:
        operation = self._entry(message, None, now)
        operation.updated = now
        return operation

    def _part(self, message: ChunkMessage, now: float) -> None:
        """A child's part of a chunk reached this aggregator."""
        self._operation(message, now)
        entry = self._entry(message, message.chunk_index, now)
        entry.received |= _mask(message.contributors)
        entry.updated = now

    def _chunk(self, message: ChunkMessage, state: str, now: float) -> None:
        operation = self._operation(message, now)
        entry = self._entry(message, message.chunk_index, now)
        if state == COMPLETE and entry.state != COMPLETE:
            operation.done += 1
            if operation.done >= operation.chunks and operation.state == RUNNING:
                operation.state = COMPLETE
        if entry.state != COMPLETE:
            entry.state = state
        entry.received |= _mask(message.contributors)  # what it carries is no longer awaited here
        entry.updated = now

    def _abort(self, message: Abort, now: float) -> None:
        key = (message.group_id, message.epoch, message.op_id, None)
        entry = self.entries.get(key)
        if entry is None:
            return
        entry.state = ABORTED
        entry.updated = now
        if message.missing is not None:
            entry.expected, entry.received = _mask(message.missing), 0

    def _assigned(self, message: TreeAssignment) -> None:
        place = self.groups.get(message.group_id)
        if place is None or place.epoch <= message.epoch:
            rank = place.rank if place is not None else None
            place = GroupPlace(message.group_id, message.epoch, message.world_size, rank=rank)
            self.groups[message.group_id] = place
        place.expected = ranks_from_bitmap(message.expected)
        if message.parent is not None:
            place.parent = message.parent.node_id
            place.parent_ranks = ranks_from_bitmap(message.parent.ranks)
        place.children = {}
        for child in message.children:
            ranks = ranks_from_bitmap(child.ranks)
            if len(ranks) == 1:  # an endpoint (an aggregator child speaks for its subtree)
                place.children[min(ranks)] = child.node_id

    # --- reading --------------------------------------------------------------------

    def views(self, limit: int | None = None) -> list[RecordView]:
        """The latest ``limit`` entries (all by default), oldest first, as the wire has them."""
        entries = list(self.entries.values())
        if limit is not None:
            entries = entries[len(entries) - limit :] if limit else []
        return [self.view(entry) for entry in entries]

    def view(self, entry: Entry) -> RecordView:
        return RecordView(
            group_id=entry.group_id,
            epoch=entry.epoch,
            op_id=entry.op_id,
            chunk_index=entry.chunk_index,
            kind=entry.kind,
            state=entry.state,
            elements=entry.elements,
            missing=bitmap_from_ranks(entry.missing),
            started_ms=self.millis(entry.started),
            updated_ms=self.millis(entry.updated),
        )

    def millis(self, when: float) -> int:
        """``when`` (the runner's clock) in milliseconds since the recorder started."""
        return max(0, round((when - self.started) * 1000))


__all__ = ["DEFAULT_ENTRIES", "Entry", "GroupPlace", "Recorder"]
