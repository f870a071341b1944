"""What one link has decoded and its reader has not taken yet.

A reader takes a link's messages one of two ways: a task awaits :meth:`Inbox.get`, or
a :class:`~cco.transport.peerlink.Listener` is handed each message in the event-loop
callback that decoded it (a machine runner does, :meth:`Inbox.listen`).  Either way
the inbox bounds what one connection may make its node do and hold:

* **Per turn.**  A listener gets at most ``messages_per_turn`` messages in one turn
  of the event loop; the rest wait for the next turns, so one connection's flood
  costs its node that many messages' work between two looks at every other
  connection's datagrams and timers.
* **In bytes.**  Queued messages above ``receive_buffer`` bytes freeze the
  connection's QUIC credit (the peer stalls after at most one more receive window);
  reading back under half of it thaws the credit, and ``on_thaw`` lets the link
  hand the peer the new credit.

The close comes last: after every message that arrived before it, once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from cco.transport.backend import Credit
from cco.transport.peerlink import LinkClosed, Listener
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Message


class Inbox:
    """Messages decoded on one connection, on their way to its reader (see the module
    docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        receive_buffer: int,
        messages_per_turn: int,
        credit: Credit,
        on_thaw: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._receive_buffer = receive_buffer
        self._messages_per_turn = messages_per_turn
        self._credit = credit
        self._on_thaw = on_thaw
        self._queue: deque[tuple[Message | CcoError, int]] = deque()
        self._bytes = 0
        self._readable = asyncio.Event()
        self._listener: Listener | None = None
        self._closed: tuple[ErrorCode, str] | None = None
        self._close_heard = False  # the listener was told of the close
        self._delivered = 0  # messages handed to the listener in this turn of the event loop
        self._turn: asyncio.Handle | None = None  # starts the next turn's budget

    @property
    def queued(self) -> int:
        """Messages waiting for the reader."""
        return len(self._queue)

    @property
    def queued_bytes(self) -> int:
        """Their bytes on the wire: what the receive buffer bounds."""
        return self._bytes

    def put(self, item: Message | CcoError, size: int) -> None:
        """One decoded message (or the DecodeError of one that was not), ``size`` bytes
        on the wire: straight to a listener within its budget, else queued."""
        if self._listener is not None and not self._queue and self._within_budget():
            self._listener.deliver(item)
            return
        self._queue.append((item, size))
        self._bytes += size
        if self._bytes > self._receive_buffer:
            self._credit.frozen = True
        self._readable.set()

    async def get(self) -> Message:
        """The oldest message; a queued DecodeError is raised, and LinkClosed once the
        link is closed and nothing is left."""
        while True:
            if self._queue:
                item = self._take()
                if isinstance(item, CcoError):
                    raise item
                return item
            if self._closed is not None:
                raise LinkClosed(*self._closed)
            self._readable.clear()
            await self._readable.wait()

    def listen(self, listener: Listener) -> None:
        """Hand every message to ``listener`` as soon as it is decoded, instead of
        queueing it for :meth:`get` (which must not be used afterwards).

        A message then reaches its reader in the event-loop callback that read its
        datagram, not one turn later through a task woken for it: for a node that
        handles each message at once, as a machine runner does, that turn cost each
        message an Event, a Future and a task step.  Messages queued before are handed
        over first, in order, on the loop's next turn; the close comes last, once."""
        self._listener = listener
        if self._queue or self._closed is not None:
            self._loop.call_soon(self._hand_over)

    def close(self, code: ErrorCode, detail: str) -> None:
        """The link closed: a waiting :meth:`get` raises once the queue is empty, and a
        listener hears of it after what is queued (never from inside its own call)."""
        if self._closed is not None:
            return
        self._closed = (code, detail)
        self._readable.set()
        if self._listener is not None:
            self._loop.call_soon(self._hand_over)

    def _take(self) -> Message | CcoError:
        """The oldest queued item; reading below half the receive buffer thaws credit."""
        item, size = self._queue.popleft()
        self._bytes -= size
        if self._credit.frozen and self._bytes <= self._receive_buffer // 2:
            self._credit.frozen = False
            self._loop.call_soon(self._on_thaw)
        return item

    def _hand_over(self) -> None:
        """Hand the listener what is queued, within this turn's budget (the rest on
        the next turns), then the close once nothing is left."""
        assert self._listener is not None
        while self._queue and self._within_budget():
            self._listener.deliver(self._take())
        if not self._queue and self._closed is not None and not self._close_heard:
            self._close_heard = True
            self._listener.closed(*self._closed)

    def _within_budget(self) -> bool:
        """Count one more message handed to the listener in this turn of the event
        loop; False when the turn's ``messages_per_turn`` are spent."""
        if self._delivered >= self._messages_per_turn:
            return False
        self._delivered += 1
        if self._turn is None:
            self._turn = self._loop.call_soon(self._next_turn)
        return True

    def _next_turn(self) -> None:
        self._turn = None
        self._delivered = 0
        if self._listener is not None and (self._queue or self._closed is not None):
            self._hand_over()
