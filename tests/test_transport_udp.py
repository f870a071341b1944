"""The batched UDP transport: datagrams read per readiness callback, sending, closing."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from cco.transport.udp import BatchedUdpTransport, open_udp


class Recorder(asyncio.DatagramProtocol):
    """Records datagrams and, once per loop turn, how many had arrived by then."""

    def __init__(self) -> None:
        self.datagrams: list[bytes] = []
        self.turns: list[int] = []
        self.lost = asyncio.get_running_loop().create_future()
        self.errors: list[Exception] = []
        self._marked = False

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.datagrams.append(data)
        if not self._marked:
            self._marked = True
            asyncio.get_running_loop().call_soon(self._mark)

    def _mark(self) -> None:
        self._marked = False
        self.turns.append(len(self.datagrams))

    def error_received(self, exc: Exception) -> None:
        self.errors.append(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set_result(exc)


async def _receive_burst(count: int, batch: int) -> Recorder:
    loop = asyncio.get_running_loop()
    recorder = Recorder()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    transport = BatchedUdpTransport(loop, sock, recorder, batch=batch)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for index in range(count):  # all queued in the kernel before the loop reads
            sender.sendto(bytes([index]) * 100, transport.get_extra_info("sockname"))
    while len(recorder.datagrams) < count:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0)
    transport.close()
    assert await asyncio.wait_for(recorder.lost, 2) is None
    assert sock.fileno() == -1
    return recorder


def test_a_burst_is_read_in_one_callback() -> None:
    recorder = asyncio.run(_receive_burst(10, batch=64))
    assert recorder.datagrams == [bytes([i]) * 100 for i in range(10)]
    assert recorder.turns == [10]  # asyncio's own transport gives [1, 2, ..., 10]


def test_the_batch_bounds_one_callback() -> None:
    recorder = asyncio.run(_receive_burst(10, batch=4))
    assert recorder.turns == [4, 8, 10]


class _FullSocket:
    """A real socket whose first ``refusals`` sends fail as if its buffer were full."""

    def __init__(self, sock: socket.socket, refusals: int) -> None:
        self._sock = sock
        self.refusals = refusals

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def sendto(self, data: bytes, addr: Any) -> int:
        if self.refusals:
            self.refusals -= 1
            raise BlockingIOError
        return self._sock.sendto(data, addr)


def test_sends_wait_for_a_writable_socket_in_order() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        receiver = await open_udp(Recorder(), "127.0.0.1", 0)
        inbox = receiver._protocol
        assert isinstance(inbox, Recorder)
        raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        raw.bind(("127.0.0.1", 0))
        full = _FullSocket(raw, refusals=2)
        sender = BatchedUdpTransport(loop, full, Recorder())  # type: ignore[arg-type]
        target = receiver.get_extra_info("sockname")
        for index in range(3):
            sender.sendto(bytes([index]), target)
        assert sender.get_write_buffer_size() == 3  # the first refusal queued all three
        while len(inbox.datagrams) < 3:
            await asyncio.sleep(0.01)
        assert inbox.datagrams == [b"\x00", b"\x01", b"\x02"]
        assert sender.get_write_buffer_size() == 0
        sender.close()
        sender.sendto(b"late", target)  # a closed transport drops silently
        receiver.close()
        await asyncio.sleep(0.05)
        assert inbox.datagrams == [b"\x00", b"\x01", b"\x02"]

    asyncio.run(main())
