"""The rendezvous and a group's members: joins and their refusals, leaving, losses and
heartbeats, epochs, and what each role may send.

Draft section "Membership, Trees and Epochs" states the behaviour checked here.
Every batch of commands the machine returns passes through :meth:`Harness.feed`,
which checks the promises that hold for any input (keys never reach an aggregator,
every message encodes, epochs only grow per recipient, nothing is sent to a closed
connection); the tests then check what a particular input must do.
"""

from __future__ import annotations

import pytest
from rendezvous_harness import CRED, GID, INTERVAL, OTHER, Harness, only, sent_to

from cco.nodes.events import (
    ClosePeer,
    MessageMalformed,
    MessageReceived,
    PeerConnected,
    PeerDisconnected,
    SendMessage,
    TimerFired,
)
from cco.nodes.rendezvous import GroupConfig, RendezvousConfig, RendezvousMachine
from cco.nodes.rendezvous_config import DEFAULT_PARAMS
from cco.nodes.rendezvous_states import (
    GroupState,
)
from cco.nodes.tree import PlanStrategy
from cco.wire.errors import DecodeError, ErrorCode
from cco.wire.fields import ranks_from_bitmap
from cco.wire.messages import (
    Address,
    AggregatorRegister,
    EpochChange,
    Error,
    GroupParams,
    Heartbeat,
    JoinAccept,
    JoinReject,
    Leave,
    TreeAssignment,
)
from cco.wire.registries import MAX_WORLD_SIZE, Role


def test_join_assigns_lowest_free_rank_and_sends_key_material() -> None:
    h = Harness()
    accept = only(h.endpoint("e0"), "e0", JoinAccept)
    assert isinstance(accept, JoinAccept)
    assert (accept.group_id, accept.rank, accept.world_size, accept.epoch) == (GID, 0, 4, 1)
    assert accept.group_secret == h.secrets[0] and len(accept.group_secret) == 32
    assert accept.params == DEFAULT_PARAMS
    h.endpoint("e2", rank=2)
    accept = only(h.endpoint("e1"), "e1", JoinAccept)
    assert isinstance(accept, JoinAccept) and accept.rank == 1
    accept = only(h.endpoint("e3"), "e3", JoinAccept)
    assert isinstance(accept, JoinAccept) and accept.rank == 3
    assert h.group().state is GroupState.WAITING
    h.check_state()


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"credential": b"wrong"}, ErrorCode.BAD_CREDENTIAL),
        ({"world_size": 5}, ErrorCode.WORLD_SIZE_MISMATCH),
        ({"rank": 0}, ErrorCode.RANK_UNAVAILABLE),
        ({"group": OTHER}, ErrorCode.UNKNOWN_GROUP),
    ],
)
def test_join_rejections(kwargs: dict[str, object], code: ErrorCode) -> None:
    h = Harness()
    h.endpoint("e0")
    reject = only(h.endpoint("x", **kwargs), "x", JoinReject)  # type: ignore[arg-type]
    assert isinstance(reject, JoinReject) and reject.code is code
    assert reject.group_id == kwargs.get("group", GID)
    assert len(h.group().members) == 1


def test_full_group_and_double_join_are_rejected() -> None:
    h = Harness()
    for i in range(4):
        h.endpoint(f"e{i}")
    reject = only(h.endpoint("late"), "late", JoinReject)
    assert isinstance(reject, JoinReject) and reject.code is ErrorCode.GROUP_FULL
    h2 = Harness()
    h2.endpoint("e0")
    reject = only(h2.endpoint("e0"), "e0", JoinReject)
    assert isinstance(reject, JoinReject) and reject.code is ErrorCode.PROTOCOL_VIOLATION


def test_groups_created_on_first_join_take_the_joiners_terms() -> None:
    h = Harness(RendezvousConfig(create_groups_on_join=True))
    accept = only(h.endpoint("e0", group=OTHER, world_size=2, credential=b"c"), "e0", JoinAccept)
    assert isinstance(accept, JoinAccept) and accept.world_size == 2
    reject = only(h.endpoint("e1", group=OTHER, world_size=2, credential=b"d"), "e1", JoinReject)
    assert isinstance(reject, JoinReject) and reject.code is ErrorCode.BAD_CREDENTIAL
    reject = only(h.endpoint("e1", group=OTHER, world_size=3, credential=b"c"), "e1", JoinReject)
    assert isinstance(reject, JoinReject) and reject.code is ErrorCode.WORLD_SIZE_MISMATCH


