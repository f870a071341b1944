"""Deterministic inputs and exact references for demos and end-to-end checks.

Every rank derives its input from (seed, case, rank) alone, so a checker that knows
the seed can recompute every rank's input and the exact expected result without
talking to any node.  References are computed with Python integers (for integer
types) or exact rationals of the float inputs, never with the code under test.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from cco.wire.registries import Collective, DType, ReduceOp

NUMPY_TYPES: dict[DType, type[np.generic]] = {
    DType.INT8: np.int8,
    DType.INT16: np.int16,
    DType.INT32: np.int32,
    DType.INT64: np.int64,
    DType.FLOAT16: np.float16,
    DType.FLOAT32: np.float32,
    DType.FLOAT64: np.float64,
}


@dataclass(frozen=True, slots=True)
class Case:
    """One collective call of a conformance run."""

    name: str
    kind: Collective
    dtype: DType
    op: ReduceOp = ReduceOp.SUM
    root: int | None = None


def conformance_cases(world_size: int) -> list[Case]:
    """Every collective; int32 and float32; SUM, AVG and MAX where they apply."""
    cases: list[Case] = []
    for dtype in (DType.INT32, DType.FLOAT32):
        tag = dtype.name.lower()
        for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX):
            cases.append(Case(f"all_reduce_{tag}_{op.name.lower()}", Collective.ALL_REDUCE, dtype, op))
        cases.append(Case(f"reduce_{tag}_sum", Collective.REDUCE, dtype, ReduceOp.SUM, root=1 % world_size))
        cases.append(Case(f"broadcast_{tag}", Collective.BROADCAST, dtype, root=(world_size - 1)))
        cases.append(Case(f"all_gather_{tag}", Collective.ALL_GATHER, dtype))
        cases.append(Case(f"reduce_scatter_{tag}_sum", Collective.REDUCE_SCATTER, dtype, ReduceOp.SUM))
    cases.append(Case("barrier", Collective.BARRIER, DType.INT8))
    return cases


def make_input(
    seed: int, case_index: int, rank: int, dtype: DType, elements: int, out: np.ndarray | None = None
) -> np.ndarray:
    """The input of ``rank`` for one case: small integers, or floats in [-1, 1).

    With ``out`` (``elements`` of the dtype's numpy type) the values are written
    there, the same values, and ``out`` is returned: a loop of large rounds then
    reuses one array instead of faulting in a new one each round."""
    rng = np.random.default_rng([seed, case_index, rank])
    numpy_type = NUMPY_TYPES[dtype]
    if out is not None and (out.dtype != numpy_type or out.shape != (elements,)):
        raise ValueError(f"out is {out.dtype} of shape {out.shape}, not {elements} of {np.dtype(numpy_type)}")
    if np.issubdtype(numpy_type, np.integer):
        bound = 1000 if np.dtype(numpy_type).itemsize > 1 else 3
        drawn = rng.integers(-bound, bound, size=elements, endpoint=True).astype(numpy_type)
    else:
        # Drawn in the type itself (float16 in float32, then rounded), so a large
        # float32 input never costs a float64 temporary of the whole tensor (the
        # benchmarks' own memory would otherwise dwarf the endpoint's); x * 2 - 1 in
        # place rounds as it does on temporaries.
        drawn_type = np.float64 if numpy_type is np.float64 else np.float32
        drawn = rng.random(elements, dtype=drawn_type, out=out if drawn_type is numpy_type else None)
        drawn *= 2
        drawn -= 1
        drawn = drawn.astype(numpy_type, copy=False)
    if out is None or drawn is out:
        return drawn
    np.copyto(out, drawn)
    return out


def exact_reduce(inputs: list[np.ndarray], op: ReduceOp) -> list[Fraction]:
    """The exact elementwise reduction of every rank's input, as rationals."""
    columns = zip(
        *[
            [Fraction(float(v)) if isinstance(v, np.floating) else Fraction(int(v)) for v in x]
            for x in inputs
        ],
        strict=True,
    )
    result: list[Fraction] = []
    for column in columns:
        if op is ReduceOp.SUM:
            result.append(sum(column, Fraction(0)))
        elif op is ReduceOp.AVG:
            result.append(sum(column, Fraction(0)) / len(inputs))
        elif op is ReduceOp.MAX:
            result.append(max(column))
        elif op is ReduceOp.MIN:
            result.append(min(column))
        else:
            raise ValueError(f"no exact reference for {op.name}")
    return result
