"""One rank of a tests/torch run: ``torch_worker.py PHASE --out FILE [options]``.

Phases (each a few checks, reported as JSON ``{"checks": [{"name", "ok", "detail"}]}``):

* ``ops``: every collective the backend serves against Gloo's result on the same
  inputs (a Gloo group beside the "cco" one): bit-identical for integers, MIN, MAX and
  moved data, within the documented bound for float sums; async work, coalesced and
  functional forms, in-place all-gather, non-finite inputs, refused ops;
* ``ddp``: 20 SGD steps of DDP over Gloo, then over CCO without a hook and with the
  hook at widths 32, 16 and 8: parameters identical on every rank and within the
  documented bound of Gloo's run; a GradScaler step skipped on every rank when one
  rank's gradient overflows;
* ``fsdp``: a fully_shard model trains a few steps on CPU (``train``: both);
* ``init``: init_process_group("cco") with the init method given;
* ``stripes``: the default group with ``Options(stripes=2)`` against a new group with
  one stripe: all-reduce and DDP steps (buckets large enough to be cut) bit-identical.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.distributed_c10d import _coalescing_manager
from torch.nn.parallel import DistributedDataParallel

import cco.torch
from cco.client.striped import MIN_STRIPE_ELEMENTS
from cco.torch import hooks
from cco.wire.blockscale import DEFAULT_BLOCK_ELEMENTS
from cco.wire.registries import ReduceOp as CcoOp

UNIT = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24, torch.float64: 2.0**-53}
OWN_WIDTH = {torch.float16: 16, torch.bfloat16: 16, torch.float32: 32, torch.float64: 64}
FLOATS = list(UNIT)
INTS = {torch.int8: 30, torch.int16: 8000, torch.int32: 1 << 28, torch.int64: 1 << 50}
"""Integer types and the magnitude of their inputs (sums of four stay in range)."""
MOVED = [*FLOATS, *INTS, torch.uint8, torch.bool]


class Checks:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, name: str, ok: bool, detail: str = "") -> None:
        self.items.append({"name": name, "ok": bool(ok), "detail": detail})

    def run(self, name: str, check: Callable[[], tuple[bool, str]]) -> None:
        try:
            ok, detail = check()
        except Exception as exc:
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        self.add(name, ok, detail)


# --- inputs and references ---------------------------------------------------------------


def values(dtype: torch.dtype, n: int, rank: int, seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input: the same on every run, different on every rank; floats span
    several magnitudes, so blocks have different scales."""
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype.is_floating_point:
        scale = torch.logspace(-3, 3, n, dtype=torch.float64)[torch.randperm(n, generator=gen)]
        return (torch.randn(n, generator=gen, dtype=torch.float64) * scale).to(dtype)
    if dtype is torch.bool:
        return torch.randint(0, 2, (n,), generator=gen).bool()
    if dtype is torch.uint8:
        return torch.randint(0, 256, (n,), generator=gen).to(torch.uint8)
    limit = INTS[dtype]
    return torch.randint(-limit, limit, (n,), generator=gen, dtype=torch.int64).to(dtype)


def gathered(tensor: torch.Tensor, gloo: dist.ProcessGroup) -> list[torch.Tensor]:
    """Every rank's ``tensor``, through Gloo as bytes (Gloo has no int16, for one)."""
    data = tensor.contiguous().reshape(-1).view(torch.uint8)
    rows = [torch.empty_like(data) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, data, group=gloo)
    return [row.view(tensor.dtype).reshape(tensor.shape) for row in rows]


