"""Run the examples over Gloo and over CCO, four processes each, and plot the loss curves.

    python examples/compare.py                 # writes examples/figures/ddp_loss.png and diloco_loss.png

It brings up a standalone CCO job (:mod:`cco.standalone`) on loopback, runs
``ddp_train.py`` under torchrun over Gloo, over CCO, and over CCO with the hook at
width 8, then ``diloco.py`` over Gloo and over CCO at widths 16 and 8, and plots each
group of curves in one figure.  Needs matplotlib.  The figures are about the losses
agreeing; how long a step takes over slow links is ``benchmarks/bench_ddp.py``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from cco.standalone import Standalone, StandaloneSpec

HERE = Path(__file__).resolve().parent


def torchrun(script: str, ranks: int, env: dict[str, str], *args: str) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    subprocess.run([*command, str(HERE / script), *args], env=env, check=True)


def plot(runs: list[tuple[str, dict[str, object]]], title: str, xlabel: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    for label, record in runs:
        losses = record["losses"]
        assert isinstance(losses, list)
        axes.plot(range(1, len(losses) + 1), losses, label=label)
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel("cross-entropy loss, mean over ranks")
    axes.set_yscale("log")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300, help="DDP steps")
    parser.add_argument("--rounds", type=int, default=30, help="DiLoCo outer steps")
    parser.add_argument("--out", type=Path, default=HERE / "figures")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cco-examples-") as tmp:
        work = Path(tmp)
        spec = StandaloneSpec(directory=work / "job", listen="127.0.0.1:0", endpoints=args.ranks)
        with Standalone(spec) as services:
            env = {**os.environ, **services.start().environment(), "OMP_NUM_THREADS": "1"}
            ddp: list[tuple[str, dict[str, object]]] = []
            for label, extra in (
                ("Gloo", ["--backend", "gloo"]),
                ("CCO", []),
                ("CCO, hook at width 8", ["--width", "8"]),
            ):
                out = work / f"ddp-{len(ddp)}.json"
                torchrun(
                    "ddp_train.py", args.ranks, env, *extra, "--steps", str(args.steps), "--out", str(out)
                )
                ddp.append((label, json.loads(out.read_text())))
            diloco: list[tuple[str, dict[str, object]]] = []
            for label, extra in (
                ("Gloo (float32)", ["--backend", "gloo"]),
                ("CCO, width 16", ["--width", "16"]),
                ("CCO, width 8", ["--width", "8"]),
            ):
                out = work / f"diloco-{len(diloco)}.json"
                torchrun(
                    "diloco.py", args.ranks, env, *extra, "--rounds", str(args.rounds), "--out", str(out)
                )
                diloco.append((label, json.loads(out.read_text())))
    plot(ddp, f"DDP, {args.ranks} ranks on one machine", "step", args.out / "ddp_loss.png")
    plot(
        diloco,
        f"DiLoCo-style, {args.ranks} ranks, 20 local steps per round",
        "outer step",
        args.out / "diloco_loss.png",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
