"""How a ``cco-node`` process logs: one line per event, as text or as JSON.

Text lines are ``time logger LEVEL message``; ``--log-format json`` writes one JSON
object per line instead (``time``, ``level``, ``logger``, ``message``, and
``exception`` with the traceback when there is one; a membership or registration
line adds its fields, see :func:`cco.services.reports.fields`), which log shippers (journald's
forwarders, Vector, Fluent Bit, Promtail) read without a parsing rule.

The QUIC libraries (aioquic and qh3, both on the logger ``quic``) log about single
connections: a peer that closes normally, for instance, is a WARNING there.  CCO's
own transport reports what matters about a connection (a peer lost, a handshake
refused) under ``cco.*``, so ``quic`` is shown at ``debug`` only.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import IO

QUIC_LOGGER = "quic"
"""The logger aioquic and qh3 write their per-connection messages to."""


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        extra = getattr(record, "cco_fields", None)
        if isinstance(extra, dict):
            entry.update(extra)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str, log_format: str, stream: IO[str] = sys.stderr) -> None:
    """Send every record at ``level`` or above to ``stream`` in ``log_format``
    (``text`` or ``json``), replacing any handler installed before."""
    handler = logging.StreamHandler(stream)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger(QUIC_LOGGER).setLevel(logging.DEBUG if level == "debug" else logging.ERROR)
