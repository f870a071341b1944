"""``cco-interop vectors``: our adapter passes every vector; a broken one fails exactly
the vectors that exercise what it broke; a missing operation is unsupported, not failed."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cco.interop import adapter, vectormode

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "interop" / "vectors"
OURS = f"{shlex.quote(sys.executable)} -m cco.interop.adapter"
# Files whose checks ask the adapter to encode a message (messages directly, the
# others through the sealed messages they list); nothing else calls encode.
ENCODING_FILES = {"messages.json", "payload_tags.json", "block_scale.json"}
COMBINING_FILES = {"payload_combine.json", "block_scale.json"}


def _variant(tmp_path: Path, body: str) -> str:
    """A command running our adapter with ``body`` changing its operations ``ops``."""
    script = tmp_path / "variant.py"
    script.write_text(
        "import sys\nfrom cco.interop import adapter\nops = dict(adapter.OPERATIONS)\n"
        f"{body}\nadapter.serve(sys.stdin, sys.stdout, ops)\n",
        encoding="utf-8",
    )
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def _outcomes(reports: list[vectormode.FileReport]) -> dict[str, dict[str, str]]:
    return {r.file: r.outcomes for r in reports}


def test_our_adapter_passes_every_vector_through_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "vectors.json"
    result = subprocess.run(
        [sys.executable, "-m", "cco.interop.cli", "vectors", "--impl", OURS, "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(out.read_text())
    committed = {p.name for p in VECTORS.glob("*.json")}
    assert set(summary) == committed  # every vector file is fed to the adapter
    for file_name, counts in summary.items():
        total = len(json.loads((VECTORS / file_name).read_text()))
        assert (counts["passed"], counts["failed"], counts["unsupported"]) == (total, 0, 0), file_name
    assert "OK" in result.stdout


def test_an_adapter_flipping_a_bit_in_encoded_messages_fails_exactly_those_vectors(tmp_path: Path) -> None:
    command = _variant(
        tmp_path,
        "def flip(req):\n"
        "    data = bytearray.fromhex(adapter.op_encode(req)['message'])\n"
        "    data[-1] ^= 1\n"
        "    return {'message': data.hex()}\n"
        "ops['encode'] = flip",
    )
    outcomes = _outcomes(vectormode.run(command, VECTORS))
    for file_name, by_vector in outcomes.items():
        wanted = vectormode.FAILED if file_name in ENCODING_FILES else vectormode.PASSED
        assert set(by_vector.values()) == {wanted}, file_name


def test_an_adapter_without_combine_is_unsupported_there_and_passes_elsewhere(tmp_path: Path) -> None:
    out = tmp_path / "vectors.json"
    command = _variant(tmp_path, "del ops['combine']")
    result = subprocess.run(
        [sys.executable, "-m", "cco.interop.cli", "vectors", "--impl", command, "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout  # unsupported is not a failure
    summary = json.loads(out.read_text())
    for file_name in COMBINING_FILES:  # every vector of these files combines
        total = len(json.loads((VECTORS / file_name).read_text()))
        assert summary[file_name]["unsupported"] == total, file_name
    refusals = summary["payload_verify_failures.json"]["vectors"]
    listed = json.loads((VECTORS / "payload_verify_failures.json").read_text())
    stages = {v["name"]: v["stage"] for v in listed}
    for name, outcome in refusals.items():
        want = vectormode.UNSUPPORTED if stages[name] == "combine" else vectormode.PASSED
        assert outcome["outcome"] == want, name
    assert summary["messages.json"]["passed"] == len(json.loads((VECTORS / "messages.json").read_text()))
    assert sum(f["failed"] for f in summary.values()) == 0


def test_an_adapter_that_dies_fails_the_remaining_vectors_instead_of_hanging(tmp_path: Path) -> None:
    command = _variant(tmp_path, "def die(req):\n    raise SystemExit(3)\nops['keys'] = die")
    outcomes = _outcomes(vectormode.run(command, VECTORS, timeout=10))
    assert set(outcomes["messages.json"].values()) == {vectormode.PASSED}
    assert set(outcomes["payload_keys.json"].values()) == {vectormode.FAILED}
    assert set(outcomes["wire_forms.json"].values()) == {vectormode.FAILED}


@pytest.mark.parametrize(
    ("request_line", "key"),
    [
        ({"id": 1, "call": "teleport"}, "unsupported"),
        ({"id": 2, "call": "decode"}, "bad_request"),
        ({"id": 3, "call": "decode", "message": "ff"}, "error"),
        ({"id": 4, "call": "keys", "group_secret": "00" * 32, "group_id": "11" * 16}, "ok"),
    ],
)
def test_adapter_answers_every_request_with_one_typed_line(request_line: dict[str, Any], key: str) -> None:
    out = io.StringIO()
    adapter.serve(io.StringIO(json.dumps(request_line) + "\nnot json\n"), out)
    first, second = [json.loads(line) for line in out.getvalue().splitlines()]
    assert first["id"] == request_line["id"] and key in first
    assert "bad_request" in second
