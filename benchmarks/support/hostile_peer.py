"""One hostile peer: the attacks of issue 41, each bounded in count and time.

The attacker speaks QUIC (aioquic's client) and CCO framing directly, with the
wire layer's codec and nothing of this implementation's transport, nodes or
services: it is what a foreign peer holding a certificate of the group CA can do
(the spoofed Initials need no certificate at all).  Run as a process of its own,
it attacks for ``--duration`` seconds, stops by itself and prints one JSON object:
what it sent and what came back (answers by kind, Error and close codes).

    python benchmarks/support/hostile_peer.py join-flood --pki DIR --rendezvous 127.0.0.1:4433 \\
        --aggregators 127.0.0.1:5001,127.0.0.1:5002 --duration 20

Attacks (:data:`ATTACKS`): join-flood, capacity, spoofed-initials, slow-reader,
parked-chunks, unfinished-frames, garbage-frames.  ``--scale`` multiplies their
counts (the CI tests run small versions).  Traffic goes to the addresses given,
which the callers keep on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import ssl
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from cco.wire.errors import ErrorCode
from cco.wire.framing import FrameDecoder, encode_frame, encode_varint
from cco.wire.messages import (
    Abort,
    Capabilities,
    ChunkMessage,
    Contribution,
    Error,
    Heartbeat,
    Hello,
    JoinAccept,
    JoinReject,
    JoinRequest,
    Message,
    TreeAssignment,
    decode_message,
    encode_message,
)
from cco.wire.payload import ChunkHeader, derive_group_keys, seal
from cco.wire.registries import ALPN, Collective, DType, ReduceOp, Role

CONTROL = 0
IDENTITIES = 64
"""Endpoint certificates the attacker holds besides its own (see :meth:`Setup.identity`)."""
DATA_TYPES = (ChunkMessage, Abort)

# --- a reader that can stop reading ------------------------------------------------------
#
# aioquic raises its receive windows (MAX_DATA, MAX_STREAM_DATA) as data arrives, that
# is, it always reads.  A connection marked ``hostile_frozen`` never raises them again:
# the server may send it no more than the credit already granted, and whatever else it
# owes this peer stays queued on the server.

_stream_limits = QuicConnection._write_stream_limits
_connection_limits = QuicConnection._write_connection_limits


def _frozen_stream_limits(self: QuicConnection, *args: Any, **kwargs: Any) -> None:
    if not getattr(self, "hostile_frozen", False):
        _stream_limits(self, *args, **kwargs)


def _frozen_connection_limits(self: QuicConnection, *args: Any, **kwargs: Any) -> None:
    if not getattr(self, "hostile_frozen", False):
        _connection_limits(self, *args, **kwargs)


QuicConnection._write_stream_limits = _frozen_stream_limits  # type: ignore[method-assign]
QuicConnection._write_connection_limits = _frozen_connection_limits  # type: ignore[method-assign]


@dataclass
class Tally:
    """What one attack sent and what came back."""

    sent: Counter[str] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)
    closes: Counter[str] = field(default_factory=Counter)
    notes: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sent": dict(self.sent),
            "answers": dict(self.answers),
            "closes": dict(self.closes),
            **self.notes,
        }


class Peer(QuicConnectionProtocol):
    """One attacking connection: sends frames on any stream, decodes what comes back."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tally: Tally | None = None
        self.decoders: dict[int, FrameDecoder] = {}
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.closed = asyncio.Event()
        self.close_code: int | None = None
        self.close_reason = ""
        self.data_streams: dict[bytes, int] = {}

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived):
            decoder = self.decoders.setdefault(event.stream_id, FrameDecoder(1 << 26))
            try:
                frames = decoder.feed(event.data)
            except Exception:
                frames = []
            for frame in frames:
                try:
                    message = decode_message(frame)
                except Exception:
                    continue
                if self.tally is not None and not isinstance(message, Heartbeat):
                    self.tally.answers[_label(message)] += 1
                self.inbox.put_nowait(message)
        elif isinstance(event, events.ConnectionTerminated):
            self.close_code, self.close_reason = event.error_code, event.reason_phrase
            if self.tally is not None:
                self.tally.closes[_close_label(event.error_code)] += 1
            self.closed.set()

    def write(self, stream_id: int, data: bytes) -> None:
        self._quic.send_stream_data(stream_id, data)
        self.transmit()

    def send(self, message: Message) -> None:
        """``message`` framed, on the control stream or its group's data stream."""
        stream = CONTROL
        if isinstance(message, DATA_TYPES):
            stream = self.data_streams.get(message.group_id, -1)
            if stream < 0:
                stream = self.new_uni_stream()
                self.data_streams[message.group_id] = stream
        self.write(stream, encode_frame(encode_message(message), 1 << 26))
        if self.tally is not None:
            self.tally.sent[type(message).__name__] += 1

    def new_uni_stream(self) -> int:
        stream_id: int = self._quic.get_next_available_stream_id(is_unidirectional=True)
        return stream_id

    def queued(self) -> int:
        """Bytes written but not yet acknowledged (the peer's flow control holds them)."""
        return sum(len(stream.sender._buffer) for stream in self._quic._streams.values())

    def freeze(self) -> None:
        """Never raise this connection's receive windows again: stop reading."""
        self._quic.hostile_frozen = True  # type: ignore[attr-defined]

    async def expect(self, kinds: tuple[type[Message], ...], timeout: float) -> Message:
        """The next message of one of ``kinds`` (others are dropped)."""

        async def wait() -> Message:
            while True:
                message = await self.inbox.get()
                if isinstance(message, kinds):
                    return message

        return await asyncio.wait_for(wait(), timeout)


