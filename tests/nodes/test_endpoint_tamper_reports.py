"""An endpoint whose parent delivers data that fails verification (draft sections
"Homomorphic Authentication" and "Reports of Tampering"): the operation fails with
VERIFICATION_FAILED, the rendezvous gets one Report naming that parent, no chunk
leaves into the reported tree, and a caller that calls again gets the exact result
from the tree of the next epoch."""

from __future__ import annotations

import dataclasses

import numpy as np
from endpoint_rig import GROUP, PARENT2, RANK, WORLD, failures, int_request, joined, result_for, sent, tree

from cco.nodes.events import ConnectTo, OperationCompleted, PeerConnected, PeerDisconnected
from cco.wire.errors import ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import Abort, ChunkMessage, Contribution, EpochChange, Error, Report
from cco.wire.registries import Role


def _tampered(good: ChunkMessage) -> ChunkMessage:
    return dataclasses.replace(good, payload=bytes([good.payload[0] ^ 1]) + good.payload[1:])


def test_a_tampered_result_is_reported_once_with_the_parent_that_delivered_it() -> None:
    rig = joined()
    op_id, out = rig.start(int_request(list(range(8))))  # two chunks, both sent (window 2)
    first, second = sent(out, rig.parent, Contribution)
    out = rig.from_parent(_tampered(result_for(first)))
    (error,) = failures(out)
    assert error.code is ErrorCode.VERIFICATION_FAILED and error.op_id == op_id
    (report,) = sent(out, "rv", Report)
    assert report == Report(
        group_id=GROUP,
        epoch=1,
        op_id=op_id,
        code=ErrorCode.VERIFICATION_FAILED,
        parent="leaf",
        detail=report.detail,
    )
    assert report.detail.startswith(f"rank {RANK}: chunk 0: ")
    assert sent(out, rig.parent, Abort), "the tree is told too, as before"
    # the operation has ended: its other chunk, tampered or not, reports nothing more
    assert not sent(rig.from_parent(_tampered(result_for(second))), "rv", Report)


def test_calling_again_waits_for_the_next_tree_and_gets_the_exact_result() -> None:
    rig = joined()
    _, out = rig.start(int_request([5, 6, 7, 8]))
    (mine,) = sent(out, rig.parent, Contribution)
    rig.from_parent(_tampered(result_for(mine)))
    old_parent = rig.parent
    op_id, out = rig.start(int_request([5, 6, 7, 8]))
    assert not sent(out), "nothing leaves into the reported tree"
    assert not sent(rig.timer(0.9)), "not even a chunk sent again"
    change = EpochChange(
        group_id=GROUP, epoch=2, members=bitmap_from_ranks(range(WORLD)), code=ErrorCode.VERIFICATION_FAILED
    )
    assert not sent(rig.rendezvous(change))
    dial = rig.rendezvous(tree(epoch=2, parent=PARENT2))
    (connect,) = [c for c in dial if isinstance(c, ConnectTo)]
    assert connect.peer != old_parent and connect.expected_node_id == "leaf2"
    rig.parent = connect.peer
    out = rig.feed(PeerConnected(connect.peer, "leaf2", Role.AGGREGATOR))
    (again,) = sent(out, rig.parent, Contribution)
    assert again.epoch == 2 and again.op_id == op_id
    done = rig.from_parent(result_for(again, lambda rank, i: 10 * rank))
    (completed,) = [c for c in done if isinstance(c, OperationCompleted)]
    assert completed.op_id == op_id and completed.result is not None
    mine_values = np.array([5, 6, 7, 8], dtype=np.int32)
    others = sum(10 * r for r in range(WORLD) if r != RANK)
    assert np.array_equal(completed.result, mine_values + others)


def test_without_the_rendezvous_nothing_is_reported_and_nothing_held_back() -> None:
    rig = joined()
    _, out = rig.start(int_request([1, 2, 3, 4]))
    (mine,) = sent(out, rig.parent, Contribution)
    rig.feed(PeerDisconnected("rv", ErrorCode.PEER_LOST))
    out = rig.from_parent(_tampered(result_for(mine)))
    assert [e.code for e in failures(out)] == [ErrorCode.VERIFICATION_FAILED]
    assert not sent(out, "rv")
    _, out = rig.start(int_request([1]))
    assert len(sent(out, rig.parent, Contribution)) == 1, "no epoch change can be awaited"


