"""The processes a test started, found through /proc: to check that a harness stopped
with a signal stopped everything it had started, and to clean up when it did not."""

from __future__ import annotations

import os
import signal
import subprocess
import time
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


def still_running(pids: list[int], within: float) -> list[int]:
    """Those of ``pids`` still running after waiting up to ``within`` seconds for all to end."""
    deadline = time.monotonic() + within
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if running(pid)]


def kill_all(harness: subprocess.Popen[str], started: list[int]) -> None:
    """SIGKILL the harness and whatever it started that still runs, then reap the harness."""
    for pid in [harness.pid, *started]:
        if running(pid):
            os.kill(pid, signal.SIGKILL)
    harness.wait()
