"""The thin asyncio layer: drives one sans-I/O role machine over QUIC links.

A :class:`MachineRunner` owns the clock and the sockets; the machine owns every
decision.  All inputs reach the machine through :meth:`MachineRunner.dispatch`, on
the event loop's thread, one at a time; every command the machine returns is carried
out here: messages are queued on links, connections opened, links closed, and the
application-level commands (``Joined``, ``OperationCompleted``, ``OperationFailed``)
handed to ``on_command``.  The machine's single timer is re-armed after every input
from ``next_deadline()``.

Sending never waits for ``PeerLink.drain()``: one slow peer must not stall a
machine that serves many.  What a link can queue is bounded by the protocol
instead: an endpoint has at most ``window`` chunks of a group in flight, and an
aggregator sends each child at most one message per open slot, of which a group
has at most ``window``; so a link's queue stays within window x chunk per group.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from cco.nodes.events import (
    ClosePeer,
    Command,
    ConnectTo,
    Input,
    MessageMalformed,
    MessageReceived,
    OperationCompleted,
    PeerConnected,
    PeerDisconnected,
    PeerId,
    Report,
    SendMessage,
    TimerFired,
)
from cco.services.recorder import DEFAULT_ENTRIES, Recorder
from cco.services.reports import log_agreement, log_report
from cco.transport.peerlink import LinkClosed, PeerLink
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import ranks_from_bitmap
from cco.wire.messages import EpochChange, Error, Message, StatusReply, StatusRequest, TreeAssignment

if TYPE_CHECKING:
    from cco.services.metrics import NodeMetrics

log = logging.getLogger(__name__)

CLOSE_WAIT = 2.0
"""Seconds :meth:`MachineRunner.close` waits for the connections to terminate."""


StatusSource = Callable[[StatusRequest, int, float], StatusReply]
"""Builds a StatusReply for a request, within a size limit (bytes), at a time."""


class Machine(Protocol):
    """What every role machine offers (see cco.nodes.events)."""

    def handle(self, event: Input, now: float) -> list[Command]: ...

    def next_deadline(self) -> float | None: ...


def describe_membership(message: TreeAssignment | EpochChange) -> str:
    """One log line for a tree assignment or epoch change (rare, and worth seeing)."""
    group = message.group_id.hex()
    if isinstance(message, EpochChange):
        members = sorted(ranks_from_bitmap(message.members))
        return f"group {group} epoch {message.epoch}: members {members} ({message.code.name})"
    parent = message.parent.node_id if message.parent is not None else "none"
    children = [child.node_id for child in message.children]
    expected = sorted(ranks_from_bitmap(message.expected))
    return (
        f"group {group} epoch {message.epoch}: tree parent {parent} children {children} expected {expected}"
    )


class _LinkListener:
    """Hands one link's messages to the runner's machine as the link decodes them.

    Each message is dispatched in the callback that read its datagram, without
    flushing: what the machine sends in answer leaves after the batch being read
    (see :meth:`MachineRunner.execute_all`)."""

    __slots__ = ("_link", "_peer", "_runner")

    def __init__(self, runner: MachineRunner, peer: PeerId, link: PeerLink) -> None:
        self._runner = runner
        self._peer = peer
        self._link = link

    def deliver(self, item: Message | CcoError) -> None:
        if isinstance(item, CcoError):
            self._runner.dispatch(MessageMalformed(peer=self._peer, error=item), flush=False)
        else:
            self._runner.dispatch(MessageReceived(peer=self._peer, message=item), flush=False)

    def closed(self, code: ErrorCode, detail: str) -> None:
        self._runner._link_closed(self._peer, self._link, code, detail)


class MachineRunner:
    """Feeds a machine its inputs and executes its commands."""

    def __init__(
        self,
        machine: Machine,
        connector: Callable[[ConnectTo], asyncio.Task[PeerLink]],
        on_command: Callable[[Command], None] = lambda command: None,
        clock: Callable[[], float] = time.monotonic,
        recorder_entries: int = DEFAULT_ENTRIES,
    ) -> None:
        self.machine = machine
        self._connector = connector
        self.on_command = on_command
        self.clock = clock
        self.recorder = Recorder(clock(), recorder_entries)
        self.metrics: NodeMetrics | None = None
        """Counts what passes (``--metrics-listen``, :mod:`cco.services.metrics`)."""
        self.status: StatusSource | None = None
        """Builds the answer to a StatusRequest (:class:`~cco.services.node.NodeService`
        sets it); without one, a StatusRequest is refused."""
        self._links: dict[PeerId, PeerLink] = {}
        self._departing: set[PeerLink] = set()  # gone from _links, connection not yet terminated
        self._tasks: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline = 0.0  # the machine deadline _timer was armed for
        self._next_inbound = 0
        self._closing = False
        self.closed = asyncio.Event()
        self.on_epoch_change: Callable[[], None] = lambda: None

    # --- inputs --------------------------------------------------------------------

    def dispatch(self, event: Input, flush: bool = True) -> None:
        """Hand one input to the machine and carry out what it asks for (see
        :meth:`execute_all` for ``flush``).  A StatusRequest is answered here, from
        the machine's state and the flight recorder: it changes nothing."""
        if self._closing:
            return  # a closing node neither decides nor sends anything more
        now = self.clock()
        if isinstance(event, MessageReceived):
            message = event.message
            if isinstance(message, StatusRequest):
                self._answer_status(event.peer, message, now)
                return
            self.recorder.received(message, now)
            if self.metrics is not None:
                self.metrics.received(message, now)
            if isinstance(message, (TreeAssignment, EpochChange)):
                log.info("%s", describe_membership(message))
                if isinstance(message, EpochChange):
                    self.on_epoch_change()  # an epoch's slots and queues go with it
        try:
            commands = self.machine.handle(event, now)
        except CcoError as exc:  # the machines refuse local misuse this way
            log.error("machine refused %s: %s", type(event).__name__, exc)
            return
        self.execute_all(commands, flush)

    def execute_all(self, commands: list[Command], flush: bool = True) -> None:
        """Carry out commands the machine returned (from handle() or a local API call).

        With ``flush``, what they queue on links leaves before this returns: each
        link it sent on is flushed once, after every command.  A transmit left to
        the event loop's next turn once ran after the loop had read the next batch
        of datagrams (up to 64, 1 MiB at 16000 bytes each), so an aggregator's
        Results waited while it decrypted and combined the next chunks, and the
        endpoints waiting for them left a core idle (``benchmarks/bench_allreduce.py``
        measures a large all-reduce on loopback).

        Without ``flush`` (inputs handed over while a batch of datagrams is being
        read, see :class:`_LinkListener`), the links transmit once that batch is
        read, on the loop's next turn, which comes before the next batch: sending in
        the middle of a batch made an aggregator's Results leave in bursts that
        overflowed shaped links (BENCHMARKS.md)."""
        sent: dict[PeerLink, None] = {}  # in sending order, each once
        for command in commands:
            link = self._execute(command)
            if link is not None:
                sent[link] = None
        if flush:
            for link in sent:
                link.flush()
        self._arm_timer()

    def attach(self, link: PeerLink, peer: PeerId | None = None) -> PeerId:
        """Adopt an authenticated link: report it, then listen to its messages."""
        if peer is None:
            self._next_inbound += 1
            peer = f"in-{self._next_inbound}-{link.node_id}"
        self._links[peer] = link
        self.dispatch(
            PeerConnected(peer=peer, node_id=link.node_id, role=link.role, capabilities=link.capabilities)
        )
        link.listen(_LinkListener(self, peer, link))
        return peer

    def links(self) -> list[PeerLink]:
        """The open connections, for the metrics' scrape-time gauges."""
        return list(self._links.values())

    def _answer_status(self, peer: PeerId, request: StatusRequest, now: float) -> None:
        link = self._links.get(peer)
        if link is None:
            return
        try:
            if self.status is None:
                raise CcoError(ErrorCode.PROTOCOL_VIOLATION, "this node does not answer StatusRequest")
            reply: Message = self.status(request, link.capabilities.max_message_size, now)
        except CcoError as exc:
            reply = Error(code=exc.code, detail=exc.detail, message_type=int(request.TYPE))
        try:
            link.send(reply)
        except LinkClosed:
            return
        link.flush()

    def _link_closed(self, peer: PeerId, link: PeerLink, code: ErrorCode, detail: str) -> None:
        if self._links.get(peer) is link:
            del self._links[peer]
            self._depart(link)
            self.dispatch(PeerDisconnected(peer=peer, code=code, detail=detail))

    def _depart(self, link: PeerLink) -> None:
        """Keep a closed link until its connection has terminated, so that
        :meth:`close` waits for it: until then it may still be flushing what was
        queued before its CONNECTION_CLOSE, and the peer still counts it connected."""
        if not link.terminated:
            self._departing.add(link)
            link.add_termination_callback(lambda: self._departing.discard(link))

    # --- commands ------------------------------------------------------------------

    def _execute(self, command: Command) -> PeerLink | None:
        """Carry out one command; the link a message was queued on, if any."""
        if isinstance(command, SendMessage):
            link = self._links.get(command.peer)
            if link is None:
                log.debug("dropping %s for departed peer %s", type(command.message).__name__, command.peer)
                return None
            try:
                link.send(command.message)
            except LinkClosed:  # closed meanwhile (often by the machine's own ClosePeer): departed
                log.debug("dropping %s for closed link to %s", type(command.message).__name__, command.peer)
                return None
            now = self.clock()
            self.recorder.sent(command.message, now)
            if self.metrics is not None:
                self.metrics.sent(command.message, now)
            return link
        if isinstance(command, ConnectTo):
            self._spawn(self._connect(command))
        elif isinstance(command, ClosePeer):
            link = self._links.get(command.peer)
            if link is not None:
                link.close(command.code, command.detail)
        elif isinstance(command, Report):
            log_report(command)
            if self.metrics is not None:
                self.metrics.report(command)
        else:
            if isinstance(command, OperationCompleted):
                log_agreement(command)
            now = self.clock()
            self.recorder.command(command, now)
            if self.metrics is not None:
                self.metrics.command(command, now)
            self.on_command(command)
        return None

    async def _connect(self, command: ConnectTo) -> None:
        try:
            link = await self._connector(command)
        except CcoError as exc:
            self.dispatch(PeerDisconnected(peer=command.peer, code=exc.code, detail=exc.detail))
            return
        except (TimeoutError, OSError) as exc:
            self.dispatch(PeerDisconnected(peer=command.peer, code=ErrorCode.PEER_LOST, detail=str(exc)))
            return
        self.attach(link, command.peer)

    # --- time ----------------------------------------------------------------------

    def _arm_timer(self) -> None:
        """Make sure the machine hears TimerFired by its next deadline.

        A timer already armed for that time or earlier is kept, never replaced:
        replacing it on every input starved a due timer under a steady flow of
        messages (each loop turn's first input cancelled the TimerFired queued for
        that turn), so a busy aggregator stopped sending heartbeats and the
        rendezvous declared it lost.  Firing early is harmless: machines compare
        every deadline with ``now``.
        """
        deadline = self.machine.next_deadline()
        if self._timer is not None:
            if deadline is not None and self._timer_deadline <= deadline:
                return
            self._timer.cancel()
            self._timer = None
        if deadline is None:
            return
        delay = max(0.0, deadline - self.clock())
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)
        self._timer_deadline = deadline

    def _fire(self) -> None:
        self._timer = None
        self.dispatch(TimerFired())

    # --- lifetime ------------------------------------------------------------------

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("runner task failed", exc_info=task.exception())

    async def close(self, code: ErrorCode = ErrorCode.SHUTTING_DOWN, detail: str = "shutting down") -> None:
        """Close every link and stop every task; nothing is dispatched after this starts.

        Returns once every connection, including those closed earlier (by the machine
        or the peer), has terminated, or after :data:`CLOSE_WAIT`: a node that
        connects again at once (after a refused join, say) is then never taken for
        its old connection."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        links = list(self._links.values())
        for link in links:
            link.close(code, detail)
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # Since Python 3.12 gather returns without yielding to the loop when every
            # task had already ended, before their done callbacks (which discard them)
            # have run: without this, a task that ended just before close() kept the
            # loop spinning here, deaf even to SIGTERM.
            self._tasks.difference_update(tasks)
        closing = [asyncio.wait_for(link.wait_closed(), CLOSE_WAIT) for link in {*links, *self._departing}]
        await asyncio.gather(*closing, return_exceptions=True)
        self.closed.set()
