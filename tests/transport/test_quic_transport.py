"""The QUIC transport end to end, over loopback: handshake, identity, streams, errors, limits."""

from __future__ import annotations

import asyncio
import math
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aioquic.asyncio.client import connect as aioquic_connect
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.packet import QuicErrorCode
from aioquic.tls import AlertDescription
from qh3.asyncio.client import connect as qh3_connect
from qh3.quic.configuration import QuicConfiguration as Qh3Configuration

from cco.transport import (
    LinkClosed,
    LocalIdentity,
    PathStats,
    PeerLink,
    Server,
    TransportConfig,
    connect,
    serve,
)
from cco.transport.certs import create_dev_pki
from cco.transport.connection import CcoQuicConnection
from cco.transport.handshake import negotiate
from cco.transport.link import CONTROL_STREAM_ID, JOIN_BELOW, LinkProtocol
from cco.transport.qh3conn import Qh3Connection
from cco.transport.udp import BatchedUdpTransport
from cco.wire.errors import CcoError, DecodeError, EncodeError, ErrorCode
from cco.wire.framing import encode_frame
from cco.wire.messages import (
    Capabilities,
    ChunkAck,
    Contribution,
    Heartbeat,
    Hello,
    Message,
    encode_message,
    encode_message_pieces,
)
from cco.wire.registries import ALPN, PROTOCOL_VERSION_2, Collective, DType, ReduceOp, Role

pytestmark = pytest.mark.quic_backends()

T = TypeVar("T")

