"""A whole group in this process's event loop, for benchmarks that time the client.

A rendezvous that creates groups on first join, one aggregator and ``ranks`` joined
communicators, over real QUIC on loopback with a throwaway development PKI.  Every
node shares one event loop, so absolute times are not those of separate processes;
comparisons between two variants measured this way are what it is for.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from cco.client import Communicator, GroupSpec
from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
from cco.nodes.rendezvous import RendezvousConfig, RendezvousMachine
from cco.services.node import NodeService
from cco.transport import TransportConfig, create_dev_pki
from cco.wire.messages import Address, GroupParams
from cco.wire.registries import Role


@contextlib.asynccontextmanager
async def group_in_process(
    ranks: int, params: GroupParams, group_id: bytes
) -> AsyncIterator[list[Communicator]]:
    """The ``ranks`` communicators of a group served in this event loop, closed on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        pki = Path(tmp)
        nodes = [("rendezvous", Role.RENDEZVOUS), ("agg-0", Role.AGGREGATOR)]
        create_dev_pki(pki, nodes + [(f"ep-{i}", Role.ENDPOINT) for i in range(ranks)])

        def transport(node: str) -> TransportConfig:
            return TransportConfig.for_node(pki, node, max_datagram_size=16000)

        rendezvous = NodeService(
            RendezvousMachine(RendezvousConfig(create_groups_on_join=True, params=params)),
            "rendezvous",
            Role.RENDEZVOUS,
            transport("rendezvous"),
        )
        host, port = await rendezvous.listen("127.0.0.1", 0)
        # bind first to learn the port, then give the machine its real address
        aggregator = NodeService(
            AggregatorMachine(AggregatorConfig(address=Address(host=host, port=1))),
            "agg-0",
            Role.AGGREGATOR,
            transport("agg-0"),
        )
        _, agg_port = await aggregator.listen(host, 0)
        aggregator.runner.machine = AggregatorMachine(
            AggregatorConfig(address=Address(host=host, port=agg_port))
        )
        await aggregator.join_rendezvous(host, port, "rendezvous")
        spec = GroupSpec(group_id=group_id, world_size=ranks, credential=b"pw", rendezvous=f"{host}:{port}")
        comms: list[Communicator] = []
        try:
            comms = list(
                await asyncio.gather(
                    *[Communicator.join(spec, f"ep-{i}", transport(f"ep-{i}")) for i in range(ranks)]
                )
            )
            yield comms
        finally:
            await asyncio.gather(*[c.close(linger=False) for c in comms], return_exceptions=True)
            await aggregator.close()
            await rendezvous.close()