def _label(message: Message) -> str:
    if isinstance(message, (Error, JoinReject, Abort)):
        return f"{type(message).__name__}:{message.code.name}"
    return type(message).__name__


def _close_label(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"quic:0x{code:x}"


@dataclass(frozen=True)
class Setup:
    """Where the attacker finds the servers and its certificates."""

    pki: Path
    rendezvous: tuple[str, int]
    aggregators: tuple[tuple[str, int], ...]
    node_id: str
    duration: float
    scale: float
    heartbeat: float = 0.5
    datagram_size: int = 1200
    """The client's QUIC datagram size; the servers here run at 16000."""

    def count(self, full: int) -> int:
        return max(1, round(full * self.scale))

    def identity(self, index: int) -> str:
        """The node id of the attacker's ``index``-th concurrent connection: a
        rendezvous takes one connection per node id, so each has a certificate of
        its own (``attacker-0`` ... ``attacker-{IDENTITIES - 1}``)."""
        return f"{self.node_id}-{index % IDENTITIES}"


def _configuration(setup: Setup, node_id: str) -> QuicConfiguration:
    config = QuicConfiguration(
        is_client=True,
        alpn_protocols=[ALPN],
        verify_mode=ssl.CERT_NONE,
        max_datagram_frame_size=None,
        idle_timeout=60.0,
        max_datagram_size=setup.datagram_size,
    )
    config.load_cert_chain(str(setup.pki / f"{node_id}.pem"), str(setup.pki / f"{node_id}.key"))
    config.load_verify_locations(cafile=str(setup.pki / "ca.pem"))
    config.server_name = node_id
    return config


def hello(node_id: str, role: Role = Role.ENDPOINT) -> Hello:
    capabilities = Capabilities(
        dtypes=tuple(DType),
        ops=tuple(ReduceOp),
        collectives=tuple(Collective),
        max_message_size=1 << 24,
        max_chunk_elements=1 << 20,
        extensions=(),
    )
    return Hello(versions=(2,), role=role, node_id=node_id, capabilities=capabilities)


@contextlib.asynccontextmanager
async def session(
    setup: Setup, address: tuple[str, int], tally: Tally, node_id: str | None = None
) -> AsyncIterator[Peer]:
    """An authenticated connection that said Hello and got HelloAck (or was refused)."""
    node_id = node_id or setup.node_id
    async with contextlib.AsyncExitStack() as stack:
        opened = connect(*address, configuration=_configuration(setup, node_id), create_protocol=Peer)
        async with asyncio.timeout(HANDSHAKE_WAIT):
            peer = await stack.enter_async_context(opened)
        assert isinstance(peer, Peer)
        peer.tally = tally
        peer.send(hello(node_id))
        with contextlib.suppress(TimeoutError):
            await peer.expect((Message,), 10.0)  # HelloAck, or the Error refusing us
        beat = asyncio.create_task(_heartbeats(peer, setup.heartbeat))
        try:
            yield peer
        finally:
            beat.cancel()
            # a server busy with the attack acknowledges slowly: do not wait long for
            # the connection's close (the process ends with the attack anyway)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await stack.aclose()


async def _heartbeats(peer: Peer, interval: float) -> None:
    """Stay a live peer: the servers drop one that sends nothing for three intervals."""
    seq = 0
    while not peer.closed.is_set():
        await asyncio.sleep(interval)
        seq += 1
        peer._quic.send_stream_data(CONTROL, encode_frame(encode_message(Heartbeat(seq=seq))))
        peer.transmit()


def _until(setup: Setup) -> float:
    return time.monotonic() + setup.duration


async def _hold(deadline: float, *peers: Peer) -> None:
    """Stay connected until ``deadline`` (or until every peer was closed)."""
    while time.monotonic() < deadline and not all(p.closed.is_set() for p in peers):
        await asyncio.sleep(0.1)


# --- the attacks -------------------------------------------------------------------------


async def join_flood(setup: Setup, tally: Tally) -> None:
    """5,000 JoinRequests for new random groups of two, on one connection, as fast as
    the connection takes them; then stay connected, answering heartbeats."""
    deadline = _until(setup)
    count = setup.count(5000)
    async with session(setup, setup.rendezvous, tally) as peer:
        started = time.monotonic()
        for index in range(count):
            peer.send(JoinRequest(group_id=os.urandom(16), world_size=2, credential=b"", labels=()))
            if index % 100 == 99:
                await asyncio.sleep(0)
        tally.notes["send_seconds"] = time.monotonic() - started
        await _answered(peer, tally, lambda: tally.answers.total() >= count, deadline)
        await _hold(deadline, peer)


async def _answered(peer: Peer, tally: Tally, done: Callable[[], bool], deadline: float) -> None:
    started = time.monotonic()
    while not done() and time.monotonic() < deadline and not peer.closed.is_set():
        await asyncio.sleep(0.05)
    tally.notes["answered_within_seconds"] = time.monotonic() - started if done() else None


async def capacity(setup: Setup, tally: Tally) -> None:
    """JoinRequests for one-member groups until every aggregator slot is taken (each
    forms at once and takes a slot); then stay connected, holding them."""
    deadline = _until(setup)
    count = setup.count(64)
    async with session(setup, setup.rendezvous, tally) as peer:
        for _ in range(count):
            peer.send(JoinRequest(group_id=os.urandom(16), world_size=1, credential=b"", labels=()))
        await asyncio.sleep(2.0)
        tally.notes["trees_received"] = tally.answers["TreeAssignment"]
        await _hold(deadline, peer)


def initial_datagram(rng: random.Random) -> bytes:
    """1200 bytes shaped like a client's QUIC v1 Initial (RFC 9000, section 17.2.2):
    long header, random connection ids, no token, a payload nobody can decrypt."""
    dcid = rng.randbytes(rng.randint(8, 20))
    scid = rng.randbytes(rng.randint(0, 20))
    head = bytes([0xC3]) + (1).to_bytes(4, "big") + bytes([len(dcid)]) + dcid + bytes([len(scid)]) + scid
    head += encode_varint(0)  # token length
    rest = 1200 - len(head) - 2
    return head + (0x4000 | rest).to_bytes(2, "big") + rng.randbytes(rest)


async def spoofed_initials(setup: Setup, tally: Tally) -> None:
    """Two waves of 10,000 Initial-shaped datagrams with random connection ids to each
    server, from many source ports; the second wave half-way through the attack."""
    deadline = _until(setup)
    rng = random.Random(41)
    per_wave = setup.count(10_000)
    targets = [setup.rendezvous, *setup.aggregators]
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(16)]
    try:
        for sock in sockets:
            sock.setblocking(False)
            sock.bind(("127.0.0.1", 0))
        for wave in range(2):
            started = time.monotonic()
            for index in range(per_wave):
                datagram = initial_datagram(rng)
                for target in targets:
                    with contextlib.suppress(BlockingIOError):
                        sockets[index % len(sockets)].sendto(datagram, target)
                        tally.sent["initial"] += 1
                if index % 200 == 199:
                    await asyncio.sleep(0.005)  # loopback's socket buffers drop a burst
            tally.notes[f"wave{wave + 1}_seconds"] = time.monotonic() - started
            if wave == 0:
                await asyncio.sleep(max(0.0, (deadline - time.monotonic()) / 2))
        for sock in sockets:  # count what came back (Retry, Version Negotiation, ...)
            with contextlib.suppress(BlockingIOError):
                while True:
                    sock.recv(2048)
                    tally.answers["datagram"] += 1
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
    finally:
        for sock in sockets:
            sock.close()


