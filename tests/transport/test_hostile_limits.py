"""What one hostile peer can make a node's transport hold (issue 41): its messages are
handed over a bounded number per turn of the event loop, a peer that does not read
is closed once its send queue is over its bound, partial frames are bounded per
connection and per node and time out, and a flood of handshakes creates no
connection past a threshold."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cco.transport import LocalIdentity, PeerLink, Server, TransportConfig, connect, serve
from cco.transport.admission import TOKEN_LIFETIME, RetryTokens
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
    """The timeout counts from a frame's last byte, not its first: a frame that
    takes longer than it in all, a piece every third of it, arrives whole."""

    async def test() -> None:
        async with server(pki, frame_timeout=3.0) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            message = chunk(0, 64 * KIB)  # a 256 KiB frame, in five pieces a second apart
            frame = encode_frame(encode_message(message))
            quic = protocol(link)._quic
            stream_id = quic.get_next_available_stream_id(is_unidirectional=True)
            size = len(frame) // 5 + 1
            for start in range(0, len(frame), size):
                quic.send_stream_data(stream_id, frame[start : start + size])
                protocol(link).transmit()
                await asyncio.sleep(1.0)
            assert await asyncio.wait_for(peer.receive(), 10) == message
            assert peer.close_reason is None

    run(test)


# --- handshake floods --------------------------------------------------------------------


def spoofed_initial(rng: random.Random) -> bytes:
    """1200 bytes shaped like a client's QUIC v1 Initial with random connection ids,
    no token and a payload nobody can decrypt (RFC 9000, section 17.2.2)."""
    dcid, scid = rng.randbytes(8), rng.randbytes(8)
    head = bytes([0xC3]) + (1).to_bytes(4, "big") + bytes([8]) + dcid + bytes([8]) + scid + encode_varint(0)
    rest = 1200 - len(head) - 2
    return head + (0x4000 | rest).to_bytes(2, "big") + rng.randbytes(rest)


async def flood(srv: Server, count: int) -> socket.socket:
    """``count`` spoofed Initials to ``srv`` from one socket (returned, to read what came back)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    sock.bind(("127.0.0.1", 0))
    rng = random.Random(41)
    for index in range(count):
        sock.sendto(spoofed_initial(rng), srv.address)
        if index % 20 == 19:
            await asyncio.sleep(0.01)  # loopback's socket buffers drop a burst
    await asyncio.sleep(0.2)
    return sock


def test_past_the_threshold_initials_without_a_token_get_a_retry_and_start_nothing(pki: Path) -> None:
    async def test() -> None:
        async with server(pki, retry_threshold=4, max_half_open=64) as (srv, _):
            sock = await flood(srv, 40)
            assert len(srv._half_open) == 4 and len(srv._protocols) == 4
            assert srv.refused_initials == 36
            answer = sock.recv(2048)
            assert answer[0] & 0xF0 == 0xF0, "a long-header Retry (type 3) came back"
            sock.close()

    run(test)


def test_a_real_client_connects_through_retry_during_a_flood(pki: Path) -> None:
    async def test() -> None:
        async with server(pki, retry_threshold=4) as (srv, accepted):
            sock = await flood(srv, 20)
            refused = srv.refused_initials
            link = await dial(srv, pki)
            peer = await accepted.get()
            assert srv.refused_initials == refused + 1, "it was sent a Retry, and came back with the token"
            link.send(Heartbeat(seq=7))
            assert await asyncio.wait_for(peer.receive(), 5) == Heartbeat(seq=7)
            sock.close()
            link.close()

    run(test)


def test_every_client_can_be_made_to_validate_its_address(pki: Path) -> None:
    async def test() -> None:
        async with server(pki, retry_threshold=0) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            assert srv.refused_initials == 1
            peer.send(Heartbeat(seq=3))
            assert await asyncio.wait_for(link.receive(), 5) == Heartbeat(seq=3)
            link.close()

    run(test)


def test_no_connection_starts_past_max_half_open(pki: Path) -> None:
    async def test() -> None:
        async with server(pki, retry_threshold=100, max_half_open=3) as (srv, _):
            sock = await flood(srv, 10)
            assert len(srv._half_open) == 3 and srv.refused_initials == 7
            sock.close()

    run(test)


def test_half_open_connections_are_dropped_after_the_handshake_timeout(pki: Path) -> None:
    async def test() -> None:
        async with server(pki, handshake_timeout=0.3) as (srv, accepted):
            sock = await flood(srv, 10)
            assert srv._half_open
            await asyncio.sleep(1.0)
            assert not srv._half_open and not srv._protocols and not srv._routes and not srv._cids
            link = await dial(srv, pki)  # a real handshake completes in time and is kept
            await accepted.get()
            await asyncio.sleep(0.5)
            assert len(srv._protocols) == 1 and not srv._half_open
            sock.close()
            link.close()

    run(test)


def test_a_retry_token_is_good_only_for_its_address_connection_id_and_lifetime() -> None:
    now = [100.0]
    tokens = RetryTokens(clock=lambda: now[0])
    address = ("127.0.0.1", 4433)
    token = tokens.issue(address, b"original", b"retry-cid")
    assert tokens.check(token, address, b"retry-cid") == b"original"
    assert tokens.check(token, ("127.0.0.1", 4434), b"retry-cid") is None
    assert tokens.check(token, ("127.0.0.2", 4433), b"retry-cid") is None
    assert tokens.check(token, address, b"other-cid") is None
    assert tokens.check(token[:-1] + bytes([token[-1] ^ 1]), address, b"retry-cid") is None
    assert tokens.check(token[:5], address, b"retry-cid") is None
    assert RetryTokens(clock=lambda: now[0]).check(token, address, b"retry-cid") is None, "another key"
    now[0] += TOKEN_LIFETIME + 0.1
    assert tokens.check(token, address, b"retry-cid") is None
