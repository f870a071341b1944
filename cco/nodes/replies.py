"""Small pieces every role machine uses when it answers a peer."""

from __future__ import annotations

from collections.abc import Iterable

from cco.nodes.events import PeerId, SendMessage
from cco.wire.errors import ErrorCode
from cco.wire.messages import Error, Message

MAX_DETAIL = 1024
"""Error.detail is at most 1024 bytes on the wire; longer texts are cut."""


def refuse(peer: PeerId, message: Message, code: ErrorCode, detail: str) -> SendMessage:
    """The Error a peer gets for one refused message; its other traffic is unaffected."""
    return SendMessage(peer, Error(code=code, detail=clip(detail), message_type=int(message.TYPE)))


def clip(detail: str) -> str:
    """``detail`` cut to what an Error message may carry (counted in UTF-8 bytes)."""
    encoded = detail.encode("utf-8")
    if len(encoded) <= MAX_DETAIL:
        return detail
    return encoded[:MAX_DETAIL].decode("utf-8", "ignore")


def ranks_text(ranks: Iterable[int]) -> str:
    """Ranks as ``{0, 3, 7}`` for error details and logs."""
    return "{" + ", ".join(str(r) for r in sorted(ranks)) + "}"
