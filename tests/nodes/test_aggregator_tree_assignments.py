"""An aggregator's place in each group's tree: which assignments it takes, what a new
epoch or a lost parent does to what is in flight.
"""

from __future__ import annotations

import pytest
from aggregator_rig import (
    ADDRESS,
    GROUP,
    OTHER,
    PARAMS,
    PARENT,
    PARENT2,
    Rig,
    assignment,
    chunk,
    errors,
    leaf_rig,
    ref,
    root_rig,
    sent,
)

from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
from cco.nodes.aggregator_states import GroupState, SlotState
from cco.nodes.events import (
    ClosePeer,
    ConnectTo,
    PeerConnected,
    PeerDisconnected,
)
from cco.wire.errors import ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import (
    Abort,
    EpochChange,
    Error,
    NodeRef,
    PartialAggregate,
    Result,
    TreeAssignment,
)
from cco.wire.payload import retype
from cco.wire.registries import Role


def test_tree_assignment_before_registration_is_a_protocol_violation() -> None:
    rig = Rig()
    rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    assert errors(rig.rendezvous(assignment({"ep0": [0]}))) == [ErrorCode.PROTOCOL_VIOLATION]
    assert rig.machine.group_state(GROUP) is GroupState.UNKNOWN


def test_inconsistent_assignment_is_refused() -> None:
    rig = Rig()
    rig.register()
    bad = TreeAssignment(
        group_id=GROUP,
        epoch=1,
        world_size=4,
        expected=bitmap_from_ranks([0, 1, 2]),
        children=(ref("ep0", [0, 1]), ref("ep1", [1])),
        params=PARAMS,
    )
    assert errors(rig.rendezvous(bad)) == [ErrorCode.INVALID_FIELD]
    small = Rig(AggregatorMachine(AggregatorConfig(address=ADDRESS, capacity=1)))
    small.register()
    small.rendezvous(assignment({"ep0": [0]}))
    assert errors(small.rendezvous(assignment({"ep0": [0]}, group=OTHER))) == [ErrorCode.RESOURCE_EXHAUSTED]


def test_assignment_with_more_children_than_max_fan_in_is_refused() -> None:
    """The aggregator's own max_fan_in caps its children, whatever the rendezvous says."""
    rig = Rig(AggregatorMachine(AggregatorConfig(address=ADDRESS, max_fan_in=2)))
    rig.register()
    rig.connect("ep0", "ep1", "ep2")
    out = rig.rendezvous(assignment({"ep0": [0], "ep1": [1], "ep2": [2]}))
    (error,) = sent(out, "rv", Error)
    assert error.code is ErrorCode.RESOURCE_EXHAUSTED and "max_fan_in" in error.detail
    assert rig.machine.group_state(GROUP) is GroupState.UNKNOWN
    # Exactly max_fan_in children is within the bound.
    assert errors(rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}))) == []
    assert rig.machine.group_state(GROUP) is GroupState.ACTIVE


def test_assignment_for_an_older_epoch_is_stale() -> None:
    rig = root_rig()
    rig.rendezvous(assignment({"ep0": [0], "ep1": [1], "ep2": [2]}, epoch=3))
    assert errors(rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}, epoch=2))) == [ErrorCode.STALE_EPOCH]
    assert rig.machine.group_epoch(GROUP) == 3
    assert errors(rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}, epoch=3))) == []  # same epoch: fine


@pytest.mark.parametrize(
    ("children", "expected"),
    [
        ({"ep0": [0, 1], "ep1": [1, 2]}, [0, 1, 2]),  # overlapping, though the union is right
        ({"ep0": [0, 1], "ep1": []}, [0, 1]),  # a child with no rank
        ({"ep0": [0], "ep1": [1]}, [0, 1, 2]),  # rank 2 reaches no child
        ({"ep0": [0], "ep1": [1, 2]}, [0, 1]),  # rank 2 is not expected
        ({}, []),  # no child at all
    ],
    ids=["overlap", "empty-child", "missing", "unexpected", "no-children"],
)
def test_children_must_partition_expected(children: dict[str, list[int]], expected: list[int]) -> None:
    rig = Rig()
    rig.register()
    bad = TreeAssignment(
        group_id=GROUP,
        epoch=1,
        world_size=4,
        expected=bitmap_from_ranks(expected),
        children=tuple(ref(n, rs) for n, rs in children.items()),
        params=PARAMS,
    )
    assert errors(rig.rendezvous(bad)) == [ErrorCode.INVALID_FIELD]
    assert rig.machine.group_state(GROUP) is GroupState.UNKNOWN


