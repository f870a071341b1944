"""CCO against torch.distributed Gloo, over the same links in the same run.

Builds a star of network namespaces (``netns.py``: one namespace per rank, a hub that
routes and hosts the rendezvous and the aggregator, every link shaped with tbf each
way), then runs verified float32 all-reduce with real ``cco-node`` processes and
``torch.distributed`` Gloo all-reduce (one worker process per rank, over the same
links, right after), and reports the median time of repeated runs per size, beside
the bounds S/R (in-network aggregation: S up and S down each link) and
2(N-1)/N x S/R (a ring).  ``--loopback`` runs both on 127.0.0.1 instead, for
CPU-bound figures.  Writes JSON and a PNG plot to ``benchmarks/results/``.

    python benchmarks/run.py --quick               # every target of issue 8, met / missed
    python benchmarks/run.py --endpoints 2 4 8 --mtu 9000 --rate-mbit 40
    python benchmarks/run.py --loopback --endpoints 4 --sizes 8 1048576 67108864

CCO's nodes run on ``--quic-backend`` (default qh3, the nodes' own default; the bare
stream of the CPU-efficiency figure uses the same stack), and with their own
``--busy-poll-us`` (aggregators and endpoints poll 1 ms before sleeping); the
8-byte case is also run with every node sleeping at once, and reported beside.  Times are the slowest
rank's per round.  The QUIC datagram size follows the MTU
(MTU minus IPv6 and UDP headers: 9000 -> 8952, 1500 -> 1452; 16000 on loopback).
Operation timeouts are generous (10 minutes) so slow runs are measured, not failed;
a run that fails anyway is reported with the end of each failing node's log.
torch is the ``bench`` extra: ``pip install -e '.[bench]'`` (or ``pip install
torch==2.13.0 matplotlib``); without it, only CCO is measured.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import timedelta
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))  # the shared support modules
import barequic
import netns

from cco.transport.config import QUIC_BACKENDS
from cco.wire import kernels

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MiB = 1 << 20
LOOPBACK_DATAGRAM = 16000
GLOO_PORT = 29500  # in rank 0's own namespace; on loopback a free port is taken instead
OPERATION_TIMEOUT_MS = 600_000
# Default 1000: on a loaded 2-core machine busy nodes were declared lost mid-run (BENCHMARKS.md).
HEARTBEAT_MS = 20000
DEFAULT_SIZES = [8, 64, 512, 4096, 32768, 262144, 2 * MiB, 16 * MiB, 64 * MiB]
QUICK_RATES = (60.0, 80.0, 100.0, 120.0, 140.0, 160.0, 180.0, 200.0, 240.0, 280.0, 320.0, 400.0)
"""Rates --quick tries above 40 Mbit/s, in order, for the highest that keeps 87% of
line rate (N = 4, MTU 9000, 16 MiB; CCO alone, 5 to 20 s each).  The ladder goes on
until a rate misses: on 2 cores the five processes' CPU, not the links, ends it
(ending at 120 Mbit/s, as it did, left the figure a lower bound)."""
BARE_STREAMS = 7
"""Bare QUIC stream transfers whose median is the CPU-efficiency yardstick.  One
transfer alone is noisy: 160 to 232 MB/s on one host, 178 to 322 MB/s on another
(eight in a row, a median near 200); with three, two fast ones in a run moved the
figure from 63% to 46% while CCO's own ingress stayed at 128 MB/s."""
FLOOR_ROUNDS = 1000
"""Rounds of the transport star, the latency floor (about 1 s).  Fewer read higher:
the first rounds run slower while the processes settle."""
FAST_LINK_CHUNK = 131072
"""Chunk elements of the loopback case's second run, a setting for links much faster
than the default's 32768 suits: every chunk costs each process a fixed amount of CPU
(messages, checks, event-loop turns), so on loopback 64 MiB took 3.4 s with it against
5.1 to 5.5 s with the default (BENCHMARKS.md), while on 40 Mbit/s links its 1.5 MiB in
flight per rank overflowed the queue."""
LATENCY_WARMUP = 10
"""Rounds of the 8-byte case run and not counted, by CCO and Gloo alike.  A fresh
endpoint process spends more CPU on each of its first ten or so all-reduces than
later (its main thread: 1.19 to 1.50 ms on the first, 0.56 to 0.81 ms, most above
0.65, on the second to the sixth, medians of 0.55 to 0.58 ms from the twentieth on;
CPython still specialising the code, caches filling).  With one round left out, the
200 rounds' p99 was those first rounds (6.6, 8.3 and 5.3 ms at rounds 2, 3 and 8,
the median 2.8 ms) rather than the steady state the target is about.  The JSON
keeps the warm-up rounds, and the figure line says what p99 is with them."""
TORCH_HINT = "pip install torch==2.13.0 matplotlib   (or: pip install -e '.[bench]')"


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- where a run happens ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Net:
    """A star (rate or unshaped, MTU, GRO) or loopback (star is None); shared by CCO and Gloo."""

    endpoints: int
    star: netns.Star | None
    rate_mbit: float | None
    mtu: int | None
    gro: bool | None = None

    @property
    def datagram(self) -> int:
        return LOOPBACK_DATAGRAM if self.mtu is None else netns.quic_datagram_size(self.mtu)

    def bound(self, nbytes: int, ring: bool) -> float | None:
        """S/R, or 2(N-1)/N x S/R for a ring; None on loopback and unshaped links."""
        if self.rate_mbit is None:
            return None
        seconds = nbytes * 8 / (self.rate_mbit * 1e6)
        return seconds * 2 * (self.endpoints - 1) / self.endpoints if ring else seconds

    def describe(self) -> str:
        if self.star is None:
            return f"loopback, N = {self.endpoints}"
        rate = "unshaped" if self.rate_mbit is None else f"{self.rate_mbit:g} Mbit/s"
        gro = "" if self.gro is None else f", GRO {'on' if self.gro else 'off'}"
        return f"star, N = {self.endpoints}, {rate}, MTU {self.mtu}{gro}"


LOOPBACK = object()
"""``network``'s rate for loopback (no star); a rate of None is an unshaped star."""


@contextlib.contextmanager
def network(
    endpoints: int,
    rate_mbit: float | object | None,
    mtu: int | None,
    queue_ms: float = 100.0,
    gro: bool | None = None,
) -> Iterator[Net]:
    """A star of ``endpoints`` links at ``rate_mbit`` (None: unshaped), or loopback
    (``rate_mbit`` is :data:`LOOPBACK` or ``mtu`` None)."""
    if rate_mbit is LOOPBACK or mtu is None:
        yield Net(endpoints, None, None, None)
        return
    assert rate_mbit is None or isinstance(rate_mbit, float | int)
    rate = None if rate_mbit is None else float(rate_mbit)
    spec = netns.StarSpec(endpoints=endpoints, rate_mbit=rate, mtu=mtu, queue_ms=queue_ms, gro=gro)
    with netns.Star(spec) as star:
        yield Net(endpoints, star, rate, mtu, gro)


