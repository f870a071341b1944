"""The committed interop vectors hold for this implementation and are reproducible.

Each equation of interop/README.md is asserted directly here, vector by vector,
so a failure names the vector; the generator's own checks are exercised too,
through ``cco-interop check``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cco.interop import generate
from cco.interop.cli import main
from cco.interop.jsonform import JsonFormError, from_hex, limits_from_json, message_from_json, message_to_json
from cco.interop.rawcbor import encode_raw
from cco.wire import cbor
from cco.wire.errors import DecodeError, ErrorCode
from cco.wire.framing import FrameDecoder, encode_frame, encode_varint
from cco.wire.messages import MESSAGE_CLASSES, ChunkMessage, Message, decode_message, encode_message
from cco.wire.registries import MessageType

ROOT = Path(__file__).resolve().parents[2]
VECTOR_DIR = ROOT / "interop" / "vectors"


def _load(name: str) -> list[dict[str, Any]]:
    vectors: list[dict[str, Any]] = json.loads((VECTOR_DIR / name).read_text(encoding="utf-8"))
    return vectors


MESSAGES = _load("messages.json")
FAILURES = _load("decode_failures.json")
FRAMES = [v for v in _load("framing.json") if not v.get("fail")]
BAD_FRAMES = [v for v in _load("framing.json") if v.get("fail")]

# The codes the message decoder can raise, all of which the negative vectors must reach.
DECODER_CODES = {
    ErrorCode.MALFORMED_CBOR,
    ErrorCode.NON_DETERMINISTIC_ENCODING,
    ErrorCode.DUPLICATE_MAP_KEY,
    ErrorCode.TRAILING_BYTES,
    ErrorCode.MESSAGE_TOO_LARGE,
    ErrorCode.UNKNOWN_MESSAGE_TYPE,
    ErrorCode.INVALID_FIELD,
    ErrorCode.MISSING_FIELD,
    ErrorCode.UNKNOWN_FIELD,
}


def _ids(vectors: list[dict[str, Any]]) -> list[str]:
    return [v["name"] for v in vectors]


# --- reproducibility -------------------------------------------------------------------


def test_regenerating_into_a_directory_reproduces_the_committed_files(tmp_path: Path) -> None:
    written = generate.write(tmp_path)
    assert sorted(p.name for p in written) == sorted(p.name for p in VECTOR_DIR.glob("*.json"))
    for path in written:
        assert path.read_bytes() == (VECTOR_DIR / path.name).read_bytes(), path.name


def test_generation_is_deterministic() -> None:
    assert generate.build() == generate.build()


def test_cli_regenerates_into_a_temporary_directory_identical_to_the_committed_files(tmp_path: Path) -> None:
    """``cco-interop generate --out`` writes elsewhere: a test never rewrites the checkout."""
    result = subprocess.run(
        [sys.executable, "-m", "cco.interop.cli", "generate", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    committed = sorted(p.name for p in VECTOR_DIR.glob("*.json"))
    assert sorted(p.name for p in tmp_path.glob("*.json")) == committed
    for name in committed:
        assert (tmp_path / name).read_bytes() == (VECTOR_DIR / name).read_bytes(), name


# --- messages.json -----------------------------------------------------------------------


@pytest.mark.parametrize("vector", MESSAGES, ids=_ids(MESSAGES))
def test_message_vector(vector: dict[str, Any]) -> None:
    encoded = from_hex(vector["encoded"])
    expected = message_from_json(vector["message_type"], vector["fields"])
    decoded = decode_message(encoded)
    assert decoded == expected
    assert encode_message(expected) == encoded
    assert message_to_json(decoded) == vector["fields"]
    assert encoded == b"\x82" + cbor.encode(vector["message_type"]) + from_hex(vector["body_cbor"])
    assert from_hex(vector["framed"]) == encode_varint(len(encoded)) + encoded
    assert vector["message_name"] == MessageType(vector["message_type"]).name == decoded.TYPE.name


def test_every_message_type_has_a_vector() -> None:
    assert {MessageType(v["message_type"]) for v in MESSAGES} == set(MessageType)


def test_optional_fields_appear_both_present_and_absent() -> None:
    # The four chunk messages share one body, so they count as one family here.
    families: dict[type[Message], list[dict[str, Any]]] = {}
    for vector in MESSAGES:
        cls = MESSAGE_CLASSES[MessageType(vector["message_type"])]
        family = ChunkMessage if issubclass(cls, ChunkMessage) else cls
        families.setdefault(family, []).append(vector)
    for family, vectors in families.items():
        for name, spec in family.wire_fields():
            if spec.optional:
                presence = {name in v["fields"] for v in vectors}
                assert presence == {True, False}, f"{family.__name__}.{name}"


def test_rawcbor_encodes_plain_values_deterministically() -> None:
    for vector in MESSAGES:
        encoded = from_hex(vector["encoded"])
        assert encode_raw(cbor.decode(encoded)) == encoded, vector["name"]


# --- decode_failures.json --------------------------------------------------------------


@pytest.mark.parametrize("vector", FAILURES, ids=_ids(FAILURES))
def test_decode_failure_vector(vector: dict[str, Any]) -> None:
    assert vector["fail"] is True
    decode_message(from_hex(vector["base"]))
    assert from_hex(vector["base"]) == from_hex(
        next(v["encoded"] for v in MESSAGES if v["name"] == vector["base_vector"])
    )
    with pytest.raises(DecodeError) as caught:
        decode_message(from_hex(vector["encoded"]), limits_from_json(vector["limits"]))
    assert caught.value.code == vector["error_code"], caught.value
    assert ErrorCode(vector["error_code"]).name == vector["error_name"]


def test_decode_failures_reach_every_decoder_error_code() -> None:
    assert {ErrorCode(v["error_code"]) for v in FAILURES} == DECODER_CODES


# --- framing.json ----------------------------------------------------------------------


@pytest.mark.parametrize("vector", FRAMES, ids=_ids(FRAMES))
def test_frame_vector(vector: dict[str, Any]) -> None:
    message = from_hex(vector["message"])
    framed = from_hex(vector["framed"])
    limit = vector["max_message_size"]
    assert vector["message_length"] == len(message)
    assert from_hex(vector["length_prefix"]) == encode_varint(len(message))
    assert framed == from_hex(vector["length_prefix"]) + message == encode_frame(message, limit)
    assert FrameDecoder(limit).feed(framed) == [message]
    decoder = FrameDecoder(limit)
    assert [f for i in range(len(framed)) for f in decoder.feed(framed[i : i + 1])] == [message]
    decode_message(message)


@pytest.mark.parametrize("vector", BAD_FRAMES, ids=_ids(BAD_FRAMES))
def test_bad_frame_vector(vector: dict[str, Any]) -> None:
    with pytest.raises(DecodeError) as caught:
        FrameDecoder(vector["max_message_size"]).feed(from_hex(vector["framed"]))
    assert caught.value.code == vector["error_code"]
    assert ErrorCode(vector["error_code"]).name == vector["error_name"]


def test_frames_cover_every_varint_size_class_and_both_errors() -> None:
    assert {len(from_hex(v["length_prefix"])) for v in FRAMES} == {1, 2, 4}
    assert {v["error_code"] for v in BAD_FRAMES} == {ErrorCode.FRAMING_ERROR, ErrorCode.MESSAGE_TOO_LARGE}
    # The eight-byte class appears among the negatives (any such length exceeds 16 MiB).
    assert any(from_hex(v["framed"])[0] >> 6 == 3 for v in BAD_FRAMES)


# --- the command line ------------------------------------------------------------------


def test_check_accepts_the_committed_vectors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--dir", str(VECTOR_DIR)]) == 0
    assert "OK" in capsys.readouterr().out


def test_check_reports_a_tampered_vector(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path in VECTOR_DIR.glob("*.json"):
        shutil.copy(path, tmp_path / path.name)
    vectors = json.loads((tmp_path / "messages.json").read_text(encoding="utf-8"))
    vectors[0]["encoded"] = vectors[0]["encoded"][:-2] + "00"
    (tmp_path / "messages.json").write_text(generate.render(vectors), encoding="utf-8")
    assert main(["check", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert vectors[0]["name"] in err
    assert "messages.json: differs from a fresh generation" in err


def test_help_describes_both_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "generate" in out and "check" in out


# --- the JSON field form ---------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"seq": 1, "extra": 2},  # unknown name
        {},  # missing field
        {"seq": True},  # a boolean is not an integer
        {"seq": "1"},
    ],
)
def test_json_form_is_strict(fields: dict[str, Any]) -> None:
    with pytest.raises(JsonFormError):
        message_from_json(int(MessageType.HEARTBEAT), fields)


@pytest.mark.parametrize("text", ["0A", "0x0a", "0", "0a 0b", 10])
def test_hex_is_lowercase_without_prefix(text: object) -> None:
    with pytest.raises(JsonFormError):
        from_hex(text)


def test_every_cited_spec_section_exists_in_the_draft() -> None:
    """Vectors cite the draft section that governs them, by anchor; the anchor must exist."""
    import re

    spec = Path(__file__).resolve().parents[2] / "spec"
    anchors = set(re.findall(r'anchor="([^"]+)"', "".join(p.read_text() for p in spec.rglob("*.xml"))))
    vector_dir = Path(__file__).resolve().parents[2] / "interop" / "vectors"
    cited = 0
    for path in sorted(vector_dir.glob("*.json")):
        for vector in json.loads(path.read_text()):
            if "spec_section" in vector:
                cited += 1
                assert vector["spec_section"] in anchors, (path.name, vector["name"], vector["spec_section"])
    assert cited > 0
