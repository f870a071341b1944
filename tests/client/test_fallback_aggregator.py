"""Fallback to end hosts (issue 9), over real QUIC on 127.0.0.1.

Endpoints that run a :class:`~cco.client.FallbackAggregator` keep their group
working when no dedicated aggregator can: with the only dedicated aggregator gone,
the next all-reduce completes exactly on the end hosts' aggregators alone, and the
group moves back to a dedicated aggregator as soon as one registers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from quic_cluster import Cluster, run

from cco.client import Communicator, FallbackAggregator, GroupSpec
from cco.nodes.aggregator import AggregatorMachine
from cco.transport import create_dev_pki
from cco.wire.messages import GroupParams
from cco.wire.registries import Role

RELAXED = GroupParams(chunk_elements=1024, window=4, heartbeat_interval_ms=2000, operation_timeout_ms=60_000)
"""Heartbeats 2 s apart: the whole cluster (rendezvous, aggregators, three endpoints and
their fallback aggregators) shares this test's one event loop, and on a busy machine
0.6 s of silence (three 200 ms intervals) lost the fallback aggregators one by one.
Every loss this test makes is a closed connection, told at once."""

GROUP = bytes.fromhex("fb" * 16)
WORLD = 3


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    nodes = [("rendezvous", Role.RENDEZVOUS), ("agg-0", Role.AGGREGATOR), ("agg-1", Role.AGGREGATOR)]
    nodes += [(f"e-{i}", Role.ENDPOINT) for i in range(WORLD)]
    nodes += [(f"e-{i}.fallback", Role.AGGREGATOR) for i in range(WORLD)]
    create_dev_pki(directory, nodes)
    return directory


def test_a_group_runs_on_its_end_hosts_when_no_aggregator_can_and_moves_back(pki: Path) -> None:
    async def scenario() -> None:
        cluster = Cluster(pki, aggregators=1, params=RELAXED)
        await cluster.start()
        try:
            spec = GroupSpec(
                group_id=GROUP, world_size=WORLD, credential=b"pw", rendezvous=cluster.rendezvous
            )
            comms = await asyncio.gather(
                *[
                    Communicator.join(
                        spec,
                        f"e-{i}",
                        cluster.transport(f"e-{i}"),
                        timeout=20,
                        fallback=FallbackAggregator(
                            node_id=f"e-{i}.fallback", transport=cluster.transport(f"e-{i}.fallback")
                        ),
                    )
                    for i in range(WORLD)
                ]
            )
            cluster.communicators += comms
            ones = np.ones(1000, np.float32)

            async def all_reduce_is_exact() -> None:
                results = await asyncio.gather(*[c.all_reduce(ones) for c in comms])
                assert all(r.tolist() == [float(WORLD)] * 1000 for r in results)

            await all_reduce_is_exact()
            assert cluster.aggregator("agg-0").group_epoch(GROUP) is not None, (
                "the dedicated aggregator first"
            )
            epoch = comms[0].epoch
            dedicated = cluster.services.pop(1)  # the only dedicated aggregator goes away
            await dedicated.close()
            while any(c.epoch == epoch for c in comms):
                await asyncio.sleep(0.05)
            await all_reduce_is_exact()  # on the end hosts' aggregators alone
            hosts = [c._fallback.machine for c in comms if c._fallback is not None]
            assert any(
                isinstance(m, AggregatorMachine) and m.group_epoch(GROUP) == comms[0].epoch for m in hosts
            )
            epoch = comms[0].epoch
            await cluster.start_aggregator("agg-1")
            while any(c.epoch == epoch for c in comms):
                await asyncio.sleep(0.05)
            await all_reduce_is_exact()
            assert cluster.aggregator("agg-1").group_epoch(GROUP) == comms[0].epoch, "back on a dedicated one"
        finally:
            await cluster.close()

    run(scenario, timeout=120)
