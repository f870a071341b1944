"""The draft's table of resource limits (section "Resource Limits") names every limit
the nodes enforce, with the default the code has: a limit added, removed or changed
on one side only fails here."""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from cco.nodes.aggregator_config import AggregatorConfig
from cco.nodes.rendezvous_admission import AdmissionLimits
from cco.transport.config import TransportConfig

SECTION = Path(__file__).resolve().parents[2] / "spec" / "sections" / "resource-limits.xml"


def _field_default(cls: Any, name: str) -> Any:
    (field,) = [f for f in dataclasses.fields(cls) if f.name == name]
    return field.default


def code_limits() -> dict[str, Any]:
    """Every limit the nodes enforce, by the name the draft gives it, with its default."""
    admission = AdmissionLimits()
    limits: dict[str, Any] = {f.name: getattr(admission, f.name) for f in dataclasses.fields(admission)}
    for name in ("pending_limit", "parked_bytes_per_peer", "parked_bytes", "pending_timeout"):
        limits[name] = _field_default(AggregatorConfig, name)
    for name in (
        "send_queue_limit",
        "retry_threshold",
        "max_half_open",
        "handshake_timeout",
        "unfinished_bytes_per_connection",
        "unfinished_bytes",
        "frame_timeout",
        "messages_per_turn",
    ):
        limits[name] = _field_default(TransportConfig, name)
    return limits


def draft_limits() -> dict[str, str]:
    table = ET.parse(SECTION).getroot().find(".//table[@anchor='tbl-resource-limits']")
    assert table is not None
    rows = {}
    for row in table.iter("tr"):
        cells = ["".join(cell.itertext()).strip() for cell in row.findall("td")]
        if cells:
            name = re.match(r"\w+", cells[0])
            assert name is not None, cells
            rows[name.group(0)] = cells[1]
    return rows


def test_every_limit_is_in_the_draft_with_its_default() -> None:
    draft, code = draft_limits(), code_limits()
    assert sorted(draft) == sorted(code)
    for name, default in code.items():
        assert float(draft[name]) == float(default), name