def test_assignment_for_a_newer_epoch_aborts_what_the_old_epoch_left_open() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0, op_id=0, total=4))
    rig.send("ep1", chunk(1, op_id=0, total=4))
    assert len(sent(rig.send("ep2", chunk(2, op_id=0, total=4)), None, Result)) == 3
    rig.send("ep0", chunk(0, op_id=1, total=4))
    children = {"ep0": [0], "ep1": [1], "ep2": [2]}
    # The same epoch again (e.g. a repeated assignment) keeps everything.
    assert sent(rig.rendezvous(assignment(children)), None, Abort) == []
    assert rig.machine.slot_state(GROUP, 1, 0) is SlotState.COLLECTING
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.COMPLETE
    # A newer epoch, announced by its assignment alone: the open slot is aborted, the
    # old epoch's records are forgotten.
    out = rig.rendezvous(assignment(children, epoch=2))
    aborts = sent(out, None, Abort)
    assert {a.code for a in aborts} == {ErrorCode.STALE_EPOCH} and {a.op_id for a in aborts} == {1}
    assert rig.machine.open_slots(GROUP) == 0
    assert rig.machine.slot_state(GROUP, 0, 0) is None and rig.machine.slot_state(GROUP, 1, 0) is None


def test_epoch_change_aborts_old_slots_and_refuses_old_data() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0))
    out = rig.rendezvous(
        EpochChange(group_id=GROUP, epoch=2, members=bitmap_from_ranks([0, 1]), code=ErrorCode.PEER_LOST)
    )
    (abort,) = sent(out, "ep0", Abort)
    assert abort.code is ErrorCode.PEER_LOST and abort.missing == bitmap_from_ranks([2])
    assert rig.machine.group_state(GROUP) is GroupState.STALE and rig.machine.open_slots(GROUP) == 0
    (stale,) = sent(rig.send("ep1", chunk(1)), "ep1", Abort)
    assert stale.code is ErrorCode.STALE_EPOCH
    assert rig.send("ep0", chunk(0, epoch=2)) == []  # the new epoch's data waits for its tree
    assert rig.machine.pending_bytes > 0
    rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}, epoch=2))
    assert rig.machine.group_state(GROUP) is GroupState.ACTIVE and rig.machine.pending_bytes == 0
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.COLLECTING
    assert len(sent(rig.send("ep1", chunk(1, epoch=2)), None, Result)) == 2


@pytest.mark.parametrize("new_parent", [PARENT, PARENT2], ids=["same-parent", "another-parent"])
def test_results_the_old_tree_owes_still_go_down_after_a_leave(new_parent: NodeRef) -> None:
    """This leaf sent its aggregate up; rank 7, elsewhere in the tree, left on purpose
    right after its last collective, and the EpochChange arrives before the root's
    Result.  The Result still goes down to this leaf's children, also once the new tree
    names another parent: the old parent's connection stays open for one operation
    timeout after the change, and closes then."""
    rig, parent = leaf_rig()
    rig.send("ep0", chunk(0))
    (partial,) = sent(rig.send("ep1", chunk(1)), parent, PartialAggregate)
    rig.rendezvous(
        EpochChange(group_id=GROUP, epoch=2, members=bitmap_from_ranks(range(7)), code=ErrorCode.NO_ERROR)
    )
    out = rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}, parent=new_parent, epoch=2))
    assert not [c for c in out if isinstance(c, ClosePeer)]
    result = retype(partial, Result)
    out = rig.send(parent, result)
    assert sent(out, "ep0", Result) == [result] and sent(out, "ep1", Result) == [result]
    closed = [c.peer for c in rig.timer(PARAMS.operation_timeout_ms / 1000) if isinstance(c, ClosePeer)]
    assert closed == ([] if new_parent is PARENT else [parent])  # the same parent: the new tree's link


def test_after_a_loss_the_old_tree_owes_nothing() -> None:
    rig, parent = leaf_rig()
    rig.send("ep0", chunk(0))
    (partial,) = sent(rig.send("ep1", chunk(1)), parent, PartialAggregate)
    rig.rendezvous(
        EpochChange(group_id=GROUP, epoch=2, members=bitmap_from_ranks(range(7)), code=ErrorCode.PEER_LOST)
    )
    assert rig.send(parent, retype(partial, Result)) == []  # its operations failed everywhere


def test_parent_loss_aborts_and_redials() -> None:
    rig, parent = leaf_rig()
    rig.send("ep0", chunk(0))
    out = rig.feed(PeerDisconnected(parent, ErrorCode.PEER_LOST))
    assert [m.code for m in sent(out, "ep0", Abort)] == [ErrorCode.PEER_LOST]
    assert rig.machine.group_state(GROUP) is GroupState.CONNECTING
    redial = [c for c in rig.timer(1.0) if isinstance(c, ConnectTo)]
    assert len(redial) == 1 and redial[0].expected_node_id == "root"
    rig.feed(PeerConnected(redial[0].peer, "root", Role.AGGREGATOR))
    assert rig.machine.group_state(GROUP) is GroupState.ACTIVE
