"""torch tensors as the arrays a CCO collective reads and writes, without copies.

A CPU tensor of a CCO element type is shared with numpy (``Tensor.numpy()`` is a view
of the same memory), so an operation reads its input, and decodes its result, in the
tensor's own memory.  Two cases cost one copy each, and nothing else does:

* an in-place reduction (all-reduce, reduce at the root, an all-gather or
  reduce-scatter whose input lies inside its output): a CCO operation reads its input
  until it completes (a chunk is encoded again when it is resent, or when the tree is
  replaced mid-operation), so the input is copied once and the result decoded straight
  into the tensor;
* a bfloat16 reduction: CCO's numpy form of bfloat16 is a float32 array of bfloat16
  values (:mod:`cco.wire.dtypes`), so the input is widened once and the result, exact
  in bfloat16, narrowed back into the tensor.

Data moved bit for bit (broadcast, all-gather) needs no numeric type: bfloat16 goes as
its 16-bit patterns, unsigned and bool tensors as the signed integers of their width,
all without a copy.  Reductions of those accept only what their bits mean the same
way signed: BAND, BOR and BXOR of any of them, MIN and MAX of bool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cco.wire.errors import CcoError, ErrorCode
from cco.wire.registries import DType, ReduceOp

NATIVE: dict[torch.dtype, DType] = {
    torch.int8: DType.INT8,
    torch.int16: DType.INT16,
    torch.int32: DType.INT32,
    torch.int64: DType.INT64,
    torch.float16: DType.FLOAT16,
    torch.float32: DType.FLOAT32,
    torch.float64: DType.FLOAT64,
}
"""Tensor types that are numpy types of a CCO dtype."""

AS_BITS: dict[torch.dtype, torch.dtype] = {
    torch.bfloat16: torch.int16,
    torch.bool: torch.int8,
    torch.uint8: torch.int8,
    torch.uint16: torch.int16,
    torch.uint32: torch.int32,
    torch.uint64: torch.int64,
}
"""Tensor types moved as the signed integers of their width (the same bits)."""

BITWISE = frozenset({ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR})

TORCH_OPS: dict[str, ReduceOp] = {op.name: op for op in ReduceOp}
"""torch's ReduceOp names that are CCO's (SUM, AVG, MIN, MAX, BAND, BOR, BXOR)."""


def reduce_op(torch_op: object) -> ReduceOp:
    """CCO's op for a torch ``ReduceOp`` (the object in an options struct, or its type)."""
    name = getattr(getattr(torch_op, "op", torch_op), "name", str(torch_op))
    if name not in TORCH_OPS:
        raise CcoError(
            ErrorCode.UNSUPPORTED_FEATURE,
            f"ReduceOp.{name} is not a CCO reduction (CCO has {', '.join(TORCH_OPS)}); "
            "PRODUCT has no exact aggregatable form and PREMUL_SUM is NCCL's",
        )
    return TORCH_OPS[name]


def check(tensor: torch.Tensor, what: str) -> None:
    """A tensor a collective can use in place: dense, on the CPU, contiguous."""
    if tensor.device.type != "cpu":
        raise CcoError(ErrorCode.UNSUPPORTED_FEATURE, f"{what}: cco runs on CPU tensors, not {tensor.device}")
    if tensor.layout is not torch.strided:
        raise CcoError(ErrorCode.UNSUPPORTED_FEATURE, f"{what}: cco takes dense tensors, not {tensor.layout}")
    if not tensor.is_contiguous():
        raise CcoError(ErrorCode.INVALID_FIELD, f"{what}: the tensor must be contiguous")
    if tensor.dtype not in NATIVE and tensor.dtype not in AS_BITS:
        raise CcoError(ErrorCode.UNSUPPORTED_FEATURE, f"{what}: cco has no element type for {tensor.dtype}")


def moved(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's memory as a numpy array to move bit for bit (never a copy)."""
    bits = AS_BITS.get(tensor.dtype)
    shared = tensor.detach() if bits is None else tensor.detach().view(bits)
    return shared.numpy()


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' memory overlaps (a bounds check, as numpy's may_share_memory)."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    a_start, b_start = a.data_ptr(), b.data_ptr()
    a_end = a_start + a.numel() * a.element_size()
    b_end = b_start + b.numel() * b.element_size()
    return a_start < b_end and b_start < a_end


@dataclass(frozen=True, slots=True)
class Reduction:
    """How one tensor enters a reduction: the array CCO reads, its dtype, and the array
    the result decodes into (with where that goes afterwards, when it is not the
    tensor itself)."""

    source: np.ndarray
    dtype: DType | None  # BFLOAT16 for a widened bfloat16 tensor; else the array's own
    out: np.ndarray | None
    target: torch.Tensor | None  # a tensor ``out`` is copied to when the result is in
    in_place: bool = False  # ``out`` is the memory of the tensor ``source`` is a copy of

    def finish(self) -> None:
        if self.target is not None and self.out is not None:
            self.target.copy_(torch.from_numpy(self.out).view(self.target.shape))

    def restore(self) -> None:
        """After a failed call: an in-place reduction's tensor holds its input again.

        Its chunks decode straight into the tensor as they are verified, so a call
        that fails midway leaves it part result, part input; its input is still whole
        in ``source``, so putting it back costs only the failed call, and calling
        again reduces what the caller passed.  (A bfloat16 tensor receives nothing
        until the whole result is in: it is untouched.)"""
        if self.in_place and self.target is None and self.out is not None:
            np.copyto(self.out, self.source.reshape(self.out.shape))


def reduction_input(
    tensor: torch.Tensor, op: ReduceOp, what: str, *, copy: bool
) -> tuple[np.ndarray, DType | None]:
    """The array a reduction of ``tensor`` reads, and its CCO dtype when numpy's does not
    say it (bfloat16); ``copy`` when the tensor itself will receive the result."""
    check(tensor, what)
    detached = tensor.detach()
    if tensor.dtype is torch.bfloat16:
        return detached.float().numpy(), DType.BFLOAT16  # widening is the one copy
    if tensor.dtype in AS_BITS:
        allowed = op in BITWISE or (tensor.dtype is torch.bool and op in (ReduceOp.MIN, ReduceOp.MAX))
        if not allowed:
            raise CcoError(
                ErrorCode.UNSUPPORTED_FEATURE,
                f"{what}: {op.name} of {tensor.dtype} (CCO's integers are signed; "
                "BAND, BOR and BXOR work on any integer tensor)",
            )
    array = moved(detached)
    return (array.copy() if copy else array), None


def into(
    tensor: torch.Tensor,
    source: np.ndarray,
    dtype: DType | None,
    shape: tuple[int, ...],
    *,
    in_place: bool = False,
) -> Reduction:
    """A reduction whose result (of ``shape``) lands in ``tensor``: straight into its
    memory, or through a float32 array for bfloat16.  ``in_place``: ``source`` is a
    copy of ``tensor`` (:meth:`Reduction.restore` puts it back after a failure)."""
    if tensor.dtype is torch.bfloat16:
        return Reduction(source, dtype, np.empty(shape, dtype=np.float32), tensor)
    return Reduction(source, dtype, moved(tensor).reshape(shape), None, in_place)
