"""The rendezvous machine in memory: a controlled clock, no sockets.

Draft section "Membership, Trees and Epochs" states the behaviour checked here.
Every batch of commands the machine returns passes through :meth:`Harness.feed`,
which checks the promises that hold for any input (keys never reach an aggregator,
every message encodes, epochs only grow per recipient, nothing is sent to a closed
connection); the tests then check what a particular input must do.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from rendezvous_harness import CRED, GID, INTERVAL, OTHER, Harness, only, sent_to
from strategies import ALL_MESSAGE_CLASSES, message_strategy

from cco.nodes.events import (
    ClosePeer,
    Command,
    Input,
    MessageMalformed,
    MessageReceived,
    PeerConnected,
    PeerDisconnected,
    SendMessage,
    TimerFired,
)
from cco.nodes.fsm import TransitionTable
from cco.nodes.rendezvous import MAY_SEND, GroupConfig, RendezvousConfig, RendezvousMachine
from cco.nodes.rendezvous_config import DEFAULT_PARAMS
from cco.nodes.rendezvous_records import chunk_elements_limit
from cco.nodes.rendezvous_states import (
    GROUP_TABLE,
    MEMBER_TABLE,
    PEER_EVENTS,
    PEER_TABLE,
    GroupState,
    PeerState,
    diagrams,
)
from cco.nodes.tree import PlanStrategy
from cco.wire.errors import DecodeError, ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import (
    MAC_MODULUS,
    MAX_CHUNK_ELEMENTS,
    MAX_TOTAL_ELEMENTS,
    MIN_BLOCK_ELEMENTS,
    Address,
    AggregatorAccept,
    AggregatorRegister,
    Capabilities,
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
    TreeAssignment,
    encode_message,
)
from cco.wire.registries import MAX_WORLD_SIZE, Collective, DType, ReduceOp, Role


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


# --- trees --------------------------------------------------------------------------------


def test_complete_group_gets_a_tree_aggregators_first_and_no_keys_for_aggregators() -> None:
    h = Harness()
    accept = only(h.aggregator("agg-a", fan_in=2, port=4001), "agg-a", AggregatorAccept)
    assert accept == AggregatorAccept(node_id="agg-a", heartbeat_interval_ms=1000)
    h.aggregator("agg-b", fan_in=2, port=4002)
    h.aggregator("agg-c", fan_in=2, port=4003)
    for i in range(3):
        assert not any(isinstance(m, TreeAssignment) for m in sent_to(h.endpoint(f"e{i}"), f"e{i}"))
    cmds = h.endpoint("e3")
    assignments = [(c.peer, c.message) for c in cmds if isinstance(c, SendMessage)
                   and isinstance(c.message, TreeAssignment)]  # fmt: skip
    assert [p for p, _ in assignments] == ["agg-c", "agg-a", "agg-b", "e0", "e1", "e2", "e3"]
    root = assignments[0][1]
    assert isinstance(root, TreeAssignment) and root.parent is None and root.epoch == 1
    assert ranks_from_bitmap(root.expected) == {0, 1, 2, 3}
    e0 = assignments[3][1]
    assert isinstance(e0, TreeAssignment) and e0.children == () and e0.expected == b"\x01"
    assert e0.parent is not None and e0.parent.node_id == "agg-a" and e0.parent.address.port == 4001
    assert h.group().state is GroupState.ACTIVE
    h.check_state()


def test_waiting_group_gets_its_tree_in_the_same_epoch_when_an_aggregator_arrives() -> None:
    h = Harness()
    for i in range(4):
        h.endpoint(f"e{i}")
    assert h.group().state is GroupState.WAITING
    cmds = h.aggregator("agg")
    assert not any(isinstance(c.message, EpochChange) for c in cmds if isinstance(c, SendMessage))
    assignment = only(cmds, "e2", TreeAssignment)
    assert isinstance(assignment, TreeAssignment) and assignment.epoch == 1
    h.check_state()


def test_capacity_is_shared_between_groups_and_freed_when_a_group_closes() -> None:
    config = RendezvousConfig(groups={GID: GroupConfig(1, CRED), OTHER: GroupConfig(1, CRED)})
    h = Harness(config)
    h.aggregator("agg", capacity=1)
    h.endpoint("e0", world_size=1)
    h.endpoint("e1", group=OTHER, world_size=1)
    assert h.group(OTHER).state is GroupState.WAITING
    (agg,) = h.rv.status().aggregators
    assert (agg.node_id, agg.capacity, agg.groups) == ("agg", 1, (GID,))
    h.check_state()
    cmds = h.send("e0", Leave(group_id=GID, rank=0, code=ErrorCode.NO_ERROR))
    assert h.group().state is GroupState.CLOSED
    change = only(cmds, "agg", EpochChange)
    assert isinstance(change, EpochChange) and change.members == b"" and change.epoch == 2
    assert isinstance(only(cmds, "e1", TreeAssignment), TreeAssignment)
    assert h.group(OTHER).state is GroupState.ACTIVE
    h.check_state()


def active_group(h: Harness, aggregators: int = 3, fan_in: int = 2) -> None:
    for i in range(aggregators):
        h.aggregator(f"agg-{i}", fan_in=fan_in, port=4000 + i)
    for i in range(4):
        h.endpoint(f"e{i}")
    assert h.group().state is GroupState.ACTIVE


# --- leave, loss, epochs ----------------------------------------------------------


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


# --- refusals -------------------------------------------------------------------------


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


SPEC_SECTION = Path(__file__).resolve().parents[2] / "spec" / "sections" / "membership.xml"


@pytest.mark.parametrize(
    ("anchor", "table"),
    [("fig-rv-peer", PEER_TABLE), ("fig-rv-group", GROUP_TABLE), ("fig-rv-member", MEMBER_TABLE)],
)
def test_draft_figures_equal_the_generated_diagrams(
    anchor: str, table: TransitionTable[Any, Any, Any]
) -> None:
    """The draft's state diagrams are the tables' output, so they cannot drift."""
    section = ElementTree.parse(SPEC_SECTION).getroot()
    assert section.get("anchor") == "membership"
    (figure,) = [f for f in section.iter("figure") if f.get("anchor") == anchor]
    artwork = figure.find("artwork")
    assert artwork is not None and artwork.text is not None
    expected = table.to_ascii()
    assert artwork.text.strip("\n") == expected, f"replace the artwork of {anchor} with:\n{expected}"


def test_diagrams_are_generated_from_the_tables() -> None:
    text = diagrams()
    for table in (PEER_TABLE, GROUP_TABLE, MEMBER_TABLE):
        assert table.to_ascii() in text
    assert max(len(line) for line in text.splitlines()) <= 69, "fits an RFC figure"


# --- every (state, input) pair ------------------------------------------------------

Scenario = Callable[[], tuple[Harness, str]]


def _endpoint_idle() -> tuple[Harness, str]:
    h = Harness()
    h.connect("p", Role.ENDPOINT)
    return h, "p"


def _endpoint_forming() -> tuple[Harness, str]:
    h = Harness()
    h.endpoint("p")
    return h, "p"


def _endpoint_waiting() -> tuple[Harness, str]:
    h = Harness()
    for peer in ("p", "e1", "e2", "e3"):
        h.endpoint(peer)
    return h, "p"


def _endpoint_active() -> tuple[Harness, str]:
    h = Harness()
    h.aggregator("agg-0", fan_in=4)
    for peer in ("p", "e1", "e2", "e3"):
        h.endpoint(peer)
    return h, "p"


def _endpoint_closed_group() -> tuple[Harness, str]:
    h = Harness()
    h.endpoint("p")
    h.send("p", Leave(group_id=GID, rank=0, code=ErrorCode.NO_ERROR))
    return h, "p"


def _aggregator_registering() -> tuple[Harness, str]:
    h = Harness()
    h.connect("p", Role.AGGREGATOR)
    return h, "p"


def _aggregator_idle() -> tuple[Harness, str]:
    h = Harness()
    h.aggregator("p")
    return h, "p"


def _aggregator_in_tree() -> tuple[Harness, str]:
    h, _ = _endpoint_active()
    return h, "agg-0"


SCENARIOS: dict[str, Scenario] = {
    "endpoint-idle": _endpoint_idle,
    "endpoint-forming": _endpoint_forming,
    "endpoint-waiting": _endpoint_waiting,
    "endpoint-active": _endpoint_active,
    "endpoint-closed-group": _endpoint_closed_group,
    "aggregator-registering": _aggregator_registering,
    "aggregator-idle": _aggregator_idle,
    "aggregator-in-tree": _aggregator_in_tree,
}


def _near_miss_join() -> st.SearchStrategy[Message]:
    """JoinRequests that hit the interesting checks, not just unknown groups."""
    return st.builds(
        lambda group, size, cred, rank, labels: JoinRequest(
            group_id=group,
            world_size=size,
            credential=cred,
            rank=None if rank is None else rank % size,
            labels=labels,
        ),
        st.sampled_from([GID, OTHER]),
        st.sampled_from([4, 3]),
        st.sampled_from([CRED, b"bad"]),
        st.none() | st.integers(0, 7),
        st.sampled_from([(), ("rack=1",)]),
    )


def _input_strategies(peer: str) -> dict[str, st.SearchStrategy[Input]]:
    kinds: dict[str, st.SearchStrategy[Input]] = {
        cls.__name__: message_strategy(cls).map(lambda m: MessageReceived(peer, m))
        for cls in ALL_MESSAGE_CLASSES
    }
    kinds["JoinRequest(near)"] = _near_miss_join().map(lambda m: MessageReceived(peer, m))
    kinds["Leave(near)"] = st.builds(
        lambda rank, code: MessageReceived(peer, Leave(group_id=GID, rank=rank, code=code)),
        st.integers(0, 4),
        st.sampled_from(list(ErrorCode)),
    )
    kinds["malformed"] = st.sampled_from(list(ErrorCode)).map(
        lambda code: MessageMalformed(peer, DecodeError(code, "x" * 2000))
    )
    kinds["disconnected"] = st.sampled_from(list(ErrorCode)).map(lambda code: PeerDisconnected(peer, code))
    kinds["timer"] = st.just(TimerFired())
    kinds["connected-again"] = st.sampled_from(list(Role)).map(
        lambda role: PeerConnected(peer, "someone", role)
    )
    kinds["connected-new"] = st.sampled_from(list(Role)).map(lambda role: PeerConnected("new", peer, role))
    kinds["unknown-peer"] = message_strategy(Heartbeat).map(lambda m: MessageReceived("ghost", m))
    return kinds


def _expected_refusal(h: Harness, peer: str, event: Input) -> ErrorCode | None:
    """What the tables say about a message from ``peer`` in its current state."""
    if not isinstance(event, MessageReceived) or event.peer != peer:
        return None
    role = h.roles[peer]
    kind = type(event.message)
    if kind not in MAY_SEND[role] and any(kind in allowed for allowed in MAY_SEND.values()):
        return ErrorCode.UNAUTHORIZED
    state = PeerState.ENDPOINT if role is Role.ENDPOINT else None
    if state is None:
        registered = any(a.node_id == peer for a in h.rv.status().aggregators)
        state = PeerState.AGGREGATOR if registered else PeerState.REGISTERING
    event = PEER_EVENTS.get(kind)
    if event is None or not PEER_TABLE.allows(state, event):
        return ErrorCode.PROTOCOL_VIOLATION
    return None


INPUT_KINDS = sorted(_input_strategies("p"))


@pytest.mark.parametrize("kind", INPUT_KINDS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_every_state_input_pair_is_handled_or_refused(scenario: str, kind: str, data: st.DataObject) -> None:
    """h2's discipline: any input in any state leaves valid states or a protocol error."""
    h, peer = SCENARIOS[scenario]()
    event = data.draw(_input_strategies(peer)[kind])
    refusal = _expected_refusal(h, peer, event)
    cmds = h.feed(event)  # must not raise; Harness.feed checks every command
    h.check_state()
    if refusal is not None:
        errors = [m for m in sent_to(cmds, peer) if isinstance(m, Error)]
        assert [e.code for e in errors] == [refusal]
        assert errors[0].message_type == int(event.message.TYPE)  # type: ignore[union-attr]
    elif isinstance(event, MessageReceived) and event.peer == peer:
        assert not any(
            isinstance(m, Error) and m.code is ErrorCode.PROTOCOL_VIOLATION for m in sent_to(cmds, peer)
        )


