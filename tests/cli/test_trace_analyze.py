"""Finding the rank a hung collective waits for: every node dumps its flight recorder
on SIGUSR1 and ``cco-node trace-analyze`` names the rank, the operation and the chunk.

The live case hangs a rank on purpose: a rendezvous, two aggregators in a two-level
tree and four endpoints running all-reduce rounds, as real processes; rank 1 (under
the leaf aggregator) is stopped with SIGSTOP in the middle of its rounds, every other
node is dumped, and the analysis must name rank 1 and the chunk the leaf aggregator
waits for first.  Heartbeats and operation timeouts are long, so that nothing gives
up on the stopped rank while the test looks at it; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cco.localcluster import ClusterSpec, LocalCluster
from cco.trace import analyze

GROUP = "c0" * 16


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def _aggregator(node: str, ranks: list[int], records: list[dict[str, object]]) -> dict[str, object]:
    return {
        "node_id": node,
        "role": "aggregator",
        "groups": [
            {"group_id": GROUP, "epoch": 1, "members": [], "tree": [{"node_id": node, "ranks": ranks}]}
        ],
        "records": records,
        "children": {GROUP: {str(r): f"ep-{r}" for r in ranks if r in (0, 1, 2)}} if node == "agg-1" else {},
    }


def _chunk(op_id: int, chunk: int, missing: list[int], state: str = "collecting") -> dict[str, object]:
    return {
        "group_id": GROUP,
        "epoch": 1,
        "op_id": op_id,
        "chunk_index": chunk,
        "kind": "all_reduce",
        "state": state,
        "elements": 4096,
        "missing": missing,
        "started_ms": 1000 + chunk,
        "updated_ms": 1000 + chunk,
    }


def test_the_deepest_waiting_aggregator_names_the_rank_and_its_first_chunk() -> None:
    root = _aggregator("agg-0", [0, 1, 2, 3], [_chunk(52, c, [0, 1, 2]) for c in (17, 18)])
    leaf = _aggregator(
        "agg-1", [0, 1, 2], [_chunk(52, 19, [1]), _chunk(52, 17, [1]), _chunk(52, 16, [], "sent up")]
    )
    endpoint = {
        "node_id": "ep-0",
        "role": "endpoint",
        "groups": [{"group_id": GROUP, "members": [{"rank": 0, "node_id": "ep-0"}], "tree": []}],
        "records": [{**_chunk(52, 17, [], "sent"), "chunk_index": None, "state": "running"}],
    }
    analysis = analyze([root, leaf, endpoint])
    (owed,) = analysis.owed
    assert (owed.rank, owed.node_id, owed.op_id, owed.chunk_index) == (1, "ep-1", 52, 17)
    assert (owed.waiting_node, owed.more_chunks, owed.dumped) == ("agg-1", 1, False)
    text = analysis.text()
    assert "rank 1 (ep-1) never sent chunk 17 of op 52" in text and "no dump from rank 1" in text
    # without the leaf's dump, the root's account is the deepest: ranks 0, 1 and 2 owe chunk 17
    assert [(o.rank, o.chunk_index, o.waiting_node) for o in analyze([root]).owed] == [
        (0, 17, "agg-0"),
        (1, 17, "agg-0"),
        (2, 17, "agg-0"),
    ]
    assert "no chunk waits for a rank" in analyze([]).text()
    assert "dump the aggregators" in analyze([endpoint]).text()


def test_a_rank_stopped_mid_all_reduce_is_named_with_the_chunk_it_owes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("STATE_DIRECTORY", str(state))  # where every node writes its dump
    spec = ClusterSpec(
        aggregators=2,
        endpoints=4,
        max_fan_in=3,  # four ranks: a root over a leaf aggregator with three of them
        rounds=10_000,
        elements=1 << 15,
        chunk_elements=2048,
        window=4,
        extra_rendezvous_args=("--heartbeat-ms", "60000", "--operation-timeout-ms", "600000"),
    )
    with LocalCluster(spec, tmp_path / "cluster") as cluster:
        cluster.start()
        ranks = [cluster.start_endpoint(i, tmp_path / f"r{i}.json") for i in range(4)]
        _wait_for(lambda: "round 3/" in cluster.log("ep-0"), 120, "the ranks run their rounds")
        leaf, victim = _leaf_and_rank(cluster.log("rendezvous"))
        ranks[victim].send_signal(signal.SIGSTOP)
        try:
            time.sleep(2.0)  # the others go on until they wait for rank 1
            others = ["rendezvous", "agg-0", "agg-1", *(f"ep-{r}" for r in range(4) if r != victim)]
            for name in others:
                if name.startswith("ep-"):
                    ranks[int(name[3:])].send_signal(signal.SIGUSR1)
                else:
                    cluster.infrastructure(name).send_signal(signal.SIGUSR1)
            for name in others:
                _wait_for(lambda n=name: "flight recorder:" in cluster.log(n), 30, f"{name} dumps")  # type: ignore[misc]
            dumps = sorted(state.glob("flight-*.json"))
            assert len(dumps) == len(others), [d.name for d in dumps]
            done = subprocess.run(
                [sys.executable, "-m", "cco", "trace-analyze", str(state)],
                capture_output=True,
                text=True,
                timeout=60,
                env={k: v for k, v in os.environ.items() if not k.startswith("CCO_")},
                check=False,
            )
        finally:
            ranks[victim].send_signal(signal.SIGCONT)
    assert done.returncode == 0, done.stderr
    leaf_dump = next(json.loads(d.read_text()) for d in dumps if d.name.startswith(f"flight-{leaf}-"))
    open_chunks = [
        r for r in leaf_dump["records"] if r["chunk_index"] is not None and r["state"] == "collecting"
    ]
    assert open_chunks and all(r["missing"] == [victim] for r in open_chunks)
    op_id, chunk = min((r["op_id"], r["chunk_index"]) for r in open_chunks)
    lines = done.stdout.splitlines()
    owed = [line for line in lines if line.startswith("rank ")]
    assert len(owed) == 1, lines
    assert owed[0].startswith(f"rank {victim} (ep-{victim}) never sent chunk {chunk} of op {op_id} "), lines
    assert f"{leaf} has waited for it" in owed[0] and f"no dump from rank {victim}" in owed[0]


def _leaf_and_rank(rendezvous_log: str) -> tuple[str, int]:
    """From the rendezvous's tree line: the leaf aggregator and the second rank below it."""
    line = next(line for line in rendezvous_log.splitlines() if f" tree group {GROUP} epoch " in line)
    levels = line.split(": ", 2)[-1].rsplit(" (", 1)[0].split("; ")
    for level in levels:
        node, children = level.split(" <- ")
        names = children.strip("[]").split(", ")
        if all(name.startswith("ep-") for name in names):
            return node, int(names[1][3:])
    raise AssertionError(f"no leaf aggregator in {line!r}")