CAPS = Capabilities(
    dtypes=(DType.INT32,),
    ops=(ReduceOp.SUM,),
    collectives=(Collective.ALL_REDUCE,),
    max_message_size=1 << 24,
    max_chunk_elements=1 << 20,
    extensions=(7,),
)
NODES = [
    ("agg-1", Role.AGGREGATOR),
    ("ep-1", Role.ENDPOINT),
    ("ep-2", Role.ENDPOINT),
    ("ep-3", Role.ENDPOINT),
]
ROLES = dict(NODES)
GROUP_A, GROUP_B = b"A" * 16, b"B" * 16


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    create_dev_pki(directory, NODES)
    return directory


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same node names, a different CA."""
    directory = tmp_path_factory.mktemp("other-pki")
    create_dev_pki(directory, NODES)
    return directory


def run(test: Callable[[], Awaitable[T]], timeout: float = 30.0) -> T:
    async def main() -> T:
        return await asyncio.wait_for(test(), timeout)

    return asyncio.run(main())


def chunk(group: bytes, index: int, elements: int = 4, chunks: int = 1000, op_id: int = 1) -> Contribution:
    """A valid int32 contribution of ``elements`` per chunk; its payload encodes ``index``."""
    payload = (index.to_bytes(4, "little") * elements)[: elements * 4]
    return Contribution(
        group_id=group,
        epoch=0,
        op_id=op_id,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.INT32,
        total_elements=elements * chunks,
        chunk_elements=elements,
        chunk_index=index,
        contributors=b"\x01",
        width=4,
        payload=payload,
    )


def config(pki: Path, node_id: str, **overrides: Any) -> TransportConfig:
    return TransportConfig.for_node(pki, node_id, **overrides)


def identity(node_id: str, caps: Capabilities = CAPS) -> LocalIdentity:
    return LocalIdentity(node_id, ROLES[node_id], caps)


@asynccontextmanager
async def server(
    pki: Path, node_id: str = "agg-1", caps: Capabilities = CAPS, **overrides: Any
) -> AsyncIterator[tuple[Server, asyncio.Queue[PeerLink]]]:
    """A server whose accepted links appear on a queue."""
    accepted: asyncio.Queue[PeerLink] = asyncio.Queue()
    srv = await serve(
        "127.0.0.1", 0, config(pki, node_id, **overrides), identity(node_id, caps), accepted.put_nowait
    )
    try:
        yield srv, accepted
    finally:
        await srv.close()


async def dial(
    srv: Server, pki: Path, node_id: str = "ep-1", expect: str = "agg-1", **overrides: Any
) -> PeerLink:
    host, port = srv.address
    return await connect(host, port, config(pki, node_id, **overrides), identity(node_id), expect, timeout=5)


async def refused(dialing: Awaitable[PeerLink]) -> CcoError:
    with pytest.raises(CcoError) as info:
        await dialing
    return info.value


def protocol(link: PeerLink) -> LinkProtocol:
    return link._protocol


def write_raw(link: PeerLink, stream_id: int, data: bytes, end_stream: bool = False) -> None:
    """Bypass framing and checks: what a broken or hostile peer would send."""
    protocol(link)._quic.send_stream_data(stream_id, data, end_stream)
    protocol(link).transmit()


async def exchange(link: PeerLink, peer: PeerLink, message: Message) -> None:
    link.send(message)
    assert await asyncio.wait_for(peer.receive(), 5) == message


# --- handshake and identity --------------------------------------------------------


def test_handshake_authenticates_both_sides(pki: Path) -> None:
    async def test() -> None:
        server_caps = replace(CAPS, extensions=(7, 8))
        async with server(pki, caps=server_caps, max_message_size=1 << 20) as (srv, accepted):
            client_caps = replace(CAPS, extensions=(9, 7))
            host, port = srv.address
            link = await connect(
                host, port, config(pki, "ep-1"), identity("ep-1", client_caps), "agg-1", timeout=5
            )
            peer = await accepted.get()
            assert (link.node_id, link.role, link.version) == ("agg-1", Role.AGGREGATOR, PROTOCOL_VERSION_2)
            assert (peer.node_id, peer.role, peer.version) == ("ep-1", Role.ENDPOINT, PROTOCOL_VERSION_2)
            assert link.extensions == peer.extensions == frozenset({7})
            # The transport advertises its own receive limit, whatever the identity said.
            assert link.capabilities.max_message_size == 1 << 20
            assert peer.capabilities.max_message_size == 1 << 24
            assert srv.links == [peer]
            await exchange(link, peer, Heartbeat(seq=1))
            await exchange(peer, link, Heartbeat(seq=2))

    run(test)


def test_client_certificate_from_another_ca_is_refused(pki: Path, other_pki: Path) -> None:
    async def test() -> None:
        async with server(pki) as (srv, accepted):
            mixed = TransportConfig(
                ca_file=pki / "ca.pem", cert_file=other_pki / "ep-1.pem", key_file=other_pki / "ep-1.key"
            )
            host, port = srv.address
            error = await refused(connect(host, port, mixed, identity("ep-1"), "agg-1", timeout=5))
            assert error.code is ErrorCode.UNAUTHORIZED
            assert "bad_certificate" in error.detail
            assert accepted.empty() and srv.links == []
            # The server is unharmed.
            link = await dial(srv, pki, "ep-2")
            assert link.node_id == "agg-1"
            assert (await accepted.get()).node_id == "ep-2"

    run(test)


@pytest.mark.parametrize(
    ("connect_plain", "configuration_class"),
    [(aioquic_connect, QuicConfiguration), (qh3_connect, Qh3Configuration)],
    ids=["aioquic-client", "qh3-client"],
)
def test_client_without_certificate_is_refused(
    pki: Path, connect_plain: Callable[..., Any], configuration_class: type[Any]
) -> None:
    """A plain client of either stack (its own TLS) presents no certificate when asked;
    the server refuses at the handshake."""

    async def test() -> None:
        async with server(pki) as (srv, accepted):
            host, port = srv.address
            plain = configuration_class(is_client=True, alpn_protocols=[ALPN], verify_mode=ssl.CERT_NONE)
            async with connect_plain(host, port, configuration=plain) as client:
                await asyncio.wait_for(client.wait_closed(), 5)
                termination = client._quic._close_event
                assert termination is not None
                assert (
                    termination.error_code
                    == QuicErrorCode.CRYPTO_ERROR + AlertDescription.certificate_required
                )
            assert accepted.empty()

    run(test)


def test_links_run_on_the_configured_backend(pki: Path, quic_backend: str) -> None:
    connection_class = {"aioquic": CcoQuicConnection, "qh3": Qh3Connection}[quic_backend]

    async def test() -> None:
        async with server(pki) as (srv, accepted):
            link = await dial(srv, pki)
            assert isinstance(protocol(link)._quic, connection_class)
            assert isinstance(protocol(await accepted.get())._quic, connection_class)

    run(test)


def test_quic_keeps_a_fine_clock_on_a_loop_whose_clock_is_coarse(
    pki: Path, quic_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvloop's loop.time() is the start of the loop turn in whole milliseconds; the
    times QUIC measures round trips and paces with must be finer than that."""
    connection_class = {"aioquic": CcoQuicConnection, "qh3": Qh3Connection}[quic_backend]
    seen: list[float] = []
    original = connection_class.datagrams_to_send

    def recording(self: Any, now: float) -> Any:
        seen.append(now)
        return original(self, now=now)

    monkeypatch.setattr(connection_class, "datagrams_to_send", recording)

    async def test() -> None:
        loop = asyncio.get_running_loop()
        monkeypatch.setattr(loop, "time", lambda: math.floor(time.monotonic() * 1000) / 1000)
        async with server(pki) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            for index in range(5):
                await exchange(link, peer, chunk(GROUP_A, index))

    run(test)
    assert len(seen) > 10
    assert any(abs(now * 1000 - round(now * 1000)) > 1e-6 for now in seen)


@pytest.mark.parametrize(("client_backend", "server_backend"), [("aioquic", "qh3"), ("qh3", "aioquic")])
def test_backends_interoperate(pki: Path, client_backend: str, server_backend: str) -> None:
    async def test() -> None:
        async with server(pki, quic_backend=server_backend) as (srv, accepted):
            link = await dial(srv, pki, quic_backend=client_backend)
            peer = await accepted.get()
            assert (link.node_id, peer.node_id) == ("agg-1", "ep-1")
            await exchange(link, peer, chunk(GROUP_A, 0, elements=1 << 18, chunks=1))  # 1 MiB
            await exchange(peer, link, Heartbeat(seq=1))

    run(test)


def test_server_certificate_from_another_ca_is_refused(pki: Path, other_pki: Path) -> None:
    async def test() -> None:
        async with server(other_pki) as (srv, accepted):
            error = await refused(dial(srv, pki))
            assert error.code is ErrorCode.UNAUTHORIZED
            assert accepted.empty()

    run(test)