async def _join_alone(setup: Setup, peer: Peer, tally: Tally) -> tuple[JoinAccept, TreeAssignment]:
    """Form a one-member group; its JoinAccept and the endpoint's TreeAssignment."""
    group = os.urandom(16)
    peer.send(JoinRequest(group_id=group, world_size=1, credential=b"", labels=()))
    accept = await peer.expect((JoinAccept, JoinReject), 20.0)
    if not isinstance(accept, JoinAccept):
        raise RuntimeError(f"the rendezvous refused the attacker's group: {accept}")
    tree = await peer.expect((TreeAssignment,), 20.0)
    assert isinstance(tree, TreeAssignment)
    return accept, tree


async def slow_reader(setup: Setup, tally: Tally) -> None:
    """An authenticated member of its own one-member group that sends its aggregator
    contribution after contribution (each completes a slot at once) and never reads
    the Results: what the aggregator owes it piles up."""
    deadline = _until(setup)
    elements = 16384
    async with session(setup, setup.rendezvous, tally) as rendezvous:
        accept, tree = await _join_alone(setup, rendezvous, tally)
        assert tree.parent is not None
        parent = (tree.parent.address.host, tree.parent.address.port)
        keys = derive_group_keys(accept.group_secret, accept.group_id)
        values = np.arange(elements, dtype=np.int64) % 1000
        async with session(setup, parent, tally) as peer:
            peer.freeze()
            tally.notes["aggregator"] = tree.parent.node_id
            op_id = 0
            limit = setup.count(4000)
            while time.monotonic() < deadline and op_id < limit and not peer.closed.is_set():
                header = ChunkHeader(
                    group_id=accept.group_id,
                    epoch=tree.epoch,
                    op_id=op_id,
                    kind=Collective.ALL_REDUCE,
                    op=ReduceOp.SUM,
                    dtype=DType.INT32,
                    total_elements=elements,
                    chunk_elements=tree.params.chunk_elements,
                    chunk_index=0,
                )
                if tree.params.chunk_elements < elements:
                    header = ChunkHeader(**{**_fields(header), "total_elements": tree.params.chunk_elements})
                count = header.element_count
                peer.send(seal(keys, header, accept.rank, values[:count]))
                op_id += 1
                while peer.queued() > 1 << 22 and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)  # the aggregator reads: wait for it, not for ourselves
                await asyncio.sleep(0)
            tally.notes["operations_sent"] = op_id
            tally.notes["result_bytes_owed"] = op_id * 4 * min(elements, tree.params.chunk_elements)
            await _hold(deadline, peer, rendezvous)


