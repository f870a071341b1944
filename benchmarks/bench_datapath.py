"""Ingress goodput of one receiving node: the CCO adapter against bare QUIC, same run.

A receiver in this process (what an aggregator's transport does: accept links,
decode every message) takes ``--mib`` MiB from each of ``--senders`` sender
processes over loopback; then the same bytes travel as one plain QUIC stream per
sender through the same stack (``--quic-backend``, default qh3 as the nodes' own;
both modes, both ends) with that stack's own asyncio protocol and no CCO at all
(no framing, no message decoding, no client certificates; the stack's default
windows).  Goodput is payload bytes / (last byte received - first byte received)
at the receiver, so connection set-up is excluded.  The target (issue 8) is CCO
at least 70% of bare.

The receiver also reports its CPU seconds per MiB: on a loaded 2-core machine that
is steadier than wall time.  Repeats alternate the two modes, so both see the same
machine load; medians are reported.  Prints a table and writes JSON.

    .venv/bin/python benchmarks/bench_datapath.py [--mib 64] [--senders 1] [--repeats 3]
        [--datagram-size 16000] [--loop asyncio|uvloop] [--quic-backend qh3|aioquic]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import platform
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))  # the shared support modules
from quicapi import QuicApi, quic_api, stack_version

from cco.transport import LocalIdentity, PeerLink, TransportConfig, connect, create_dev_pki, serve
from cco.transport.certs import CA_CERT_FILE, node_paths
from cco.transport.config import QUIC_BACKENDS
from cco.wire.messages import Capabilities, Contribution
from cco.wire.registries import Collective, DType, ReduceOp, Role

MiB = 1 << 20
RESULTS = Path(__file__).resolve().parent / "results" / "bench_datapath.json"
TARGET_RATIO = 0.70
SEND_BUFFER = 8 * MiB  # TransportConfig.send_buffer's default: what PeerLink.drain() lets queue unsent
CHUNK = MiB
CAPS = Capabilities(
    dtypes=(DType.INT64,),
    ops=(ReduceOp.SUM,),
    collectives=(Collective.ALL_REDUCE,),
    max_message_size=1 << 24,
    max_chunk_elements=1 << 20,
    extensions=(),
)
SERVER_ID = "agg-1"


def _run(coroutine: Any, loop_name: str) -> Any:
    if loop_name == "uvloop":
        import uvloop

        return uvloop.run(coroutine)
    return asyncio.run(coroutine)


# --- senders (child processes) ------------------------------------------------------


def _chunks(mib: int, sender: int) -> list[Contribution]:
    elements = CHUNK // 8
    payload = bytes(range(256)) * (CHUNK // 256)
    group = bytes([sender + 1]) * 16
    return [
        Contribution(
            group_id=group,
            epoch=0,
            op_id=1,
            kind=Collective.ALL_REDUCE,
            op=ReduceOp.SUM,
            dtype=DType.INT64,
            total_elements=elements * mib,
            chunk_elements=elements,
            chunk_index=index,
            contributors=b"\x01",
            width=8,
            payload=payload,
            tag=index,
        )
        for index in range(mib)
    ]


async def _send_cco(pki: Path, port: int, sender: int, mib: int, datagram_size: int, backend: str) -> None:
    node_id = f"ep-{sender}"
    config = TransportConfig.for_node(pki, node_id, max_datagram_size=datagram_size, quic_backend=backend)
    link = await connect("127.0.0.1", port, config, LocalIdentity(node_id, Role.ENDPOINT, CAPS), SERVER_ID)
    for message in _chunks(mib, sender):
        link.send(message)
        await link.drain()
    await link.wait_closed()  # the receiver closes once it has everything


def _unsent(quic: Any, backend: str, stream_id: int, queued: int) -> int:
    """Stream bytes handed to ``quic`` but not sent once yet: what PeerLink.drain() bounds.

    qh3 says it itself (``get_send_buffer_size``, public API; what CCO's qh3 backend
    uses too).  aioquic has no public counterpart: bytes queued minus the connection's
    stream bytes sent at least once (``_remote_max_data_used``, private; CCO's aioquic
    backend reads the same), which is this one stream's.
    """
    if backend == "qh3":
        return int(quic.get_send_buffer_size(stream_id))
    return queued - int(quic._remote_max_data_used)


async def _send_bare(pki: Path, port: int, mib: int, datagram_size: int, backend: str) -> None:
    api = quic_api(backend)
    config = api.QuicConfiguration(
        is_client=True, alpn_protocols=["bench"], max_datagram_size=datagram_size, verify_mode=ssl.CERT_NONE
    )
    async with api.connect("127.0.0.1", port, configuration=config) as client:
        quic = client._quic
        stream_id = quic.get_next_available_stream_id()
        payload = bytes(range(256)) * (CHUNK // 256)
        for index in range(mib):
            quic.send_stream_data(stream_id, payload, end_stream=index == mib - 1)
            client.transmit()
            # Same back-pressure as PeerLink.drain(): at most send_buffer (8 MiB) queued unsent.
            while _unsent(quic, backend, stream_id, (index + 1) * CHUNK) > SEND_BUFFER:
                await asyncio.sleep(0.001)
        await client.wait_closed()


def sender_main(
    mode: str,
    pki: Path,
    port: int,
    sender: int,
    mib: int,
    datagram_size: int,
    loop: str,
    backend: str,
    cpu: Any,
) -> None:
    """Send, then report the CPU seconds that took on ``cpu`` (a multiprocessing queue)."""
    start = time.process_time()  # after start-up and imports
    if mode == "cco":
        _run(_send_cco(pki, port, sender, mib, datagram_size, backend), loop)
    else:
        _run(_send_bare(pki, port, mib, datagram_size, backend), loop)
    cpu.put(time.process_time() - start)


# --- receiver (this process) -------------------------------------------------------


class _Meter:
    """First and last arrival of payload at the receiver, and when all of it is in."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.received = 0
        self.first: float | None = None
        self.last = 0.0
        self.done = asyncio.get_running_loop().create_future()

    def add(self, size: int) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.received += size
        self.last = now
        if self.received >= self.expected and not self.done.done():
            self.done.set_result(None)


