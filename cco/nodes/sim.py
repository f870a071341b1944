"""An in-memory cluster of sans-I/O machines with a controlled clock.

The harness plays the I/O layer for any number of machines (rendezvous,
aggregators, endpoint sessions) so that whole protocols run in one process with no
sockets and no real time:

* a *connection* links two machines; each direction is a FIFO queue, like a QUIC
  stream: ``SendMessage`` appends to it, ``ClosePeer`` closes it after what is
  already queued, and killing a node drops what was on its way to it;
* ``ConnectTo`` is resolved by address to the machine listening there; both ends
  get ``PeerConnected`` with the other's authenticated node id and role (a wrong
  ``expected_node_id`` or a dead address gives the dialler ``PeerDisconnected``);
* deliveries are picked at random among the connections with something queued
  (seeded), and chunk messages may overtake each other on one connection, so tests
  see many arrival orders; control messages keep their order;
* with ``reencode`` every message goes through ``encode_message`` and
  ``decode_message``, so the codec is exercised by every run;
* ``faults(src, dst, message) -> copies`` drops (0) or duplicates (2+) messages;
* time stands still while messages are in flight and jumps to the earliest
  ``next_deadline()`` when nothing is, so timeouts cost no wall-clock time.

Local commands (``Joined``, ``OperationCompleted``, ``OperationFailed``) are
collected per node in :attr:`SimNode.outputs`.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
from cco.nodes.calls import CollectiveRequest, EndpointConfig
from cco.nodes.endpoint import EndpointMachine
from cco.nodes.endpoint_states import SessionState
from cco.nodes.events import (
    ClosePeer,
    Command,
    ConnectTo,
    Input,
    Joined,
    MessageReceived,
    OperationCompleted,
    OperationFailed,
    PeerConnected,
    PeerDisconnected,
    PeerId,
    SendMessage,
    TimerFired,
)
from cco.nodes.rendezvous import GroupConfig, RendezvousConfig, RendezvousMachine
from cco.wire.errors import ErrorCode
from cco.wire.messages import Address, ChunkMessage, GroupParams, Message, decode_message, encode_message
from cco.wire.registries import Role


class Machine(Protocol):
    """What the harness drives: every role machine has this shape."""

    def handle(self, event: Input, now: float) -> list[Command]: ...

    def next_deadline(self) -> float | None: ...


Faults = Callable[[str, str, Message], int]
"""(source node, destination node, message) -> how many copies to deliver."""


@dataclass(slots=True)
class SimNode:
    """One machine in the cluster and what it reported."""

    node_id: str
    role: Role
    machine: Machine
    address: Address | None
    alive: bool = True
    outputs: list[Command] = field(default_factory=list)

    @property
    def completed(self) -> dict[int, OperationCompleted]:
        return {c.op_id: c for c in self.outputs if isinstance(c, OperationCompleted)}

    @property
    def failed(self) -> dict[int, OperationFailed]:
        return {c.op_id: c for c in self.outputs if isinstance(c, OperationFailed)}

    @property
    def joined(self) -> Joined | None:
        return next((c for c in self.outputs if isinstance(c, Joined)), None)

    def finished(self, op_id: int) -> bool:
        return any(
            isinstance(c, OperationCompleted | OperationFailed) and c.op_id == op_id for c in self.outputs
        )


@dataclass(slots=True)
class _End:
    """One end of a connection: who is there and what it calls the connection."""

    node_id: str
    peer: PeerId


@dataclass(slots=True)
class _Link:
    """One direction of a connection: events queued for ``to``."""

    to: _End
    queue: deque[Input] = field(default_factory=deque)
    open: bool = True


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message the harness delivered, for tests that inspect the traffic."""

    time: float
    source: str
    destination: str
    message: Message


