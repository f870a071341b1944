"""A group whose nodes run different QUIC stacks, as real processes.

The rendezvous and the aggregators run on the default stack (qh3's native core),
the endpoints on pure-Python aioquic: the wire is the same, so the group forms, the
two-level tree carries verified all-reduces, and every rank gets the same result.
This also keeps the aioquic backend exercised end to end, beside the transport
tests that run on both.  The qh3 nodes log no error for an aioquic peer: qh3's
core once dropped part of a server's first flight to an aioquic client, with a
traceback and a probe timeout per connection (``qh3conn.py``, item 8).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cco.localcluster import ClusterSpec, LocalCluster
from cco.transport.config import QUIC_BACKEND_ENV


def test_endpoints_on_aioquic_work_with_infrastructure_on_qh3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the infrastructure takes the default stack even where the suite runs with
    # another one chosen in the environment
    monkeypatch.delenv(QUIC_BACKEND_ENV, raising=False)
    spec = ClusterSpec(
        aggregators=3,
        endpoints=4,
        max_fan_in=2,
        rounds=2,
        elements=1 << 16,
        chunk_elements=1 << 14,
        extra_endpoint_args=("--quic-backend", "aioquic"),
    )
    with LocalCluster(spec, tmp_path) as cluster:
        cluster.start()
        files = cluster.run_endpoints(timeout=120)
        logs = {name: cluster.log(name) for name in ("rendezvous", "agg-0", "agg-1", "ep-0", "ep-3")}
    assert "(QUIC qh3, store" in logs["rendezvous"]
    assert "QUIC qh3)" in logs["agg-0"]
    assert "QUIC aioquic)" in logs["ep-0"] and "QUIC aioquic)" in logs["ep-3"]
    for name in ("rendezvous", "agg-0", "agg-1"):
        assert "Traceback" not in logs[name] and "capacity exhausted" not in logs[name], logs[name][-2000:]
    reports = [json.loads(path.read_text()) for path in files]
    for round_index in range(spec.rounds):
        digests = {report["rounds"][round_index]["sha256"] for report in reports}
        assert len(digests) == 1, f"round {round_index}: ranks disagree"
