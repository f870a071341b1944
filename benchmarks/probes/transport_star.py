"""The bulk all-reduce's data movement on the namespace star, with none of the protocol's work.

A 64 MiB float32 all-reduce of four ranks costs the nodes CPU in two places: the
protocol's own work (``bench_sim_bulk.py`` measures it with no transport) and the
transport under it.  This measures the second alone, on the same star as
``profile_star.py``: a hub in the hub's namespace and one leaf per endpoint
namespace, over CCO's own transport (its UDP batching with GSO and GRO, its adapter
of the QUIC stack, framing and the message codec), moving what the all-reduce moves
and nothing else.  Each round every leaf sends ``--bytes`` as chunk messages of
``--chunk-bytes``, at most ``--window`` ahead of the answers; once the hub has chunk
i from every leaf it sends each leaf an answer of the same size (as an aggregator
sends each endpoint the chunk's Result).  No quantizing, MAC, combining, verifying:
the payloads are zeros and nobody reads them.

The round times are therefore what the star can do at best on this host with this
transport, whatever the protocol above it did; with the nodes CPU-bound, the CPU per
round of the hub and the leaves says how much of a CCO round is the transport's.

    python benchmarks/probes/transport_star.py --rate-mbit unshaped --gro on
    python benchmarks/probes/transport_star.py --rate-mbit 1000 --rounds 6

Prints the rounds and each side's CPU per round (rounds after the first), and writes
JSON to ``--out`` (default ``benchmarks/probes/results/transport_star.json``).
Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # the shared support modules
import netns

from cco.services.node import full_capabilities
from cco.transport import LinkClosed, LocalIdentity, PeerLink, TransportConfig, connect, create_dev_pki, serve
from cco.wire.messages import Contribution
from cco.wire.registries import Collective, DType, ReduceOp, Role

RESULTS = Path(__file__).resolve().parent / "results" / "transport_star.json"
MiB = 1 << 20
HUB = "hub-0"
PORT = 4600
DEADLINE = 300.0
"""Seconds a role waits for the whole run before it gives up."""
CAPABILITIES = full_capabilities(1 << 24)


def _leaf_id(index: int) -> str:
    return f"leaf-{index}"


def _chunk(index: int, chunks: int, chunk_bytes: int) -> Contribution:
    """Chunk ``index`` of ``chunks``: int32 zeros, ``chunk_bytes`` of payload."""
    elements = chunk_bytes // 4
    return Contribution(
        group_id=bytes(16),
        epoch=0,
        op_id=1,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.INT32,
        total_elements=elements * chunks,
        chunk_elements=elements,
        chunk_index=index,
        contributors=b"\x01",
        width=4,
        payload=bytes(chunk_bytes),
        tag=0,
    )


def _config(pki: Path, node_id: str, datagram: int) -> TransportConfig:
    return TransportConfig.for_node(pki, node_id, max_datagram_size=datagram)


def _hub(args: argparse.Namespace) -> None:
    """Answer chunk i to every leaf once every leaf has sent chunk i; report CPU per round."""
    chunks = args.bytes // args.chunk_bytes

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        links: list[PeerLink] = []
        counts: dict[int, int] = {}
        state = {"answered": 0, "cpu": 0.0}
        answers = [_chunk(i, chunks, args.chunk_bytes) for i in range(chunks)]

        async def serve_leaf(link: PeerLink) -> None:
            links.append(link)
            try:
                while True:
                    message = await link.receive()
                    assert isinstance(message, Contribution)
                    index = message.chunk_index
                    counts[index] = counts.get(index, 0) + 1
                    if counts[index] < args.leaves:
                        continue
                    del counts[index]
                    for leaf in links:
                        leaf.send(answers[index])
                    for leaf in links:
                        leaf.flush()
                    state["answered"] += 1
                    if state["answered"] == chunks:  # round 1 over: measure from here
                        state["cpu"] = time.process_time()
                    if state["answered"] == chunks * args.rounds and not done.done():
                        done.set_result(None)
            except LinkClosed:
                return

        config = _config(args.pki, HUB, args.datagram)
        server = await serve(
            netns.HUB_ADDRESS, PORT, config, LocalIdentity(HUB, Role.AGGREGATOR, CAPABILITIES), serve_leaf
        )
        print("ready", flush=True)
        await asyncio.wait_for(done, DEADLINE)
        cpu = (time.process_time() - state["cpu"]) / max(1, args.rounds - 1)
        print(json.dumps({"cpu_per_round": cpu}), flush=True)
        await asyncio.sleep(0.5)  # let the last answers leave before closing
        await server.close()

    asyncio.run(main())


def _leaf(args: argparse.Namespace) -> None:
    """Send every round's chunks, at most ``--window`` ahead of the answers."""
    chunks = args.bytes // args.chunk_bytes

    async def main() -> None:
        node_id = _leaf_id(args.index)
        config = _config(args.pki, node_id, args.datagram)
        link = await connect(
            netns.HUB_ADDRESS, PORT, config, LocalIdentity(node_id, Role.ENDPOINT, CAPABILITIES), HUB
        )
        messages = [_chunk(i, chunks, args.chunk_bytes) for i in range(chunks)]
        seconds: list[float] = []
        cpu = 0.0
        for round_index in range(args.rounds):
            if round_index == 1:
                cpu = time.process_time()
            start = time.perf_counter()
            sent = min(args.window, chunks)
            for message in messages[:sent]:
                link.send(message)
            link.flush()
            for expected in range(chunks):
                answer = await link.receive()
                if not isinstance(answer, Contribution) or answer.chunk_index != expected:
                    raise RuntimeError(f"expected the answer to chunk {expected}, got {answer!r:.80}")
                if sent < chunks:
                    link.send(messages[sent])
                    link.flush()
                    sent += 1
            seconds.append(time.perf_counter() - start)
        cpu = (time.process_time() - cpu) / max(1, args.rounds - 1)
        print(json.dumps({"round_seconds": seconds, "cpu_per_round": cpu}), flush=True)
        await asyncio.sleep(1.0)  # the hub closes first
        link.close()
        await link.wait_closed()

    asyncio.run(asyncio.wait_for(main(), DEADLINE))


