"""Peers whose port is closed: ICMP port-unreachable reports, and when to believe them.

A process that ends (killed, crashed) closes its UDP sockets; the datagrams its peers
keep sending (heartbeats, QUIC's retransmissions) then draw ICMP port-unreachable
messages from its host.  Linux hands them to a socket that asks for them
(``IP_RECVERR`` / ``IPV6_RECVERR``) in its error queue, each with the destination
of the datagram that drew it.  Without this, a peer that is gone is noticed only
when the liveness window runs out (draft section "Heartbeats and Loss Detection");
with it, within about a second where the reports arrive.

Anyone who can reach this host can forge such a message, so one report proves
nothing: :class:`UnreachableTracker` believes a peer's port closed only when
reports naming that address and port keep coming for :data:`CONFIRM_SPAN` seconds
(at least :data:`CONFIRM_REPORTS` of them), and any datagram from the address in
between clears the suspicion.  A forger must then keep sending, matching the
address and port of a live connection, while the peer itself says nothing.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
import sys
from collections import OrderedDict
from typing import Any

CONFIRM_SPAN = 0.3
"""Seconds over which port-unreachable reports about one address must keep coming."""
CONFIRM_REPORTS = 3
"""Reports about one address, at least, within a confirmation."""
FORGET_AFTER = 10.0
"""Reports older than this start a new count: a stray report long ago is no evidence."""
MAX_SUSPECTS = 256
"""Addresses followed at once; the oldest is dropped beyond this (bounded memory)."""

IP_RECVERR = 11  # <linux/in.h>
IPV6_RECVERR = 25  # <linux/in6.h>
_EXTENDED_ERROR = struct.Struct("=IBBBBII")  # struct sock_extended_err
_ORIGIN_ICMP, _ORIGIN_ICMP6 = 2, 3
_PORT_UNREACHABLE = {(_ORIGIN_ICMP, 3, 3), (_ORIGIN_ICMP6, 1, 4)}  # (origin, type, code)
_ERROR_CMSG_SPACE = 512


def peer_key(addr: Any) -> tuple[str, int]:
    """An address as both a datagram's source and an error's destination name it."""
    return addr[0], addr[1]


def enable_error_queue(sock: socket.socket) -> bool:
    """Ask Linux to queue ICMP errors on ``sock``, with the address each is about."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "MSG_ERRQUEUE"):
        return False
    try:
        if sock.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVERR, 1)
            # an IPv6 socket may carry IPv4 too (mapped addresses); best effort
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
        elif sock.family == socket.AF_INET:
            sock.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
        else:
            return False
    except OSError:
        return False
    return True


def drain_error_queue(sock: socket.socket, limit: int = 64) -> list[tuple[str, int]]:
    """Empty ``sock``'s error queue (up to ``limit`` entries); the addresses whose
    port was reported unreachable, one per report."""
    unreachable: list[tuple[str, int]] = []
    for _ in range(limit):
        try:
            _, ancdata, _, addr = sock.recvmsg(1, _ERROR_CMSG_SPACE, socket.MSG_ERRQUEUE)
        except OSError:  # BlockingIOError: the queue is empty
            break
        if addr and any(_is_port_unreachable(level, kind, data) for level, kind, data in ancdata):
            unreachable.append(peer_key(addr))
    return unreachable


def _is_port_unreachable(level: int, kind: int, data: bytes) -> bool:
    if (level, kind) not in ((socket.IPPROTO_IP, IP_RECVERR), (socket.IPPROTO_IPV6, IPV6_RECVERR)):
        return False
    if len(data) < _EXTENDED_ERROR.size:
        return False
    ee_errno, origin, icmp_type, icmp_code, _, _, _ = _EXTENDED_ERROR.unpack_from(data)
    return ee_errno == errno.ECONNREFUSED and (origin, icmp_type, icmp_code) in _PORT_UNREACHABLE


class UnreachableTracker:
    """Which addresses have drawn port-unreachable reports, and since when; sans I/O."""

    def __init__(self) -> None:
        self.suspects: OrderedDict[tuple[str, int], tuple[float, int]] = OrderedDict()
        """Address -> (first report, reports): test it before :meth:`heard` on a hot path."""

    def report(self, addr: tuple[str, int], now: float) -> bool:
        """One report about ``addr`` at ``now``; True once the reports confirm it (the
        address is then forgotten, so that the next confirmation needs new reports)."""
        first, count = self.suspects.pop(addr, (now, 0))
        if now - first > FORGET_AFTER:
            first, count = now, 0
        count += 1
        if count >= CONFIRM_REPORTS and now - first >= CONFIRM_SPAN:
            return True
        self.suspects[addr] = (first, count)
        while len(self.suspects) > MAX_SUSPECTS:
            self.suspects.popitem(last=False)
        return False

    def heard(self, addr: tuple[str, int]) -> None:
        """A datagram came from ``addr``: its port is open after all."""
        self.suspects.pop(addr, None)
