"""The rendezvous's admission limits (issue 41): what one peer and all peers together
may make it hold, the refusal that names the limit, the expiry of created groups that
never formed or stayed empty, and group creation that costs the same whatever the
number of groups."""

from __future__ import annotations

import dataclasses

import pytest
from rendezvous_harness import CRED, GID, Harness, only, sent_to

from cco.nodes.events import Command, SendMessage, TimerFired
from cco.nodes.rendezvous import GroupConfig, RendezvousConfig, RendezvousMachine
from cco.nodes.rendezvous_admission import AdmissionLimits
from cco.nodes.rendezvous_states import GroupState
from cco.nodes.rendezvous_trees import Trees
from cco.wire.errors import ErrorCode
from cco.wire.messages import EpochChange, Error, Heartbeat, JoinAccept, JoinReject, Leave, TreeAssignment


def gid(n: int) -> bytes:
    return n.to_bytes(16, "big")


def harness(**limits: float) -> Harness:
    config = RendezvousConfig(create_groups_on_join=True, limits=AdmissionLimits(**limits))  # type: ignore[arg-type]
    return Harness(config)


def refusal(cmds: list[Command], peer: str) -> JoinReject:
    reject = only(cmds, peer, JoinReject)
    assert isinstance(reject, JoinReject) and reject.code is ErrorCode.RESOURCE_EXHAUSTED
    return reject


def accepted(cmds: list[Command], peer: str) -> bool:
    return any(isinstance(m, JoinAccept) for m in sent_to(cmds, peer))


def test_defaults_are_positive_and_a_zero_limit_is_refused() -> None:
    assert all(getattr(AdmissionLimits(), f.name) > 0 for f in dataclasses.fields(AdmissionLimits))
    with pytest.raises(ValueError, match="groups_per_peer"):
        AdmissionLimits(groups_per_peer=0)


def test_a_peer_joins_at_most_groups_per_peer_groups() -> None:
    h = harness(groups_per_peer=3)
    h.aggregator("agg", capacity=8)
    for n in range(3):
        assert accepted(h.endpoint("e", group=gid(n), world_size=1), "e")
    reject = refusal(h.endpoint("e", group=gid(3), world_size=1), "e")
    assert "groups_per_peer (3)" in reject.detail
    assert gid(3) not in {g.group_id for g in h.rv.status().groups}, "a refused join creates nothing"
    assert accepted(h.endpoint("other", group=gid(3), world_size=1), "other"), "only that peer is limited"
    h.check_state()


def test_a_peer_has_at_most_pending_per_peer_joins_in_groups_still_forming() -> None:
    h = harness(pending_per_peer=2)
    h.aggregator("agg", capacity=8)
    assert accepted(h.endpoint("e", group=gid(0), world_size=2), "e")
    assert accepted(h.endpoint("e", group=gid(1), world_size=2), "e")
    assert "pending_per_peer (2)" in refusal(h.endpoint("e", group=gid(2), world_size=2), "e").detail
    # a formed group is no longer pending: once group 0 is complete, e may start another
    assert accepted(h.endpoint("f", group=gid(0), world_size=2), "f")
    assert h.group(gid(0)).state is GroupState.ACTIVE
    assert accepted(h.endpoint("e", group=gid(2), world_size=2), "e")
    # a group that is complete with this join is not pending: e may join it at the limit
    assert accepted(h.endpoint("f", group=gid(5), world_size=2), "f")
    assert accepted(h.endpoint("e", group=gid(5), world_size=2), "e")
    h.check_state()


