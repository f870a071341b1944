"""The log line of each :class:`~cco.nodes.events.Report` a machine returns.

The machines say what happened as data (they have no logger); this is where it
becomes text, at INFO: a refusal is the refused peer's problem, and a member lost
or leaving is how groups change, so neither is a warning about this node.  A Report
of tampering is the exception, at WARNING: a member proved that an aggregator
changed what it forwarded, and whoever runs that aggregator must look at it even
where the log keeps warnings only.

An operation whose ranks agreed a chunk size other than the one it was planned with
(:class:`~cco.nodes.events.ChunkAgreement`) gets a line at DEBUG when it completes:
one per call, too many for INFO, and what a benchmark run's CPU per byte depends on.
"""

from __future__ import annotations

import logging

from cco.nodes.events import Happening, OperationCompleted, Report
from cco.wire.errors import ErrorCode

log = logging.getLogger("cco.node")

FIELDS_ATTRIBUTE = "cco_fields"
"""The log record attribute holding a report's fields; :mod:`cco.logs` writes them
into a JSON line."""


def describe(report: Report) -> str:
    """``report`` as one line: who, which group, rank and epoch, then why."""
    parts = [report.what.value]
    if report.node_id:
        parts.append(report.node_id)
    if report.group_id is not None:
        parts.append(f"group {report.group_id.hex()}")
    if report.rank is not None:
        parts.append(f"rank {report.rank}")
    if report.epoch is not None:
        parts.append(f"epoch {report.epoch}")
    line = " ".join(parts)
    if report.code is not ErrorCode.NO_ERROR:
        line += f" ({report.code.name})"
    if report.detail:
        line += f": {report.detail}"
    return line


def fields(report: Report) -> dict[str, object]:
    """``report`` as the fields of a JSON log line (``--log-format json``)."""
    entry: dict[str, object] = {"event": report.what.name.lower()}
    if report.node_id:
        entry["peer"] = report.node_id
    if report.group_id is not None:
        entry["group"] = report.group_id.hex()
    for name in ("rank", "epoch"):
        value = getattr(report, name)
        if value is not None:
            entry[name] = value
    if report.code is not ErrorCode.NO_ERROR:
        entry["code"] = report.code.name
    return entry


def level(report: Report) -> int:
    """The logging level of ``report``'s line (see the module docstring)."""
    return logging.WARNING if report.what is Happening.TAMPERING else logging.INFO


def log_report(report: Report) -> None:
    log.log(level(report), "%s", describe(report), extra={FIELDS_ATTRIBUTE: fields(report)})


def log_agreement(completed: OperationCompleted) -> None:
    """The DEBUG line of an operation whose agreed chunk size is not its planned one."""
    agreement = completed.agreement
    if agreement is None or agreement.agreed == agreement.planned or not log.isEnabledFor(logging.DEBUG):
        return
    entry = {
        "event": "chunk size agreed",
        "op_id": completed.op_id,
        "planned": agreement.planned,
        "agreed": agreement.agreed,
        "proposed": agreement.proposed,
    }
    log.debug(
        "op %d: chunks of %d elements agreed (planned %d, this rank proposed %d)",
        completed.op_id,
        agreement.agreed,
        agreement.planned,
        agreement.proposed,
        extra={FIELDS_ATTRIBUTE: entry},
    )


__all__ = ["FIELDS_ATTRIBUTE", "describe", "fields", "level", "log_agreement", "log_report"]
