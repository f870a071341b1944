"""What the stack under CCO does alone on this machine: the floors under two of issue 8's figures.

CCO's CPU-bound figures (loopback CPU efficiency and latency) compare a star of five
Python processes with a yardstick.  This module measures the stack beneath CCO's
protocol with none of the protocol on top, so a figure's distance from its target
splits into what the stack itself costs here and what CCO's protocol adds:

* :func:`bare_stream` -- one stream over the QUIC stack's own asyncio API, sender
  here, receiver in another process, same datagram size and receive window as
  CCO's.  Its goodput is the CPU-efficiency yardstick; the CPU both sides spent
  gives :func:`star_ingress_bound`, the best share of that yardstick any star on
  this many cores can reach, CCO or not.
* :func:`star_round_trips` -- N leaf processes and one hub over CCO's own transport
  (its UDP batching, its adapter of the QUIC stack, framing and the message codec),
  with no machines, MAC or workload: each round every leaf sends an 8-byte chunk
  message and the hub answers all of them once it has N.  That is the least an
  aggregation tree of depth one does per pass, so its p50 is the latency floor of
  one pass (a block-scaled float sum takes two, block scales then data; the 8-byte
  case, an EXACT sum, takes one).  It runs on CCO's transport, not on the stack's
  own asyncio API, because at CCO's loopback datagram size (16000) qh3's asyncio
  layer holds most of a leaf's small packets for its pacing timer: the same star
  took 1.35 ms per round there against 0.35 ms at 1452 bytes, a cost CCO's
  transport does not have (BENCHMARKS.md).

Both run as subprocesses of this file (``python barequic.py sink|hub|leaf ...``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quicapi import quic_api

from cco.services.node import full_capabilities
from cco.transport import LinkClosed, LocalIdentity, PeerLink, TransportConfig, connect, create_dev_pki, serve
from cco.transport.config import QUIC_BACKENDS
from cco.wire.messages import Contribution
from cco.wire.registries import Collective, DType, ReduceOp, Role

MESSAGE = 8
"""Bytes each leaf sends per round, and the hub answers: the latency case's payload."""
DEADLINE = 600.0
"""Seconds any one measurement may take before it is abandoned."""


def _cpu_seconds() -> float:
    """This process's CPU time, user and system, every thread."""
    return time.process_time()


def _server_config(quic: Any, pki: Path, datagram: int) -> Any:
    window: int = TransportConfig.for_node(pki, "agg-0").receive_window  # as CCO's
    config = quic.QuicConfiguration(
        is_client=False,
        alpn_protocols=["bench"],
        max_datagram_size=datagram,
        max_data=window,
        max_stream_data=window,
    )
    config.load_cert_chain(pki / "agg-0.pem", pki / "agg-0.key")
    return config


def _client_config(quic: Any, datagram: int) -> Any:
    return quic.QuicConfiguration(
        is_client=True, alpn_protocols=["bench"], max_datagram_size=datagram, verify_mode=ssl.CERT_NONE
    )


def _arguments(role: str, argv: list[str], *extra: str) -> argparse.Namespace:
    """A role's command line: --port, --datagram and --backend, and ``extra`` (--pki a
    directory, the others integers)."""
    parser = argparse.ArgumentParser(prog=f"barequic.py {role}")
    for name in ("--port", "--datagram", *extra):
        parser.add_argument(name, type=Path if name == "--pki" else int, required=True)
    parser.add_argument("--backend", choices=QUIC_BACKENDS, required=True)
    return parser.parse_args(argv)