def test_a_verification_failure_announced_by_an_abort_is_not_reported_but_awaited() -> None:
    """Only data this rank verified itself is evidence: an Abort is the claim of
    whoever sent it.  But the rank that found it is reporting it, so the next call
    waits for the new tree, where it runs as at that rank; and if no new epoch comes,
    the call fails at its deadline and the tree is used again."""
    rig = joined()
    op_id, out = rig.start(int_request([1, 2, 3, 4]))
    abort = Abort(
        group_id=GROUP, epoch=1, op_id=op_id, code=ErrorCode.VERIFICATION_FAILED, detail="rank 0: ..."
    )
    out = rig.from_parent(abort)
    assert [e.code for e in failures(out)] == [ErrorCode.VERIFICATION_FAILED]
    assert not sent(out, "rv", Report)
    again, out = rig.start(int_request([1]))
    assert not sent(out), "held back"
    change = EpochChange(
        group_id=GROUP, epoch=2, members=bitmap_from_ranks(range(WORLD)), code=ErrorCode.VERIFICATION_FAILED
    )
    assert not failures(rig.rendezvous(change)), "a call made again after the tampering starts again"
    dial = rig.rendezvous(tree(epoch=2, parent=PARENT2))
    (connect,) = [c for c in dial if isinstance(c, ConnectTo)]
    rig.parent = connect.peer
    (chunk,) = sent(rig.feed(PeerConnected(connect.peer, "leaf2", Role.AGGREGATOR)), rig.parent, Contribution)
    assert (chunk.op_id, chunk.epoch) == (again, 2)
    # a claim no Report followed: the held call fails at its deadline, the next leaves
    rig = joined()
    op_id, _ = rig.start(int_request([1, 2, 3, 4]))
    rig.from_parent(dataclasses.replace(abort, op_id=op_id))
    rig.start(int_request([1], timeout=1.0))
    (timeout,) = failures(rig.timer(1.5))
    assert timeout.code is ErrorCode.TIMEOUT and "held back" in str(timeout)
    _, out = rig.start(int_request([2]))
    assert len(sent(out, rig.parent, Contribution)) == 1


def test_another_ranks_report_fails_what_went_through_the_tree_and_restarts_the_rest() -> None:
    """The same operations fail on every rank: here another rank found the tampering,
    and this one learns of it from the epoch change before its own Result came."""
    rig = joined()
    sent_op, out = rig.start(int_request([1, 2, 3, 4, 5, 6, 7, 8]))  # two chunks fill the window
    assert len(sent(out, rig.parent, Contribution)) == 2
    queued_op, out = rig.start(int_request([9]))
    assert not sent(out), "behind a full window"
    change = EpochChange(
        group_id=GROUP, epoch=2, members=bitmap_from_ranks(range(WORLD)), code=ErrorCode.VERIFICATION_FAILED
    )
    out = rig.rendezvous(change)
    (error,) = failures(out)
    assert error.op_id == sent_op and error.code is ErrorCode.VERIFICATION_FAILED
    assert "call again" in str(error)
    assert not sent(out, "rv", Report), "only what this rank checked itself is reported"
    dial = rig.rendezvous(tree(epoch=2, parent=PARENT2))
    (connect,) = [c for c in dial if isinstance(c, ConnectTo)]
    rig.parent = connect.peer
    (again,) = sent(rig.feed(PeerConnected(connect.peer, "leaf2", Role.AGGREGATOR)), rig.parent, Contribution)
    assert (again.op_id, again.epoch) == (queued_op, 2)


def test_a_refused_report_or_a_new_rendezvous_connection_lets_chunks_leave_again() -> None:
    """No new epoch comes from a Report the rendezvous refused, or from one told to a
    connection that is gone: the rank does not wait for one."""
    for ending in ("refused", "reconnected"):
        rig = joined()
        _, out = rig.start(int_request([1, 2, 3, 4]))
        (mine,) = sent(out, rig.parent, Contribution)
        assert len(sent(rig.from_parent(_tampered(result_for(mine))), "rv", Report)) == 1
        _, out = rig.start(int_request([1]))
        assert not sent(out, rig.parent), "held back while the Report may take effect"
        if ending == "refused":
            refusal = Error(code=ErrorCode.STALE_EPOCH, detail="epoch 1 has no tree", message_type=0x18)
            rig.rendezvous(refusal)
        else:
            rig.feed(PeerDisconnected("rv", ErrorCode.PEER_LOST))
        _, out = rig.start(int_request([2]))
        assert [m.op_id for m in sent(out, rig.parent, Contribution)] == [1, 2], ending


def test_a_result_that_is_not_of_its_operation_is_reported_as_a_mismatch() -> None:
    """It includes this rank's own chunk, or should: an honest tree cannot send it."""
    rig = joined()
    op_id, out = rig.start(int_request([1, 2, 3, 4]))
    (mine,) = sent(out, rig.parent, Contribution)
    other = result_for(dataclasses.replace(mine, total_elements=3, payload=mine.payload[:3]))
    out = rig.from_parent(other)
    assert [e.code for e in failures(out)] == [ErrorCode.OPERATION_MISMATCH]
    (report,) = sent(out, "rv", Report)
    assert (report.op_id, report.code, report.parent) == (op_id, ErrorCode.OPERATION_MISMATCH, "leaf")
