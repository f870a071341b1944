"""A member's Report of tampering at the rendezvous (draft section "Reports of
Tampering"): a Report that stands takes the reporting rank's path to the root out of
its group's trees, for that group only, and the group goes on in a new epoch; any
other Report is refused with a typed Error and changes nothing."""

from __future__ import annotations

from rendezvous_harness import CRED, GID, OTHER, Harness, VersionedHarness, only, sent_to

from cco.nodes.events import Happening, PeerDisconnected
from cco.nodes.rendezvous import GroupConfig, RendezvousConfig
from cco.nodes.rendezvous_admission import AdmissionLimits
from cco.nodes.rendezvous_states import GroupState
from cco.wire.errors import ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import EpochChange, Error, Leave, Report, TreeAssignment
from cco.wire.registries import Role


def _report(h: Harness, peer: str, group: bytes = GID, **changes: object) -> Report:
    """A Report from ``peer`` naming its current epoch and parent in ``group``."""
    status = h.group(group)
    (member,) = [m for m in status.members if m.node_id == peer]
    assert status.tree is not None
    fields: dict[str, object] = {
        "group_id": group,
        "epoch": status.epoch,
        "op_id": 7,
        "code": ErrorCode.VERIFICATION_FAILED,
        "parent": status.tree.parent_of(member.rank).node_id,
        "detail": "chunk 0: the tag does not verify",
    }
    fields.update(changes)
    return Report(**fields)  # type: ignore[arg-type]


def _two_level(limits: AdmissionLimits | None = None) -> VersionedHarness:
    """Group GID of 4 members on two leaves (l0: ranks 0-1, l1: ranks 2-3) under a root
    r0, with two spare aggregators s0 and s1: fan-in 2 everywhere, so that a tree of
    three of them is as good as any."""
    config = RendezvousConfig(
        groups={GID: GroupConfig(world_size=4, credential=CRED, max_fan_in=4)},
        limits=limits or AdmissionLimits(),
    )
    h = VersionedHarness(config)
    for i, name in enumerate(("l0", "l1", "r0")):
        h.aggregator(name, capacity=1, fan_in=2, port=4000 + i)
    for i in range(4):
        h.endpoint(f"e{i}")
    tree = h.group().tree
    assert tree is not None and tree.root.node_id == "r0"
    assert [tree.parent_of(r).node_id for r in range(4)] == ["l0", "l0", "l1", "l1"]
    h.aggregator("s0", capacity=1, fan_in=2, port=4010)
    h.aggregator("s1", capacity=1, fan_in=2, port=4011)
    assert h.group().tree is tree, "spare aggregators alone do not make a better tree"
    return h


def test_a_report_excludes_the_path_to_the_root_and_the_group_goes_on_in_a_new_epoch() -> None:
    h = _two_level()
    epoch = h.group().epoch
    cmds = h.send("e0", _report(h, "e0"))
    change = EpochChange(
        group_id=GID, epoch=epoch + 1, members=bitmap_from_ranks(range(4)), code=ErrorCode.VERIFICATION_FAILED
    )
    for peer in ("e0", "e1", "e2", "e3", "l0", "l1", "r0"):
        assert only(cmds, peer, EpochChange) == change, peer
    status = h.group()
    assert status.state is GroupState.ACTIVE and status.epoch == epoch + 1
    assert status.excluded == ("l0", "r0"), "the leaf that delivered, then its parent up to the root"
    assert status.tree is not None and status.tree.aggregator_ids.isdisjoint({"l0", "r0"})
    for rank in range(4):
        assignment = only(cmds, f"e{rank}", TreeAssignment)
        assert isinstance(assignment, TreeAssignment) and assignment.epoch == epoch + 1
        assert assignment.parent == status.tree.parent_of(rank)
    (logged,) = [r for r in h.reports if r.what is Happening.TAMPERING]
    assert (logged.node_id, logged.group_id, logged.rank, logged.epoch, logged.code) == (
        "e0",
        GID,
        0,
        epoch,
        ErrorCode.VERIFICATION_FAILED,
    )
    assert "op 7 from parent l0" in logged.detail and "l0, r0" in logged.detail
    h.check_state()


def test_a_report_from_the_other_leaf_spares_the_first_leaf() -> None:
    h = _two_level()
    h.send("e3", _report(h, "e3"))
    assert h.group().excluded == ("l1", "r0")
    assert "l0" not in h.group().excluded


