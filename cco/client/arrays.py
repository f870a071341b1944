"""What a collective call takes and gives back, shared by both communicators.

Arrays read from numpy or through DLPack without a copy, ops by name, the quorum
all-reduce's :class:`PartialResult`, and the guard of float reductions against inf
and NaN (:data:`NonFinite`): each call's whole-array work, which
:class:`~cco.client.BlockingCommunicator` runs on the caller's thread.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from cco.nodes.replies import ranks_text
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.registries import Collective, ReduceOp


def reduce_op(op: ReduceOp | str) -> ReduceOp:
    """``op`` as a :class:`ReduceOp`: the enum itself, or its name in any case (``"sum"``)."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str) and op.upper() in ReduceOp.__members__:
        return ReduceOp[op.upper()]
    names = ", ".join(name.lower() for name in ReduceOp.__members__)
    raise CcoError(ErrorCode.INVALID_FIELD, f"op {op!r} is not one of {names}")


NonFinite = Literal["propagate", "report"]
"""What a float reduction does with inf and NaN inputs (the ``nonfinite`` keyword):

* ``"propagate"``: on every rank, the whole result is NaN when any rank's input held a
  value the reduction cannot carry (inf or NaN for SUM and AVG, NaN for MIN and MAX),
  as a loss-scaling step under mixed precision expects: every rank sees it and skips
  the step, and the reduction itself still completes;
* ``"report"``: every rank raises :class:`NonFiniteError` naming the ranks that had one.

Either way each rank learns it from a one-byte all-gather run beside the reduction
(a second collective, started with it).  Without ``nonfinite`` (the default) such a
value fails the call at once, on its own rank only."""

NONFINITE_MODES: tuple[str, ...] = ("propagate", "report")


class NonFiniteError(CcoError):
    """Some ranks' inputs to a reduction held inf or NaN (``nonfinite="report"``)."""

    def __init__(self, kind: Collective, ranks: frozenset[int]) -> None:
        super().__init__(
            ErrorCode.OVERFLOW, f"{kind.name}: inputs of ranks {ranks_text(ranks)} are not finite"
        )
        self.ranks = ranks


def _guarded(array: np.ndarray, op: ReduceOp) -> tuple[np.ndarray, bool | None]:
    """A reduction's input made safe to send, and whether it held values the reduction
    cannot carry: zeros in their place (a copy, made only then).  None: the dtype and
    op carry every value, nothing to guard."""
    if array.dtype.kind != "f" or op not in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MIN, ReduceOp.MAX):
        return array, None
    carried = ~np.isnan(array) if op in (ReduceOp.MIN, ReduceOp.MAX) else np.isfinite(array)
    if carried.all():
        return array, False
    return np.where(carried, array, np.zeros((), dtype=array.dtype)), True


def _check_nonfinite(mode: str | None) -> None:
    if mode is not None and mode not in NONFINITE_MODES:
        raise CcoError(
            ErrorCode.INVALID_FIELD, f"nonfinite {mode!r} is not one of {', '.join(NONFINITE_MODES)}"
        )


def as_array(value: Any, name: str = "array") -> np.ndarray:
    """``value`` as a numpy array sharing its memory: a numpy array as it is, a tensor
    through DLPack (a torch CPU tensor, for one: never copied), anything else through
    ``np.asarray``.  INVALID_FIELD for what cannot be read so."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except (RuntimeError, BufferError, TypeError, ValueError) as exc:
            hint = ""
            if "bfloat16" in str(getattr(value, "dtype", "")):
                hint = " (bfloat16: use cco.torch, or float32 values with dtype=DType.BFLOAT16)"
            raise CcoError(
                ErrorCode.INVALID_FIELD, f"{name} cannot be shared with numpy: {exc}{hint}"
            ) from None
    if name == "out":
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"out is a {type(value).__name__}: give a numpy array or a tensor (DLPack) to write into",
        )
    return np.asarray(value)


@dataclass(frozen=True, slots=True)
class PartialResult:
    """What a quorum all-reduce returns: the verified reduction of ``contributors``'
    arrays (AVG divides by their number).  The ranks missing from it came too late,
    or never; a rank that was late gets the same result without having contributed."""

    array: np.ndarray
    contributors: frozenset[int]


def present(result: np.ndarray | None) -> np.ndarray:
    """The result of a call that always has one (all but REDUCE)."""
    if result is None:
        raise CcoError(ErrorCode.INTERNAL_ERROR, "collective completed without a result")
    return result


_REDUCTIONS = frozenset({Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER})


def prepare_input(
    kind: Collective, array: Any, op: ReduceOp | str, nonfinite: NonFinite | None
) -> tuple[np.ndarray | None, bool | None]:
    """A call's input as an array, made safe to send when ``nonfinite`` asks for it,
    and whether it had values that could not be sent (None: no guard runs): the
    whole-array work of a call, which may run on the caller's own thread (see
    BlockingCommunicator)."""
    _check_nonfinite(nonfinite)
    if array is None:
        return None, None
    values = as_array(array)
    if nonfinite is None or kind not in _REDUCTIONS:
        return values, None
    return _guarded(values, reduce_op(op))


async def settle_nonfinite(
    kind: Collective,
    data: asyncio.Future[np.ndarray | None],
    flags: asyncio.Future[np.ndarray | None],
    mode: NonFinite,
) -> np.ndarray | None:
    """A guarded reduction's result, once it and its all-gather of flags are in."""
    await asyncio.wait([data, flags])
    if not flags.cancelled():
        flags.exception()  # retrieved, so a failure of both is not reported as unseen
    result = data.result()  # its failure first: the flags say nothing then
    gathered = flags.result()
    assert gathered is not None
    bad = frozenset(int(rank) for rank in np.flatnonzero(gathered.reshape(-1)))
    if bad and mode == "report":
        raise NonFiniteError(kind, bad)
    if bad and result is not None:
        result[...] = np.nan
    return result
