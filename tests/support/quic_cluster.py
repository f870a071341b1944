"""A rendezvous and aggregators over real QUIC in the test's event loop, for the
service and client tests: every message crosses a real UDP socket, TLS 1.3 and the
CCO framing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from cco.client import Communicator, GroupSpec
from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
from cco.nodes.rendezvous import RendezvousConfig, RendezvousMachine
from cco.services.node import NodeService
from cco.transport import TransportConfig
from cco.wire.messages import Address, GroupParams
from cco.wire.registries import Role

T = TypeVar("T")

FAST = GroupParams(chunk_elements=1024, window=4, heartbeat_interval_ms=200, operation_timeout_ms=1500)


def run(coroutine_factory: Callable[[], Awaitable[T]], timeout: float = 60.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coroutine_factory(), timeout)

    return asyncio.run(bounded())


class Cluster:
    """A rendezvous and aggregators in this event loop; endpoints join on demand."""

    def __init__(
        self,
        pki: Path,
        aggregators: int,
        max_fan_in: int = 4,
        params: GroupParams = FAST,
        capacity: int | None = None,
    ) -> None:
        """``capacity``: how many groups each aggregator serves at once (None: the default)."""
        self.pki = pki
        self.capacity = capacity
        self.params = params
        self.aggregators = aggregators
        self.max_fan_in = max_fan_in
        self.services: list[NodeService] = []
        self.communicators: list[Communicator] = []
        self.rendezvous = ""

    def transport(self, node_id: str) -> TransportConfig:
        return TransportConfig.for_node(self.pki, node_id, max_datagram_size=16000)

    async def start(self) -> None:
        machine = RendezvousMachine(RendezvousConfig(create_groups_on_join=True, params=self.params))
        rendezvous = NodeService(machine, "rendezvous", Role.RENDEZVOUS, self.transport("rendezvous"))
        host, port = await rendezvous.listen("127.0.0.1", 0)
        self.rendezvous = f"{host}:{port}"
        self.services.append(rendezvous)
        for i in range(self.aggregators):
            await self.start_aggregator(f"agg-{i}")

    async def start_aggregator(self, node_id: str) -> NodeService:
        """One more aggregator, registered with this cluster's rendezvous."""
        listening = NodeService(
            AggregatorMachine(AggregatorConfig(address=Address(host="127.0.0.1", port=1), max_fan_in=2)),
            node_id,
            Role.AGGREGATOR,
            self.transport(node_id),
        )
        # Bind first to learn the port, then give the machine its real address.
        _, agg_port = await listening.listen("127.0.0.1", 0)
        listening.runner.machine = AggregatorMachine(
            AggregatorConfig(
                address=Address(host="127.0.0.1", port=agg_port),
                max_fan_in=self.max_fan_in,
                **({} if self.capacity is None else {"capacity": self.capacity}),
            )
        )
        host, port = self.rendezvous.split(":")
        await listening.join_rendezvous(host, int(port), "rendezvous")
        self.services.append(listening)
        return listening

    def aggregator(self, node_id: str) -> AggregatorMachine:
        for service in self.services:
            if service.identity.node_id == node_id:
                machine = service.machine
                assert isinstance(machine, AggregatorMachine)
                return machine
        raise KeyError(node_id)

    async def join(self, group: bytes, names: list[str], world_size: int | None = None) -> list[Communicator]:
        spec = GroupSpec(
            group_id=group, world_size=world_size or len(names), credential=b"pw", rendezvous=self.rendezvous
        )
        comms = await asyncio.gather(
            *[Communicator.join(spec, name, self.transport(name), timeout=20) for name in names]
        )
        self.communicators += comms
        return sorted(comms, key=lambda c: c.rank)

    async def close(self) -> None:
        await asyncio.gather(*[c.close() for c in self.communicators], return_exceptions=True)
        for service in reversed(self.services):
            await service.close()