# --- random churn ----------------------------------------------------------------------

LABELS = st.sampled_from([(), ("rack=0",), ("rack=1",)])


class RendezvousChurn(RuleBasedStateMachine):
    """Random joins, leaves, losses and aggregator churn against the invariants."""

    def __init__(self) -> None:
        super().__init__()
        config = RendezvousConfig(
            groups={GID: GroupConfig(3, CRED), OTHER: GroupConfig(2, CRED, max_fan_in=2)},
            create_groups_on_join=True,
        )
        self.h = Harness(config)
        self.names = itertools.count()
        self.epochs: dict[bytes, int] = {}

    def _live(self, role: Role) -> list[str]:
        return sorted(p for p, r in self.h.roles.items() if r is role and p not in self.h.closed and p != "x")

    @initialize()
    def two_aggregators(self) -> None:
        self.add_aggregator(capacity=1, fan_in=2, labels=())
        self.add_aggregator(capacity=2, fan_in=3, labels=("rack=0",))

    @rule(capacity=st.integers(1, 3), fan_in=st.integers(2, 4), labels=LABELS)
    def add_aggregator(self, capacity: int, fan_in: int, labels: tuple[str, ...]) -> None:
        n = next(self.names)
        self.h.aggregator(f"agg-{n}", capacity=capacity, fan_in=fan_in, labels=labels, port=4000 + n)

    @precondition(lambda self: self._live(Role.AGGREGATOR))
    @rule(data=st.data(), malformed=st.booleans())
    def drop_aggregator(self, data: st.DataObject, malformed: bool) -> None:
        peer = data.draw(st.sampled_from(self._live(Role.AGGREGATOR)))
        if malformed:
            self.h.feed(MessageMalformed(peer, DecodeError(ErrorCode.TRAILING_BYTES, "junk")))
        else:
            self.h.feed(PeerDisconnected(peer, ErrorCode.PEER_LOST))

    @rule(
        data=st.data(),
        group=st.sampled_from([GID, OTHER, bytes(16)]),
        count=st.integers(1, 3),
        rank=st.none() | st.integers(0, 2),
        labels=LABELS,
        reuse=st.booleans(),
    )
    def join(
        self,
        data: st.DataObject,
        group: bytes,
        count: int,
        rank: int | None,
        labels: tuple[str, ...],
        reuse: bool,
    ) -> None:
        """One to three endpoints ask to join; an existing endpoint may join a second group."""
        size = {GID: 3, OTHER: 2}.get(group, 2)
        for _ in range(count):
            live = self._live(Role.ENDPOINT)
            peer = data.draw(st.sampled_from(live)) if reuse and live else f"ep-{next(self.names)}"
            self.h.endpoint(
                peer, group=group, world_size=size, rank=None if rank is None else rank % size, labels=labels
            )

    @precondition(lambda self: self._live(Role.ENDPOINT))
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        memberships = [(m.node_id, g.group_id, m.rank) for g in self.h.rv.status().groups for m in g.members]
        if memberships:
            peer, group, rank = data.draw(st.sampled_from(memberships))
            self.h.send(peer, Leave(group_id=group, rank=rank, code=ErrorCode.NO_ERROR))

    @precondition(lambda self: self._live(Role.ENDPOINT))
    @rule(data=st.data())
    def drop_endpoint(self, data: st.DataObject) -> None:
        self.h.feed(
            PeerDisconnected(data.draw(st.sampled_from(self._live(Role.ENDPOINT))), ErrorCode.PEER_LOST)
        )

    @rule(seconds=st.floats(0.1, 2.5), data=st.data())
    def time_passes(self, seconds: float, data: st.DataObject) -> None:
        """Everyone but a random few heartbeats; the timer then runs."""
        live = self._live(Role.ENDPOINT) + self._live(Role.AGGREGATOR)
        silent = data.draw(st.sets(st.sampled_from(live), max_size=1)) if live else set()
        self.h.now += seconds
        for peer in live:
            if peer not in silent:
                self.h.send(peer, Heartbeat(seq=int(self.h.now)))
        self.h.feed(TimerFired())

    @rule(data=st.data(), message=st.sampled_from(ALL_MESSAGE_CLASSES).flatmap(message_strategy))
    def stray_message(self, data: st.DataObject, message: Message) -> None:
        live = self._live(Role.ENDPOINT) + self._live(Role.AGGREGATOR)
        if live:
            self.h.send(data.draw(st.sampled_from(live)), message)

    @invariant()
    def invariants_hold(self) -> None:
        self.h.check_state()
        for g in self.h.rv.status().groups:
            assert g.epoch >= self.epochs.get(g.group_id, 0), "epochs never go back"
            self.epochs[g.group_id] = g.epoch


