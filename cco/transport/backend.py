"""Which QUIC implementation carries a link: one interface, two backends.

``TransportConfig.quic_backend`` selects it:

* ``"qh3"`` (default): :class:`~cco.transport.qh3conn.Qh3Connection`, qh3's native
  packet core with aioquic's TLS for client certificates; several times less CPU
  per packet, which is what bounds a node's goodput at MTU 1500.
* ``"aioquic"``: :class:`~cco.transport.connection.CcoQuicConnection`, pure Python,
  with this package's changes to aioquic (bounded credit, fewer ACK-only packets, a
  non-copying send buffer).

Both satisfy :class:`QuicLink`, all that link.py and endpoint.py use of a
connection, and both hand out aioquic's event classes.  :func:`connection_factory`
is the only place that knows which backend is in use, but for :class:`Diagnostics`,
whose qlog writer is the backend's own type.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, Protocol, TextIO

from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.logger import QuicFileLogger

from cco.transport.certs import Credentials, NodeIdentity, identity_from_certificate, load_credentials
from cco.transport.config import TransportConfig
from cco.transport.connection import CcoQuicConnection
from cco.transport.handshake import LocalIdentity
from cco.transport.pathstats import PathStats
from cco.wire.registries import ALPN


class Credit(Protocol):
    """Receive credit the link can hold still while its application falls behind."""

    frozen: bool


class Side(Protocol):
    @property
    def is_client(self) -> bool: ...


class QuicLink(Protocol):
    """One CCO QUIC connection, as link.py and endpoint.py drive it (sans I/O)."""

    @property
    def configuration(self) -> Side: ...
    @property
    def host_cid(self) -> bytes: ...
    @property
    def peer_identity(self) -> NodeIdentity | None:
        """The authenticated peer, once ``HandshakeCompleted`` has been returned."""

    @property
    def credit(self) -> Credit: ...
    @property
    def stream_bytes_sent(self) -> int:
        """Stream bytes sent at least once, over all streams."""

    @property
    def bytes_in_flight(self) -> int: ...
    def path_stats(self) -> PathStats:
        """Round trip, congestion window and bytes in flight as QUIC measures them."""

    @property
    def termination(self) -> events.ConnectionTerminated | None:
        """Why the connection is closing, as soon as that is known."""

    def connect(self, addr: Any, now: float) -> None: ...
    def receive_datagram(self, data: bytes, addr: Any, now: float) -> None: ...
    def receive_segments(self, data: bytes, segment_size: int, addr: Any, now: float) -> None:
        """Datagrams of ``segment_size`` bytes back to back (UDP GRO), the last maybe shorter."""

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Any]]: ...
    def get_timer(self) -> float | None: ...
    def handle_timer(self, now: float) -> None: ...
    def next_event(self) -> events.QuicEvent | None: ...
    def get_next_available_stream_id(self, is_unidirectional: bool = False) -> int: ...
    def send_stream_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None: ...
    def close(self, error_code: int = 0, frame_type: int | None = None, reason_phrase: str = "") -> None: ...


class Diagnostics:
    """The qlog writer and TLS key log file one server or client connection owns."""

    def __init__(self, config: TransportConfig) -> None:
        self.quic_logger: Any = None
        self.keylog: TextIO | None = None
        if config.qlog_dir is not None:
            config.qlog_dir.mkdir(parents=True, exist_ok=True)
            if config.quic_backend == "qh3":
                from qh3.quic.logger import QuicFileLogger as Qh3FileLogger

                self.quic_logger = Qh3FileLogger(str(config.qlog_dir))
            else:
                self.quic_logger = QuicFileLogger(str(config.qlog_dir))
        if config.keylog_file is not None:
            self.keylog = open(config.keylog_file, "a", buffering=1)  # noqa: SIM115 (closed by close())

    def close(self) -> None:
        if self.keylog is not None:
            self.keylog.close()
            self.keylog = None


class ConnectionFactory(Protocol):
    """Makes the connections of one server or client, and says how to route them."""

    @property
    def connection_id_length(self) -> int: ...
    @property
    def supported_versions(self) -> list[int]: ...
    def client(self, expected_node_id: str) -> QuicLink: ...
    def server(self, original_destination_connection_id: bytes) -> QuicLink: ...


def _settings(config: TransportConfig, is_client: bool, diagnostics: Diagnostics) -> dict[str, Any]:
    """The QuicConfiguration fields both stacks take alike (their classes share them)."""
    return {
        "is_client": is_client,
        "alpn_protocols": [ALPN],
        "idle_timeout": config.idle_timeout,
        "max_datagram_size": config.max_datagram_size,
        "max_data": config.receive_window,
        "max_stream_data": config.receive_window,
        "quic_logger": diagnostics.quic_logger,
        "secrets_log_file": diagnostics.keylog,
    }


def aioquic_configuration(
    config: TransportConfig, *, is_client: bool, diagnostics: Diagnostics
) -> QuicConfiguration:
    """aioquic's configuration for one side.

    ``server_name`` stays unset: the client checks the server's identity itself
    (see :mod:`cco.transport.peercheck`), so no SNI is sent.
    """
    quic_config = QuicConfiguration(
        **_settings(config, is_client, diagnostics), verify_mode=ssl.CERT_REQUIRED
    )
    quic_config.load_cert_chain(config.cert_file, config.key_file)
    quic_config.load_verify_locations(cafile=str(config.ca_file))
    return quic_config


class _AioquicFactory:
    def __init__(self, config: TransportConfig, is_client: bool, diagnostics: Diagnostics) -> None:
        self._quic_config = aioquic_configuration(config, is_client=is_client, diagnostics=diagnostics)
        self._receive_window = config.receive_window
        self.connection_id_length: int = self._quic_config.connection_id_length
        self.supported_versions: list[int] = self._quic_config.supported_versions

    def client(self, expected_node_id: str) -> QuicLink:
        return CcoQuicConnection(
            configuration=self._quic_config,
            receive_window=self._receive_window,
            expected_node_id=expected_node_id,
        )

    def server(self, original_destination_connection_id: bytes) -> QuicLink:
        return CcoQuicConnection(
            configuration=self._quic_config,
            receive_window=self._receive_window,
            original_destination_connection_id=original_destination_connection_id,
        )


class _Qh3Factory:
    def __init__(
        self, config: TransportConfig, is_client: bool, diagnostics: Diagnostics, credentials: Credentials
    ) -> None:
        # Imported when chosen: a node on aioquic does not load qh3's native module.
        from qh3.quic.configuration import QuicConfiguration as Qh3Configuration

        from cco.transport.qh3conn import Qh3Connection

        self._connection_class = Qh3Connection
        self._quic_config = Qh3Configuration(**_settings(config, is_client, diagnostics))
        # qh3's bridge insists that a server holds its own certificate; the TLS
        # that runs is aioquic's, which gets ``credentials``.
        self._quic_config.load_cert_chain(config.cert_file, config.key_file)
        self._credentials = credentials
        self._cafile = str(config.ca_file)
        self.connection_id_length: int = self._quic_config.connection_id_length
        self.supported_versions: list[int] = self._quic_config.supported_versions

    def client(self, expected_node_id: str) -> QuicLink:
        return self._connection_class(
            configuration=self._quic_config,
            credentials=self._credentials,
            cafile=self._cafile,
            expected_node_id=expected_node_id,
        )

    def server(self, original_destination_connection_id: bytes) -> QuicLink:
        return self._connection_class(
            configuration=self._quic_config,
            credentials=self._credentials,
            cafile=self._cafile,
            original_destination_connection_id=original_destination_connection_id,
        )


def connection_factory(
    config: TransportConfig, local: LocalIdentity, *, is_client: bool, diagnostics: Diagnostics
) -> ConnectionFactory:
    """The factory of ``config.quic_backend``, after checking our own certificate is ``local``'s."""
    credentials = load_credentials(Path(config.cert_file), Path(config.key_file))
    own = identity_from_certificate(credentials.certificate)
    if (own.node_id, own.role) != (local.node_id, local.role):
        raise ValueError(
            f"{config.cert_file} is for {own.node_id!r} as {own.role.name.lower()}, "
            f"not {local.node_id!r} as {local.role.name.lower()}"
        )
    if config.quic_backend == "qh3":
        return _Qh3Factory(config, is_client, diagnostics, credentials)
    return _AioquicFactory(config, is_client, diagnostics)