def _bare_receiver(api: QuicApi, meter: _Meter) -> Any:
    """A protocol class of ``api``'s stack that counts stream data into ``meter``."""

    class BareReceiver(api.Protocol):  # type: ignore[misc,name-defined]
        def quic_event_received(self, event: Any) -> None:
            if isinstance(event, api.StreamDataReceived):
                meter.add(len(event.data))
                if event.end_stream:
                    self._quic.close()
                    self.transmit()

    return BareReceiver


async def _receive(mode: str, pki: Path, args: argparse.Namespace) -> dict[str, float]:
    meter = _Meter(args.mib * MiB * args.senders)
    if mode == "cco":

        async def on_link(link: PeerLink) -> None:
            for _ in range(args.mib):
                message = await link.receive()
                assert isinstance(message, Contribution)
                meter.add(len(message.payload))
            link.close()

        config = TransportConfig.for_node(
            pki, SERVER_ID, max_datagram_size=args.datagram_size, quic_backend=args.quic_backend
        )
        server: Any = await serve(
            "127.0.0.1", 0, config, LocalIdentity(SERVER_ID, Role.AGGREGATOR, CAPS), on_link
        )
        port = server.address[1]
    else:
        api = quic_api(args.quic_backend)
        cert, key = node_paths(pki, SERVER_ID)
        quic_config = api.QuicConfiguration(
            is_client=False, alpn_protocols=["bench"], max_datagram_size=args.datagram_size
        )
        quic_config.load_cert_chain(cert, key)
        server = await api.serve(
            "127.0.0.1", 0, configuration=quic_config, create_protocol=_bare_receiver(api, meter)
        )
        port = server._transport.get_extra_info("sockname")[1]
    context = multiprocessing.get_context("spawn")
    sender_cpu = context.Queue()
    senders = [
        context.Process(
            target=sender_main,
            args=(mode, pki, port, i, args.mib, args.datagram_size, args.loop, args.quic_backend, sender_cpu),
        )
        for i in range(args.senders)
    ]
    for process in senders:
        process.start()
    cpu_start = time.process_time()
    deadline = time.monotonic() + args.timeout
    try:
        while not meter.done.done():
            await asyncio.wait({meter.done}, timeout=0.5)
            if any(p.exitcode not in (None, 0) for p in senders) or time.monotonic() > deadline:
                raise RuntimeError(f"{mode}: a sender failed or the run exceeded {args.timeout} s")
        cpu = time.process_time() - cpu_start
    finally:
        loop = asyncio.get_running_loop()
        for process in senders:  # joined off the loop, which must carry the closes
            await loop.run_in_executor(None, process.join, 10)
            if process.is_alive():
                process.terminate()
        if mode == "cco":
            await server.close()
        else:
            server.close()
    assert meter.first is not None
    seconds = meter.last - meter.first
    mib = meter.received / MiB
    sent_cpu = sum(sender_cpu.get(timeout=10) for _ in senders)
    return {
        "seconds": seconds,
        "mb_per_s": meter.received / seconds / 1e6,
        "cpu_s_per_mib": cpu / mib,
        "sender_cpu_s_per_mib": sent_cpu / mib,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=64, help="MiB each sender sends")
    parser.add_argument("--senders", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--datagram-size", type=int, default=16000)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument(
        "--quic-backend",
        choices=QUIC_BACKENDS,
        default="qh3",
        help="QUIC stack of both modes, both ends (default qh3, the nodes' own)",
    )
    parser.add_argument("--modes", nargs="+", choices=("bare", "cco"), default=["bare", "cco"])
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in args.modes}
    with tempfile.TemporaryDirectory() as directory:
        pki = Path(directory)
        nodes = [(SERVER_ID, Role.AGGREGATOR)] + [(f"ep-{i}", Role.ENDPOINT) for i in range(args.senders)]
        create_dev_pki(pki, nodes)
        assert (pki / CA_CERT_FILE).is_file()
        for _ in range(args.repeats):
            for mode in args.modes:
                runs[mode].append(_run(_receive(mode, pki, args), args.loop))

    summary = {
        mode: {
            "median_mb_per_s": statistics.median(r["mb_per_s"] for r in rows),
            "median_cpu_s_per_mib": statistics.median(r["cpu_s_per_mib"] for r in rows),
            "median_sender_cpu_s_per_mib": statistics.median(r["sender_cpu_s_per_mib"] for r in rows),
        }
        for mode, rows in runs.items()
    }
    ratio = None
    if len(summary) == 2:
        ratio = summary["cco"]["median_mb_per_s"] / summary["bare"]["median_mb_per_s"]
    print(
        f"{args.senders} sender(s) x {args.mib} MiB, datagram {args.datagram_size}, "
        f"loop {args.loop}, {args.quic_backend} {stack_version(args.quic_backend)}, {args.repeats} repeats"
    )
    print(f"{'mode':>5} {'MB/s (median)':>14} {'runs MB/s':>24} {'rx CPU ms/MiB':>14} {'tx CPU ms/MiB':>14}")
    for mode, rows in runs.items():
        each = " ".join(f"{r['mb_per_s']:.1f}" for r in rows)
        print(
            f"{mode:>5} {summary[mode]['median_mb_per_s']:>14.1f} {each:>24} "
            f"{1e3 * summary[mode]['median_cpu_s_per_mib']:>14.2f} "
            f"{1e3 * summary[mode]['median_sender_cpu_s_per_mib']:>14.2f}"
        )
    if ratio is not None:
        verdict = "met" if ratio >= TARGET_RATIO else "missed"
        print(f"CCO / bare ingress goodput: {ratio:.2f} (target >= {TARGET_RATIO:.2f}: {verdict})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "bench_datapath",
        "python": platform.python_version(),
        "quic_backend": args.quic_backend,
        "quic_backend_version": stack_version(args.quic_backend),
        "aioquic": stack_version("aioquic"),  # CCO's qh3 backend runs aioquic's TLS too
        "machine": platform.machine(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "runs": runs,
        "summary": summary,
        "ratio": ratio,
        "target_ratio": TARGET_RATIO,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