def _fields(header: ChunkHeader) -> dict[str, Any]:
    return {name: getattr(header, name) for name in header.__dataclass_fields__}


def _chunk(group: bytes, op_id: int, elements: int, rng: np.random.Generator) -> Contribution:
    """A well-formed Contribution for ``group`` (its tag made with a key nobody holds)."""
    header = ChunkHeader(
        group_id=group,
        epoch=1,
        op_id=op_id,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.INT32,
        total_elements=elements,
        chunk_elements=elements,
        chunk_index=0,
    )
    keys = derive_group_keys(b"\x00" * 32, group)
    message = seal(keys, header, 0, rng.integers(-(1 << 30), 1 << 30, elements))
    assert isinstance(message, Contribution)
    return message


async def parked_chunks(setup: Setup, tally: Tally) -> None:
    """Large Contributions for groups no aggregator has heard of, which it parks until
    their assignment comes (it never does), from several connections at once, again
    as soon as the parked ones are refused."""
    deadline = _until(setup)
    connections = setup.count(8)
    per_connection = 64  # the aggregator's pending_limit per peer
    elements = 1 << 17  # 512 KiB of int32 per chunk
    rng = np.random.default_rng(41)
    chunk = _chunk(os.urandom(16), 0, elements, rng)

    async def one(address: tuple[str, int], who: str) -> None:
        async with session(setup, address, tally, who) as peer:
            while time.monotonic() < deadline and not peer.closed.is_set():
                group = os.urandom(16)
                for op_id in range(per_connection):
                    peer.send(_replace(chunk, group_id=group, op_id=op_id))
                    while peer.queued() > 1 << 23 and time.monotonic() < deadline:
                        await asyncio.sleep(0.01)
                await asyncio.sleep(1.0)

    targets = list(setup.aggregators)
    await asyncio.gather(*(one(targets[i % len(targets)], setup.identity(i)) for i in range(connections)))
    tally.notes["bytes_per_chunk"] = len(chunk.payload)