def test_server_must_be_the_expected_node(pki: Path) -> None:
    async def test() -> None:
        async with server(pki) as (srv, accepted):
            error = await refused(dial(srv, pki, expect="agg-2"))
            assert error.code is ErrorCode.UNAUTHORIZED
            assert "'agg-1', expected 'agg-2'" in error.detail
            assert accepted.empty()

    run(test)


def test_hello_that_contradicts_the_certificate_is_unauthorized(
    pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def lying_hello(local: LocalIdentity, versions: tuple[int, ...]) -> Hello:
        return Hello(versions=versions, role=Role.ENDPOINT, node_id="ep-2", capabilities=local.capabilities)

    monkeypatch.setattr("cco.transport.link.build_hello", lying_hello)

    async def test() -> None:
        async with server(pki) as (srv, accepted):
            error = await refused(dial(srv, pki, "ep-1"))
            assert error.code is ErrorCode.UNAUTHORIZED
            assert "'ep-2'" in error.detail and "'ep-1'" in error.detail
            assert accepted.empty()

    run(test)


def test_unsupported_version_is_refused(pki: Path) -> None:
    async def test() -> None:
        async with server(pki) as (srv, accepted):
            error = await refused(dial(srv, pki, versions=(99, 98)))
            assert error.code is ErrorCode.UNSUPPORTED_VERSION
            assert accepted.empty()

    run(test)


def test_own_certificate_must_match_local_identity(pki: Path) -> None:
    async def test() -> None:
        with pytest.raises(ValueError, match="is for 'ep-1'"):
            await connect("127.0.0.1", 9, config(pki, "ep-1"), identity("ep-2"), "agg-1")

    run(test)


def test_hello_timeout(pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = LinkProtocol._on_handshake_completed

    def silent_client(self: LinkProtocol, event: Any) -> None:
        if not self._is_client:
            original(self, event)

    monkeypatch.setattr(LinkProtocol, "_on_handshake_completed", silent_client)

    async def test() -> None:
        async with server(pki, hello_timeout=0.2) as (srv, _):
            error = await refused(dial(srv, pki))
            assert error.code is ErrorCode.TIMEOUT
            assert "no Hello" in error.detail

    run(test)


def test_connect_times_out_without_a_server(pki: Path) -> None:
    async def test() -> None:
        async with server(pki) as (srv, _):
            host, port = srv.address
        # The server is closed: nobody answers on that port any more.
        error = await refused(
            connect(host, port, config(pki, "ep-1"), identity("ep-1"), "agg-1", timeout=0.3)
        )
        assert error.code is ErrorCode.TIMEOUT

    run(test)


# --- messages and streams ----------------------------------------------------------


def test_ipv6_loopback(pki: Path) -> None:
    async def test() -> None:
        accepted: asyncio.Queue[PeerLink] = asyncio.Queue()
        try:
            srv = await serve("::1", 0, config(pki, "agg-1"), identity("agg-1"), accepted.put_nowait)
        except OSError:
            pytest.skip("no IPv6 loopback")
        try:
            link = await connect("::1", srv.address[1], config(pki, "ep-1"), identity("ep-1"), "agg-1", 5)
            await exchange(link, await accepted.get(), Heartbeat(seq=6))
        finally:
            await srv.close()

    run(test)


def test_large_and_many_small_messages_round_trip(pki: Path) -> None:
    async def test() -> None:
        async with server(pki) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            big = chunk(GROUP_A, 3, elements=1 << 20, chunks=4)  # 4 MiB payload, ~3000 packets
            assert len(big.payload) == 4 << 20
            link.send(big)
            assert await peer.receive() == big
            small = [ChunkAck(group_id=GROUP_B, epoch=0, op_id=i, chunks=(i,)) for i in range(500)]
            for message in small:
                peer.send(message)
            await peer.drain()
            assert [await link.receive() for _ in small] == small

    run(test)


def test_a_small_message_is_one_write_to_quic_and_a_large_payload_a_write_of_its_own(
    pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each piece queued costs a call into the QUIC stack, so a message of at most
    JOIN_BELOW bytes goes joined to its frame prefix; a payload of JOIN_BELOW bytes or
    more goes as a write of its own, the message's own bytes object (never copied
    into an encoded message), between the prefix with the fields before it and the
    fields after it.  Both arrive whole."""

    async def test() -> None:
        async with server(pki) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            quic = protocol(link)._quic
            writes: list[bytes] = []
            write = quic.send_stream_data

            def counted(stream_id: int, data: bytes, end_stream: bool = False) -> None:
                writes.append(data)
                write(stream_id, data, end_stream)

            monkeypatch.setattr(quic, "send_stream_data", counted)
            for elements, tag in (
                (2, None),
                (JOIN_BELOW // 4 - 64, None),
                (JOIN_BELOW // 4, None),
                (JOIN_BELOW // 4, 7),
            ):
                message = replace(chunk(GROUP_A, 0, elements=elements, chunks=1), tag=tag)
                frame = encode_frame(encode_message(message))
                writes.clear()
                link.send(message)
                assert await peer.receive() == message
                assert b"".join(writes) == frame
                if len(message.payload) < JOIN_BELOW:
                    assert len(writes) == 1
                else:
                    assert writes[1] is message.payload
                    assert len(writes) == (2 if tag is None else 3)  # the tag follows the payload

    run(test)


class Recorder:
    """A link listener that notes what it is handed, in order."""

    def __init__(self) -> None:
        self.items: list[Message | CcoError] = []
        self.closes: list[tuple[ErrorCode, str]] = []
        self.done = asyncio.Event()

    def deliver(self, item: Message | CcoError) -> None:
        self.items.append(item)

    def closed(self, code: ErrorCode, detail: str) -> None:
        self.closes.append((code, detail))
        self.done.set()


def test_a_listener_gets_what_was_queued_first_then_each_message_then_the_close_once(pki: Path) -> None:
    """PeerLink.listen: messages that arrived before it are handed over first, in
    order, on the loop's next turn; later ones as they are decoded; the close last,
    once, after every message that arrived before it."""

    async def test() -> None:
        async with server(pki) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            early = [chunk(GROUP_A, index) for index in range(3)]
            for message in early:
                peer.send(message)
            await peer.drain()
            while protocol(link)._inbox.queued < len(early):
                await asyncio.sleep(0.01)  # all three decoded and queued, nobody listening
            recorder = Recorder()
            link.listen(recorder)
            assert recorder.items == []  # handed over on the next turn, not inside listen()
            late = [chunk(GROUP_A, index) for index in range(3, 6)]  # one stream: in order
            for message in late:
                peer.send(message)
            await peer.drain()
            while len(recorder.items) < len(early) + len(late):
                await asyncio.sleep(0.01)
            peer.close(ErrorCode.SHUTTING_DOWN, "bye")
            await asyncio.wait_for(recorder.done.wait(), 5)
            await asyncio.sleep(0.05)  # nothing more comes
            assert recorder.items == early + late
            assert recorder.closes == [(ErrorCode.SHUTTING_DOWN, "bye")]

    run(test)


def test_stray_datagrams_do_not_disturb_a_running_link(pki: Path) -> None:
    """Datagrams no connection owns are dropped, whichever way the server routes them:
    short headers with an unknown connection ID (the fast path), a long header that is
    not an Initial, truncated and empty ones; the established link carries on."""

    async def test() -> None:
        async with server(pki) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            await exchange(link, peer, Heartbeat(seq=1))
            host, port = srv.address
            strays = [
                b"",
                b"\x40",
                b"\x41" + bytes(8) + bytes(40),  # short header, an unknown connection ID
                b"\x40" + b"\xff" * 60,
                b"\xe0\x00\x00\x00\x01\x08" + bytes(8) + b"\x00" + bytes(30),  # Handshake, unknown
            ]
            loop = asyncio.get_running_loop()
            sender, _ = await loop.create_datagram_endpoint(
                asyncio.DatagramProtocol, remote_addr=(host, port)
            )
            try:
                for data in strays:
                    sender.sendto(data)
                await asyncio.sleep(0.1)
            finally:
                sender.close()
            await exchange(link, peer, Heartbeat(seq=2))
            await exchange(peer, link, Heartbeat(seq=3))
            assert len(srv._protocols) == 1

    run(test)


def test_a_coalesced_run_goes_to_its_link_whole_only_if_every_datagram_is_the_links(pki: Path) -> None:
    """UDP GRO hands the server runs of datagrams from one address.  A run goes whole
    to a link when each of its datagrams has a short header with that link's
    connection ID; any other run is taken apart and routed datagram by datagram."""

    async def test() -> None:
        async with server(pki) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            await exchange(link, peer, Heartbeat(seq=1))
            cid, target = next(iter(srv._routes.items()))
            calls: list[tuple[str, int]] = []
            target.segments_received = lambda data, size, addr: calls.append(("run", len(data) // size))  # type: ignore[method-assign]
            target.datagram_received = lambda data, addr: calls.append(("one", len(data)))  # type: ignore[method-assign]
            try:
                own = b"\x41" + cid + bytes(40)
                unknown = b"\x41" + bytes(len(cid)) + bytes(40)
                handshake = b"\xe0" + bytes(len(own) - 1)
                address = ("127.0.0.1", 9)
                srv.segments_received(own * 3, len(own), address)
                assert calls == [("run", 3)]
                calls.clear()
                srv.segments_received(own + unknown + own, len(own), address)
                assert calls == [("one", len(own)), ("one", len(own))]  # the unknown one dropped
                calls.clear()
                srv.segments_received(own + handshake, len(own), address)
                assert calls == [("one", len(own))]
            finally:
                del target.segments_received, target.datagram_received  # type: ignore[attr-defined]
            await exchange(link, peer, Heartbeat(seq=2))

    run(test)


def test_a_link_takes_coalesced_runs_and_loses_nothing(pki: Path) -> None:
    """At 1452-byte datagrams a 4 MiB message reaches the server's link partly as
    kernel-coalesced runs (where the kernel offers UDP_GRO), and arrives intact."""

    async def test() -> int:
        async with server(pki, max_datagram_size=1452) as (srv, accepted):
            link = await dial(srv, pki, max_datagram_size=1452)
            peer = await accepted.get()
            runs: list[int] = []
            taker = protocol(peer)
            take_run = taker.segments_received

            def counting(data: bytes, size: int, addr: tuple[object, ...]) -> None:
                runs.append(len(data) // size)
                take_run(data, size, addr)

            taker.segments_received = counting  # type: ignore[method-assign]
            message = chunk(GROUP_A, 0, elements=1 << 20, chunks=1)
            link.send(message)
            assert await peer.receive() == message
            await exchange(peer, link, Heartbeat(seq=1))
            return len(runs)

    if run(test) == 0:
        pytest.skip("no coalesced run arrived: this kernel does not offer UDP_GRO on loopback")


def test_flush_hands_what_was_sent_to_the_socket_at_once(pki: Path, quic_backend: str) -> None:
    """A send is transmitted at the loop's next turn, or at once when flushed; flushing
    leaves no transmit scheduled, and flushing with nothing queued sends nothing."""

    async def test() -> None:
        async with server(pki) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            transport = protocol(link)._transport
            assert isinstance(transport, BatchedUdpTransport)
            handed: list[int] = []
            send_datagrams = transport.send_datagrams

            def counting(datagrams: list[bytes], addr: Any) -> None:
                handed.append(len(datagrams))
                send_datagrams(datagrams, addr)

            transport.send_datagrams = counting  # type: ignore[method-assign]
            message = chunk(GROUP_A, 1, elements=4096)
            link.send(message)
            assert handed == [] and protocol(link)._transmit_handle is not None
            link.flush()
            assert handed and protocol(link)._transmit_handle is None  # before the loop ran again
            link.flush()
            assert len(handed) == 1
            assert await asyncio.wait_for(peer.receive(), 5) == message

    run(test)


def test_data_travels_on_one_unidirectional_stream_per_group_in_order(pki: Path) -> None:
    async def test() -> None:
        async with server(pki) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            sent: list[Message] = []
            for index in range(200):
                sent.append(chunk(GROUP_A if index % 3 else GROUP_B, index, elements=2048))
                if index % 50 == 0:
                    sent.append(Heartbeat(seq=index))
            for message in sent:
                link.send(message)
            received = [await peer.receive() for _ in sent]
            assert sorted(map(repr, received)) == sorted(map(repr, sent))
            for group in (GROUP_A, GROUP_B):
                mine = [
                    m.chunk_index for m in received if isinstance(m, Contribution) and m.group_id == group
                ]
                assert mine == sorted(mine) and mine

            # Client-initiated unidirectional streams (id % 4 == 2), one per group.
            outbound = protocol(link)._outbound
            assert set(outbound) == {GROUP_A, GROUP_B}
            assert all(stream_id % 4 == 2 for stream_id in outbound.values())
            inbound = protocol(peer)._inbound.streams
            assert inbound[CONTROL_STREAM_ID].is_control
            assert {s.group_id for i, s in inbound.items() if i != CONTROL_STREAM_ID} == {GROUP_A, GROUP_B}

            # The server's data to the client uses its own streams (id % 4 == 3).
            peer.send(chunk(GROUP_A, 0))
            assert await link.receive() == chunk(GROUP_A, 0)
            assert list(protocol(peer)._outbound.values()) == [3]

    run(test)


def test_groups_beyond_the_peer_stream_limit_wait_for_a_stream(pki: Path, quic_backend: str) -> None:
    """One data stream per group: a group past the peer's MAX_STREAMS waits, nothing fails."""
    limit = {"aioquic": 128, "qh3": 103}[quic_backend]  # unidirectional streams a server allows

    async def test() -> None:
        async with server(pki) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            groups = [index.to_bytes(16, "big") for index in range(limit + 1)]
            for group in groups:
                link.send(chunk(group, 0))
            arrived = {(await asyncio.wait_for(peer.receive(), 5)).group_id for _ in range(limit)}
            assert arrived == set(groups[:limit])
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(peer.receive(), 0.3)
            # Ending one group's stream lets the peer allow one more.
            write_raw(link, protocol(link)._outbound[groups[0]], b"", end_stream=True)
            assert (await asyncio.wait_for(peer.receive(), 5)).group_id == groups[limit]

    run(test)


def test_message_larger_than_the_peer_accepts_is_refused_locally(pki: Path) -> None:
    async def test() -> None:
        async with server(pki, max_message_size=64 * 1024) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            with pytest.raises(EncodeError) as info:
                link.send(chunk(GROUP_A, 0, elements=32 * 1024))
            assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE
            await exchange(link, peer, chunk(GROUP_A, 1, elements=1024))  # still open

    run(test)


# --- peer errors -------------------------------------------------------------------

MALFORMED_CBOR = b"\x03\xff\xff\xff"  # a 3-byte frame of CBOR "break" codes
NON_SHORTEST_LENGTH = b"\x40\x01\x00"  # length 1 as a 2-byte varint
HUGE_LENGTH = b"\xbf\xff\xff\xff"  # a 1 GiB frame


@pytest.mark.parametrize(
    ("stream", "data", "code"),
    [
        ("data", MALFORMED_CBOR, ErrorCode.MALFORMED_CBOR),
        ("data", NON_SHORTEST_LENGTH, ErrorCode.FRAMING_ERROR),
        ("data", HUGE_LENGTH, ErrorCode.MESSAGE_TOO_LARGE),
        ("control", MALFORMED_CBOR, ErrorCode.MALFORMED_CBOR),
        ("data", encode_frame(encode_message(Heartbeat(seq=1))), ErrorCode.PROTOCOL_VIOLATION),
        ("control", encode_frame(encode_message(chunk(GROUP_A, 0))), ErrorCode.PROTOCOL_VIOLATION),
        (
            "data",
            encode_frame(encode_message(chunk(GROUP_A, 0))) + encode_frame(encode_message(chunk(GROUP_B, 1))),
            ErrorCode.PROTOCOL_VIOLATION,
        ),
        ("bidi", encode_frame(encode_message(Heartbeat(seq=1))), ErrorCode.PROTOCOL_VIOLATION),
    ],
)
def test_bad_input_closes_that_connection_only(pki: Path, stream: str, data: bytes, code: ErrorCode) -> None:
    async def test() -> None:
        async with server(pki) as (srv, accepted):
            good = await dial(srv, pki, "ep-1")
            good_peer = await accepted.get()
            bad = await dial(srv, pki, "ep-2")
            bad_peer = await accepted.get()
            stream_id = {"data": 2, "control": CONTROL_STREAM_ID, "bidi": 4}[stream]
            write_raw(bad, stream_id, data)
            assert (await bad.wait_closed())[0] is code
            assert (await bad_peer.wait_closed())[0] is code
            with pytest.raises(LinkClosed) as info:
                while True:  # valid messages before the bad one are still delivered
                    await bad_peer.receive()
            assert info.value.code is code
            # Other clients, current and new, are served as before.
            await exchange(good, good_peer, chunk(GROUP_A, 5))
            await exchange(good_peer, good, Heartbeat(seq=9))
            late = await dial(srv, pki, "ep-3")
            await exchange(late, await accepted.get(), Heartbeat(seq=10))

    run(test)


def test_decode_error_can_be_reported_without_closing(pki: Path) -> None:
    async def test() -> None:
        async with server(pki, close_on_decode_error=False) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            write_raw(link, CONTROL_STREAM_ID, MALFORMED_CBOR)
            with pytest.raises(DecodeError) as info:
                await asyncio.wait_for(peer.receive(), 5)
            assert info.value.code is ErrorCode.MALFORMED_CBOR
            await exchange(link, peer, Heartbeat(seq=3))
            assert peer.close_reason is None

    run(test)


# --- closing -----------------------------------------------------------------------


def test_close_code_and_detail_reach_the_peer(pki: Path) -> None:
    async def test() -> None:
        async with server(pki) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            link.send(Heartbeat(seq=1))
            await link.drain()
            link.close(ErrorCode.ABORTED, "bye")
            assert await link.wait_closed() == (ErrorCode.ABORTED, "bye")
            assert await peer.wait_closed() == (ErrorCode.ABORTED, "bye")
            # Messages that arrived before the close are still delivered, then the close.
            assert await peer.receive() == Heartbeat(seq=1)
            with pytest.raises(LinkClosed):
                await peer.receive()
            with pytest.raises(LinkClosed):
                link.send(Heartbeat(seq=2))
            assert srv.links == []

    run(test)


def test_async_iteration_ends_on_a_normal_close(pki: Path) -> None:
    async def test() -> None:
        async with server(pki) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            for seq in range(3):
                link.send(Heartbeat(seq=seq))
            link.close()  # queued messages are still delivered before the close
            assert [m async for m in peer] == [Heartbeat(seq=seq) for seq in range(3)]

    run(test)


def test_server_close_tells_clients(pki: Path) -> None:
    async def test() -> None:
        async with server(pki) as (srv, accepted):
            link = await dial(srv, pki)
            await accepted.get()
        assert (await link.wait_closed())[0] is ErrorCode.SHUTTING_DOWN

    run(test)


def test_silent_peer_is_reported_lost(pki: Path) -> None:
    async def test() -> None:
        async with server(pki, idle_timeout=0.5) as (srv, accepted):
            link = await dial(srv, pki, idle_timeout=0.5)
            peer = await accepted.get()
            # Nothing is sent; QUIC's idle timer ends both sides.
            assert (await peer.wait_closed())[0] is ErrorCode.PEER_LOST
            assert (await link.wait_closed())[0] is ErrorCode.PEER_LOST

    run(test)


def test_failing_handler_closes_its_link_only(pki: Path) -> None:
    async def test() -> None:
        calls: list[str] = []

        async def handler(link: PeerLink) -> None:
            calls.append(link.node_id)
            if link.node_id == "ep-1":
                raise RuntimeError("handler bug")
            link.send(Heartbeat(seq=42))

        srv = await serve("127.0.0.1", 0, config(pki, "agg-1"), identity("agg-1"), handler)
        try:
            bad = await dial(srv, pki, "ep-1")
            assert (await bad.wait_closed())[0] is ErrorCode.INTERNAL_ERROR
            good = await dial(srv, pki, "ep-2")
            assert await good.receive() == Heartbeat(seq=42)
        finally:
            await srv.close()
        assert calls == ["ep-1", "ep-2"]

    run(test)


def test_internal_error_costs_one_connection_only(pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def buggy_for_ep1(hello: Hello, *args: Any) -> Any:
        if hello.node_id == "ep-1":
            raise RuntimeError("a bug")
        return negotiate(hello, *args)

    monkeypatch.setattr("cco.transport.link.negotiate", buggy_for_ep1)

    async def test() -> None:
        async with server(pki) as (srv, accepted):
            error = await refused(dial(srv, pki, "ep-1"))
            assert error.code is ErrorCode.INTERNAL_ERROR
            link = await dial(srv, pki, "ep-2")
            await exchange(link, await accepted.get(), Heartbeat(seq=1))

    run(test)


# --- limits, packet size and diagnostics ------------------------------------------


def test_unread_messages_stall_the_sender(pki: Path) -> None:
    """A receiver that does not read holds a bounded amount; the sender waits in drain()."""
    mib = 1 << 20
    limits: dict[str, Any] = {
        "receive_window": mib,
        "receive_buffer": 2 * mib,
        "send_buffer": mib,
        "max_datagram_size": 9000,
    }

    async def test() -> None:
        async with server(pki, **limits) as (srv, accepted):
            link = await dial(srv, pki, **limits)
            peer = await accepted.get()
            messages = [chunk(GROUP_A, i, elements=mib // 4, chunks=16) for i in range(16)]  # 16 x 1 MiB

            async def send_all() -> None:
                for message in messages:
                    link.send(message)
                    await link.drain()

            sender = asyncio.ensure_future(send_all())
            receiver = protocol(peer)
            history: list[int] = []
            while len(history) < 4 or len(set(history[-4:])) > 1:  # until the inbox stops growing
                await asyncio.sleep(0.1)
                history.append(receiver._inbox.queued_bytes)
            assert not sender.done()
            assert receiver._cco.credit.frozen
            queued = receiver._inbox.queued_bytes
            assert 2 * mib < queued <= 2 * mib + mib + mib + 1024  # buffer + window + 1 msg
            assert [await peer.receive() for _ in messages] == messages
            await sender

    run(test, timeout=60)


def test_a_stalled_receiver_still_learns_that_the_peer_closed(pki: Path) -> None:
    """Frozen credit must not hide the close (qh3 holds events in its core while frozen)."""
    mib = 1 << 20
    limits: dict[str, Any] = {"receive_window": mib, "receive_buffer": 2 * mib}

    async def test() -> None:
        async with server(pki, **limits) as (srv, accepted):
            link = await dial(srv, pki, close_flush_timeout=0.2, **limits)
            peer = await accepted.get()
            receiver = protocol(peer)
            for index in range(8):
                link.send(chunk(GROUP_A, index, elements=mib // 4, chunks=8))
            while not receiver._cco.credit.frozen:
                await asyncio.sleep(0.05)
            link.close(ErrorCode.SHUTTING_DOWN, "going away")
            assert await asyncio.wait_for(peer.wait_closed(), 5) == (ErrorCode.SHUTTING_DOWN, "going away")

    run(test)


class _RecordingTransport:
    """Wraps a datagram transport to record the size of every datagram sent."""

    def __init__(self, inner: BatchedUdpTransport) -> None:
        self.inner = inner
        self.sizes: list[int] = []

    def send_datagrams(self, datagrams: list[bytes], addr: Any) -> None:
        self.sizes += [len(data) for data in datagrams]
        self.inner.send_datagrams(datagrams, addr)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _record(link: PeerLink) -> _RecordingTransport:
    recorder = _RecordingTransport(protocol(link)._transport)  # type: ignore[arg-type]
    protocol(link)._transport = recorder  # type: ignore[assignment]
    return recorder


@pytest.mark.parametrize("size", [1452, 9000, 16000])
def test_max_datagram_size_is_honoured_both_ways(pki: Path, quic_backend: str, size: int) -> None:
    """Each side sends datagrams up to the configured size (qh3's own client would
    tell a server it takes no more than 1472 bytes: the way down stayed at 1443)."""

    async def test() -> None:
        async with server(pki, max_datagram_size=size) as (srv, accepted):
            link = await dial(srv, pki, max_datagram_size=size)
            peer = await accepted.get()
            up, down = _record(link), _record(peer)
            message = chunk(GROUP_A, 0, elements=1 << 18, chunks=1)  # 1 MiB
            link.send(message)
            assert await peer.receive() == message
            peer.send(message)
            assert await link.receive() == message
            assert size - 64 <= max(up.sizes) <= size
            assert size - 64 <= max(down.sizes) <= size

    run(test)


def _largest_datagram_down(
    pki: Path, server_size: int, server_backend: str, client_size: int, client_backend: str
) -> int:
    """The largest datagram a 1 MiB message from server to client travels in."""

    async def test() -> int:
        async with server(pki, max_datagram_size=server_size, quic_backend=server_backend) as (srv, accepted):
            link = await dial(srv, pki, max_datagram_size=client_size, quic_backend=client_backend)
            peer = await accepted.get()
            down = _record(peer)
            message = chunk(GROUP_A, 0, elements=1 << 18, chunks=1)
            peer.send(message)
            assert await link.receive() == message
            return max(down.sizes)

    return run(test)


@pytest.mark.parametrize(("client_backend", "server_backend"), [("qh3", "aioquic"), ("aioquic", "qh3")])
def test_full_size_datagrams_between_backends(pki: Path, client_backend: str, server_backend: str) -> None:
    assert 9000 - 64 <= _largest_datagram_down(pki, 9000, server_backend, 9000, client_backend) <= 9000


@pytest.mark.parametrize("client_backend", ["aioquic", "qh3"])
def test_a_qh3_server_keeps_to_the_datagram_size_its_client_takes(pki: Path, client_backend: str) -> None:
    """A client on either stack advertises its own configured size; a qh3 server
    sends no larger (aioquic ignores what its peer advertises)."""
    assert 4000 - 64 <= _largest_datagram_down(pki, 16000, "qh3", 4000, client_backend) <= 4000


def test_a_message_sent_to_several_peers_in_a_row_is_encoded_once(
    pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As an aggregator sends one Result to every child; each peer still gets it whole."""
    from cco.transport import link as link_module

    encodings: list[Message] = []

    def counting(message: Message, large: int) -> list[bytes]:
        encodings.append(message)
        return encode_message_pieces(message, large)

    monkeypatch.setattr(link_module, "encode_message_pieces", counting)

    async def test() -> None:
        async with server(pki) as (srv, accepted):
            clients = [await dial(srv, pki, node_id) for node_id in ("ep-1", "ep-2")]
            peers = [await accepted.get() for _ in clients]
            result = chunk(GROUP_A, 0, elements=1 << 12, chunks=1)
            other = chunk(GROUP_A, 1, elements=1 << 12, chunks=2)
            encodings.clear()
            for message in (result, other):
                for peer in peers:
                    peer.send(message)
            for client in clients:
                assert [await client.receive(), await client.receive()] == [result, other]
            assert encodings == [result, other]

    run(test)


def test_qh3_takes_what_arrives_after_the_handshake_straight_to_its_core(
    pki: Path, quic_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without qlog, no datagram received after the handshake goes through qh3's own
    receive methods, whose walk over a run's datagrams sliced (copied) each one to
    log it; the messages still arrive whole both ways."""
    if quic_backend != "qh3":
        pytest.skip("only the qh3 backend has that walk")

    async def test() -> None:
        async with server(pki) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await accepted.get()
            walked: list[str] = []
            for end in (link, peer):
                native = protocol(end)._cco._native  # type: ignore[attr-defined]
                for name in ("receive_datagram", "receive_many_datagrams", "receive_gro_buffer"):
                    method = getattr(native, name)

                    def counted(*args: Any, name: str = name, method: Any = method) -> None:
                        walked.append(name)
                        method(*args)

                    monkeypatch.setattr(native, name, counted)
            message = chunk(GROUP_A, 0, elements=1 << 15, chunks=1)
            link.send(message)
            assert await peer.receive() == message
            peer.send(message)
            assert await link.receive() == message
            assert walked == []

    run(test)


def test_qlog_and_key_log_are_written(pki: Path, tmp_path: Path) -> None:
    async def test() -> None:
        server_qlog, client_qlog, keylog = tmp_path / "qlog-s", tmp_path / "qlog-c", tmp_path / "keys.log"
        async with server(pki, qlog_dir=server_qlog, keylog_file=keylog) as (srv, accepted):
            link = await dial(srv, pki, qlog_dir=client_qlog)
            await exchange(link, await accepted.get(), Heartbeat(seq=1))
            link.close()
            await link.wait_closed()
        for directory in (server_qlog, client_qlog):
            traces = list(directory.glob("*.qlog"))
            assert len(traces) == 1 and b"stream" in traces[0].read_bytes()
        labels = {line.split()[0] for line in keylog.read_text().splitlines()}
        assert {"CLIENT_HANDSHAKE_TRAFFIC_SECRET", "SERVER_TRAFFIC_SECRET_0"} <= labels

    run(test)


# --- what QUIC measures of the path ---------------------------------------------------


def test_each_side_reports_the_path_quic_measured(pki: Path) -> None:
    async def scenario() -> None:
        async with server(pki) as (srv, accepted):
            link = await dial(srv, pki)
            peer = await asyncio.wait_for(accepted.get(), 5)
            for index in range(20):  # data both ways: ACKs give each side RTT samples
                await exchange(link, peer, chunk(GROUP_A, index, elements=4096))
                await exchange(peer, link, chunk(GROUP_B, index, elements=4096))
            for side in (link, peer):
                stats = side.path_stats()
                assert stats.smoothed_rtt is not None and 0 < stats.smoothed_rtt < 5
                assert stats.latest_rtt is not None and stats.latest_rtt > 0
                assert stats.congestion_window >= 2 * 1200
                assert stats.bytes_in_flight >= 0
                assert stats.send_rate == stats.congestion_window / stats.smoothed_rtt
            link.close()
            await link.wait_closed()

    run(scenario)


def test_path_stats_before_any_round_trip_say_so() -> None:
    stats = PathStats(smoothed_rtt=None, latest_rtt=None, congestion_window=12000, bytes_in_flight=0)
    assert stats.send_rate is None
