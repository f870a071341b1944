"""One EndpointMachine with a controlled clock, and helpers that play its rendezvous and
its parent: results built the way a tree would build them, from the session's own
sealed Contribution and chunks sealed for the other ranks with the group keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from cco.nodes.calls import CollectiveRequest, EndpointConfig, OperationError
from cco.nodes.endpoint import EndpointMachine
from cco.nodes.endpoint_states import (
    SessionState,
)
from cco.nodes.events import (
    Command,
    ConnectTo,
    Input,
    MessageReceived,
    OperationFailed,
    PeerConnected,
    SendMessage,
    TimerFired,
)
from cco.nodes.operation import Quorum
from cco.wire import payload
from cco.wire.blockscale import SCALE_MAX
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import (
    Address,
    BroadcastData,
    ChunkMessage,
    Contribution,
    GroupParams,
    JoinAccept,
    Message,
    NodeRef,
    Result,
    TreeAssignment,
)
from cco.wire.registries import Collective, DType, ReduceOp, Role

GROUP = bytes.fromhex("c3" * 16)

SECRET = bytes(range(100, 132))

KEYS = payload.derive_group_keys(SECRET, GROUP)

WORLD = 4

RANK = 1

PARAMS = GroupParams(chunk_elements=4, window=2, heartbeat_interval_ms=600_000, operation_timeout_ms=1000)

PARENT = NodeRef(
    node_id="leaf", address=Address(host="leaf.test", port=4433), ranks=bitmap_from_ranks([0, 1])
)

PARENT2 = NodeRef(node_id="leaf2", address=Address(host="leaf2.test", port=4433), ranks=PARENT.ranks)

M = TypeVar("M", bound=Message)


def sent(commands: list[Command], peer: str | None = None, kind: type[M] = Message) -> list[M]:  # type: ignore[assignment]
    return [
        c.message
        for c in commands
        if isinstance(c, SendMessage) and (peer is None or c.peer == peer) and isinstance(c.message, kind)
    ]


def failures(commands: list[Command]) -> list[OperationError]:
    out = []
    for c in commands:
        if isinstance(c, OperationFailed):
            assert isinstance(c.error, OperationError)
            out.append(c.error)
    return out


def tree(epoch: int = 1, parent: NodeRef = PARENT, params: GroupParams = PARAMS) -> TreeAssignment:
    return TreeAssignment(
        group_id=GROUP,
        epoch=epoch,
        world_size=WORLD,
        expected=bitmap_from_ranks([RANK]),
        children=(),
        params=params,
        parent=parent,
    )


def accept(params: GroupParams = PARAMS) -> JoinAccept:
    return JoinAccept(
        group_id=GROUP, rank=RANK, world_size=WORLD, epoch=1, group_secret=SECRET, params=params
    )


def others(
    message: ChunkMessage, values: Callable[[int, int], int] = lambda rank, i: rank
) -> list[ChunkMessage]:
    """The other ranks' chunks matching ``message`` (rank r sends values(r, i))."""
    header = payload.ChunkHeader.of(message)
    return [
        payload.seal(
            KEYS, header, r, np.array([values(r, i) for i in range(header.element_count)], dtype=np.int64)
        )
        for r in range(WORLD)
        if r != RANK
    ]


def result_for(
    message: ChunkMessage, values: Callable[[int, int], int] = lambda rank, i: rank
) -> ChunkMessage:
    """The Result a tree would return for this rank's Contribution."""
    return payload.combine([message, *others(message, values)], Result)