def _replace(message: Contribution, **changes: Any) -> Contribution:
    """The chunk under another group or operation (its tag no longer matches: the
    aggregator, holding no key, cannot tell)."""
    import dataclasses

    return dataclasses.replace(message, **changes)


async def unfinished_frames(setup: Setup, tally: Tally) -> None:
    """On every unidirectional stream a connection may open (and on its control
    stream), the length prefix of a 16 MiB frame and the first part of its body,
    never the rest; at every server, from several connections."""
    deadline = _until(setup)
    connections = setup.count(4)
    body = 1 << 18  # bytes of each frame sent
    claim = (1 << 24) - 1

    async def one(address: tuple[str, int], who: str) -> None:
        async with session(setup, address, tally, who) as peer:
            streams = [peer.new_uni_stream() for _ in range(setup.count(96))]
            piece = encode_varint(claim) + os.urandom(body)
            for stream in streams:
                peer.write(stream, piece)
                tally.sent["unfinished_frame"] += 1
                while peer.queued() > 1 << 23 and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            peer.write(CONTROL, encode_varint(claim) + os.urandom(body))
            tally.sent["unfinished_control_frame"] += 1
            await _hold(deadline, peer)

    targets = [setup.rendezvous, *setup.aggregators]
    await asyncio.gather(
        *(one(targets[i % len(targets)], setup.identity(i)) for i in range(connections * len(targets)))
    )


