"""DDP training step time over the namespace star: Gloo against CCO at widths 32, 16 and 8.

    python benchmarks/bench_ddp.py                       # N = 4, 40 Mbit/s per link, MTU 9000
    python benchmarks/bench_ddp.py --steps 4 --json out.json

One run trains the same model (an MLP of 5.3 M parameters, so that gradient traffic
dominates a step) with DDP on N ranks, one process per endpoint namespace of a star
(``support/netns.py``: every rank's traffic crosses its own link, shaped to the rate
each way; the rendezvous and the aggregator sit in the hub): first over Gloo
(``init_process_group("gloo")``, a ring), then over the "cco" backend with the CCO
hook (``cco.torch.hooks``) at widths 32, 16 and 8, all from the same initial model on
the same data.  A step is forward, backward (DDP's all-reduce of the gradient buckets
overlapping it) and the optimizer; its time is the slowest rank's, and the figure is
the median over the timed steps, after ``--warmup`` untimed ones.  The loss is that of
the final model on a held-out batch, after the same number of steps for every backend.

Targets (issue 38): CCO's step at width 32 at most 0.8 x Gloo's, at width 8 at most
0.3 x; the final loss within 1% of Gloo's at every width.  Each rank's CPU seconds
(getrusage: its training thread and, for CCO, the session's) are reported beside, the
figure that holds on a loaded machine; wall-clock figures want a quiet one.  Needs
root (namespaces), torch, and the nodes' settings of ``run.py`` (10-minute operation
timeout, 20 s heartbeats), so that slow steps are measured rather than failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))  # the shared support modules
import netns

from cco.transport import create_dev_pki
from cco.wire.registries import Role

HERE = Path(__file__).resolve()
MASTER_PORT = 29500  # torch's store, in rank 0's namespace
OPERATION_TIMEOUT_MS = 600_000
HEARTBEAT_MS = 20_000
FEATURES, HIDDEN, CLASSES, LATENT = 1024, 2048, 10, 16
TARGETS = {32: 0.8, 8: 0.3}
"""CCO's step time at this width, as a fraction of Gloo's, at most."""
LOSS_TOLERANCE = 0.01
CONFIGS: list[tuple[str, str, int | None]] = [
    ("Gloo", "gloo", None),
    ("CCO width 32", "cco", 32),
    ("CCO width 16", "cco", 16),
    ("CCO width 8", "cco", 8),
]


# --- one rank --------------------------------------------------------------------------------


def worker(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench_ddp.py worker")
    parser.add_argument("--backend", choices=("gloo", "cco"), required=True)
    parser.add_argument("--width", type=int)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import cco.torch  # noqa: F401 - registers the backend
    from cco.torch import hooks

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        args.backend,
        init_method=f"tcp://{args.master}",
        rank=rank,
        world_size=world,
        timeout=timedelta(milliseconds=OPERATION_TIMEOUT_MS),
    )
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, 1024),
        nn.ReLU(),
        nn.Linear(1024, 1024),
        nn.ReLU(),
        nn.Linear(1024, CLASSES),
    )
    # inputs of a few latent dimensions, labelled by a linear teacher: a task the model
    # learns within the steps timed, so that the losses compared have moved
    mix = torch.randn(LATENT, FEATURES) / LATENT**0.5
    teacher = nn.Linear(LATENT, CLASSES)
    ddp = DistributedDataParallel(model)
    if args.width is not None:
        ddp.register_comm_hook(hooks.CcoHookState(width=args.width), hooks.allreduce_hook)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=3e-4)
    data = torch.Generator().manual_seed(100 + rank)

    def batch(size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        latent = torch.randn(size, LATENT, generator=gen)
        with torch.no_grad():
            return latent @ mix, teacher(latent).argmax(1)

    seconds, cpu = [], 0.0
    for step in range(args.warmup + args.steps):
        x, y = batch(args.batch, data)
        if step == args.warmup:
            before = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        loss = nn.functional.cross_entropy(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seconds.append(time.perf_counter() - started)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    held_out = batch(2048, torch.Generator().manual_seed(999))
    with torch.no_grad():
        final = nn.functional.cross_entropy(model(held_out[0]), held_out[1]).item()
    parameters = sum(p.numel() for p in model.parameters())
    report = {
        "seconds": seconds[args.warmup :],
        "final_loss": final,
        "cpu_seconds": cpu,
        "parameters": parameters,
    }
    args.out.write_text(json.dumps(report))
    dist.destroy_process_group()
    return 0


# --- the run ---------------------------------------------------------------------------------


def run_config(
    star: netns.Star,
    cluster: netns.CcoCluster,
    workdir: Path,
    name: str,
    backend: str,
    width: int | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """All ranks of one configuration; the slowest rank's step times and rank 0's loss."""
    tag = name.lower().replace(" ", "-")
    master = f"{netns.Star.endpoint_address(0)}:{MASTER_PORT}"
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "eth0",
        "OMP_NUM_THREADS": "1",
        "CCO_RENDEZVOUS": cluster.rendezvous,
        "CCO_PKI_DIR": str(cluster.pki),
        "CCO_MAX_DATAGRAM_SIZE": str(netns.quic_datagram_size(args.mtu)),
        "WORLD_SIZE": str(args.endpoints),
    }
    env.pop("CCO_CONFIG", None)
    processes = []
    for rank in range(args.endpoints):
        out = workdir / f"{tag}-{rank}.json"
        argv = [sys.executable, str(HERE), "worker", "--backend", backend, "--steps", str(args.steps)]
        argv += [
            "--warmup",
            str(args.warmup),
            "--batch",
            str(args.batch),
            "--master",
            master,
            "--out",
            str(out),
        ]
        argv += ["--width", str(width)] if width is not None else []
        log = open(workdir / f"{tag}-{rank}.log", "w")  # noqa: SIM115 - the child owns it
        process = star.popen(
            star.endpoint_ns[rank], argv, env={**env, "RANK": str(rank)}, stdout=log, stderr=subprocess.STDOUT
        )
        processes.append((out, process))
        log.close()
    print(f"  {name}: {args.endpoints} ranks, {args.warmup} + {args.steps} steps", flush=True)
    deadline = time.monotonic() + args.timeout
    failed = []
    try:
        for rank, (_, process) in enumerate(processes):
            try:
                code = process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                failed.append(f"rank {rank} did not finish within {args.timeout:.0f} s")
                continue
            if code != 0:
                lines = (workdir / f"{tag}-{rank}.log").read_text(errors="replace").strip().splitlines()
                failed.append(f"rank {rank} exited with {code}: {' | '.join(lines[-3:])}")
    finally:
        for _, process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    if failed:
        print(f"  {name} FAILED: {'; '.join(failed)}", flush=True)
        return {"failed": "; ".join(failed)}
    reports = [json.loads(out.read_text()) for out, _ in processes]
    slowest = [max(steps) for steps in zip(*(r["seconds"] for r in reports), strict=True)]
    return {
        "step_seconds": slowest,
        "median_step_seconds": statistics.median(slowest),
        "final_loss": reports[0]["final_loss"],
        "cpu_seconds_per_rank": [r["cpu_seconds"] for r in reports],
        "parameters": reports[0]["parameters"],
    }


def verdicts(results: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, bool | None]]:
    """(name, figure, target, met) rows: step time ratios and loss differences against Gloo."""
    gloo = results["Gloo"]
    rows: list[tuple[str, str, str, bool | None]] = []
    for name, _, width in CONFIGS[1:]:
        cco = results[name]
        if "failed" in cco or "failed" in gloo:
            rows.append((name, "not measured", "", False))
            continue
        ratio = cco["median_step_seconds"] / gloo["median_step_seconds"]
        limit = TARGETS.get(width or 0)
        target = f"<= {limit} x Gloo" if limit is not None else "(no target)"
        rows.append(
            (f"{name} step time", f"{ratio:.2f} x Gloo", target, None if limit is None else ratio <= limit)
        )
        difference = abs(cco["final_loss"] - gloo["final_loss"]) / gloo["final_loss"]
        rows.append(
            (
                f"{name} final loss",
                f"{100 * difference:.2f}% from Gloo's",
                "<= 1%",
                difference <= LOSS_TOLERANCE,
            )
        )
    return rows


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        return worker(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument("--rate-mbit", type=float, default=40.0)
    parser.add_argument("--mtu", type=int, default=9000, choices=(1500, 9000))
    parser.add_argument("--steps", type=int, default=8, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one configuration may take")
    parser.add_argument(
        "--json",
        type=Path,
        default=HERE.parent / "results" / "bench_ddp.json",
        help="JSON path (default %(default)s)",
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/cco-bench-ddp"))
    args = parser.parse_args()
    reason = netns.unavailable_reason()
    if reason is not None:
        print(f"bench_ddp: {reason}", file=sys.stderr)
        return 2
    args.workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    star_text = f"star N = {args.endpoints}, {args.rate_mbit:g} Mbit/s, MTU {args.mtu}"
    print(f"load average {load_before[0]:.2f}; {star_text}")
    settings = netns.CcoSettings(
        max_datagram_size=netns.quic_datagram_size(args.mtu),
        operation_timeout_ms=OPERATION_TIMEOUT_MS,
        heartbeat_ms=HEARTBEAT_MS,
    )
    spec = netns.StarSpec(endpoints=args.endpoints, rate_mbit=args.rate_mbit, mtu=args.mtu)
    results: dict[str, dict[str, Any]] = {}
    with (
        netns.Star(spec) as star,
        netns.CcoCluster(star, args.workdir / "cco", args.endpoints, settings) as cluster,
    ):
        cluster.start()
        create_dev_pki(cluster.pki, [(f"ep-{rank}", Role.ENDPOINT) for rank in range(args.endpoints)])
        for name, backend, width in CONFIGS:
            results[name] = run_config(star, cluster, args.workdir, name, backend, width, args)
    load_after = os.getloadavg()
    print(f"\n{'configuration':<16} {'median step':>12} {'final loss':>11} {'CPU s/rank':>11}")
    for name, result in results.items():
        if "failed" in result:
            print(f"{name:<16} {'FAILED':>12}")
            continue
        cpu = statistics.mean(result["cpu_seconds_per_rank"])
        line = (
            f"{name:<16} {result['median_step_seconds']:>10.2f} s {result['final_loss']:>11.4f} {cpu:>11.1f}"
        )
        print(line)
    print()
    rows = verdicts(results)
    for name, figure, target, met in rows:
        mark = "" if met is None else ("  met" if met else "  MISSED")
        print(f"{name:<28} {figure:<22} {target:<16}{mark}")
    loads = f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    print(f"{loads} (wall-clock figures want a quiet machine)")
    record = {
        "benchmark": "bench_ddp",
        "machine": platform.node(),
        "star": {"endpoints": args.endpoints, "rate_mbit": args.rate_mbit, "mtu": args.mtu},
        "steps": args.steps,
        "warmup": args.warmup,
        "batch": args.batch,
        "load_average": [load_before[0], load_after[0]],
        "results": results,
        "targets": [{"name": n, "figure": f, "target": t, "met": m} for n, f, t, m in rows],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2))
    print(f"wrote {args.json}")
    return 0 if all(met is not False for *_, met in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
