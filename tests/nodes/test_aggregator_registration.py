"""An aggregator's standing with the rendezvous: registration, heartbeats, the loss of
the rendezvous, and the grace for which its groups outlive that loss.
"""

from __future__ import annotations

import dataclasses

import pytest
from aggregator_rig import (
    ADDRESS,
    GROUP,
    PARAMS,
    PARENT,
    Rig,
    assignment,
    chunk,
    leaf_rig,
    root_rig,
    sent,
)

from cco.nodes.aggregator_states import GroupState, NodeState
from cco.nodes.events import (
    ClosePeer,
    Command,
    ConnectTo,
    MessageReceived,
    PeerConnected,
    PeerDisconnected,
)
from cco.wire.errors import ErrorCode
from cco.wire.messages import (
    Abort,
    AggregatorAccept,
    AggregatorRegister,
    Error,
    Heartbeat,
    PartialAggregate,
)
from cco.wire.registries import Role


def test_registers_on_rendezvous_connection_and_heartbeats() -> None:
    rig = Rig()
    out = rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    assert sent(out, "rv") == [AggregatorRegister(address=ADDRESS, capacity=64, max_fan_in=64, labels=())]
    assert rig.machine.state is NodeState.REGISTERING
    rig.rendezvous(AggregatorAccept(node_id="agg-7", heartbeat_interval_ms=100))
    assert rig.machine.state is NodeState.REGISTERED and rig.machine.node_id == "agg-7"
    assert rig.machine.next_deadline() == pytest.approx(0.1)
    beats = sent(rig.timer(0.1), "rv", Heartbeat)
    assert len(beats) == 1
    rig.rendezvous(Heartbeat(seq=1))  # the rendezvous is alive at 0.1
    assert sent(rig.timer(0.2), "rv", Heartbeat)
    assert rig.machine.state is NodeState.REGISTERED


def test_silent_rendezvous_is_lost_after_three_intervals() -> None:
    rig = Rig()
    rig.register(heartbeat_ms=100)
    out: list[Command] = []
    while rig.machine.state is NodeState.REGISTERED:
        deadline = rig.machine.next_deadline()
        assert deadline is not None
        out = rig.timer(deadline)
    assert rig.now == pytest.approx(0.3)
    assert [c for c in out if isinstance(c, ClosePeer)] == [
        ClosePeer("rv", ErrorCode.PEER_LOST, "no message from the rendezvous for 0.3 s (the liveness window)")
    ]
    assert rig.machine.state is NodeState.DETACHED
    assert sent(rig.feed(PeerConnected("rv2", "rendezvous", Role.RENDEZVOUS)), "rv2", AggregatorRegister)


def test_an_aggregator_waits_as_long_as_its_groups_liveness_window() -> None:
    """Heartbeats every 100 ms, but a group with a 2 s window: the machine that may
    stall its members that long may stall the aggregator too."""
    rig = Rig()
    rig.register(heartbeat_ms=100)
    rig.connect("ep0", "ep1")
    rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}, params=dataclasses.replace(PARAMS, liveness_ms=2000)))
    start = rig.now
    while rig.machine.state is NodeState.REGISTERED:
        deadline = rig.machine.next_deadline()
        assert deadline is not None
        rig.timer(deadline)
    assert rig.now - start == pytest.approx(2.0)


def test_losing_the_rendezvous_keeps_serving_groups() -> None:
    """The data plane needs no rendezvous: a slot open when it is lost completes."""
    rig, parent = leaf_rig()
    rig.send("ep0", chunk(0))
    out = rig.feed(PeerDisconnected("rv", ErrorCode.PEER_LOST))
    assert sent(out, "ep0", Abort) == [] and not [c for c in out if isinstance(c, ClosePeer)]
    assert rig.machine.state is NodeState.DETACHED and rig.machine.group_state(GROUP) is GroupState.ACTIVE
    out = rig.send("ep1", chunk(1))
    assert len(sent(out, parent, PartialAggregate)) == 1


def test_groups_the_returned_rendezvous_assigns_again_are_kept() -> None:
    rig, _ = leaf_rig()
    rig.feed(PeerDisconnected("rv", ErrorCode.PEER_LOST))
    rig.feed(PeerConnected("rv2", "rendezvous", Role.RENDEZVOUS))
    rig.feed(MessageReceived("rv2", AggregatorAccept(node_id="agg", heartbeat_interval_ms=600_000)))
    out = rig.feed(MessageReceived("rv2", assignment({"ep0": [0], "ep1": [1]}, parent=PARENT)))
    assert not [c for c in out if isinstance(c, ClosePeer | ConnectTo)]  # same tree: a refresh
    out = rig.timer(rig.machine.config.rendezvous_grace + 1)
    assert rig.machine.group_state(GROUP) is GroupState.ACTIVE and out == []


def test_groups_not_assigned_again_within_the_grace_end() -> None:
    rig, parent = leaf_rig()
    rig.feed(PeerDisconnected("rv", ErrorCode.PEER_LOST))
    grace = rig.machine.config.rendezvous_grace
    assert rig.machine.next_deadline() == grace
    rig.timer(grace - 1)
    assert rig.machine.group_state(GROUP) is GroupState.ACTIVE
    rig.now = grace - 0.5
    rig.send("ep0", chunk(0))  # a slot still open when the grace ends
    out = rig.timer(grace)
    assert [m.code for m in sent(out, "ep0", Abort)] == [ErrorCode.PEER_LOST]
    assert ClosePeer(parent, ErrorCode.NO_ERROR, "the group ended here") in out
    assert rig.machine.group_state(GROUP) is GroupState.UNKNOWN
    assert rig.machine.slot_bytes == 0


def test_registration_refused_by_the_rendezvous_detaches_and_says_why() -> None:
    rig = Rig()
    rig.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
    out = rig.rendezvous(Error(code=ErrorCode.UNAUTHORIZED, detail="agg is already connected"))
    assert out == [ClosePeer("rv", ErrorCode.UNAUTHORIZED, "registration refused")]
    assert rig.machine.state is NodeState.DETACHED
    assert rig.machine.refusal is not None and rig.machine.refusal.code is ErrorCode.UNAUTHORIZED
    assert "already connected" in rig.machine.refusal.detail


def test_an_error_report_after_registration_changes_nothing() -> None:
    rig = root_rig()
    assert rig.rendezvous(Error(code=ErrorCode.INVALID_FIELD, detail="a report")) == []
    assert rig.machine.state is NodeState.REGISTERED and rig.machine.refusal is None
    assert rig.machine.group_state(GROUP) is GroupState.ACTIVE


def test_losing_the_rendezvous_connection_does_not_close_it_again() -> None:
    rig = root_rig()
    out = rig.feed(PeerDisconnected("rv", ErrorCode.PEER_LOST))
    assert not [c for c in out if isinstance(c, ClosePeer) and c.peer == "rv"]
