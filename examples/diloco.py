"""DiLoCo-style training: local steps, then an outer all-reduce of the parameter deltas.

    cco-node standalone -- torchrun --nproc-per-node 4 examples/diloco.py --backend cco --width 8
    torchrun --nproc-per-node 4 examples/diloco.py --backend gloo

The setting of training across slow links: each rank takes ``--local-steps`` steps of
its own optimizer (AdamW) on its own data with no communication at all, then the ranks
average how far they moved from the shared parameters (the outer gradient) in one
all-reduce, and an outer optimizer (SGD with Nesterov momentum) applies it to the
shared parameters, which every rank then starts from again.

Over CCO the outer all-reduce runs at ``--width`` bits per element (the process group's
``cco.torch.Options(width=...)``): exact, deterministic compression, so every rank holds
bit-identical shared parameters after each round, with the average within the bound of
:mod:`cco.torch.hooks` of the exact one; at width 8 the outer all-reduce moves a quarter
of float32's bytes.  Over Gloo it runs in float32.  Rank 0 prints the loss of the shared
model after each outer step and, with ``--out``, writes the curve as JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from ddp_train import model, shard
from torch import nn

import cco.torch


def flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cco", "gloo"), default="cco")
    parser.add_argument(
        "--width", type=int, choices=(8, 16, 32), default=8, help="outer all-reduce width (cco)"
    )
    parser.add_argument("--rounds", type=int, default=30, help="outer steps")
    parser.add_argument("--local-steps", type=int, default=20, help="inner steps between outer steps")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out", type=Path, help="write the loss curve (rank 0) as JSON here")
    args = parser.parse_args()

    torch.set_num_threads(1)
    options = cco.torch.Options(width=args.width) if args.backend == "cco" else None
    dist.init_process_group(args.backend, pg_options=options)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    shared = model()  # the same start everywhere
    local = copy.deepcopy(shared)
    inner = torch.optim.AdamW(local.parameters(), lr=1e-3)
    outer = torch.optim.SGD(shared.parameters(), lr=0.7, momentum=0.5, nesterov=True)
    inputs, labels = shard(rank, 8192)
    held_out = shard(10_000 + rank, 1024)
    order = torch.Generator().manual_seed(100 + rank)
    losses, started = [], time.perf_counter()
    for round_ in range(args.rounds):
        for _ in range(args.local_steps):
            pick = torch.randint(0, len(inputs), (args.batch,), generator=order)
            loss = nn.functional.cross_entropy(local(inputs[pick]), labels[pick])
            inner.zero_grad()
            loss.backward()
            inner.step()
        delta = flat(shared) - flat(local)  # the outer gradient: how far this rank moved
        if args.backend == "cco":
            dist.all_reduce(delta, op=dist.ReduceOp.AVG)  # at --width bits per element
        else:
            dist.all_reduce(delta)
            delta /= world
        offset = 0
        for parameter in shared.parameters():
            parameter.grad = delta[offset : offset + parameter.numel()].view_as(parameter).clone()
            offset += parameter.numel()
        outer.step()
        local.load_state_dict(shared.state_dict())
        with torch.no_grad():
            mean = nn.functional.cross_entropy(shared(held_out[0]), held_out[1]).reshape(1)
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
        if rank == 0:
            print(f"round {round_:3d}  loss {losses[-1]:.4f}", flush=True)
    seconds = time.perf_counter() - started
    if rank == 0 and args.out is not None:
        width = args.width if args.backend == "cco" else 32
        record = {"backend": args.backend, "width": width, "losses": losses, "seconds": seconds}
        args.out.write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
