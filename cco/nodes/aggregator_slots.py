"""The slots of one group at an aggregator: its chunks on their way up.

A part from a child opens a slot if none is open for its chunk (at most ``window``
per group, so a group's memory is bounded by window x chunk size, never by the size
of the tensor), is classified against the slot (:meth:`Slot.classify`) and does
what :data:`~cco.nodes.aggregator_states.SLOT_TABLE` says.  A completed slot sends
its one message on (up to the parent, or down as the Result at the root) and is kept
a while as fingerprints only, to recognise copies; so is an aborted operation.  The
timers of the slots ask silent children to send again at half the timeout, release
presence passes at the end of their wait, and abort operations whose slots are not
complete in time, naming the missing ranks.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cco.nodes.aggregator_slot import Slot, WaitState, fingerprint
from cco.nodes.aggregator_states import SLOT_TABLE, GroupEvent, SlotAction, SlotEvent, SlotState
from cco.nodes.deadlines import earlier
from cco.nodes.events import Command, PeerId, SendMessage
from cco.nodes.replies import ranks_text, refuse
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import ChunkMessage, PartialAggregate, RetransmitRequest
from cco.wire.payload import Aggregate, check_part, retype
from cco.wire.registries import Role

if TYPE_CHECKING:
    from cco.nodes.aggregator_group import AggregatorGroup

SlotKey = tuple[int, int]  # (op_id, chunk_index) within one group and epoch


@dataclass(frozen=True, slots=True)
class Part:
    """A chunk from a child, authorised to speak for ``contributors``."""

    peer: PeerId
    child: str  # its node id
    message: ChunkMessage
    contributors: frozenset[int]
    digest: bytes  # its fingerprint


MAX_CHUNKS_ASKED = 4096
"""Chunk indices in one RetransmitRequest; more are asked for in several."""


class GroupSlots:
    """Open slots, the slots kept after they finished, and the operations aborted."""

    def __init__(self, group: AggregatorGroup) -> None:
        self._group = group
        self.open: dict[SlotKey, Slot] = {}
        self.record: OrderedDict[SlotKey, Slot] = OrderedDict()  # finished: fingerprints and state only
        self.aborted: OrderedDict[int, None] = OrderedDict()

    def open_ops(self) -> set[int]:
        return {key[0] for key in self.open}

    def state_of(self, op_id: int, chunk_index: int) -> SlotState | None:
        slot = self.open.get((op_id, chunk_index)) or self.record.get((op_id, chunk_index))
        if slot is not None:
            return slot.state
        return SlotState.ABORTED if op_id in self.aborted else None

    def deadline(self, earliest: float | None) -> float | None:
        for slot in self.open.values():
            earliest = earlier(earliest, slot.next_timer())
        return earliest

    # --- parts ----------------------------------------------------------------------

    def part(
        self, peer: PeerId, child: str, message: ChunkMessage, contributors: frozenset[int], now: float
    ) -> list[Command]:
        """A chunk from ``child`` (already authorised to speak for ``contributors``)."""
        group = self._group
        key = (message.op_id, message.chunk_index)
        slot = self.open.get(key) or self.record.get(key)
        if slot is None and message.op_id in self.aborted:
            return []  # the operation is over: a late part changes nothing
        if slot is None:
            if len(self.open) >= group.window:
                detail = (
                    f"group {group.group_id.hex()} already has {len(self.open)} open slots "
                    f"(window {group.window})"
                )
                return [refuse(peer, message, ErrorCode.RESOURCE_EXHAUSTED, detail)]
            slot = Slot.open(message, group.expected, group.timeout, now)
            self.open[key] = slot
        part = Part(peer, child, message, contributors, fingerprint(message))
        move = SLOT_TABLE.move(slot.state, slot.classify(child, part.digest, contributors))
        if move is None:
            detail = (
                f"op {message.op_id} chunk {message.chunk_index}: node {child} sent a different "
                f"chunk in place of one already taken"
            )
            return [refuse(peer, message, ErrorCode.DUPLICATE_CONTRIBUTION, detail)]
        match move.action:
            case SlotAction.ADD | SlotAction.COMPLETE:  # first: nearly every part is one
                refused = self._add(key, slot, part)
                if refused is not None:
                    return refused
                slot.note(child, part.digest, contributors)
                slot.state = move.target
                if move.action is SlotAction.COMPLETE:
                    return self._complete(key, slot)
                return self._release(key, slot) if slot.releasable(group.root) else []
            case SlotAction.LATE:
                return self._late(key, slot, part)
            case SlotAction.RESEND:
                result = group.results.get(key)
                return [] if result is None else [SendMessage(peer, result)]
        return []  # IGNORE: a copy of what was taken, or the slot is over

    def _add(self, key: SlotKey, slot: Slot, part: Part) -> list[Command] | None:
        """Add the part to the slot's aggregate; the commands that refuse it, if it is refused."""
        group = self._group
        usage = group.context.usage
        message = part.message
        try:
            if slot.aggregate is None:
                slot.aggregate = Aggregate(message)  # kept as it is until the next part
                usage.hold(slot.aggregate.held_bytes)
            else:
                held = slot.aggregate.held_bytes
                slot.aggregate.add(message)
                usage.hold(slot.aggregate.held_bytes - held)
        except CcoError as error:
            if not slot.fingerprints:  # the slot this part opened holds nothing: close it again
                del self.open[key]
            if error.code is ErrorCode.OPERATION_MISMATCH and slot.fingerprints:
                # the children disagree on what this operation is: it cannot complete, so
                # every rank learns why at once instead of waiting for its timeout
                detail = (
                    f"aggregator {group.context.node_id}: op {message.op_id} chunk {message.chunk_index}: "
                    f"ranks {ranks_text(part.contributors)} (via {part.child}) and ranks "
                    f"{ranks_text(slot.received)} called different operations ({error.detail})"
                )
                return group.abort_op(message.op_id, error.code, detail, None)
            return [refuse(part.peer, message, error.code, error.detail)]
        return None

    def _late(self, key: SlotKey, slot: Slot, part: Part) -> list[Command]:
        """A part of a presence pass that went on without it.  The root does not count
        it: the rank gets the Result without having contributed.  Below the root it goes
        up as it is, in case the root is still short of its quorum (a rank that was
        early at this node makes the others late here, not necessarily at the root)."""
        group = self._group
        result = group.results.get(key)
        if result is not None:
            return [SendMessage(part.peer, result)]
        if group.root:
            return []
        try:
            check_part(part.message)
        except CcoError as error:
            return [refuse(part.peer, part.message, error.code, error.detail)]
        slot.note(part.child, part.digest, part.contributors)
        return group.send_up(retype(part.message, PartialAggregate))

    def _release(self, key: SlotKey, slot: Slot) -> list[Command]:
        slot.state = SLOT_TABLE.next(slot.state, SlotEvent.WAIT_OVER)
        return self._complete(key, slot)

    def _complete(self, key: SlotKey, slot: Slot) -> list[Command]:
        """Send the slot's one message on, and keep the slot as fingerprints only."""
        group = self._group
        aggregate = slot.aggregate
        assert aggregate is not None
        group.context.usage.hold(-aggregate.held_bytes)
        slot.aggregate = None
        del self.open[key]
        self._remember(key, slot)
        message = aggregate.message(group.outgoing)
        return group.send_down(message) if group.root else group.send_up(message)

    def _remember(self, key: SlotKey, slot: Slot) -> None:
        self.record[key] = slot
        while len(self.record) > self._group.context.config.record_limit:
            self.record.popitem(last=False)

    # --- ending -----------------------------------------------------------------------

    def abort(self, op_id: int) -> bool:
        """Free the operation's slots and remember it aborted; False if it already was."""
        if op_id in self.aborted:
            return False
        self.aborted[op_id] = None
        while len(self.aborted) > self._group.context.config.record_limit:
            self.aborted.popitem(last=False)
        usage = self._group.context.usage
        for key in [k for k in self.open if k[0] == op_id]:
            slot = self.open.pop(key)
            slot.state = SLOT_TABLE.next(slot.state, SlotEvent.ABORT)
            if slot.aggregate is not None:
                usage.hold(-slot.aggregate.held_bytes)
                slot.aggregate = None
            self._remember(key, slot)
        for key, slot in self.record.items():
            if key[0] == op_id:
                slot.state = SLOT_TABLE.next(slot.state, SlotEvent.ABORT)
        return True

    def forget(self) -> None:
        """What this node remembers of the group's operations belongs to one epoch."""
        self.record.clear()
        self.aborted.clear()

    # --- timers -----------------------------------------------------------------------

    def on_timer(self, now: float) -> list[Command]:
        return self._release_due(now) + self._nudge(now) + self._expire(now)

    def _release_due(self, now: float) -> list[Command]:
        """Release the presence passes whose wait is over.  A slot still missing a whole
        child aggregator waits once more as long: that child releases what its own
        ranks sent at the end of its wait, which began no earlier than this one."""
        group = self._group
        out: list[Command] = []
        for key, slot in list(self.open.items()):
            wait = slot.wait
            if wait is None or not wait.due(now) or not slot.collecting:
                continue
            if wait.state is WaitState.WAITING and self._silent_aggregator_child(slot):
                wait.extend(now)
                continue
            wait.state = WaitState.OVER
            if slot.releasable(group.root):
                out += self._release(key, slot)
        return out

    def _nudge(self, now: float) -> list[Command]:
        """At half the timeout, ask each child that has not sent a chunk to send it again.

        Sealing is deterministic, so what comes back is identical to anything that
        did arrive and is recognised as a retransmission; what was lost is replaced.
        """
        wanted: dict[tuple[str, int], list[int]] = {}
        for (op_id, index), slot in self.open.items():
            if slot.state is not SlotState.COLLECTING or slot.half_timeout > now:
                continue
            slot.state = SLOT_TABLE.next(slot.state, SlotEvent.HALF_TIMEOUT)
            for node_id in slot.owing(self._group.children):
                wanted.setdefault((node_id, op_id), []).append(index)
        return self._ask(wanted)

    def asked_again(self, request: RetransmitRequest, now: float) -> list[Command]:
        """The parent lacks chunks: pass the request on to the children that can supply them.

        A chunk this node already completed is reopened: its children's copies, all
        identical, rebuild the identical aggregate, which goes up again.  A presence
        pass released at the end of its wait is not: what it sent up was the ranks in
        time, and every later one went up on its own.
        """
        group = self._group
        wanted: dict[tuple[str, int], list[int]] = {}
        for index in request.chunks:
            key = (request.op_id, index)
            slot = self.open.get(key) or self.record.get(key)
            move = None if slot is None else SLOT_TABLE.move(slot.state, SlotEvent.ASKED_AGAIN)
            if slot is None or move is None:
                continue
            if move.action is SlotAction.REOPEN:
                if len(self.open) >= group.window:
                    continue
                del self.record[key]
                timeout = group.timeout
                slot = Slot(
                    opened=now, half_timeout=now + timeout / 2, deadline=now + timeout, expected=slot.expected
                )
                self.open[key] = slot
            slot.state = move.target
            if move.action is not SlotAction.IGNORE:
                for node_id in slot.owing(group.children):
                    wanted.setdefault((node_id, request.op_id), []).append(index)
        return self._ask(wanted)

    def _ask(self, wanted: dict[tuple[str, int], list[int]]) -> list[Command]:
        group = self._group
        out: list[Command] = []
        for (node_id, op_id), chunks in sorted(wanted.items()):
            peer = group.context.node_peer.get(node_id)
            if peer is None:
                continue
            for start in range(0, len(chunks), MAX_CHUNKS_ASKED):
                request = RetransmitRequest(
                    group_id=group.group_id,
                    epoch=group.epoch,
                    op_id=op_id,
                    chunks=tuple(sorted(chunks)[start : start + MAX_CHUNKS_ASKED]),
                    missing=bitmap_from_ranks(group.children[node_id]),
                )
                out.append(SendMessage(peer, request))
        return out

    def _expire(self, now: float) -> list[Command]:
        """Abort operations with a slot open too long, naming the ranks that are missing.

        A slot that misses a whole child *aggregator* first waits half a timeout
        more: that child, which saw which of its own ranks are missing, times out
        first and its Abort names them; this node could only name all its ranks.
        """
        group = self._group
        for slot in self.open.values():
            if (
                slot.deadline <= now
                and slot.state is SlotState.NUDGED
                and self._silent_aggregator_child(slot)
            ):
                slot.state = SLOT_TABLE.next(slot.state, SlotEvent.SILENT_CHILD)
                slot.deadline = now + group.timeout / 2
        late = sorted({key[0] for key, slot in self.open.items() if slot.deadline <= now})
        out: list[Command] = []
        for op_id in late:
            out += group.event(GroupEvent.SLOT_TIMEOUT, now)
            open_slots = [(k, s) for k, s in self.open.items() if k[0] == op_id]
            missing: set[int] = set()
            for _, slot in open_slots:
                missing |= slot.expected - slot.received
            chunks = sorted(k[1] for k, _ in open_slots)
            for _, slot in open_slots:
                slot.state = SLOT_TABLE.next(slot.state, SlotEvent.TIMEOUT)
            detail = (
                f"aggregator {group.context.node_id}: group {group.group_id.hex()} op {op_id} "
                f"chunks {chunks} incomplete after {group.timeout:g}s; missing ranks {ranks_text(missing)}"
            )
            out += group.abort_op(op_id, ErrorCode.TIMEOUT, detail, frozenset(missing))
        return out

    def _silent_aggregator_child(self, slot: Slot) -> bool:
        context = self._group.context
        for node_id in slot.owing(self._group.children):
            peer = context.node_peer.get(node_id)
            if peer is not None and context.peers[peer].role is Role.AGGREGATOR:
                return True
        return False
