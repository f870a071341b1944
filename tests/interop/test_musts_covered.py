"""Every requirement of the draft that a decoder can check has a negative vector.

``interop/musts.json`` sorts every sentence of the draft holding a BCP 14
requirement (MUST, MUST NOT, REQUIRED, SHALL, SHALL NOT) into the rules a
decoder can check, each with the negative vectors that exercise it, and the
rules it cannot, each with why.  These tests read the draft's section sources,
so a MUST added to the draft without a place in that list, a rule whose text
changed, or a vector renamed away fails here.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ROOT / "spec" / "sections"
VECTORS = ROOT / "interop" / "vectors"
MUSTS: dict[str, Any] = json.loads((ROOT / "interop" / "musts.json").read_text(encoding="utf-8"))
KEYWORDS = re.compile(r"\b(MUST|REQUIRED|SHALL)\b")
BLOCKS = ("t", "li", "dd", "td")


def _text(element: ET.Element) -> str:
    return re.sub(r"\s+", " ", "".join(element.itertext())).strip()


def requirement_sentences(root: ET.Element) -> list[tuple[str, str]]:
    """(section anchor, sentence) for every sentence with a bcp14 requirement keyword.

    A block (paragraph, list item, table cell) is split into sentences at a
    period, semicolon or colon followed by a capital; only blocks that mark a
    keyword with <bcp14> count, so prose that quotes the word does not.
    """
    found: list[tuple[str, str]] = []

    def walk(element: ET.Element, anchor: str) -> None:
        if element.tag == "section":
            anchor = element.get("anchor", anchor)
        nested = any(child.tag in ("t", "li", "ul", "ol") for child in element)
        if element.tag in BLOCKS and not nested:
            marked = {_text(b) for b in element.iter("bcp14")}
            if marked & {"MUST", "MUST NOT", "REQUIRED", "SHALL", "SHALL NOT"}:
                for sentence in re.split(r"(?<=[.;:])\s+(?=[A-Z(])", _text(element)):
                    if KEYWORDS.search(sentence):
                        found.append((anchor, sentence))
            return
        for child in element:
            walk(child, anchor)

    walk(root, root.get("anchor", ""))
    return found


def draft_requirements() -> list[tuple[str, str]]:
    sentences: list[tuple[str, str]] = []
    for path in sorted(SECTIONS.glob("*.xml")):
        sentences += requirement_sentences(ET.parse(path).getroot())
    return sentences


def entries() -> list[dict[str, Any]]:
    return [*MUSTS["decoder_checkable"], *MUSTS["excluded"]]


def unlisted(sentences: list[tuple[str, str]], listed: list[dict[str, Any]]) -> list[str]:
    """Sentences that no entry (same anchor, rule a fragment of the sentence) covers."""
    return [
        f"{anchor}: {sentence}"
        for anchor, sentence in sentences
        if not any(e["anchor"] == anchor and e["rule"] in sentence for e in listed)
    ]


def _vector(ref: str) -> dict[str, Any] | None:
    file_name, _, name = ref.partition("#")
    path = VECTORS / file_name
    if not path.is_file():
        return None
    matches = [v for v in json.loads(path.read_text(encoding="utf-8")) if v.get("name") == name]
    return matches[0] if len(matches) == 1 else None


def test_every_requirement_of_the_draft_is_listed() -> None:
    sentences = draft_requirements()
    assert len(sentences) > 20  # the extraction finds the draft's requirements at all
    missing = unlisted(sentences, entries())
    assert not missing, "requirements missing from interop/musts.json:\n" + "\n".join(missing)


def test_every_listed_rule_is_still_in_the_draft_once() -> None:
    sentences = draft_requirements()
    for entry in entries():
        hits = [s for a, s in sentences if a == entry["anchor"] and entry["rule"] in s]
        assert len(hits) == 1, f"{entry['anchor']}: {entry['rule']!r} matches {len(hits)} sentences"


CHECKABLE = MUSTS["decoder_checkable"]


@pytest.mark.parametrize("entry", CHECKABLE, ids=[e["id"] for e in CHECKABLE])
def test_every_decoder_checkable_rule_has_negative_vectors(entry: dict[str, Any]) -> None:
    assert entry["vectors"], f"{entry['id']} has no negative vector"
    for ref in entry["vectors"]:
        vector = _vector(ref)
        assert vector is not None, f"{entry['id']}: no vector {ref}"
        assert vector.get("fail") is True, f"{entry['id']}: {ref} is not a negative vector"
        assert "error_code" in vector, f"{entry['id']}: {ref} names no error code"


def test_every_exclusion_says_why() -> None:
    for entry in MUSTS["excluded"]:
        assert len(entry["why"]) > 10, entry


def test_an_unlisted_requirement_is_found() -> None:
    """The coverage check can fail: a new MUST in a section is reported."""
    section = ET.fromstring(
        '<section anchor="new-rule"><name>x</name><t>Intro.  A decoder <bcp14>MUST</bcp14> refuse '
        "a zero epoch with INVALID_FIELD.  Prose MUST in capitals unmarked.</t>"
        "<t>Quoting the word MUST without markup.</t></section>"
    )
    sentences = requirement_sentences(section)
    assert sentences == [
        ("new-rule", "A decoder MUST refuse a zero epoch with INVALID_FIELD."),
        ("new-rule", "Prose MUST in capitals unmarked."),
    ]
    assert len(unlisted(sentences, entries())) == 2
