"""The committed payload vectors are reproducible, hold, and cover every attack.

The checks in ``cco.interop.vectors_payload`` recompute each value from its
definition (``hmac``, ``hashlib``, AES and Python integers); here they run over
the committed files, and over tampered copies, which they must reject.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from cco.interop.generate import render
from cco.interop.vectors_payload import VECTOR_CHECKS, vector_files

ROOT = Path(__file__).resolve().parent.parent
VECTOR_DIR = ROOT / "interop" / "vectors"
FILES = vector_files()


def _committed(name: str) -> list[dict[str, Any]]:
    vectors: list[dict[str, Any]] = json.loads((VECTOR_DIR / name).read_text(encoding="utf-8"))
    return vectors


@pytest.mark.parametrize("name", sorted(FILES))
def test_committed_files_are_exactly_a_fresh_generation(name: str) -> None:
    assert (VECTOR_DIR / name).read_text(encoding="utf-8") == render(FILES[name])


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_committed_vector_holds(name: str) -> None:
    assert VECTOR_CHECKS[name](_committed(name)) == []


TAMPERING = [
    ("payload_keys.json", 0, ["k2"], "00" * 32),
    ("payload_tags.json", 0, ["coefficients", 1], 5),
    ("payload_tags.json", 2, ["tag"], 1),
    ("payload_tags.json", 1, ["pad_input"], "00"),
    ("payload_combine.json", 0, ["verification", "expected_tag"], 3),
    ("payload_combine.json", 1, ["verified_values", 0], 0),
    ("payload_verify_failures.json", 0, ["check"], "range"),
    ("payload_verify_failures.json", 3, ["error_code"], 0x23),
    ("fixed_point.json", 0, ["wire", 1], 1),
    ("fixed_point.json", 4, ["fail"], False),
]


@pytest.mark.parametrize(("name", "index", "path", "value"), TAMPERING)
def test_the_checks_reject_a_tampered_vector(name: str, index: int, path: list[Any], value: Any) -> None:
    vectors = copy.deepcopy(_committed(name))
    target: Any = vectors[index]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    problems = VECTOR_CHECKS[name](vectors)
    assert problems and all(p.startswith(vectors[index]["name"]) for p in problems)


def test_a_negative_vector_that_verifies_is_reported() -> None:
    vectors = copy.deepcopy(_committed("payload_verify_failures.json"))
    vectors[0]["message"] = vectors[0]["base"]
    assert VECTOR_CHECKS["payload_verify_failures.json"](vectors) == [f"{vectors[0]['name']}: was accepted"]


def test_negative_vectors_cover_every_attack_of_the_issue() -> None:
    by_name = {v["name"]: v for v in _committed("payload_verify_failures.json")}
    attacks = {
        "one element changed": "element_changed",
        "a contributor dropped without changing the bitmap": "contributor_dropped_bitmap_kept",
        "a contributor counted twice": "counted_twice",
        "a contribution from another epoch replayed": "replay_other_epoch",
        "a contribution from another operation replayed": "replay_other_operation",
        "a contribution from another group replayed": "replay_other_group",
        "two chunks swapped": "chunks_swapped",
        "a contributor added who did not contribute": "contributor_added",
        "a value shifted by a multiple of p": "value_shifted_by_p",
    }
    for attack, name in attacks.items():
        vector = by_name[name]
        assert vector["fail"] is True, attack
        assert vector["error_name"] == "VERIFICATION_FAILED", attack
    assert by_name["value_shifted_by_p"]["check"] == "range"
    assert all(v["fail"] is True and v["mutation"] for v in by_name.values())


def test_payload_md_describes_every_file() -> None:
    text = (ROOT / "interop" / "payload.md").read_text(encoding="utf-8")
    for name in FILES:
        assert f"`{name}`" in text, name