def hostile_inputs() -> list[tuple[str, int | None, bytes]]:
    """Bytes an authenticated peer sends after Hello, each on a fresh connection:
    (name, stream: None for a new unidirectional one, the bytes)."""
    group = os.urandom(16)
    chunk = _chunk(group, 0, 64, np.random.default_rng(1))
    foreign = encode_message(chunk)
    join = encode_message(JoinRequest(group_id=group, world_size=2, credential=b"", labels=()))
    return [
        ("truncated CBOR", CONTROL, encode_frame(bytes.fromhex("8204a101"))),
        ("not CBOR at all", CONTROL, encode_frame(b"\xff\xfe\xfd\xfc")),
        ("a tag", CONTROL, encode_frame(bytes.fromhex("c1820401"))),
        ("a float", CONTROL, encode_frame(bytes.fromhex("fb3ff0000000000000"))),
        ("indefinite length", CONTROL, encode_frame(bytes.fromhex("9f0401ff"))),
        ("non-shortest integer", CONTROL, encode_frame(bytes.fromhex("821804a10100"))),
        ("trailing bytes", CONTROL, encode_frame(join + b"\x00")),
        ("unknown message type", CONTROL, encode_frame(bytes.fromhex("821863a0"))),
        ("missing field", CONTROL, encode_frame(bytes.fromhex("8204a0"))),
        ("unknown field", CONTROL, encode_frame(bytes.fromhex("8204a201001863f5"))),
        ("huge length prefix", CONTROL, encode_varint((1 << 62) - 1)),
        ("non-shortest length prefix", CONTROL, bytes.fromhex("4001") + b"\x00"),
        ("second Hello", CONTROL, encode_frame(encode_message(hello("attacker")))),
        ("HelloAck from a client", CONTROL, encode_frame(bytes.fromhex("8202a0"))),
        ("chunk on the control stream", CONTROL, encode_frame(foreign)),
        ("JoinRequest on a data stream", None, encode_frame(join)),
        ("chunk of a foreign group", None, encode_frame(foreign)),
        ("control stream finished", CONTROL, b""),
        ("bidirectional stream opened", 4, encode_frame(join)),
    ]


async def _one_input(
    setup: Setup, address: tuple[str, int], who: str, name: str, stream: int | None, data: bytes, wait: float
) -> str:
    """Send one hostile input as ``who``; what came back first: an Error (its code), a
    close (its code), or nothing within ``wait`` seconds."""
    try:
        async with asyncio.timeout(wait + HANDSHAKE_WAIT):
            return await _answer(setup, address, who, name, stream, data, wait)
    except TimeoutError:
        return "error:timeout"


HANDSHAKE_WAIT = 15.0
"""Seconds a connection may take to open and to close, besides the wait for an answer."""


async def _answer(
    setup: Setup, address: tuple[str, int], who: str, name: str, stream: int | None, data: bytes, wait: float
) -> str:
    tally = Tally()
    async with session(setup, address, tally, who) as peer:
        peer.inbox = asyncio.Queue()  # the HelloAck is behind us
        tally.answers.clear()
        target = peer.new_uni_stream() if stream is None else stream
        if name == "control stream finished":
            peer._quic.send_stream_data(CONTROL, b"", end_stream=True)
            peer.transmit()
        else:
            peer.write(target, data)
        ended = time.monotonic() + wait
        while time.monotonic() < ended and not peer.closed.is_set():
            answered = [k for k in tally.answers if not k.startswith(("HelloAck", "Heartbeat"))]
            if answered:
                return answered[0]
            await asyncio.sleep(0.02)
        if peer.closed.is_set():
            return f"close:{_close_label(peer.close_code or 0)}"
        answered = [k for k in tally.answers if not k.startswith(("HelloAck", "Heartbeat"))]
        return answered[0] if answered else "nothing"


CONCURRENT_INPUTS = 8
"""Hostile inputs in flight at once: enough to finish the catalogue in seconds, few
enough that the handshakes themselves do not keep a busy machine from answering."""
ANSWER_WAIT = 7.0
"""Seconds a hostile input waits for its answer: an aggregator answers a parked chunk
when its pending timeout (5 s) passes."""


