"""One QUIC stack's own asyncio API, for a bare stream beside CCO on the same stack.

CCO's nodes run on qh3 or aioquic (``TransportConfig.quic_backend``); a benchmark that
compares CCO with "bare QUIC" must use the same stack for the bare stream, or it
measures the difference between two stacks.  qh3's asyncio API mirrors aioquic's, so
one named tuple covers both.  Used by ``run.py`` (the CPU-efficiency figure) and
``bench_datapath.py`` (ingress goodput).
"""

from __future__ import annotations

from importlib import metadata
from typing import Any, NamedTuple

from cco.transport.config import QUIC_BACKENDS


class QuicApi(NamedTuple):
    """What a bare stream uses of one stack's asyncio API (qh3 mirrors aioquic's)."""

    connect: Any
    serve: Any
    Protocol: Any
    QuicConfiguration: Any
    StreamDataReceived: Any


def quic_api(backend: str) -> QuicApi:
    """The asyncio client/server API of ``backend`` (qh3 mirrors aioquic's)."""
    if backend == "qh3":
        from qh3.asyncio.client import connect
        from qh3.asyncio.protocol import QuicConnectionProtocol
        from qh3.asyncio.server import serve
        from qh3.quic import events
        from qh3.quic.configuration import QuicConfiguration
    elif backend == "aioquic":
        from aioquic.asyncio.client import connect  # type: ignore[assignment]
        from aioquic.asyncio.protocol import QuicConnectionProtocol  # type: ignore[assignment]
        from aioquic.asyncio.server import serve  # type: ignore[assignment]
        from aioquic.quic import events  # type: ignore[no-redef]
        from aioquic.quic.configuration import QuicConfiguration  # type: ignore[assignment]
    else:
        raise ValueError(f"unknown QUIC backend {backend!r}, not one of {', '.join(QUIC_BACKENDS)}")
    return QuicApi(
        connect=connect,
        serve=serve,
        Protocol=QuicConnectionProtocol,
        QuicConfiguration=QuicConfiguration,
        StreamDataReceived=events.StreamDataReceived,
    )


def stack_version(backend: str) -> str:
    """The installed version of ``backend``'s package."""
    return metadata.version(backend)
