"""An endpoint session's life: joining, its link to the rendezvous (heartbeats, loss,
resumption), its parent, epoch changes, leaving, and what it refuses from its peers.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from endpoint_rig import (
    GROUP,
    KEYS,
    PARAMS,
    PARENT,
    PARENT2,
    RANK,
    SECRET,
    WORLD,
    Rig,
    accept,
    failures,
    int_header,
    int_request,
    joined,
    others,
    result_for,
    sent,
    tree,
)

from cco.nodes.calls import CollectiveRequest, EndpointConfig
from cco.nodes.endpoint import EndpointMachine
from cco.nodes.endpoint_states import (
    LinkState,
    OperationState,
    SessionState,
)
from cco.nodes.events import (
    ClosePeer,
    Command,
    ConnectTo,
    Joined,
    JoinFailed,
    MessageMalformed,
    MessageReceived,
    OperationCompleted,
    PeerConnected,
    PeerDisconnected,
)
from cco.wire import payload
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import (
    Abort,
    Contribution,
    EpochChange,
    Error,
    GroupParams,
    Heartbeat,
    JoinAccept,
    JoinReject,
    JoinRequest,
    Leave,
    Message,
    Result,
)
from cco.wire.registries import Collective, ReduceOp, Role


def test_join_flow() -> None:
    rig = Rig()
    out = rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    assert sent(out, "rv") == [
        JoinRequest(group_id=GROUP, world_size=WORLD, credential=b"pw", rank=RANK, labels=("rack1",))
    ]
    assert rig.rendezvous(accept()) == [] and rig.machine.state is SessionState.ACCEPTED
    out = rig.rendezvous(tree())
    (dial,) = out
    assert isinstance(dial, ConnectTo) and dial.expected_node_id == "leaf" and dial.address == PARENT.address
    assert rig.machine.state is SessionState.CONNECTING
    out = rig.feed(PeerConnected(dial.peer, "leaf", Role.AGGREGATOR))
    assert out == [Joined(GROUP, RANK, WORLD, 1)]
    assert rig.machine.state is SessionState.READY and rig.machine.rank == RANK
    assert rig.machine.members == frozenset(range(WORLD))


def test_join_reject_ends_the_session() -> None:
    rig = Rig()
    rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    out = rig.rendezvous(JoinReject(group_id=GROUP, code=ErrorCode.BAD_CREDENTIAL, detail="no"))
    assert next(c for c in out if isinstance(c, ClosePeer)).code is ErrorCode.BAD_CREDENTIAL
    assert rig.machine.state is SessionState.REJECTED
    with pytest.raises(CcoError) as info:
        rig.start(int_request([1]))
    assert info.value.code is ErrorCode.PROTOCOL_VIOLATION


def test_join_into_a_running_group_waits_for_the_next_epoch() -> None:
    rig = Rig()
    rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    rig.rendezvous(accept())
    rig.rendezvous(
        EpochChange(group_id=GROUP, epoch=2, members=bitmap_from_ranks(range(WORLD)), code=ErrorCode.NO_ERROR)
    )
    assert rig.machine.state is SessionState.ACCEPTED and rig.machine.epoch == 2
    assert [e.code for e in sent(rig.rendezvous(tree(epoch=1)), "rv", Error)] == [ErrorCode.STALE_EPOCH]
    (dial,) = rig.rendezvous(tree(epoch=2))
    assert isinstance(dial, ConnectTo)
    assert rig.feed(PeerConnected(dial.peer, "leaf", Role.AGGREGATOR)) == [Joined(GROUP, RANK, WORLD, 2)]


def test_epoch_change_fails_in_flight_operations_naming_lost_ranks() -> None:
    rig = joined()
    op_id, _ = rig.start(int_request([1, 2]))
    change = EpochChange(
        group_id=GROUP, epoch=2, members=bitmap_from_ranks([0, 1, 3]), code=ErrorCode.PEER_LOST
    )
    (error,) = failures(rig.rendezvous(change))
    assert (
        error.code is ErrorCode.PEER_LOST and error.missing_ranks == frozenset({2}) and error.op_id == op_id
    )
    assert rig.machine.state is SessionState.REPLANNING
    assert rig.machine.members == {0, 1, 3} and rig.machine.accepted_members == {0, 1, 2, 3}
    # strict membership: nothing runs over fewer ranks until the application accepts them
    refused, out = rig.start(int_request([4, 4, 4, 4]))
    (error,) = failures(out)
    assert refused == op_id + 1 and error.code is ErrorCode.PEER_LOST and error.missing_ranks == {2}
    assert "ranks {2} left" in str(error) and sent(out) == []
    assert rig.machine.accept_membership() == {0, 1, 3}
    next_op, out = rig.start(int_request([4, 4, 4, 4]))  # queued until the new tree is up
    assert next_op == op_id + 2 and sent(out) == []
    out = rig.rendezvous(tree(epoch=2))  # same parent, still connected
    assert rig.machine.state is SessionState.READY
    (contribution,) = sent(out, rig.parent, Contribution)
    assert contribution.epoch == 2
    three = payload.combine(
        [contribution, *[c for c in others(contribution) if c.contributors != bitmap_from_ranks([2])]], Result
    )
    (completed,) = rig.from_parent(three)
    assert isinstance(completed, OperationCompleted) and completed.result is not None
    assert completed.result.tolist() == [4 + 0 + 3] * 4


def test_a_rank_that_left_on_purpose_does_not_fail_an_operation_this_rank_sent_in_full() -> None:
    """Rank 0 completed its last all-reduce and closed at once: its Leave (NO_ERROR) may
    reach this rank before this rank's copy of the Result.  The operation to which this
    rank sent every chunk still completes from the old epoch's Result; one with chunks
    still held back by the window cannot, and fails naming the rank that left."""
    rig = joined()
    sent_in_full, out = rig.start(int_request([1, 1, 1, 1]))  # one chunk
    (mine,) = sent(out, rig.parent, Contribution)
    held_back, out = rig.start(int_request([2] * 12))  # three chunks; the window of 2 sends one
    assert len(sent(out, rig.parent, Contribution)) == 1
    change = EpochChange(
        group_id=GROUP, epoch=2, members=bitmap_from_ranks([1, 2, 3]), code=ErrorCode.NO_ERROR
    )
    (error,) = failures(rig.rendezvous(change))
    assert error.op_id == held_back and error.code is ErrorCode.PEER_LOST
    assert error.missing_ranks == frozenset({0}) and "ranks {0} left" in str(error)
    (completed,) = [c for c in rig.from_parent(result_for(mine)) if isinstance(c, OperationCompleted)]
    assert completed.op_id == sent_in_full and completed.result is not None
    assert completed.result.tolist() == [0 + 1 + 2 + 3] * 4  # rank 0's contribution counted, exact


def test_a_rank_moved_to_another_parent_keeps_the_old_one_until_its_kept_operation_has_its_result() -> None:
    """Rank 0 left right after its last all-reduce, and the new tree gives this rank
    another parent.  The old parent's connection stays open: the Result it still owes
    completes the kept operation, and only then is that connection closed."""
    rig = joined()
    old = rig.parent
    op_id, out = rig.start(int_request([1, 1, 1, 1]))
    (mine,) = sent(out, old, Contribution)
    change = EpochChange(
        group_id=GROUP, epoch=2, members=bitmap_from_ranks([1, 2, 3]), code=ErrorCode.NO_ERROR
    )
    assert failures(rig.rendezvous(change)) == []
    out = rig.rendezvous(tree(epoch=2, parent=PARENT2))
    (dial,) = out  # no ClosePeer for the old parent
    assert isinstance(dial, ConnectTo) and dial.expected_node_id == "leaf2"
    rig.feed(PeerConnected(dial.peer, "leaf2", Role.AGGREGATOR))
    out = rig.feed(MessageReceived(old, result_for(mine)))
    (completed,) = [c for c in out if isinstance(c, OperationCompleted)]
    assert completed.op_id == op_id and completed.result is not None
    assert completed.result.tolist() == [0 + 1 + 2 + 3] * 4
    assert [c.peer for c in out if isinstance(c, ClosePeer)] == [old]  # delivered: closed now


def test_a_rank_moved_to_another_parent_with_nothing_kept_closes_the_old_one_at_once() -> None:
    rig = joined()
    old = rig.parent
    change = EpochChange(
        group_id=GROUP, epoch=2, members=bitmap_from_ranks([1, 2, 3]), code=ErrorCode.NO_ERROR
    )
    rig.rendezvous(change)
    out = rig.rendezvous(tree(epoch=2, parent=PARENT2))
    assert [c.peer for c in out if isinstance(c, ClosePeer)] == [old]


@pytest.mark.parametrize("code", [ErrorCode.STALE_EPOCH, ErrorCode.PEER_LOST])
def test_an_operation_kept_for_a_rank_that_left_fails_when_the_tree_aborts_it(code: ErrorCode) -> None:
    """The rank that left had not sent: the aggregator aborts the old epoch's operation
    (or refuses this rank's chunk as stale, if the epoch change reached it first).  The
    operation cannot start again without the rank that left, so it fails naming it
    instead of waiting for a tree that will never carry it."""
    rig = joined()
    op_id, out = rig.start(int_request([1, 1, 1, 1]))
    (mine,) = sent(out, rig.parent, Contribution)
    change = EpochChange(
        group_id=GROUP, epoch=2, members=bitmap_from_ranks([1, 2, 3]), code=ErrorCode.NO_ERROR
    )
    assert failures(rig.rendezvous(change)) == []  # kept: rank 0 may have sent its copy
    abort = Abort(group_id=GROUP, epoch=1, op_id=op_id, code=code, detail="epoch 1 is over")
    (error,) = failures(rig.from_parent(abort))
    assert error.op_id == op_id and error.code is ErrorCode.PEER_LOST
    assert error.missing_ranks == frozenset({0}) and "ranks {0} left" in str(error)
    assert mine.epoch == 1


def test_a_rank_that_was_lost_fails_even_an_operation_sent_in_full() -> None:
    """PEER_LOST is no promise that the lost rank contributed: everything in flight fails."""
    rig = joined()
    op_id, _ = rig.start(int_request([1, 1, 1, 1]))
    change = EpochChange(
        group_id=GROUP, epoch=2, members=bitmap_from_ranks([1, 2, 3]), code=ErrorCode.PEER_LOST
    )
    (error,) = failures(rig.rendezvous(change))
    assert error.op_id == op_id and error.missing_ranks == frozenset({0})


def test_elastic_sessions_accept_the_new_membership_at_the_epoch_change() -> None:
    rig = Rig(
        machine=EndpointMachine(
            EndpointConfig(group_id=GROUP, world_size=WORLD, credential=b"pw", rank=RANK, elastic=True)
        )
    )
    rig.join()
    rig.start(int_request([1, 2]))
    change = EpochChange(
        group_id=GROUP, epoch=2, members=bitmap_from_ranks([0, 1, 3]), code=ErrorCode.PEER_LOST
    )
    (error,) = failures(rig.rendezvous(change))  # the operation in flight still fails: the news
    assert error.code is ErrorCode.PEER_LOST and error.missing_ranks == frozenset({2})
    assert rig.machine.accepted_members == {0, 1, 3}
    rig.rendezvous(tree(epoch=2))
    _, out = rig.start(int_request([6, 6, 6, 6], op=ReduceOp.AVG))
    (contribution,) = sent(out, rig.parent, Contribution)
    three = payload.combine(
        [contribution, *[c for c in others(contribution) if c.contributors != bitmap_from_ranks([2])]], Result
    )
    (completed,) = rig.from_parent(three)
    assert isinstance(completed, OperationCompleted) and completed.result is not None
    assert completed.result.tolist() == [(6 + 0 + 3) // 3] * 4  # AVG over the three members
    with pytest.raises(CcoError) as info:  # slices of a shrunken group are not defined
        rig.start(CollectiveRequest(kind=Collective.ALL_GATHER, array=np.zeros(2, np.int32)))
    assert info.value.code is ErrorCode.UNSUPPORTED_FEATURE


def test_parent_loss_redials_and_starts_operations_again() -> None:
    """A lost parent interrupts the operations in flight; once the parent is back they
    start again from this rank's input (same epoch, so identical chunks: idempotent
    for an aggregator that kept its slots) and complete."""
    rig = joined()
    op_id, out = rig.start(int_request([1, 2, 3, 4, 5]))
    first = sent(out, rig.parent, Contribution)
    assert rig.parent is not None and len(first) == 2
    out = rig.feed(PeerDisconnected(rig.parent, ErrorCode.PEER_LOST))
    assert failures(out) == [] and rig.machine.state is SessionState.RECONNECTING
    assert rig.machine.outstanding == 0 and rig.machine.operation_state(op_id) is OperationState.QUEUED
    redial = [c for c in rig.timer(1.0) if isinstance(c, ConnectTo)]
    assert len(redial) == 1 and redial[0].expected_node_id == "leaf"
    out = rig.feed(PeerConnected(redial[0].peer, "leaf", Role.AGGREGATOR))
    assert rig.machine.state is SessionState.READY
    rig.parent = redial[0].peer
    again = sent(out, rig.parent, Contribution)
    assert again == first  # sealing is deterministic: the same bytes
    done: list[Command] = []
    chunks = list(again)
    while chunks:
        out = rig.from_parent(result_for(chunks.pop(0)))
        chunks += sent(out, rig.parent, Contribution)
        done += out
    (completed,) = [c for c in done if isinstance(c, OperationCompleted)]
    assert completed.op_id == op_id and completed.result is not None
    assert completed.result.tolist() == [v + sum(range(WORLD)) - RANK for v in [1, 2, 3, 4, 5]]


def test_a_lost_tree_that_never_comes_back_ends_at_the_deadline_saying_why() -> None:
    rig = joined()
    op_id, _ = rig.start(int_request([1]))
    assert rig.parent is not None
    rig.feed(PeerDisconnected(rig.parent, ErrorCode.PEER_LOST))
    (error,) = failures(rig.timer(rig.now + 1000))  # past the default deadline (timeout + heartbeat)
    assert error.code is ErrorCode.TIMEOUT and error.op_id == op_id
    assert "waiting for a new tree since: connection to parent leaf lost" in str(error)


def test_leave_tells_the_rendezvous_and_fails_what_is_in_flight() -> None:
    rig = joined()
    rig.start(int_request([1]))
    out = rig.machine.leave(rig.now)
    assert sent(out, "rv") == [Leave(group_id=GROUP, rank=RANK, code=ErrorCode.NO_ERROR)]
    assert {c.peer for c in out if isinstance(c, ClosePeer)} == {"rv", rig.parent}
    assert [e.code for e in failures(out)] == [ErrorCode.ABORTED]
    assert rig.machine.state is SessionState.LEFT and rig.machine.leave(rig.now) == []


def test_heartbeats_and_rendezvous_loss() -> None:
    """A silent rendezvous detaches the session; the operation in flight completes."""
    rig = Rig()
    rig.join(GroupParams(chunk_elements=4, window=2, heartbeat_interval_ms=100, operation_timeout_ms=60_000))
    assert sent(rig.timer(0.1), "rv", Heartbeat)
    rig.rendezvous(Heartbeat(seq=7))
    _, out = rig.start(int_request([1]))
    (mine,) = sent(out, rig.parent, Contribution)
    while rig.machine.link is LinkState.ATTACHED:
        deadline = rig.machine.next_deadline()
        assert deadline is not None
        out = rig.timer(deadline)
    assert rig.now == pytest.approx(0.4) and rig.machine.state is SessionState.READY
    assert (
        ClosePeer("rv", ErrorCode.PEER_LOST, "no message from the rendezvous for 0.3 s (the liveness window)")
        in out
    )
    assert failures(out) == [] and sent(rig.timer(1.0), "rv") == []  # no heartbeats while detached
    (done,) = [c for c in rig.from_parent(result_for(mine)) if isinstance(c, OperationCompleted)]
    assert done.result is not None and done.result.tolist() == [0 + 1 + 2 + 3 - RANK + 1]


def test_the_groups_liveness_window_not_the_heartbeat_interval_bounds_the_rendezvous_silence() -> None:
    """Heartbeats every 100 ms, but a rendezvous silent for 2 s (a stalled process on
    either side) is still attached: the group's liveness_ms is the rule."""
    rig = Rig()
    rig.join(
        GroupParams(
            chunk_elements=4,
            window=2,
            heartbeat_interval_ms=100,
            operation_timeout_ms=60_000,
            liveness_ms=2000,
        )
    )
    beats = 0
    while rig.machine.link is LinkState.ATTACHED:
        deadline = rig.machine.next_deadline()
        assert deadline is not None
        beats += len(sent(rig.timer(deadline), "rv", Heartbeat))
    assert rig.now == pytest.approx(2.0) and beats >= 19


