"""What the service layer holds of one open CCO session: :class:`PeerLink`.

A small handle over the connection's :class:`~cco.transport.link.LinkProtocol`:
send, drain, receive or listen, close.  :class:`LinkClosed` is how every one of
them reports the end of the session, and :class:`Listener` is who takes messages
as they arrive instead of reading them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Protocol

from cco.transport.handshake import Session
from cco.transport.pathstats import PathStats
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Message
from cco.wire.registries import Role

if TYPE_CHECKING:
    from cco.transport.link import LinkProtocol


class LinkClosed(CcoError):
    """The link is closed; ``code`` and ``detail`` say why (as in ``wait_closed()``)."""


class Listener(Protocol):
    """Who takes a link's messages as they arrive (:meth:`PeerLink.listen`)."""

    def deliver(self, item: Message | CcoError) -> None:
        """One message, or the DecodeError of one that could not be decoded (with
        ``close_on_decode_error`` off)."""

    def closed(self, code: ErrorCode, detail: str) -> None:
        """The link closed, after every message that arrived before the close."""


class PeerLink:
    """One open, authenticated CCO session with a peer.

    ``node_id`` and ``role`` come from the peer's certificate (Hello/HelloAck had to
    agree with it); ``capabilities`` are the peer's as it declared them, and
    ``extensions`` the extension ids both sides support.
    """

    def __init__(self, protocol: LinkProtocol, session: Session) -> None:
        self._protocol = protocol
        self.node_id: str = session.node_id
        self.role: Role = session.role
        self.version = session.version
        self.capabilities = session.capabilities
        self.extensions = session.extensions

    def __repr__(self) -> str:
        return f"PeerLink({self.node_id!r}, {self.role.name.lower()}, v{self.version})"

    def send(self, message: Message) -> None:
        """Queue ``message`` (on the control stream, or its group's data stream).

        Raises :class:`~cco.wire.errors.EncodeError` for a message that cannot be
        encoded or exceeds the peer's ``max_message_size``, :class:`LinkClosed` once
        the link is closed.  Never blocks: pair bursts with :meth:`drain`.
        """
        self._protocol.send_message(message)

    def flush(self) -> None:
        """Hand what :meth:`send` queued to the socket now rather than at the event
        loop's next turn, which may first read and decrypt a whole batch of datagrams.
        Sending several messages and then flushing once keeps them in one transmit."""
        self._protocol.flush()

    def path_stats(self) -> PathStats:
        """The path as QUIC measures it now: round trip, congestion window, bytes in
        flight, and the rate they allow.  What a sender sizes its chunks and window
        by, rather than by fixed settings; cheap enough to read per chunk."""
        return self._protocol.path_stats()

    async def drain(self) -> None:
        """Wait until at most ``send_buffer`` bytes are queued but unsent."""
        await self._protocol.drain()

    async def receive(self) -> Message:
        """The next message from the peer, in arrival order (per group: send order).

        Raises :class:`LinkClosed` once the link is closed and every message that
        arrived before the close has been read.  With ``close_on_decode_error``
        off, an undecodable message is raised here as its ``DecodeError``.

        Keep reading: once more than ``receive_buffer`` bytes wait here, the peer
        may send nothing more on this connection, control messages included.
        """
        return await self._protocol.receive()

    def listen(self, listener: Listener) -> None:
        """Have every message handed to ``listener`` in the event-loop callback that
        decoded it, then the close; :meth:`receive` must not be used afterwards.
        What ``listener`` does there runs before the rest of the datagrams read in
        the same batch are decoded, and should not block."""
        self._protocol.listen(listener)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Message]:
        """Messages until the link closes: normally (NO_ERROR) ends the loop, else raises."""
        while True:
            try:
                yield await self._protocol.receive()
            except LinkClosed as closed:
                if closed.code is ErrorCode.NO_ERROR:
                    return
                raise

    @property
    def close_reason(self) -> tuple[ErrorCode, str] | None:
        """Why the link closed, or None while it is open."""
        return self._protocol.close_reason

    def close(self, code: ErrorCode = ErrorCode.NO_ERROR, detail: str = "") -> None:
        """Close the connection, telling the peer ``code`` and ``detail``."""
        self._protocol.fail(code, detail)

    async def wait_closed(self) -> tuple[ErrorCode, str]:
        """Wait until the connection has terminated; return why it closed."""
        return await self._protocol.wait_terminated()

    @property
    def terminated(self) -> bool:
        """Whether the QUIC connection has fully terminated (a closing one may still
        be sending what was queued before its CONNECTION_CLOSE)."""
        return self._protocol.terminated

    def add_termination_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the QUIC connection has fully terminated."""
        self._protocol.add_termination_callback(callback)