async def garbage_frames(setup: Setup, tally: Tally) -> None:
    """Every hostile input of :func:`hostile_inputs` to every server, each on a fresh
    connection, noting which got neither an Error nor a close; then random garbage
    frames from new connections, one after another, until the attack ends."""
    deadline = _until(setup)
    targets = {"rendezvous": setup.rendezvous} | {
        f"aggregator-{i}": a for i, a in enumerate(setup.aggregators)
    }
    cases = [(server, address, *case) for server, address in targets.items() for case in hostile_inputs()]
    at_once = asyncio.Semaphore(CONCURRENT_INPUTS)

    async def one(index: int, address: tuple[str, int], name: str, stream: int | None, data: bytes) -> str:
        async with at_once:
            return await _one_input(setup, address, setup.identity(index), name, stream, data, ANSWER_WAIT)

    got = await asyncio.gather(
        *(
            one(index, address, name, stream, data)
            for index, (_, address, name, stream, data) in enumerate(cases)
        ),
        return_exceptions=True,
    )
    answers: dict[str, dict[str, str]] = {}
    for (server, _, name, _, _), answer in zip(cases, got, strict=True):
        answers.setdefault(name, {})[server] = answer if isinstance(answer, str) else f"error:{answer!r}"
    tally.notes["hostile_inputs"] = answers
    tally.notes["unanswered"] = sorted(
        f"{name} @ {server}" for name, by in answers.items() for server, got in by.items() if got == "nothing"
    )
    rng = random.Random(41)

    async def garbage(who: str) -> None:
        while time.monotonic() < deadline:
            address = list(targets.values())[rng.randrange(len(targets))]
            stream = CONTROL if rng.random() < 0.5 else None
            frame = encode_frame(rng.randbytes(rng.randrange(1, 4096)))
            try:
                answer = await _one_input(setup, address, who, "garbage", stream, frame, 1.0)
            except Exception as error:  # a refused handshake, for one
                answer = f"error:{type(error).__name__}"
            tally.sent["garbage_frame"] += 1
            tally.answers[f"garbage:{answer}"] += 1

    await asyncio.gather(*(garbage(setup.identity(60 + i)) for i in range(4)))


ATTACKS: dict[str, Callable[[Setup, Tally], Awaitable[None]]] = {
    "join-flood": join_flood,
    "capacity": capacity,
    "spoofed-initials": spoofed_initials,
    "slow-reader": slow_reader,
    "parked-chunks": parked_chunks,
    "unfinished-frames": unfinished_frames,
    "garbage-frames": garbage_frames,
}


def _address(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


async def run(name: str, setup: Setup) -> dict[str, Any]:
    tally = Tally()
    started = time.monotonic()
    error = None
    try:
        await asyncio.wait_for(ATTACKS[name](setup, tally), setup.duration + 30.0)
    except Exception as exc:  # the report says what stopped the attack
        error = f"{type(exc).__name__}: {exc}"
    return {"attack": name, "seconds": time.monotonic() - started, "error": error, **tally.as_dict()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("attack", choices=sorted(ATTACKS))
    parser.add_argument(
        "--pki", type=Path, required=True, help="PKI directory with the attacker's certificate"
    )
    parser.add_argument(
        "--node-id", default="attacker", help="the attacker's node id (an endpoint certificate)"
    )
    parser.add_argument("--rendezvous", type=_address, required=True)
    parser.add_argument("--aggregators", default="", help="comma-separated HOST:PORT")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds the attack lasts")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the attack's counts")
    parser.add_argument("--datagram-size", type=int, default=16000, help="the client's QUIC datagram size")
    parser.add_argument("--at", type=float, default=0.0, help="start at this Unix time (imports done before)")
    args = parser.parse_args(argv)
    time.sleep(max(0.0, args.at - time.time()))
    setup = Setup(
        pki=args.pki,
        rendezvous=args.rendezvous,
        aggregators=tuple(_address(a) for a in args.aggregators.split(",") if a),
        node_id=args.node_id,
        duration=args.duration,
        scale=args.scale,
        datagram_size=args.datagram_size,
    )
    report = asyncio.run(run(args.attack, setup))
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
