"""The batched UDP transport: datagrams read per readiness callback, sending, closing."""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

import pytest

from cco.transport.udp import (
    UDP_GRO,
    BatchedUdpTransport,
    SegmentedDatagramProtocol,
    open_udp,
    split_segments,
)

pytestmark = pytest.mark.quic_backends("aioquic")  # backend-independent parts: run once
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


# --- receiving coalesced runs (UDP GRO) -------------------------------------------


class RunRecorder(SegmentedDatagramProtocol):
    """Takes runs whole: records each run's datagram size and the datagrams in it."""

    def __init__(self) -> None:
        self.datagrams: list[bytes] = []
        self.runs: list[tuple[int, int]] = []  # (segment size, datagrams)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.datagrams.append(data)

    def segments_received(self, data: bytes, segment_size: int, addr: Any) -> None:
        run = split_segments(data, segment_size)
        self.runs.append((segment_size, len(run)))
        self.datagrams.extend(run)


class SplittingRecorder(SegmentedDatagramProtocol):
    """Keeps the default ``segments_received``: one ``datagram_received`` per datagram."""

    def __init__(self) -> None:
        self.datagrams: list[bytes] = []

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.datagrams.append(data)


async def _coalesced(receiver_protocol: RunRecorder | SplittingRecorder, datagrams: list[bytes]) -> bool:
    loop = asyncio.get_running_loop()
    receiver = await open_udp(receiver_protocol, "127.0.0.1", 0)
    receiver.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    sender = await open_udp(Recorder(), "127.0.0.1", 0)
    sender.send_datagrams(datagrams, receiver.get_extra_info("sockname"))  # GSO runs
    deadline = loop.time() + 5
    while len(receiver_protocol.datagrams) < len(datagrams) and loop.time() < deadline:
        await asyncio.sleep(0.01)
    gro = receiver._gro
    sender.close()
    receiver.close()
    return gro


def test_a_coalesced_run_reaches_a_segmented_protocol_whole() -> None:
    recorder = RunRecorder()
    datagrams = _mixed_datagrams()
    if not asyncio.run(_coalesced(recorder, datagrams)):
        pytest.skip("this kernel does not offer UDP_GRO")
    assert recorder.datagrams == datagrams  # every datagram, in order, boundaries intact
    assert any(count > 1 for _, count in recorder.runs)  # the kernel did coalesce
    assert all(size in (1200, 5000) for size, _ in recorder.runs)


def test_the_default_segments_received_delivers_datagrams_one_by_one() -> None:
    recorder = SplittingRecorder()
    datagrams = _mixed_datagrams()
    if not asyncio.run(_coalesced(recorder, datagrams)):
        pytest.skip("this kernel does not offer UDP_GRO")
    assert recorder.datagrams == datagrams


def test_only_a_segmented_protocol_asks_for_coalesced_runs() -> None:
    async def main() -> tuple[bool, bool]:
        plain = await open_udp(Recorder(), "127.0.0.1", 0)
        segmented = await open_udp(RunRecorder(), "127.0.0.1", 0)
        flags = (plain._gro, segmented._gro)
        plain.close()
        segmented.close()
        return flags

    plain, segmented = asyncio.run(main())
    assert not plain  # asyncio.DatagramProtocol gets one datagram per call, as always
    assert segmented or not hasattr(socket, "SOL_UDP")


def test_a_run_counts_its_datagrams_against_the_batch() -> None:
    """64 datagrams in coalesced runs end one callback, however few reads they took."""

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        turns: list[int] = []

        class Counting(RunRecorder):
            marked = False

            def segments_received(self, data: bytes, segment_size: int, addr: Any) -> None:
                super().segments_received(data, segment_size, addr)
                self._mark_turn()

            def datagram_received(self, data: bytes, addr: Any) -> None:
                super().datagram_received(data, addr)
                self._mark_turn()

            def _mark_turn(self) -> None:
                if not self.marked:
                    self.marked = True
                    loop.call_soon(self._end_turn)

            def _end_turn(self) -> None:
                self.marked = False
                turns.append(len(self.datagrams))

        recorder = Counting()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        transport = BatchedUdpTransport(loop, sock, recorder, batch=64)
        if not transport._gro:
            transport.close()
            pytest.skip("this kernel does not offer UDP_GRO")
        loop.remove_reader(sock.fileno())  # let the runs queue up in the kernel first
        sender = await open_udp(Recorder(), "127.0.0.1", 0)
        for _ in range(4):  # 4 GSO sends of 40 datagrams: 160 datagrams, a few reads
            sender.send_datagrams([bytes(1000)] * 40, transport.get_extra_info("sockname"))
        sender.close()
        await asyncio.sleep(0.05)
        loop.add_reader(sock.fileno(), transport._read_ready)
        while len(recorder.datagrams) < 160:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)
        transport.close()
        return turns

    turns = asyncio.run(main())
    assert turns[-1] == 160 and len(turns) >= 2  # counting reads, one callback would take all 160
    assert all(later - earlier <= 64 + 40 for earlier, later in zip([0, *turns], turns, strict=False))


def test_a_truncated_coalesced_read_is_dropped_and_counted_against_the_batch() -> None:
    """A read the kernel flags MSG_TRUNC (longer than the buffer) is lost, as UDP may
    lose it, and counts as one datagram against the batch; the reads after it arrive
    as usual."""

    class Reads:
        """The socket's side of three reads: a truncated one, a run of two, a single datagram."""

        def __init__(self, sock: socket.socket, addr: Any) -> None:
            self.sock = sock
            gro_size = (4).to_bytes(4, sys.byteorder)
            self.results: list[tuple[bytes, list[tuple[int, int, bytes]], int, Any]] = [
                (b"t" * 100, [], socket.MSG_TRUNC, addr),
                (b"a" * 8, [(socket.SOL_UDP, UDP_GRO, gro_size)], 0, addr),
                (b"single", [], 0, addr),
            ]

        def recvmsg(self, size: int, ancillary: int) -> tuple[bytes, list[tuple[int, int, bytes]], int, Any]:
            if not self.results:
                raise BlockingIOError
            return self.results.pop(0)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sock, name)

    async def main() -> tuple[list[bytes], list[bytes], list[tuple[int, int]]]:
        recorder = RunRecorder()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        transport = BatchedUdpTransport(asyncio.get_running_loop(), sock, recorder, batch=3)
        transport._sock = Reads(sock, ("127.0.0.1", 9))  # type: ignore[assignment]
        transport._read_coalesced()  # the truncated read and the run: 3 datagrams, the batch
        first = list(recorder.datagrams)
        transport._read_coalesced()
        transport._sock = sock
        transport.close()
        await asyncio.sleep(0)
        return first, recorder.datagrams, recorder.runs

    first, everything, runs = asyncio.run(main())
    assert first == [b"aaaa", b"aaaa"]
    assert everything == [b"aaaa", b"aaaa", b"single"]
    assert runs == [(4, 2)]