def _role_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="transport_star.py hub|leaf")
    parser.add_argument("role", choices=("hub", "leaf"))
    parser.add_argument("--pki", type=Path, required=True)
    for name in ("--datagram", "--bytes", "--chunk-bytes", "--rounds", "--leaves", "--window", "--index"):
        parser.add_argument(name, type=int, default=0)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    rate = None if args.rate_mbit == "unshaped" else float(args.rate_mbit)
    spec = netns.StarSpec(endpoints=args.endpoints, rate_mbit=rate, mtu=args.mtu, gro=args.gro == "on")
    datagram = netns.quic_datagram_size(args.mtu)
    with tempfile.TemporaryDirectory(prefix="transport-star-") as tmp, netns.Star(spec) as star:
        pki = Path(tmp) / "pki"
        create_dev_pki(
            pki, [(HUB, Role.AGGREGATOR), *((_leaf_id(i), Role.ENDPOINT) for i in range(args.endpoints))]
        )
        common = ["--pki", str(pki), "--datagram", str(datagram), "--bytes", str(args.bytes)]
        common += [
            "--chunk-bytes",
            str(args.chunk_bytes),
            "--rounds",
            str(args.rounds),
            "--window",
            str(args.window),
        ]
        me = [sys.executable, str(Path(__file__).resolve())]
        hub = star.popen(
            star.hub_ns, [*me, "hub", *common, "--leaves", str(args.endpoints)], stdout=-1, text=True
        )
        assert hub.stdout is not None
        if hub.stdout.readline().strip() != "ready":
            raise RuntimeError("the hub did not start")
        leaves = [
            star.popen(star.endpoint_ns[i], [*me, "leaf", *common, "--index", str(i)], stdout=-1, text=True)
            for i in range(args.endpoints)
        ]
        reports = []
        for process in [hub, *leaves]:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line:
                raise RuntimeError("a role ended without a report")
            reports.append(json.loads(line))
        for process in [hub, *leaves]:
            process.wait(30)
        links = star.link_stats()
    rounds = [max(r["round_seconds"][i] for r in reports[1:]) for i in range(args.rounds)]
    return {
        "network": f"N={args.endpoints} {args.rate_mbit} MTU {args.mtu} GRO {args.gro}",
        "bytes": args.bytes,
        "chunk_bytes": args.chunk_bytes,
        "window": args.window,
        "round_seconds": rounds,
        "hub_cpu_per_round": reports[0]["cpu_per_round"],
        "leaf_cpu_per_round": [r["cpu_per_round"] for r in reports[1:]],
        "link_stats": links,
    }


def main(argv: list[str]) -> int:
    if argv[:1] and argv[0] in ("hub", "leaf"):
        args = _role_arguments(argv)
        (_hub if args.role == "hub" else _leaf)(args)
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument("--bytes", type=int, default=64 * MiB, help="bytes each leaf sends per round")
    parser.add_argument("--chunk-bytes", type=int, default=512 * 1024, help="payload of one chunk message")
    parser.add_argument("--window", type=int, default=3, help="chunks a leaf sends ahead of the answers")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--rate-mbit", default="unshaped", help="Mbit/s of each link direction, or 'unshaped'"
    )
    parser.add_argument("--mtu", type=int, default=9000)
    parser.add_argument("--gro", choices=("on", "off"), default="on")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.window < 1 or not 4 <= args.chunk_bytes <= args.bytes:
        parser.error(
            "needs --rounds >= 2 (the first is not measured), --window >= 1, 4 <= --chunk-bytes <= --bytes"
        )
    if reason := netns.unavailable_reason():
        print(f"cannot build the star: {reason}", file=sys.stderr)
        return 2
    result = run(args)
    warm = result["round_seconds"][1:]
    hub_cpu, leaf_cpu = result["hub_cpu_per_round"], result["leaf_cpu_per_round"]
    moved = 2 * args.endpoints * args.bytes
    print(f"{result['network']}: rounds " + ", ".join(f"{s:.2f}" for s in result["round_seconds"]) + " s")
    print(f"rounds 2 to {args.rounds}: median {statistics.median(warm):.2f} s")
    print(
        f"hub {hub_cpu:.2f} CPU s per round ({moved / hub_cpu / 1e6:.0f} MB in+out per CPU s); leaves "
        + ", ".join(f"{c:.2f}" for c in leaf_cpu)
        + f" CPU s per round ({2 * args.bytes / statistics.mean(leaf_cpu) / 1e6:.0f} MB up+down per CPU s)"
    )
    print(f"all processes: {hub_cpu + sum(leaf_cpu):.2f} CPU s per round")
    if args.rate_mbit != "unshaped":
        stats = result["link_stats"]
        print(
            f"tbf drops: up {sum(s['up_drops'] for s in stats)}, down {sum(s['down_drops'] for s in stats)}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
