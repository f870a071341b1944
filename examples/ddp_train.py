"""DDP training of a small classifier on synthetic data, over Gloo or over CCO.

    cco-node standalone -- torchrun --nproc-per-node 4 examples/ddp_train.py --backend cco
    cco-node standalone -- torchrun --nproc-per-node 4 examples/ddp_train.py --backend cco --width 8
    torchrun --nproc-per-node 4 examples/ddp_train.py --backend gloo

The script is a plain DDP script: only the backend's name changes, and ``import
cco.torch`` registers it.  ``--width`` averages the gradient buckets through the CCO
hook at that many bits per element (:mod:`cco.torch.hooks`); without it DDP's own
all-reduce runs over the "cco" group at float32's own width.  Every rank trains on its
own shard of a synthetic data set (labels from a fixed random "teacher" network); rank
0 prints the loss averaged over the ranks and, with ``--out``, writes the curve as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import cco.torch  # noqa: F401 - registers the "cco" backend
from cco.torch import hooks

FEATURES, CLASSES = 64, 10


def model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, CLASSES)
    )


def shard(rank: int, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's data: inputs of its own, labels from the teacher every rank shares."""
    torch.manual_seed(1234)
    teacher = nn.Sequential(nn.Linear(FEATURES, 128), nn.Tanh(), nn.Linear(128, CLASSES))
    inputs = torch.randn(samples, FEATURES, generator=torch.Generator().manual_seed(rank))
    with torch.no_grad():
        labels = teacher(inputs).argmax(1)
    return inputs, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cco", "gloo"), default="cco")
    parser.add_argument(
        "--width", type=int, choices=(8, 16, 32), help="average gradients through the CCO hook"
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out", type=Path, help="write the loss curve (rank 0) as JSON here")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial model everywhere (DDP also broadcasts rank 0's)
    ddp = DistributedDataParallel(model())
    if args.width is not None:
        ddp.register_comm_hook(hooks.CcoHookState(width=args.width), hooks.allreduce_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    inputs, labels = shard(rank, 8192)
    order = torch.Generator().manual_seed(100 + rank)
    losses, started = [], time.perf_counter()
    for step in range(args.steps):
        pick = torch.randint(0, len(inputs), (args.batch,), generator=order)
        loss = nn.functional.cross_entropy(ddp(inputs[pick]), labels[pick])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mean = loss.detach().reshape(1)
        dist.all_reduce(mean)  # SUM: Gloo has no AVG
        losses.append(mean.item() / world)
        if rank == 0 and (step % 50 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {losses[-1]:.4f}", flush=True)
    seconds = time.perf_counter() - started
    if rank == 0 and args.out is not None:
        record = {"backend": args.backend, "width": args.width, "losses": losses, "seconds": seconds}
        args.out.write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