def _detached(grace: float = 5.0) -> Rig:
    config = EndpointConfig(
        group_id=GROUP, world_size=WORLD, credential=b"pw", rank=RANK, rendezvous_grace=grace
    )
    rig = Rig(machine=EndpointMachine(config))
    rig.join()
    rig.feed(PeerDisconnected("rv", ErrorCode.PEER_LOST))
    assert rig.machine.link is LinkState.DETACHED and rig.machine.state is SessionState.READY
    return rig


def test_a_rendezvous_not_back_within_the_grace_closes_the_session() -> None:
    rig = _detached(grace=5.0)
    rig.start(int_request([1]))
    assert rig.machine.next_deadline() == pytest.approx(5.0)
    out = rig.timer(5.0)
    assert rig.machine.state is SessionState.CLOSED
    (error,) = failures(out)
    assert error.code is ErrorCode.PEER_LOST and "not back within 5s" in str(error)
    assert any(isinstance(c, ClosePeer) and c.peer == rig.parent for c in out)


def test_a_returning_rendezvous_that_kept_the_group_resumes_the_membership() -> None:
    rig = _detached()
    out = rig.feed(PeerConnected("rv2", "rendezvous", Role.RENDEZVOUS))
    (request,) = sent(out, "rv2", JoinRequest)
    assert request.rank == RANK and request.group_id == GROUP and rig.machine.link is LinkState.RESUMING
    _, out = rig.start(int_request([1]))
    (mine,) = sent(out, rig.parent, Contribution)
    assert rig.feed(MessageReceived("rv2", accept())) == []
    assert rig.machine.link is LinkState.ATTACHED and rig.machine.state is SessionState.READY
    beat = rig.now + PARAMS.heartbeat_interval_ms / 1000
    assert sent(rig.timer(beat), "rv2", Heartbeat)  # heartbeats on the new connection
    out = rig.feed(MessageReceived("rv2", tree()))  # the same tree again: a refresh
    assert not [c for c in out if isinstance(c, ClosePeer | ConnectTo)]
    assert [type(c) for c in rig.from_parent(result_for(mine))] == [OperationCompleted]
    assert rig.machine.next_deadline() != pytest.approx(5.0)  # the grace timer is gone


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (dataclasses.replace(accept(), group_secret=b"\x01" * 32), "without this membership"),
        (dataclasses.replace(accept(), rank=(RANK + 1) % WORLD), "without this membership"),
        (dataclasses.replace(accept(), epoch=0), "without this membership"),
        (dataclasses.replace(accept(), epoch=2), "epoch 2 where this rank has 1"),  # messages lost
        (JoinReject(group_id=GROUP, code=ErrorCode.GROUP_FULL, detail="full"), "refused to resume"),
        (Error(code=ErrorCode.UNAUTHORIZED, detail="who?"), "refused to resume"),
    ],
)
def test_a_returning_rendezvous_without_the_membership_closes_the_session(answer: Message, why: str) -> None:
    rig = _detached()
    rig.feed(PeerConnected("rv2", "rendezvous", Role.RENDEZVOUS))
    rig.start(int_request([1]))
    out = rig.feed(MessageReceived("rv2", answer))
    assert rig.machine.state is SessionState.CLOSED
    (error,) = failures(out)
    assert error.code is ErrorCode.PEER_LOST and why in str(error)
    assert any(isinstance(c, ClosePeer) and c.peer == "rv2" for c in out)


