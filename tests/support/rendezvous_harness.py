"""The rendezvous machine under a controlled clock, for the node and store tests.

:class:`Harness` feeds the machine and checks, on every batch of commands, the
promises that hold for any input (keys never reach an aggregator, every message
encodes, epochs only grow per recipient, nothing is sent to a closed connection);
:class:`VersionedHarness` also restarts it from its durable state.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest

from cco.nodes.events import (
    ClosePeer,
    Command,
    Input,
    MessageReceived,
    PeerConnected,
    Report,
    SendMessage,
    TimerFired,
)
from cco.nodes.rendezvous import GroupConfig, RendezvousConfig, RendezvousMachine
from cco.nodes.rendezvous_config import DEFAULT_PARAMS, RESUME_REDIAL_GAP
from cco.nodes.rendezvous_durable import DurableState
from cco.nodes.rendezvous_states import (
    GroupState,
    MemberState,
)
from cco.nodes.rendezvous_status import GroupStatus
from cco.nodes.tree import ENDPOINT_ADDRESS, AggregatorInfo, MemberInfo, fan_in_bound, plan_tree
from cco.wire.errors import CcoError
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import (
    Address,
    AggregatorRegister,
    EpochChange,
    Heartbeat,
    JoinAccept,
    JoinRequest,
    Message,
    TreeAssignment,
    encode_message,
)
from cco.wire.registries import Role

GID = bytes(range(16))
OTHER = bytes(range(1, 17))
CRED = b"pw"
INTERVAL = DEFAULT_PARAMS.heartbeat_interval_ms / 1000.0


@dataclass
class Harness:
    """One rendezvous, a clock, and a record of everything it sent."""

    config: RendezvousConfig = field(
        default_factory=lambda: RendezvousConfig(groups={GID: GroupConfig(world_size=4, credential=CRED)})
    )
    now: float = 0.0
    roles: dict[str, Role] = field(default_factory=dict)
    closed: set[str] = field(default_factory=set)
    secrets: list[bytes] = field(default_factory=list)
    epochs_seen: dict[tuple[str, bytes], int] = field(default_factory=dict)
    last: dict[tuple[str, type[Message], bytes], Message] = field(default_factory=dict)
    log: list[Command] = field(default_factory=list)
    reports: list[Report] = field(default_factory=list)

    def __post_init__(self) -> None:
        counter = itertools.count(1)

        def random_bytes(n: int) -> bytes:
            secret = bytes([next(counter) % 256]) * n
            self.secrets.append(secret)
            return secret

        self.rv = RendezvousMachine(self.config, random_bytes=random_bytes)

    # --- driving -----------------------------------------------------------------

    def feed(self, event: Input) -> list[Command]:
        if isinstance(event, PeerConnected) and event.peer not in self.roles:
            self.roles[event.peer] = event.role
        everything = self.rv.handle(event, self.now)
        self.reports += [c for c in everything if isinstance(c, Report)]
        cmds = [c for c in everything if not isinstance(c, Report)]  # reports are for the logs
        self._check(cmds)
        self.log.extend(cmds)
        return cmds

    def tick(self, seconds: float) -> list[Command]:
        self.now += seconds
        return self.feed(TimerFired())

    def send(self, peer: str, message: Message) -> list[Command]:
        return self.feed(MessageReceived(peer, message))

    def connect(self, peer: str, role: Role, node_id: str | None = None) -> list[Command]:
        return self.feed(PeerConnected(peer, node_id or peer, role))

    def aggregator(
        self, peer: str, capacity: int = 1, fan_in: int = 16, labels: tuple[str, ...] = (), port: int = 4000
    ) -> list[Command]:
        self.connect(peer, Role.AGGREGATOR)
        register = AggregatorRegister(
            address=Address(host=f"{peer}.test", port=port),
            capacity=capacity,
            max_fan_in=fan_in,
            labels=labels,
        )
        return self.send(peer, register)

    def endpoint(
        self,
        peer: str,
        group: bytes = GID,
        world_size: int = 4,
        credential: bytes = CRED,
        rank: int | None = None,
        labels: tuple[str, ...] = (),
    ) -> list[Command]:
        if peer not in self.roles:
            self.connect(peer, Role.ENDPOINT)
        request = JoinRequest(
            group_id=group, world_size=world_size, credential=credential, rank=rank, labels=labels
        )
        return self.send(peer, request)

    def group(self, group_id: bytes = GID) -> GroupStatus:
        (status,) = [g for g in self.rv.status().groups if g.group_id == group_id]
        return status

    # --- checks on every batch ----------------------------------------------------

    def _check(self, cmds: list[Command]) -> None:
        closing: set[str] = set()
        for cmd in cmds:
            assert isinstance(cmd, SendMessage | ClosePeer), cmd
            assert cmd.peer in self.roles and cmd.peer not in self.closed, f"{cmd} to an unknown/closed peer"
            if isinstance(cmd, ClosePeer):
                closing.add(cmd.peer)
                continue
            assert cmd.peer not in closing, "nothing is sent after ClosePeer"
            encoded = encode_message(cmd.message)  # raises if any field is out of range
            if self.roles[cmd.peer] is not Role.ENDPOINT:
                assert not isinstance(cmd.message, JoinAccept)
                assert not any(secret in encoded for secret in self.secrets), "key material to an aggregator"
            self._check_epoch(cmd.peer, cmd.message)
            group_id = getattr(cmd.message, "group_id", b"")
            self.last[(cmd.peer, type(cmd.message), group_id)] = cmd.message
        self.closed |= closing

    def _check_epoch(self, peer: str, message: Message) -> None:
        if not isinstance(message, JoinAccept | EpochChange | TreeAssignment):
            return
        key = (peer, message.group_id)
        seen = self.epochs_seen.get(key)
        if seen is not None:
            if isinstance(message, EpochChange):
                assert message.epoch > seen, f"EpochChange {message.epoch} after {seen} to {peer}"
            else:
                assert message.epoch >= seen, f"{type(message).__name__} {message.epoch} after {seen}"
        self.epochs_seen[key] = message.epoch

    def check_state(self) -> None:
        """Invariants over the machine's whole state, via its public snapshot."""
        status = self.rv.status()
        use: dict[str, int] = {}
        for g in status.groups:
            assert g.state is not GroupState.PLANNING
            assert all(m.rank < g.world_size for m in g.members)
            assert len({m.node_id for m in g.members}) == len(g.members)
            assert len(g.members) <= g.world_size
            if g.state is GroupState.FORMING:
                assert g.tree is None and len(g.members) < g.world_size
            if g.state is GroupState.CLOSED:
                assert not g.members and g.tree is None
            if g.tree is None:
                assert all(m.state is MemberState.JOINED for m in g.members)
                continue
            assert g.state is GroupState.ACTIVE
            assert not g.tree.aggregator_ids & set(g.excluded), "an excluded aggregator in the tree"
            self._check_tree(g)
            for node_id in g.tree.aggregator_ids:
                use[node_id] = use.get(node_id, 0) + 1
        capacity = {a.node_id: a.capacity for a in status.aggregators}
        for node_id, count in use.items():
            assert count <= capacity[node_id], f"{node_id} over-subscribed"
        for g in status.groups:
            if g.state is GroupState.WAITING:
                pool = [
                    AggregatorInfo(a.node_id, a.address, a.capacity - len(a.groups), a.max_fan_in, a.labels)
                    for a in status.aggregators
                    if a.node_id not in g.excluded
                ]
                members = {m.rank: MemberInfo(m.node_id, m.labels) for m in g.members}
                with pytest.raises(CcoError):
                    plan_tree(members, pool, g.max_fan_in)

    def _check_tree(self, g: GroupStatus) -> None:
        tree = g.tree
        assert tree is not None
        members = {m.rank: m for m in g.members}
        info = {a.node_id: a for a in self.rv.status().aggregators}
        assert ranks_from_bitmap(tree.root.expected) == set(members)
        leaves: list[int] = []
        for p in tree.aggregators:
            a = info[p.node_id]
            bound = fan_in_bound(
                AggregatorInfo(a.node_id, a.address, 1, a.max_fan_in, a.labels), g.max_fan_in
            )
            assert len(p.children) <= bound
            leaves += [
                r for c in p.children if c.address == ENDPOINT_ADDRESS for r in ranks_from_bitmap(c.ranks)
            ]
            peer = self.peer_of(p.node_id)
            sent = self.last[(peer, TreeAssignment, g.group_id)]
            assert isinstance(sent, TreeAssignment)
            assert (sent.epoch, sent.expected, sent.children, sent.parent) == (
                g.epoch,
                p.expected,
                p.children,
                p.parent,
            )
        assert sorted(leaves) == sorted(members), "every member in exactly one leaf"
        for rank, m in members.items():
            assert m.state is MemberState.ASSIGNED
            sent = self.last[(self.peer_of(m.node_id), TreeAssignment, g.group_id)]
            assert isinstance(sent, TreeAssignment)
            assert sent.epoch == g.epoch
            assert sent.parent == tree.parent_of(rank) and sent.expected == bitmap_from_ranks([rank])

    def peer_of(self, node_id: str) -> str:
        return node_id  # the harness uses the node id as the peer id


