"""The CCO transport: authenticated QUIC connections carrying framed CCO messages.

Layers, lowest first: :mod:`~cco.transport.certs` (group CA, node certificates,
identities), :mod:`~cco.transport.handshake` (Hello/HelloAck rules, pure),
:mod:`~cco.transport.connection` (aioquic's sans-I/O connection plus mutual
authentication and bounded credit) or, with ``quic_backend="qh3"``,
:mod:`~cco.transport.qh3conn` (qh3's native one, with aioquic's TLS), both behind
:mod:`~cco.transport.backend`, :mod:`~cco.transport.link` (one connection's
handshake, transmission and flow control over asyncio, on the streams of
:mod:`~cco.transport.streams`), :mod:`~cco.transport.peerlink` (the open session
the services hold) and :mod:`~cco.transport.endpoint` (:func:`serve` and
:func:`connect`).
"""

from cco.transport.certs import NodeIdentity, create_dev_pki, identity_from_certificate
from cco.transport.config import TransportConfig
from cco.transport.endpoint import Server, connect, serve
from cco.transport.handshake import LocalIdentity
from cco.transport.pathstats import PathStats
from cco.transport.peerlink import LinkClosed, PeerLink

__all__ = [
    "LinkClosed",
    "LocalIdentity",
    "NodeIdentity",
    "PathStats",
    "PeerLink",
    "Server",
    "TransportConfig",
    "connect",
    "create_dev_pki",
    "identity_from_certificate",
    "serve",
]
