"""Which client Initials a server lets start a connection (RFC 9000, section 8.1).

Every connection a server starts costs it memory and a TLS context before the client
has proven anything, and a client Initial can come from a forged address.  So a
server counts its *half-open* connections (started, QUIC handshake not complete)
and, past ``retry_threshold`` of them, starts none for an Initial that carries no
token: it answers with a Retry carrying one (:class:`RetryTokens`) and keeps
nothing.  A client that really is at its address sends its Initial again with the
token and gets its connection; a forged address never sees the Retry.  Past
``max_half_open`` no connection starts at all, token or not, and a half-open
connection that has not completed its handshake within ``handshake_timeout`` is
dropped without a word (it has no peer worth telling).  Both QUIC backends sit
behind the same server, so this holds for either.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Callable

TOKEN_LIFETIME = 10.0
"""Seconds a Retry token is good for: a client sends it back within a round trip."""

_TAG = 16  # bytes of HMAC-SHA256 kept in a token
_STAMP = 8  # bytes of the issue time, in milliseconds


class RetryTokens:
    """Issues and checks the tokens of Retry packets, holding no state per client.

    A token is the time it was issued, the connection id the client first chose
    (which the server must echo in its transport parameters) and a tag, made with a
    key of this process, over those, the client's address and the connection id the
    Retry gave the client (the destination of the Initial that brings the token
    back).  A token for another address, another connection id, or older than
    :data:`TOKEN_LIFETIME`, is refused.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._key = os.urandom(32)
        self._clock = clock

    def issue(self, address: tuple[object, ...], original_cid: bytes, retry_cid: bytes) -> bytes:
        stamp = int(self._clock() * 1000).to_bytes(_STAMP, "big")
        body = stamp + bytes([len(original_cid)]) + original_cid
        return body + self._tag(address, body, retry_cid)

    def check(self, token: bytes, address: tuple[object, ...], retry_cid: bytes) -> bytes | None:
        """The client's original connection id if ``token`` is good, else None."""
        if len(token) < _STAMP + 1 + _TAG:
            return None
        length = token[_STAMP]
        body, tag = token[: _STAMP + 1 + length], token[_STAMP + 1 + length :]
        if len(body) != _STAMP + 1 + length or not hmac.compare_digest(
            tag, self._tag(address, body, retry_cid)
        ):
            return None
        issued = int.from_bytes(body[:_STAMP], "big") / 1000
        if not 0 <= self._clock() - issued <= TOKEN_LIFETIME:
            return None
        return body[_STAMP + 1 :]

    def _tag(self, address: tuple[object, ...], body: bytes, retry_cid: bytes) -> bytes:
        where = f"{address[0]}|{address[1]}".encode()
        message = len(where).to_bytes(2, "big") + where + bytes([len(retry_cid)]) + retry_cid + body
        return hmac.new(self._key, message, hashlib.sha256).digest()[:_TAG]


__all__ = ["TOKEN_LIFETIME", "RetryTokens"]
