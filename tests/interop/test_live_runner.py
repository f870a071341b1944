"""``cco-interop live`` with our implementation in every role: every case passes;
a node variant that tampers with Results fails exactly the cases that rely on
honest aggregation; a node that exits 127 makes its cases unsupported, not failed;
an implementation given only as its command, whose endpoints draw their inputs
from interop/README.md without ``cco.workload``, passes beside ours.

These start real processes on loopback (about 80 s for the whole set on two
cores, the broken-variant and unsupported checks about 25 s more).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cco.interop import live

ROOT = Path(__file__).resolve().parents[2]
OURS = live.OUR_ADAPTER
TAMPERING = f"env CCO_INTEROP_FAULT=flip-result {OURS}"
INDEPENDENT = (
    f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).parent / 'independent_endpoint.py'))}"
)


def _case(name: str) -> live.Case:
    return next(c for c in live.CASES if c.name == name)


@pytest.mark.timeout(600)
def test_every_case_passes_with_our_implementation_in_every_role(tmp_path: Path) -> None:
    out = tmp_path / "matrix.json"
    result = subprocess.run(
        [sys.executable, "-m", "cco.interop.cli", "live", "--ci", "--json", str(out),
         "--workdir", str(tmp_path / "runs")],
        cwd=ROOT, capture_output=True, text=True, timeout=580,
    )  # fmt: skip
    matrix = json.loads(out.read_text())
    failed = [c for c in matrix["cases"] if c["outcome"] != live.PASSED]
    assert result.returncode == 0 and not failed, result.stdout[-3000:]
    assert {c["case"] for c in matrix["cases"]} == {c.name for c in live.CASES if c.ci}
    assert all(c["roles"] == dict.fromkeys(_case(c["case"]).roles, "cco") for c in matrix["cases"])
    assert "passed" in result.stdout  # the text matrix is printed too


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("case", "outcome"),
    [
        ("allreduce-small", live.FAILED),  # results come only through the tampering aggregator
        ("collectives", live.FAILED),
        ("join-refused", live.PASSED),  # no aggregator involved
        ("tamper", live.PASSED),  # the runner's own bad aggregator, whatever the implementation's
    ],
)
def test_a_tampering_aggregator_fails_exactly_the_cases_that_aggregate(
    tmp_path: Path, case: str, outcome: str
) -> None:
    roles = dict.fromkeys(_case(case).roles, "cco")
    if "aggregator" in roles:
        roles["aggregator"] = "bad"
    result = live.run_case(_case(case), roles, {"cco": OURS, "bad": TAMPERING}, tmp_path)
    assert result.outcome == outcome, result.reason
    if outcome == live.FAILED:
        assert "results differ" in result.reason or "exited with" in result.reason


@pytest.mark.timeout(120)
def test_exit_127_shows_as_unsupported_not_failed(tmp_path: Path) -> None:
    no_endpoint = tmp_path / "no_endpoint.sh"
    no_endpoint.write_text(f'#!/bin/sh\n[ "$ROLE" = endpoint ] && exit 127\nexec {OURS}\n')
    no_endpoint.chmod(0o755)
    out = tmp_path / "matrix.json"
    impl = f"partial={shlex.quote(str(no_endpoint))}"
    result = subprocess.run(
        [sys.executable, "-m", "cco.interop.cli", "live", "--impl", impl,
         "--case", "join-refused", "--case", "tamper", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    matrix = json.loads(out.read_text())
    assert result.returncode == 0, result.stdout  # unsupported is not failure
    assert [c["outcome"] for c in matrix["cases"]] == [live.UNSUPPORTED, live.UNSUPPORTED]
    assert matrix["summary"] == {"passed": 0, "failed": 0, "unsupported": 2}
    assert "does not support role endpoint" in matrix["cases"][0]["reason"]


def test_the_matrix_puts_every_implementation_in_every_role() -> None:
    combos = list(live.combinations(_case("handshake"), ["a", "b"]))
    assert len(combos) == 8 and len({tuple(c.values()) for c in combos}) == 8
    assert {"rendezvous": "a", "aggregator": "b", "endpoint": "a"} in combos
    outcome = live.Outcome("handshake", combos[1], live.FAILED, "why")
    text = live.matrix_text([outcome])
    assert "handshake" in text and "failed" in text and "ag=a" in text and "en=b" in text
    assert live.matrix_json([outcome])["summary"] == {"passed": 0, "failed": 1, "unsupported": 0}


def test_a_missing_results_file_or_a_wrong_digest_fails_the_judge(tmp_path: Path) -> None:
    """The judge trusts nothing an endpoint says except the bytes it must reproduce."""
    run = live.Run("join", tmp_path, {"endpoint": "x"}, {"x": "true"}, OURS)
    work = live.Workload(elements=10)
    nodes = []
    for rank in range(2):
        node = live.Node(f"ep-{rank}", "endpoint", "x", {"RESULTS": str(tmp_path / f"ep-{rank}.json")})
        node.proc = subprocess.Popen(["true"])
        node.proc.wait()
        nodes.append(node)
    with pytest.raises(live.CaseFailed, match="no results file"):
        live.judge_exact(run, nodes, work)
    good = live.expected.digests("allreduce", "int32", 10, 1, 0, 2)
    for rank, node in enumerate(nodes):
        Path(node.env["RESULTS"]).write_text(json.dumps({"rank": rank, "world_size": 2, "results": good}))
    live.judge_exact(run, nodes, work)  # both ranks have the same all-reduce result
    wrong = {k: "0" * 64 for k in good}
    Path(nodes[1].env["RESULTS"]).write_text(json.dumps({"rank": 1, "world_size": 2, "results": wrong}))
    with pytest.raises(live.CaseFailed, match="differ from the exact"):
        live.judge_exact(run, nodes, work)


@pytest.mark.timeout(600)
def test_an_implementation_given_only_as_its_command_interoperates(tmp_path: Path) -> None:
    """Its endpoints (tests/interop/independent_endpoint.py) compute every input from the
    README's definitions and fail on any import of cco.workload; beside ours, in every
    combination of the two, each case passes where it runs endpoints under our servers
    and is unsupported where it would be a server."""
    out = tmp_path / "matrix.json"
    result = subprocess.run(
        [sys.executable, "-m", "cco.interop.cli", "live", "--impl", f"cco={OURS}",
         "--impl", f"independent={INDEPENDENT}", "--case", "collectives", "--case", "allreduce-small",
         "--json", str(out), "--workdir", str(tmp_path / "runs")],
        cwd=ROOT, capture_output=True, text=True, timeout=580,
    )  # fmt: skip
    matrix = json.loads(out.read_text())
    assert result.returncode == 0, result.stdout[-3000:]
    for entry in matrix["cases"]:
        roles = entry["roles"]
        servers_ours = roles["rendezvous"] == roles["aggregator"] == "cco"
        assert entry["outcome"] == (live.PASSED if servers_ours else live.UNSUPPORTED), entry
    independent = [c for c in matrix["cases"] if c["roles"]["endpoint"] == "independent"]
    assert sorted(c["case"] for c in independent if c["outcome"] == live.PASSED) == [
        "allreduce-small",
        "collectives",
    ]
