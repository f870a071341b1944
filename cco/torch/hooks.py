"""A DDP communication hook that averages gradient buckets through CCO at a chosen width.

    import cco.torch.hooks as hooks
    model = DistributedDataParallel(model)            # over a "cco" process group
    model.register_comm_hook(hooks.CcoHookState(width=16), hooks.allreduce_hook)

Each bucket is all-reduced with AVG as block-scaled fixed point of ``width`` bits per
element (8, 16, 32 or 64; :mod:`cco.wire.blockscale`): unlike DDP's fp16 and bf16
compress hooks, which round every rank's gradient and then sum in whatever order the
reduction takes, the integers add exactly in any order, so every rank gets the same
bits, run after run.  The error is bounded per block of 256 elements: each element of
the averaged bucket is within ``error_bound(width, N) x M`` of the exact mean of the
ranks' gradients (M: the largest gradient magnitude in its block on any rank), plus
one rounding to the gradient's dtype.  With N ranks:

=====  =====================================  ===========
width  bound (relative to M)                  at N = 4
=====  =====================================  ===========
32     2 / (2 floor((2^31 - 1) / N) + 1)      about 2^-29
16     2 / (2 floor(32767 / N) + 1)           about 2^-13
8      2 / (2 floor(127 / N) + 1)             about 2^-5
=====  =====================================  ===========

Over a training run the bound adds up: after k plain SGD steps at learning rate lr,
the parameters of a run over CCO and of one over an exact reduction differ by at most
about k x lr x (bound x G + the float rounding of the sum), to first order, G being
the largest gradient magnitude seen.

Non-finite gradients (inf or NaN, as loss scaling under AMP produces on overflow):
with ``nonfinite="propagate"`` (the default) a bucket that held one on any rank comes
back all NaN on every rank, so ``GradScaler`` finds it on every rank, skips the same
step everywhere and lowers its scale; ``"report"`` raises
:class:`~cco.client.NonFiniteError` on every rank instead, naming the ranks.
"""

# No ``from __future__ import annotations`` here: DDP's register_comm_hook compares the
# hook's annotations with dist.GradBucket and Future[Tensor] themselves, not their text.

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket

from cco.client import NonFinite
from cco.torch.process_group import ProcessGroupCCO
from cco.wire import blockscale
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.registries import ReduceOp

WIDTHS = (8, 16, 32, 64)


def error_bound(width: int, world_size: int) -> float:
    """The bound per element of an averaged bucket, relative to the largest magnitude
    in its block on any rank: 2 / (2Q + 1), Q = floor(min(2^(width-1) - 1, B) / N)."""
    limit = blockscale.sum_limit(width // 8, world_size)
    return 2.0 / (2 * limit + 1)


@dataclass(slots=True)
class CcoHookState:
    """The hook's settings: ``width`` bits per gradient element on the wire, what to do
    with non-finite gradients, and the process group (default: the DDP model's own,
    which must be a "cco" group)."""

    width: int = 32
    nonfinite: NonFinite = "propagate"
    process_group: dist.ProcessGroup | None = None

    def __post_init__(self) -> None:
        if self.width not in WIDTHS:
            raise ValueError(f"width {self.width} is not one of {WIDTHS}")


def allreduce_hook(state: CcoHookState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket`` over the group through CCO at ``state.width``; the future holds
    the bucket's own buffer, the mean written into it."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    if not isinstance(group, ProcessGroupCCO):
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"the cco hook needs a cco process group, not {type(group).__name__}: "
            "init_process_group('cco'), or CcoHookState(process_group=...)",
        )
    return group.allreduce_future(bucket.buffer(), ReduceOp.AVG, width=state.width, nonfinite=state.nonfinite)
