"""Split the UDP segmentation offload (GSO) sends in a capture into the datagrams they became.

A CCO node on Linux sends many QUIC packets with one ``sendmsg`` (``UDP_SEGMENT``):
one UDP datagram of up to 64 KiB that the kernel, or the network card, cuts into
datagrams of the segment size after the capture point.  A capture taken on the
sending host (always on loopback) therefore holds the uncut datagram, whose QUIC
packets Wireshark cannot separate: it shows them as one undecryptable "Protected
Payload".  This rewrites a classic pcap file (``dumpcap -P`` or ``tshark -F pcap``)
with every such datagram cut into segments, as the peer received them.

The segment size of each send is found from the datagram itself: every segment
starts a QUIC packet for the same destination connection id, so it is the
smallest size (of at least QUIC's 1200 bytes) at whose every multiple that
connection id appears in a packet header.  Connection ids are taken to be 8
bytes long, as both QUIC stacks CCO runs on choose them.

    python interop/wireshark/split_gso.py IN.pcap OUT.pcap
"""

from __future__ import annotations

import argparse
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

ETHERNET = 1  # pcap link type of Linux loopback and Ethernet captures
_IPV4, _IPV6 = 0x0800, 0x86DD
_UDP = 17
MIN_SEGMENT = 1200  # RFC 9000, section 14: no QUIC datagram is smaller, except the last of a send
CID_SIZE = 8


def _records(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(record header, packet bytes) of each packet after the global header."""
    at = 24
    while at < len(data):
        header = data[at : at + 16]
        captured = struct.unpack("<I", header[8:12])[0]
        yield header, data[at + 16 : at + 16 + captured]
        at += 16 + captured


def _checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _connection_id(payload: bytes, at: int) -> bytes | None:
    """The destination connection id of the QUIC packet at ``at``, if one starts there."""
    if at + 6 + CID_SIZE > len(payload) or not payload[at] & 0x40:  # the fixed bit
        return None
    if payload[at] & 0x80:  # a long header: version, then the id's length and the id
        return payload[at + 6 : at + 6 + CID_SIZE] if payload[at + 5] == CID_SIZE else None
    return payload[at + 1 : at + 1 + CID_SIZE]


def segment_size(payload: bytes) -> int | None:
    """The segment size of a GSO send, or None for a datagram sent as it is."""
    first = _connection_id(payload, 0)
    if first is None:
        return None
    for size in range(MIN_SEGMENT, len(payload)):
        if all(_connection_id(payload, at) == first for at in range(size, len(payload), size)):
            return size
    return None


def _split(packet: bytes) -> list[bytes]:
    """``packet`` (Ethernet + IP + UDP) as one packet per segment of its UDP payload."""
    ethertype = struct.unpack("!H", packet[12:14])[0]
    if ethertype == _IPV4 and packet[23] == _UDP:
        ip_size = (packet[14] & 0x0F) * 4
    elif ethertype == _IPV6 and packet[20] == _UDP:
        ip_size = 40
    else:
        return [packet]
    udp_at = 14 + ip_size
    payload = packet[udp_at + 8 :]
    segment = segment_size(payload)
    if segment is None:
        return [packet]
    pieces = []
    for start in range(0, len(payload), segment):
        piece = payload[start : start + segment]
        ip = bytearray(packet[14:udp_at])
        if ethertype == _IPV4:
            struct.pack_into("!H", ip, 2, ip_size + 8 + len(piece))
            struct.pack_into("!H", ip, 10, 0)
            struct.pack_into("!H", ip, 10, _checksum(bytes(ip)))
        else:
            struct.pack_into("!H", ip, 4, 8 + len(piece))
        udp = bytearray(packet[udp_at : udp_at + 8])
        struct.pack_into("!HH", udp, 4, 8 + len(piece), 0)  # no checksum: Wireshark does not verify it
        pieces.append(packet[:14] + bytes(ip) + bytes(udp) + piece)
    return pieces


def split_capture(source: Path, target: Path) -> int:
    """Rewrite ``source`` into ``target`` with GSO sends cut; returns how many were cut."""
    data = source.read_bytes()
    magic, link_type = struct.unpack("<I", data[:4])[0], struct.unpack("<I", data[20:24])[0]
    if magic not in (0xA1B2C3D4, 0xA1B23C4D):
        raise ValueError(f"{source}: not a little-endian classic pcap file (capture with dumpcap -P)")
    if link_type != ETHERNET:
        raise ValueError(f"{source}: link type {link_type}, only Ethernet (1) is handled")
    out = [data[:24]]
    cut = 0
    for header, packet in _records(data):
        pieces = _split(packet)
        cut += len(pieces) > 1
        for piece in pieces:
            out.append(header[:8] + struct.pack("<II", len(piece), len(piece)) + piece)
    target.write_bytes(b"".join(out))
    return cut


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    try:
        cut = split_capture(args.source, args.target)
    except (OSError, ValueError) as exc:
        print(f"split_gso: {exc}", file=sys.stderr)
        return 1
    print(f"{cut} GSO sends cut into their datagrams")
    return 0


if __name__ == "__main__":
    sys.exit(main())