RendezvousChurn.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
test_rendezvous_churn = RendezvousChurn.TestCase


# --- advertised capabilities ---------------------------------------------------------

FULL = Capabilities(
    dtypes=tuple(DType),
    ops=tuple(ReduceOp),
    collectives=tuple(Collective),
    max_message_size=1 << 24,
    max_chunk_elements=MAX_CHUNK_ELEMENTS,
    extensions=(),
)
DEFAULT_CHUNK = DEFAULT_PARAMS.chunk_elements


def caps(**changes: Any) -> Capabilities:
    return dataclasses.replace(FULL, **changes)


def capable_endpoint(h: Harness, peer: str, capabilities: Capabilities | None, **join: Any) -> list[Command]:
    h.feed(PeerConnected(peer, peer, Role.ENDPOINT, capabilities))
    return h.endpoint(peer, **join)


def capable_aggregator(h: Harness, peer: str, capabilities: Capabilities | None) -> list[Command]:
    h.feed(PeerConnected(peer, peer, Role.AGGREGATOR, capabilities))
    register = AggregatorRegister(
        address=Address(host=f"{peer}.test", port=4000), capacity=1, max_fan_in=16, labels=()
    )
    return h.send(peer, register)


def chunk_sizes_sent(h: Harness, group: bytes = GID) -> set[int]:
    """chunk_elements of the last TreeAssignment sent to each peer of the current tree."""
    status = h.group(group)
    assert status.tree is not None
    peers = [m.node_id for m in status.members] + sorted(status.tree.aggregator_ids)
    found = set()
    for peer in peers:
        sent = h.last[(peer, TreeAssignment, group)]
        assert isinstance(sent, TreeAssignment) and sent.epoch == status.epoch
        assert dataclasses.replace(sent.params, chunk_elements=DEFAULT_CHUNK) == DEFAULT_PARAMS
        found.add(sent.params.chunk_elements)
    return found


