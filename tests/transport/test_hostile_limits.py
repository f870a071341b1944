"""What one hostile peer can make a node's transport hold (issue 41): its messages are
handed over a bounded number per turn of the event loop, a peer that does not read
is closed once its send queue is over its bound, partial frames are bounded per
connection and per node and time out, and a flood of handshakes creates no
connection past a threshold."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cco.transport import LocalIdentity, PeerLink, Server, TransportConfig, connect, serve
from cco.transport.certs import create_dev_pki
from cco.transport.link import LinkClosed, LinkProtocol
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.framing import encode_frame, encode_varint
from cco.wire.messages import Capabilities, Contribution, Heartbeat, Message, encode_message
from cco.wire.registries import Collective, DType, ReduceOp, Role

pytestmark = pytest.mark.quic_backends()

T = TypeVar("T")
CAPS = Capabilities(
    dtypes=(DType.INT32,),
    ops=(ReduceOp.SUM,),
    collectives=(Collective.ALL_REDUCE,),
    max_message_size=1 << 24,
    max_chunk_elements=1 << 20,
    extensions=(),
)
ROLES = {"agg-1": Role.AGGREGATOR, "ep-1": Role.ENDPOINT, "ep-2": Role.ENDPOINT}
KIB = 1024


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    create_dev_pki(directory, list(ROLES.items()))
    return directory


def run(test: Callable[[], Awaitable[T]], timeout: float = 60.0) -> T:
    async def main() -> T:
        return await asyncio.wait_for(test(), timeout)

    return asyncio.run(main())


def config(pki: Path, node_id: str, **overrides: Any) -> TransportConfig:
    return TransportConfig.for_node(pki, node_id, **overrides)


@asynccontextmanager
async def server(pki: Path, **overrides: Any) -> AsyncIterator[tuple[Server, asyncio.Queue[PeerLink]]]:
    accepted: asyncio.Queue[PeerLink] = asyncio.Queue()
    srv = await serve(
        "127.0.0.1", 0, config(pki, "agg-1", **overrides), LocalIdentity("agg-1", Role.AGGREGATOR, CAPS),
        accepted.put_nowait,
    )  # fmt: skip
    try:
        yield srv, accepted
    finally:
        await srv.close()


async def dial(srv: Server, pki: Path, node_id: str = "ep-1", **overrides: Any) -> PeerLink:
    host, port = srv.address
    identity = LocalIdentity(node_id, ROLES[node_id], CAPS)
    return await connect(host, port, config(pki, node_id, **overrides), identity, "agg-1", timeout=10)


def protocol(link: PeerLink) -> LinkProtocol:
    return link._protocol


def chunk(index: int, elements: int) -> Contribution:
    return Contribution(
        group_id=b"A" * 16,
        epoch=0,
        op_id=1,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.INT32,
        total_elements=elements * 1000,
        chunk_elements=elements,
        chunk_index=index,
        contributors=b"\x01",
        width=4,
        payload=bytes(4 * elements),
    )


class TurnRecorder:
    """A listener that notes, for each message, the turn of the event loop it came in."""

    def __init__(self) -> None:
        self.turn = 0
        self.turns: list[int] = []
        self.items: list[Message | CcoError] = []
        self.closes: list[tuple[ErrorCode, str]] = []
        self._ticking = True
        asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        self.turn += 1
        if self._ticking:
            asyncio.get_running_loop().call_soon(self._tick)

    def stop(self) -> None:
        self._ticking = False

    def deliver(self, item: Message | CcoError) -> None:
        self.items.append(item)
        self.turns.append(self.turn)

    def closed(self, code: ErrorCode, detail: str) -> None:
        self.closes.append((code, detail))


# --- a bounded number of messages per connection per turn ------------------------------


def test_a_burst_on_one_connection_is_handed_over_a_bounded_number_per_turn(pki: Path) -> None:
    async def test() -> None:
        async with server(pki, messages_per_turn=4) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            recorder = TurnRecorder()
            peer.listen(recorder)
            burst = [Heartbeat(seq=n) for n in range(200)]
            for message in burst:
                link.send(message)
            link.flush()
            while len(recorder.items) < len(burst):
                await asyncio.sleep(0.01)
            recorder.stop()
            assert recorder.items == burst, "all of them, in order"
            per_turn: dict[int, int] = {}
            for turn in recorder.turns:
                per_turn[turn] = per_turn.get(turn, 0) + 1
            assert max(per_turn.values()) == 4
            assert len(per_turn) >= len(burst) // 4

    run(test)


def test_a_messages_per_turn_below_one_is_refused(pki: Path) -> None:
    with pytest.raises(ValueError, match="messages_per_turn"):
        config(pki, "agg-1", messages_per_turn=0)


# --- bounded send queues ---------------------------------------------------------------


def test_a_peer_that_does_not_read_is_closed_once_its_send_queue_is_over_the_bound(pki: Path) -> None:
    small: dict[str, Any] = {"receive_window": 64 * KIB, "receive_buffer": 64 * KIB}

    async def test() -> None:
        async with server(pki, send_queue_limit=256 * KIB) as (srv, accepted):
            link = await dial(srv, pki, **small)  # never reads: its credit freezes
            peer = await accepted.get()
            sent = 0
            with pytest.raises(LinkClosed):
                for index in range(1000):  # 16 MiB in all
                    peer.send(chunk(index, 4 * KIB))
                    sent += 16 * KIB
                    await asyncio.sleep(0.001)
            code, detail = await asyncio.wait_for(link.wait_closed(), 10)
            assert code is ErrorCode.RESOURCE_EXHAUSTED, detail
            assert "send_queue_limit" in detail
            assert sent < 4 * 1024 * KIB, "closed near the bound, not after everything"
            await asyncio.wait_for(protocol(peer).wait_terminated(), 10)
            assert not srv.links

    run(test)


def test_a_peer_that_reads_is_not_closed_whatever_it_is_sent(pki: Path) -> None:
    async def test() -> None:
        async with server(pki, send_queue_limit=256 * KIB) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            received: list[Message] = []

            async def read() -> None:
                async for message in link:
                    received.append(message)

            reader = asyncio.ensure_future(read())
            for index in range(256):  # 4 MiB in all, 16 times the bound
                peer.send(chunk(index, 4 * KIB))
                await asyncio.sleep(0.002)
                while protocol(peer)._unsent() > 128 * KIB:  # the runner's pace: a window at most
                    await asyncio.sleep(0.002)
            while len(received) < 256:
                await asyncio.sleep(0.01)
            assert peer.close_reason is None
            peer.close()
            await reader

    run(test)


# --- unfinished frames -------------------------------------------------------------------


def begin_frames(link: PeerLink, streams: int, claim: int, body: int) -> None:
    """On ``streams`` new data streams, the length prefix of a ``claim``-byte frame and
    ``body`` bytes of it, never the rest: what a hostile peer would leave."""
    quic = protocol(link)._quic
    for _ in range(streams):
        stream_id = quic.get_next_available_stream_id(is_unidirectional=True)
        quic.send_stream_data(stream_id, encode_varint(claim) + bytes(body))
    protocol(link).transmit()


SMALL_FRAMES: dict[str, Any] = {"max_message_size": 64 * KIB, "unfinished_bytes_per_connection": 128 * KIB}


def test_unfinished_frames_past_the_connections_bound_close_it(pki: Path) -> None:
    async def test() -> None:
        async with server(pki, **SMALL_FRAMES) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            begin_frames(link, streams=1, claim=60_000, body=50_000)
            await asyncio.sleep(0.3)
            assert peer.close_reason is None, "one unfinished frame under the bound is kept"
            begin_frames(link, streams=2, claim=60_000, body=50_000)
            code, detail = await asyncio.wait_for(link.wait_closed(), 10)
            assert code is ErrorCode.RESOURCE_EXHAUSTED and "unfinished_bytes_per_connection" in detail
            assert srv._unfinished.bytes == 0, "what it held is released with it"

    run(test)


def test_unfinished_frames_of_all_connections_are_bounded_together(pki: Path) -> None:
    async def test() -> None:
        limits = {"max_message_size": 64 * KIB, "unfinished_bytes": 128 * KIB}
        async with server(pki, **limits) as (srv, accepted):
            first = await dial(srv, pki, "ep-1")
            await accepted.get()
            second = await dial(srv, pki, "ep-2")
            await accepted.get()
            begin_frames(first, streams=2, claim=60_000, body=40_000)
            await asyncio.sleep(0.3)
            assert srv._unfinished.bytes == 80_000
            begin_frames(second, streams=2, claim=60_000, body=40_000)
            code, detail = await asyncio.wait_for(second.wait_closed(), 10)
            assert code is ErrorCode.RESOURCE_EXHAUSTED and "limit unfinished_bytes (" in detail
            assert first.close_reason is None
            assert srv._unfinished.bytes == 80_000

    run(test)


def test_a_frame_that_stalls_for_frame_timeout_closes_its_connection(pki: Path) -> None:
    async def test() -> None:
        async with server(pki, frame_timeout=0.5) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            begin_frames(link, streams=1, claim=60_000, body=1000)
            code, detail = await asyncio.wait_for(link.wait_closed(), 10)
            assert code is ErrorCode.TIMEOUT and "frame_timeout (0.5 s)" in detail
            assert peer.close_reason is not None and srv._unfinished.bytes == 0

    run(test)


def test_a_frame_that_keeps_coming_is_not_timed_out(pki: Path) -> None:
    async def test() -> None:
        async with server(pki, frame_timeout=0.5) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            received: list[Message | CcoError] = []
            recorder = TurnRecorder()
            peer.listen(recorder)
            message = chunk(0, 64 * KIB)  # a 256 KiB frame, a piece every 0.2 s
            frame = encode_frame(encode_message(message))
            quic = protocol(link)._quic
            stream_id = quic.get_next_available_stream_id(is_unidirectional=True)
            pieces = [frame[i : i + 32 * KIB] for i in range(0, len(frame), 32 * KIB)]
            for piece in pieces:
                quic.send_stream_data(stream_id, piece)
                protocol(link).transmit()
                await asyncio.sleep(0.2)
            while not recorder.items:
                await asyncio.sleep(0.05)
            recorder.stop()
            received += recorder.items
            assert received == [message] and peer.close_reason is None

    run(test)
