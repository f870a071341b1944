"""A node's flight recorder written to a file on SIGUSR1, for ``cco-node trace-analyze``.

The dump is one JSON object: what ``cco-node status --json`` shows (the node's role
and id, its groups and its place in their trees), every flight-recorder entry the
node keeps, oldest first, and for each group the node ids of the endpoints directly
below it by rank, so that the analysis can name the process that owes a chunk.  It
is written under the state directory (:func:`cco.config.state_directory`) as
``flight-<node id>-<pid>-<UTC time>.json``, atomically (a reader never sees half a
file), and the path is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

from cco.services.node import NodeService
from cco.services.status import record_json, reply_json
from cco.wire.messages import StatusRequest

log = logging.getLogger("cco.node")

DUMP_SIGNAL = signal.SIGUSR1


def dump_data(service: NodeService) -> dict[str, Any]:
    """Everything the dump holds, as plain JSON values."""
    runner = service.runner
    now = runner.clock()
    reply = service.status(StatusRequest(records=0), 1 << 62, now)
    data = reply_json(reply)
    data["pid"] = os.getpid()
    data["time"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
    data["records"] = [record_json(runner.recorder.view(entry)) for entry in runner.recorder.entries.values()]
    data["children"] = {
        group_id.hex(): {str(rank): node_id for rank, node_id in sorted(place.children.items())}
        for group_id, place in sorted(runner.recorder.groups.items())
    }
    return data


def write_dump(service: NodeService, directory: Path) -> Path:
    """Write the dump of ``service`` into ``directory``; its path."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%f")
    path = directory / f"flight-{service.identity.node_id}-{os.getpid()}-{stamp}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(dump_data(service), indent=1) + "\n")
    partial.replace(path)
    return path


def dump_on_signal(service: NodeService, directory: Path) -> None:
    """Dump the flight recorder into ``directory`` whenever the process gets SIGUSR1."""

    def dump() -> None:
        try:
            path = write_dump(service, directory)
        except OSError as exc:
            log.error("flight recorder: cannot write a dump in %s: %s", directory, exc.strerror or exc)
            return
        log.info("flight recorder: %d entries written to %s", len(service.runner.recorder.entries), path)

    with contextlib.suppress(NotImplementedError):
        asyncio.get_running_loop().add_signal_handler(DUMP_SIGNAL, dump)


__all__ = ["DUMP_SIGNAL", "dump_data", "dump_on_signal", "write_dump"]