def test_the_node_holds_at_most_groups_created_groups_until_closed_ones_are_forgotten() -> None:
    h = harness(groups=2, idle_timeout=2.0)
    h.aggregator("agg", capacity=8)
    assert accepted(h.endpoint("a", group=gid(0), world_size=1), "a")
    assert accepted(h.endpoint("b", group=gid(1), world_size=1), "b")
    assert "limit groups (2)" in refusal(h.endpoint("c", group=gid(2), world_size=1), "c").detail
    h.send("a", _leave(gid(0)))
    assert h.group(gid(0)).state is GroupState.CLOSED
    refusal(h.endpoint("c", group=gid(3), world_size=1), "c")  # a closed group still counts
    assert accepted(h.endpoint("c", group=gid(0), world_size=1), "c"), "a closed group reopens"
    h.send("c", _leave(gid(0)))
    h.send("b", _leave(gid(1)))
    _beat(h, "agg", "a", "b", "c")
    h.tick(2.5)
    assert {g.group_id for g in h.rv.status().groups} == set(), "idle created groups are forgotten"
    assert accepted(h.endpoint("c", group=gid(3), world_size=1), "c")
    h.check_state()


def test_configured_groups_neither_count_nor_expire() -> None:
    config = RendezvousConfig(
        groups={GID: GroupConfig(world_size=2, credential=CRED)},
        create_groups_on_join=True,
        limits=AdmissionLimits(groups=1, pending=1, forming_timeout=1.0, idle_timeout=1.0),
    )
    h = Harness(config)
    assert accepted(h.endpoint("e0", world_size=2), "e0")
    assert accepted(h.endpoint("x", group=gid(1), world_size=2), "x")
    _beat(h, "e0", "x")
    h.tick(1.5)
    assert h.group().state is GroupState.FORMING and len(h.group().members) == 1
    assert {g.group_id for g in h.rv.status().groups} == {GID, gid(1)}
    assert h.group(gid(1)).state is GroupState.CLOSED
    h.check_state()


def test_the_node_holds_at_most_pending_forming_created_groups() -> None:
    h = harness(pending=2)
    assert accepted(h.endpoint("a", group=gid(0), world_size=2), "a")
    assert accepted(h.endpoint("b", group=gid(1), world_size=2), "b")
    assert "limit pending (2)" in refusal(h.endpoint("c", group=gid(2), world_size=2), "c").detail
    assert accepted(h.endpoint("c", group=gid(1), world_size=2), "c"), "joining a forming group adds none"
    assert accepted(h.endpoint("d", group=gid(2), world_size=2), "d")
    h.check_state()


def test_the_node_holds_at_most_members_memberships() -> None:
    h = harness(members=3)
    h.aggregator("agg", capacity=8)
    for peer, n in (("a", 0), ("b", 0), ("c", 1)):
        assert accepted(h.endpoint(peer, group=gid(n), world_size=2), peer)
    assert "limit members (3)" in refusal(h.endpoint("d", group=gid(1), world_size=2), "d").detail
    h.send("a", _leave(gid(0), rank=0))
    assert accepted(h.endpoint("d", group=gid(1), world_size=2), "d"), "a leave frees a membership"
    h.check_state()


def test_a_created_group_that_does_not_form_loses_its_members_with_timeout() -> None:
    h = harness(forming_timeout=2.0, idle_timeout=2.0)
    assert accepted(h.endpoint("a", group=gid(0), world_size=3), "a")
    assert accepted(h.endpoint("b", group=gid(0), world_size=3), "b")
    assert h.rv.next_deadline() is not None and h.rv.next_deadline() <= 2.0
    _beat(h, "a", "b")
    cmds = h.tick(2.0)
    for peer in ("a", "b"):
        error = only(cmds, peer, Error)
        assert isinstance(error, Error) and error.code is ErrorCode.TIMEOUT
        assert "did not form within 2 s (2 of 3 members joined)" in error.detail
    assert not any(isinstance(m, EpochChange) for m in sent_to(cmds, "a")), "no epoch ran"
    assert h.group(gid(0)).state is GroupState.CLOSED and not h.group(gid(0)).members
    assert "a" not in h.closed, "the peer's connection stays: only the membership ends"
    _beat(h, "a", "b")
    h.tick(2.0)
    assert not h.rv.status().groups
    h.check_state()