class Cluster:
    """The in-memory network, clock and event loop; see the module docstring."""

    def __init__(
        self,
        *,
        seed: int = 0,
        reencode: bool = True,
        reorder: bool = True,
        faults: Faults | None = None,
        now: float = 0.0,
        record: bool = False,
    ) -> None:
        self.now = now
        self.nodes: dict[str, SimNode] = {}
        self.reencode = reencode
        self.reorder = reorder
        self.faults = faults
        self.record = record
        self.deliveries: list[Delivery] = []
        self.steps = 0
        self._rng = random.Random(seed)
        self._links: list[_Link] = []
        self._routes: dict[tuple[str, PeerId], _Link] = {}  # (node, what it calls the peer) -> link out
        self._local: dict[str, deque[Input]] = {}
        self._accepted = 0

    # --- building ---------------------------------------------------------------

    def add(self, node_id: str, role: Role, machine: Machine, address: Address | None = None) -> SimNode:
        """Place a machine in the cluster; ``address`` makes it reachable by ConnectTo."""
        if node_id in self.nodes:
            raise ValueError(f"node {node_id} already exists")
        node = SimNode(node_id, role, machine, address)
        self.nodes[node_id] = node
        self._local[node_id] = deque()
        return node

    def connect(self, client: str, server: str) -> None:
        """Open a connection the I/O layer was configured to make (e.g. to the rendezvous)."""
        self._accepted += 1
        self._open(client, f"{server}#{self._accepted}", self.nodes[server])

    def kill(self, node_id: str) -> None:
        """The node stops: its peers see the connection drop, its inbound traffic is lost."""
        node = self.nodes[node_id]
        node.alive = False
        self._local[node_id].clear()
        for (owner, peer), link in list(self._routes.items()):
            if owner != node_id:
                continue
            del self._routes[(owner, peer)]
            link.open = False
            reverse = self._reverse(link)
            if reverse is not None:
                reverse.queue.clear()
                reverse.open = False
            link.queue.append(PeerDisconnected(link.to.peer, ErrorCode.PEER_LOST, f"{node_id} died"))
            self._routes.pop((link.to.node_id, link.to.peer), None)

    # --- local API calls ----------------------------------------------------------

    def call(self, node_id: str, action: Callable[[float], list[Command]]) -> None:
        """Run a local API call (``lambda now: machine.leave(now)``) and route its commands."""
        self._apply(node_id, action(self.now))

    def call_with_result(self, node_id: str, action: Callable[[float], tuple[int, list[Command]]]) -> int:
        """Like :meth:`call` for calls that also return a value, e.g. ``start``."""
        value, commands = action(self.now)
        self._apply(node_id, commands)
        return value

    # --- running ------------------------------------------------------------------

    def step(self) -> bool:
        """Deliver one queued event; False when nothing is queued."""
        if len(self._links) > 64 and any(not link.open and not link.queue for link in self._links):
            self._links = [link for link in self._links if link.open or link.queue]
        ready = [(node_id, queue) for node_id, queue in self._local.items() if queue]
        ready += [(link.to.node_id, link.queue) for link in self._links if link.queue]
        if not ready:
            return False
        node_id, queue = self._rng.choice(ready) if self.reorder else ready[0]
        event = self._take(queue)
        node = self.nodes[node_id]
        if node.alive:
            self.steps += 1
            self._apply(node_id, node.machine.handle(event, self.now))
        return True

    def advance(self, limit: float) -> bool:
        """Move the clock to the earliest deadline (not beyond ``limit``) and fire timers."""
        deadlines = [
            (d, n) for n in self.nodes.values() if n.alive and (d := n.machine.next_deadline()) is not None
        ]
        if not deadlines:
            return False
        when = max(self.now, min(d for d, _ in deadlines))
        if when > limit:
            return False
        self.now = when
        for deadline, node in sorted(deadlines, key=lambda x: x[1].node_id):
            if deadline <= self.now and node.alive:
                self._apply(node.node_id, node.machine.handle(TimerFired(), self.now))
                after = node.machine.next_deadline()
                if after is not None and after <= self.now:
                    raise RuntimeError(
                        f"{node.node_id} keeps asking for a timer at {after} <= now {self.now}"
                    )
        return True

    def run(
        self,
        until: Callable[[], bool] | None = None,
        *,
        duration: float = 60.0,
        max_steps: int = 10_000_000,
    ) -> bool:
        """Deliver and advance time until ``until()`` holds, nothing is left to do, or
        ``duration`` seconds of simulated time pass.  Returns ``until()`` (or True)."""
        limit = self.now + duration
        budget = max_steps
        while until is None or not until():
            if budget <= 0:
                raise RuntimeError(f"no quiescence after {max_steps} steps")
            budget -= 1
            if self.step():
                continue
            if not self.advance(limit):
                break
        return True if until is None else until()

    def settle(self) -> None:
        """Deliver everything in flight without moving the clock."""
        while self.step():
            pass

    # --- plumbing -----------------------------------------------------------------

    def _take(self, queue: deque[Input]) -> Input:
        if (
            self.reorder
            and isinstance(queue[0], MessageReceived)
            and isinstance(queue[0].message, ChunkMessage)
        ):
            run = 1
            while run < len(queue):
                head = queue[run]
                if not (isinstance(head, MessageReceived) and isinstance(head.message, ChunkMessage)):
                    break
                run += 1
            index = self._rng.randrange(run)
            queue.rotate(-index)
            event = queue.popleft()
            queue.rotate(index)
            return event
        return queue.popleft()

    def _reverse(self, link: _Link) -> _Link | None:
        return self._routes.get((link.to.node_id, link.to.peer))

    def _open(self, client: str, client_peer: PeerId, server: SimNode) -> None:
        source = self.nodes[client]
        self._accepted += 1
        server_peer = f"{client}#{self._accepted}"
        to_server = _Link(_End(server.node_id, server_peer))
        to_client = _Link(_End(client, client_peer))
        self._links += [to_server, to_client]
        self._routes[(client, client_peer)] = to_server
        self._routes[(server.node_id, server_peer)] = to_client
        to_server.queue.append(PeerConnected(server_peer, source.node_id, source.role))
        to_client.queue.append(PeerConnected(client_peer, server.node_id, server.role))

    def _apply(self, node_id: str, commands: list[Command]) -> None:
        node = self.nodes[node_id]
        for command in commands:
            if isinstance(command, SendMessage):
                self._send(node_id, command)
            elif isinstance(command, ConnectTo):
                self._dial(node_id, command)
            elif isinstance(command, ClosePeer):
                self._close(node_id, command)
            else:
                node.outputs.append(command)

    def _send(self, node_id: str, command: SendMessage) -> None:
        link = self._routes.get((node_id, command.peer))
        if link is None:
            return  # the connection is gone: the message is lost with it
        message = command.message
        if self.reencode:
            message = decode_message(encode_message(message))
        copies = 1 if self.faults is None else self.faults(node_id, link.to.node_id, message)
        for _ in range(copies):
            link.queue.append(MessageReceived(link.to.peer, message))
            if self.record:
                self.deliveries.append(Delivery(self.now, node_id, link.to.node_id, message))

    def _dial(self, node_id: str, command: ConnectTo) -> None:
        target = next(
            (n for n in self.nodes.values() if n.alive and n.address == command.address),
            None,
        )
        if target is None or target.node_id != command.expected_node_id:
            why = "nothing listens there" if target is None else f"certificate names {target.node_id}"
            code = ErrorCode.PEER_LOST if target is None else ErrorCode.UNAUTHORIZED
            self._local[node_id].append(PeerDisconnected(command.peer, code, why))
            return
        self._open(node_id, command.peer, target)

    def _close(self, node_id: str, command: ClosePeer) -> None:
        link = self._routes.pop((node_id, command.peer), None)
        if link is None:
            return
        reverse = self._reverse(link)
        if reverse is not None:
            reverse.queue.clear()
            reverse.open = False
        self._routes.pop((link.to.node_id, link.to.peer), None)
        link.queue.append(PeerDisconnected(link.to.peer, command.code, command.detail))


