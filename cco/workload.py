"""Deterministic inputs and exact references for demos, end-to-end checks and live interop.

Every rank derives its input from (seed, case, rank) alone, so a checker that knows
the seed can recompute every rank's input and the exact expected result without
talking to any node.  The generator is the one interop/README.md specifies ("Live
inputs"), so that another implementation's endpoints draw the same inputs from the
specification alone: an AES-256-CTR keystream keyed by a hash of (seed, case, rank),
read as one little-endian word per element and mapped to small integers or to floats
in [-1, 1) that the dtype holds exactly.  References are computed with Python
integers (for integer types) or exact rationals of the float inputs, never with the
code under test.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

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


INPUT_LABEL = b"cco interop input"
"""Domain separation of the input keys from every other use of SHA-256 and AES."""


@dataclass(frozen=True, slots=True)
class Mapping:
    """How one dtype's elements come from the keystream: ``word_bytes`` bytes per
    element, read as a little-endian unsigned word u; an integer is
    ``(u mod modulus) - offset``; a float is ``((u >> shift) - offset) * 2^-fraction``,
    exact in the dtype since the integer has at most the dtype's precision in bits."""

    word_bytes: int
    offset: int
    modulus: int = 0  # integers
    shift: int = 0  # floats
    fraction: int = 0


INPUT_MAPPINGS: dict[DType, Mapping] = {
    DType.INT8: Mapping(2, offset=3, modulus=7),
    DType.INT16: Mapping(2, offset=1000, modulus=2001),
    DType.INT32: Mapping(2, offset=1000, modulus=2001),
    DType.INT64: Mapping(2, offset=1000, modulus=2001),
    DType.FLOAT16: Mapping(2, offset=1 << 10, shift=5, fraction=10),
    DType.FLOAT32: Mapping(4, offset=1 << 23, shift=8, fraction=23),
    DType.FLOAT64: Mapping(8, offset=1 << 52, shift=11, fraction=52),
}
"""Integers in [-3, 3] (INT8) or [-1000, 1000], so that sums over a few dozen ranks
fit the dtype; floats in [-1, 1)."""

_SLICE = 1 << 18
"""Elements mapped at a time: the keystream of a 64 MiB input is never whole in memory."""


def input_key(seed: int, case_index: int, rank: int) -> bytes:
    """The AES-256 key of one rank's input: SHA-256 of the label, then seed and case as
    unsigned 64-bit and rank as unsigned 32-bit integers, big-endian."""
    return hashlib.sha256(INPUT_LABEL + struct.pack(">QQI", seed, case_index, rank)).digest()


def make_input(
    seed: int, case_index: int, rank: int, dtype: DType, elements: int, out: np.ndarray | None = None
) -> np.ndarray:
    """The input of ``rank`` for one case: small integers, or floats in [-1, 1).

    With ``out`` (``elements`` of the dtype's numpy type) the values are written
    there, the same values, and ``out`` is returned: a loop of large rounds then
    reuses one array instead of faulting in a new one each round."""
    numpy_type = NUMPY_TYPES[dtype]
    if out is None:
        out = np.empty(elements, dtype=numpy_type)
    elif out.dtype != numpy_type or out.shape != (elements,):
        raise ValueError(f"out is {out.dtype} of shape {out.shape}, not {elements} of {np.dtype(numpy_type)}")
    mapping = INPUT_MAPPINGS[dtype]
    word = np.dtype(f"<u{mapping.word_bytes}")
    keystream = Cipher(algorithms.AES(input_key(seed, case_index, rank)), modes.CTR(bytes(16))).encryptor()
    zeros = bytes(min(elements, _SLICE) * mapping.word_bytes)
    buffer = bytearray(len(zeros) + 15)  # update_into wants room for a block more
    for start in range(0, elements, _SLICE):
        count = min(_SLICE, elements - start)
        size = count * mapping.word_bytes
        keystream.update_into(memoryview(zeros)[:size], buffer)
        words = np.frombuffer(buffer, dtype=word, count=count)
        target = out[start : start + count]
        if mapping.modulus:  # in [0, modulus), then shifted: the dtype holds both exactly
            np.subtract(words % word.type(mapping.modulus), mapping.offset, out=target, dtype=np.int32)
        else:  # (u >> shift) - offset has the dtype's precision: exact in it, and so scaled
            signed = (words >> word.type(mapping.shift)).astype(np.int64) - mapping.offset
            np.multiply(signed, 2.0**-mapping.fraction, out=target, casting="unsafe")
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