def test_a_group_that_formed_in_time_does_not_expire() -> None:
    h = harness(forming_timeout=2.0)
    h.aggregator("agg", capacity=8)
    h.endpoint("a", group=gid(0), world_size=2)
    _beat(h, "agg", "a")
    h.tick(1.0)
    h.endpoint("b", group=gid(0), world_size=2)
    _beat(h, "agg", "a", "b")
    cmds = h.tick(1.5)
    assert not [m for m in sent_to(cmds, "a") if isinstance(m, Error)]
    assert h.group(gid(0)).state is GroupState.ACTIVE
    h.check_state()


def test_a_join_flood_on_one_connection_holds_no_more_than_its_limits() -> None:
    h = harness()
    h.aggregator("agg", capacity=64)
    limits = AdmissionLimits()
    answers: dict[type, int] = {}
    for n in range(2000):
        for message in sent_to(h.endpoint("flood", group=gid(n), world_size=2), "flood"):
            answers[type(message)] = answers.get(type(message), 0) + 1
    assert answers == {JoinAccept: limits.pending_per_peer, JoinReject: 2000 - limits.pending_per_peer}
    assert len(h.rv.status().groups) == limits.pending_per_peer
    assert accepted(h.endpoint("v0", group=gid(9999), world_size=2), "v0")
    cmds = h.endpoint("v1", group=gid(9999), world_size=2)
    assert only(cmds, "v1", TreeAssignment) is not None, "everyone else's groups still form"
    h.check_state()


def test_creating_a_group_visits_no_other_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Creating a group costs the same with 10 or 400 groups: the number of group
    moves and tree searches it makes does not grow with them."""

    def cost(existing: int) -> int:
        h = harness(pending=1000)
        h.aggregator("agg", capacity=1)
        h.endpoint("full", group=gid(10_000), world_size=1)  # takes the only slot
        for n in range(existing // 2):  # waiting groups
            h.endpoint(f"w{n}", group=gid(20_000 + n), world_size=1)
        for n in range(existing // 2):  # forming groups
            h.endpoint(f"f{n}", group=gid(n), world_size=2)
        calls = 0
        moves, searches = Trees.group_event, Trees._candidate

        def count_moves(self: Trees, *args: object, **kwargs: object) -> None:
            nonlocal calls
            calls += 1
            moves(self, *args, **kwargs)  # type: ignore[arg-type]

        def count_searches(self: Trees, *args: object) -> object:
            nonlocal calls
            calls += 1
            return searches(self, *args)  # type: ignore[arg-type]

        with monkeypatch.context() as patch:
            patch.setattr(Trees, "group_event", count_moves)
            patch.setattr(Trees, "_candidate", count_searches)
            assert accepted(h.endpoint("new", group=gid(50_000), world_size=2), "new")
        return calls

    assert cost(400) == cost(10)


def test_a_restored_created_group_still_expires() -> None:
    h = harness(forming_timeout=2.0, idle_timeout=2.0)
    h.endpoint("a", group=gid(0), world_size=2)
    state = h.rv.durable_state()
    rv = RendezvousMachine.restored(state, 10.0, h.config)
    assert rv.next_deadline() is not None and rv.next_deadline() <= 12.0  # type: ignore[operator]
    cmds = rv.handle(TimerFired(), 12.5)  # the grace ends first: the away member is lost
    assert not [c for c in cmds if isinstance(c, SendMessage)]
    rv.handle(TimerFired(), 15.0)
    assert not rv.status().groups


def _leave(group: bytes, rank: int = 0) -> Leave:
    return Leave(group_id=group, rank=rank, code=ErrorCode.NO_ERROR)


def _beat(h: Harness, *peers: str) -> None:
    for peer in peers:
        h.send(peer, Heartbeat(seq=1))