def root_chunks(
    values: np.ndarray, op_id: int, epoch: int = 1, *, dtype: DType = DType.INT64, chunk_elements: int = 4
) -> list[ChunkMessage]:
    """Rank 0's BroadcastData chunks of ``values``, as the root would seal them."""
    wire = payload.encode_values(values, dtype, Collective.BROADCAST, ReduceOp.SUM, WORLD)
    chunks = []
    for index in range(max(1, -(-wire.size // chunk_elements))):
        header = payload.ChunkHeader(
            group_id=GROUP,
            epoch=epoch,
            op_id=op_id,
            kind=Collective.BROADCAST,
            op=ReduceOp.SUM,
            dtype=dtype,
            total_elements=wire.size,
            chunk_elements=chunk_elements,
            chunk_index=index,
            root=0,
        )
        start = index * chunk_elements
        chunks.append(payload.seal(KEYS, header, 0, wire[start : start + chunk_elements], BroadcastData))
    return chunks


def int_header(op_id: int, epoch: int, total: int) -> payload.ChunkHeader:
    """Chunk 0 of an int32 SUM all-reduce of ``total`` elements."""
    return payload.ChunkHeader(
        group_id=GROUP,
        epoch=epoch,
        op_id=op_id,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.INT32,
        total_elements=total,
        chunk_elements=4,
        chunk_index=0,
    )


@dataclass
class Rig:
    """One endpoint session, its clock, and the peers the test plays."""

    machine: EndpointMachine = field(
        default_factory=lambda: EndpointMachine(
            EndpointConfig(group_id=GROUP, world_size=WORLD, credential=b"pw", rank=RANK, labels=("rack1",))
        )
    )
    now: float = 0.0
    parent: str | None = None

    def feed(self, event: Input) -> list[Command]:
        out = self.machine.handle(event, self.now)
        assert isinstance(self.machine.state, SessionState)
        return out

    def rendezvous(self, message: Message) -> list[Command]:
        return self.feed(MessageReceived("rv", message))

    def from_parent(self, message: Message) -> list[Command]:
        assert self.parent is not None
        return self.feed(MessageReceived(self.parent, message))

    def timer(self, at: float) -> list[Command]:
        self.now = at
        return self.feed(TimerFired())

    def start(self, request: CollectiveRequest) -> tuple[int, list[Command]]:
        return self.machine.start(request, self.now)

    def join(self, params: GroupParams = PARAMS) -> list[Command]:
        """IDLE -> READY; returns every command on the way."""
        out = self.feed(PeerConnected("rv", "rendezvous", Role.RENDEZVOUS))
        out += self.rendezvous(accept(params))
        dial = self.rendezvous(tree(params=params))
        (connect,) = [c for c in dial if isinstance(c, ConnectTo)]
        self.parent = connect.peer
        out += dial + self.feed(PeerConnected(connect.peer, "leaf", Role.AGGREGATOR))
        return out


def joined() -> Rig:
    rig = Rig()
    rig.join()
    return rig


def int_request(
    values: list[int], kind: Collective = Collective.ALL_REDUCE, **kw: object
) -> CollectiveRequest:
    return CollectiveRequest(kind=kind, array=np.array(values, dtype=np.int32), **kw)  # type: ignore[arg-type]


QUORUM = Quorum(min_ranks=1, wait=0.5)


def quorum_results(
    op_id: int, epoch: int, values: list[int], ranks: list[int], members: list[int] | None = None
) -> tuple[Result, Result]:
    """What the tree returns for a quorum all-reduce of int32 ``values`` (this rank's
    length) that ``ranks`` made in time, each sending its rank in every element: the
    presence pass's Result (op ``op_id``) and the data's (op ``op_id + 1``, over
    ``members``, by default ``ranks``)."""
    presence = dataclasses.replace(
        int_header(op_id, epoch, 1), dtype=DType.INT8, quorum=QUORUM.min_ranks, wait_ms=QUORUM.wait_ms
    )
    listed = bitmap_from_ranks(ranks if members is None else members)
    data = dataclasses.replace(int_header(op_id + 1, epoch, len(values)), members=listed)
    ones = [payload.seal(KEYS, presence, r, np.ones(1, dtype=np.int64)) for r in ranks]
    parts = [payload.seal(KEYS, data, r, np.full(data.element_count, r, dtype=np.int64)) for r in ranks]
    return payload.combine(ones, Result), payload.combine(parts, Result)  # type: ignore[return-value]


def tree_result(mine: ChunkMessage, others: dict[int, np.ndarray]) -> ChunkMessage:
    """What the tree returns for ``mine``: a root's BroadcastData itself; otherwise the
    Result combining it with the other ranks' wire integers ``others[rank]``.  In a
    scale pass the others propose the largest scale (so the agreed scales are this
    rank's); in block-scaled data they send zeros and attest nothing."""
    if isinstance(mine, BroadcastData):
        return mine
    header = payload.ChunkHeader.of(mine)
    start = header.chunk_index * header.chunk_elements
    if header.dtype is DType.INT16 and header.op is ReduceOp.MIN:
        others = {r: np.full(header.total_elements, SCALE_MAX, dtype=np.int64) for r in others}
    if header.block_elements is not None:
        parts = [payload.seal(KEYS, header, r, np.zeros(header.integer_count, np.int64)) for r in others]
    else:
        parts = [
            payload.seal(KEYS, header, r, wire[start : start + header.element_count])
            for r, wire in others.items()
        ]
    return payload.combine([mine, *parts], Result)


def after_the_scale_pass(rig: Rig, out: list[Command]) -> list[Contribution]:
    """Answer a block-scaled operation's scale pass (its first chunks, ``out``) as
    :func:`tree_result` does; the data chunks sent once its scales are agreed."""
    chunks = sent(out, rig.parent, Contribution)
    while chunks and chunks[0].dtype is DType.INT16:
        out = rig.from_parent(tree_result(chunks.pop(0), {r: np.zeros(0) for r in range(WORLD) if r != RANK}))
        chunks += sent(out, rig.parent, Contribution)
    return chunks