def sum_bound(inputs: list[torch.Tensor], width: int, dtype: torch.dtype) -> torch.Tensor:
    """How far CCO's sum may lie from Gloo's, per element: CCO's block bound
    (:func:`cco.torch.hooks.error_bound` x contributors x the block's largest |x|), CCO's
    one rounding to the dtype, and Gloo's rounding at each of its additions."""
    stack = torch.stack([x.double().reshape(-1) for x in inputs])
    world, n = stack.shape
    largest = stack.abs().max(0).values
    blocks = -(-n // DEFAULT_BLOCK_ELEMENTS)
    padded = torch.zeros(blocks * DEFAULT_BLOCK_ELEMENTS, dtype=torch.float64)
    padded[:n] = largest
    block_max = padded.view(blocks, -1).max(1).values.repeat_interleave(DEFAULT_BLOCK_ELEMENTS)[:n]
    unit = UNIT[dtype]
    cco = hooks.error_bound(width, world) * world * block_max + 2 * unit * stack.sum(0).abs()
    return cco + (world + 1) * unit * stack.abs().sum(0)


def within(result: torch.Tensor, reference: torch.Tensor, bound: torch.Tensor) -> tuple[bool, str]:
    error = (result.double() - reference.double()).abs()
    worst = int(torch.argmax(error / bound.clamp_min(1e-300)))
    ok = bool((error <= bound).all())
    return ok, f"worst element {worst}: error {error[worst].item():.3g}, bound {bound[worst].item():.3g}"


def same(result: torch.Tensor, reference: torch.Tensor) -> tuple[bool, str]:
    if torch.equal(result, reference):
        return True, ""
    differ = (result != reference).nonzero()
    return False, f"{len(differ)} elements differ, first at {differ[0].tolist()}: {result.reshape(-1)[0]} ..."


def gloo_or(reference: Callable[[], torch.Tensor], gloo: Callable[[], torch.Tensor]) -> torch.Tensor:
    """Gloo's result; for what Gloo does not serve (bitwise ops on bool, say), the
    reference computed from the gathered inputs."""
    try:
        return gloo()
    except RuntimeError:
        return reference()


def reduce_local(rows: list[torch.Tensor], op: dist.ReduceOp) -> torch.Tensor:
    stack = torch.stack(rows)
    if op == dist.ReduceOp.SUM:
        return stack.sum(0, dtype=stack.dtype)
    if op == dist.ReduceOp.MIN:
        return stack.min(0).values
    if op == dist.ReduceOp.MAX:
        return stack.max(0).values
    result = rows[0].clone()
    for row in rows[1:]:
        if op == dist.ReduceOp.BAND:
            result &= row
        elif op == dist.ReduceOp.BOR:
            result |= row
        else:
            result ^= row
    return result


# --- phase: every op against Gloo ---------------------------------------------------------


def phase_ops(checks: Checks, args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    sum_, min_, max_ = dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX
    bitwise = [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]

    def all_reduce(dtype: torch.dtype, op: dist.ReduceOp, n: int) -> tuple[bool, str]:
        mine = values(dtype, n, rank)
        rows = gathered(mine, gloo)
        ours = mine.clone()
        dist.all_reduce(ours, op=op)

        def by_gloo() -> torch.Tensor:
            theirs = mine.clone()
            dist.all_reduce(theirs, op=op, group=gloo)
            return theirs

        reference = gloo_or(lambda: reduce_local(rows, op), by_gloo)
        if dtype.is_floating_point and op == sum_:
            return within(ours, reference, sum_bound(rows, OWN_WIDTH[dtype], dtype))
        return same(ours, reference)

    for dtype in FLOATS:
        for n in (5, 3000):  # a few elements (exact limbs) and block-scaled chunks
            checks.run(f"all_reduce SUM {dtype} x{n}", lambda d=dtype, n=n: all_reduce(d, sum_, n))
        for op in (min_, max_):
            checks.run(f"all_reduce {op} {dtype}", lambda d=dtype, op=op: all_reduce(d, op, 3000))
    for dtype in INTS:
        for op in (sum_, min_, max_, *bitwise):
            checks.run(f"all_reduce {op} {dtype}", lambda d=dtype, op=op: all_reduce(d, op, 3000))
    for dtype in (torch.uint8, torch.bool):
        for op in bitwise:
            checks.run(f"all_reduce {op} {dtype}", lambda d=dtype, op=op: all_reduce(d, op, 1000))
    checks.run("all_reduce MAX bool", lambda: all_reduce(torch.bool, max_, 1000))

    def average(dtype: torch.dtype) -> tuple[bool, str]:
        mine = values(dtype, 3000, rank)
        rows = gathered(mine, gloo)
        ours = mine.clone()
        dist.all_reduce(ours, op=dist.ReduceOp.AVG)
        theirs = mine.double()
        dist.all_reduce(theirs, group=gloo)  # Gloo has no AVG: its float64 sum, divided
        bound = sum_bound(rows, OWN_WIDTH[dtype], dtype) / world + UNIT[dtype] * theirs.abs() / world
        return within(ours, theirs / world, bound)

    for dtype in FLOATS:
        checks.run(f"all_reduce AVG {dtype}", lambda d=dtype: average(d))

    def widths(width: int) -> tuple[bool, str]:
        pg = dist.group.WORLD
        assert isinstance(pg, cco.torch.ProcessGroupCCO)
        mine = values(torch.float32, 5000, rank, seed=width)
        rows = gathered(mine, gloo)
        ours = mine.clone()
        pg.allreduce_future(ours, CcoOp.AVG, width=width, nonfinite="propagate").wait()
        exact = torch.stack([r.double() for r in rows]).mean(0)
        bound = sum_bound(rows, width, torch.float32) / world
        return within(ours, exact, bound)

    for width in (32, 16, 8):
        checks.run(f"all_reduce AVG at width {width} (the hook's)", lambda w=width: widths(w))

    def reduce(dtype: torch.dtype, op: dist.ReduceOp) -> tuple[bool, str]:
        root = world - 1
        mine = values(dtype, 2000, rank, seed=2)
        rows = gathered(mine, gloo)
        ours, theirs = mine.clone(), mine.clone()
        dist.reduce(ours, root, op=op)
        dist.reduce(theirs, root, op=op, group=gloo)
        if rank != root:
            return same(ours, mine)  # not the root: its tensor is left as it was
        reference = theirs
        if dtype.is_floating_point and op == sum_:
            return within(ours, reference, sum_bound(rows, OWN_WIDTH[dtype], dtype))
        return same(ours, reference)

    for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.int64):
        for op in (sum_, max_):
            checks.run(f"reduce {op} {dtype}", lambda d=dtype, op=op: reduce(d, op))

    def broadcast(dtype: torch.dtype) -> tuple[bool, str]:
        root = 1 % world
        ours = values(dtype, 1500, rank, seed=3)
        theirs = ours.clone()
        dist.broadcast(ours, root)
        dist.broadcast(theirs.view(torch.uint8), root, group=gloo)  # as bytes: every dtype
        return same(ours, theirs)

    def all_gather(dtype: torch.dtype) -> tuple[bool, str]:
        mine = values(dtype, 700, rank, seed=4).reshape(7, 100)
        ours = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(ours, mine)
        into = torch.empty((world * 7, 100), dtype=dtype)
        dist.all_gather_into_tensor(into, mine)
        theirs = gathered(mine, gloo)
        ok, detail = same(torch.stack(ours), torch.stack(theirs))
        return (ok and torch.equal(into, torch.cat(theirs))), detail

    for dtype in MOVED:
        checks.run(f"broadcast {dtype}", lambda d=dtype: broadcast(d))
        checks.run(f"all_gather {dtype}", lambda d=dtype: all_gather(d))

    def reduce_scatter(dtype: torch.dtype, op: dist.ReduceOp, form: str) -> tuple[bool, str]:
        mine = values(dtype, world * 600, rank, seed=5)
        rows = gathered(mine, gloo)
        ours = torch.empty(600, dtype=dtype)
        if form == "tensor":
            dist.reduce_scatter_tensor(ours, mine, op=op)
        else:
            dist.reduce_scatter(ours, list(mine.chunk(world)), op=op)
        part = slice(rank * 600, (rank + 1) * 600)

        def by_gloo() -> torch.Tensor:
            theirs = torch.empty(600, dtype=dtype)
            dist.reduce_scatter_tensor(theirs, mine.clone(), op=op, group=gloo)
            return theirs

        reference = gloo_or(lambda: reduce_local(rows, op)[part], by_gloo)
        if dtype.is_floating_point and op == sum_:
            return within(ours, reference, sum_bound([r[part] for r in rows], OWN_WIDTH[dtype], dtype))
        return same(ours, reference)

    for form in ("tensor", "list"):
        for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32):
            checks.run(
                f"reduce_scatter ({form}) SUM {dtype}", lambda d=dtype, f=form: reduce_scatter(d, sum_, f)
            )
        checks.run(
            f"reduce_scatter ({form}) MIN float32", lambda f=form: reduce_scatter(torch.float32, min_, f)
        )

    def coalesced() -> tuple[bool, str]:
        a, b = values(torch.float32, 300, rank), values(torch.int64, 50, rank)
        rows_a, rows_b = gathered(a, gloo), gathered(b, gloo)
        ours = [a.clone(), a[:100].clone()]  # one dtype per coalesced all-reduce, as torch asks
        dist.all_reduce_coalesced(ours)
        ok_a, detail = within(ours[0], torch.stack(rows_a).sum(0), sum_bound(rows_a, 32, torch.float32))
        heads = [r[:100] for r in rows_a]
        ok_b, _ = within(ours[1], torch.stack(heads).sum(0), sum_bound(heads, 32, torch.float32))
        outs = [torch.empty(world * 300), torch.empty(world * 50, dtype=torch.int64)]
        scattered = [torch.empty(300 // world), torch.empty(50, dtype=torch.int64)]
        with _coalescing_manager(async_ops=True) as manager:
            dist.all_gather_into_tensor(outs[0], a)
            dist.all_gather_into_tensor(outs[1], b)
        manager.wait()
        with _coalescing_manager(async_ops=True) as manager:
            dist.reduce_scatter_tensor(scattered[0], a)
            dist.reduce_scatter_tensor(scattered[1], torch.cat([b] * world))
        manager.wait()
        ok_g = torch.equal(outs[0], torch.cat(rows_a)) and torch.equal(outs[1], torch.cat(rows_b))
        part = slice(rank * (300 // world), (rank + 1) * (300 // world))
        ok_s = bool((scattered[0] - torch.stack(rows_a).sum(0)[part]).abs().max() < 1e-3)
        ok_s = ok_s and torch.equal(scattered[1], torch.stack(rows_b).sum(0))
        lists = [[torch.empty_like(a) for _ in range(world)], [torch.empty(100) for _ in range(world)]]
        dist.all_gather_coalesced(lists, [a, a[:100]])  # one dtype, as torch asks
        pairs = zip([*lists[0], *lists[1]], [*rows_a, *heads], strict=True)
        ok_l = all(torch.equal(x, y) for x, y in pairs)
        based = torch.empty(world * 50, dtype=torch.int64)
        dist._all_gather_base(based, b)  # the older names, which some callers still use
        base_scattered = torch.empty(50, dtype=torch.int64)
        dist._reduce_scatter_base(base_scattered, torch.cat([b] * world))
        ok_base = torch.equal(based, torch.cat(rows_b)) and torch.equal(
            base_scattered, torch.stack(rows_b).sum(0)
        )
        ok = ok_a and ok_b and ok_g and ok_s and ok_l and ok_base
        return ok, f"{detail}; gathers {ok_g}, scatters {ok_s}, lists {ok_l}, older names {ok_base}"

    checks.run("coalesced and older forms of all_reduce, all_gather and reduce_scatter", coalesced)

    def functional() -> tuple[bool, str]:
        mine = values(torch.int32, 40, rank)
        rows = gathered(mine, gloo)
        gathered_ = funcol.all_gather_tensor(mine, 0, dist.group.WORLD)
        summed = funcol.all_reduce(mine, "sum", dist.group.WORLD)
        scattered = funcol.reduce_scatter_tensor(torch.cat([mine] * world), "sum", 0, dist.group.WORLD)
        total = torch.stack(rows).sum(0, dtype=torch.int32)
        ok = torch.equal(funcol.wait_tensor(gathered_), torch.cat(rows))
        ok = ok and torch.equal(funcol.wait_tensor(summed), total)
        return ok and torch.equal(funcol.wait_tensor(scattered), total), ""

    checks.run("functional collectives", functional)

    def asynchronous() -> tuple[bool, str]:
        mine = values(torch.int64, 100, rank)
        ours = mine.clone()
        work = dist.all_reduce(ours, async_op=True)
        barrier = dist.barrier(async_op=True)
        work.wait()
        barrier.wait()
        value = work.get_future().value()
        total = torch.stack(gathered(mine, gloo)).sum(0)
        return torch.equal(ours, total) and value[0] is ours and work.is_completed(), ""

    checks.run("async_op=True: Work, future and barrier", asynchronous)

    def gather_in_place() -> tuple[bool, str]:
        mine = values(torch.float32, 64, rank)
        output = torch.zeros(world * 64)
        inside = output.narrow(0, rank * 64, 64)
        inside.copy_(mine)
        dist.all_gather_into_tensor(output, inside)  # FSDP2 gathers from inside its output
        return same(output, torch.cat(gathered(mine, gloo)))

    checks.run("all_gather_into_tensor from inside its output", gather_in_place)

    def nonfinite(op: dist.ReduceOp, bad: float) -> tuple[bool, str]:
        mine = values(torch.float32, 3000, rank)
        if rank == 1:
            mine[17] = bad
        ours = mine.clone()
        dist.all_reduce(ours, op=op)
        if op == max_ and not math.isnan(bad):  # inf is a value MAX carries
            return same(ours, torch.stack(gathered(mine, gloo)).max(0).values)
        return bool(ours.isnan().all()), f"{int(ours.isnan().sum())} of {ours.numel()} elements NaN"

    checks.run("SUM with inf on one rank: NaN on every rank", lambda: nonfinite(sum_, math.inf))
    checks.run("SUM with NaN on one rank: NaN on every rank", lambda: nonfinite(sum_, math.nan))
    checks.run("MAX with inf on one rank: exact", lambda: nonfinite(max_, math.inf))
    checks.run("MAX with NaN on one rank: NaN on every rank", lambda: nonfinite(max_, math.nan))

    def failed_in_place() -> tuple[bool, str]:
        mine = torch.ones(3000, dtype=torch.float16)
        mine[1024:1536] = 60000  # summed over the ranks: past float16's range
        ours = mine.clone()
        try:
            dist.all_reduce(ours)
        except Exception as exc:  # the call fails; the tensor holds its input again
            return "OVERFLOW" in str(exc) and torch.equal(ours, mine), str(exc)
        return False, "did not fail"

    checks.run("a failed in-place all_reduce leaves its input", failed_in_place)

    def refused(name: str, call: Callable[[], object]) -> tuple[bool, str]:
        try:
            call()
        except Exception as exc:
            return name in str(exc), str(exc)
        return False, "not refused"

    t = torch.ones(world * 2)
    checks.run(
        "all_to_all refused", lambda: refused("all_to_all", lambda: dist.all_to_all_single(t.clone(), t))
    )
    checks.run("send refused", lambda: refused("send", lambda: dist.send(t, (rank + 1) % world)))
    checks.run("recv refused", lambda: refused("recv", lambda: dist.recv(t, (rank + 1) % world)))
    checks.run(
        "gather refused", lambda: refused("gather", lambda: dist.gather(t, None if rank else [t] * world))
    )
    checks.run(
        "scatter refused",
        lambda: refused("scatter", lambda: dist.scatter(t, [t] * world if not rank else None)),
    )
    checks.run(
        "PRODUCT refused", lambda: refused("PRODUCT", lambda: dist.all_reduce(t, op=dist.ReduceOp.PRODUCT))
    )
    premul = dist._make_nccl_premul_sum(2.0)
    checks.run("PREMUL_SUM refused", lambda: refused("PREMUL_SUM", lambda: dist.all_reduce(t, op=premul)))
    dist.barrier()  # nothing above left a collective half-called


# --- phase: DDP ---------------------------------------------------------------------------

STEPS, LR = 20, 0.05


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))


def batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(16, 32, generator=gen)
    return x, torch.sin(x[:, :4].sum(1, keepdim=True))


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def train_ddp(group: dist.ProcessGroup | None, hook: Callable[..., Any] | None, state: Any) -> torch.Tensor:
    model = make_model()
    ddp = DistributedDataParallel(model, process_group=group)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(STEPS):
        x, y = batch(gen)
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
    return flat(model)


def phase_ddp(checks: Checks, args: argparse.Namespace) -> None:
    world = dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    largest: list[float] = []

    def recording(group, bucket):  # type: ignore[no-untyped-def]  # DDP checks real annotations, not text
        largest.append(bucket.buffer().abs().max().item())  # a rank's own gradients, before averaging
        return default_hooks.allreduce_hook(group, bucket)

    reference = train_ddp(gloo, recording, gloo)
    peak = torch.tensor([max(largest)], dtype=torch.float64)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=gloo)
    runs: dict[str, tuple[Any, Any, int]] = {"no hook (width 32)": (None, None, 32)}
    for width in (32, 16, 8):
        runs[f"hook at width {width}"] = (hooks.allreduce_hook, hooks.CcoHookState(width=width), width)
    for name, (hook, state, width) in runs.items():
        params = train_ddp(None, hook, state)
        rows = gathered(params, gloo)
        checks.add(
            f"DDP {name}: parameters identical on every rank", all(torch.equal(rows[0], r) for r in rows)
        )
        unit = UNIT[torch.float32]
        per_step = hooks.error_bound(width, world) * peak.item() + (world + 1) * unit * peak.item()
        bound = 2 * STEPS * LR * per_step + 2 * STEPS * unit * reference.abs().max().item()
        error = (params - reference).abs().max().item()
        checks.add(
            f"DDP {name}: within the bound of the Gloo run",
            error <= bound,
            f"largest difference {error:.3g}, bound {bound:.3g} (largest gradient {peak.item():.3g})",
        )
    loss_scaling(checks, gloo)


def loss_scaling(checks: Checks, gloo: dist.ProcessGroup) -> None:
    """A gradient that overflows on one rank: every rank skips that step and lowers its scale."""
    rank = dist.get_rank()
    model = make_model()
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(hooks.CcoHookState(width=16), hooks.allreduce_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    gen = torch.Generator().manual_seed(7 + rank)
    overflow_step = 2
    for step in range(4):
        x, y = batch(gen)
        if step == overflow_step and rank == 1:
            x[0, 0] = math.inf
        before = flat(model)
        scale = scaler.get_scale()
        optimizer.zero_grad()
        scaler.scale(nn.functional.mse_loss(ddp(x), y)).backward()
        scaler.step(optimizer)
        scaler.update()
        if step == overflow_step:
            checks.add("GradScaler: the overflowing step is skipped", torch.equal(before, flat(model)))
            checks.add(
                "GradScaler: the scale is lowered",
                scaler.get_scale() < scale,
                f"{scale} -> {scaler.get_scale()}",
            )
    scales = gathered(torch.tensor([scaler.get_scale()]), gloo)
    rows = gathered(flat(model), gloo)
    identical = all(torch.equal(rows[0], r) for r in rows) and all(torch.equal(scales[0], s) for s in scales)
    checks.add("GradScaler: scale and parameters identical on every rank", identical)


# --- phase: FSDP2 ---------------------------------------------------------------------------


def phase_fsdp(checks: Checks, args: argparse.Namespace) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    mesh = init_device_mesh("cpu", (world,))
    model = make_model()
    reference = make_model()  # one process training on every rank's batch: what FSDP must equal
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    gens = [torch.Generator().manual_seed(200 + r) for r in range(world)]
    losses = []
    for _ in range(5):
        batches = [batch(gen) for gen in gens]
        x, y = batches[rank]
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        reference_optimizer.zero_grad()
        sum(nn.functional.mse_loss(reference(bx), by) for bx, by in batches).div(world).backward()
        reference_optimizer.step()
    full = torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])
    rows = gathered(full, gloo)
    checks.add("FSDP2: parameters identical on every rank", all(torch.equal(rows[0], r) for r in rows))
    error = (full - flat(reference)).abs().max().item()
    checks.add(
        "FSDP2: trains as one process on every rank's batch", error < 1e-4, f"largest difference {error:.3g}"
    )
    checks.add("FSDP2: losses finite", all(math.isfinite(v) for v in losses), str(losses))


