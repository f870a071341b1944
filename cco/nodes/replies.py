"""Small pieces every role machine uses when it answers a peer."""

from __future__ import annotations

from collections.abc import Iterable

from cco.nodes.events import PeerId, SendMessage
from cco.wire.errors import ErrorCode
from cco.wire.messages import Error, Message, clip_detail


def refuse(peer: PeerId, message: Message, code: ErrorCode, detail: str) -> SendMessage:
    """The Error a peer gets for one refused message; its other traffic is unaffected."""
    return SendMessage(peer, Error(code=code, detail=clip_detail(detail), message_type=int(message.TYPE)))


def ranks_text(ranks: Iterable[int]) -> str:
    """Ranks as ``{0, 3, 7}`` for error details and logs."""
    return "{" + ", ".join(str(r) for r in sorted(ranks)) + "}"
