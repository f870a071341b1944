"""Transport settings: credentials, packet size, limits, and diagnostics output."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cco.transport.certs import CA_CERT_FILE, node_paths
from cco.wire.framing import DEFAULT_MAX_MESSAGE_SIZE
from cco.wire.registries import SUPPORTED_VERSIONS

MiB = 1024 * 1024

MIN_DATAGRAM_SIZE = 1200
"""QUIC's floor (RFC 9000, section 14): every path must carry 1200-byte datagrams."""

QUIC_BACKENDS = ("aioquic", "qh3")
"""QUIC implementations a link can run on (see :mod:`cco.transport.backend`)."""
QUIC_BACKEND_ENV = "CCO_QUIC_BACKEND"

MAX_DATAGRAM_SIZE = 65507
"""The largest UDP payload over IPv4; what a link really carries is usually far less."""


DEFAULT_IDLE_TIMEOUT = 30.0


def idle_timeout_above(liveness_ms: int) -> float:
    """A QUIC idle timeout that outlasts a liveness window of ``liveness_ms``: twice the
    window, and never under the default."""
    return max(DEFAULT_IDLE_TIMEOUT, 2 * liveness_ms / 1000)


@dataclass(frozen=True, slots=True, kw_only=True)
class TransportConfig:
    """Everything a node's QUIC transport needs besides addresses and identity.

    Flow control (see :mod:`cco.transport.link` for the full argument):

    * ``receive_window``: QUIC credit the peer holds beyond what we have received
      (connection-level MAX_DATA slides with receipt instead of aioquic's doubling).
    * ``receive_buffer``: decoded messages the application has not read yet; above
      it we stop extending credit, so the peer stalls after at most one more
      ``receive_window``.  Unread messages per connection therefore stay below
      ``receive_buffer + max_message_size + receive_window``, plus one partial
      frame (under ``max_message_size``) per open stream.
    * ``send_buffer``: bytes handed to QUIC but not yet sent; :meth:`PeerLink.drain`
      waits while more than this is pending.
    """

    ca_file: Path
    cert_file: Path
    key_file: Path
    max_datagram_size: int = 1452
    """UDP payload size of the packets we send.  1452 fits a 1500-byte Ethernet MTU
    over IPv6 (1500 - 40 - 8); loopback (MTU 65536) and jumbo-frame links allow far
    more, and since a QUIC stack's cost is mostly per packet, ~16000 there is
    several times faster (GUIDE section 5; 2x with qh3, more with aioquic).  Above
    ~16000 gains flatten and 65000 fails."""
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    """Seconds of silence after which QUIC drops the connection (reported as PEER_LOST).
    Keep it above the liveness window (:func:`idle_timeout_above`), so that the
    heartbeats, not the transport, decide when a stalled peer is lost."""
    hello_timeout: float = 10.0
    """Seconds a server waits for Hello after the TLS handshake before closing (TIMEOUT)."""
    close_flush_timeout: float = 2.0
    """Seconds ``close()`` keeps delivering queued messages before the QUIC close."""
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    """Largest frame we accept; advertised to the peer in Hello/HelloAck capabilities."""
    receive_window: int = 8 * MiB
    receive_buffer: int = 32 * MiB
    send_buffer: int = 8 * MiB
    socket_buffer: int = 4 * MiB
    """SO_RCVBUF / SO_SNDBUF requested for the UDP socket (the kernel caps it at
    net.core.rmem_max / wmem_max).  Large datagrams arriving in bursts from several
    peers overflow the default (~208 KiB) receive buffer; every drop costs a QUIC
    loss-recovery delay, which dominated collective latency on loopback."""
    send_queue_limit: int = 8 * MiB
    """Bytes handed to QUIC for one accepted connection and not yet sent, beyond which
    the peer is taken not to read: the connection is closed at once with
    RESOURCE_EXHAUSTED and what was queued for it is dropped.  An honest peer is owed
    at most ``window`` chunk messages per group it shares with this node; a node
    that serves many groups to one peer (an aggregator below another) or very large
    chunks needs more.  Links this node dialled are not bounded: they carry what
    this node itself chose to send."""
    unfinished_bytes_per_connection: int = 2 * DEFAULT_MAX_MESSAGE_SIZE
    """Bytes of frames received in part that one connection may hold (never below
    ``max_message_size``: one frame must fit); past it the connection is closed
    with RESOURCE_EXHAUSTED.  QUIC's credit slides as data arrives, so without it a
    peer could leave a large frame unfinished on every stream it may open."""
    unfinished_bytes: int = 64 * MiB
    """The same bound for all the connections a server accepted together; the
    connection that passes it is closed with RESOURCE_EXHAUSTED."""
    frame_timeout: float = 30.0
    """Seconds a frame received in part may go without a byte more before its
    connection is closed with TIMEOUT."""
    retry_threshold: int = 16
    """Half-open connections (started, QUIC handshake not complete) past which a
    server answers a client Initial without a token with a Retry (address
    validation, RFC 9000 section 8.1) instead of starting a connection.  0: always."""
    max_half_open: int = 256
    """Half-open connections past which a server starts none, token or not."""
    handshake_timeout: float = 5.0
    """Seconds a server gives a connection to complete its QUIC handshake; one that
    has not is dropped without a word (its Initial may have come from a forged
    address).  The Hello exchange that follows has ``hello_timeout``."""
    messages_per_turn: int = 64
    """Messages of one connection handed to its listener (the node's machine) in one
    turn of the event loop; the rest wait for the next turns, held by the receive
    buffer's bound.  A flood on one connection is thus throttled on that connection,
    and every other connection is heard between two of its batches."""
    versions: tuple[int, ...] = SUPPORTED_VERSIONS
    """Protocol versions offered (client) or accepted (server)."""
    close_on_decode_error: bool = True
    """If False, a well-framed message that fails to decode is raised from
    :meth:`PeerLink.receive` and the connection stays open; framing errors are
    always fatal, since the stream position is lost."""
    quic_backend: str = field(default_factory=lambda: os.environ.get(QUIC_BACKEND_ENV, "qh3"))
    """QUIC implementation: ``"qh3"`` (native packet processing, several times less
    CPU per packet) or ``"aioquic"`` (pure Python).  Peers need not use the same one.
    Default: the environment variable ``CCO_QUIC_BACKEND`` (as for ``cco-node
    --quic-backend``), else qh3, so a training script or a whole test run can change
    stacks without code."""
    qlog_dir: Path | None = None
    """Write one qlog trace per connection here (kept in memory until it closes)."""
    keylog_file: Path | None = None
    """Append TLS secrets in NSS key log format (for Wireshark) to this file."""

    def __post_init__(self) -> None:
        if self.quic_backend not in QUIC_BACKENDS:
            raise ValueError(f"quic_backend {self.quic_backend!r} is not one of {', '.join(QUIC_BACKENDS)}")
        if not MIN_DATAGRAM_SIZE <= self.max_datagram_size <= MAX_DATAGRAM_SIZE:
            raise ValueError(
                f"max_datagram_size {self.max_datagram_size} is outside "
                f"[{MIN_DATAGRAM_SIZE}, {MAX_DATAGRAM_SIZE}]"
            )
        if not 1024 <= self.max_message_size <= (1 << 32) - 1:
            raise ValueError(f"max_message_size {self.max_message_size} is outside [1024, 2^32 - 1]")
        for name in (
            "idle_timeout",
            "hello_timeout",
            "close_flush_timeout",
            "frame_timeout",
            "handshake_timeout",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.retry_threshold < 0 or self.max_half_open < 1:
            raise ValueError("retry_threshold must not be negative, max_half_open must be at least 1")
        if self.messages_per_turn < 1:
            raise ValueError("messages_per_turn must be at least 1")
        for name in (
            "receive_window",
            "receive_buffer",
            "send_buffer",
            "send_queue_limit",
            "unfinished_bytes_per_connection",
            "unfinished_bytes",
        ):
            if getattr(self, name) < 64 * 1024:
                raise ValueError(f"{name} must be at least 64 KiB")
        if not self.versions or any(not 0 <= v < 1 << 32 for v in self.versions):
            raise ValueError(f"versions {self.versions} must be a non-empty list of 32-bit values")

    @classmethod
    def for_node(cls, pki_dir: str | Path, node_id: str, **overrides: Any) -> TransportConfig:
        """The configuration of ``node_id`` in a directory written by ``create_dev_pki``."""
        pki_dir = Path(pki_dir)
        cert_file, key_file = node_paths(pki_dir, node_id)
        return cls(ca_file=pki_dir / CA_CERT_FILE, cert_file=cert_file, key_file=key_file, **overrides)
