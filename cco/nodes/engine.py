"""The operations of one membership at an endpoint: the window, the pump and the
outstanding chunks, and what happens to each chunk that comes back.

* At most ``GroupParams.window`` chunks of the session are outstanding at a time,
  across all its operations in call order; a chunk stops being outstanding when its
  result comes back, so the tree's memory per group stays bounded by window x chunk
  size (SwitchML's self-clocking).  Each chunk is sealed when the window lets it
  leave, under the epoch current at that moment.
* Every Result or BroadcastData chunk is verified (:func:`payload.open_verified`)
  against the ranks that must have contributed and against this rank's own
  contribution, then decoded straight into the result and remembered by a digest;
  an operation completes once every chunk is verified.
* A chunk that fails verification fails its operation with VERIFICATION_FAILED, and
  the rendezvous hears of it in a Report naming the parent that delivered it (one
  per failed operation): it moves the group to a tree without that path, in a new
  epoch.  Until that epoch comes no chunk leaves into the reported tree, so a caller
  that simply calls again gets its result from the new tree.  The other ranks fail
  the operations whose data went through the reported tree when they learn of the
  new epoch, if they did not find the tampering themselves: the same operations
  fail on every rank, and every caller calls again alike.
* A tree that fails (a re-planned epoch, a lost parent, an Abort saying so)
  interrupts operations instead of failing them: they start again from this rank's
  input in the next tree, within their deadline.  A chunk whose result is half a
  timeout overdue is sent again, and an aggregator answers with the Result it kept.
* A scale pass's result is its data operation's scales, a presence pass's
  contributors are the members its operations run over; a pass that fails fails its
  data operation, which is what the caller sees.

Every operation moves along :data:`~cco.nodes.endpoint_states.OPERATION_TABLE`, and
every failure reaches the caller as :class:`OperationFailed` carrying an
:class:`~cco.nodes.calls.OperationError` that names the group, the operation, the
collective and, when anyone knows them, the ranks that did not contribute.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np

from cco.nodes import chunking
from cco.nodes.calls import TREE_FAILURES, EndpointConfig, OperationError
from cco.nodes.data_operation import DataOperation
from cco.nodes.deadlines import earlier
from cco.nodes.endpoint_states import OPERATION_TABLE, OperationAction, OperationEvent, OperationState
from cco.nodes.events import Command, OperationCompleted, OperationFailed, SendMessage
from cco.nodes.membership import Membership
from cco.nodes.operation import WireOperation, digest
from cco.nodes.parent import ParentLink
from cco.nodes.passes import PresencePass, ScalePass
from cco.nodes.planning import Prepared
from cco.nodes.replies import ranks_text
from cco.nodes.session import RendezvousSession
from cco.nodes.tree_reports import TreeReports
from cco.nodes.verification import check_copy, open_chunk, tampered
from cco.wire import payload
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import (
    REPORT_CODES,
    Abort,
    BroadcastData,
    ChunkMessage,
    Contribution,
    Result,
    RetransmitRequest,
    clip_detail,
)
from cco.wire.packing import unpack
from cco.wire.registries import Collective

_FINISHED = (OperationState.COMPLETED, OperationState.FAILED)
_HELD_BACK = (OperationState.QUEUED, OperationState.SENDING)
_WHOLE_GROUP = (Collective.ALL_GATHER, Collective.REDUCE_SCATTER)  # need every rank


class OperationEngine:
    """Every wire operation of one membership in flight, in call order."""

    def __init__(
        self,
        config: EndpointConfig,
        membership: Membership,
        parent: ParentLink,
        rendezvous: RendezvousSession,
    ) -> None:
        self._early_limit = config.early_limit
        self._membership = membership
        self._parent = parent
        self._rendezvous = rendezvous
        self.ready = False
        """Whether chunks may leave: the session is READY (its parent connected, its tree current)."""
        self.reports = TreeReports(membership, parent, rendezvous)
        self.next_op_id = 0
        self.outstanding = 0
        """Chunks sent whose result has not come back, across all operations."""
        self._ops: OrderedDict[int, WireOperation] = OrderedDict()
        self._early: dict[int, list[ChunkMessage | Abort]] = {}
        self._early_count = 0
        self.goodput = chunking.Goodput()
        """What this rank's block-scaled operations moved per second: its chunk proposals."""
        self._recent: OrderedDict[tuple[int, int], ChunkMessage] = OrderedDict()
        """The last 2 x window chunks this rank sealed, whole (their payload at its width
        and every identifying field: a few MiB at most), to seal again for a rank that
        restarts an operation this one completed (see :meth:`resend`); a failed
        operation's are dropped."""

    # --- observation ----------------------------------------------------------

    def state_of(self, op_id: int) -> OperationState | None:
        op = self._ops.get(op_id)
        return op.state if op else None

    def operation(self, op_id: int) -> WireOperation | None:
        return self._ops.get(op_id)

    def awaits_epoch(self, epoch: int) -> bool:
        """Whether an operation still waits for results of ``epoch``: one kept through a
        Leave (:meth:`fail_all`'s ``keep_sent``), whose old tree still owes it them."""
        return any(op.epoch == epoch for op in self._ops.values())

    @property
    def kept_chunks(self) -> list[tuple[int, int]]:
        return list(self._recent)

    def deadline(self, earliest: float | None) -> float | None:
        for op in self._ops.values():
            earliest = earlier(earliest, _call(op).deadline)
            if op.outstanding:
                earliest = earlier(earliest, min(op.outstanding.values()) + op.timeout / 2)
        return earliest

    # --- starting -------------------------------------------------------------

    def start(self, prepared: Prepared, now: float) -> tuple[int, list[Command]]:
        """Begin a planned call; its op_id and what to send now.  A value that cannot be
        encoded consumes the op_ids and fails the operation, so that every rank's op_id
        sequence stays aligned."""
        membership = self._membership
        request = prepared.request
        if len(membership.members) < membership.world_size and request.kind in _WHOLE_GROUP:
            raise CcoError(
                ErrorCode.UNSUPPORTED_FEATURE,
                f"{request.kind.name} needs every rank of {membership.world_size}; "
                f"members are {ranks_text(membership.members)}",
            )
        operation = prepared.operation
        scaled = prepared.width is not None
        first = self.next_op_id  # the call's first wire operation: its presence or scale pass, if any
        presence_id = first if request.quorum is not None else None
        scale_id = first + (presence_id is not None) if scaled else None
        self.next_op_id += 1 + (presence_id is not None) + (scale_id is not None)
        op_id = self.next_op_id - 1
        refusal = membership.refusal(op_id, request.kind)
        if refusal is not None:
            return op_id, [OperationFailed(op_id, refusal)]
        operation.op_id = op_id
        operation.deadline = now + operation.timeout
        if operation.total >= 0 and not operation.members:
            # plan() sized it under these parameters; only the members are of now
            operation.members = membership.members
        prepared.compute()
        if prepared.error is not None:
            return op_id, self._refuse_start(first, op_id, request.kind, prepared.error)
        passes: list[WireOperation] = []
        if operation.scaling is not None:
            assert scale_id is not None
            scaling = operation.scaling
            scaling.chunk_proposal = chunking.proposal(
                scaling.planned_chunk_elements,
                prepared.params.scaled_chunk_limit,
                scaling.block_elements,
                operation.total,
                scaling.width,
                self.goodput.value,
            )
            passes.append(ScalePass.of(scale_id, operation))
        if request.quorum is not None:
            assert presence_id is not None
            presence = PresencePass.of(presence_id, operation, request.quorum, membership.accepted)
            presence.decides = tuple(p.op_id for p in [*passes, operation])
            for gated in [*passes, operation]:
                gated.gated = True
            passes.insert(0, presence)
        out = self._begin([*passes, operation], now)
        if operation.state not in _FINISHED:
            out += self.pump(now)
        return op_id, out

    def _begin(self, operations: list[WireOperation], now: float) -> list[Command]:
        """Register a call's wire operations, then replay what arrived for them before
        they started (a presence pass that completes so decides the ones after it)."""
        for operation in operations:
            self._ops[operation.op_id] = operation
            if operation.source is None:
                self._apply(operation, OperationEvent.ALL_SENT)
        out: list[Command] = []
        for operation in operations:
            early = self._early.pop(operation.op_id, [])
            self._early_count -= len(early)
            for message in early:
                if operation.state in _FINISHED:
                    break
                out += self._on_op_message(operation, message, now)
        return out

    def _refuse_start(self, first: int, op_id: int, kind: Collective, error: CcoError) -> list[Command]:
        """An operation whose input cannot be encoded: fail it, and tell the tree so
        the other ranks fail at once instead of waiting for this rank.  The Abort names
        ``first``, the first wire operation of the call (its scale pass, if any)."""
        membership = self._membership
        rank = membership.rank
        out: list[Command] = []
        if self.ready and self._parent.peer is not None:
            abort = Abort(
                group_id=membership.group_id,
                epoch=membership.epoch,
                op_id=first,
                code=error.code,
                detail=clip_detail(f"rank {rank}: {error.detail}"),
                missing=bitmap_from_ranks([rank]),
            )
            out.append(SendMessage(self._parent.peer, abort))
        failure = OperationError(
            error.code,
            error.detail,
            group_id=membership.group_id,
            op_id=op_id,
            kind=kind,
            missing_ranks=frozenset({rank}),
        )
        return [*out, OperationFailed(op_id, failure)]

    # --- sending --------------------------------------------------------------

    def pump(self, now: float) -> list[Command]:
        """Send chunks, oldest operation first, while the window has room."""
        parent = self._parent.peer
        if not self.ready or parent is None or self.reports.holding:
            return []
        window = self._membership.params.window
        out: list[Command] = []
        for op in list(self._ops.values()):
            if op.ready:
                out += self._send_chunks(op, parent, window, now)
            if op.state in _HELD_BACK:
                break  # later operations wait behind this one: chunks leave in call order
        return out

    def _send_chunks(self, op: WireOperation, parent: str, window: int, now: float) -> list[Command]:
        """Send ``op``'s next chunks while the window has room."""
        out: list[Command] = []
        while op.source is not None and op.next_chunk < op.chunks and self.outstanding < window:
            try:
                message = self._seal(op, op.next_chunk)
            except CcoError as error:
                return out + self._input_changed(op, op.next_chunk, error)
            out.append(SendMessage(parent, message))
            if op.next_chunk == 0 and isinstance(op, DataOperation):
                op.first_sent = now
            op.outstanding[op.next_chunk] = now
            self.outstanding += 1
            op.next_chunk += 1
            self._apply(op, OperationEvent.SENT if op.next_chunk < op.chunks else OperationEvent.ALL_SENT)
        return out

    def _seal(self, op: WireOperation, index: int) -> ChunkMessage:
        membership = self._membership
        if op.epoch is None:
            op.epoch = membership.epoch
            op.members = op.listed if op.listed is not None else membership.members
        cls: type[ChunkMessage] = BroadcastData if op.broadcast else Contribution
        sealed = payload.seal(
            membership.keys,
            op.header(membership.group_id, index, op.epoch),
            membership.rank,
            op.chunk_values(index),
            cls,
            membership.coefficients,
        )
        self._recent[(op.op_id, index)] = sealed
        self._recent.move_to_end((op.op_id, index))
        while len(self._recent) > 2 * membership.params.window:
            self._recent.popitem(last=False)
        return sealed

    def resend(self, request: RetransmitRequest, now: float) -> list[Command]:
        """Send the listed chunks again: sealing is deterministic, so each copy is
        identical to the first and an aggregator that has it recognises it.

        A chunk of an operation this rank already completed is asked for when the
        tree failed after this rank got its result but before another rank did:
        that rank starts the operation again in the new epoch and cannot finish
        without this rank's part.  The last sealed chunks are kept for that and
        sealed again, the same integers under the new epoch's chunk ids."""
        op = self._ops.get(request.op_id)
        if op is None:
            return self._seal_again(request)
        if op.epoch != request.epoch:
            return []
        return self._resend(op, set(request.chunks), now)

    def _seal_again(self, request: RetransmitRequest) -> list[Command]:
        membership = self._membership
        parent = self._parent.peer
        if parent is None or not self._parent.up or request.epoch != membership.epoch:
            return []
        out: list[Command] = []
        for index in sorted(set(request.chunks)):
            kept = self._recent.get((request.op_id, index))
            if kept is None or kept.epoch >= request.epoch:
                continue
            header = dataclasses.replace(payload.ChunkHeader.of(kept), epoch=request.epoch)
            values = unpack(kept.payload, kept.width)  # a fixed width (block-scaled): sealed as it is
            if header.width is None:  # the smallest width its integers fit: seal takes them as int64
                values = values.astype(np.int64)
            again = payload.seal(membership.keys, header, membership.rank, values, type(kept))
            out.append(SendMessage(parent, again))
        return out

    def _resend(self, op: WireOperation, chunks: set[int], now: float) -> list[Command]:
        parent = self._parent.peer
        if parent is None or not self._parent.up:
            return []
        out: list[Command] = []
        for index in sorted(chunks & op.outstanding.keys()):
            op.outstanding[index] = now
            try:
                message = self._seal(op, index)
            except CcoError as error:
                return out + self._input_changed(op, index, error)
            out.append(SendMessage(parent, message))
            self._apply(op, OperationEvent.RESENT)
        return out

    # --- what comes back --------------------------------------------------------

    def on_message(self, message: Result | BroadcastData | Abort, now: float) -> list[Command]:
        """A chunk or an Abort from the parent, for an operation in flight (or one this
        rank has not started yet: a broadcast root may run ahead of a receiver)."""
        op = self._ops.get(message.op_id)
        if op is None:
            if message.op_id >= self.next_op_id and self._early_count < self._early_limit:
                self._early.setdefault(message.op_id, []).append(message)
                self._early_count += 1
            return []  # finished operations ignore late traffic
        return self._on_op_message(op, message, now)

    def _on_op_message(self, op: WireOperation, message: ChunkMessage | Abort, now: float) -> list[Command]:
        if message.epoch != (op.epoch if op.epoch is not None else self._membership.epoch):
            return []  # another epoch's traffic: the operation runs (again) in this one
        if isinstance(message, Abort):
            gone = op.members - self._membership.members
            if message.code in TREE_FAILURES and gone:
                # kept through a Leave (fail_all's keep_sent) and the leaver had not sent:
                # no later tree carries the ranks that left, so it cannot start again
                detail = f"aborted by the tree after ranks {ranks_text(gone)} left: {message.detail}"
                return self._finish_failed(
                    op, OperationEvent.ABORTED, ErrorCode.PEER_LOST, detail, gone, tell_tree=False
                )
            if message.code in TREE_FAILURES:
                self._interrupt(op, f"aborted by the tree: {message.detail}", aborted_in=message.epoch)
                return []
            missing = ranks_from_bitmap(message.missing) if message.missing is not None else None
            detail = f"aborted by the tree: {message.detail}"
            out = self._finish_failed(
                op, OperationEvent.ABORTED, message.code, detail, missing, tell_tree=False
            )
            if message.code in REPORT_CODES and out:
                self.reports.failed_epoch = message.epoch
                self.reports.hold(message.epoch)  # another rank found it, and is reporting it
            return out
        return self._on_chunk(op, message, now)

    def _on_chunk(self, op: WireOperation, message: ChunkMessage, now: float) -> list[Command]:
        index = message.chunk_index
        if op.chunks == 0:  # a broadcast receiver without an array learns the size here
            membership = self._membership
            op.size(message.total_elements, membership.params.chunk_elements, membership.members)
        try:
            if index in op.verified:
                check_copy(op, message, self._membership)
                del op.headers[index]  # built again by expected_header: verified chunks keep none
                self._apply(op, OperationEvent.DUPLICATE)
                return []
            values = open_chunk(op, message, self._membership)
        except CcoError as error:
            detail = f"chunk {index}: {error.detail}"
            out = self._finish_failed(op, OperationEvent.BAD_CHUNK, error.code, detail, None, tell_tree=True)
            if out:
                self.reports.failed_epoch = message.epoch
                if tampered(error.code, message):
                    out += self.reports.report(op.op_id, message.epoch, error.code, detail)
            return out
        op.epoch = message.epoch
        op.verified[index] = digest(message)
        del op.headers[index]  # built by expected_header, if not already by _seal
        self._progress(op, now)
        op.decode(index, values)
        if index in op.outstanding:
            del op.outstanding[index]
            self.outstanding -= 1
        if len(op.verified) < op.chunks:
            self._apply(op, OperationEvent.CHUNK)
            return self.pump(now)
        return self._complete(op, now) + self.pump(now)

    def _progress(self, op: WireOperation, now: float) -> None:
        """A chunk of the call was verified: a watchdog deadline (no explicit timeout),
        the call's one deadline whichever of its passes verified the chunk, moves on."""
        call = _call(op)
        if call.watchdog:
            call.deadline = max(call.deadline, now + call.timeout)

    def _served(self, op: WireOperation) -> DataOperation | None:
        """The data operation a pass serves, while it is in flight."""
        if isinstance(op, ScalePass | PresencePass) and self._ops.get(op.data.op_id) is op.data:
            return op.data
        return None

    def _complete(self, op: WireOperation, now: float) -> list[Command]:
        result: np.ndarray | None = None
        if op.receives:
            if op.decode_error is not None:
                detail = f"decoding: {op.decode_error.detail}"
                return self._finish_failed(
                    op, OperationEvent.BAD_CHUNK, op.decode_error.code, detail, None, tell_tree=False
                )
            assert op.result is not None
            if isinstance(op, PresencePass):  # its contributors decide the members
                self._apply(op, OperationEvent.LAST_CHUNK)
                for decided in op.decides:
                    if (gated := self._ops.get(decided)) is not None:
                        gated.decide(op.contributors, op)
                        if gated.source is None:
                            self._apply(gated, OperationEvent.ALL_SENT)
                return []
            if isinstance(op, ScalePass):  # its result is the data operation's scales
                self._apply(op, OperationEvent.LAST_CHUNK)
                data = self._served(op)
                if data is not None and data.scaling is not None:
                    data.agree(op.result)
                return []
            assert isinstance(op, DataOperation)
            result = op.shaped_result()
            if op.scaling is not None and op.first_sent is not None:
                self.goodput.observe(op.total * op.scaling.width, now - op.first_sent)
        self._apply(op, OperationEvent.LAST_CHUNK)
        if not isinstance(op, DataOperation):
            return [OperationCompleted(op.op_id, result, op.listed, op.chunk_elements)]
        self._end_passes(op)  # a presence pass run again may still wait: it decides nothing
        return [OperationCompleted(op.op_id, result, op.listed, op.chunk_elements, op.chunk_agreement())]

    # --- ending ---------------------------------------------------------------

    def _input_changed(self, op: WireOperation, index: int, error: CcoError) -> list[Command]:
        """Chunk ``index`` encoded at start() but no longer does: the caller changed the
        array before the operation completed.  Fail the operation, and tell the tree so
        the other ranks fail at once instead of waiting for this rank."""
        detail = f"chunk {index}: the input changed before the operation completed: {error.detail}"
        missing = frozenset({self._membership.rank})
        return self._finish_failed(op, OperationEvent.BAD_CHUNK, error.code, detail, missing, tell_tree=True)

    def _finish_failed(
        self,
        op: WireOperation,
        event: OperationEvent,
        code: ErrorCode,
        detail: str,
        missing: frozenset[int] | None,
        *,
        tell_tree: bool,
    ) -> list[Command]:
        """Fail one operation; release its window share; optionally tell the tree.

        A pass fails the data operation it serves (which is what the caller sees); a
        data operation takes its unfinished passes with it."""
        if self._ops.get(op.op_id) is not op:
            return []  # already ended, with its pass or its data operation
        self._apply(op, event)
        self._forget_kept(op.op_id)
        out: list[Command] = []
        membership = self._membership
        parent = self._parent.peer
        if tell_tree and self._parent.up and parent is not None and op.epoch is not None:
            abort = Abort(
                group_id=membership.group_id,
                epoch=op.epoch,
                op_id=op.op_id,
                code=code,
                detail=clip_detail(f"rank {membership.rank}: {detail}"),
                missing=bitmap_from_ranks(missing) if missing else None,
            )
            out.append(SendMessage(parent, abort))
        if isinstance(op, ScalePass | PresencePass):
            data = self._served(op)
            if data is None:
                return out
            # Other ranks may have finished their pass already: they hear of this
            # failure through an Abort of the data operation.
            data.epoch = op.epoch
            failure = f"{'presence' if isinstance(op, PresencePass) else 'scale'} pass: {detail}"
            return out + self._finish_failed(data, event, code, failure, missing, tell_tree=tell_tree)
        assert isinstance(op, DataOperation)
        for wire_pass in self._end_passes(op):
            self._forget_kept(wire_pass.op_id)
        out.append(OperationFailed(op.op_id, self._error(op, code, detail, missing)))
        return out

    def _end_passes(self, data: DataOperation) -> list[WireOperation]:
        """Release the passes of ``data``'s call still in flight (its call ended)."""
        ended: list[WireOperation] = [
            p for p in self._ops.values() if isinstance(p, ScalePass | PresencePass) and p.data is data
        ]
        for wire_pass in ended:
            self._apply(wire_pass, OperationEvent.LOST)
        return ended

    def _forget_kept(self, op_id: int) -> None:
        """A failed operation's sealed chunks are not kept for sealing again: only an
        operation this rank completed is completed for the ranks that restart it."""
        for key in [key for key in self._recent if key[0] == op_id]:
            del self._recent[key]

    def _error(
        self, op: WireOperation, code: ErrorCode, detail: str, missing: frozenset[int] | None
    ) -> OperationError:
        return OperationError(
            code,
            detail,
            group_id=self._membership.group_id,
            op_id=op.op_id,
            kind=op.kind,
            missing_ranks=missing,
            missing_chunks=tuple(op.missing_chunks()),
        )

    def fail_all(
        self, code: ErrorCode, detail: str, missing: frozenset[int] | None, *, keep_sent: bool = False
    ) -> list[Command]:
        """Fail every operation in flight (the tree they used is gone) and forget early data.

        With ``keep_sent`` (ranks left on purpose, the tree stands), an operation to which
        this rank sent every chunk still waits for its results in its own epoch: its
        slots complete if the leavers had sent too, and the tree aborts it otherwise."""
        out: list[Command] = []
        for op in list(self._ops.values()):
            if (
                keep_sent
                and op.state is OperationState.AWAITING
                and op.source is not None
                and op.interrupted is None
            ):
                continue
            out += self._finish_failed(op, OperationEvent.LOST, code, detail, missing, tell_tree=False)
        for queued in self._early.values():
            self._early_count -= len(queued)
        self._early.clear()
        return out

    def fail_reported(self, why: str) -> list[Command]:
        """The group left a tree that a rank reported for data that failed verification.
        An operation whose data went through that tree (it sent or received a chunk
        there) fails with VERIFICATION_FAILED, as it did at the rank that checked it,
        so that every rank fails it and every caller can call again alike; one that
        sent nothing there yet, or that this rank sent after it had seen that tree's
        tampering itself, starts in the new tree (:meth:`interrupt_all`)."""
        out: list[Command] = []
        for op in list(self._ops.values()):
            # an operation sent into a tree whose tampering this rank had seen already
            # is a call made again: it starts again in the new tree, as everywhere
            if op.epoch is not None and op.interrupted is None and op.epoch != self.reports.failed_epoch:
                event, code = OperationEvent.LOST, ErrorCode.VERIFICATION_FAILED
                out += self._finish_failed(op, event, code, why, None, tell_tree=False)
        return out

    def interrupt_all(self, why: str) -> None:
        for op in list(self._ops.values()):
            self._interrupt(op, why)

    def _interrupt(self, op: WireOperation, why: str, aborted_in: int | None = None) -> None:
        """The tree ``op`` ran in failed: forget its progress and wait for the next tree,
        where it starts again from this rank's own input (new epoch, new chunk ids: no
        integer of the old tree is counted or accepted again).  Its deadline stands.
        Interrupted by an Abort of epoch ``aborted_in``, it starts again only in a newer
        epoch: that epoch's aggregators aborted it and drop its chunks.

        A block-scaled operation also runs its scale pass again, so that every rank
        agrees on its scales in the same tree, whatever it had received before."""
        if op.interrupted is not None:
            return
        op.interrupted = why
        op.aborted_in = aborted_in
        self._apply(op, OperationEvent.RESTART)
        if isinstance(op, DataOperation) and op.scaling is not None and op.scaling.agreed is not None:
            op.agree(None)
            agreement = ScalePass.of(op.op_id - 1, op)
            if op.listed is not None:
                agreement.decide(op.listed, op.presence)
            self._again(agreement, why, aborted_in)
        presence = op.presence
        if (
            presence is not None
            and presence.op_id not in self._ops
            and self._membership.rank in (op.listed or ())
        ):
            # A rank that lost the decision with the tree starts its presence pass again:
            # this rank, a member of the decided set, takes part again, so that the
            # new pass decides the same members (the decision itself is kept here).
            assert isinstance(presence, PresencePass)
            data = op if isinstance(op, DataOperation) else presence.data
            again = PresencePass.of(presence.op_id, data, presence.quorum, presence.members)
            self._again(again, why, aborted_in)

    def _again(self, wire_pass: WireOperation, why: str, aborted_in: int | None) -> None:
        """A pass this rank had completed, to run again in the next tree, in call order."""
        wire_pass.interrupted = why
        wire_pass.aborted_in = aborted_in
        self._ops[wire_pass.op_id] = wire_pass
        self._ops = OrderedDict(sorted(self._ops.items()))  # call order, for the window

    def resume_all(self) -> None:
        """A tree is ready: interrupted operations start again (in the current epoch),
        except those an Abort of this epoch interrupted."""
        epoch = self._membership.epoch
        for op in self._ops.values():
            if op.interrupted is not None and (op.aborted_in is None or op.aborted_in < epoch):
                op.interrupted = None
                op.aborted_in = None
                if op.source is None:
                    self._apply(op, OperationEvent.ALL_SENT)  # a broadcast receiver only waits

    def on_timer(self, now: float) -> list[Command]:
        out: list[Command] = []
        for op in list(self._ops.values()):
            # A result overdue by half the timeout may have been lost with a connection:
            # ask again by sending the chunk again (an aggregator answers a copy of a
            # completed chunk with its Result), and again every half timeout after.
            overdue = {i for i, sent in op.outstanding.items() if sent + op.timeout / 2 <= now}
            if overdue and not self.reports.holding:
                out += self._resend(op, overdue, now)
        for op in [op for op in self._ops.values() if _call(op).deadline <= now]:
            detail = f"no verified result for chunks {op.missing_chunks()} after {op.timeout:g}s"
            if op.interrupted is not None:
                detail += f" (waiting for a new tree since: {op.interrupted})"
            elif self.reports.holding:
                epoch = self._membership.epoch
                detail += f" (held back: data of the tree of epoch {epoch} failed verification)"
                self.reports.release()  # no new epoch came: the tree is all there is
            out += self._finish_failed(
                op, OperationEvent.DEADLINE, ErrorCode.TIMEOUT, detail, None, tell_tree=True
            )
        return out

    def _apply(self, op: WireOperation, event: OperationEvent) -> None:
        """Move ``op`` along the operation table and do what the move says."""
        move = OPERATION_TABLE.fire(op.state, event)
        op.state = move.target
        action = move.action
        if action is OperationAction.KEEP:  # first: most moves are a chunk's
            return
        self.outstanding -= len(op.outstanding)
        if action is OperationAction.RELEASE:
            del self._ops[op.op_id]
            op.outstanding.clear()
        else:
            op.forget_progress()


def _call(op: WireOperation) -> DataOperation:
    """The data operation of ``op``'s call: ``op`` itself, or the one its pass serves."""
    if isinstance(op, ScalePass | PresencePass):
        return op.data
    assert isinstance(op, DataOperation)
    return op
