"""spec/cco.cddl agrees with the codec, checked by two independent CDDL validators.

Every valid message in the vectors must validate against ``cco-message`` with
both pycddl (the Rust ``cddl`` crate) and zcbor (a Python implementation), and
every negative vector the schema can judge (``cddl_valid`` not null) must get the
verdict it claims.  The schema is also checked against the code directly: type
codes, map keys, field names, optionality and registry code points.

Each validator has false results on this schema; they are listed below with
what was observed, and handled so that the pair still covers every vector:

- pycddl 0.6.4 rejects every value against a range with a negative bound
  ("upper and lower values must be uint types").  Version 2 of the schema has
  no signed field any more (scales travel as a byte string), and the test
  below asserts that it stays so.
- pycddl 0.6.4 accepts keys beyond those defined in a map that is an array
  element, i.e. in every message body (nested maps are checked correctly).
- pycddl 0.6.4 does not check the entries of a group referenced after an absent
  optional entry of the same map (so the schema never places a group reference
  after an optional entry: chunk-data holds the optional scales, key 7, itself).
- zcbor 0.9.1 matches map entries in the order the schema lists them (so the
  schema lists them in ascending key order, the order of the wire).
- pycddl 0.6.4 ignores the base type under ``.size``: ``bstr .size 16`` accepts a
  16-byte text string, ``tstr .size (1..64)`` accepts an integer.
- zcbor 0.9.1 counts ``tstr .size`` in characters, not UTF-8 bytes.
- zcbor 0.9.1 accepts negative integers for ``uint`` (so the schema writes
  unsigned types as ranges such as ``0..4294967295``, which it checks).
- zcbor 0.9.1 imports ``cbor2.CBORDecodeValueError``, which cbor2 6 removed; it
  uses that name only when converting to YAML, so the alias below is harmless.

Known false accepts are expected failures (xfail) for that validator alone; the
other validator must reject the same vector.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
from collections.abc import Callable
from enum import IntEnum
from pathlib import Path
from typing import Any

import cbor2
import pycddl
import pytest

from cco.wire.errors import ErrorCode
from cco.wire.fields import Struct
from cco.wire.messages import MESSAGE_CLASSES, Address, Capabilities, ChunkMessage, GroupParams, NodeRef
from cco.wire.registries import Collective, DType, MessageType, ReduceOp, Role

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_TEXT = (ROOT / "spec" / "cco.cddl").read_text(encoding="utf-8")
VECTOR_DIR = ROOT / "interop" / "vectors"


Validator = Callable[[bytes], bool]

_UNKNOWN_KEYS = "pycddl 0.6.4 accepts undefined keys in a map that is an array element"
_SIZE_TYPE = "pycddl 0.6.4 does not check the base type under .size"
KNOWN_FALSE_ACCEPTS: dict[str, dict[str, str]] = {
    "pycddl": {
        "bytes-as-text": _SIZE_TYPE,
        "text-as-bytes": _SIZE_TYPE,
        "list-item-type": _SIZE_TYPE,
        "unknown-key": _UNKNOWN_KEYS,
        "unknown-key-after-last": _UNKNOWN_KEYS,
        "unknown-key-zero": _UNKNOWN_KEYS,
        "unknown-key-negative": _UNKNOWN_KEYS,
        "unknown-text-key": _UNKNOWN_KEYS,
    },
    "zcbor": {
        "node-id-long-utf8": "zcbor 0.9.1 counts tstr .size in characters, not UTF-8 bytes",
    },
}


def _load(name: str) -> list[dict[str, Any]]:
    vectors: list[dict[str, Any]] = json.loads((VECTOR_DIR / name).read_text(encoding="utf-8"))
    return vectors


POSITIVE = [(v["name"], bytes.fromhex(v["encoded"])) for v in _load("messages.json")] + [
    (v["name"], bytes.fromhex(v["message"])) for v in _load("framing.json") if not v.get("fail")
]
JUDGED = [v for v in _load("decode_failures.json") if v["cddl_valid"] is not None]


# --- the two validators, each built once -------------------------------------------------


def _pycddl_validator() -> Validator:
    assert not re.search(r"(?<![\w-])-\d+\s*\.\.", SCHEMA_TEXT), "pycddl 0.6.4 cannot read a negative range"
    schema = pycddl.Schema(SCHEMA_TEXT)

    def validate(data: bytes) -> bool:
        try:
            schema.validate_cbor(data)
        except pycddl.ValidationError:
            return False
        return True

    return validate


def _zcbor_validator() -> Validator:
    if not hasattr(cbor2, "CBORDecodeValueError"):
        cbor2.CBORDecodeValueError = cbor2.CBORDecodeError
    zcbor = importlib.import_module("zcbor")
    translator = zcbor.DataTranslator.from_cddl(SCHEMA_TEXT, 64).my_types["cco-message"]

    def validate(data: bytes) -> bool:
        try:
            # zcbor prints every alternative it tried when validation fails.
            with contextlib.redirect_stdout(io.StringIO()):
                translator.validate_str(data)
        except zcbor.CddlValidationError:
            return False
        return True

    return validate


@pytest.fixture(scope="module")
def validators() -> dict[str, Validator]:
    return {"pycddl": _pycddl_validator(), "zcbor": _zcbor_validator()}


VALIDATORS = ["pycddl", "zcbor"]


# --- verdicts on the vectors -----------------------------------------------------------


@pytest.mark.parametrize("validator", VALIDATORS)
@pytest.mark.parametrize(("name", "encoded"), POSITIVE, ids=[n for n, _ in POSITIVE])
def test_valid_message_matches_schema(
    validators: dict[str, Validator], validator: str, name: str, encoded: bytes
) -> None:
    assert validators[validator](encoded), f"{validator} rejects {name}"


@pytest.mark.parametrize("validator", VALIDATORS)
@pytest.mark.parametrize("vector", JUDGED, ids=[v["name"] for v in JUDGED])
def test_negative_vector_gets_its_stated_verdict(
    validators: dict[str, Validator], validator: str, vector: dict[str, Any]
) -> None:
    accepted = validators[validator](bytes.fromhex(vector["encoded"]))
    gap = KNOWN_FALSE_ACCEPTS[validator].get(vector["name"])
    if gap is not None and accepted:
        pytest.xfail(gap)
    assert accepted == vector["cddl_valid"]


def test_every_schema_invalid_vector_is_rejected_by_some_validator(validators: dict[str, Validator]) -> None:
    for vector in JUDGED:
        if vector["cddl_valid"] is False:
            data = bytes.fromhex(vector["encoded"])
            assert not all(v(data) for v in validators.values()), vector["name"]


@pytest.mark.parametrize(
    "name",
    [
        "uint-as-text",  # wrong type
        "uint-negative",
        "block-elements-over",  # out of range, above and below
        "block-elements-under",
        "tag-equals-modulus",
        "world-size-over",
        "width-three",  # not one of 1, 2, 4, 8
        "role-unregistered",  # not a code point
        "missing-only-field",
        "broadcast-op-max",  # the alternatives of chunk-body, by kind
        "barrier-dtype-float32",
        "type-unassigned",
    ],
)
def test_both_validators_can_fail(validators: dict[str, Validator], name: str) -> None:
    vector = next(v for v in JUDGED if v["name"] == name)
    assert vector["cddl_valid"] is False
    data = bytes.fromhex(vector["encoded"])
    assert [v(data) for v in validators.values()] == [False, False]


def test_no_known_gap_is_stale() -> None:
    judged = {v["name"] for v in JUDGED}
    for gaps in KNOWN_FALSE_ACCEPTS.values():
        assert set(gaps) <= judged


# --- the schema against the code ---------------------------------------------------------

# A map entry with the comment that names it on the line above: "; name: ..." then "? key => type".
_ENTRY = re.compile(r"^\s*;\s*([a-z0-9-]+):[^\n]*\n\s*(\?\s*)?(\d+)\s*=>", re.M)


def _rule(name: str) -> str:
    """The text of rule ``name``: from its definition to the next blank line."""
    match = re.search(rf"^{re.escape(name)} = (.*?)(?:\n\n|\Z)", SCHEMA_TEXT, re.M | re.S)
    assert match, f"rule {name} is not defined"
    return match.group(1)


def _entries(text: str) -> set[tuple[int, str, bool]]:
    return {(int(key), label.replace("-", "_"), bool(opt)) for label, opt, key in _ENTRY.findall(text)}


def _declared(cls: type[Struct]) -> set[tuple[int, str, bool]]:
    return {(spec.key, name, spec.optional) for name, spec in cls.wire_fields()}


def _rule_name(message_type: MessageType) -> str:
    return message_type.name.lower().replace("_", "-")


@pytest.mark.parametrize("message_type", list(MessageType), ids=[t.name for t in MessageType])
def test_schema_declares_each_message_as_the_code_does(message_type: MessageType) -> None:
    rule = _rule(_rule_name(message_type))
    assert rule.startswith(f"[{int(message_type)}, "), rule[:40]
    cls = MESSAGE_CLASSES[message_type]
    if issubclass(cls, ChunkMessage):
        shared = _rule("chunk-id") + _rule("chunk-data")
        alternatives = ["reduction-chunk", "pattern-chunk", "barrier-chunk"]
        assert _rule("chunk-body") == " / ".join(alternatives)
        for alternative in alternatives:  # every alternative defines the same keys, alike
            assert _entries(_rule(alternative) + shared) == _declared(cls), alternative
        entries = _entries(_rule(alternatives[0]) + shared)
    else:
        entries = _entries(rule)
    assert entries == _declared(cls)
    assert re.search(
        rf"/ {re.escape(_rule_name(message_type))}\b|= {re.escape(_rule_name(message_type))}\b",
        _rule("cco-message"),
    )


@pytest.mark.parametrize(
    ("rule", "cls"),
    [
        ("capabilities", Capabilities),
        ("address", Address),
        ("node-ref", NodeRef),
        ("group-params", GroupParams),
    ],
)
def test_schema_declares_each_structure_as_the_code_does(rule: str, cls: type[Struct]) -> None:
    assert _entries(_rule(rule)) == _declared(cls)


def _code_points(rule: str) -> dict[int, str]:
    return {
        int(code): label
        for code, label in re.findall(r"^\s*/?\s*(\d+)\s*;\s*([a-z0-9-]+)", _rule(rule), re.M)
    }


@pytest.mark.parametrize(
    ("rules", "enum"),
    [
        (["role"], Role),
        (["dtype"], DType),
        (["reduce-op"], ReduceOp),
        (["reduction", "broadcast", "all-gather", "barrier"], Collective),
        (["error-code"], ErrorCode),
    ],
)
def test_schema_registries_match_the_code(rules: list[str], enum: type[IntEnum]) -> None:
    points: dict[int, str] = {}
    for rule in rules:
        points |= _code_points(rule)
    assert points == {int(m): m.name.lower().replace("_", "-") for m in enum}
