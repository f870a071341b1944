"""The committed payload vectors are reproducible, hold, and cover every attack.

The checks of the payload files' modules in ``cco.interop.vectorfiles``
recompute each value from its definition (``cco.interop.reference``: ``hmac``,
``hashlib``, AES, exact rationals and Python integers); here they run over the
committed files, and over tampered copies, which they must reject.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from cco.interop.generate import render
from cco.interop.vectorfiles import (
    block_scale,
    block_scale_failures,
    payload_combine,
    payload_keys,
    payload_tags,
    payload_verify_failures,
    wire_forms,
)

ROOT = Path(__file__).resolve().parents[2]
VECTOR_DIR = ROOT / "interop" / "vectors"
MODULES = [
    payload_keys,
    payload_tags,
    payload_combine,
    payload_verify_failures,
    wire_forms,
    block_scale,
    block_scale_failures,
]
FILES = {m.FILE: m.vectors() for m in MODULES}
VECTOR_CHECKS = {m.FILE: m.check for m in MODULES}


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
    ("wire_forms.json", 5, ["wire", 4], 0),  # float32 -0.0 given the key of +0.0
    ("wire_forms.json", 9, ["fail"], False),
    ("block_scale.json", 0, ["proposals", 2, 1], 20),
    ("block_scale.json", 0, ["agreed_scales", 0], 20),
    ("block_scale.json", 0, ["chunks", 0, "contributions", 1, "quantized", 3], 7),
    ("block_scale.json", 1, ["chunks", 0, "contributions", 0, "attestations", 0], 0),
    ("block_scale.json", 3, ["output_bits"], "00" * 80),
    ("block_scale.json", 0, ["chunks", 1, "key_m"], "00" * 32),
    ("block_scale.json", 2, ["scale_pass", 0, "result", "values", 0], -2),
    ("block_scale.json", 5, ["scale_pass", 1, "contributions", 1, "values", 0], 3),
    ("block_scale_failures.json", 4, ["check"], "tag"),
    ("block_scale_failures.json", 5, ["error_code"], 0x20),
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


def test_block_scale_failures_cover_every_attack_on_the_scales() -> None:
    by_name = {v["name"]: v for v in _committed("block_scale_failures.json")}
    checks = {
        "scale_lowered_unattested": ("VERIFICATION_FAILED", "attestation"),
        "scale_raised_in_scale_pass": ("VERIFICATION_FAILED", "consistency"),
        "children_given_different_scales": ("VERIFICATION_FAILED", "tag"),
        "children_given_different_scales_refused_by_aggregator": ("OPERATION_MISMATCH", None),
        "scales_on_values_form": ("INVALID_FIELD", None),
        "scales_wrong_length": ("INVALID_FIELD", None),
        "width_not_the_operations": ("OPERATION_MISMATCH", None),
        "attestation_sum_above_contributors": ("VERIFICATION_FAILED", "attestation"),
    }
    for name, (error, check) in checks.items():
        assert (by_name[name]["error_name"], by_name[name]["check"]) == (error, check), name


def test_payload_md_describes_every_file() -> None:
    text = (ROOT / "interop" / "payload.md").read_text(encoding="utf-8")
    for name in FILES:
        assert f"`{name}`" in text, name
