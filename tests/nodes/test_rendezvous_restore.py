"""The rendezvous machine across a restart: durable state out, a restored machine in.

Draft section "Rendezvous Persistence and Restart".  A machine's
:meth:`~cco.nodes.rendezvous.RendezvousMachine.durable_state` is handed to
:meth:`~cco.nodes.rendezvous.RendezvousMachine.restored` as a restarted process
would get it from its store; members and aggregators then connect again on new
connections.  The harness of ``test_rendezvous`` checks every batch (key material
never reaches an aggregator, every message encodes, epochs per recipient never go
back, across the restart too), and this one also checks after every input that the
durable state changed only if ``durable_version`` moved.
"""

from __future__ import annotations

import dataclasses

import pytest
from rendezvous_harness import GID, GRACE, INTERVAL, VersionedHarness, formed, only, sent_to

from cco.nodes.events import PeerConnected, PeerDisconnected
from cco.nodes.rendezvous import RendezvousConfig, RendezvousMachine
from cco.nodes.rendezvous_config import DEFAULT_PARAMS
from cco.nodes.rendezvous_durable import DurableState
from cco.nodes.rendezvous_states import GroupState, MemberState
from cco.wire.errors import ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import (
    Address,
    AggregatorAccept,
    AggregatorRegister,
    EpochChange,
    Heartbeat,
    JoinAccept,
    JoinReject,
    JoinRequest,
    Leave,
    TreeAssignment,
)
from cco.wire.registries import Role


def test_the_durable_state_survives_a_restore_unchanged() -> None:
    h = formed(aggregators=3)
    before = h.rv.status()
    state = h.restart()
    assert h.rv.durable_state() == state
    after = h.rv.status()
    assert after.groups == tuple(
        dataclasses.replace(g, members=tuple(dataclasses.replace(m, connected=False) for m in g.members))
        for g in before.groups
    )
    assert after.aggregators == tuple(dataclasses.replace(a, connected=False) for a in before.aggregators)
    assert after.peers == 0 and after.grace_ends == pytest.approx(h.now + GRACE)
    assert h.rv.next_deadline() == pytest.approx(h.now + GRACE)


def test_an_empty_state_restores_a_fresh_machine_without_grace() -> None:
    rv = RendezvousMachine.restored(DurableState(), 5.0)
    assert rv.status().grace_ends is None and rv.next_deadline() is None


def test_members_and_aggregators_that_come_back_keep_rank_epoch_secret_and_tree() -> None:
    h = formed()
    accepts = {f"e{i}": h.last[(f"e{i}", JoinAccept, GID)] for i in range(4)}
    trees = {peer: h.last[(peer, TreeAssignment, GID)] for peer in ("a0", "a1", "e0", "e1", "e2", "e3")}
    epoch = h.group().epoch
    h.restart()
    version = h.rv.durable_version
    for i in (2, 0, 3, 1):  # any order, each on a new connection
        cmds = h.rejoin(f"e{i}", rank=i)
        accept = only(cmds, f"e{i}", JoinAccept)
        assert accept == dataclasses.replace(accepts[f"e{i}"], epoch=epoch)  # same rank, secret, params
        assert sent_to(cmds, f"e{i}") == [accept], "nothing else: the endpoint keeps its parent"
        assert not any(c.peer != f"e{i}" for c in cmds if hasattr(c, "peer")), "nobody else hears of it"
    for peer in ("a1", "a0"):
        cmds = h.reregister(peer, port=4000 + int(peer[1]))
        assert isinstance(sent_to(cmds, peer)[0], AggregatorAccept)
        assert sent_to(cmds, peer)[1:] == [trees[peer]], "its current TreeAssignment again, same content"
        assert all(c.peer == peer for c in cmds if hasattr(c, "peer"))
    assert h.rv.durable_version == version, "coming back changes nothing durable: nothing to write"
    assert h.live(GRACE) == []
    assert h.group().epoch == epoch and h.group().state is GroupState.ACTIVE
    assert all(m.connected for m in h.group().members) and h.rv.status().grace_ends is None
    h.check_state()


