"""The parts an endpoint and an aggregator share: the loss rule and heartbeats of a
control connection, the session with the rendezvous, and the link to a parent."""

from __future__ import annotations

import pytest

from cco.nodes.events import ClosePeer, ConnectTo, SendMessage
from cco.nodes.liveness import Liveness
from cco.nodes.parent import Dials, ParentLink
from cco.nodes.session import RendezvousSession, Tick
from cco.wire.errors import ErrorCode
from cco.wire.messages import LOSS_INTERVALS, Address, Heartbeat, JoinRequest, NodeRef


def test_a_peer_silent_for_loss_intervals_is_lost_and_not_a_moment_before() -> None:
    liveness = Liveness.starting(0.5, now=10.0)
    assert liveness.lost_at() == 10.0 + LOSS_INTERVALS * 0.5
    assert not liveness.lost(liveness.lost_at() - 1e-9) and liveness.lost(liveness.lost_at())
    liveness.heard(11.0)
    assert liveness.lost_at() == 11.0 + LOSS_INTERVALS * 0.5
    assert liveness.lost_at(window=6.0) == 17.0  # a longer window asked for


def test_a_liveness_window_apart_from_the_interval_keeps_a_silent_peer_that_long() -> None:
    liveness = Liveness.starting(0.5, now=10.0, window=15.0)
    assert liveness.deadline() == 10.5  # heartbeats still every interval
    assert not liveness.lost(24.999) and liveness.lost(25.0)


def test_heartbeats_are_due_every_interval_and_the_deadline_is_the_earlier_of_beat_and_loss() -> None:
    liveness = Liveness.starting(1.0, now=0.0)
    assert liveness.deadline() == 1.0
    assert not liveness.beat_due(0.5)
    assert liveness.beat_due(1.2) and liveness.next_heartbeat == pytest.approx(2.2)
    assert not liveness.beat_due(1.3)
    assert liveness.deadline(window=0.3) == pytest.approx(0.3)  # the loss comes first


def test_a_session_heartbeats_only_once_accepted_and_reports_the_loss() -> None:
    session = RendezvousSession()
    greeting = JoinRequest(group_id=bytes(16), world_size=2, credential=b"pw", labels=())
    assert session.greet("rv", greeting) == SendMessage("rv", greeting)
    assert session.tick(100.0) is Tick.QUIET and session.deadline() is None  # not accepted yet
    session.accept(1.0, now=0.0)
    assert session.tick(0.5) is Tick.QUIET
    assert session.tick(1.0) is Tick.BEAT
    assert [session.heartbeat().message, session.heartbeat().message] == [Heartbeat(seq=1), Heartbeat(seq=2)]
    session.heard(2.0)
    assert session.tick(2.0 + LOSS_INTERVALS) is Tick.LOST
    session.greet("rv2", greeting)
    session.accept(1.0, now=10.0, window=15.0)
    assert session.tick(24.9) is not Tick.LOST and session.tick(25.0) is Tick.LOST
    assert session.silence() == "no message from the rendezvous for 15 s (the liveness window)"


def test_a_detached_session_counts_its_grace_from_the_first_loss_until_accepted_again() -> None:
    session = RendezvousSession()
    session.greet("rv", JoinRequest(group_id=bytes(16), world_size=2, credential=b"pw", labels=()))
    session.accept(1.0, now=0.0)
    assert session.close(ErrorCode.PEER_LOST, "silent") == [ClosePeer("rv", ErrorCode.PEER_LOST, "silent")]
    session.detach(now=5.0)
    session.detach(now=7.0)  # lost again while detached: the grace still runs from 5
    assert session.peer is None and session.detached_at == 5.0
    assert not session.grace_over(64.9, grace=60.0) and session.grace_over(65.0, grace=60.0)
    session.greet("rv2", JoinRequest(group_id=bytes(16), world_size=2, credential=b"pw", labels=()))
    session.accept(1.0, now=8.0)
    assert session.detached_at is None and not session.grace_over(1e9, grace=60.0)


def test_a_parent_link_dials_redials_after_a_pause_and_closes() -> None:
    parent = NodeRef(node_id="agg-1", address=Address(host="agg.test", port=4433), ranks=b"\x03")
    dials = Dials()
    link = ParentLink()
    first = dials.peer("g", 1)
    assert link.dial(first, parent) == ConnectTo(first, parent.address, "agg-1")
    assert not link.reaches("agg-1")
    link.connected()
    assert link.reaches("agg-1") and not link.reaches("agg-2")
    link.lost(now=3.0, retry_interval=1.0)
    assert not link.up and not link.retry_due(3.5) and link.retry_due(4.0) and not link.retry_due(4.0)
    link.lost(now=5.0, retry_interval=None)  # no redial: the next tree names the next parent
    assert link.retry_at is None
    second = dials.peer("g", 1)
    assert second != first and link.dial(second, parent).peer == second
    assert link.close("bye") == [ClosePeer(second, ErrorCode.NO_ERROR, "bye")]
    assert link.peer is None and link.close("again") == []
