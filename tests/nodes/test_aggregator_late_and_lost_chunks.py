"""What an aggregator does when chunks are late or lost: it asks silent children again,
aborts what does not complete in time naming the missing ranks, spreads Aborts
once, and holds early data for a while.
"""

from __future__ import annotations

import pytest
from aggregator_rig import (
    ADDRESS,
    GROUP,
    OTHER,
    Rig,
    assignment,
    chunk,
    errors,
    leaf_rig,
    root_rig,
    sent,
)

from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
from cco.nodes.aggregator_states import SlotState
from cco.nodes.events import (
    PeerConnected,
    SendMessage,
)
from cco.wire.errors import ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import (
    Abort,
    BroadcastData,
    ChunkAck,
    PartialAggregate,
    RetransmitRequest,
)
from cco.wire.registries import Collective, Role


def test_slot_timeout_aborts_down_and_up_naming_missing_ranks() -> None:
    rig, parent = leaf_rig()
    rig.now = 0.5
    rig.send("ep0", chunk(0))
    assert rig.machine.next_deadline() == pytest.approx(1.0)  # half the timeout: ask again first
    (request,) = sent(rig.timer(1.0), "ep1", RetransmitRequest)
    assert request.chunks == (0,) and request.missing == bitmap_from_ranks([1])
    assert rig.machine.next_deadline() == pytest.approx(1.5)
    out = rig.timer(1.5)
    for peer in ("ep0", "ep1", parent):
        (abort,) = sent(out, peer, Abort)
        assert abort.code is ErrorCode.TIMEOUT and abort.op_id == 0
        assert abort.missing is not None and ranks_from_bitmap(abort.missing) == {1}
        assert "missing ranks {1}" in abort.detail
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.ABORTED
    assert rig.machine.slot_bytes == 0
    assert rig.send("ep1", chunk(1)) == []  # late: dropped, no slot reopened
    assert rig.machine.open_slots(GROUP) == 0


def test_parent_asking_again_rebuilds_the_identical_partial() -> None:
    rig, parent = leaf_rig()
    rig.send("ep0", chunk(0))
    (first,) = sent(rig.send("ep1", chunk(1)), parent, PartialAggregate)
    request = RetransmitRequest(group_id=GROUP, epoch=1, op_id=0, chunks=(0, 3))
    out = rig.send(parent, request)  # chunk 3 is unknown here: nothing to ask for it
    assert {c.peer: c.message for c in out if isinstance(c, SendMessage)} == {
        "ep0": RetransmitRequest(group_id=GROUP, epoch=1, op_id=0, chunks=(0,), missing=b"\x01"),
        "ep1": RetransmitRequest(group_id=GROUP, epoch=1, op_id=0, chunks=(0,), missing=b"\x02"),
    }
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.COLLECTING
    rig.send("ep1", chunk(1))
    assert sent(rig.send("ep0", chunk(0)), parent, PartialAggregate) == [first]
    assert errors(rig.send("ep0", RetransmitRequest(group_id=GROUP, epoch=1, op_id=0, chunks=(0,)))) == [
        ErrorCode.PROTOCOL_VIOLATION  # only a parent asks again
    ]
    assert rig.send("ep0", ChunkAck(group_id=GROUP, epoch=1, op_id=0, chunks=(0,))) == []


def test_a_silent_aggregator_child_gets_time_to_name_its_own_missing_ranks() -> None:
    rig = Rig()
    rig.register()
    rig.connect("ep0")
    rig.connect("leaf", role=Role.AGGREGATOR)
    rig.rendezvous(assignment({"ep0": [0], "leaf": [1, 2, 3]}))
    rig.send("ep0", chunk(0))
    assert [m for m in sent(rig.timer(1.0), None, Abort)] == []  # waits half a timeout more
    assert rig.machine.next_deadline() == pytest.approx(1.5)
    report = Abort(
        group_id=GROUP,
        epoch=1,
        op_id=0,
        code=ErrorCode.TIMEOUT,
        detail="leaf",
        missing=bitmap_from_ranks([2]),
    )
    (forwarded,) = sent(rig.send("leaf", report), "ep0", Abort)
    assert forwarded.missing == bitmap_from_ranks([2])  # the leaf's precise answer reaches everyone
    assert rig.timer(1.5) == []