def test_a_member_not_back_within_the_grace_is_lost() -> None:
    h = formed()
    epoch = h.group().epoch
    h.restart()
    for i in (0, 1, 2):
        h.rejoin(f"e{i}", rank=i)
    for peer in ("a0", "a1"):
        h.reregister(peer, port=4000 + int(peer[1]))
    assert h.live(GRACE - 0.5) == []
    cmds = h.live(0.5)
    changes = [c for c in cmds if isinstance(getattr(c, "message", None), EpochChange)]
    assert {c.peer for c in changes} == {"e0", "e1", "e2", "a0", "a1"}
    for change in changes:
        message = change.message
        assert isinstance(message, EpochChange)
        assert message.epoch == epoch + 1 and message.code is ErrorCode.PEER_LOST
        assert ranks_from_bitmap(message.members) == {0, 1, 2}
    assert [m.rank for m in h.group().members] == [0, 1, 2]
    h.check_state()  # the three survivors have a new tree in the new epoch


def test_an_aggregator_not_back_within_the_grace_is_replanned() -> None:
    h = formed(aggregators=4)  # three hold the tree, one is spare
    used = sorted(h.group().tree.aggregator_ids)  # type: ignore[union-attr]
    (spare,) = {"a0", "a1", "a2", "a3"} - set(used)
    epoch = h.group().epoch
    h.restart()
    for i in range(4):
        h.rejoin(f"e{i}", rank=i)
    for back in (*used[:2], spare):
        h.reregister(back, port=4000 + int(back[1]))
    cmds = h.live(GRACE)
    change = only(cmds, "e0", EpochChange)
    assert isinstance(change, EpochChange)
    assert (change.epoch, change.code) == (epoch + 1, ErrorCode.PEER_LOST)
    assert used[2] not in {a.node_id for a in h.rv.status().aggregators}
    tree = h.group().tree
    assert tree is not None and tree.aggregator_ids == {*used[:2], spare}
    h.check_state()


def test_with_no_aggregator_back_the_members_learn_no_aggregator() -> None:
    h = formed(aggregators=2)
    h.restart()
    for i in range(4):
        h.rejoin(f"e{i}", rank=i)
    cmds = h.live(GRACE)
    changes = [m for m in sent_to(cmds, "e0") if isinstance(m, EpochChange)]
    assert changes[0].code is ErrorCode.NO_AGGREGATOR
    assert h.group().state is GroupState.WAITING and not h.rv.status().aggregators


def test_a_member_away_while_the_group_changed_is_told_what_it_missed() -> None:
    h = formed(aggregators=2)
    epoch = h.group().epoch
    h.restart()
    for i in (0, 1, 2):
        h.rejoin(f"e{i}", rank=i)
    for peer in ("a0", "a1"):
        h.reregister(peer, port=4000 + int(peer[1]))
    h.send("e2", Leave(group_id=GID, rank=2, code=ErrorCode.NO_ERROR))  # the group moves on: epoch + 1
    assert h.group().epoch == epoch + 1
    cmds = h.rejoin("e3", rank=3)
    accept, change, tree = sent_to(cmds, "e3")
    assert isinstance(accept, JoinAccept) and accept.epoch == epoch and accept.rank == 3
    assert isinstance(change, EpochChange) and change.epoch == epoch + 1
    assert change.code is ErrorCode.NO_ERROR and ranks_from_bitmap(change.members) == {0, 1, 3}
    assert isinstance(tree, TreeAssignment) and tree.epoch == epoch + 1
    assert tree.expected == bitmap_from_ranks([3])
    h.check_state()


