"""The Internet-Draft builds, shows the normative CDDL verbatim, and agrees with the code.

xml2rfc runs once per module (about seven seconds): it writes the text and HTML
renderings and the expanded XML (every XInclude and ``sourcecode src`` resolved,
exactly as xml2rfc sees the document) into a temporary directory.  The tests read
the draft's tables from that expanded XML, so a code point, a message field or an
error code added to the code but not to the draft, or the reverse, fails here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

import pytest

from cco.wire.errors import ERROR_DESCRIPTIONS, ErrorCode
from cco.wire.fields import Struct
from cco.wire.messages import (
    MESSAGE_CLASSES,
    Address,
    AggregatorView,
    Capabilities,
    ChunkMessage,
    GroupParams,
    GroupView,
    MemberView,
    NodeRef,
    RecordView,
    TreeNodeView,
)
from cco.wire.registries import ALPN, Collective, DType, MessageType, ReduceOp, Role

SPEC = Path(__file__).resolve().parents[2] / "spec"
DRAFT = SPEC / "draft-cco-protocol.xml"
CDDL = SPEC / "cco.cddl"


@dataclass(frozen=True)
class Build:
    returncode: int
    log: str
    text: Path
    html: Path
    expanded: Path


def _xml2rfc() -> str:
    """The venv's xml2rfc (a test dependency), else one on PATH."""
    beside = Path(sys.executable).parent / "xml2rfc"
    if beside.exists():
        return str(beside)
    found = shutil.which("xml2rfc")
    if found is None:
        pytest.fail("xml2rfc is not installed; it is a test dependency (pip install -e '.[test]')")
    return found


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    out = tmp_path_factory.mktemp("draft")
    result = subprocess.run(
        [_xml2rfc(), "--allow-local-file-access", "--no-network",
         "--text", "--html", "--expand", "-p", str(out), str(DRAFT)],
        capture_output=True, text=True, timeout=300, cwd=SPEC,
    )  # fmt: skip
    stem = DRAFT.stem
    return Build(
        returncode=result.returncode,
        log=result.stdout + result.stderr,
        text=out / f"{stem}.txt",
        html=out / f"{stem}.html",
        expanded=out / f"{stem}.exp.xml",
    )


@pytest.fixture(scope="module")
def document(build: Build) -> ET.Element:
    assert build.returncode == 0, build.log
    return ET.parse(build.expanded).getroot()


# --- build -----------------------------------------------------------------------


def test_draft_builds_to_text_and_html(build: Build) -> None:
    assert build.returncode == 0, build.log
    assert not re.search(r"\bError:", build.log), build.log
    for rendering in (build.text, build.html):
        assert rendering.stat().st_size > 10_000, f"{rendering.name} is (nearly) empty"
    assert "draft-cco-protocol" in build.text.read_text(encoding="utf-8")


def test_draft_builds_without_warnings(build: Build) -> None:
    warnings = [line for line in build.log.splitlines() if "Warning:" in line]
    assert not warnings, f"{len(warnings)} xml2rfc warnings, first:\n" + "\n".join(warnings[:10])


# --- the CDDL appendix -------------------------------------------------------------


def test_draft_shows_the_cddl_file_verbatim(document: ET.Element) -> None:
    blocks = [e for e in document.iter("sourcecode") if e.get("type") == "cddl"]
    assert len(blocks) == 1, "the draft has exactly one CDDL block"
    assert blocks[0].get("originalSrc") == CDDL.name, "the CDDL block is included from cco.cddl"
    shown = (blocks[0].text or "").rstrip("\n")
    assert shown == CDDL.read_text(encoding="utf-8").rstrip("\n")


# --- tables ------------------------------------------------------------------------


def _cell(element: ET.Element) -> str:
    return " ".join("".join(element.itertext()).split())


def _rows(document: ET.Element, anchor: str) -> list[list[str]]:
    """The body rows of the table ``anchor``, each a list of normalised cell texts."""
    tables = [t for t in document.iter("table") if t.get("anchor") == anchor]
    assert len(tables) == 1, f"the draft has exactly one table {anchor!r}"
    body = tables[0].find("tbody")
    assert body is not None, f"table {anchor!r} has no body"
    return [[_cell(cell) for cell in row] for row in body.iter("tr")]