def test_other_groups_keep_their_tree_and_epoch() -> None:
    config = RendezvousConfig(
        groups={
            GID: GroupConfig(world_size=2, credential=CRED),
            OTHER: GroupConfig(world_size=2, credential=CRED),
        }
    )
    h = Harness(config)
    h.aggregator("shared", capacity=2, port=4000)
    h.aggregator("spare", capacity=1, port=4001)
    for peer, group in (("a0", GID), ("a1", GID), ("b0", OTHER), ("b1", OTHER)):
        h.endpoint(peer, group=group, world_size=2)
    tree, epoch = h.group(OTHER).tree, h.group(OTHER).epoch
    assert tree is not None and tree.root.node_id == "shared" == h.group(GID).tree.root.node_id  # type: ignore[union-attr]
    cmds = h.send("a0", _report(h, "a0"))
    assert h.group(GID).excluded == ("shared",)
    assert h.group(OTHER).tree is tree and h.group(OTHER).epoch == epoch and h.group(OTHER).excluded == ()
    assert not sent_to(cmds, "b0") and not sent_to(cmds, "b1")
    assert any(a.node_id == "shared" for a in h.rv.status().aggregators), "the registration stays"
    # and a member of the other group cannot report this one's tree
    before = h.group(GID)
    refused = h.send("b0", _report(h, "a1"))
    assert [m.code for m in sent_to(refused, "b0") if isinstance(m, Error)] == [ErrorCode.NOT_A_MEMBER]
    assert h.group(GID) == before


def _refused(h: Harness, peer: str, report: Report) -> ErrorCode:
    before, logged = h.rv.status(), len(h.reports)
    cmds = h.send(peer, report)
    (error,) = sent_to(cmds, peer)
    assert isinstance(error, Error) and error.message_type == 0x18
    assert h.rv.status() == before, "a refused Report changes nothing"
    assert [r.what for r in h.reports[logged:]] == [Happening.REFUSED]
    return error.code


def test_reports_that_do_not_stand_are_refused_in_the_drafts_order() -> None:
    h = _two_level()
    assert _refused(h, "e0", _report(h, "e0", group_id=OTHER)) is ErrorCode.UNKNOWN_GROUP
    h.connect("x", Role.ENDPOINT)
    assert _refused(h, "x", _report(h, "e0")) is ErrorCode.NOT_A_MEMBER
    epoch = h.group().epoch
    assert _refused(h, "e0", _report(h, "e0", epoch=epoch - 1)) is ErrorCode.STALE_EPOCH
    assert _refused(h, "e0", _report(h, "e0", epoch=epoch + 1)) is ErrorCode.STALE_EPOCH
    assert _refused(h, "e0", _report(h, "e0", parent="l1")) is ErrorCode.UNAUTHORIZED
    assert _refused(h, "e0", _report(h, "e0", parent="r0")) is ErrorCode.UNAUTHORIZED
    assert _refused(h, "l0", _report(h, "e0")) is ErrorCode.UNAUTHORIZED


def test_the_second_report_of_an_epoch_is_stale() -> None:
    h = _two_level()
    first, second = _report(h, "e0"), _report(h, "e1")
    h.send("e0", first)
    assert _refused(h, "e1", second) is ErrorCode.STALE_EPOCH
    assert h.group().excluded == ("l0", "r0")


def test_a_waiting_group_has_no_tree_to_report() -> None:
    h = Harness()
    for i in range(4):
        h.endpoint(f"e{i}")
    status = h.group()
    assert status.state is GroupState.WAITING
    report = Report(
        group_id=GID, epoch=status.epoch, op_id=0, code=ErrorCode.VERIFICATION_FAILED, parent="agg", detail=""
    )
    assert _refused(h, "e0", report) is ErrorCode.STALE_EPOCH


def test_without_an_aggregator_left_the_group_waits_after_the_reported_epoch_ends() -> None:
    h = Harness(RendezvousConfig(groups={GID: GroupConfig(world_size=2, credential=CRED)}))
    h.aggregator("evil", capacity=1)
    h.endpoint("e0", world_size=2)
    h.endpoint("e1", world_size=2)
    epoch = h.group().epoch
    cmds = h.send("e1", _report(h, "e1"))
    changes = [m for m in sent_to(cmds, "e0") if isinstance(m, EpochChange)]
    assert [(c.epoch, c.code) for c in changes] == [
        (epoch + 1, ErrorCode.VERIFICATION_FAILED),
        (epoch + 2, ErrorCode.NO_AGGREGATOR),
    ]
    assert h.group().state is GroupState.WAITING
    # the excluded aggregator comes back on a new connection: still not this group's
    h.feed(PeerDisconnected("evil", ErrorCode.PEER_LOST))
    h.aggregator("evil", capacity=1)
    assert h.group().state is GroupState.WAITING and h.group().tree is None
    cmds = h.aggregator("honest", capacity=1, port=4001)
    assert h.group().state is GroupState.ACTIVE
    assert h.group().tree.aggregator_ids == {"honest"}  # type: ignore[union-attr]
    assert isinstance(only(cmds, "e0", TreeAssignment), TreeAssignment)
    h.check_state()


