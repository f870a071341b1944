"""``live_cases.json``: the calls of the live ``collectives`` workload, in order.

An endpoint running WORKLOAD=collectives makes these calls (interop/README.md, "Live
inputs"), case ``i`` on the input drawn for case ``i``; these vectors are the list
for a group of 4, as :func:`cco.workload.conformance_cases` gives it, each with the
first inputs rank 0 draws for it.  The check holds the list to the rules the README
states for any group size, and draws the inputs again.
"""

from __future__ import annotations

import numpy as np

from cco.interop.vectorfiles.common import Vector, checked, run
from cco.wire.registries import Collective, DType, ReduceOp
from cco.workload import conformance_cases, make_input

FILE = "live_cases.json"
WORLD_SIZE = 4
SEED = 2026
ELEMENTS = 4


def vectors() -> list[Vector]:
    built = []
    for index, case in enumerate(conformance_cases(WORLD_SIZE)):
        vector: Vector = {
            "name": case.name,
            "world_size": WORLD_SIZE,
            "case": index,
            "kind": int(case.kind),
            "kind_name": case.kind.name,
            "op": int(case.op),
            "op_name": case.op.name,
            "dtype": int(case.dtype),
            "dtype_name": case.dtype.name,
        }
        if case.root is not None:
            vector["root"] = case.root
        drawn = make_input(SEED, index, 0, case.dtype, ELEMENTS)
        vector |= {"seed": SEED, "rank": 0, "elements": ELEMENTS, "input_bits": _bits(drawn)}
        built.append(vector)
    return checked(FILE, built, check)


def _bits(x: np.ndarray) -> str:
    return x.astype(x.dtype.newbyteorder("<")).tobytes().hex()


def _expected(world: int) -> list[Vector]:
    """The list from the README's rules: int32 then float32, each with ALL_REDUCE SUM,
    AVG and MAX, REDUCE SUM to rank 1 mod N, BROADCAST from rank N - 1, ALL_GATHER,
    REDUCE_SCATTER SUM; then one BARRIER (INT8)."""
    out: list[Vector] = []
    for dtype in (DType.INT32, DType.FLOAT32):
        tag = dtype.name.lower()
        calls = [
            *((f"all_reduce_{tag}_{op.name.lower()}", Collective.ALL_REDUCE, op, None) for op in _OPS),
            (f"reduce_{tag}_sum", Collective.REDUCE, ReduceOp.SUM, 1 % world),
            (f"broadcast_{tag}", Collective.BROADCAST, ReduceOp.SUM, world - 1),
            (f"all_gather_{tag}", Collective.ALL_GATHER, ReduceOp.SUM, None),
            (f"reduce_scatter_{tag}_sum", Collective.REDUCE_SCATTER, ReduceOp.SUM, None),
        ]
        out += [{"name": n, "kind": k, "op": o, "dtype": dtype, "root": r} for n, k, o, r in calls]
    out.append(
        {"name": "barrier", "kind": Collective.BARRIER, "op": ReduceOp.SUM, "dtype": DType.INT8, "root": None}
    )
    return out


_OPS = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX)


def check(vectors: list[Vector]) -> list[str]:
    problems = run(vectors, lambda v: [])
    worlds = {v.get("world_size") for v in vectors}
    if len(worlds) != 1:
        return [*problems, "the cases are not of one group size"]
    world = worlds.pop()
    if not isinstance(world, int):
        return [*problems, "world_size is not an integer"]
    wanted = _expected(world)
    if len(vectors) != len(wanted):
        return [*problems, f"{len(vectors)} cases, not the README's {len(wanted)}"]
    for index, (v, w) in enumerate(zip(vectors, wanted, strict=True)):
        got = (v["case"], v["name"], v["kind"], v["op"], v["dtype"], v.get("root"))
        want = (index, w["name"], int(w["kind"]), int(w["op"]), int(w["dtype"]), w["root"])
        names = (v["kind_name"], v["op_name"], v["dtype_name"])
        if got != want or names != (w["kind"].name, w["op"].name, w["dtype"].name):
            problems.append(f"{v['name']}: case {index} of the README's list is {w['name']}, {want[2:]}")
        drawn = make_input(v["seed"], index, v["rank"], w["dtype"], v["elements"])
        if _bits(drawn) != v["input_bits"]:
            problems.append(f"{v['name']}: input_bits are not the inputs drawn for the case")
    return problems