def run_timeout(net: Net, nbytes: int, rounds: int) -> float:
    """Wall-clock limit of one run: generous, so slow runs are measured, not cut."""
    bound = net.bound(nbytes, ring=True) or nbytes / 5e6
    return 90 + rounds * max(60.0, 20 * bound)


# --- CCO ---------------------------------------------------------------------------------------


def cco_runs(
    net: Net,
    sizes: list[int],
    rounds: int,
    workdir: Path,
    settings: netns.CcoSettings | None = None,
    untagged: bool = False,
    backend: str | None = None,
    warmup: int = 1,
    chunk_elements: int | None = None,
    busy_poll_us: int | None = None,
) -> tuple[dict[int, dict[str, Any]], dict[str, float]]:
    """Per size: the per-round times (or the failure); and the aggregator's usage.

    The endpoints run ``warmup`` rounds more, first, which are not counted: as Gloo's
    workers do as many all-reduces before the timed ones (the first round of a fresh
    group also ramps up congestion windows and path MTU; for small sizes it took 1.5
    to 2.5 times the next one).  ``untagged`` runs the endpoints with every
    MAC tag zero (``untagged.py``), for the cost of authentication; ``backend`` is
    every node's ``--quic-backend``, ``chunk_elements`` the group's chunk size and
    ``busy_poll_us`` every node's ``--busy-poll-us`` (when ``settings`` are not
    given; None: the node default)."""
    settings = settings or netns.CcoSettings(
        max_datagram_size=net.datagram,
        operation_timeout_ms=OPERATION_TIMEOUT_MS,
        heartbeat_ms=HEARTBEAT_MS,
        untagged=untagged,
        quic_backend=backend,
        chunk_elements=chunk_elements,
        busy_poll_us=busy_poll_us,
    )
    first = f" after {warmup} warm-up round{'s' if warmup > 1 else ''}" if warmup else ""
    results: dict[int, dict[str, Any]] = {}
    with netns.CcoCluster(net.star, workdir, net.endpoints, settings) as cluster:
        cluster.start()
        for size in sizes:
            tags = ", tags off" if settings.untagged else ""
            log(f"  CCO  {net.describe()}{tags}: {human(size)} x {rounds}{first}")
            before = net.star.link_stats() if net.star is not None else []
            total = rounds + warmup
            try:
                run = cluster.run(max(1, size // 4), total, run_timeout(net, size, total))
            except netns.NetnsError as exc:
                results[size] = {"failed": str(exc)}
                log(f"  CCO  FAILED: {exc}")
                continue
            timed = run.round_seconds()[warmup:]
            entry: dict[str, Any] = {
                "round_seconds": timed,
                "warmup_seconds": run.round_seconds()[:warmup],
                "from_last_call_seconds": run.from_last_call()[warmup:],
                "median_seconds": statistics.median(timed),
                "bit_identical": run.bit_identical(),
                "endpoint_peak_rss_bytes": max(r["peak_rss_bytes"] for r in run.reports),
                "endpoint_cpu_seconds": run.cpu_seconds,
                "wall_seconds": run.wall_seconds,
            }
            entry.update(datapath_cpu(run, warmup, size, net.endpoints))
            if net.star is not None:
                after = net.star.link_stats()
                for way in ("up", "down"):
                    key = f"{way}_drops"
                    entry[f"tbf_drops_{way}"] = sum(
                        a[key] - b[key] for a, b in zip(after, before, strict=True)
                    )
            results[size] = entry
        usage = cluster.close()
    return results, usage


def datapath_cpu(run: netns.EndpointRun, warmup: int, size: int, endpoints: int) -> dict[str, Any]:
    """The CPU of the timed rounds (after ``warmup``), and the bytes each node moved
    per CPU second in them: the aggregator its N x S in plus N x S out per round,
    an endpoint its S up plus S down (the mean of the endpoints).  Empty where the
    CPU trace does not cover the rounds."""
    cpu = run.rounds_cpu(warmup)
    rounds = len(run.reports[0]["rounds"]) - warmup
    if cpu is None or rounds <= 0:
        return {}
    aggregator, per_endpoint = cpu
    mean_endpoint = sum(per_endpoint) / len(per_endpoint)
    return {
        "rounds_cpu_aggregator": aggregator,
        "rounds_cpu_endpoints": per_endpoint,
        "aggregator_mb_per_cpu_second": 2 * endpoints * size * rounds / 1e6 / aggregator
        if aggregator
        else None,
        "endpoint_mb_per_cpu_second": 2 * size * rounds / 1e6 / mean_endpoint if mean_endpoint else None,
    }


# --- Gloo --------------------------------------------------------------------------------------


def torch_available() -> bool:
    return find_spec("torch") is not None


def gloo_runs(
    net: Net, sizes: list[int], repeats: int, workdir: Path, warmup: int = 1
) -> dict[int, dict[str, Any]]:
    """Per size: each repeat's time on the slowest rank (``warmup`` all-reduces first,
    not counted), and from the last rank's call to the last result."""
    master = netns.Star.endpoint_address(0) if net.star is not None else "127.0.0.1"
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "eth0" if net.star is not None else "lo",
        "OMP_NUM_THREADS": "1",
    }
    port = GLOO_PORT if net.star is not None else free_tcp_port()
    processes = []
    log(f"  Gloo {net.describe()}: {', '.join(human(s) for s in sizes)} x {repeats}")
    for rank in range(net.endpoints):
        out = workdir / f"gloo-{rank}.json"
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "gloo-worker",
            "--rank",
            str(rank),
            "--world",
            str(net.endpoints),
            "--master",
            f"{master}:{port}",
            "--repeats",
            str(repeats),
            "--warmup",
            str(warmup),
            "--out",
            str(out),
            "--sizes",
            *map(str, sizes),
        ]
        logfile = open(workdir / f"gloo-{rank}.log", "w")  # noqa: SIM115 - the child owns it
        kwargs: dict[str, Any] = {"stdout": logfile, "stderr": subprocess.STDOUT, "env": env}
        if net.star is not None:
            processes.append((out, net.star.popen(net.star.endpoint_ns[rank], argv, **kwargs)))
        else:
            processes.append((out, subprocess.Popen(argv, **kwargs)))
        logfile.close()
    timeout = 120 + sum(run_timeout(net, size, repeats + warmup) for size in sizes)
    deadline = time.monotonic() + timeout
    failed = []
    try:
        for rank, (_, process) in enumerate(processes):
            try:
                code = process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                failed.append(f"rank {rank} did not finish within {timeout:.0f} s")
                continue
            if code != 0:
                tail = (workdir / f"gloo-{rank}.log").read_text(errors="replace").strip().splitlines()[-3:]
                failed.append(f"rank {rank} exited with {code}: {' | '.join(tail)}")
    finally:  # also when the harness is stopped meanwhile (as CcoCluster.run does)
        for _, process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    if failed:
        log(f"  Gloo FAILED: {'; '.join(failed)}")
        return {size: {"failed": "; ".join(failed)} for size in sizes}
    reports = [json.loads(out.read_text()) for out, _ in processes]
    results = {}
    for size in sizes:
        key = str(size)
        per_rank = [report["seconds"][key] for report in reports]
        slowest = [max(times) for times in zip(*per_rank, strict=True)]
        from_last_call = [
            netns.last_call_to_last_result(
                [report["started"][key][i] for report in reports], [times[i] for times in per_rank]
            )
            for i in range(len(slowest))
        ]
        results[size] = {
            "round_seconds": slowest,
            "median_seconds": statistics.median(slowest),
            "from_last_call_seconds": from_last_call,
        }
    return results


