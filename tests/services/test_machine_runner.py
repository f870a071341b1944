"""The machine runner with a scripted machine and in-memory links: no sockets.

What is checked is the runner's own duty between a machine and its links: that a
message for a link which closed meanwhile is dropped, as for a departed peer,
instead of killing the link's task with a traceback (seen in the demo when an
endpoint left: the machine closed its parent, then answered a message already
queued from it); and that closing the runner waits for connections closed before,
which may still be flushing (a join refused and retried at once was otherwise
refused again, as "already connected", by a rendezvous that had not yet seen the
first connection end); and that what one input makes the machine send is flushed,
once per link, before the runner returns to the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest

from cco.nodes.events import (
    ClosePeer,
    Command,
    ConnectTo,
    Input,
    MessageReceived,
    PeerDisconnected,
    SendMessage,
)
from cco.services.runner import MachineRunner
from cco.transport.link import LinkClosed, Listener
from cco.wire.errors import ErrorCode
from cco.wire.messages import Address, Heartbeat, Message
from cco.wire.registries import Role


class FakeLink:
    """What the runner uses of a PeerLink; sending on it after close() raises LinkClosed."""

    node_id = "peer-node"
    role = Role.ENDPOINT
    capabilities = None

    def __init__(self, log: list[tuple[FakeLink, str]] | None = None) -> None:
        self.listener: Listener | None = None
        self.sent: list[Message] = []
        self.log = log if log is not None else []  # (link, "send" or "flush"), in call order
        self.closed: tuple[ErrorCode, str] | None = None
        self.terminated = False
        self.on_terminated: list[Callable[[], None]] = []

    def listen(self, listener: Listener) -> None:
        self.listener = listener

    def arrive(self, message: Message) -> None:
        """A message decoded: handed over at once, as a real link does."""
        assert self.listener is not None
        self.listener.deliver(message)

    def end(self, code: ErrorCode, detail: str) -> None:
        """The link closed: reported on the loop's next turn, as a real link does."""
        assert self.listener is not None
        asyncio.get_running_loop().call_soon(self.listener.closed, code, detail)

    def send(self, message: Message) -> None:
        if self.closed is not None:
            raise LinkClosed(*self.closed)
        self.sent.append(message)
        self.log.append((self, "send"))

    def flush(self) -> None:
        self.log.append((self, "flush"))

    def close(self, code: ErrorCode, detail: str) -> None:
        self.closed = (code, detail)

    def add_termination_callback(self, callback: Callable[[], None]) -> None:
        self.on_terminated.append(callback)

    def terminate(self) -> None:
        """The QUIC connection's end, which each test decides."""
        self.terminated = True
        for callback in self.on_terminated:
            callback()

    async def wait_closed(self) -> tuple[ErrorCode, str]:
        while not self.terminated:
            await asyncio.sleep(0.005)
        assert self.closed is not None
        return self.closed


class Scripted:
    """A machine that notes every input and answers each message with :meth:`answer`."""

    def __init__(self) -> None:
        self.seen: list[Input] = []

    def handle(self, event: Input, now: float) -> list[Command]:
        self.seen.append(event)
        return self.answer(event) if isinstance(event, MessageReceived) else []

    def answer(self, event: MessageReceived) -> list[Command]:
        raise NotImplementedError

    def next_deadline(self) -> float | None:
        return None


class CloseThenAnswer(Scripted):
    """On each message: close the sender's link, then answer it anyway."""

    def answer(self, event: MessageReceived) -> list[Command]:
        return [ClosePeer(event.peer, ErrorCode.NO_ERROR, "done"), SendMessage(event.peer, Heartbeat(seq=1))]