def test_a_second_rendezvous_connection_while_attached_is_refused() -> None:
    rig = joined()
    out = rig.feed(PeerConnected("rv2", "rendezvous", Role.RENDEZVOUS))
    assert [c.code for c in out if isinstance(c, ClosePeer)] == [ErrorCode.PROTOCOL_VIOLATION]
    assert rig.machine.link is LinkState.ATTACHED


def test_malformed_bytes_from_the_parent_end_that_connection() -> None:
    rig = joined()
    rig.start(int_request([1]))
    assert rig.parent is not None
    out = rig.feed(MessageMalformed(rig.parent, CcoError(ErrorCode.TRAILING_BYTES, "junk")))
    assert [m.code for m in sent(out, rig.parent, Error)] == [ErrorCode.TRAILING_BYTES]
    assert ClosePeer(rig.parent, ErrorCode.TRAILING_BYTES, "junk") in out
    assert failures(out) == []  # the operation waits for the parent to be dialled again
    assert rig.machine.state is SessionState.RECONNECTING


OTHER_GROUP = bytes.fromhex("ee" * 16)


@pytest.mark.parametrize(
    "message",
    [
        JoinAccept(
            group_id=OTHER_GROUP, rank=RANK, world_size=WORLD, epoch=2, group_secret=SECRET, params=PARAMS
        ),
        JoinReject(group_id=OTHER_GROUP, code=ErrorCode.GROUP_FULL, detail="full"),
        EpochChange(group_id=OTHER_GROUP, epoch=2, members=b"\x0f", code=ErrorCode.NO_ERROR),
    ],
    ids=["JoinAccept", "JoinReject", "EpochChange"],
)
def test_the_rendezvous_speaking_of_another_group_is_refused(message: Message) -> None:
    rig = joined()
    assert [e.code for e in sent(rig.rendezvous(message), "rv", Error)] == [ErrorCode.UNKNOWN_GROUP]
    assert rig.machine.state is SessionState.READY and rig.machine.epoch == 1


