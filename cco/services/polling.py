"""Busy polling: an event loop that keeps looking for I/O for a while before it sleeps.

A node that waits in ``epoll_wait`` is put to sleep, and a datagram for it must
wake it: the kernel marks it runnable and, when its core is idle (halted), sends
that core an interrupt to run it.  On a virtual machine both are exits to the
hypervisor.  A UDP ping-pong between two processes is several times quicker when
each polls than when each sleeps in ``epoll_wait`` (``benchmarks/probes/bench_wakeup.py``
measures it), and the 8-byte all-reduce of four ranks exchanges eight datagrams a
round, each with its wakeup.  The kernel's own busy
polling (``net.core.busy_poll``) serves network cards' queues only, not loopback,
and is a system setting; this does the same inside the process, for any socket.

What it costs is CPU: once the loop has nothing to run, it keeps its core for up to
the budget, polling without blocking.  Between polls it yields the core
(``sched_yield``), so another runnable process on that core goes first and the
polling takes only time nobody else on that core wants.  A timer due within the
budget is never late: the polling stops when the loop's own timeout does.  A budget
of 0 is the standard event loop.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import time
from collections.abc import Callable

from cco.config import MAX_BUSY_POLL_US


def give_way() -> None:
    """Let another runnable process have this core first, if one wants it (returns at
    once when none is waiting)."""
    if hasattr(os, "sched_yield"):
        os.sched_yield()
    else:  # Windows: a zero sleep gives up the rest of the thread's time slice
        time.sleep(0)


class PollingSelector(selectors.DefaultSelector):
    """The platform's default selector, polling for up to ``budget`` seconds before
    it blocks (see the module docstring)."""

    def __init__(self, budget: float) -> None:
        if not 0 < budget <= MAX_BUSY_POLL_US / 1e6:
            raise ValueError(f"busy-poll budget must be in (0, {MAX_BUSY_POLL_US / 1e6}] s, got {budget}")
        super().__init__()
        self.budget = budget

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout <= 0:  # the loop has work: only look
            return super().select(0)
        start = time.monotonic()
        polling = self.budget if timeout is None else min(self.budget, timeout)
        while True:
            ready = super().select(0)
            if ready:
                return ready
            elapsed = time.monotonic() - start
            if elapsed >= polling:
                break
            give_way()
        return super().select(None if timeout is None else max(0.0, timeout - elapsed))


def event_loop_factory(busy_poll_us: int) -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory of event loops that poll for ``busy_poll_us`` microseconds before
    sleeping, for :class:`asyncio.Runner` (``loop_factory``); 0 gives the standard
    loop."""
    if not 0 <= busy_poll_us <= MAX_BUSY_POLL_US:
        raise ValueError(f"busy_poll_us must be in [0, {MAX_BUSY_POLL_US}], got {busy_poll_us}")
    if busy_poll_us == 0:
        return asyncio.new_event_loop
    budget = busy_poll_us / 1e6

    def polling_loop() -> asyncio.AbstractEventLoop:
        return asyncio.SelectorEventLoop(PollingSelector(budget))

    return polling_loop
