"""Throughput of the CCO transport: chunk messages over one loopback connection.

Sends ``--total-mib`` MiB as Contribution messages of ``--chunk-mib`` MiB payload
from a client to a server in this process, once per ``--datagram-sizes`` value, and
reports the goodput (payload bytes / time from the first send to the last message
decoded by the receiver) and the CPU time the process spent on it (both sides).
``--backend`` picks the QUIC implementation (``TransportConfig.quic_backend``).
Prints a table and writes JSON to ``benchmarks/results/bench_transport.json``
(``bench_transport_qh3.json`` for the qh3 backend).

    .venv/bin/python benchmarks/bench_transport.py [--total-mib 64] [--repeats 3] [--backend qh3]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aioquic

from cco.transport import LocalIdentity, PeerLink, TransportConfig, connect, create_dev_pki, serve
from cco.transport.config import QUIC_BACKENDS
from cco.wire.messages import Capabilities, Contribution
from cco.wire.registries import Collective, DType, ReduceOp, Role

MiB = 1 << 20
RESULTS = Path(__file__).resolve().parent / "results"
CAPS = Capabilities(
    dtypes=(DType.INT64,),
    ops=(ReduceOp.SUM,),
    collectives=(Collective.ALL_REDUCE,),
    max_message_size=1 << 24,
    max_chunk_elements=1 << 20,
    extensions=(),
)


def make_chunks(total_mib: int, chunk_mib: int) -> list[Contribution]:
    elements = chunk_mib * MiB // 8
    count = total_mib // chunk_mib
    payload = bytes(range(256)) * (elements * 8 // 256)
    return [
        Contribution(
            group_id=b"\x01" * 16,
            epoch=0,
            op_id=1,
            kind=Collective.ALL_REDUCE,
            op=ReduceOp.SUM,
            dtype=DType.INT64,
            total_elements=elements * count,
            chunk_elements=elements,
            chunk_index=index,
            contributors=b"\x01",
            width=8,
            payload=payload,
            tag=index,
        )
        for index in range(count)
    ]


async def transfer(
    pki: Path, datagram_size: int, backend: str, chunks: list[Contribution]
) -> tuple[float, float]:
    """Seconds from the first send to the last chunk received and decoded: (wall, CPU)."""
    done: asyncio.Future[tuple[float, float]] = asyncio.get_running_loop().create_future()

    async def receive_all(link: PeerLink) -> None:
        for _ in chunks:
            await link.receive()
        done.set_result((time.perf_counter(), time.process_time()))

    settings: dict[str, Any] = {"max_datagram_size": datagram_size, "quic_backend": backend}
    server_config = TransportConfig.for_node(pki, "agg-1", **settings)
    client_config = TransportConfig.for_node(pki, "ep-1", **settings)
    server = await serve(
        "127.0.0.1", 0, server_config, LocalIdentity("agg-1", Role.AGGREGATOR, CAPS), receive_all
    )
    try:
        host, port = server.address
        link = await connect(host, port, client_config, LocalIdentity("ep-1", Role.ENDPOINT, CAPS), "agg-1")
        start, start_cpu = time.perf_counter(), time.process_time()
        for message in chunks:
            link.send(message)
            await link.drain()
        end, end_cpu = await asyncio.wait_for(done, timeout=120)
        link.close()
        await link.wait_closed()
        return end - start, end_cpu - start_cpu
    finally:
        await server.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--total-mib", type=int, default=64)
    parser.add_argument("--chunk-mib", type=int, default=1)
    parser.add_argument("--datagram-sizes", type=int, nargs="+", default=[1452, 16000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", choices=QUIC_BACKENDS, default="aioquic")
    args = parser.parse_args()

    chunks = make_chunks(args.total_mib, args.chunk_mib)
    payload_bytes = sum(len(c.payload) for c in chunks)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as directory:
        pki = Path(directory)
        create_dev_pki(pki, [("agg-1", Role.AGGREGATOR), ("ep-1", Role.ENDPOINT)])
        for size in args.datagram_sizes:
            runs = [asyncio.run(transfer(pki, size, args.backend, chunks)) for _ in range(args.repeats)]
            seconds = [wall for wall, _ in runs]
            cpu_seconds = [cpu for _, cpu in runs]
            best, median = min(seconds), statistics.median(seconds)
            rows.append(
                {
                    "max_datagram_size": size,
                    "payload_bytes": payload_bytes,
                    "messages": len(chunks),
                    "seconds": seconds,
                    "cpu_seconds": cpu_seconds,
                    "median_seconds": median,
                    "median_mb_per_s": payload_bytes / median / 1e6,
                    "best_mb_per_s": payload_bytes / best / 1e6,
                    "median_cpu_ms_per_mib": statistics.median(cpu_seconds) * 1e3 * MiB / payload_bytes,
                }
            )

    print(
        f"{args.total_mib} MiB as {len(chunks)} chunk messages of {args.chunk_mib} MiB, "
        f"loopback, one connection, {args.backend}"
    )
    print(f"{'datagram':>9} {'median s':>9} {'MB/s (median)':>14} {'MB/s (best)':>12} {'CPU ms/MiB':>11}")
    for row in rows:
        print(
            f"{row['max_datagram_size']:>9} {row['median_seconds']:>9.2f} "
            f"{row['median_mb_per_s']:>14.1f} {row['best_mb_per_s']:>12.1f} "
            f"{row['median_cpu_ms_per_mib']:>11.1f}"
        )
    results = RESULTS / (
        "bench_transport.json" if args.backend == "aioquic" else f"bench_transport_{args.backend}.json"
    )
    results.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "bench_transport",
        "backend": args.backend,
        "python": platform.python_version(),
        "aioquic": aioquic.__version__,
        "qh3": importlib.metadata.version("qh3") if args.backend == "qh3" else None,
        "machine": platform.machine(),
        "total_mib": args.total_mib,
        "chunk_mib": args.chunk_mib,
        "repeats": args.repeats,
        "results": rows,
    }
    results.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {results}")


if __name__ == "__main__":
    main()