def test_group_chunk_elements_is_at_most_every_members_max_chunk_elements() -> None:
    h = Harness()
    h.aggregator("a1")
    first = only(capable_endpoint(h, "e0", FULL), "e0", JoinAccept)
    assert isinstance(first, JoinAccept) and first.params.chunk_elements == DEFAULT_CHUNK
    small = only(capable_endpoint(h, "e1", caps(max_chunk_elements=1000)), "e1", JoinAccept)
    assert isinstance(small, JoinAccept) and small.params.chunk_elements == 1000
    capable_endpoint(h, "e2", None)  # no declared limit (an in-memory peer)
    capable_endpoint(h, "e3", caps(max_chunk_elements=DEFAULT_CHUNK))  # exactly the group's: no change
    assert h.group().state is GroupState.ACTIVE
    assert chunk_sizes_sent(h) == {1000}, "every node of the tree applies the lowered value"
    assert h.group().params.chunk_elements == 1000
    # The member with the small limit leaves: the next epoch goes back to the configured value.
    h.send("e1", Leave(group_id=GID, rank=1, code=ErrorCode.NO_ERROR))
    assert h.group().state is GroupState.ACTIVE
    assert chunk_sizes_sent(h) == {DEFAULT_CHUNK}


def test_group_chunk_message_fits_every_members_max_message_size() -> None:
    h = Harness()
    h.aggregator("a1")
    for i in range(3):
        capable_endpoint(h, f"e{i}", FULL)
    capable_endpoint(h, "e3", caps(max_message_size=4096))
    (chunk,) = chunk_sizes_sent(h)
    assert 400 <= chunk < 512, chunk  # 4096 bytes hold at most 512 8-byte elements
    assert len(encode_message(largest_chunk_message(chunk, 4, DEFAULT_PARAMS.block_elements))) <= 4096


