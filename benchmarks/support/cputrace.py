"""CPU seconds of running processes over time, to charge a stretch of a run to them.

A node's CPU over its whole life includes starting up (imports, bytecode compiled
anew where none is cached, numba's loops), joining and its first, cold round: an
endpoint of a three-round 64 MiB all-reduce spent a third of its CPU before the
first byte of data moved.  The CPU *per byte* of the datapath is the CPU of the
rounds that ran warm, so :class:`CpuTrace` samples each process's user + system
time (``/proc/<pid>/stat``) with the ``time.monotonic()`` it was read at, on a
thread, and :meth:`CpuTrace.between` interpolates the CPU a process used between
two instants of that clock (the one the endpoints stamp their rounds with).
``/proc`` counts in clock ticks (10 ms), so the stretch should be seconds long.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (OSError once it is gone)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class CpuTrace:
    """Samples the CPU seconds of some processes every ``interval`` s until stopped."""

    def __init__(self, interval: float = 0.02) -> None:
        self._interval = interval
        self._samples: dict[int, tuple[list[float], list[float]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def follow(self, pid: int) -> None:
        """Start sampling ``pid`` (a process that ends is no longer sampled)."""
        with self._lock:
            self._samples.setdefault(pid, ([], []))
        self._sample(pid)

    def _sample(self, pid: int) -> None:
        try:
            cpu = cpu_seconds(pid)
        except (OSError, ValueError, IndexError):
            return
        now = time.monotonic()
        with self._lock:
            times, cpus = self._samples[pid]
            times.append(now)
            cpus.append(cpu)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            with self._lock:
                pids = list(self._samples)
            for pid in pids:
                self._sample(pid)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, pid: int, start: float, end: float) -> float | None:
        """CPU seconds ``pid`` used from ``start`` to ``end`` (``time.monotonic()``),
        interpolated between samples; None without samples around both instants."""
        with self._lock:
            times, cpus = self._samples.get(pid, ([], []))
            times, cpus = list(times), list(cpus)
        if len(times) < 2 or start < times[0] or end > times[-1] or end <= start:
            return None
        return _at(times, cpus, end) - _at(times, cpus, start)


def _at(times: list[float], cpus: list[float], instant: float) -> float:
    index = min(max(1, bisect.bisect_left(times, instant)), len(times) - 1)
    t0, t1 = times[index - 1], times[index]
    c0, c1 = cpus[index - 1], cpus[index]
    return c0 if t1 == t0 else c0 + (c1 - c0) * (instant - t0) / (t1 - t0)