def sim_address(node_id: str) -> Address:
    """The address the harness gives a listening node."""
    return Address(host=f"{node_id}.sim.invalid", port=4433)


# --- a ready-made deployment --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """A group the rendezvous of :func:`build_cluster` knows, with its members' node ids."""

    group_id: bytes
    world_size: int
    credential: bytes = b"sim-credential"
    name: str = "g"

    def endpoint_id(self, rank: int) -> str:
        return f"{self.name}-ep{rank}"


@dataclass(slots=True)
class Deployment:
    """A cluster with one real rendezvous, aggregators and endpoint sessions."""

    cluster: Cluster
    groups: dict[bytes, GroupSpec]
    aggregators: tuple[str, ...]
    rendezvous: str = "rendezvous"

    def endpoint(self, group_id: bytes, rank: int) -> EndpointMachine:
        machine = self.cluster.nodes[self.groups[group_id].endpoint_id(rank)].machine
        assert isinstance(machine, EndpointMachine)
        return machine

    def aggregator(self, node_id: str) -> AggregatorMachine:
        machine = self.cluster.nodes[node_id].machine
        if not isinstance(machine, AggregatorMachine):
            inner = getattr(machine, "inner", None)  # a test wrapper around an aggregator
            assert isinstance(inner, AggregatorMachine)
            return inner
        return machine

    def endpoint_ids(self, group_id: bytes) -> list[str]:
        spec = self.groups[group_id]
        return [spec.endpoint_id(rank) for rank in range(spec.world_size)]

    def ready(self, group_id: bytes) -> bool:
        return all(self.endpoint(group_id, r).state is SessionState.READY for r in self._ranks(group_id))

    def start(self, group_id: bytes, requests: dict[int, CollectiveRequest]) -> dict[int, int]:
        """Start one collective on the given ranks (in rank order); their op_ids."""
        spec = self.groups[group_id]
        op_ids: dict[int, int] = {}
        for rank, request in sorted(requests.items()):
            start = partial(_start, self.endpoint(group_id, rank), request)
            op_ids[rank] = self.cluster.call_with_result(spec.endpoint_id(rank), start)
        return op_ids

    def outcomes(self, group_id: bytes, op_ids: dict[int, int]) -> dict[int, Command]:
        """The OperationCompleted or OperationFailed of each rank that has one."""
        spec = self.groups[group_id]
        out: dict[int, Command] = {}
        for rank, op_id in op_ids.items():
            node = self.cluster.nodes[spec.endpoint_id(rank)]
            result = node.completed.get(op_id) or node.failed.get(op_id)
            if result is not None:
                out[rank] = result
        return out

    def collective(
        self, group_id: bytes, requests: dict[int, CollectiveRequest], *, duration: float = 120.0
    ) -> dict[int, Command]:
        """Start a collective on the given ranks and run until each has an outcome."""
        op_ids = self.start(group_id, requests)
        self.cluster.run(lambda: len(self.outcomes(group_id, op_ids)) == len(op_ids), duration=duration)
        return self.outcomes(group_id, op_ids)

    def _ranks(self, group_id: bytes) -> range:
        return range(self.groups[group_id].world_size)