def test_a_tree_for_another_group_or_without_a_parent_is_refused() -> None:
    rig = joined()
    other = dataclasses.replace(tree(epoch=2), group_id=OTHER_GROUP)
    assert [e.code for e in sent(rig.rendezvous(other), "rv", Error)] == [ErrorCode.UNKNOWN_GROUP]
    orphan = dataclasses.replace(tree(epoch=2), parent=None)
    (error,) = sent(rig.rendezvous(orphan), "rv", Error)
    assert error.code is ErrorCode.INVALID_FIELD and "an endpoint needs a parent" in error.detail
    assert rig.machine.epoch == 1


def test_an_error_answering_the_join_request_ends_the_session_with_its_code() -> None:
    rig = Rig()
    rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    out = rig.rendezvous(Error(code=ErrorCode.UNAUTHORIZED, detail="ep-1 is already connected"))
    (failed,) = [c for c in out if isinstance(c, JoinFailed)]
    assert (
        failed.code is ErrorCode.UNAUTHORIZED and "join refused: ep-1 is already connected" in failed.detail
    )
    assert next(c for c in out if isinstance(c, ClosePeer)).code is ErrorCode.UNAUTHORIZED
    assert rig.machine.state is SessionState.REJECTED


def test_the_parent_may_send_only_data_traffic() -> None:
    rig = joined()
    (error,) = sent(rig.from_parent(accept()), rig.parent, Error)
    assert (
        error.code is ErrorCode.PROTOCOL_VIOLATION
        and "JoinAccept is not allowed from the parent" in error.detail
    )