# --- phase: init methods --------------------------------------------------------------------


def phase_init(checks: Checks, args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    checks.add("backend is cco", dist.get_backend() == "cco", dist.get_backend())
    total = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(total)
    checks.add("all_reduce", total.item() == world * (world + 1) // 2, str(total.item()))
    group = dist.group.WORLD
    width = getattr(group, "width", None)
    checks.add("pg_options reached the group", args.width is None or width == args.width, str(width))
    checks.add("node id follows the rank", group.communicator.rank == rank, "")  # type: ignore[union-attr]
    sub = dist.new_group(backend="cco")  # a session, and a certificate, of its own
    value = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(value, group=sub)
    checks.add("a new_group over cco", value.item() == world * (world - 1) // 2, str(value.item()))


def phase_stripes(checks: Checks, args: argparse.Namespace) -> None:
    """The default group has two stripes (main() passes ``--stripes 2``); ``whole`` one."""
    rank = dist.get_rank()
    pki = Path(os.environ["CCO_PKI_DIR"])
    checks.add(
        "stripes: stripe 1's certificate issued on the spot",
        (pki / f"ep-{rank}.s1.pem").exists(),
        str(sorted(p.name for p in pki.glob(f"ep-{rank}*.pem"))),
    )
    gloo = dist.new_group(backend="gloo")
    whole = dist.new_group(backend="cco", pg_options=cco.torch.Options(stripes=1))
    values = torch.randn(3 * MIN_STRIPE_ELEMENTS + 1000, generator=torch.Generator().manual_seed(rank))
    striped, single = values.clone(), values.clone()
    dist.all_reduce(striped)
    dist.all_reduce(single, group=whole)
    rows = gathered(striped, gloo)
    checks.add(
        "stripes: all_reduce bit-identical to one stripe, on every rank",
        torch.equal(striped, single) and all(torch.equal(rows[0], r) for r in rows),
    )
    moved = torch.arange(3 * MIN_STRIPE_ELEMENTS + 7, dtype=torch.float64) * (rank + 1)
    segment = torch.randn(2 * MIN_STRIPE_ELEMENTS + 5, generator=torch.Generator().manual_seed(rank))
    world = dist.get_world_size()
    scattered = torch.randn(
        world * (2 * MIN_STRIPE_ELEMENTS + 8192), generator=torch.Generator().manual_seed(rank)
    )
    results = []
    for group in (None, whole):
        sent = moved.clone()
        dist.broadcast(sent, src=1, group=group)
        gathered_all = torch.empty(world * segment.numel())
        dist.all_gather_into_tensor(gathered_all, segment, group=group)
        mine = torch.empty(scattered.numel() // world)
        dist.reduce_scatter_tensor(mine, scattered, group=group)
        results.append((sent, gathered_all, mine))
    for name, striped_one, single_one in zip(
        ("broadcast", "all_gather_into_tensor", "reduce_scatter_tensor"), *results, strict=True
    ):
        checks.add(f"stripes: {name} bit-identical to one stripe", torch.equal(striped_one, single_one))
    checks.add(
        "stripes: broadcast is the root's", torch.equal(results[0][0], torch.arange(moved.numel()) * 2.0)
    )
    stripe = dist.group.WORLD.communicator._comm.stripes[1]  # type: ignore[union-attr]  # the test looks inside
    for name, hook in (("no hook", None), ("the hook at width 16", hooks.allreduce_hook)):
        state = hooks.CcoHookState(width=16) if hook is not None else None
        before = stripe.service.machine.next_op_id
        params = [wide_ddp(group, hook, state) for group in (None, whole)]
        checks.add(
            f"stripes: DDP with {name} cut buckets over stripe 1", stripe.service.machine.next_op_id > before
        )
        rows = gathered(params[0], gloo)
        checks.add(
            f"stripes: DDP with {name} bit-identical to one stripe, on every rank",
            torch.equal(params[0], params[1]) and all(torch.equal(rows[0], r) for r in rows),
        )


def wide_ddp(group: dist.ProcessGroup | None, hook: Callable[..., Any] | None, state: Any) -> torch.Tensor:
    """A few SGD steps of a model whose gradient buckets are cut over stripes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 1))
    ddp = DistributedDataParallel(model, process_group=group, bucket_cap_mb=4)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(3):
        x, y = batch(gen)
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
    return flat(model)


def phase_train(checks: Checks, args: argparse.Namespace) -> None:
    """DDP, then FSDP2: one start of the ranks for both."""
    phase_ddp(checks, args)
    phase_fsdp(checks, args)


PHASES = {
    "ops": phase_ops,
    "ddp": phase_ddp,
    "fsdp": phase_fsdp,
    "train": phase_train,
    "init": phase_init,
    "stripes": phase_stripes,
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=sorted(PHASES))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--init-method", default="env://")
    parser.add_argument("--width", type=int)
    parser.add_argument("--stripes", type=int)
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = (
        cco.torch.Options(width=args.width, stripes=args.stripes) if args.width or args.stripes else None
    )
    if args.init_method == "env://":
        dist.init_process_group("cco", pg_options=options)
    else:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(
            "cco", init_method=args.init_method, rank=rank, world_size=world, pg_options=options
        )
    checks = Checks()
    try:
        checks.run(f"{args.phase} ran to its end", lambda: (PHASES[args.phase](checks, args), (True, ""))[1])
    finally:
        args.out.write_text(json.dumps({"checks": checks.items}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
