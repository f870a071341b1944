"""A UDP transport for the event loop that reads datagrams in batches.

asyncio's own datagram transport reads one datagram per readiness callback, so a
QUIC protocol sees each datagram in its own loop turn and must build and send its
answer (``transmit()``: packet building, timer re-arming, often a packet holding
just an ACK) once per datagram.  Profiles of a busy aggregator put about 40% of
its time there.  :class:`BatchedUdpTransport` reads every datagram the socket has
ready, up to ``batch``, in one callback; a protocol that defers its transmit to
the next loop turn (``call_soon``, as :class:`~cco.transport.link.LinkProtocol`
does) then transmits once per batch, whatever the number of datagrams in it.

Where Linux offers UDP generic receive offload (``UDP_GRO``), the kernel hands over a
sender's consecutive datagrams of one size as one buffer with their size beside it,
up to 64 KiB per read; a :class:`SegmentedDatagramProtocol` takes such a buffer
whole (a QUIC stack can decrypt it in one call), any other protocol gets the
datagrams one by one as before.

Where Linux offers it, the socket also queues ICMP errors (``IP_RECVERR``): the
addresses whose port was reported unreachable go to
:meth:`SegmentedDatagramProtocol.ports_unreachable`, which decides what to believe
(:mod:`cco.transport.unreachable`).

Sending is the kernel's at once; only when the socket buffer is full are datagrams
queued (up to ``max_queued``, then dropped like any UDP datagram the network loses:
QUIC retransmits) and sent when the socket is writable again.
:meth:`BatchedUdpTransport.send_datagrams` hands a transmit's datagrams to Linux as
few ``sendmsg`` calls with UDP generic segmentation offload (``UDP_SEGMENT``): one
system call and one trip down the stack for up to 64 datagrams of one size, split
into datagrams by the kernel (or the NIC).  Where the kernel refuses it, the
transport falls back to one ``sendto`` per datagram for good.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import sys
from typing import Any, cast

from cco.transport.unreachable import drain_error_queue, enable_error_queue

MAX_UDP_PAYLOAD = 65535

UDP_SEGMENT = 103
"""Linux socket option (``<linux/udp.h>``): the segment size of a GSO send."""
UDP_MAX_SEGMENTS = 64
GSO_MAX_BYTES = 65000
"""A GSO send is one IP packet before segmentation: payload under 64 KiB."""

UDP_GRO = 104
"""Linux socket option (``<linux/udp.h>``): receive coalesced datagrams, and their
size in a control message of the same name."""
_GRO_CMSG_SPACE = socket.CMSG_SPACE(4)  # the kernel writes the size as a C int
_MSG_TRUNC = int(socket.MSG_TRUNC)
"""As a plain int: ``socket.MSG_TRUNC`` is an IntFlag, and testing a read's flags
against it built an enum member on every read (0.5 against 0.01 us)."""

DEFAULT_BATCH = 64
"""Datagrams read per readiness callback: enough to amortize a transmit, few enough
that one busy socket cannot starve the rest of the event loop for long."""


class SegmentedDatagramProtocol(asyncio.DatagramProtocol):
    """A datagram protocol that can take a kernel-coalesced run of datagrams whole."""

    def segments_received(self, data: bytes, segment_size: int, addr: Any) -> None:
        """Datagrams from ``addr`` of ``segment_size`` bytes each (the last may be
        shorter), back to back in ``data``.  By default, one ``datagram_received`` each."""
        for datagram in split_segments(data, segment_size):
            self.datagram_received(datagram, addr)

    def ports_unreachable(self, addrs: list[tuple[str, int]]) -> None:
        """ICMP port-unreachable reports about datagrams sent to ``addrs`` (one entry a
        report).  By default, ignored."""


def split_segments(data: bytes, segment_size: int) -> list[bytes]:
    """The datagrams of a coalesced run."""
    return [data[start : start + segment_size] for start in range(0, len(data), segment_size)]


class BatchedUdpTransport(asyncio.DatagramTransport):
    """One UDP socket feeding ``protocol``; the subset of ``DatagramTransport`` QUIC uses."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol: asyncio.DatagramProtocol,
        *,
        batch: int = DEFAULT_BATCH,
        max_queued: int = 1024,
    ) -> None:
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._protocol = protocol
        self._batch = batch
        self._max_queued = max_queued
        self._queue: collections.deque[tuple[bytes, Any]] = collections.deque()
        self._closing = False
        self._gso = sock.family in (socket.AF_INET, socket.AF_INET6) and hasattr(socket, "SOL_UDP")
        self._gro = self._gso and isinstance(protocol, SegmentedDatagramProtocol) and _enable_gro(sock)
        self._errors = isinstance(protocol, SegmentedDatagramProtocol) and enable_error_queue(sock)
        self._extra = {"socket": sock, "sockname": sock.getsockname()}
        sock.setblocking(False)
        protocol.connection_made(self)
        loop.add_reader(sock.fileno(), self._read_ready)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._sock.fileno())
        if self._queue:
            self._loop.remove_writer(self._sock.fileno())
            self._queue.clear()
        self._loop.call_soon(self._finish_close)

    def abort(self) -> None:
        self.close()

    def _finish_close(self) -> None:
        try:
            self._protocol.connection_lost(None)
        finally:
            self._sock.close()

    def get_write_buffer_size(self) -> int:
        return sum(len(data) for data, _ in self._queue)

    # --- receiving -------------------------------------------------------------

    def _read_ready(self) -> None:
        if self._gro:
            self._read_coalesced()
            return
        recvfrom = self._sock.recvfrom
        for turn in range(self._batch):
            if self._closing:
                return
            try:
                data, addr = recvfrom(MAX_UDP_PAYLOAD)
            except (BlockingIOError, InterruptedError):
                if turn == 0 and self._errors:
                    self._drain_errors()  # readable for its error queue alone
                return
            except OSError as exc:
                if self._reported(exc):
                    continue
                self._protocol.error_received(exc)
                return
            self._protocol.datagram_received(data, addr)

    def _read_coalesced(self) -> None:
        """As many reads as it takes for ``batch`` datagrams, each read a run of them."""
        protocol = cast(SegmentedDatagramProtocol, self._protocol)
        recvmsg = self._sock.recvmsg
        budget = self._batch
        while budget > 0 and not self._closing:
            try:
                data, ancdata, flags, addr = recvmsg(MAX_UDP_PAYLOAD, _GRO_CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                if budget == self._batch and self._errors:
                    self._drain_errors()  # readable for its error queue alone
                return
            except OSError as exc:
                if self._reported(exc):
                    budget -= 1
                    continue
                protocol.error_received(exc)
                return
            if flags & _MSG_TRUNC:
                budget -= 1
                continue  # longer than any run the kernel builds: lost, as UDP may be
            segment_size = _segment_size(ancdata)
            if 0 < segment_size < len(data):
                budget -= -(-len(data) // segment_size)
                protocol.segments_received(data, segment_size, addr)
            else:
                budget -= 1
                protocol.datagram_received(data, addr)

    def _reported(self, exc: OSError) -> bool:
        """Whether ``exc`` was the kernel's notice of queued ICMP errors (then read)."""
        if not self._errors or not isinstance(exc, ConnectionRefusedError):
            return False
        self._drain_errors()
        return True

    def _drain_errors(self) -> None:
        unreachable = drain_error_queue(self._sock)
        if unreachable:
            cast(SegmentedDatagramProtocol, self._protocol).ports_unreachable(unreachable)

    # --- sending ---------------------------------------------------------------

    def sendto(self, data: bytes | bytearray | memoryview, addr: Any = None) -> None:
        if self._closing:
            return
        if not self._queue:
            try:
                self._send_now(data, addr)
                return
            except (BlockingIOError, InterruptedError):
                self._loop.add_writer(self._sock.fileno(), self._write_ready)
            except OSError as exc:
                self._protocol.error_received(exc)
                return
        if len(self._queue) < self._max_queued:
            self._queue.append((bytes(data), addr))

    def _send_now(self, data: bytes | bytearray | memoryview, addr: Any) -> None:
        """One ``sendto``; a send that only reported an earlier ICMP error (and so sent
        nothing) is made once more."""
        try:
            self._sock.sendto(data, addr)
        except ConnectionRefusedError as exc:
            if not self._reported(exc):
                raise
            self._sock.sendto(data, addr)

    def send_datagrams(self, datagrams: list[bytes], addr: Any) -> None:
        """Send ``datagrams`` to ``addr`` in order, in runs of one size per system call."""
        start = 0
        count = len(datagrams)
        while start < count:
            size = len(datagrams[start])
            stop = start + 1
            if self._gso and not self._queue and not self._closing:
                limit = min(count, start + UDP_MAX_SEGMENTS, start + max(1, GSO_MAX_BYTES // size))
                while stop < limit and len(datagrams[stop]) == size:
                    stop += 1
                if stop < limit and len(datagrams[stop]) < size:
                    stop += 1  # a shorter datagram may end a run
            if stop - start == 1 or not self._send_segmented(datagrams[start:stop], size, addr):
                for data in datagrams[start:stop]:
                    self.sendto(data, addr)
            start = stop

    def _send_segmented(self, run: list[bytes], size: int, addr: Any) -> bool:
        """One GSO ``sendmsg`` of ``run``; False if it must go datagram by datagram.

        The datagrams go as the message's pieces (an iovec each), not joined first:
        the kernel gathers them as it copies, and segments by ``size`` wherever the
        pieces end, so joining would only copy every byte once more."""
        try:
            self._sock.sendmsg(run, [(socket.SOL_UDP, UDP_SEGMENT, size.to_bytes(2, sys.byteorder))], 0, addr)
            return True
        except (BlockingIOError, InterruptedError):
            return False  # sendto() queues them for a writable socket
        except OSError as exc:
            if self._reported(exc):
                return False  # an earlier ICMP error, not GSO's: these go one by one
            self._gso = False  # not offered here (kernel, device or path): never again
            return False

    def _write_ready(self) -> None:
        while self._queue:
            data, addr = self._queue[0]
            try:
                self._send_now(data, addr)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._protocol.error_received(exc)
            self._queue.popleft()
        self._loop.remove_writer(self._sock.fileno())


def _enable_gro(sock: socket.socket) -> bool:
    try:
        sock.setsockopt(socket.SOL_UDP, UDP_GRO, 1)
    except OSError:
        return False  # an older kernel: datagrams one by one
    return True


def _segment_size(ancdata: list[tuple[int, int, bytes]]) -> int:
    """The datagram size of a coalesced read (0 if the read is one datagram)."""
    for level, kind, value in ancdata:
        if level == socket.SOL_UDP and kind == UDP_GRO and len(value) >= 4:
            return int.from_bytes(value[:4], sys.byteorder)
    return 0


async def open_udp(
    protocol: asyncio.DatagramProtocol, host: str, port: int, *, family: int = socket.AF_UNSPEC
) -> BatchedUdpTransport:
    """Bind a UDP socket to ``host``:``port`` (0: any free port) and start reading."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, family=family, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE)
    af, kind, proto, _, address = infos[0]
    sock = socket.socket(af, kind, proto)
    try:
        sock.bind(address)
        return BatchedUdpTransport(loop, sock, protocol)
    except BaseException:
        sock.close()
        raise
