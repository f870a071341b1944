"""A link's inbox (cco.transport.inbox) without a connection: a listener gets at most
messages_per_turn messages per turn of the event loop, what was queued before it
listened comes first, the close comes last and once; queued bytes past the receive
buffer freeze the credit and reading back under half of it thaws it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from cco.transport.inbox import Inbox
from cco.transport.peerlink import LinkClosed
from cco.wire.errors import CcoError, DecodeError, ErrorCode
from cco.wire.messages import Heartbeat, Message


@dataclass
class Credit:
    frozen: bool = False


@dataclass
class Recorder:
    """A listener that notes what it is handed, and in which turn."""

    turn: int = 0
    items: list[tuple[int, Message | CcoError]] = field(default_factory=list)
    closes: list[tuple[ErrorCode, str]] = field(default_factory=list)

    def deliver(self, item: Message | CcoError) -> None:
        self.items.append((self.turn, item))

    def closed(self, code: ErrorCode, detail: str) -> None:
        self.closes.append((code, detail))


def inbox(
    receive_buffer: int = 1 << 20,
    messages_per_turn: int = 64,
    credit: Credit | None = None,
    on_thaw: Callable[[], None] = lambda: None,
) -> Inbox:
    """An inbox on the running loop."""
    return Inbox(
        asyncio.get_running_loop(),
        receive_buffer=receive_buffer,
        messages_per_turn=messages_per_turn,
        credit=credit or Credit(),
        on_thaw=on_thaw,
    )


def beats(count: int) -> list[Message]:
    return [Heartbeat(seq=i) for i in range(count)]


async def turns(recorder: Recorder, count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)
        recorder.turn += 1


def test_a_listener_gets_the_queue_first_within_a_budget_per_turn_then_the_close_once() -> None:
    async def scenario() -> Recorder:
        thawed: list[bool] = []
        queue = inbox(messages_per_turn=2, on_thaw=lambda: thawed.append(True))
        for message in beats(3):
            queue.put(message, 10)
        recorder = Recorder()
        queue.listen(recorder)
        queue.put(Heartbeat(seq=3), 10)  # queued behind the others, not handed over first
        queue.close(ErrorCode.NO_ERROR, "bye")
        queue.close(ErrorCode.INTERNAL_ERROR, "a second close changes nothing")
        await turns(recorder, 6)
        assert not thawed
        return recorder

    recorder = asyncio.run(scenario())
    assert [item.seq for _, item in recorder.items] == [0, 1, 2, 3]  # type: ignore[union-attr]
    per_turn = [sum(1 for turn, _ in recorder.items if turn == t) for t in range(6)]
    assert max(per_turn) <= 2 and sum(per_turn) == 4
    assert recorder.closes == [(ErrorCode.NO_ERROR, "bye")]


def test_queued_bytes_past_the_buffer_freeze_the_credit_and_reading_thaws_it() -> None:
    async def scenario() -> tuple[list[bool], Inbox]:
        thawed: list[bool] = []
        credit = Credit()
        queue = inbox(receive_buffer=100, credit=credit, on_thaw=lambda: thawed.append(True))
        for message in beats(4):
            queue.put(message, 40)
        assert credit.frozen and queue.queued == 4 and queue.queued_bytes == 160
        await queue.get()  # 120 left: above half the buffer, still frozen
        assert credit.frozen
        await queue.get()
        await queue.get()  # 40 left: thawed
        assert not credit.frozen
        await asyncio.sleep(0)
        return thawed, queue

    thawed, queue = asyncio.run(scenario())
    assert thawed == [True] and queue.queued == 1


def test_get_raises_a_queued_decode_error_then_link_closed_once_empty() -> None:
    async def scenario() -> None:
        queue = inbox()
        queue.put(DecodeError(ErrorCode.MALFORMED_CBOR, "not CBOR"), 5)
        queue.put(Heartbeat(seq=7), 5)
        queue.close(ErrorCode.PEER_LOST, "gone")
        with pytest.raises(DecodeError):
            await queue.get()
        assert await queue.get() == Heartbeat(seq=7)
        with pytest.raises(LinkClosed) as closed:
            await queue.get()
        assert closed.value.code is ErrorCode.PEER_LOST

    asyncio.run(scenario())


def test_a_waiting_reader_wakes_for_a_message() -> None:
    async def scenario() -> Message:
        queue = inbox()
        waiting = asyncio.ensure_future(queue.get())
        await asyncio.sleep(0)
        assert not waiting.done()
        queue.put(Heartbeat(seq=1), 5)
        return await asyncio.wait_for(waiting, 5)

    assert asyncio.run(scenario()) == Heartbeat(seq=1)
