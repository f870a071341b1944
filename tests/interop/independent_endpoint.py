"""A second implementation for ``cco-interop live``, given to the runner only as a command.

It runs endpoints only (every other role exits 127), and draws every input from the
definitions of interop/README.md ("Live inputs") written out here again: nothing of
``cco.workload`` is imported, and importing it anywhere in the process fails, so an
input that matches the runner's expectation proves the README is enough to produce
it.  The collectives run on this project's client library (``cco.client``): what is
under test is the input generator and the runner's contract, not another stack.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import struct
import sys
from pathlib import Path

sys.modules["cco.workload"] = None  # type: ignore[assignment]  # any import of it fails

import numpy as np  # noqa: E402
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes  # noqa: E402

from cco.client import Communicator, GroupSpec  # noqa: E402
from cco.nodes.calls import CollectiveRequest  # noqa: E402
from cco.transport.config import TransportConfig  # noqa: E402
from cco.wire import kernels  # noqa: E402
from cco.wire.registries import Collective, ReduceOp  # noqa: E402

UNSUPPORTED = 127
SEED = 2026
# dtype name -> (numpy type, word bytes, integer (modulus, offset) or float (shift, fraction bits))
DRAWS: dict[str, tuple[type[np.generic], int, tuple[int, int] | None, tuple[int, int] | None]] = {
    "int8": (np.int8, 2, (7, 3), None),
    "int16": (np.int16, 2, (2001, 1000), None),
    "int32": (np.int32, 2, (2001, 1000), None),
    "int64": (np.int64, 2, (2001, 1000), None),
    "float16": (np.float16, 2, None, (5, 10)),
    "float32": (np.float32, 4, None, (8, 23)),
    "float64": (np.float64, 8, None, (11, 52)),
}


def draw(case: int, rank: int, dtype: str, elements: int) -> np.ndarray:
    """The README's generator, element by element in Python integers."""
    numpy_type, width, integer, floating = DRAWS[dtype]
    key = hashlib.sha256(b"cco interop input" + struct.pack(">QQI", SEED, case, rank)).digest()
    stream = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(elements * width))
    words = [int.from_bytes(stream[j : j + width], "little") for j in range(0, len(stream), width)]
    if integer is not None:
        modulus, offset = integer
        return np.array([u % modulus - offset for u in words], dtype=numpy_type)
    shift, fraction = floating or (0, 0)
    return np.array([((u >> shift) - (1 << fraction)) / (1 << fraction) for u in words], dtype=numpy_type)


def cases(world: int) -> list[tuple[str, Collective, ReduceOp, str, int | None]]:
    """The README's case list for a group of ``world`` ranks."""
    out: list[tuple[str, Collective, ReduceOp, str, int | None]] = []
    for dtype in ("int32", "float32"):
        out += [
            (f"all_reduce_{dtype}_sum", Collective.ALL_REDUCE, ReduceOp.SUM, dtype, None),
            (f"all_reduce_{dtype}_avg", Collective.ALL_REDUCE, ReduceOp.AVG, dtype, None),
            (f"all_reduce_{dtype}_max", Collective.ALL_REDUCE, ReduceOp.MAX, dtype, None),
            (f"reduce_{dtype}_sum", Collective.REDUCE, ReduceOp.SUM, dtype, 1 % world),
            (f"broadcast_{dtype}", Collective.BROADCAST, ReduceOp.SUM, dtype, world - 1),
            (f"all_gather_{dtype}", Collective.ALL_GATHER, ReduceOp.SUM, dtype, None),
            (f"reduce_scatter_{dtype}_sum", Collective.REDUCE_SCATTER, ReduceOp.SUM, dtype, None),
        ]
    return [*out, ("barrier", Collective.BARRIER, ReduceOp.SUM, "int8", None)]


def digest(array: np.ndarray) -> str:
    return hashlib.sha256(array.astype(array.dtype.newbyteorder("<")).tobytes()).hexdigest()


async def run(env: dict[str, str]) -> dict[str, object]:
    world, elements = int(env["WORLD_SIZE"]), int(env["ELEMENTS"])
    spec = GroupSpec(
        group_id=bytes.fromhex(env["GROUP_ID"]),
        world_size=world,
        credential=env.get("CREDENTIAL", "").encode(),
        rank=int(env["RANK"]) if "RANK" in env else None,
        rendezvous=env["RENDEZVOUS"],
        rendezvous_id=env.get("RENDEZVOUS_ID", "rendezvous"),
    )
    transport = TransportConfig(
        ca_file=Path(env["CA"]),
        cert_file=Path(env["CERT"]),
        key_file=Path(env["KEY"]),
        keylog_file=Path(env["SSLKEYLOGFILE"]) if "SSLKEYLOGFILE" in env else None,
        qlog_dir=Path(env["QLOGDIR"]) if "QLOGDIR" in env else None,
    )
    comm = await Communicator.join(spec, env["NODE_ID"], transport)
    results: dict[str, str] = {}
    try:
        if env["WORKLOAD"] == "allreduce":
            for index in range(int(env["ROUNDS"])):
                data = draw(index, comm.rank, env["DTYPE"], elements)
                results[f"round-{index}"] = digest(await comm.all_reduce(data, ReduceOp.SUM))
        else:
            length = elements - elements % world
            for index, (name, kind, op, dtype, root) in enumerate(cases(world)):
                data = draw(index, comm.rank, dtype, length)
                array = None if kind is Collective.BARRIER else data
                result = await comm.start(CollectiveRequest(kind=kind, op=op, array=array, root=root))
                if result is not None:
                    results[name] = digest(result)
        rank = comm.rank
    finally:
        await comm.close()
    return {"rank": rank, "world_size": world, "results": results}


def main() -> int:
    env = dict(os.environ)
    if env.get("ROLE") != "endpoint" or env.get("WORKLOAD") not in ("allreduce", "collectives"):
        return UNSUPPORTED
    if "QUORUM" in env or env.get("DTYPE", "int32") not in DRAWS:
        return UNSUPPORTED
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # As cco-node does: compiled in the first large chunk instead, the loops hold the
    # event loop for seconds, heartbeats stop and the rendezvous evicts the rank.
    kernels.preload()
    try:
        report = asyncio.run(run(env))
    except Exception as error:  # a failed join or collective: say why, exit non-zero
        print(f"independent endpoint: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    Path(env["RESULTS"]).write_text(json.dumps(report) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