def test_per_group_params_and_fan_in_override_the_defaults() -> None:
    params = GroupParams(chunk_elements=1024, window=2, heartbeat_interval_ms=500, operation_timeout_ms=900)
    config = RendezvousConfig(groups={GID: GroupConfig(2, CRED, params=params, max_fan_in=2)})
    h = Harness(config)
    accept = only(h.endpoint("e0", world_size=2), "e0", JoinAccept)
    assert isinstance(accept, JoinAccept) and accept.params == params
    with pytest.raises(ValueError):
        RendezvousConfig(max_fan_in=1)
    with pytest.raises(ValueError):
        GroupConfig(world_size=0, credential=b"")
    with pytest.raises(ValueError):
        GroupConfig(world_size=2, credential=b"", max_fan_in=1)
    with pytest.raises(ValueError):
        RendezvousConfig(groups={b"short": GroupConfig(2, b"")})


def active_group(h: Harness, aggregators: int = 3, fan_in: int = 2) -> None:
    for i in range(aggregators):
        h.aggregator(f"agg-{i}", fan_in=fan_in, port=4000 + i)
    for i in range(4):
        h.endpoint(f"e{i}")
    assert h.group().state is GroupState.ACTIVE


def test_leave_starts_a_new_epoch_and_replans() -> None:
    h = Harness()
    active_group(h, aggregators=3)
    cmds = h.send("e3", Leave(group_id=GID, rank=3, code=ErrorCode.NO_ERROR))
    change = only(cmds, "e0", EpochChange)
    assert change == EpochChange(group_id=GID, epoch=2, members=b"\x07", code=ErrorCode.NO_ERROR)
    assert not sent_to(cmds, "e3")
    for agg in ("agg-0", "agg-1", "agg-2"):
        assert EpochChange in {type(m) for m in sent_to(cmds, agg)}
    assignment = only(cmds, "e0", TreeAssignment)
    assert isinstance(assignment, TreeAssignment) and assignment.epoch == 2
    assert [type(m) for m in sent_to(cmds, "e0")] == [EpochChange, TreeAssignment]
    h.check_state()


def test_leave_for_someone_else_or_an_unknown_group_is_refused() -> None:
    h = Harness()
    active_group(h)
    error = only(h.send("e0", Leave(group_id=GID, rank=1, code=ErrorCode.NO_ERROR)), "e0", Error)
    assert isinstance(error, Error) and error.code is ErrorCode.NOT_A_MEMBER
    error = only(h.send("e0", Leave(group_id=OTHER, rank=0, code=ErrorCode.NO_ERROR)), "e0", Error)
    assert isinstance(error, Error) and error.code is ErrorCode.UNKNOWN_GROUP
    assert h.group().epoch == 1


def test_heartbeats_flow_each_interval_and_echo_the_peers_seq() -> None:
    h = Harness()
    h.endpoint("e0")
    assert h.rv.next_deadline() == pytest.approx(INTERVAL)
    h.send("e0", Heartbeat(seq=41))
    assert h.tick(INTERVAL / 2) == []
    cmds = h.tick(INTERVAL / 2)
    assert sent_to(cmds, "e0") == [Heartbeat(seq=41)]
    assert h.rv.next_deadline() == pytest.approx(2 * INTERVAL)


def test_silent_member_is_lost_after_three_intervals() -> None:
    h = Harness()
    active_group(h, aggregators=3)
    for _ in range(2):
        h.now += INTERVAL
        for peer in ("e0", "e1", "e2", "agg-0", "agg-1", "agg-2"):
            h.send(peer, Heartbeat(seq=1))
        h.feed(TimerFired())
    assert h.group().epoch == 1
    h.now += INTERVAL
    for peer in ("e0", "e1", "e2", "agg-0", "agg-1", "agg-2"):
        h.send(peer, Heartbeat(seq=2))
    cmds = h.feed(TimerFired())
    assert ClosePeer("e3", ErrorCode.PEER_LOST, "no message for 3 heartbeat intervals") in cmds
    change = only(cmds, "e0", EpochChange)
    assert (
        isinstance(change, EpochChange) and change.code is ErrorCode.PEER_LOST and change.members == b"\x07"
    )
    h.check_state()
    assert h.feed(MessageReceived("e3", Heartbeat(seq=3))) == []  # late input for a closed peer