def test_a_resume_is_checked_like_a_join() -> None:
    h = formed()
    h.restart()
    h.connect("e1", Role.ENDPOINT)
    bad = JoinRequest(group_id=GID, world_size=4, credential=b"wrong", labels=())
    reject = only(h.send("e1", bad), "e1", JoinReject)
    assert isinstance(reject, JoinReject) and reject.code is ErrorCode.BAD_CREDENTIAL
    reject = only(h.endpoint("e1", rank=2), "e1", JoinReject)
    assert isinstance(reject, JoinReject) and reject.code is ErrorCode.RANK_UNAVAILABLE
    assert not h.group().members[1].connected
    accept = only(h.endpoint("e1"), "e1", JoinAccept)  # no rank asked: its own
    assert isinstance(accept, JoinAccept) and accept.rank == 1
    reject = only(h.endpoint("e1"), "e1", JoinReject)  # now connected: a second join is refused as before
    assert isinstance(reject, JoinReject) and reject.code is ErrorCode.PROTOCOL_VIOLATION


def test_a_new_node_cannot_take_an_away_members_place_during_the_grace() -> None:
    h = formed()
    h.restart()
    reject = only(h.endpoint("intruder"), "intruder", JoinReject)
    assert isinstance(reject, JoinReject) and reject.code is ErrorCode.GROUP_FULL


def test_a_resumed_member_that_disconnects_is_lost_at_once() -> None:
    h = formed()
    epoch = h.group().epoch
    h.restart()
    for i in range(4):
        h.rejoin(f"e{i}", rank=i)
    for peer in ("a0", "a1"):
        h.reregister(peer, port=4000 + int(peer[1]))
    cmds = h.feed(PeerDisconnected("e3", ErrorCode.PEER_LOST))
    change = only(cmds, "e0", EpochChange)
    assert isinstance(change, EpochChange) and change.epoch == epoch + 1
    h.check_state()


def test_an_aggregator_registering_differently_is_a_new_registration() -> None:
    h = formed(aggregators=2)
    epoch = h.group().epoch
    h.restart()
    for i in range(4):
        h.rejoin(f"e{i}", rank=i)
    h.reregister("a0", port=4000)
    cmds = h.reregister("a1", port=4999)  # another address: children could not reach the old one
    change = only(cmds, "e0", EpochChange)
    assert isinstance(change, EpochChange) and change.epoch == epoch + 1
    assert {a.address.port for a in h.rv.status().aggregators} == {4000, 4999}
    h.live(GRACE)
    h.check_state()


def test_an_aggregator_connection_lost_before_registering_again_keeps_the_registration() -> None:
    h = formed(aggregators=2)
    h.restart()
    h.connect("a0", Role.AGGREGATOR)
    h.feed(PeerDisconnected("a0", ErrorCode.PEER_LOST))
    assert {a.node_id for a in h.rv.status().aggregators} == {"a0", "a1"}
    h.roles.pop("a0")
    h.closed.discard("a0")
    cmds = h.reregister("a0", port=4000)
    assert any(isinstance(m, TreeAssignment) for m in sent_to(cmds, "a0"))


def test_a_forming_group_restores_its_members_and_loses_those_not_back() -> None:
    h = VersionedHarness()
    h.endpoint("e0")
    h.endpoint("e1")
    h.restart()
    accept = only(h.rejoin("e1"), "e1", JoinAccept)
    assert isinstance(accept, JoinAccept) and accept.rank == 1 and accept.epoch == 1
    h.live(GRACE)
    assert [m.rank for m in h.group().members] == [1] and h.group().state is GroupState.FORMING
    assert h.group().members[0].state is MemberState.JOINED


def test_the_grace_ends_on_any_input_after_its_deadline() -> None:
    h = formed()
    epoch, secret = h.group().epoch, h.last[("e0", JoinAccept, GID)].group_secret  # type: ignore[attr-defined]
    h.restart()
    h.now += GRACE
    h.connect("e0", Role.ENDPOINT)  # no TimerFired came: the grace ends before this input is handled
    assert h.rv.status().grace_ends is None and h.group().state is GroupState.CLOSED
    accept = only(h.endpoint("e0"), "e0", JoinAccept)  # not a resume: the group starts over
    assert isinstance(accept, JoinAccept) and accept.epoch > epoch + 1 and accept.group_secret != secret
    assert [m.connected for m in h.group().members] == [True]


