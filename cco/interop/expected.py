"""The exact results the live cases expect, recomputed from the deterministic inputs.

Every rank's input comes from :func:`cco.workload.make_input` (the seed below, the
round or case index, the rank); the expected results are computed here with
Python integers and, for float SUM and AVG, with the draft's definitions of the
EXACT form (at most 16 elements) or of block scaling (:mod:`cco.interop.reference`:
exact rationals), never
with this implementation's codec, so an implementation whose results match them
is right whatever produced them.  A result is identified by the SHA-256 of its
little-endian bytes, which is what endpoints write in their results files.
"""

from __future__ import annotations

import hashlib
from fractions import Fraction

import numpy as np

from cco.interop import reference as ref
from cco.wire.registries import Collective, DType, ReduceOp
from cco.workload import conformance_cases, make_input

SEED = 2026
"""The workload seed every endpoint uses (cco-node's WORKLOAD_SEED)."""
BLOCK_ELEMENTS = 256
"""GroupParams.block_elements of the runner's groups (the default)."""
CHUNK_ELEMENTS = 65536
"""GroupParams.chunk_elements of the runner's groups (it sets CHUNK_ELEMENTS for every rendezvous)."""
DTYPES = {
    "int8": DType.INT8,
    "int16": DType.INT16,
    "int32": DType.INT32,
    "int64": DType.INT64,
    "float16": DType.FLOAT16,
    "float32": DType.FLOAT32,
    "float64": DType.FLOAT64,
}
OWN_WIDTH = {DType.FLOAT16: 2, DType.FLOAT32: 4, DType.FLOAT64: 8}


def sha256(array: np.ndarray) -> str:
    little = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False)
    return hashlib.sha256(little.tobytes()).hexdigest()


def block_scaled(inputs: list[np.ndarray], dtype: DType, op: ReduceOp) -> np.ndarray:
    """The SUM or AVG every rank must obtain, by the draft's definitions: per chunk,
    per block, the agreed scale is the least proposal; integers are summed exactly
    and decoded once."""
    world, n = len(inputs), len(inputs[0])
    limit = ref.sum_limit(OWN_WIDTH[dtype], world)
    values = [[Fraction(float(v)) for v in x] for x in inputs]
    divisor = world if op is ReduceOp.AVG else 1
    out = bytearray()
    for chunk_start in range(0, n, CHUNK_ELEMENTS):
        chunk_end = min(n, chunk_start + CHUNK_ELEMENTS)
        for start in range(chunk_start, chunk_end, BLOCK_ELEMENTS):
            end = min(chunk_end, start + BLOCK_ELEMENTS)
            scale = min(ref.propose(max(abs(v) for v in x[start:end]), limit) for x in values)
            for j in range(start, end):
                total = sum(ref.quantize(x[j], scale) for x in values)
                out += ref.decode_block_scaled(total, scale, divisor, int(dtype))
    return np.frombuffer(bytes(out), dtype=np.dtype(inputs[0].dtype).newbyteorder("<")).copy()


def exact_limbs(inputs: list[np.ndarray], dtype: DType, op: ReduceOp) -> np.ndarray:
    """The SUM or AVG of at most 16 elements (the EXACT form): the exact sum of the
    elements' limbs, rounded once."""
    divisor = len(inputs) if op is ReduceOp.AVG else 1
    out = bytearray()
    for j in range(len(inputs[0])):
        columns = zip(*(ref.exact_limbs(int(dtype), float(x[j])) for x in inputs), strict=True)
        element = ref.exact_decode(int(dtype), [sum(column) for column in columns], divisor)
        if element is None:
            raise OverflowError(f"element {j} of the expected sum does not fit {dtype.name}")
        out += element
    return np.frombuffer(bytes(out), dtype=np.dtype(inputs[0].dtype).newbyteorder("<")).copy()


def reduce_exact(inputs: list[np.ndarray], dtype: DType, op: ReduceOp) -> np.ndarray:
    if dtype in OWN_WIDTH and op in (ReduceOp.SUM, ReduceOp.AVG):
        if len(inputs[0]) <= ref.EXACT_MAX_ELEMENTS:
            return exact_limbs(inputs, dtype, op)
        return block_scaled(inputs, dtype, op)
    if op in (ReduceOp.MAX, ReduceOp.MIN):
        extreme: np.ndarray = (np.max if op is ReduceOp.MAX else np.min)(np.stack(inputs), axis=0)
        return extreme
    # integers of at most 32 bits from at most 65536 ranks: int64 sums are exact
    assert np.dtype(inputs[0].dtype).itemsize <= 4
    totals = np.sum(np.stack(inputs).astype(np.int64), axis=0)
    if op is ReduceOp.AVG:
        totals = np.array([round(Fraction(int(t), len(inputs))) for t in totals], dtype=np.int64)
    result: np.ndarray = totals.astype(inputs[0].dtype)
    return result


def allreduce_digests(dtype_name: str, elements: int, rounds: int, world: int) -> dict[str, str]:
    dtype = DTYPES[dtype_name]
    out = {}
    for r in range(rounds):
        inputs = [make_input(SEED, r, rank, dtype, elements) for rank in range(world)]
        out[f"round-{r}"] = sha256(reduce_exact(inputs, dtype, ReduceOp.SUM))
    return out


def quorum_digest(dtype_name: str, elements: int, round_index: int, contributors: list[int]) -> str:
    """The exact result of one all-reduce round over ``contributors`` only (a quorum)."""
    dtype = DTYPES[dtype_name]
    inputs = [make_input(SEED, round_index, rank, dtype, elements) for rank in contributors]
    return sha256(reduce_exact(inputs, dtype, ReduceOp.SUM))


def collective_digests(elements: int, rank: int, world: int) -> dict[str, str]:
    """The results of cco-node's conformance suite at ``rank`` (absent: no result there)."""
    out = {}
    length = elements - elements % world
    for index, case in enumerate(conformance_cases(world)):
        inputs = [make_input(SEED, index, r, case.dtype, length) for r in range(world)]
        if case.kind is Collective.ALL_REDUCE:
            result = reduce_exact(inputs, case.dtype, case.op)
        elif case.kind is Collective.REDUCE:
            if rank != case.root:
                continue
            result = reduce_exact(inputs, case.dtype, case.op)
        elif case.kind is Collective.BROADCAST:
            assert case.root is not None
            result = inputs[case.root]
        elif case.kind is Collective.ALL_GATHER:
            result = np.stack(inputs)
        elif case.kind is Collective.REDUCE_SCATTER:
            part = length // world
            result = reduce_exact(inputs, case.dtype, case.op)[rank * part : (rank + 1) * part]
        else:
            continue
        out[case.name] = sha256(result)
    return out


def digests(kind: str, dtype: str, elements: int, rounds: int, rank: int, world: int) -> dict[str, str]:
    """What an endpoint of rank ``rank`` must write in its results file."""
    if kind == "collectives":
        return collective_digests(elements, rank, world)
    return allreduce_digests(dtype, elements, rounds, world)
