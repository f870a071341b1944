"""The rendezvous's transition tables: the draft's figures are their output, every
(state, input) pair is handled or refused (h2's discipline), and random churn keeps
the invariants.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from rendezvous_harness import CRED, GID, OTHER, Harness, sent_to
from strategies import ALL_MESSAGE_CLASSES, message_strategy

from cco.nodes.events import (
    Input,
    MessageMalformed,
    MessageReceived,
    PeerConnected,
    PeerDisconnected,
    TimerFired,
)
from cco.nodes.fsm import TransitionTable
from cco.nodes.rendezvous import MAY_SEND, GroupConfig, RendezvousConfig
from cco.nodes.rendezvous_states import (
    GROUP_TABLE,
    MEMBER_TABLE,
    PEER_EVENTS,
    PEER_TABLE,
    PeerState,
    diagrams,
)
from cco.wire.errors import DecodeError, ErrorCode
from cco.wire.messages import (
    Error,
    Heartbeat,
    JoinRequest,
    Leave,
    Message,
    Report,
)
from cco.wire.registries import Role

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
    kinds["Report(near)"] = st.builds(
        lambda epoch, parent: MessageReceived(
            peer,
            Report(
                group_id=GID,
                epoch=epoch,
                op_id=0,
                code=ErrorCode.VERIFICATION_FAILED,
                parent=parent,
                detail="",
            ),
        ),
        st.integers(0, 3),
        st.sampled_from(["agg-0", "p", "elsewhere"]),
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

    @precondition(lambda self: self._live(Role.ENDPOINT))
    @rule(data=st.data(), stale=st.booleans())
    def report(self, data: st.DataObject, stale: bool) -> None:
        """A member reports its tree (or, ``stale``, the epoch before)."""
        reporters = [
            (m.node_id, g, m.rank)
            for g in self.h.rv.status().groups
            if g.tree is not None
            for m in g.members
            if m.connected
        ]
        if reporters:
            peer, group, rank = data.draw(st.sampled_from(reporters))
            assert group.tree is not None
            report = Report(
                group_id=group.group_id,
                epoch=group.epoch - stale,
                op_id=0,
                code=ErrorCode.VERIFICATION_FAILED,
                parent=group.tree.parent_of(rank).node_id,
                detail="",
            )
            cmds = self.h.send(peer, report)
            after = self.h.group(group.group_id)
            if stale:
                assert after.epoch == group.epoch, "a stale Report changes nothing"
                assert any(isinstance(m, Error) for m in sent_to(cmds, peer))
            else:
                # one new epoch, and one more when no tree fits without the reported path
                assert after.epoch == group.epoch + (1 if after.tree is not None else 2)
                assert group.tree.parent_of(rank).node_id in after.excluded

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