def free_tcp_port() -> int:
    """A TCP port on loopback that was free a moment ago (for Gloo's store)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def gloo_worker(argv: list[str]) -> int:
    """One Gloo rank: all-reduce each size ``repeats`` times after ``--warmup`` more; JSON out."""
    parser = argparse.ArgumentParser(prog="run.py gloo-worker")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--repeats", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--sizes", type=int, nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master}",
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(seconds=OPERATION_TIMEOUT_MS / 1000),
    )
    seconds: dict[str, list[float]] = {}
    started: dict[str, list[float]] = {}
    for size in args.sizes:
        tensor = torch.ones(max(1, size // 4), dtype=torch.float32)
        for _ in range(args.warmup):  # buffers and pairs
            dist.all_reduce(tensor)
        times, calls = [], []
        for _ in range(args.repeats):
            tensor.fill_(1.0)
            dist.barrier()
            calls.append(time.monotonic())  # as the CCO workload's "started"
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - start)
        if float(tensor[0]) != args.world:
            raise SystemExit(f"wrong all-reduce result {float(tensor[0])}, expected {args.world}")
        seconds[str(size)] = times
        started[str(size)] = calls
    dist.barrier()
    dist.destroy_process_group()
    args.out.write_text(json.dumps({"rank": args.rank, "seconds": seconds, "started": started}))
    return 0


# --- reporting ---------------------------------------------------------------------------------


def human(nbytes: int) -> str:
    for unit, scale in (("MiB", MiB), ("KiB", 1024)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info: dict[str, Any] = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
    }
    if torch_available():
        # Not imported: children forked from a big harness would inherit its ru_maxrss
        # (Linux keeps the peak across exec), inflating the peaks the nodes report.
        info["torch"] = metadata.version("torch")
    return info


def commit_of_cco() -> str:
    """The commit of the tree ``cco`` is imported from (with '+dirty' if cco/ differs)."""
    import cco

    root = Path(cco.__file__).resolve().parent.parent
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    if head.returncode != 0:
        return f"unknown ({root} is not a git checkout)"
    dirty = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "cco"], capture_output=True, text=True
    ).stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")


def plot(points: list[dict[str, Any]], path: Path) -> Path | None:
    """Time against size per (network, N): CCO, Gloo, and the two bounds where a rate is set."""
    if find_spec("matplotlib") is None:
        log(f"no plot: matplotlib is not installed ({TORCH_HINT})")
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[dict[str, Any]]] = {}
    for point in points:
        groups.setdefault(point["network"], []).append(point)
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
    for axis, (title, group) in zip(axes[0], sorted(groups.items()), strict=True):
        for system, style in (("cco", "o-"), ("gloo", "s-")):
            data = sorted((p["bytes"], p["median_seconds"]) for p in group if p["system"] == system)
            if data:
                axis.plot(*zip(*data, strict=True), style, label=f"{system.upper()} (median)")
        sizes = sorted({p["bytes"] for p in group})
        for key, label in (("bound_cco", "S/R (aggregation)"), ("bound_ring", "2(N-1)/N x S/R (ring)")):
            bounds = sorted({(p["bytes"], p[key]) for p in group if p.get(key)})
            if bounds and len(sizes) > 1:
                axis.plot(*zip(*bounds, strict=True), "--", label=label)
            elif bounds:
                axis.axhline(
                    bounds[0][1], linestyle="--", label=label, color="grey" if "ring" in key else "k"
                )
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("bytes per rank")
        axis.set_ylabel("seconds per all-reduce")
        axis.set_title(title, fontsize=9)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def points_of(
    net: Net, cco: dict[int, dict[str, Any]], gloo: dict[int, dict[str, Any]]
) -> list[dict[str, Any]]:
    points = []
    for system, results in (("cco", cco), ("gloo", gloo)):
        for size, entry in results.items():
            if "median_seconds" in entry:
                points.append(
                    {
                        "network": net.describe(),
                        "system": system,
                        "bytes": size,
                        "median_seconds": entry["median_seconds"],
                        "bound_cco": net.bound(size, ring=False),
                        "bound_ring": net.bound(size, ring=True),
                    }
                )
    return points


# --- the sweep ---------------------------------------------------------------------------------


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    points: list[dict[str, Any]] = []
    have_torch = torch_available()
    if not have_torch:
        log(f"torch is not installed: Gloo is not measured. Install it with: {TORCH_HINT}")
    if args.wan_delay_ms or args.wan_loss:
        log(
            "WAN profile: delay and loss apply to CCO's endpoint-aggregator datagrams (relay.py); "
            "Gloo (TCP) is not measured"
        )
    for endpoints in args.endpoints:
        rate, mtu = (None, None) if args.loopback else (args.rate_mbit, args.mtu)
        tmp = mkdir(args.logs / f"n{endpoints}")
        with network(endpoints, rate, mtu, args.queue_ms, args.gro) as net:
            settings = netns.CcoSettings(
                max_datagram_size=net.datagram,
                operation_timeout_ms=OPERATION_TIMEOUT_MS,
                heartbeat_ms=HEARTBEAT_MS,
                wan_delay_ms=args.wan_delay_ms,
                wan_loss=args.wan_loss,
                quic_backend=args.quic_backend,
                nodes_from=args.nodes_from,
                busy_poll_us=args.busy_poll_us,
            )
            cco, usage = cco_runs(net, args.sizes, args.repeats, Path(tmp) / "cco", settings)
            gloo = {}
            if have_torch and not settings.wan and not args.no_gloo:
                gloo = gloo_runs(net, args.sizes, args.repeats, mkdir(Path(tmp) / "gloo"))
        runs.append({"network": net.describe(), "cco": cco, "gloo": gloo, "aggregator": usage})
        points += points_of(net, cco, gloo)
        for size in args.sizes:
            row = [f"{net.describe():40}", f"{human(size):>8}", fmt_result(cco.get(size))]
            row += [fmt_result(gloo.get(size)) if gloo else "not measured"]
            bound = net.bound(size, ring=False)
            row += [f"S/R {bound:.3g} s" if bound else ""]
            row += [cpu_figures(cco.get(size, {}))]
            print("  ".join(row), flush=True)
    return {"runs": runs, "points": points}


def cpu_figures(entry: dict[str, Any]) -> str:
    """The warm rounds' MB per CPU second of the aggregator and an endpoint, if measured."""
    if not entry.get("aggregator_mb_per_cpu_second"):
        return ""
    aggregator, endpoint = entry["aggregator_mb_per_cpu_second"], entry["endpoint_mb_per_cpu_second"]
    return f"MB per CPU s: aggregator {aggregator:.0f} (in+out), endpoint {endpoint:.0f} (up+down)"


