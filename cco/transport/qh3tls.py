"""aioquic's TLS 1.3 engine presented to qh3's QUIC connection.

qh3 moves packets in native code but keeps TLS in Python, behind
``qh3.quic.tls_bridge.QuicTlsBridge``, which drives a ``qh3.tls.Context``.  That
context never sends a CertificateRequest, so a qh3 server cannot authenticate
clients, and every CCO connection must.  aioquic's ``tls.Context`` can (its
``_request_client_certificate`` flag, as :mod:`cco.transport.connection` uses it).
:class:`AioquicTls` wraps one aioquic context in the small interface the bridge
calls, translating what differs between the two libraries:

* **Buffers.**  The bridge passes qh3 ``Buffer`` objects per epoch; aioquic writes
  into its own ``Buffer`` type.  Output is copied across after each message.
* **Enums.**  aioquic's ``Epoch``, ``Direction`` and ``State`` are plain ``Enum``
  types (qh3's are ``IntEnum``), and the server states are numbered differently
  (aioquic has two more, for the client certificate).  Traffic-key callbacks and
  ``state`` are converted by name.
* **Alerts.**  aioquic raises its own ``tls.Alert``; the bridge catches qh3's and
  turns it into CRYPTO_ERROR + description.  :class:`TranslatedAlert` carries the
  description across.

The peer check runs *inside* the handshake: once aioquic reaches its
post-handshake state, ``verify_peer`` gets the peer certificate and its chain and
may raise an aioquic alert.  The bridge then closes the connection with that alert
before it ever reports ``HandshakeCompleted``, so an unauthenticated peer is never
seen as connected.

Session tickets are not supported (``get_session_ticket_cb`` and
``new_session_ticket_cb`` must stay unset): a resumed session would skip the client
certificate, and CCO makes every connection a full handshake.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import qh3.tls
from aioquic import tls as aio_tls
from aioquic.buffer import Buffer as AioBuffer  # type: ignore[attr-defined]  # re-exported from _buffer
from cryptography import x509
from qh3._hazmat import Buffer as Qh3Buffer

PeerVerifier = Callable[[x509.Certificate | None, list[x509.Certificate]], None]
"""Checks the peer's certificate (None if it sent none) and chain; raises an aioquic alert."""

TrafficKeyCallback = Callable[[qh3.tls.Direction, qh3.tls.Epoch, qh3.tls.CipherSuite, bytes], None]

CRYPTO_BUFFER_SIZE = 16384
"""Bytes aioquic may write per epoch and message (both libraries use this size)."""

_POST_HANDSHAKE = (aio_tls.State.CLIENT_POST_HANDSHAKE, aio_tls.State.SERVER_POST_HANDSHAKE)


def _refuse_tickets(callback: object) -> None:
    if callback is not None:
        raise ValueError("session tickets are not supported: every CCO handshake is a full one")


class TranslatedAlert(qh3.tls.Alert):
    """An aioquic TLS alert re-raised as qh3's, keeping its description."""

    def __init__(self, alert: aio_tls.Alert) -> None:
        super().__init__(*alert.args)
        self.description = qh3.tls.AlertDescription(int(alert.description))


class AioquicTls:
    """The part of ``qh3.tls.Context`` that ``QuicTlsBridge`` uses, done by aioquic."""

    def __init__(self, context: aio_tls.Context, verify_peer: PeerVerifier) -> None:
        self._context = context
        self._verify_peer = verify_peer
        self._verified = False
        self._traffic_key_cb: TrafficKeyCallback | None = None

    # -- set by the bridge -------------------------------------------------

    @property
    def handshake_extensions(self) -> list[tuple[int, bytes]]:
        return self._context.handshake_extensions

    @handshake_extensions.setter
    def handshake_extensions(self, extensions: list[tuple[int, bytes]]) -> None:
        self._context.handshake_extensions = extensions

    @property
    def alpn_cb(self) -> Callable[[str], None] | None:
        return self._context.alpn_cb

    @alpn_cb.setter
    def alpn_cb(self, callback: Callable[[str], None] | None) -> None:
        self._context.alpn_cb = callback

    @property
    def update_traffic_key_cb(self) -> TrafficKeyCallback | None:
        return self._traffic_key_cb

    @update_traffic_key_cb.setter
    def update_traffic_key_cb(self, callback: TrafficKeyCallback) -> None:
        """Forward aioquic's new traffic secrets to ``callback`` with qh3's enum types."""
        self._traffic_key_cb = callback

        def forward(
            direction: aio_tls.Direction, epoch: aio_tls.Epoch, suite: aio_tls.CipherSuite, secret: bytes
        ) -> None:
            callback(
                qh3.tls.Direction(direction.value),
                qh3.tls.Epoch(epoch.value),
                qh3.tls.CipherSuite(int(suite)),
                secret,
            )

        self._context.update_traffic_key_cb = forward

    @property
    def get_session_ticket_cb(self) -> None:
        return None

    @get_session_ticket_cb.setter
    def get_session_ticket_cb(self, callback: object) -> None:
        _refuse_tickets(callback)

    @property
    def new_session_ticket_cb(self) -> None:
        return None

    @new_session_ticket_cb.setter
    def new_session_ticket_cb(self, callback: object) -> None:
        _refuse_tickets(callback)

    # -- read by the bridge ------------------------------------------------

    @property
    def state(self) -> qh3.tls.State | aio_tls.State:
        """qh3's state of the same name; aioquic's own for its client-certificate states.

        The bridge only tests for the two post-handshake states, which both have.
        """
        return qh3.tls.State.__members__.get(self._context.state.name, self._context.state)

    @property
    def alpn_negotiated(self) -> str | None:
        return self._context.alpn_negotiated

    @property
    def early_data_accepted(self) -> bool:
        return self._context.early_data_accepted

    @property
    def session_resumed(self) -> bool:
        return self._context.session_resumed

    @property
    def received_extensions(self) -> list[tuple[int, bytes]] | None:
        return self._context.received_extensions

    @property
    def client_random(self) -> bytes | None:
        return self._context.client_random

    @property
    def key_schedule(self) -> Any:
        """aioquic's key schedule; the bridge reads only its ``cipher_suite``."""
        return self._context.key_schedule

    @property
    def peer_certificate(self) -> x509.Certificate | None:
        return self._context._peer_certificate

    @property
    def peer_certificate_chain(self) -> list[x509.Certificate]:
        return self._context._peer_certificate_chain

    # -- the handshake ---------------------------------------------------

    def handle_message(
        self, data: bytes, buffers: dict[qh3.tls.Epoch, Qh3Buffer], epoch: qh3.tls.Epoch
    ) -> None:
        """Feed one epoch's CRYPTO bytes to aioquic; copy what it writes into ``buffers``.

        aioquic tracks the epoch itself from its handshake state, so ``epoch`` is
        only the bridge's bookkeeping.
        """
        output = {e: AioBuffer(capacity=CRYPTO_BUFFER_SIZE) for e in aio_tls.Epoch}
        try:
            self._context.handle_message(data, output)
            if not self._verified and self._context.state in _POST_HANDSHAKE:
                self._verified = True
                self._verify_peer(self.peer_certificate, self.peer_certificate_chain)
        except aio_tls.Alert as alert:
            raise TranslatedAlert(alert) from alert
        for aio_epoch, buf in output.items():
            written = buf.data
            if written:
                buffers[qh3.tls.Epoch(aio_epoch.value)].push_bytes(written)
