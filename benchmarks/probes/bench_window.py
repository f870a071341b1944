"""Chunk size and window on the namespace star: round time and tbf drops per setting.

How much data a rank keeps in flight (``--chunk-elements`` x ``--window`` x 4 bytes of
float32) decides whether the window overflows the queue it crosses: loss-based
congestion control fills whatever queue there is, and a loss on a group's ordered
stream holds back every later chunk.  This runs CCO alone (no Gloo) on one star,
each setting ``--repeats`` times, alternated, and prints the slowest rank's round
times and the tbf drops up and down for each.  Needs root (network namespaces).

    python benchmarks/probes/bench_window.py --endpoints 4 --rate-mbit 40 --mtu 9000 \\
        --settings 65536x8 32768x4 16384x4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # the shared support modules
import netns

from cco.transport.config import QUIC_BACKENDS

RESULTS = Path(__file__).resolve().parent / "results" / "bench_window.json"
MiB = 1 << 20


def parse_setting(text: str) -> tuple[int, int]:
    chunk, _, window = text.partition("x")
    try:
        return int(chunk), int(window)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not CHUNKxWINDOW, e.g. 32768x4") from None


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument("--rate-mbit", type=float, default=40.0)
    parser.add_argument("--mtu", type=int, choices=(1500, 9000), default=9000)
    parser.add_argument("--mib", type=int, default=16, help="MiB of float32 per rank")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quic-backend", choices=QUIC_BACKENDS, default=None)
    parser.add_argument("--settings", type=parse_setting, nargs="+", default=[(65536, 8), (32768, 4)])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    reason = netns.unavailable_reason()
    if reason is not None:
        print(f"bench_window.py: the namespace star is not available: {reason}", file=sys.stderr)
        return 2
    spec = netns.StarSpec(endpoints=args.endpoints, rate_mbit=args.rate_mbit, mtu=args.mtu)
    rows = []
    with netns.Star(spec) as star, tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for chunk, window in args.settings:
                settings = netns.CcoSettings(
                    max_datagram_size=netns.quic_datagram_size(args.mtu),
                    chunk_elements=chunk,
                    window=window,
                    operation_timeout_ms=600_000,
                    heartbeat_ms=20_000,
                    quic_backend=args.quic_backend,
                )
                workdir = Path(tmp) / f"{chunk}x{window}-{repeat}"
                with netns.CcoCluster(star, workdir, args.endpoints, settings) as cluster:
                    cluster.start()
                    before = star.link_stats()
                    run = cluster.run(args.mib * MiB // 4, args.rounds, 600)
                    after = star.link_stats()
                drops = {
                    way: sum(
                        a[f"{way}_drops"] - b[f"{way}_drops"] for a, b in zip(after, before, strict=True)
                    )
                    for way in ("up", "down")
                }
                row = {
                    "chunk_elements": chunk,
                    "window": window,
                    "in_flight_bytes": chunk * window * 4,
                    "round_seconds": run.round_seconds(),
                    "tbf_drops": drops,
                    "bit_identical": run.bit_identical(),
                }
                rows.append(row)
                rounds = ", ".join(f"{t:.2f}" for t in row["round_seconds"])
                print(
                    f"{chunk:>6} x {window:<2} ({chunk * window * 4 // 1024:>5} KiB in flight): "
                    f"rounds {rounds} s, drops up/down {drops['up']}/{drops['down']}",
                    flush=True,
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"star": dataclasses.asdict(spec), "backend": args.quic_backend, "runs": rows}, indent=2)
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