def test_a_better_tree_never_brings_an_excluded_aggregator_back() -> None:
    h = Harness(RendezvousConfig(groups={GID: GroupConfig(world_size=2, credential=CRED)}))
    h.aggregator("b-plain", capacity=1, port=4000)
    h.aggregator("c-spare", capacity=1, port=4001)
    h.endpoint("e0", world_size=2, labels=("rack=1",))
    h.endpoint("e1", world_size=2, labels=("rack=1",))
    assert h.group().tree.root.node_id == "b-plain"  # type: ignore[union-attr]
    h.send("e0", _report(h, "e0"))
    assert h.group().tree.root.node_id == "c-spare"  # type: ignore[union-attr]
    epoch = h.group().epoch
    # b-plain registers again with the members' label: it would be a better (local) tree
    h.feed(PeerDisconnected("b-plain", ErrorCode.PEER_LOST))
    h.aggregator("b-plain", capacity=1, labels=("rack=1",), port=4000)
    assert h.group().tree.root.node_id == "c-spare" and h.group().epoch == epoch  # type: ignore[union-attr]
    h.aggregator("a-local", capacity=1, labels=("rack=1",), port=4002)
    assert h.group().tree.root.node_id == "a-local"  # type: ignore[union-attr]


def test_exclusions_are_bounded_oldest_forgotten_first() -> None:
    h = Harness(
        RendezvousConfig(
            groups={GID: GroupConfig(world_size=2, credential=CRED)},
            limits=AdmissionLimits(exclusions_per_group=2),
        )
    )
    for i, name in enumerate(("a", "b", "c", "d")):
        h.aggregator(name, capacity=1, port=4000 + i)
    h.endpoint("e0", world_size=2)
    h.endpoint("e1", world_size=2)
    used = []
    for _ in range(3):
        used.append(h.group().tree.root.node_id)  # type: ignore[union-attr]
        h.send("e0", _report(h, "e0"))
    assert used == ["a", "b", "c"]
    assert h.group().excluded == ("b", "c")
    assert h.group().tree.root.node_id == "a"  # type: ignore[union-attr]  # forgotten, so usable again


def test_exclusions_go_with_the_group_when_it_closes_and_reopens() -> None:
    h = Harness(RendezvousConfig(groups={GID: GroupConfig(world_size=2, credential=CRED)}))
    h.aggregator("a", capacity=1)
    h.aggregator("b", capacity=1, port=4001)
    h.endpoint("e0", world_size=2)
    h.endpoint("e1", world_size=2)
    h.send("e0", _report(h, "e0"))
    assert h.group().excluded == ("a",)
    for rank in (0, 1):
        h.send(f"e{rank}", Leave(group_id=GID, rank=rank, code=ErrorCode.NO_ERROR))
    assert h.group().state is GroupState.CLOSED and h.group().excluded == ("a",)
    h.endpoint("e0", world_size=2)
    h.endpoint("e1", world_size=2)
    assert h.group().excluded == ()
    assert h.group().tree.root.node_id == "a"  # type: ignore[union-attr]


def test_exclusions_survive_a_restart() -> None:
    h = _two_level()
    version = h.rv.durable_version
    h.send("e0", _report(h, "e0"))
    assert h.rv.durable_version > version
    state = h.restart()
    assert state.groups[0].excluded == ("l0", "r0")
    assert h.group().excluded == ("l0", "r0")
    for name, port in (("l0", 4000), ("l1", 4001), ("r0", 4002), ("s0", 4010), ("s1", 4011)):
        h.aggregator(name, capacity=1, fan_in=2, port=port)
    for i in range(4):
        h.rejoin(f"e{i}")
    assert h.group().tree is not None
    assert h.group().tree.aggregator_ids.isdisjoint({"l0", "r0"})  # type: ignore[union-attr]
    h.check_state()
