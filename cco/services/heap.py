"""Giving memory back to the operating system once a peer has gone.

A node frees what a connection held (its queues, its partial frames, what was
owed to it) when the connection ends, but glibc's allocator keeps freed memory in
its heap for reuse: after a hostile peer made a node hold a lot and left, the
node's RSS stayed at its peak.  ``malloc_trim`` returns the heap's free pages.  It
walks the heap, so it runs once, a short while after connections end (however
many end together), never per message: an honest node, whose connections last,
hardly ever runs it.  A full garbage collection goes first: a closed connection's
objects refer to each other (the link, its QUIC connection, their callbacks), so
they are freed only by the cyclic collector, whose full passes are rare in a node
(its start-up heap is frozen, and a few large buffers never add up to a
collection's threshold); without it the slow reader's queue outlived its
connection.  Where the C library has no ``malloc_trim`` (not glibc),
nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

TRIM_DELAY = 1.0
"""Seconds between a connection's end and the first trim (ends meanwhile share it)."""

SECOND_TRIM_DELAY = 8.0
"""Seconds between a connection's end and a second trim: what the node kept for the
peer after its connection ended (an aggregator's chunks held or parked for it) is
dropped within the aggregator's ``pending_timeout`` (5 s by default), after the
first trim."""


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class HeapTrimmer:
    """Trims the heap ``delays`` seconds after :meth:`released` is called (a trim
    already due at one of those times is shared)."""

    def __init__(self, delays: tuple[float, ...] = (TRIM_DELAY, SECOND_TRIM_DELAY)) -> None:
        self._delays = delays
        self._trim = _malloc_trim()
        self._pending: list[asyncio.TimerHandle | None] = [None] * len(delays)
        self.trims = 0

    def released(self) -> None:
        """Memory was freed (a connection ended): trim soon, and once more later."""
        if self._trim is None:
            return
        loop = asyncio.get_running_loop()
        for index, delay in enumerate(self._delays):
            if self._pending[index] is None:
                self._pending[index] = loop.call_later(delay, self._run, index)

    def _run(self, index: int) -> None:
        self._pending[index] = None
        assert self._trim is not None
        gc.collect()
        self._trim(0)
        self.trims += 1
        log.debug("heap trimmed (%d so far)", self.trims)

    def cancel(self) -> None:
        for index, handle in enumerate(self._pending):
            if handle is not None:
                handle.cancel()
                self._pending[index] = None