def test_data_for_a_child_not_yet_connected_waits_for_its_connection() -> None:
    rig = Rig()
    rig.register()
    rig.connect("ep1")
    rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}))
    data = chunk(1, cls=BroadcastData, kind=Collective.BROADCAST, root=1)
    assert sent(rig.send("ep1", data), "ep1") == [data]
    assert rig.machine.pending_bytes == len(data.payload)
    out = rig.feed(PeerConnected("ep0", "ep0", Role.ENDPOINT))
    assert out == [SendMessage("ep0", data)] and rig.machine.pending_bytes == 0


def test_abort_from_a_child_spreads_once() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0))
    abort = Abort(
        group_id=GROUP,
        epoch=1,
        op_id=0,
        code=ErrorCode.TIMEOUT,
        detail="gave up",
        missing=bitmap_from_ranks([1, 2]),
    )
    out = rig.send("ep1", abort)
    assert {c.peer for c in out if isinstance(c, SendMessage)} == {"ep0", "ep2"}
    (forwarded,) = sent(out, "ep0", Abort)
    assert forwarded.missing == bitmap_from_ranks([1])  # a child speaks for its own ranks only
    assert rig.send("ep2", abort) == []


def test_early_data_waits_for_assignment_then_times_out_as_unknown_group() -> None:
    rig = Rig()
    rig.register()
    rig.connect("ep0", "ep1")
    assert rig.send("ep0", chunk(0)) == []
    out = rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}))
    assert out == [] and rig.machine.slot_state(GROUP, 0, 0) is SlotState.COLLECTING
    assert rig.send("ep1", chunk(0, group=OTHER)) == []
    assert rig.send("ep1", chunk(0, group=OTHER, index=1)) == []
    expired = rig.timer(2.0)
    (abort,) = [m for m in sent(expired, "ep1", Abort) if m.group_id == OTHER]  # one per operation
    assert abort.code is ErrorCode.UNKNOWN_GROUP and abort.group_id == OTHER
    assert rig.machine.pending_bytes == 0


def test_pending_queue_is_bounded_per_peer() -> None:
    rig = Rig(AggregatorMachine(AggregatorConfig(address=ADDRESS, pending_limit=2)))
    rig.register()
    rig.connect("ep0", "ep1")
    rig.send("ep0", chunk(0, index=0))
    rig.send("ep0", chunk(0, index=1))
    assert errors(rig.send("ep0", chunk(0, op_id=1))) == [ErrorCode.RESOURCE_EXHAUSTED]
    assert rig.send("ep1", chunk(1)) == []  # another peer's queue is its own


def test_parked_data_expires_oldest_first_after_pending_timeout_not_before() -> None:
    rig = Rig()  # pending_timeout 2 s
    rig.register()
    rig.connect("ep0")
    rig.send("ep0", chunk(0, group=OTHER, op_id=0))  # no assignment for OTHER: parked at 0.0
    rig.now = 1.5
    rig.send("ep0", chunk(0, group=OTHER, op_id=1))  # parked at 1.5
    assert sent(rig.timer(1.9), None, Abort) == []
    assert [a.op_id for a in sent(rig.timer(2.0), "ep0", Abort)] == [0]
    assert rig.machine.pending_bytes > 0
    assert [a.op_id for a in sent(rig.timer(3.5), "ep0", Abort)] == [1]
    assert rig.machine.pending_bytes == 0


def test_data_held_for_a_child_that_never_connects_is_dropped_after_pending_timeout() -> None:
    rig = Rig()  # pending_timeout 2 s
    rig.register()
    rig.connect("ep1")
    rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}))
    first = chunk(1, cls=BroadcastData, kind=Collective.BROADCAST, root=1, op_id=0)
    second = chunk(1, cls=BroadcastData, kind=Collective.BROADCAST, root=1, op_id=1)
    rig.send("ep1", first)  # held for ep0 at 0.0
    rig.now = 1.5
    rig.send("ep1", second)  # held for ep0 at 1.5
    rig.timer(1.9)
    assert rig.machine.pending_bytes == len(first.payload) + len(second.payload)
    rig.timer(2.0)
    assert rig.machine.pending_bytes == len(second.payload), "the older one is dropped first"
    rig.timer(3.5)
    assert rig.machine.pending_bytes == 0
    assert rig.feed(PeerConnected("ep0", "ep0", Role.ENDPOINT)) == [], "nothing stale is delivered"
