"""Prometheus metrics over HTTP, scraped while a cluster on 127.0.0.1 runs all-reduces:
counters and histograms move at an endpoint and at the aggregator, the rendezvous's
gauges show the group, its members and epoch, and a refused join is counted by code."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from quic_cluster import Cluster, run

from cco.client import Communicator, GroupSpec
from cco.services.metrics import NodeMetrics
from cco.transport import create_dev_pki
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import GroupParams
from cco.wire.registries import Role

GROUP = bytes.fromhex("cd" * 16)
PARAMS = GroupParams(chunk_elements=1024, window=4, heartbeat_interval_ms=5000, operation_timeout_ms=60_000)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    nodes = [("rendezvous", Role.RENDEZVOUS), ("agg-0", Role.AGGREGATOR), ("late", Role.ENDPOINT)]
    create_dev_pki(directory, nodes + [(f"e-{i}", Role.ENDPOINT) for i in range(3)])
    return directory


def _scrape_now(address: tuple[str, int]) -> Samples:
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def scrape(address: tuple[str, int]) -> Samples:
    """Scrape from another thread, as Prometheus would, while this loop runs the nodes."""
    return await asyncio.to_thread(_scrape_now, address)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_and_histograms_move_during_all_reduces(pki: Path) -> None:
    async def scenario() -> None:
        cluster = Cluster(pki, aggregators=1, max_fan_in=4, params=PARAMS)
        await cluster.start()
        try:
            rendezvous, aggregator = cluster.services
            served = {}
            for name, service in (("rendezvous", rendezvous), ("agg-0", aggregator)):
                service.runner.metrics = NodeMetrics(service.runner)
                served[name] = service.runner.metrics.serve("127.0.0.1", 0)
            comms = await cluster.join(GROUP, ["e-0", "e-1", "e-2"])
            endpoint = comms[0].service
            endpoint.runner.metrics = NodeMetrics(endpoint.runner)
            served["e"] = endpoint.runner.metrics.serve("127.0.0.1", 0)

            before = {name: await scrape(address) for name, address in served.items()}
            data = [np.full(50_000, c.rank + 1, dtype=np.int32) for c in comms]
            running = asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, data, strict=True)))
            during = await scrape(served["agg-0"])  # while the all-reduce runs
            results = await running
            assert all(np.array_equal(r, np.full(50_000, 6)) for r in results)
            for _ in range(2):
                await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, data, strict=True)))
            spec = GroupSpec(group_id=GROUP, world_size=3, credential=b"wrong", rendezvous=cluster.rendezvous)
            with pytest.raises(CcoError) as refused:
                await Communicator.join(spec, "late", cluster.transport("late"), timeout=20)
            assert refused.value.code is ErrorCode.BAD_CREDENTIAL
            after = {name: await scrape(address) for name, address in served.items()}
        finally:
            await cluster.close()

        labels = {"kind": "all_reduce", "op": "sum", "dtype": "int32", "outcome": "completed"}
        for name in ("e", "agg-0"):
            assert value(before[name], "cco_collectives_total", **labels) == 0
            assert value(after[name], "cco_collectives_total", **labels) == 3, name
            assert value(after[name], "cco_operation_seconds_count", kind="all_reduce") == 3
            assert value(after[name], "cco_chunk_seconds_count") == 3 * 49  # 50000 elements in 1024s
        assert value(during, "cco_chunk_bytes_total", direction="up", way="received") <= value(
            after["agg-0"], "cco_chunk_bytes_total", direction="up", way="received"
        )
        sent_up = value(after["e"], "cco_chunk_bytes_total", direction="up", way="sent")
        assert sent_up >= 3 * 50_000  # three rounds, at least a byte an element (the width fits the values)
        assert value(after["agg-0"], "cco_chunk_bytes_total", direction="up", way="received") >= 3 * sent_up
        assert value(after["e"], "cco_chunk_bytes_total", direction="down", way="received") >= sent_up
        assert value(after["rendezvous"], "cco_groups") == 1
        assert value(after["rendezvous"], "cco_group_members", group=GROUP.hex()) == 3
        assert value(after["rendezvous"], "cco_group_epoch", group=GROUP.hex()) >= 1
        assert value(after["rendezvous"], "cco_aggregator_load", aggregator="agg-0", of="trees") == 1
        assert value(after["rendezvous"], "cco_join_rejections_total", code="BAD_CREDENTIAL") == 1
        assert value(after["rendezvous"], "cco_events_total", event="joined") == 3
        assert value(after["e"], "cco_peers") == 2  # the rendezvous and the aggregator
        assert value(after["e"], "cco_quic_rtt_seconds", peer="agg-0") > 0
        assert value(after["e"], "cco_group_epoch", group=GROUP.hex()) >= 1

    run(scenario, timeout=120)