def sent_to(cmds: Iterable[Command], peer: str) -> list[Message]:
    return [c.message for c in cmds if isinstance(c, SendMessage) and c.peer == peer]


def only(cmds: Iterable[Command], peer: str, kind: type[Message]) -> Message:
    (message,) = [m for m in sent_to(cmds, peer) if isinstance(m, kind)]
    return message


# --- join and rank assignment -----------------------------------------------------------


WINDOW = DEFAULT_PARAMS.loss_window
GRACE = WINDOW + RESUME_REDIAL_GAP


class VersionedHarness(Harness):
    """A harness that can restart its machine, and that checks durable_version."""

    def feed(self, event: Input) -> list[Command]:
        version, state = self.rv.durable_version, self.rv.durable_state()
        cmds = super().feed(event)
        if self.rv.durable_version == version:
            assert self.rv.durable_state() == state, f"durable state changed by {event} without a new version"
        return cmds

    def restart(self, downtime: float = 2.0) -> DurableState:
        """The process dies (every connection with it) and a new one starts from the
        durable state ``downtime`` seconds later."""
        state = self.rv.durable_state()
        self.now += downtime
        self.rv = RendezvousMachine.restored(state, self.now, self.config, random_bytes=self.rv._random)
        self.roles.clear()
        self.closed.clear()
        return state

    def live(self, seconds: float) -> list[Command]:
        """Let ``seconds`` pass in steps of half an interval, every connected peer
        sending its heartbeats; returns everything but heartbeats."""
        out: list[Command] = []
        steps = round(seconds / (INTERVAL / 2))
        for _ in range(steps):
            for peer in sorted(set(self.roles) - self.closed):
                self.send(peer, Heartbeat(seq=1))
            out += self.tick(seconds / steps)
        return [c for c in out if not isinstance(getattr(c, "message", None), Heartbeat)]

    def rejoin(self, peer: str, rank: int | None = None) -> list[Command]:
        return self.endpoint(peer, rank=rank)

    def reregister(self, peer: str, capacity: int = 1, port: int = 4000) -> list[Command]:
        return self.aggregator(peer, capacity=capacity, fan_in=3, port=port)


def formed(aggregators: int = 2) -> VersionedHarness:
    """Group GID of 4 members in a tree (aggregators of fan-in 3: two hold it, three make
    it a local tree with two leaves and a root)."""
    h = VersionedHarness(
        RendezvousConfig(groups={GID: GroupConfig(world_size=4, credential=CRED, max_fan_in=3)})
    )
    for i in range(aggregators):
        h.aggregator(f"a{i}", capacity=1, fan_in=3, port=4000 + i)
    for i in range(4):
        h.endpoint(f"e{i}")
    assert h.group().state is GroupState.ACTIVE
    h.check_state()
    return h
