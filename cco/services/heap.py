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
"""Seconds between a connection's end and the trim (ends meanwhile share it)."""


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class HeapTrimmer:
    """Trims the heap :data:`TRIM_DELAY` seconds after :meth:`released` is called."""

    def __init__(self, delay: float = TRIM_DELAY) -> None:
        self._delay = delay
        self._trim = _malloc_trim()
        self._pending: asyncio.TimerHandle | None = None
        self.trims = 0

    def released(self) -> None:
        """Memory was freed (a connection ended): trim soon, once."""
        if self._trim is not None and self._pending is None:
            self._pending = asyncio.get_running_loop().call_later(self._delay, self._run)

    def _run(self) -> None:
        self._pending = None
        assert self._trim is not None
        gc.collect()
        self._trim(0)
        self.trims += 1
        log.debug("heap trimmed (%d so far)", self.trims)

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