def _start(machine: EndpointMachine, request: CollectiveRequest, now: float) -> tuple[int, list[Command]]:
    return machine.start(request, now)


def build_cluster(
    groups: list[GroupSpec],
    *,
    aggregators: int,
    params: GroupParams,
    max_fan_in: int,
    seed: int = 0,
    reencode: bool = True,
    reorder: bool = True,
    faults: Faults | None = None,
    wrap: Callable[[str, AggregatorMachine], Machine] | None = None,
    aggregator_config: Callable[[str], AggregatorConfig] | None = None,
) -> Deployment:
    """A rendezvous, ``aggregators`` aggregators and every group's endpoints, joined.

    The aggregators register first, then every endpoint joins; the function returns
    once every endpoint is READY (or raises).  ``wrap`` lets a test put a machine
    around an aggregator (to tamper with what it sends, for instance).
    """
    cluster = Cluster(seed=seed, reencode=reencode, reorder=reorder, faults=faults)
    rng = random.Random(seed ^ 0x5EED)
    config = RendezvousConfig(
        groups={
            g.group_id: GroupConfig(world_size=g.world_size, credential=g.credential, params=params)
            for g in groups
        },
        params=params,
        max_fan_in=max_fan_in,
    )
    rendezvous = RendezvousMachine(config, random_bytes=rng.randbytes)
    cluster.add("rendezvous", Role.RENDEZVOUS, rendezvous, sim_address("rendezvous"))
    names = tuple(f"agg{i}" for i in range(aggregators))
    for node_id in names:
        agg_config = (
            aggregator_config(node_id)
            if aggregator_config
            else AggregatorConfig(address=sim_address(node_id), max_fan_in=max_fan_in)
        )
        aggregator = AggregatorMachine(agg_config)
        machine: Machine = wrap(node_id, aggregator) if wrap else aggregator
        cluster.add(node_id, Role.AGGREGATOR, machine, agg_config.address)
        cluster.connect(node_id, "rendezvous")
    cluster.settle()
    deployment = Deployment(cluster, {g.group_id: g for g in groups}, names)
    for spec in groups:
        for rank in range(spec.world_size):
            endpoint = EndpointMachine(
                EndpointConfig(
                    group_id=spec.group_id, world_size=spec.world_size, credential=spec.credential, rank=rank
                )
            )
            cluster.add(spec.endpoint_id(rank), Role.ENDPOINT, endpoint)
            cluster.connect(spec.endpoint_id(rank), "rendezvous")
    if not cluster.run(lambda: all(deployment.ready(g.group_id) for g in groups), duration=30.0):
        raise RuntimeError("the deployment did not become ready")
    return deployment


__all__ = [
    "Cluster",
    "Delivery",
    "Deployment",
    "Faults",
    "GroupSpec",
    "Machine",
    "SimNode",
    "build_cluster",
    "sim_address",
]
