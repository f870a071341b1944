"""A small UDP relay that adds delay and loss: a WAN profile where netem is missing.

The kernel here has tbf (rate) but not netem (delay, loss), so a WAN link is emulated
in user space: the relay listens on one address, and for every client address that
sends to it opens its own socket towards the target, so the target sees one peer per
client and replies find their way back.  Each datagram, either way, is dropped with
probability ``loss`` or forwarded after ``delay_ms`` (constant delay keeps the order,
as a long link does).  QUIC does not mind the relay: connection IDs, not addresses,
identify a connection, and certificates name nodes, not IP addresses.

The interop runner puts one in front of an aggregator to drop datagrams, or to count
who carried traffic (``cco-interop live``); the namespace testbed runs it as a
command in front of its aggregator (``benchmarks/support/netns.py``):

    python -m cco.interop.relay --listen 198.18.0.1:4600 --target 198.18.0.1:4500 \\
        --delay-ms 20 --loss 0.001

Runs until SIGINT/SIGTERM, then prints what it forwarded and dropped as one JSON line.
It forwards only between the two given addresses' peers: use addresses of loopback or
of your own namespaces.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast


def hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


@dataclass(frozen=True, slots=True)
class Profile:
    """Delay (ms) and loss probability applied to every datagram, each way."""

    delay_ms: float = 0.0
    loss: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or not 0 <= self.loss <= 1:
            raise ValueError(f"bad profile: delay {self.delay_ms} ms, loss {self.loss}")


@dataclass
class Counters:
    forwarded_up: int = 0
    bytes_up: int = 0
    """UDP payload bytes forwarded up: progress of the data, which handshakes, ACKs and
    probes (many datagrams, few bytes) barely move."""
    dropped_up: int = 0
    forwarded_down: int = 0
    dropped_down: int = 0
    clients: int = 0


@dataclass
class Relay(asyncio.DatagramProtocol):
    """The listening side; one :class:`_Upstream` per client address."""

    target: tuple[str, int]
    profile: Profile
    counters: Counters = field(default_factory=Counters)
    _transport: asyncio.DatagramTransport | None = None
    _upstreams: dict[tuple[str, int], _Upstream] = field(default_factory=dict)
    _random: random.Random = field(init=False)
    _tasks: set[asyncio.Task[object]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._random = random.Random(self.profile.seed)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        upstream = self._upstreams.get(addr)
        if upstream is None:
            upstream = _Upstream(self, addr)
            self._upstreams[addr] = upstream
            self.counters.clients += 1
            loop = asyncio.get_running_loop()
            task: asyncio.Task[object] = loop.create_task(
                loop.create_datagram_endpoint(lambda: upstream, remote_addr=self.target)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._lost():
            self.counters.dropped_up += 1
            return
        self.counters.forwarded_up += 1
        self.counters.bytes_up += len(data)
        self._later(upstream.send, data)

    def back_to(self, client: tuple[str, int], data: bytes) -> None:
        if self._lost():
            self.counters.dropped_down += 1
            return
        self.counters.forwarded_down += 1
        if self._transport is not None:
            self._later(self._transport.sendto, data, client)

    def _lost(self) -> bool:
        return self.profile.loss > 0 and self._random.random() < self.profile.loss

    def _later(self, send: Callable[..., object], *args: object) -> None:
        if self.profile.delay_ms:
            asyncio.get_running_loop().call_later(self.profile.delay_ms / 1000, send, *args)
        else:
            send(*args)

    def close(self) -> None:
        for upstream in self._upstreams.values():
            upstream.close()
        if self._transport is not None:
            self._transport.close()


class _Upstream(asyncio.DatagramProtocol):
    """The relay's socket towards the target for one client; queues until it is open."""

    def __init__(self, relay: Relay, client: tuple[str, int]) -> None:
        self.relay = relay
        self.client = client
        self.transport: asyncio.DatagramTransport | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)
        for data in self.pending:
            self.transport.sendto(data)
        self.pending.clear()

    def send(self, data: bytes) -> None:
        if self.transport is None:
            self.pending.append(data)
        else:
            self.transport.sendto(data)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.relay.back_to(self.client, data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def start(listen: tuple[str, int], target: tuple[str, int], profile: Profile) -> Relay:
    """A running relay; stop it with :meth:`Relay.close`."""
    relay = Relay(target, profile)
    await asyncio.get_running_loop().create_datagram_endpoint(lambda: relay, local_addr=listen)
    return relay


async def _main(args: argparse.Namespace) -> None:
    relay = await start(args.listen, args.target, Profile(args.delay_ms, args.loss, args.seed))
    print(f"relaying {args.listen} -> {args.target}, delay {args.delay_ms} ms, loss {args.loss}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    relay.close()
    print(json.dumps(vars(relay.counters)), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--listen", type=hostport, required=True, help="HOST:PORT clients send to")
    parser.add_argument("--target", type=hostport, required=True, help="HOST:PORT to forward to")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay added each way")
    parser.add_argument("--loss", type=float, default=0.0, help="drop probability each way (0..1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the loss draws")
    args = parser.parse_args(argv)
    try:
        asyncio.run(_main(args))
    except ValueError as exc:
        print(f"cco.interop.relay: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
