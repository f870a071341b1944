"""The CCO session handshake (Hello / HelloAck) as pure functions.

After TLS has authenticated both certificates, the client sends ``Hello`` on the
control stream and the server answers ``HelloAck`` or ``Error`` (draft section
"Session Establishment").  The rules live here, free of I/O, so that the asyncio
adapter only moves messages and both sides can be tested without a network:

* ``Hello.node_id`` and ``Hello.role`` equal the client certificate's identity,
  else ``UNAUTHORIZED``; likewise ``HelloAck`` and the server certificate.
* The server picks the highest offered version it supports, else
  ``UNSUPPORTED_VERSION``.
* The server echoes only the offered extension ids it supports; unknown ids are
  ignored, never an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from cco.transport.certs import NodeIdentity
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Capabilities, Hello, HelloAck
from cco.wire.registries import SUPPORTED_VERSIONS, Role


@dataclass(frozen=True, slots=True)
class LocalIdentity:
    """Who this node is and what it can process.

    ``capabilities.max_message_size`` is replaced by the transport's own
    ``TransportConfig.max_message_size`` when advertised: the transport enforces
    that limit, so it is the only one that may be promised.
    """

    node_id: str
    role: Role
    capabilities: Capabilities


@dataclass(frozen=True, slots=True)
class Session:
    """What one side knows about its peer once the handshake succeeded."""

    version: int
    node_id: str
    role: Role
    capabilities: Capabilities
    """The peer's capabilities as it declared them."""
    extensions: frozenset[int]
    """Extension ids both sides support (those the server echoed)."""


def _check_identity(what: str, node_id: str, role: Role, certified: NodeIdentity) -> None:
    if node_id != certified.node_id or role != certified.role:
        raise CcoError(
            ErrorCode.UNAUTHORIZED,
            f"{what} claims {node_id!r} as {role.name.lower()}, but the certificate is "
            f"{certified.node_id!r} as {certified.role.name.lower()}",
        )


def build_hello(local: LocalIdentity, versions: Sequence[int] = SUPPORTED_VERSIONS) -> Hello:
    """The client's first message: offered versions, most preferred first."""
    return Hello(
        versions=tuple(sorted(set(versions), reverse=True)),
        role=local.role,
        node_id=local.node_id,
        capabilities=local.capabilities,
    )


def negotiate(
    hello: Hello,
    local: LocalIdentity,
    peer_certificate: NodeIdentity,
    supported_versions: Sequence[int] = SUPPORTED_VERSIONS,
) -> tuple[HelloAck, Session]:
    """Server side: answer ``hello``, or raise :class:`CcoError` to refuse it.

    Identity is checked before anything else: a peer lying about who it is gets no
    information about what the server supports.
    """
    _check_identity("Hello", hello.node_id, hello.role, peer_certificate)
    common = set(hello.versions) & set(supported_versions)
    if not common:
        raise CcoError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"offered versions {list(hello.versions)}, supported {sorted(supported_versions)}",
        )
    version = max(common)
    extensions = tuple(sorted(set(hello.capabilities.extensions) & set(local.capabilities.extensions)))
    ack = HelloAck(
        version=version,
        role=local.role,
        node_id=local.node_id,
        capabilities=replace(local.capabilities, extensions=extensions),
    )
    session = Session(
        version=version,
        node_id=hello.node_id,
        role=hello.role,
        capabilities=hello.capabilities,
        extensions=frozenset(extensions),
    )
    return ack, session


def accept_hello_ack(ack: HelloAck, hello: Hello, peer_certificate: NodeIdentity) -> Session:
    """Client side: check the server's answer to ``hello``; raise :class:`CcoError` if wrong."""
    _check_identity("HelloAck", ack.node_id, ack.role, peer_certificate)
    if ack.version not in hello.versions:
        raise CcoError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"HelloAck selects version {ack.version}, which was not offered ({list(hello.versions)})",
        )
    echoed = set(ack.capabilities.extensions)
    unoffered = echoed - set(hello.capabilities.extensions)
    if unoffered:
        raise CcoError(
            ErrorCode.PROTOCOL_VIOLATION, f"HelloAck echoes extensions never offered: {sorted(unoffered)}"
        )
    return Session(
        version=ack.version,
        node_id=ack.node_id,
        role=ack.role,
        capabilities=ack.capabilities,
        extensions=frozenset(echoed),
    )
