"""cputrace.py charges a stretch of time to a process from its sampled CPU seconds."""

from __future__ import annotations

import os
import sys
import time

import pytest
from cputrace import CpuTrace, cpu_seconds

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")


def burn(seconds: float) -> None:
    """Use about ``seconds`` of this thread's CPU."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        sum(range(1000))


def test_the_cpu_of_a_stretch_is_what_the_process_used_in_it() -> None:
    trace = CpuTrace(interval=0.01)
    trace.follow(os.getpid())
    time.sleep(0.05)
    start = time.monotonic()
    burn(0.3)
    end = time.monotonic()
    time.sleep(0.05)
    trace.stop()
    used = trace.between(os.getpid(), start, end)
    assert used is not None
    assert 0.2 <= used <= end - start + 0.05  # ticks of 10 ms; at most the wall time, and the sampler's
    assert trace.between(os.getpid(), start - 60, end) is None  # before the first sample
    assert trace.between(os.getpid(), end, start) is None
    assert trace.between(12345678, start, end) is None  # never followed


def test_cpu_seconds_reads_this_process() -> None:
    before = cpu_seconds(os.getpid())
    burn(0.1)
    assert cpu_seconds(os.getpid()) >= before + 0.05
