"""An operation whose tree failed, at an endpoint: what of the old tree it ignores, when
it starts again, how a rank that kept its quorum decision helps the others decide the
same, and what it keeps to complete an operation for a rank that lost its result
(draft sections "Endpoint Processing of Results", "Restart in a New Tree",
"Stragglers and Quorum").
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from endpoint_rig import (
    GROUP,
    KEYS,
    QUORUM,
    RANK,
    WORLD,
    Rig,
    after_the_scale_pass,
    failures,
    int_request,
    joined,
    quorum_results,
    result_for,
    sent,
    tree,
    tree_result,
)

from cco.nodes.calls import CollectiveRequest
from cco.nodes.endpoint_states import OperationState, SessionState
from cco.nodes.events import Command, ConnectTo, OperationCompleted, PeerConnected, PeerDisconnected
from cco.wire import payload
from cco.wire.errors import ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import Abort, Contribution, EpochChange, RetransmitRequest
from cco.wire.registries import Collective, Role

EVERYONE = bitmap_from_ranks(range(WORLD))


def replanned(rig: Rig, epoch: int) -> list[Command]:
    """The same members in a new tree under the same parent: what the rank sends."""
    rig.rendezvous(EpochChange(group_id=GROUP, epoch=epoch, members=EVERYONE, code=ErrorCode.NO_ERROR))
    assert rig.machine.state is SessionState.REPLANNING
    return rig.rendezvous(tree(epoch=epoch))


def reconnected(rig: Rig) -> list[Command]:
    """The connection to the parent breaks and is dialled again: what the rank sends."""
    assert rig.parent is not None
    rig.feed(PeerDisconnected(rig.parent, ErrorCode.PEER_LOST))
    (dial,) = [c for c in rig.timer(rig.now + 1.0) if isinstance(c, ConnectTo)]
    rig.parent = dial.peer
    return rig.feed(PeerConnected(dial.peer, "leaf", Role.AGGREGATOR))


def completed(commands: list[Command]) -> list[OperationCompleted]:
    return [c for c in commands if isinstance(c, OperationCompleted)]


def test_the_old_epochs_results_and_aborts_after_a_restart_are_neither_checked_nor_counted() -> None:
    rig = joined()
    op_id, out = rig.start(int_request([1, 2, 3, 4, 5]))
    old = sent(out, rig.parent, Contribution)
    again = sent(replanned(rig, 2), rig.parent, Contribution)
    assert [(c.epoch, c.chunk_index) for c in again] == [(2, 0), (2, 1)]
    genuine = result_for(old[0])
    forged = dataclasses.replace(genuine, tag=(genuine.tag or 0) ^ 1)  # would fail verification
    abort = Abort(group_id=GROUP, epoch=1, op_id=op_id, code=ErrorCode.VERIFICATION_FAILED, detail="old")
    for message in (genuine, forged, abort):
        assert rig.from_parent(message) == []
    assert rig.machine.operation_state(op_id) is OperationState.AWAITING
    done: list[Command] = []
    while again:
        out = rig.from_parent(result_for(again.pop(0)))
        again += sent(out, rig.parent, Contribution)
        done += out
    (finished,) = completed(done)
    assert finished.result is not None and finished.result.tolist() == [v + 5 for v in [1, 2, 3, 4, 5]]


def test_an_operation_a_tree_abort_interrupted_starts_again_only_in_a_newer_epoch() -> None:
    """The aggregators of the Abort's epoch aborted it and drop its chunks: neither a
    reconnection to the same parent nor the same epoch's assignment starts it again."""
    rig = joined()
    op_id, _ = rig.start(int_request([1, 2, 3]))
    peer_lost = Abort(group_id=GROUP, epoch=1, op_id=op_id, code=ErrorCode.PEER_LOST, detail="parent lost")
    assert rig.from_parent(peer_lost) == []
    assert rig.machine.operation_state(op_id) is OperationState.QUEUED
    assert sent(reconnected(rig), rig.parent, Contribution) == []
    assert sent(rig.rendezvous(tree(epoch=1)), rig.parent, Contribution) == []
    (chunk,) = sent(replanned(rig, 2), rig.parent, Contribution)
    assert (chunk.op_id, chunk.epoch) == (op_id, 2)
    (finished,) = completed(rig.from_parent(result_for(chunk)))
    assert finished.op_id == op_id


def test_an_aborted_operation_that_no_newer_tree_reaches_fails_at_its_deadline_saying_why() -> None:
    rig = joined()
    op_id, _ = rig.start(int_request([1]))
    rig.from_parent(Abort(group_id=GROUP, epoch=1, op_id=op_id, code=ErrorCode.STALE_EPOCH, detail="x"))
    reconnected(rig)
    (error,) = failures(rig.timer(rig.now + 1000))  # past the watchdog
    assert error.code is ErrorCode.TIMEOUT and error.op_id == op_id
    assert "waiting for a new tree since: aborted by the tree" in str(error)


