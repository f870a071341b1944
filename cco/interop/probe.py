"""A hostile client for the live cases: it speaks QUIC and CCO framing directly.

Built on aioquic alone, not on this implementation's transport, so that it tests a
server the way a foreign peer would: it offers ALPN "cco/2", completes the Hello
exchange with a certificate of the group CA, then sends whatever bytes the case
wants and reports what came back: the negotiated ALPN, the CCO messages received
(decoded) and the code of the QUIC CONNECTION_CLOSE, if any.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from typing import Any

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration

from cco.wire.errors import DecodeError
from cco.wire.framing import FrameDecoder, encode_frame
from cco.wire.messages import Capabilities, Hello, Message, decode_message, encode_message
from cco.wire.registries import ALPN, Collective, DType, ReduceOp, Role

CONTROL_STREAM = 0


@dataclass
class ProbeOutcome:
    alpn: str | None = None
    messages: list[Message] = field(default_factory=list)
    undecodable: int = 0
    close_code: int | None = None
    close_reason: str = ""


class _Probe(QuicConnectionProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcome = ProbeOutcome()
        self.frames = FrameDecoder()
        self.arrived = asyncio.Event()
        self.closed = asyncio.Event()

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.ProtocolNegotiated):
            self.outcome.alpn = event.alpn_protocol
        elif isinstance(event, events.StreamDataReceived) and event.stream_id == CONTROL_STREAM:
            try:
                for frame in self.frames.feed(event.data):
                    self.outcome.messages.append(decode_message(frame))
            except DecodeError:
                self.outcome.undecodable += 1
            self.arrived.set()
        elif isinstance(event, events.ConnectionTerminated):
            self.outcome.close_code, self.outcome.close_reason = event.error_code, event.reason_phrase
            self.closed.set()
            self.arrived.set()

    async def wait_messages(self, count: int, timeout: float) -> None:
        async def enough() -> None:
            while len(self.outcome.messages) < count and not self.closed.is_set():
                self.arrived.clear()
                await self.arrived.wait()

        await asyncio.wait_for(enough(), timeout)


def _hello(node_id: str) -> bytes:
    capabilities = Capabilities(
        dtypes=tuple(DType),
        ops=tuple(ReduceOp),
        collectives=tuple(Collective),
        max_message_size=1 << 24,
        max_chunk_elements=1 << 16,
        extensions=(),
    )
    return encode_frame(
        encode_message(Hello(versions=(2,), role=Role.ENDPOINT, node_id=node_id, capabilities=capabilities))
    )


async def probe(
    host: str,
    port: int,
    ca: str,
    cert: str,
    key: str,
    node_id: str,
    payload: bytes,
    timeout: float = 10.0,
    alpn: str = ALPN,
) -> ProbeOutcome:
    """Connect as ``node_id`` (an endpoint certificate) offering ``alpn``, say Hello,
    then send ``payload`` (raw bytes, framing included) on the control stream; collect
    the answers until the server closes the connection or ``timeout`` passes.  A
    handshake the server refuses gives an outcome without ALPN and with its close code."""
    try:
        return await asyncio.wait_for(
            _probe(host, port, ca, cert, key, node_id, payload, timeout, alpn), 3 * timeout
        )
    except ConnectionError as refused:
        return ProbeOutcome(close_code=-1, close_reason=f"handshake refused: {refused}")


async def _probe(
    host: str,
    port: int,
    ca: str,
    cert: str,
    key: str,
    node_id: str,
    payload: bytes,
    timeout: float,
    alpn: str,
) -> ProbeOutcome:
    config = QuicConfiguration(is_client=True, alpn_protocols=[alpn], verify_mode=ssl.CERT_NONE)
    config.load_cert_chain(cert, key)
    config.load_verify_locations(cafile=ca)
    config.server_name = node_id  # any name: the probe does not check the server
    async with connect(host, port, configuration=config, create_protocol=_Probe) as client:
        assert isinstance(client, _Probe)
        client._quic.send_stream_data(CONTROL_STREAM, _hello(node_id))
        client.transmit()
        try:
            await client.wait_messages(1, timeout)  # HelloAck (or the Error refusing us)
            if payload and not client.closed.is_set():
                client._quic.send_stream_data(CONTROL_STREAM, payload)
                client.transmit()
                await asyncio.wait_for(client.closed.wait(), timeout)
        except TimeoutError:
            pass
        return client.outcome