def fmt_result(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "-"
    if "failed" in entry:
        return "FAILED"
    return f"{entry['median_seconds']:10.4f} s"


def mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- --quick: every target of issue 8 ----------------------------------------------------------


@dataclass
class Target:
    name: str
    target: str
    figure: str
    met: bool | None  # None: not measured

    def line(self) -> str:
        verdict = "-" if self.met is None else ("met" if self.met else "MISSED")
        return f"{self.name:56} {self.target:22} {verdict:7} {self.figure}"


def ratio_target(
    name: str, cco: dict[str, Any], gloo: dict[str, Any] | None, limit: float, have_torch: bool
) -> Target:
    if not have_torch or gloo is None:
        return Target(name, f"<= {limit}", f"not measured: torch missing ({TORCH_HINT})", None)
    if "failed" in cco or "failed" in gloo:
        which = "CCO" if "failed" in cco else "Gloo"
        return Target(name, f"<= {limit}", f"not measured: {which} run failed (see above)", None)
    ratio = cco["median_seconds"] / gloo["median_seconds"]
    figure = f"{ratio:.2f} (CCO {cco['median_seconds']:.2f} s, Gloo {gloo['median_seconds']:.2f} s)"
    return Target(name, f"<= {limit}", figure, ratio <= limit)


def tags_target(tagged: dict[str, Any], untagged: dict[str, Any] | None) -> Target:
    """Tags on / tags off: the same case, the endpoints once through ``untagged.py``."""
    name, limit = "authentication cost: tags on / tags off (line-rate case)", 1.10
    if untagged is None or "failed" in tagged or "failed" in untagged:
        return Target(name, f"<= {limit}", "not measured: a run failed (see above)", None)
    ratio = tagged["median_seconds"] / untagged["median_seconds"]
    figure = f"{ratio:.2f} (on {tagged['median_seconds']:.2f} s, off {untagged['median_seconds']:.2f} s)"
    return Target(name, f"<= {limit}", figure, ratio <= limit)


def last_call_figure(entry: dict[str, Any], prefix: str = "") -> str:
    """p50 / p99 of a run's ``from_last_call_seconds``; empty if it has none."""
    times = entry.get("from_last_call_seconds", [])
    if not times:
        return ""
    return f"{prefix}{percentile(times, 50) * 1e3:.2f} / {percentile(times, 99) * 1e3:.2f} ms"


def endpoints_bound(entry: dict[str, Any], size: int, cores: int, yardstick: float) -> tuple[float, float]:
    """The most a CCO run's ingress goodput could have been, as a share of
    ``yardstick`` (bytes per second), had its aggregator cost nothing: the round
    then takes at least the endpoints' own CPU per round shared by ``cores`` cores.
    Returns that share and each endpoint's CPU seconds per round.  The CPU counted
    includes joining (and the warm-up round is counted as a round), so the share
    comes out a little low."""
    rounds = len(entry["round_seconds"]) + len(entry["warmup_seconds"])
    cpu: list[float] = entry["endpoint_cpu_seconds"]
    per_round = sum(cpu) / rounds
    ingress = len(cpu) * size / (per_round / cores)
    return ingress / yardstick, per_round / len(cpu)


def quick(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    backend = args.quic_backend
    run_cco = functools.partial(cco_runs, backend=backend)
    have_torch = torch_available()
    if not have_torch:
        log(f"torch is not installed: Gloo figures are not measured. Install it with: {TORCH_HINT}")
    size = 16 * MiB
    rounds = args.repeats
    targets: list[Target] = []
    runs: list[dict[str, Any]] = []
    points: list[dict[str, Any]] = []

    def star_case(
        endpoints: int, rate: float, mtu: int, tmp: Path, untagged: bool = False
    ) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]:
        """CCO, then Gloo, then (``untagged``) CCO with tags off, on one star."""
        with network(endpoints, rate, mtu) as net:
            cco, usage = run_cco(net, [size], rounds, tmp / f"cco-{endpoints}-{mtu}")
            gloo = (
                gloo_runs(net, [size], rounds, mkdir(tmp / f"gloo-{endpoints}-{mtu}")) if have_torch else {}
            )
            bare = (
                run_cco(net, [size], rounds, tmp / f"cco-{endpoints}-{mtu}-untagged", untagged=True)[0]
                if untagged
                else {}
            )
        runs.append({"network": net.describe(), "cco": cco, "gloo": gloo, "aggregator": usage})
        if untagged:
            runs.append({"network": net.describe() + ", tags off", "cco": bare})
        points.extend(points_of(net, cco, gloo))
        return cco[size], gloo.get(size), bare.get(size)

    def highest_rate(met_at_40: bool) -> Target:
        """Above 40 Mbit/s through QUICK_RATES (CCO only, a star per rate) until a
        rate misses 87% of line rate: the last one that kept it."""
        name = "highest rate with >= 87% of line rate (MTU 9000, N=4)"
        if not met_at_40:
            return Target(name, "report", "below 40 Mbit/s (missed at 40)", False)
        highest, tried = "40 Mbit/s", ""
        for rate in QUICK_RATES:
            with network(4, rate, 9000) as net:
                results, usage = run_cco(net, [size], rounds, tmp / f"cco-4-9000-{rate:.0f}")
            runs.append({"network": net.describe(), "cco": results, "aggregator": usage})
            entry = results[size]
            if "failed" in entry:
                tried = f"; {rate:.0f} Mbit/s failed (see above)"
                break
            share = size * 8 / (rate * 1e6) / entry["median_seconds"]
            if share < 1 / 1.15:
                tried = f"; {rate:.0f} Mbit/s: {share:.0%}"
                break
            highest = f"{rate:.0f} Mbit/s ({share:.0%})"
        else:
            tried = f"; above {QUICK_RATES[-1]:.0f} not tried"
        return Target(name, "report", highest + tried, None)

    tmp = args.logs
    # Line rate, CCO / Gloo and the cost of tags at N = 4, 40 Mbit/s, MTU 9000.
    cco, gloo, untagged = star_case(4, 40.0, 9000, tmp, untagged=True)
    bound = 16 * MiB * 8 / 40e6
    name = "line rate: N=4, 40 Mbit/s, MTU 9000, 16 MiB"
    if "failed" in cco:
        targets.append(Target(name, ">= 87% (<= 1.15 S/R)", "not measured: CCO run failed (see above)", None))
        met = False
    else:
        share = bound / cco["median_seconds"]
        met = share >= 1 / 1.15
        figure = f"{share:.0%} ({cco['median_seconds']:.2f} s vs S/R {bound:.2f} s)"
        targets.append(Target(name, ">= 87% (<= 1.15 S/R)", figure, met))
    targets.append(highest_rate(met))
    targets.append(ratio_target("CCO / Gloo: N=4, 40 Mbit/s, MTU 9000, 16 MiB", cco, gloo, 0.75, have_torch))
    drops = f"tbf drops up/down {cco.get('tbf_drops_up', '?')}/{cco.get('tbf_drops_down', '?')}"
    log(f"  (N=4 MTU 9000: {drops})")

    tagging = tags_target(cco, untagged)
    cco, gloo, _ = star_case(8, 20.0, 9000, tmp)
    targets.append(ratio_target("CCO / Gloo: N=8, 20 Mbit/s, MTU 9000, 16 MiB", cco, gloo, 0.65, have_torch))

    with network(4, 40.0, 1500) as net:
        cco1500, usage = run_cco(net, [size], rounds, tmp / "cco-4-1500")
        gloo1500 = gloo_runs(net, [size], rounds, mkdir(tmp / "gloo-4-1500")) if have_torch else {}
        runs.append({"network": net.describe(), "cco": cco1500, "gloo": gloo1500, "aggregator": usage})
        points.extend(points_of(net, cco1500, gloo1500))
        # Defaults: no datagram size, window, chunk size or timeout given to any node.
        defaults, _ = run_cco(  # a user's very first round: no warm-up
            net, [64 * MiB], 1, tmp / "cco-defaults", netns.CcoSettings(quic_backend=backend), warmup=0
        )
        runs.append({"network": net.describe() + ", node defaults", "cco": defaults})
    targets.append(
        ratio_target(
            "CCO / Gloo: N=4, 40 Mbit/s, MTU 1500, 16 MiB",
            cco1500[size],
            gloo1500.get(size),
            1.0,
            have_torch,
        )
    )
    targets.append(tagging)

    # Loopback: latency, CPU efficiency, memory.
    with network(4, None, None) as net:
        latency, usage_small = run_cco(
            net, [8], args.latency_rounds, tmp / "cco-latency", warmup=LATENCY_WARMUP
        )
        latency_asleep, _ = run_cco(
            net, [8], args.latency_rounds, tmp / "cco-latency-asleep", warmup=LATENCY_WARMUP, busy_poll_us=0
        )
        big, usage = run_cco(net, [64 * MiB], rounds, tmp / "cco-loopback")
        big_chunks, usage_chunks = run_cco(
            net, [64 * MiB], rounds, tmp / "cco-loopback-chunks", chunk_elements=FAST_LINK_CHUNK
        )
        gloo_lo = gloo_runs(net, [64 * MiB], rounds, mkdir(tmp / "gloo-lo")) if have_torch else {}
        gloo_lat = (
            gloo_runs(net, [8], args.latency_rounds, mkdir(tmp / "gloo-lat"), warmup=LATENCY_WARMUP)
            if have_torch
            else {}
        )
        runs.append({"network": net.describe(), "cco": latency, "gloo": gloo_lat, "aggregator": usage_small})
        runs.append({"network": f"{net.describe()}, --busy-poll-us 0", "cco": latency_asleep})
        runs.append({"network": net.describe(), "cco": big, "gloo": gloo_lo, "aggregator": usage})
        runs.append(
            {
                "network": f"{net.describe()}, chunk {FAST_LINK_CHUNK}",
                "cco": big_chunks,
                "aggregator": usage_chunks,
            }
        )
        points.extend(points_of(net, {**latency, **big}, {**gloo_lat, **gloo_lo}))
        pki = tmp / "cco-loopback" / "pki"
        streams = sorted(
            (
                barequic.bare_stream(pki, net.datagram, 64 * MiB, backend, netns._free_port())
                for _ in range(BARE_STREAMS)
            ),
            key=lambda run: run.goodput,
        )
        bare = streams[BARE_STREAMS // 2]
        low, high = streams[0].goodput / 1e6, streams[-1].goodput / 1e6
        spread = f"median of {BARE_STREAMS}: {low:.0f} to {high:.0f}"
        floor = barequic.star_round_trips(
            tmp / "cco-loopback", 4, FLOOR_ROUNDS, net.datagram, backend, netns._free_port()
        )
        bare_quic = {
            "network": net.describe(),
            "stream": asdict(bare),
            "stream_goodputs": [run.goodput for run in streams],
            "star": floor,
        }
    name = "CPU efficiency: aggregator ingress / bare QUIC stream"
    bound = barequic.star_ingress_bound(bare, os.cpu_count() or 1)
    if "failed" in big[64 * MiB]:
        targets.append(Target(name, ">= 70%", "not measured: CCO run failed (see above)", None))
    else:
        ingress = 4 * 64 * MiB / big[64 * MiB]["median_seconds"]
        figure = f"{ingress / bare.goodput:.0%} ({ingress / 1e6:.1f} vs {bare.goodput / 1e6:.1f} MB/s"
        figure += f" ({spread}), datagram {net.datagram})"
        targets.append(Target(name, ">= 70%", figure, ingress / bare.goodput >= 0.70))
    targets.append(
        Target(
            "  floor: the same, QUIC alone at bare-stream CPU/byte",
            "report",
            f"{bound:.0%} on {os.cpu_count()} cores (stream CPU: sender {bare.sender_cpu:.2f} s, "
            f"receiver {bare.receiver_cpu:.2f} s, for {bare.seconds:.2f} s)",
            None,
        )
    )
    if "failed" not in big[64 * MiB]:
        share, per_endpoint = endpoints_bound(big[64 * MiB], 64 * MiB, os.cpu_count() or 1, bare.goodput)
        targets.append(
            Target(
                "  bound: the endpoints' own CPU, aggregator free",
                "report",
                f"{share:.0%} (each endpoint {per_endpoint:.2f} s of CPU per round, joining included)",
                None,
            )
        )
    entry = big_chunks[64 * MiB]
    name = f"  the same with {FAST_LINK_CHUNK}-element chunks (fast links)"
    if "failed" in entry:
        targets.append(Target(name, "report", "not measured: the run failed (see above)", None))
    else:
        ingress = 4 * 64 * MiB / entry["median_seconds"]
        figure = f"{ingress / bare.goodput:.0%} ({ingress / 1e6:.1f} MB/s, {entry['median_seconds']:.2f} s)"
        targets.append(Target(name, "report", figure, None))
    gloo_big = gloo_lo.get(64 * MiB, {})
    if "median_seconds" in big[64 * MiB] and "median_seconds" in gloo_big:
        cco_s, gloo_s = big[64 * MiB]["median_seconds"], gloo_big["median_seconds"]
        figure = f"{cco_s / gloo_s:.0f} (CCO {cco_s:.2f} s, Gloo {gloo_s:.3f} s)"
    else:
        figure = "not measured: " + ("torch missing" if not have_torch else "a run failed (see above)")
    targets.append(Target("CCO / Gloo: loopback, N=4, 64 MiB", "report", figure, None))
    entry = latency[8]
    if "failed" in entry:
        targets.append(
            Target("latency: loopback, N=4, 8 bytes", "p50 <= 1.5 ms", "not measured: failed", None)
        )
    else:
        times = sorted(entry["round_seconds"])  # after LATENCY_WARMUP rounds
        p50, p99 = percentile(times, 50), percentile(times, 99)
        # The same with the warm-up rounds but the first (it also sets up connections).
        settling = percentile(sorted(entry["warmup_seconds"][1:] + entry["round_seconds"]), 99)
        gloo_text = ""
        if 8 in gloo_lat and "round_seconds" in gloo_lat[8]:
            g = sorted(gloo_lat[8]["round_seconds"])
            gloo_text = f"; Gloo {percentile(g, 50) * 1e3:.2f} / {percentile(g, 99) * 1e3:.2f} ms"
        targets.append(
            Target(
                "latency p50: loopback, N=4, 8 bytes",
                "<= 1.5 ms",
                f"{p50 * 1e3:.2f} ms{gloo_text}",
                p50 <= 1.5e-3,
            )
        )
        figure = f"{p99 * 1e3:.2f} ms (with warm-up rounds 2 to {LATENCY_WARMUP}: {settling * 1e3:.2f} ms)"
        targets.append(Target("latency p99: loopback, N=4, 8 bytes", "<= 5 ms", figure, p99 <= 5e-3))
        targets.append(
            Target(
                "  from the last rank's call to the last result, p50 / p99",
                "report",
                last_call_figure(entry) + last_call_figure(gloo_lat.get(8, {}), "; Gloo "),
                None,
            )
        )
        asleep_entry = latency_asleep[8]
        if "failed" in asleep_entry:
            figure = "not measured: failed"
        else:
            times = sorted(asleep_entry["round_seconds"])
            figure = f"p50 {percentile(times, 50) * 1e3:.2f} / p99 {percentile(times, 99) * 1e3:.2f} ms"
        name = "  the same, nodes sleeping at once (--busy-poll-us 0)"
        targets.append(Target(name, "report", figure, None))
    trips = floor["round_seconds"]
    targets.append(
        Target(
            "  floor: CCO's transport alone, 8 B star, one pass",
            "report",
            f"p50 {percentile(trips, 50) * 1e3:.2f} / p99 {percentile(trips, 99) * 1e3:.2f} ms; "
            f"CPU per round: leaf {floor['leaf_cpu_per_round'] * 1e3:.2f}, "
            f"hub {floor['hub_cpu_per_round'] * 1e3:.2f} ms",
            None,
        )
    )
    rss = usage.get("peak_rss_bytes")
    name = "memory: aggregator peak RSS, loopback 64 MiB all-reduce"
    if "failed" in big[64 * MiB] or not rss:
        targets.append(Target(name, "<= 100 MiB", "not measured: the 64 MiB run failed", None))
    else:
        targets.append(Target(name, "<= 100 MiB", f"{rss / MiB:.0f} MiB", rss <= 100 * MiB))
    entry = defaults[64 * MiB]
    ok = "failed" not in entry
    figure = f"completed in {entry['median_seconds']:.1f} s" if ok else "failed: " + entry["failed"][:200]
    targets.append(Target("defaults: 64 MiB, N=4, 40 Mbit/s, MTU 1500, no tuning", "completes", figure, ok))
    fast_targets, fast_runs = fast_links(run_cco, have_torch, rounds, tmp, bare)
    targets += fast_targets
    runs += fast_runs
    elapsed = time.monotonic() - started
    print()
    print(f"{'figure':56} {'target':22} {'verdict':7} measured")
    for target in targets:
        print(target.line())
    print("\nper run: CCO and Gloo medians, tbf drops (up/down, all links), aggregator CPU and peak RSS")
    for run in runs:
        for size, entry in run["cco"].items():
            gloo = run.get("gloo", {}).get(size, {})
            usage = run.get("aggregator") or {}
            text = f"  {run['network']:48} {human(size):>7}  CCO {fmt_result(entry)}"
            text += f"  Gloo {fmt_result(gloo or None)}"
            if "tbf_drops_up" in entry:
                text += f"  drops {entry['tbf_drops_up']}/{entry['tbf_drops_down']}"
            if "endpoint_cpu_seconds" in entry:
                text += f"  endpoint CPU {max(entry['endpoint_cpu_seconds']):.1f} s"
                text += f" of {entry['wall_seconds']:.1f} s"
            if usage:
                text += f"  agg CPU {usage['cpu_seconds']:.1f} s, RSS {usage['peak_rss_bytes'] / MiB:.0f} MiB"
            print(text)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\n--quick took {elapsed / 60:.1f} min (limit 10 min); "
        f"load average at the end {load} on {os.cpu_count()} cores"
    )
    print(f"node logs: {args.logs}")
    return {
        "targets": [vars(t) for t in targets],
        "runs": runs,
        "points": points,
        "bare_quic": bare_quic,
        "elapsed_seconds": elapsed,
        "latency_rounds": args.latency_rounds,
    }


# --- fast links (issue 40) ----------------------------------------------------------------------

FAST_SIZE = 64 * MiB
CROSSOVER_RATES = (100.0, 200.0, 400.0, 1000.0)
"""Per-link rates --quick tries, in order, for the highest at which CCO takes at most
Gloo's time (N = 4, 64 MiB, MTU 9000); the ladder stops at the first rate CCO loses."""


def bare_mb_per_cpu_second(run: barequic.StreamRun) -> float:
    """The bare QUIC stream's MB per CPU second, each byte counted out (at the sender)
    and in (at the receiver) over the CPU of both: the yardstick of a node's in+out."""
    return 2 * run.nbytes / (run.sender_cpu + run.receiver_cpu) / 1e6


def cpu_target(name: str, entry: dict[str, Any], key: str, limit: float, bare: float) -> Target:
    value = entry.get(key)
    if not value:
        return Target(name, f">= {limit:.0f}", "not measured (the run failed or was too short)", None)
    figure = f"{value:.0f} (bare QUIC stream, loopback, same run: {bare:.0f}; warm rounds' CPU)"
    return Target(name, f">= {limit:.0f}", figure, value >= limit)


def fast_links(
    run_cco: Any, have_torch: bool, rounds: int, tmp: Path, bare: barequic.StreamRun
) -> tuple[list[Target], list[dict[str, Any]]]:
    """CCO against Gloo on fast links: unshaped with veth GRO off and on (the ratio,
    and each node's MB per CPU second beside the bare stack's), and the crossover
    ladder (:data:`CROSSOVER_RATES`, veth GRO at the kernel's default, off)."""
    targets: list[Target] = []
    runs: list[dict[str, Any]] = []
    yardstick = bare_mb_per_cpu_second(bare)

    def case(
        rate: float | None, gro: bool | None, label: str
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        with network(4, rate, 9000, gro=gro) as net:
            cco, usage = run_cco(net, [FAST_SIZE], rounds, tmp / f"fast-cco-{label}")
            gloo = (
                gloo_runs(net, [FAST_SIZE], rounds, mkdir(tmp / f"fast-gloo-{label}")) if have_torch else {}
            )
        runs.append({"network": net.describe(), "cco": cco, "gloo": gloo, "aggregator": usage})
        return cco[FAST_SIZE], gloo.get(FAST_SIZE)

    for gro in (False, True):
        state = "on" if gro else "off"
        cco, gloo = case(None, gro, f"unshaped-gro-{state}")
        name = f"CCO / Gloo: N=4, unshaped, MTU 9000, 64 MiB, GRO {state}"
        targets.append(ratio_target(name, cco, gloo, 3.0, have_torch))
        targets.append(
            cpu_target(
                "  aggregator MB per CPU second (in+out)", cco, "aggregator_mb_per_cpu_second", 600, yardstick
            )
        )
        targets.append(
            cpu_target(
                "  endpoint MB per CPU second (up+down)", cco, "endpoint_mb_per_cpu_second", 300, yardstick
            )
        )
    name, limit = "crossover: highest rate with CCO <= Gloo (N=4, 64 MiB)", ">= 1000 Mbit/s"
    if not have_torch:
        targets.append(Target(name, limit, f"not measured: torch missing ({TORCH_HINT})", None))
        return targets, runs
    highest: float | None = None
    tried = []
    for rate in CROSSOVER_RATES:
        cco, gloo = case(rate, None, f"{rate:.0f}")
        if gloo is None or "failed" in cco or "failed" in gloo:
            tried.append(f"{rate:.0f}: a run failed")
            break
        ratio = cco["median_seconds"] / gloo["median_seconds"]
        tried.append(f"{rate:.0f}: {ratio:.2f}")
        if ratio > 1:
            break
        highest = rate
    below = f"below {CROSSOVER_RATES[0]:.0f} Mbit/s" if highest is None else f"{highest:.0f} Mbit/s"
    figure = f"{below} (CCO / Gloo at {', '.join(tried)})"
    targets.append(Target(name, limit, figure, highest is not None and highest >= 1000))
    return targets, runs


def rate_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """CCO / Gloo against the per-link rate (``--rates``, 'unshaped' last) for each N
    of ``--endpoints``, one size: a table, and a plot under benchmarks/figures/."""
    have_torch = torch_available() and not args.no_gloo
    size = args.sizes[0]
    rows: list[dict[str, Any]] = []
    runs = []
    columns = f"{'N':>3} {'rate':>10} {'CCO s':>9} {'Gloo s':>9} {'CCO/Gloo':>9}"
    print(f"{columns}  MB per CPU s: aggregator, endpoint")
    for endpoints in args.endpoints:
        for rate in args.rates:
            label = "unshaped" if rate is None else f"{rate:g}"
            tmp = mkdir(args.logs / f"n{endpoints}-{label}")
            with network(endpoints, rate, args.mtu, args.queue_ms, args.gro) as net:
                settings = netns.CcoSettings(
                    max_datagram_size=net.datagram,
                    operation_timeout_ms=OPERATION_TIMEOUT_MS,
                    heartbeat_ms=HEARTBEAT_MS,
                    quic_backend=args.quic_backend,
                    nodes_from=args.nodes_from,
                    busy_poll_us=args.busy_poll_us,
                )
                cco, usage = cco_runs(net, [size], args.repeats, tmp / "cco", settings)
                gloo = gloo_runs(net, [size], args.repeats, mkdir(tmp / "gloo")) if have_torch else {}
            runs.append({"network": net.describe(), "cco": cco, "gloo": gloo, "aggregator": usage})
            entry, other = cco[size], gloo.get(size, {})
            row = {"endpoints": endpoints, "rate_mbit": rate, "cco_seconds": entry.get("median_seconds")}
            row["gloo_seconds"] = other.get("median_seconds")
            row["ratio"] = (
                row["cco_seconds"] / row["gloo_seconds"]
                if row["cco_seconds"] and row["gloo_seconds"]
                else None
            )
            row["aggregator_mb_per_cpu_second"] = entry.get("aggregator_mb_per_cpu_second")
            row["endpoint_mb_per_cpu_second"] = entry.get("endpoint_mb_per_cpu_second")
            rows.append(row)
            times = f"{fmt_seconds(row['cco_seconds'])} {fmt_seconds(row['gloo_seconds'])}"
            cpu = f"{fmt_number(row['aggregator_mb_per_cpu_second'], 0, 0)}, "
            cpu += fmt_number(row["endpoint_mb_per_cpu_second"], 0, 0)
            print(f"{endpoints:>3} {label:>10} {times} {fmt_number(row['ratio'], 9, 2)}  {cpu}", flush=True)
    png = plot_by_rate(rows, size, args)
    if png is not None:
        print(f"plot: {png}")
    return {"runs": runs, "points": [], "rate_sweep": rows, "figure": str(png) if png else None}


def fmt_seconds(value: float | None) -> str:
    return f"{value:9.3f}" if value is not None else f"{'-':>9}"


def fmt_number(value: float | None, width: int, decimals: int) -> str:
    return f"{value:{width}.{decimals}f}" if value is not None else "-".rjust(width)


def plot_by_rate(rows: list[dict[str, Any]], size: int, args: argparse.Namespace) -> Path | None:
    """CCO / Gloo against the per-link rate, one line per N; the unshaped star at the
    right end, labelled so."""
    if find_spec("matplotlib") is None or not any(row["ratio"] for row in rows):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = list(dict.fromkeys(row["rate_mbit"] for row in rows))
    labels = ["unshaped" if rate is None else f"{rate:g}" for rate in rates]
    fig, axis = plt.subplots(figsize=(7, 4.5))
    for endpoints in dict.fromkeys(row["endpoints"] for row in rows):
        points = [
            (rates.index(row["rate_mbit"]), row["ratio"]) for row in rows if row["endpoints"] == endpoints
        ]
        points = [(x, y) for x, y in points if y]
        if points:
            axis.plot(*zip(*points, strict=True), "o-", label=f"N = {endpoints}")
    axis.axhline(1.0, color="grey", linestyle="--", label="CCO = Gloo")
    axis.set_xticks(range(len(rates)), labels)
    axis.set_yscale("log")
    axis.set_xlabel("per-link rate, Mbit/s (each way)")
    axis.set_ylabel("CCO time / Gloo time (median)")
    gro = "" if args.gro is None else f", veth GRO {'on' if args.gro else 'off'}"
    axis.set_title(f"all-reduce of {human(size)} float32, MTU {args.mtu}{gro}", fontsize=9)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    fig.tight_layout()
    ns = "".join(str(n) for n in dict.fromkeys(row["endpoints"] for row in rows))
    path = (
        mkdir(HERE / "figures") / f"cco-gloo-by-rate-n{ns}-{human(size).replace(' ', '')}-mtu{args.mtu}.png"
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


# --- main --------------------------------------------------------------------------------------


def rate_arg(text: str) -> float | None:
    """A link rate in Mbit/s, or None for 'unshaped'."""
    if text == "unshaped":
        return None
    rate = float(text)
    if rate <= 0:
        raise argparse.ArgumentTypeError(f"a rate must be positive or 'unshaped', got {text}")
    return rate


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["gloo-worker"]:
        return gloo_worker(argv[1:])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="every target of issue 8, met / missed (< 10 min)"
    )
    parser.add_argument(
        "--loopback", action="store_true", help="127.0.0.1, no namespaces (CPU-bound figures)"
    )
    parser.add_argument(
        "--endpoints", type=int, nargs="+", default=[2, 4, 8], help="N values (default 2 4 8)"
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES, help="bytes per rank")
    parser.add_argument(
        "--rate-mbit",
        type=rate_arg,
        default=40.0,
        help="tbf rate of each link direction, or 'unshaped' (no tbf)",
    )
    parser.add_argument(
        "--rates",
        type=rate_arg,
        nargs="+",
        help="a sweep over per-link rates ('unshaped' for none): CCO / Gloo per rate and N, "
        "a table and a plot under benchmarks/figures/ (one size: the first of --sizes)",
    )
    parser.add_argument(
        "--gro",
        choices=("on", "off"),
        help="veth GRO on both ends of every link (default: the kernel's, off for veth)",
    )
    parser.add_argument("--queue-ms", type=float, default=100.0, help="tbf queue, in ms at the rate")
    parser.add_argument("--mtu", type=int, default=9000, choices=(1500, 9000), help="veth MTU")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per size (median reported)")
    parser.add_argument(
        "--wan-delay-ms", type=float, default=0.0, help="WAN profile: one-way delay (CCO only)"
    )
    parser.add_argument("--wan-loss", type=float, default=0.0, help="WAN profile: loss each way (CCO only)")
    parser.add_argument(
        "--latency-rounds", type=int, default=200, help="rounds of the 8-byte case in --quick"
    )
    parser.add_argument(
        "--quic-backend",
        choices=QUIC_BACKENDS,
        default="qh3",
        help="every CCO node's QUIC implementation, and the bare stream's (default qh3, the nodes' own)",
    )
    parser.add_argument(
        "--busy-poll-us", type=int, help="every CCO node's --busy-poll-us (sweep; default: the nodes')"
    )
    parser.add_argument("--no-gloo", action="store_true", help="CCO alone, even where torch is installed")
    parser.add_argument(
        "--nodes-from",
        type=Path,
        help="a source tree (e.g. a worktree of an older commit) whose cco the nodes run (sweep only)",
    )
    parser.add_argument("--commit", help="commit measured (default: git HEAD of the tree cco comes from)")
    parser.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/run[-quick].json)")
    args = parser.parse_args(argv)
    args.gro = None if args.gro is None else args.gro == "on"
    if args.quick and "--repeats" not in argv:
        args.repeats = 2
    if not args.loopback or args.quick:
        reason = netns.unavailable_reason()
        if reason is not None:
            print(f"run.py: the namespace star is not available: {reason}; use --loopback", file=sys.stderr)
            return 2
    stem = "run-quick" if args.quick else ("run-loopback" if args.loopback else "run")
    stem = "run-rates" if args.rates and not args.quick else stem
    args.logs = RESULTS / f"{stem}-logs"  # kept until the next run of the same kind, for failures
    shutil.rmtree(args.logs, ignore_errors=True)
    mkdir(args.logs)
    header: dict[str, Any] = {
        "command": "python benchmarks/run.py " + " ".join(argv),
        "commit": args.commit or commit_of_cco(),
        "quic_backend": args.quic_backend,
        "arithmetic": kernels.configured(),
    }
    header["machine"] = machine()
    log(
        f"measuring cco at {header['commit']} ({args.quic_backend}, arithmetic on {header['arithmetic']}) "
        f"on {header['machine']['cpu']} x {header['machine']['cores']}"
    )
    mode = quick if args.quick else (rate_sweep if args.rates else sweep)
    report = {**header, **mode(args)}
    out = args.out or RESULTS / f"{stem}.json"
    mkdir(out.parent)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    png = plot(report["points"], out.with_suffix(".png")) if report["points"] else None
    print(f"wrote {out}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