def largest_chunk_message(chunk_elements: int, world_size: int, block_elements: int) -> Result:
    """The largest chunk message with ``chunk_elements`` 8-byte elements: block-scaled
    (scales and attestations), every header field at its largest, every rank a contributor."""
    blocks = -(-chunk_elements // block_elements)
    return Result(
        group_id=bytes(16),
        epoch=(1 << 64) - 1,
        op_id=(1 << 64) - 1,
        kind=Collective.REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.FLOAT64,
        scales=b"\xff" * 2 * blocks,
        total_elements=MAX_TOTAL_ELEMENTS,
        chunk_elements=chunk_elements,
        chunk_index=MAX_TOTAL_ELEMENTS // chunk_elements - 1,  # a full chunk
        contributors=bitmap_from_ranks(range(world_size)),
        width=8,
        payload=b"\xff" * 8 * (chunk_elements + blocks),
        tag=MAC_MODULUS - 1,
        root=world_size - 1,
        block_elements=block_elements,
    )


@pytest.mark.parametrize("world_size", [1, 4, 1000, MAX_WORLD_SIZE])
@pytest.mark.parametrize("block_elements", [MIN_BLOCK_ELEMENTS, 17, DEFAULT_PARAMS.block_elements])
@pytest.mark.parametrize("max_message_size", [1 << 14, 100_000, 1 << 20])
def test_chunk_elements_limit_is_the_largest_chunk_that_fits(
    world_size: int, block_elements: int, max_message_size: int
) -> None:
    """The bound is safe (the largest chunk message at the limit fits) and tight within
    the slack of CHUNK_HEADER_BOUND (32 more elements would not fit)."""
    limit = chunk_elements_limit(caps(max_message_size=max_message_size), world_size, block_elements)
    size = len(encode_message(largest_chunk_message(limit, world_size, block_elements)))
    assert size <= max_message_size
    assert (
        len(encode_message(largest_chunk_message(limit + 32, world_size, block_elements))) > max_message_size
    )
    assert chunk_elements_limit(caps(max_message_size=max_message_size, max_chunk_elements=7), 4, 16) == 7
    assert chunk_elements_limit(None, world_size, block_elements) == MAX_CHUNK_ELEMENTS


def test_aggregator_that_cannot_take_the_groups_chunks_is_not_placed() -> None:
    h = Harness()
    capable_aggregator(h, "a-small", caps(max_chunk_elements=DEFAULT_CHUNK - 1))
    for i in range(4):
        h.endpoint(f"e{i}")
    assert h.group().state is GroupState.WAITING, "a-small cannot take 65536-element chunks"
    assert not any(isinstance(m, TreeAssignment) for m in sent_to(h.log, "a-small"))
    capable_aggregator(h, "a-exact", caps(max_chunk_elements=DEFAULT_CHUNK))
    assert h.group().state is GroupState.ACTIVE
    assert h.group().tree.aggregator_ids == {"a-exact"}  # type: ignore[union-attr]
    # If the group's chunks shrink to what a-small takes, a-small becomes usable.
    h.feed(PeerDisconnected("a-exact", ErrorCode.PEER_LOST))
    assert h.group().state is GroupState.WAITING
    h.send("e3", Leave(group_id=GID, rank=3, code=ErrorCode.NO_ERROR))
    capable_endpoint(h, "e4", caps(max_chunk_elements=DEFAULT_CHUNK - 1))
    assert h.group().state is GroupState.ACTIVE
    assert h.group().tree.aggregator_ids == {"a-small"}  # type: ignore[union-attr]
    assert chunk_sizes_sent(h) == {DEFAULT_CHUNK - 1}


def test_aggregator_chunk_message_must_fit_its_max_message_size() -> None:
    h = Harness()
    capable_aggregator(h, "a-narrow", caps(max_message_size=8 * DEFAULT_CHUNK))  # no room for the header
    for i in range(4):
        h.endpoint(f"e{i}")
    assert h.group().state is GroupState.WAITING
    capable_aggregator(h, "a-wide", caps(max_message_size=9 * DEFAULT_CHUNK))
    assert h.group().tree.aggregator_ids == {"a-wide"}  # type: ignore[union-attr]


NARROW = caps(
    dtypes=(DType.INT32, DType.FLOAT32),
    ops=(ReduceOp.SUM, ReduceOp.MAX),
    collectives=(Collective.ALL_REDUCE, Collective.BARRIER),
)


@pytest.mark.parametrize(
    "lacking",
    [
        {"dtypes": (DType.INT32,)},
        {"ops": (ReduceOp.SUM,)},
        {"collectives": (Collective.ALL_REDUCE,)},
    ],
    ids=["dtype", "op", "collective"],
)
def test_aggregator_must_list_everything_all_members_list(lacking: dict[str, Any]) -> None:
    """The members' common dtypes, ops and collectives are what the group can run: an
    aggregator lacking any of them is not placed in the group's tree."""
    h = Harness()
    capable_aggregator(h, "a-lacking", dataclasses.replace(NARROW, **lacking))
    capable_endpoint(h, "e0", FULL)  # lists more than the others: the group needs only the common part
    for i in range(1, 4):
        capable_endpoint(h, f"e{i}", NARROW)
    assert h.group().state is GroupState.WAITING
    capable_aggregator(h, "a-fit", NARROW)
    assert h.group().state is GroupState.ACTIVE
    assert h.group().tree.aggregator_ids == {"a-fit"}  # type: ignore[union-attr]


def test_join_refused_when_no_chunk_message_fits_the_joiners_max_message_size() -> None:
    """At the smallest max_message_size (1024), a world of 6000 ranks leaves room for a
    one-element chunk (its contributors bitmap takes 750 bytes); 6008 ranks do not."""
    config = RendezvousConfig(
        groups={GID: GroupConfig(world_size=6000, credential=CRED), OTHER: GroupConfig(6008, CRED)}
    )
    h = Harness(config)
    tight = caps(max_message_size=1024)
    accept = only(capable_endpoint(h, "e0", tight, world_size=6000), "e0", JoinAccept)
    assert isinstance(accept, JoinAccept) and accept.params.chunk_elements == 1
    reject = only(capable_endpoint(h, "e1", tight, group=OTHER, world_size=6008), "e1", JoinReject)
    assert isinstance(reject, JoinReject) and reject.code is ErrorCode.MESSAGE_TOO_LARGE
    assert "max_message_size 1024" in reject.detail
    assert h.group(OTHER).members == (), "a rejected join changes nothing"


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
