"""The chunk size a float SUM's ranks agreed, as an operator and a benchmark see it over
real QUIC: a DEBUG line naming the operation when it differs from the planned one (as
a JSON line, with its fields), the ``cco_agreed_chunk_elements`` histogram at the
endpoint, and the client's ``last_chunk_elements``."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from quic_cluster import Cluster, run

from cco.logs import QUIC_LOGGER, configure_logging
from cco.nodes.endpoint import EndpointMachine
from cco.services.metrics import NodeMetrics
from cco.transport import create_dev_pki
from cco.wire.messages import GroupParams
from cco.wire.registries import Role

GROUP = bytes.fromhex("ce" * 16)
PARAMS = GroupParams(
    chunk_elements=1024,
    block_elements=256,
    scaled_chunk_elements=8192,
    window=4,
    heartbeat_interval_ms=5000,
    operation_timeout_ms=60_000,
)
ELEMENTS = 1 << 16
"""Per rank: a rank that has measured a fast path proposes an eighth of it, 8192
elements (the group's limit too), where the group plans 1024."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    nodes = [("rendezvous", Role.RENDEZVOUS), ("agg-0", Role.AGGREGATOR)]
    create_dev_pki(directory, nodes + [(f"e-{i}", Role.ENDPOINT) for i in range(3)])
    return directory


def histogram(address: tuple[str, int]) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=10) as response:
        text = response.read().decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "cco_agreed_chunk_elements"]
    return {
        sample.name + sample.labels.get("le", ""): sample.value
        for sample in family.samples
        if sample.name.endswith(("_count", "_sum")) or sample.labels.get("le") in ("4096.0", "8192.0")
    }


def test_an_agreed_chunk_size_is_logged_counted_and_read_by_the_client(pki: Path) -> None:
    stream = io.StringIO()
    levels = {name: logging.getLogger(name).level for name in ("", QUIC_LOGGER)}
    configure_logging("debug", "json", stream)
    seen: dict[str, object] = {}

    async def whole() -> None:
        cluster = Cluster(pki, aggregators=1, max_fan_in=4, params=PARAMS)
        await cluster.start()
        try:
            comms = await cluster.join(GROUP, ["e-0", "e-1", "e-2"])
            runner = comms[0].service.runner
            runner.metrics = NodeMetrics(runner)
            address = runner.metrics.serve("127.0.0.1", 0)
            seen["before"] = [c.last_chunk_elements for c in comms]
            for comm in comms:  # as if each had measured a fast path in an earlier call
                machine = comm.service.machine
                assert isinstance(machine, EndpointMachine) and machine.goodput is not None
                machine.goodput.value = 1e9
            data = [np.full(ELEMENTS, c.rank + 1, dtype=np.float32) for c in comms]
            results = await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, data, strict=True)))
            assert all(np.array_equal(r, np.full(ELEMENTS, 6, np.float32)) for r in results)
            seen["float"] = [c.last_chunk_elements for c in comms]
            seen["histogram"] = await asyncio.to_thread(histogram, address)
            ints = [np.full(ELEMENTS, c.rank, dtype=np.int32) for c in comms]
            await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, ints, strict=True)))
            seen["int"] = [c.last_chunk_elements for c in comms]
            seen["after ints"] = await asyncio.to_thread(histogram, address)
            runner.metrics.close()
        finally:
            await cluster.close()

    try:
        run(whole)
    finally:
        logging.getLogger().handlers.clear()
        for name, level in levels.items():  # as they were: DEBUG would slow the tests after this one
            logging.getLogger(name).setLevel(level)
    assert seen["before"] == [None] * 3
    assert seen["float"] == [8192] * 3
    assert seen["int"] == [1024] * 3  # not block-scaled: the group's chunk size
    assert seen["histogram"] == {
        "cco_agreed_chunk_elements_bucket4096.0": 0.0,
        "cco_agreed_chunk_elements_bucket8192.0": 1.0,
        "cco_agreed_chunk_elements_count": 1.0,
        "cco_agreed_chunk_elements_sum": 8192.0,
    }
    assert seen["after ints"] == seen["histogram"]  # only block-scaled operations count
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    agreed = [line for line in lines if line.get("event") == "chunk size agreed"]
    assert len(agreed) == 3  # one per rank; the integer all-reduce plans no agreement
    assert {(line["planned"], line["agreed"], line["proposed"], line["level"]) for line in agreed} == {
        (1024, 8192, 8192, "debug")
    }
    assert agreed[0]["message"] == (
        f"op {agreed[0]['op_id']}: chunks of 8192 elements agreed (planned 1024, this rank proposed 8192)"
    )