def test_a_rank_that_kept_its_quorum_decision_runs_the_presence_pass_again_in_the_new_tree() -> None:
    """Its presence lets the pass decide the same members for a rank that lost the
    decision with the tree; its data goes on over the members it kept, and the new
    pass, which decides nothing for it, ends with its call."""
    rig = joined()
    op_id, out = rig.start(int_request([5, 6, 7], quorum=QUORUM))
    (presence,) = sent(out, rig.parent, Contribution)
    sent(rig.from_parent(result_for(presence, lambda rank, i: 1)), rig.parent, Contribution)
    presence_again, data = sent(replanned(rig, 2), rig.parent, Contribution)
    assert payload.ChunkHeader.of(presence_again) == dataclasses.replace(
        payload.ChunkHeader.of(presence), epoch=2
    )
    assert (data.op_id, data.epoch, data.members) == (op_id, 2, EVERYONE)
    (finished,) = completed(rig.from_parent(result_for(data)))
    assert finished.contributors == frozenset(range(WORLD))
    assert rig.machine.operation_state(op_id - 1) is None and rig.machine.outstanding == 0
    assert rig.from_parent(result_for(presence_again, lambda rank, i: 1)) == []


def test_a_rank_outside_the_decided_members_does_not_run_the_presence_pass_again() -> None:
    rig = joined()
    op_id, _ = rig.start(int_request([5, 6], quorum=QUORUM))
    decision, _ = quorum_results(op_id - 1, 1, [5, 6], [0, 2])
    assert sent(rig.from_parent(decision), rig.parent, Contribution) == []
    assert sent(replanned(rig, 2), rig.parent, Contribution) == []
    assert rig.machine.operation_state(op_id) is OperationState.AWAITING


def test_only_a_completed_operations_chunks_are_sealed_again_with_every_identifying_field() -> None:
    """A rank that lost a quorum operation's Result with the tree restarts it in the new
    epoch; this rank completed it and seals its kept chunk again, members included.  A
    failed operation's chunks are not kept."""
    rig = joined()
    done, out = rig.start(int_request([5, 6, 7], quorum=QUORUM))
    (presence,) = sent(out, rig.parent, Contribution)
    (data,) = sent(rig.from_parent(result_for(presence, lambda rank, i: 1)), rig.parent, Contribution)
    assert completed(rig.from_parent(result_for(data)))
    failed, out = rig.start(int_request([1, 2]))
    (chunk,) = sent(out, rig.parent, Contribution)
    abort = Abort(group_id=GROUP, epoch=1, op_id=failed, code=ErrorCode.TIMEOUT, detail="slot timed out")
    assert [e.op_id for e in failures(rig.from_parent(abort))] == [failed]
    assert rig.machine.kept_chunks == [(done - 1, 0), (done, 0)]
    replanned(rig, 2)
    ask = RetransmitRequest(group_id=GROUP, epoch=2, op_id=done, chunks=(0,))
    (again,) = sent(rig.from_parent(ask), rig.parent, Contribution)
    assert again == payload.seal(
        KEYS, dataclasses.replace(payload.ChunkHeader.of(data), epoch=2), RANK, np.array([5, 6, 7])
    )
    assert again.members == EVERYONE
    ask_failed = dataclasses.replace(ask, op_id=failed)
    assert chunk.op_id == failed and sent(rig.from_parent(ask_failed), rig.parent) == []


def test_a_block_scaled_chunk_is_sealed_again_byte_for_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    """A completed float SUM's kept chunk goes out again with the payload it first
    had: its fixed-width integers as they are, not widened to int64 and narrowed again."""
    rig = joined()
    data = np.linspace(-3.0, 3.0, 20, dtype=np.float32)  # five chunks of 16-bit integers
    op_id, out = rig.start(CollectiveRequest(kind=Collective.ALL_REDUCE, array=data, width=16))
    others = {r: np.zeros(0) for r in range(WORLD) if r != RANK}
    chunks, first, done = after_the_scale_pass(rig, out), {}, []
    while chunks:
        chunk = chunks.pop(0)
        first[chunk.chunk_index] = chunk
        out = rig.from_parent(tree_result(chunk, others))
        chunks += sent(out, rig.parent, Contribution)
        done += completed(out)
    assert [c.op_id for c in done] == [op_id] and sorted(first) == [0, 1, 2, 3, 4]
    replanned(rig, 2)
    widths: list[np.dtype] = []
    seal = payload.seal

    def noting(*args: object, **kwargs: object) -> object:
        widths.append(np.asarray(args[3]).dtype)
        return seal(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(payload, "seal", noting)
    ask = RetransmitRequest(group_id=GROUP, epoch=2, op_id=op_id, chunks=(3, 4))
    again = sent(rig.from_parent(ask), rig.parent, Contribution)
    assert [c.chunk_index for c in again] == [3, 4] and widths == [np.dtype("<i2")] * 2
    for chunk in again:
        original = first[chunk.chunk_index]
        assert chunk.width == original.width == 2 and chunk.payload == original.payload
        assert payload.ChunkHeader.of(chunk) == dataclasses.replace(payload.ChunkHeader.of(original), epoch=2)
        assert chunk.tag != original.tag  # tagged under the new epoch's chunk id