def test_disconnected_aggregator_is_replaced() -> None:
    h = Harness()
    active_group(h, aggregators=4)
    tree = h.group().tree
    assert tree is not None
    used = tree.aggregator_ids
    victim = sorted(used)[0]
    cmds = h.feed(PeerDisconnected(victim, ErrorCode.PEER_LOST))
    change = only(cmds, "e1", EpochChange)
    assert isinstance(change, EpochChange) and change.code is ErrorCode.PEER_LOST and change.epoch == 2
    assert change.members == b"\x0f"
    tree = h.group().tree
    assert tree is not None and victim not in tree.aggregator_ids
    h.check_state()


def test_losing_the_last_aggregator_leaves_the_group_waiting() -> None:
    h = Harness()
    active_group(h, aggregators=1, fan_in=4)
    cmds = h.feed(PeerDisconnected("agg-0", ErrorCode.PEER_LOST))
    assert all(isinstance(m, EpochChange) for m in sent_to(cmds, "e0"))
    assert h.group().state is GroupState.WAITING
    cmds = h.aggregator("agg-9", fan_in=4)
    assignment = only(cmds, "e0", TreeAssignment)
    assert isinstance(assignment, TreeAssignment) and assignment.epoch == 2
    h.check_state()


def test_new_aggregator_replans_only_when_the_tree_gets_better() -> None:
    h = Harness()
    active_group(h, aggregators=2, fan_in=3)
    before = h.group().tree
    assert before is not None and before.strategy is PlanStrategy.COMPACT
    cmds = h.aggregator("agg-7", fan_in=2, port=4007)
    change = only(cmds, "e0", EpochChange)
    assert isinstance(change, EpochChange) and change.epoch == 2 and change.code is ErrorCode.NO_ERROR
    after = h.group().tree
    assert after is not None and after.strategy is PlanStrategy.LOCAL
    # Sorting first, "a-new" would be picked by a fresh plan, but that tree is no better.
    cmds = h.aggregator("a-new", fan_in=2, port=4008)
    assert not any(isinstance(c, SendMessage) and c.peer.startswith("e") for c in cmds)
    assert h.group().epoch == 2 and h.group().tree == after
    h.check_state()


def test_new_aggregator_with_matching_labels_improves_locality() -> None:
    h = Harness()
    h.aggregator("agg-0", fan_in=4)
    h.aggregator("agg-1", fan_in=4)
    for i in range(4):
        h.endpoint(f"e{i}", labels=("rack=1",))
    before = h.group().tree
    assert before is not None and before.locality == 0
    cmds = h.aggregator("tor-1", fan_in=4, labels=("rack=1",))
    assert isinstance(only(cmds, "e0", EpochChange), EpochChange)
    after = h.group().tree
    assert after is not None and after.locality == 4 and after.root.node_id == "tor-1"
    h.check_state()


def test_rejoin_after_loss_is_a_membership_change() -> None:
    h = Harness()
    active_group(h, aggregators=3)
    h.feed(PeerDisconnected("e1", ErrorCode.PEER_LOST))
    cmds = h.endpoint("e9")
    accept = only(cmds, "e9", JoinAccept)
    assert isinstance(accept, JoinAccept) and (accept.rank, accept.epoch) == (1, 2)
    assert [type(m) for m in sent_to(cmds, "e9")] == [JoinAccept, EpochChange, TreeAssignment]
    change = only(cmds, "e9", EpochChange)
    assert isinstance(change, EpochChange) and change.epoch == 3 and change.members == b"\x0f"
    h.check_state()


def test_closed_group_reopens_with_a_fresh_secret_and_a_later_epoch() -> None:
    h = Harness(RendezvousConfig(groups={GID: GroupConfig(1, CRED)}))
    h.aggregator("agg")
    first = only(h.endpoint("e0", world_size=1), "e0", JoinAccept)
    h.send("e0", Leave(group_id=GID, rank=0, code=ErrorCode.NO_ERROR))
    assert h.group().state is GroupState.CLOSED
    again = only(h.endpoint("e0", world_size=1), "e0", JoinAccept)
    assert isinstance(first, JoinAccept) and isinstance(again, JoinAccept)
    assert again.group_secret != first.group_secret and again.epoch > first.epoch
    h.check_state()


def test_forming_group_member_loss_frees_the_rank() -> None:
    h = Harness()
    h.endpoint("e0")
    h.endpoint("e1")
    cmds = h.feed(PeerDisconnected("e0", ErrorCode.PEER_LOST))
    assert sent_to(cmds, "e1") == []  # nothing to tell while the group forms
    accept = only(h.endpoint("e2"), "e2", JoinAccept)
    assert isinstance(accept, JoinAccept) and accept.rank == 0 and accept.epoch == 1


