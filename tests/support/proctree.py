"""The processes a test started, found through /proc: to check that a harness stopped
with a signal stopped everything it had started, and to clean up when it did not."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def sigterm_stops_everything(
    harness: subprocess.Popen[str], at_work: Callable[[], bool], started: int
) -> None:
    """Once ``at_work()`` (within 60 s), SIGTERM ``harness``: it must exit with 128 +
    SIGTERM, and the ``started`` processes it had started must all end within 10 s.
    Whatever fails, nothing it started is left running."""
    nodes: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not at_work():
            assert harness.poll() is None, f"the harness exited with {harness.returncode}"
            assert time.monotonic() < deadline, "the harness did not get to work within 60 s"
            time.sleep(0.1)
        nodes += children(harness.pid)
        assert len(nodes) == started, f"{len(nodes)} processes started, not {started}: {nodes}"
        harness.send_signal(signal.SIGTERM)
        code = harness.wait(30)
        assert code == 128 + signal.SIGTERM, f"the harness exited with {code}"
        deadline = time.monotonic() + 10
        while any(running(pid) for pid in nodes) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [pid for pid in nodes if running(pid)]
        assert not left, f"still running after the harness ended: {left}"
    finally:
        for pid in [harness.pid, *nodes]:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        harness.wait()