def _spawn(role: str, *args: str) -> subprocess.Popen[str]:
    argv = [sys.executable, str(Path(__file__).resolve()), role, *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def _expect_ready(process: subprocess.Popen[str], role: str) -> None:
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        raise RuntimeError(f"barequic.py {role} did not start")


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


# --- one stream -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamRun:
    """One bare stream transfer: goodput and the CPU each side spent on it."""

    nbytes: int
    seconds: float
    sender_cpu: float
    receiver_cpu: float

    @property
    def goodput(self) -> float:
        return self.nbytes / self.seconds


def _sink(argv: list[str]) -> int:
    """Receive one stream; print 'ready', then its bytes, seconds and CPU seconds."""
    args = _arguments("sink", argv, "--pki")
    quic = quic_api(args.backend)

    async def main() -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        state = {"first": 0.0, "last": 0.0, "bytes": 0, "cpu": 0.0}

        class Sink(quic.Protocol):  # type: ignore[misc,name-defined]
            def quic_event_received(self, event: Any) -> None:
                if isinstance(event, quic.StreamDataReceived):
                    if not state["bytes"]:
                        state["first"], state["cpu"] = time.perf_counter(), _cpu_seconds()
                    state["bytes"] += len(event.data)
                    if event.end_stream and not done.done():
                        state["last"], state["cpu"] = time.perf_counter(), _cpu_seconds() - state["cpu"]
                        done.set_result(None)

        config = _server_config(quic, args.pki, args.datagram)
        server = await quic.serve("127.0.0.1", args.port, configuration=config, create_protocol=Sink)
        print("ready", flush=True)
        await asyncio.wait_for(done, DEADLINE)
        report = {"seconds": state["last"] - state["first"], "bytes": state["bytes"], "cpu": state["cpu"]}
        print(json.dumps(report), flush=True)
        server.close()

    asyncio.run(main())
    return 0


def bare_stream(pki: Path, datagram: int, nbytes: int, backend: str, port: int) -> StreamRun:
    """One stream of ``nbytes`` on ``backend``, sender here, receiver in another process.

    Same stack, datagram size and receive window as CCO; no CCO framing, no
    aggregation.  The sender's CPU is this process's over the whole transfer."""
    quic = quic_api(backend)
    sink = _spawn(
        "sink", "--pki", str(pki), "--port", str(port), "--datagram", str(datagram), "--backend", backend
    )
    try:
        _expect_ready(sink, "sink")
        stdout = sink.stdout
        assert stdout is not None

        async def send() -> str:
            async with quic.connect(
                "127.0.0.1", port, configuration=_client_config(quic, datagram)
            ) as client:
                stream = client._quic.get_next_available_stream_id()
                client._quic.send_stream_data(stream, bytes(nbytes), end_stream=True)
                client.transmit()
                return await asyncio.get_running_loop().run_in_executor(None, stdout.readline)

        cpu = _cpu_seconds()
        report = json.loads(asyncio.run(send()))
        return StreamRun(
            nbytes=int(report["bytes"]),
            seconds=float(report["seconds"]),
            sender_cpu=_cpu_seconds() - cpu,
            receiver_cpu=float(report["cpu"]),
        )
    finally:
        _stop(sink)


def star_ingress_bound(run: StreamRun, cores: int) -> float:
    """The most a star's ingress goodput can be, as a share of ``run``'s goodput, on
    ``cores`` cores when its QUIC moves bytes as cheaply as the bare stream did.

    An all-reduce over a star of N endpoints moves N x S bytes up and N x S down: 2 N S
    bytes, each sent once and received once.  At the bare stream's CPU per byte, that
    takes at least 2 N S (sender_cpu + receiver_cpu) / nbytes / cores seconds of wall
    time, which bounds the ingress goodput N S / time.  Every cost CCO adds (the MAC,
    framing, aggregation) comes on top."""
    best_ingress = cores * run.nbytes / (2 * (run.sender_cpu + run.receiver_cpu))
    return best_ingress / run.goodput


# --- a star of round trips --------------------------------------------------------------------

STAR_HUB = "hub-0"


def _leaf_id(index: int) -> str:
    return f"leaf-{index}"


def _star_message() -> Contribution:
    """What every leaf sends and the hub answers each round: an 8-byte chunk message,
    as the latency case's Contribution and Result are."""
    return Contribution(
        group_id=bytes(16),
        epoch=0,
        op_id=1,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.INT64,
        total_elements=1,
        chunk_elements=1,
        chunk_index=0,
        contributors=b"\x01",
        width=8,
        payload=bytes(MESSAGE),
        tag=0,
    )


_STAR_CAPABILITIES = full_capabilities(1 << 20)
"""What the hub and leaves announce: what every node announces, as in the latency case."""


def _star_config(pki: Path, node_id: str, datagram: int, backend: str) -> TransportConfig:
    return TransportConfig.for_node(pki, node_id, max_datagram_size=datagram, quic_backend=backend)


def _hub(argv: list[str]) -> int:
    """Answer every leaf once all ``--leaves`` have sent this round's message."""
    args = _arguments("hub", argv, "--pki", "--leaves", "--rounds")

    async def main() -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting: list[PeerLink] = []
        state = {"rounds": 0, "cpu": 0.0}
        answer = _star_message()

        async def serve_leaf(link: PeerLink) -> None:
            try:
                while True:
                    await link.receive()
                    waiting.append(link)
                    if len(waiting) < args.leaves:
                        continue
                    state["rounds"] += 1
                    if state["rounds"] == 1:
                        state["cpu"] = _cpu_seconds()  # from the first complete round: no handshakes
                    for leaf in waiting:
                        leaf.send(answer)
                    for leaf in waiting:
                        leaf.flush()
                    waiting.clear()
                    if state["rounds"] == args.rounds and not done.done():
                        done.set_result(None)
            except LinkClosed:
                return  # the leaf is done

        config = _star_config(args.pki, STAR_HUB, args.datagram, args.backend)
        local = LocalIdentity(STAR_HUB, Role.AGGREGATOR, _STAR_CAPABILITIES)
        server = await serve("127.0.0.1", args.port, config, local, serve_leaf)
        print("ready", flush=True)
        await asyncio.wait_for(done, DEADLINE)
        cpu = (_cpu_seconds() - state["cpu"]) / max(1, args.rounds - 1)
        print(json.dumps({"cpu_per_round": cpu}), flush=True)
        await asyncio.sleep(0.2)  # let the last answers leave before closing
        await server.close()

    asyncio.run(main())
    return 0


def _leaf(argv: list[str]) -> int:
    """Send ``--rounds`` messages one after another, each when the last was answered."""
    args = _arguments("leaf", argv, "--pki", "--index", "--rounds")

    async def main() -> None:
        node_id = _leaf_id(args.index)
        config = _star_config(args.pki, node_id, args.datagram, args.backend)
        local = LocalIdentity(node_id, Role.ENDPOINT, _STAR_CAPABILITIES)
        link = await connect("127.0.0.1", args.port, config, local, STAR_HUB)
        message = _star_message()

        async def rounds() -> tuple[list[float], float]:
            seconds = []
            cpu = 0.0
            for index in range(args.rounds):
                if index == 1:
                    cpu = _cpu_seconds()
                start = time.perf_counter()
                link.send(message)
                link.flush()
                await link.receive()
                seconds.append(time.perf_counter() - start)
            return seconds, (_cpu_seconds() - cpu) / max(1, args.rounds - 1)

        try:
            seconds, cpu = await asyncio.wait_for(rounds(), DEADLINE)
        finally:
            link.close()
            await link.wait_closed()
        print(json.dumps({"round_seconds": seconds, "cpu_per_round": cpu}), flush=True)

    asyncio.run(main())
    return 0


def star_round_trips(
    workdir: Path, leaves: int, rounds: int, datagram: int, backend: str, port: int
) -> dict[str, Any]:
    """Round times of ``leaves`` leaf processes through one hub over CCO's transport
    (the first round, which waits for every leaf to connect, dropped), and each
    side's CPU per round.  Certificates for the star go in ``workdir``."""
    pki = workdir / "star-pki"
    create_dev_pki(pki, [(STAR_HUB, Role.AGGREGATOR), *((_leaf_id(i), Role.ENDPOINT) for i in range(leaves))])
    common = ["--pki", str(pki), "--port", str(port), "--datagram", str(datagram), "--rounds", str(rounds)]
    common += ["--backend", backend]
    hub = _spawn("hub", "--leaves", str(leaves), *common)
    processes = [hub]
    try:
        _expect_ready(hub, "hub")
        for index in range(leaves):
            processes.append(_spawn("leaf", "--index", str(index), *common))
        reports = []
        for process in processes:
            assert process.stdout is not None
            reports.append(json.loads(process.stdout.readline()))
        return {
            "round_seconds": [s for report in reports[1:] for s in report["round_seconds"][1:]],
            "leaf_cpu_per_round": sum(r["cpu_per_round"] for r in reports[1:]) / leaves,
            "hub_cpu_per_round": reports[0]["cpu_per_round"],
        }
    finally:
        for process in processes:
            _stop(process)


def main(argv: list[str]) -> int:
    roles = {"sink": _sink, "hub": _hub, "leaf": _leaf}
    if argv[:1] and argv[0] in roles:
        return roles[argv[0]](argv[1:])
    print(f"usage: {os.path.basename(__file__)} sink|hub|leaf ... (started by run.py)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
