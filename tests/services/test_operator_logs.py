"""What a rendezvous logs about its groups, over real QUIC: registrations, joins with
rank and epoch, the tree, a leave and a loss at INFO, none of them a warning; and the
same lines as JSON with their fields for a log shipper.  Only a Report of tampering is
a warning."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from pathlib import Path

import pytest
from quic_cluster import Cluster, run

from cco.logs import configure_logging
from cco.nodes.events import Happening, Report
from cco.services.reports import describe, log_report
from cco.transport import create_dev_pki
from cco.wire.registries import Role

GROUP = bytes.fromhex("ab" * 16)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    nodes = [("rendezvous", Role.RENDEZVOUS), ("agg-0", Role.AGGREGATOR)]
    create_dev_pki(directory, nodes + [(f"e-{i}", Role.ENDPOINT) for i in range(3)])
    return directory


def test_membership_is_logged_at_info_and_as_json_fields(pki: Path) -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream)

    async def whole() -> None:
        cluster = Cluster(pki, aggregators=1, max_fan_in=4)
        await cluster.start()
        try:
            comms = await cluster.join(GROUP, ["e-0", "e-1", "e-2"])
            await comms[2].close()  # leaves first: the group's next epoch has ranks 0 and 1
            await asyncio.sleep(0.2)
        finally:
            await cluster.close()

    try:
        run(whole)
    finally:
        logging.getLogger().handlers.clear()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    node = [line for line in lines if line["logger"] == "cco.node" and "event" in line]
    events = [(line["event"], line.get("peer"), line.get("rank"), line.get("epoch")) for line in node]
    assert events[0] == ("registered", "agg-0", None, None)
    joined = sorted((e[2], e[3]) for e in events if e[0] == "joined")
    assert joined == [(0, 1), (1, 1), (2, 1)]
    assert ("tree", None, None, 1) in events
    left = [line for line in node if line["event"] == "left"]
    assert len(left) == 3 and left[0]["group"] == GROUP.hex() and left[0]["rank"] == 2
    epoch = next(line for line in node if line["event"] == "epoch")
    assert epoch["epoch"] == 2 and epoch["message"].endswith("members [0, 1]")
    assert all(line["level"] == "info" for line in node)
    warnings = [line for line in lines if line["level"] in ("warning", "error", "critical")]
    assert warnings == [], warnings
    assert left[0]["message"] == f"left {left[0]['peer']} group {GROUP.hex()} rank 2 epoch 1"


@pytest.mark.parametrize("what", list(Happening))
def test_only_tampering_is_logged_as_a_warning(what: Happening, caplog: pytest.LogCaptureFixture) -> None:
    report = Report(what, "agg-1", group_id=GROUP, epoch=3, detail="a detail")
    with caplog.at_level(logging.INFO, logger="cco.node"):
        log_report(report)
    (record,) = caplog.records
    expected = logging.WARNING if what is Happening.TAMPERING else logging.INFO
    assert record.levelno == expected
    assert record.getMessage() == describe(report)
