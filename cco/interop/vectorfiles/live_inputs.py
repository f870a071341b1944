"""``live_inputs.json``: the first inputs of the live-mode generator, for every dtype.

Live test cases judge results against the inputs every endpoint draws for itself
(interop/README.md, "Live inputs"); these vectors let another implementation check
its generator without running a case.  They are drawn with
:func:`cco.workload.make_input`; the check recomputes every value from the
definition alone (SHA-256, AES-256-CTR and Python integers) and draws them again.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from cco.interop.jsonform import from_hex
from cco.interop.vectorfiles.common import Vector, checked, run
from cco.wire.registries import DType
from cco.workload import INPUT_LABEL, INPUT_MAPPINGS, NUMPY_TYPES, input_key, make_input

FILE = "live_inputs.json"
SEED = 2026
"""The seed of every live case (``SEED`` of :mod:`cco.interop.expected`)."""
ELEMENTS = 8


def _vector(name: str, description: str, dtype: DType, case: int, rank: int) -> Vector:
    mapping = INPUT_MAPPINGS[dtype]
    key = input_key(SEED, case, rank)
    keystream = (
        Cipher(algorithms.AES(key), modes.CTR(bytes(16)))
        .encryptor()
        .update(bytes(ELEMENTS * mapping.word_bytes))
    )
    words = [
        int.from_bytes(keystream[j : j + mapping.word_bytes], "little")
        for j in range(0, len(keystream), mapping.word_bytes)
    ]
    inputs = make_input(SEED, case, rank, dtype, ELEMENTS)
    fraction = mapping.fraction if mapping.shift else 0
    integers = [int(x * 2**fraction) for x in inputs.tolist()]
    return {
        "name": name,
        "description": description,
        "seed": SEED,
        "case": case,
        "rank": rank,
        "dtype": int(dtype),
        "dtype_name": dtype.name.lower(),
        "elements": ELEMENTS,
        "key_input": (INPUT_LABEL + struct.pack(">QQI", SEED, case, rank)).hex(),
        "key": key.hex(),
        "keystream": keystream.hex(),
        "words": words,
        "integers": integers,
        "fraction_bits": fraction,
        "input_bits": np.ascontiguousarray(inputs).astype(inputs.dtype.newbyteorder("<")).tobytes().hex(),
    }


def vectors() -> list[Vector]:
    built = [
        _vector(
            f"{dtype.name.lower()}_case_0_rank_1",
            f"The first {ELEMENTS} {dtype.name} inputs of rank 1 in round (case) 0.",
            dtype,
            0,
            1,
        )
        for dtype in NUMPY_TYPES
    ]
    built.append(
        _vector(
            "float32_case_299_rank_3",
            "Rank 3 in round 299: the case and the rank enter the key as big-endian integers.",
            DType.FLOAT32,
            299,
            3,
        )
    )
    return checked(FILE, built, check)


def _check_one(v: Vector) -> list[str]:
    """Every value from the definition, with nothing of :mod:`cco.workload` but the
    draw itself, which must give the same bits."""
    dtype = DType(v["dtype"])
    word_bytes = {1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 7: 4, 8: 8}[v["dtype"]]
    key_input = b"cco interop input" + struct.pack(">QQI", v["seed"], v["case"], v["rank"])
    key = hashlib.sha256(key_input).digest()
    stream = (
        Cipher(algorithms.AES(key), modes.CTR(bytes(16)))
        .encryptor()
        .update(bytes(v["elements"] * word_bytes))
    )
    words = [int.from_bytes(stream[j : j + word_bytes], "little") for j in range(0, len(stream), word_bytes)]
    if v["dtype"] <= 4:  # integers: (u mod 7) - 3 for INT8, (u mod 2001) - 1000 for the others
        modulus, offset = (7, 3) if v["dtype"] == 1 else (2001, 1000)
        integers, fraction = [u % modulus - offset for u in words], 0
    else:  # floats: ((u >> shift) - 2^fraction) * 2^-fraction
        shift, fraction = {5: (5, 10), 7: (8, 23), 8: (11, 52)}[v["dtype"]]
        integers = [(u >> shift) - (1 << fraction) for u in words]
    size = np.dtype(NUMPY_TYPES[dtype]).itemsize
    if v["dtype"] <= 4:
        bits = b"".join(i.to_bytes(size, "little", signed=True) for i in integers)
    else:
        fmt = {5: "<e", 7: "<f", 8: "<d"}[v["dtype"]]
        bits = b"".join(struct.pack(fmt, i / (1 << fraction)) for i in integers)
    want = {
        "key_input": key_input.hex(),
        "key": key.hex(),
        "keystream": stream.hex(),
        "words": words,
        "integers": integers,
        "fraction_bits": fraction,
        "input_bits": bits.hex(),
    }
    problems = [f"{k} is not what the definition gives" for k, value in want.items() if v[k] != value]
    drawn = make_input(v["seed"], v["case"], v["rank"], dtype, v["elements"])
    if drawn.astype(drawn.dtype.newbyteorder("<")).tobytes() != from_hex(v["input_bits"]):
        problems.append("cco.workload.make_input draws other inputs")
    return problems


def check(vectors: list[Vector]) -> list[str]:
    return run(vectors, _check_one)
