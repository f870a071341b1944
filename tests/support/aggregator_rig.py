"""One AggregatorMachine with a controlled clock, and helpers that play its peers:
hand-made tree assignments, sealed chunks of chosen ranks, the commands it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
from cco.nodes.aggregator_states import NodeState
from cco.nodes.events import (
    Command,
    ConnectTo,
    Input,
    MessageReceived,
    PeerConnected,
    SendMessage,
    TimerFired,
)
from cco.wire import payload
from cco.wire.errors import ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import (
    Address,
    AggregatorAccept,
    ChunkMessage,
    Contribution,
    Error,
    GroupParams,
    Message,
    NodeRef,
    TreeAssignment,
)
from cco.wire.registries import Collective, DType, ReduceOp, Role

GROUP = bytes.fromhex("a1" * 16)

OTHER = bytes.fromhex("b2" * 16)

SECRET = bytes(range(32))

KEYS = {
    GROUP: payload.derive_group_keys(SECRET, GROUP),
    OTHER: payload.derive_group_keys(SECRET[::-1], OTHER),
}

PARAMS = GroupParams(chunk_elements=4, window=2, heartbeat_interval_ms=100, operation_timeout_ms=1000)

QUORUM_WAIT_MS = 200  # below half the operation timeout: no retransmission request first

ADDRESS = Address(host="agg.test", port=4433)

PARENT = NodeRef(
    node_id="root", address=Address(host="root.test", port=4433), ranks=bitmap_from_ranks(range(6))
)

PARENT2 = NodeRef(node_id="root2", address=Address(host="root2.test", port=4433), ranks=PARENT.ranks)


def ref(node_id: str, ranks: list[int]) -> NodeRef:
    return NodeRef(
        node_id=node_id, address=Address(host="endpoint.invalid", port=1), ranks=bitmap_from_ranks(ranks)
    )


def assignment(
    children: dict[str, list[int]],
    *,
    parent: NodeRef | None = None,
    epoch: int = 1,
    group: bytes = GROUP,
    params: GroupParams = PARAMS,
) -> TreeAssignment:
    ranks = sorted(r for rs in children.values() for r in rs)
    return TreeAssignment(
        group_id=group,
        epoch=epoch,
        world_size=8,
        expected=bitmap_from_ranks(ranks),
        children=tuple(ref(n, rs) for n, rs in children.items()),
        params=params,
        parent=parent,
    )


def chunk(
    rank: int,
    *,
    values: list[int] | None = None,
    op_id: int = 0,
    index: int = 0,
    total: int = 8,
    epoch: int = 1,
    group: bytes = GROUP,
    cls: type[ChunkMessage] = Contribution,
    kind: Collective = Collective.ALL_REDUCE,
    op: ReduceOp = ReduceOp.SUM,
    root: int | None = None,
    quorum: int | None = None,
    wait_ms: int = QUORUM_WAIT_MS,
    members: list[int] | None = None,
) -> ChunkMessage:
    """Rank ``rank``'s sealed chunk (by default its rank+1 repeated); with ``quorum``, of
    a presence pass; with ``members``, of an operation a presence pass decided."""
    header = payload.ChunkHeader(
        group_id=group,
        epoch=epoch,
        op_id=op_id,
        kind=kind,
        op=op,
        dtype=DType.INT32,
        total_elements=total,
        chunk_elements=PARAMS.chunk_elements,
        chunk_index=index,
        root=root,
        quorum=quorum,
        wait_ms=wait_ms if quorum is not None else None,
        members=bitmap_from_ranks(members) if members is not None else None,
    )
    count = header.element_count
    data = np.array(values if values is not None else [rank + 1] * count, dtype=np.int64)
    return payload.seal(KEYS[group], header, rank, data, cls)


@dataclass
class Rig:
    """One aggregator, a clock, and helpers that play its peers."""

    machine: AggregatorMachine = field(
        default_factory=lambda: AggregatorMachine(AggregatorConfig(address=ADDRESS, pending_timeout=2.0))
    )
    now: float = 0.0

    def feed(self, event: Input) -> list[Command]:
        out = self.machine.handle(event, self.now)
        assert isinstance(self.machine.state, NodeState)
        return out

    def register(self, heartbeat_ms: int = 600_000) -> list[Command]:
        """Registered with a rendezvous; heartbeats slow enough not to interfere by default."""
        out = self.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
        out += self.feed(
            MessageReceived("rv", AggregatorAccept(node_id="agg", heartbeat_interval_ms=heartbeat_ms))
        )
        return out

    def connect(self, *nodes: str, role: Role = Role.ENDPOINT) -> None:
        for node in nodes:
            assert self.feed(PeerConnected(node, node, role)) == []

    def rendezvous(self, message: Message) -> list[Command]:
        return self.feed(MessageReceived("rv", message))

    def send(self, peer: str, message: Message) -> list[Command]:
        return self.feed(MessageReceived(peer, message))

    def timer(self, at: float) -> list[Command]:
        self.now = at
        return self.feed(TimerFired())


M = TypeVar("M", bound=Message)


def sent(commands: list[Command], peer: str | None = None, kind: type[M] = Message) -> list[M]:  # type: ignore[assignment]
    return [
        c.message
        for c in commands
        if isinstance(c, SendMessage) and (peer is None or c.peer == peer) and isinstance(c.message, kind)
    ]


def errors(commands: list[Command], peer: str | None = None) -> list[ErrorCode]:
    return [m.code for m in sent(commands, peer, Error)]


def root_rig(children: dict[str, list[int]] | None = None) -> Rig:
    """A registered root aggregator for GROUP with endpoint children connected."""
    children = children or {"ep0": [0], "ep1": [1], "ep2": [2]}
    rig = Rig()
    rig.register()
    rig.connect(*children)
    rig.rendezvous(assignment(children))
    return rig


def leaf_rig(*, connect_parent: bool = True) -> tuple[Rig, str]:
    """A registered non-root aggregator (children ep0, ep1) and its parent peer id."""
    rig = Rig()
    rig.register()
    rig.connect("ep0", "ep1")
    out = rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}, parent=PARENT))
    (dial,) = [c for c in out if isinstance(c, ConnectTo)]
    assert dial.expected_node_id == "root" and dial.address == PARENT.address
    if connect_parent:
        assert rig.feed(PeerConnected(dial.peer, "root", Role.AGGREGATOR)) == []
    return rig, dial.peer