def test_roles_are_enforced() -> None:
    h = Harness()
    h.aggregator("agg")
    error = only(h.endpoint("agg"), "agg", Error)
    assert error == Error(code=ErrorCode.UNAUTHORIZED, detail="role AGGREGATOR may not send JoinRequest",
                          message_type=0x10)  # fmt: skip
    h.connect("e0", Role.ENDPOINT)
    register = AggregatorRegister(address=Address(host="x", port=1), capacity=1, max_fan_in=2, labels=())
    error = only(h.send("e0", register), "e0", Error)
    assert isinstance(error, Error) and error.code is ErrorCode.UNAUTHORIZED
    error = only(h.send("agg", register), "agg", Error)
    assert isinstance(error, Error) and error.code is ErrorCode.PROTOCOL_VIOLATION
    cmds = h.connect("rv2", Role.RENDEZVOUS)
    assert cmds == [ClosePeer("rv2", ErrorCode.UNAUTHORIZED, "role RENDEZVOUS has no business here")]
    cmds = h.feed(PeerConnected("dup", "agg", Role.AGGREGATOR))
    # a second node with a taken id hears why (so it can stop) before the close
    assert [type(c) for c in cmds] == [SendMessage, ClosePeer]
    refusal = cmds[0].message  # type: ignore[union-attr]
    assert isinstance(refusal, Error) and refusal.code is ErrorCode.UNAUTHORIZED
    assert refusal.detail == "agg is already connected"


def test_malformed_input_is_answered_and_the_connection_closed() -> None:
    h = Harness()
    active_group(h, aggregators=3)
    cmds = h.feed(MessageMalformed("e2", DecodeError(ErrorCode.MALFORMED_CBOR, "bad")))
    assert cmds[0] == SendMessage("e2", Error(code=ErrorCode.MALFORMED_CBOR, detail="bad"))
    assert cmds[1] == ClosePeer("e2", ErrorCode.MALFORMED_CBOR, "malformed message")
    tree = h.group().tree
    assert tree is not None and ranks_from_bitmap(tree.root.expected) == {0, 1, 3}
    h.check_state()


def test_configuration_bounds_are_inclusive() -> None:
    """The largest world and the smallest fan-in bound are valid; one beyond is not."""
    assert GroupConfig(world_size=MAX_WORLD_SIZE, credential=b"").world_size == MAX_WORLD_SIZE
    assert GroupConfig(world_size=1, credential=b"", max_fan_in=2).max_fan_in == 2
    assert RendezvousConfig(max_fan_in=2).max_fan_in == 2
    with pytest.raises(ValueError):
        GroupConfig(world_size=MAX_WORLD_SIZE + 1, credential=b"")


def test_a_random_source_giving_a_short_secret_is_refused() -> None:
    config = RendezvousConfig(groups={GID: GroupConfig(world_size=2, credential=CRED)})
    with pytest.raises(ValueError, match="31 bytes"):
        RendezvousMachine(config, random_bytes=lambda n: bytes(n - 1))
    assert RendezvousMachine(config, random_bytes=bytes).status().groups[0].group_id == GID


def test_a_member_of_a_group_with_a_shorter_interval_hears_from_the_rendezvous_at_that_one() -> None:
    """The endpoint times the rendezvous out by its group's interval, the only one it
    knows; so the rendezvous beats toward it at the shorter of its own and the group's
    (and still gives it the longer one before calling it lost)."""
    short = DEFAULT_PARAMS.heartbeat_interval_ms // 10
    params = GroupParams(chunk_elements=1024, window=2, heartbeat_interval_ms=short, operation_timeout_ms=900)
    h = Harness(RendezvousConfig(groups={GID: GroupConfig(4, CRED, params=params)}))
    h.connect("stranger", Role.ENDPOINT)  # a member of no group: the rendezvous's own interval
    h.endpoint("e0")
    beat = short / 1000
    beats: dict[str, int] = {"e0": 0, "stranger": 0}
    for _ in range(9):  # 0.9 of the rendezvous's own interval
        for cmd in h.tick(beat):
            if isinstance(cmd, SendMessage) and isinstance(cmd.message, Heartbeat):
                beats[cmd.peer] += 1
    assert beats == {"e0": 9, "stranger": 0}