def test_a_message_for_a_link_closed_meanwhile_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        machine = CloseThenAnswer()

        def no_dialling(command: ConnectTo) -> asyncio.Task[object]:
            raise AssertionError("nothing to dial")

        runner = MachineRunner(machine, no_dialling)  # type: ignore[arg-type]
        link = FakeLink()
        peer = runner.attach(link)  # type: ignore[arg-type]
        link.arrive(Heartbeat(seq=7))
        link.end(ErrorCode.NO_ERROR, "done")
        for _ in range(100):
            if any(isinstance(event, PeerDisconnected) for event in machine.seen):
                break
            await asyncio.sleep(0.01)
        assert link.closed == (ErrorCode.NO_ERROR, "done") and link.sent == []
        assert [type(event).__name__ for event in machine.seen] == [
            "PeerConnected",
            "MessageReceived",
            "PeerDisconnected",
        ], "the link's listener lived on to report the disconnection"
        assert machine.seen[-1] == PeerDisconnected(peer=peer, code=ErrorCode.NO_ERROR, detail="done")
        link.terminate()
        await runner.close()

    with caplog.at_level(logging.DEBUG, logger="cco.services.runner"):
        asyncio.run(asyncio.wait_for(scenario(), 10))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_close_waits_for_a_link_closed_earlier_until_its_connection_ends() -> None:
    async def scenario() -> None:
        machine = CloseThenAnswer()
        runner = MachineRunner(machine, lambda command: None)  # type: ignore[arg-type,return-value]
        link, other = FakeLink(), FakeLink()
        runner.attach(link)  # type: ignore[arg-type]
        runner.attach(other)  # type: ignore[arg-type]
        link.arrive(Heartbeat(seq=7))  # the machine closes this link
        link.end(ErrorCode.NO_ERROR, "done")
        for _ in range(100):
            if any(isinstance(event, PeerDisconnected) for event in machine.seen):
                break
            await asyncio.sleep(0.01)
        asyncio.get_running_loop().call_later(0.2, link.terminate)  # still flushing until then
        asyncio.get_running_loop().call_later(0.05, other.terminate)
        start = time.monotonic()
        await runner.close()
        assert link.terminated and time.monotonic() - start >= 0.15
        assert other.closed == (ErrorCode.SHUTTING_DOWN, "shutting down")

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_link_that_ended_is_not_kept_for_close() -> None:
    async def scenario() -> None:
        machine = CloseThenAnswer()
        runner = MachineRunner(machine, lambda command: None)  # type: ignore[arg-type,return-value]
        link = FakeLink()
        runner.attach(link)  # type: ignore[arg-type]
        link.end(ErrorCode.PEER_LOST, "gone")
        for _ in range(100):
            if any(isinstance(event, PeerDisconnected) for event in machine.seen):
                break
            await asyncio.sleep(0.01)
        link.terminate()
        start = time.monotonic()
        await runner.close()
        assert time.monotonic() - start < 0.1

    asyncio.run(asyncio.wait_for(scenario(), 10))


class Fanout:
    """On each message: answer every peer in ``peers`` order (one of them twice)."""

    def __init__(self) -> None:
        self.peers: list[str] = []

    def handle(self, event: Input, now: float) -> list[Command]:
        if isinstance(event, MessageReceived):
            return [SendMessage(peer, Heartbeat(seq=i)) for i, peer in enumerate(self.peers)]
        return []

    def next_deadline(self) -> float | None:
        return None


def test_what_one_input_sends_is_flushed_once_per_link_before_the_loop_runs_again() -> None:
    async def scenario() -> None:
        machine = Fanout()
        runner = MachineRunner(machine, lambda command: None)  # type: ignore[arg-type,return-value]
        log: list[tuple[FakeLink, str]] = []
        first, second, closed = FakeLink(log), FakeLink(log), FakeLink(log)
        peers = [runner.attach(link) for link in (first, second, closed)]  # type: ignore[arg-type]
        closed.close(ErrorCode.NO_ERROR, "closed meanwhile")  # its message is dropped, not flushed
        machine.peers = [peers[0], peers[1], peers[2], peers[0]]
        runner.dispatch(MessageReceived(peer=peers[1], message=Heartbeat(seq=1)))
        # dispatch returned without the loop running in between: everything already left
        assert log == [
            (first, "send"),
            (second, "send"),
            (first, "send"),
            (first, "flush"),
            (second, "flush"),
        ]
        for link in (first, second, closed):
            link.terminate()
        await runner.close()

    asyncio.run(asyncio.wait_for(scenario(), 10))


class DialOnMessage(Scripted):
    """On each message: dial a peer (whose connection the test's connector refuses)."""

    def answer(self, event: MessageReceived) -> list[Command]:
        return [ConnectTo(peer="dialled", address=Address(host="127.0.0.1", port=9), expected_node_id="x")]


@pytest.mark.timeout(20)
def test_close_returns_when_a_task_ended_just_before_it() -> None:
    """A runner task (here, a dial refused at once) that ended in the loop turn
    close() starts in still has its done callback queued.  From Python 3.12 on,
    gather() over tasks that have all ended returns without yielding, so a close()
    that waited for that callback to drop the task spun forever (an endpoint of
    profile_round.py did, at 100% of a core, after its last round); under 3.11
    gather yields and this passes either way."""

    def refused(command: ConnectTo) -> asyncio.Future[object]:
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        future.set_exception(OSError("refused"))
        return future

    async def scenario() -> None:
        machine = DialOnMessage()
        runner = MachineRunner(machine, refused)  # type: ignore[arg-type]
        link = FakeLink()
        link.terminated = True
        peer = runner.attach(link)  # type: ignore[arg-type]
        runner.dispatch(MessageReceived(peer=peer, message=Heartbeat(seq=1)))  # the dial's task is queued
        await asyncio.sleep(0)  # it runs to its end in this turn, ahead of this task
        assert isinstance(machine.seen[-1], PeerDisconnected) and machine.seen[-1].peer == "dialled"
        await runner.close()
        assert runner.closed.is_set()

    asyncio.run(scenario())