def test_a_rendezvous_lost_while_joining_fails_the_join_with_the_reason() -> None:
    rig = Rig()
    rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    out = rig.feed(PeerDisconnected("rv", ErrorCode.PEER_LOST))
    (failed,) = [c for c in out if isinstance(c, JoinFailed)]
    assert failed.code is ErrorCode.PEER_LOST and "rendezvous connection closed" in failed.detail
    assert not [c for c in out if isinstance(c, ClosePeer) and c.peer == "rv"]  # already closed
    assert rig.machine.state is SessionState.CLOSED


def test_a_silent_rendezvous_is_closed_and_a_joined_session_detaches_without_join_failure() -> None:
    rig = Rig()
    rig.join(GroupParams(chunk_elements=4, window=2, heartbeat_interval_ms=100, operation_timeout_ms=1000))
    out = rig.timer(rig.now + 0.31)  # three silent heartbeat intervals
    assert (
        ClosePeer("rv", ErrorCode.PEER_LOST, "no message from the rendezvous for 0.3 s (the liveness window)")
        in out
    )
    assert not [c for c in out if isinstance(c, JoinFailed)]
    assert rig.machine.state is SessionState.READY and rig.machine.link is LinkState.DETACHED


def test_data_from_a_lost_parent_connection_is_refused() -> None:
    rig = joined()
    rig.start(int_request([1]))
    lost = rig.parent
    assert lost is not None
    rig.feed(PeerDisconnected(lost, ErrorCode.PEER_LOST))
    assert rig.machine.state is SessionState.RECONNECTING
    late = result_for(payload.seal(KEYS, int_header(0, 1, 1), RANK, np.ones(1, np.int64)))
    (error,) = sent(rig.feed(MessageReceived(lost, late)), lost, Error)
    assert error.code is ErrorCode.PROTOCOL_VIOLATION