def _registered(document: ET.Element, anchor: str) -> dict[int, str]:
    """Value -> name of a registry table, without its Reserved rows."""
    entries: dict[int, str] = {}
    for row in _rows(document, anchor):
        value, name = int(row[0], 0), row[1]
        if name == "Reserved":
            continue
        assert value not in entries, f"{anchor}: value {value} listed twice"
        entries[value] = name
    return entries


REGISTRIES: list[tuple[str, type[IntEnum]]] = [
    ("tbl-iana-message-types", MessageType),
    ("tbl-iana-roles", Role),
    ("tbl-iana-dtypes", DType),
    ("tbl-iana-ops", ReduceOp),
    ("tbl-iana-collectives", Collective),
    ("tbl-iana-error-codes", ErrorCode),
]


@pytest.mark.parametrize(("anchor", "registry"), REGISTRIES, ids=[r.__name__ for _, r in REGISTRIES])
def test_iana_table_lists_every_code_point(
    document: ET.Element, anchor: str, registry: type[IntEnum]
) -> None:
    assert _registered(document, anchor) == {int(member): member.name for member in registry}


def test_iana_alpn_is_the_code_alpn(document: ET.Element) -> None:
    section = next(s for s in document.iter("section") if s.get("anchor") == "iana-alpn")
    text = _cell(section)
    assert f'"{ALPN}"' in text
    assert " ".join(f"0x{byte:02x}" for byte in ALPN.encode("ascii")) in text


def test_error_code_table_gives_every_meaning(document: ET.Element) -> None:
    rows = {int(row[0], 0): (row[1], row[2]) for row in _rows(document, "tbl-error-codes")}
    assert rows == {int(c): (c.name, ERROR_DESCRIPTIONS[c]) for c in ErrorCode}


def test_message_summary_lists_every_message(document: ET.Element) -> None:
    rows = {int(row[0], 0): row[1] for row in _rows(document, "tbl-messages")}
    assert rows == {int(t): cls.__name__ for t, cls in MESSAGE_CLASSES.items()}


def _anchor(struct: type[Struct]) -> str:
    """fields-<kebab-case name>; the four chunk messages share one table."""
    name = "Chunk" if issubclass(struct, ChunkMessage) else struct.__name__
    return "fields-" + re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()


STRUCTS: list[type[Struct]] = [
    Capabilities,
    Address,
    NodeRef,
    GroupParams,
    MemberView,
    TreeNodeView,
    GroupView,
    AggregatorView,
    RecordView,
    *MESSAGE_CLASSES.values(),
]


@pytest.mark.parametrize("struct", STRUCTS, ids=[s.__name__ for s in STRUCTS])
def test_field_table_matches_the_code(document: ET.Element, struct: type[Struct]) -> None:
    """Every field's key, name and optionality in the draft are those of messages.py."""
    drafted = [(int(row[0]), row[1], "(optional)" in row[2]) for row in _rows(document, _anchor(struct))]
    coded = [(spec.key, name, spec.optional) for name, spec in struct.wire_fields()]
    assert drafted == coded


def test_no_sentence_speaks_of_the_version_1_scale_field(build: Build) -> None:
    """Version 2 has per-block scales (key 7 "scales"); the single "scale" field, and the
    rule that it is 0 for integers and bit-exact kinds, are gone from every section."""
    text = " ".join(build.text.read_text(encoding="utf-8").split())
    stale = re.findall(r"[^.]*\b(?:scale field|scale (?:is|must be) 0|field scale)\b[^.]*\.", text, re.I)
    assert not stale, stale


def test_cddl_comments_say_what_the_field_tables_say() -> None:
    """The comments the issue found disagreeing with the tables now agree with them."""
    cddl = CDDL.read_text(encoding="utf-8")
    messages = (SPEC / "sections" / "messages.xml").read_text(encoding="utf-8")
    assert "capacity: groups it can serve at once" in cddl
    assert "The number of groups the aggregator can serve at once." in messages
    assert "window: chunks an endpoint may have outstanding, all operations" in cddl
    assert "across all its operations" in messages
    assert "operation-timeout-ms: deadline for one chunk slot of an operation" in cddl
    assert "for completing one chunk slot of an operation" in messages
