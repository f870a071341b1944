"""The batched UDP transport: datagrams read per readiness callback, sending, closing."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from cco.transport.udp import BatchedUdpTransport, open_udp

QUIC_BACKENDS = ("aioquic",)
"""The UDP layer under both backends, no QUIC connection: nothing depends on the backend."""


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


class _NoGsoSocket(_FullSocket):
    """A real socket whose kernel refuses segmentation offload."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock, refusals=0)
        self.refused = 0

    def sendmsg(self, *args: Any) -> int:
        self.refused += 1
        raise OSError(5, "Input/output error")


def _mixed_datagrams() -> list[bytes]:
    # Runs of one size (longer than one GSO send), a shorter datagram ending a run,
    # and a size change: the order and every boundary must survive.
    sizes = [1200] * 70 + [700] + [1200] * 3 + [5000] * 2 + [40]
    return [bytes([index % 256]) * size for index, size in enumerate(sizes)]


async def _send_batch(no_gso: bool) -> tuple[list[bytes], bool, int]:
    loop = asyncio.get_running_loop()
    receiver = await open_udp(Recorder(), "127.0.0.1", 0)
    receiver.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    inbox = receiver._protocol
    assert isinstance(inbox, Recorder)
    raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    raw.bind(("127.0.0.1", 0))
    sock: Any = _NoGsoSocket(raw) if no_gso else raw
    sender = BatchedUdpTransport(loop, sock, Recorder())
    datagrams = _mixed_datagrams()
    sender.send_datagrams(datagrams, receiver.get_extra_info("sockname"))
    sender.send_datagrams(datagrams[:2], receiver.get_extra_info("sockname"))
    while len(inbox.datagrams) < len(datagrams) + 2:
        await asyncio.sleep(0.01)
    gso = sender._gso
    sender.close()
    receiver.close()
    return inbox.datagrams, gso, sock.refused if no_gso else 0


def test_a_batch_keeps_every_datagram_and_its_order() -> None:
    received, gso, _ = asyncio.run(_send_batch(no_gso=False))
    datagrams = _mixed_datagrams()
    assert received == datagrams + datagrams[:2]
    assert gso  # Linux loopback accepts UDP_SEGMENT


def test_without_segmentation_offload_datagrams_go_one_by_one() -> None:
    received, gso, refused = asyncio.run(_send_batch(no_gso=True))
    datagrams = _mixed_datagrams()
    assert received == datagrams + datagrams[:2]
    assert not gso and refused == 1  # refused once, then never tried again