def test_the_resume_grace_is_configurable_and_defaults_to_the_window_and_nine_seconds() -> None:
    assert RendezvousConfig().resume_grace == pytest.approx(24.0)
    old_rule = dataclasses.replace(DEFAULT_PARAMS, liveness_ms=None)  # three intervals of 1 s
    assert RendezvousConfig(params=old_rule).resume_grace == pytest.approx(12.0)
    fast = dataclasses.replace(DEFAULT_PARAMS, heartbeat_interval_ms=100, liveness_ms=None)
    assert RendezvousConfig(params=fast).resume_grace == pytest.approx(
        9.3
    )  # peers' redial gaps do not shrink
    assert RendezvousConfig(resume_grace_ms=2500).resume_grace == 2.5
    with pytest.raises(ValueError, match="negative"):
        RendezvousConfig(resume_grace_ms=-1)
    h = formed()
    state = h.rv.durable_state()
    rv = RendezvousMachine.restored(state, 100.0, RendezvousConfig(resume_grace_ms=2500))
    assert rv.next_deadline() == 102.5


def test_a_configured_group_comes_back_as_stored_not_as_configured() -> None:
    h = formed()
    secret = h.last[("e0", JoinAccept, GID)].group_secret  # type: ignore[attr-defined]
    h.restart()
    accept = only(h.rejoin("e0"), "e0", JoinAccept)
    assert isinstance(accept, JoinAccept) and accept.group_secret == secret


@pytest.mark.parametrize(
    "damage",
    [
        lambda s: dataclasses.replace(s, aggregators=s.aggregators + s.aggregators[:1]),
        lambda s: dataclasses.replace(s, groups=s.groups + s.groups[:1]),
        lambda s: dataclasses.replace(s, aggregators=()),  # a tree over unregistered aggregators
        lambda s: dataclasses.replace(
            s, groups=(dataclasses.replace(s.groups[0], state=GroupState.PLANNING),)
        ),
        lambda s: dataclasses.replace(s, groups=(dataclasses.replace(s.groups[0], world_size=2),)),
        lambda s: dataclasses.replace(s, groups=(dataclasses.replace(s.groups[0], secret=b"short"),)),
    ],
)
def test_a_state_no_machine_could_export_is_refused(damage: object) -> None:
    state = formed().rv.durable_state()
    with pytest.raises(ValueError):
        RendezvousMachine.restored(damage(state), 0.0)  # type: ignore[operator]


def test_heartbeats_do_not_move_the_durable_version() -> None:
    h = formed()
    version = h.rv.durable_version
    for _ in range(5):
        for peer in ("a0", "a1", "e0", "e1", "e2", "e3"):
            h.send(peer, Heartbeat(seq=1))
        h.tick(INTERVAL)
    assert h.rv.durable_version == version


def test_every_change_moves_the_durable_version() -> None:
    h = VersionedHarness()
    seen = [h.rv.durable_version]

    def moved() -> None:
        assert h.rv.durable_version > seen[-1]
        seen.append(h.rv.durable_version)

    h.aggregator("a0", capacity=1, fan_in=4)
    moved()
    for i in range(4):
        h.endpoint(f"e{i}")
        moved()
    h.send("e3", Leave(group_id=GID, rank=3, code=ErrorCode.NO_ERROR))
    moved()
    h.feed(PeerDisconnected("a0", ErrorCode.PEER_LOST))
    moved()
    h.feed(PeerConnected("a1", "a1", Role.AGGREGATOR))
    h.send(
        "a1", AggregatorRegister(address=Address(host="a1.test", port=1), capacity=1, max_fan_in=4, labels=())
    )
    moved()
