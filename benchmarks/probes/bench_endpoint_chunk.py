"""What an endpoint's CPU does per chunk of a large float32 all-reduce (issue 8).

In a 64 MiB all-reduce on loopback the four endpoints, not the aggregator, use most
of the two cores: each handles 256 chunks of 64 Ki float32 elements per round.  Per
chunk it proposes the blocks' scales, quantizes the chunk into its integers and
attestations, seals (packs and tags) and encodes it; for the Result it decodes,
verifies (range, attestations, tag) and dequantizes into the result.  The
aggregator's step is timed too: the four parts added into one aggregate, which is
packed into the message it sends on.  This times each step alone on one core in CPU
seconds (the process's, best of seven runs, so that other work on a shared host
counts less than in wall time) and writes JSON, so that a change to one of them
shows here in the same minutes, away from the host's noise on whole runs.  QUIC,
the event loop and the workload's own input and digest are not in it.

glibc returns the pages of a large temporary to the kernel when it is freed at the
top of the heap, and an isolated loop of one step does that on every call: quantize
then measured 609 us, most of it page faults on fresh memory.  A node process
mixes many allocations and mostly reuses its pages (9,000 to 18,000 faults in 8 s
of a 64 MiB all-reduce for an endpoint and the aggregator together: tens of ms of
their 16 CPU-seconds), so this benchmark keeps freed memory for reuse (glibc's
``mallopt``), as that process mostly does.

    python benchmarks/probes/bench_endpoint_chunk.py
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import ctypes
import json
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cco.wire import blockscale, kernels, payload
from cco.wire.dtypes import ELEMENT_TYPES
from cco.wire.mac import CoefficientCache, derive_group_keys
from cco.wire.messages import PartialAggregate, Result, decode_message, encode_message
from cco.wire.registries import Collective, DType, ReduceOp

RESULTS = Path(__file__).resolve().parent / "results" / "endpoint_chunk.json"
RANKS = 4
AGGREGATOR_STEPS = ("aggregate",)
BLOCK = blockscale.DEFAULT_BLOCK_ELEMENTS
WIDTH = 4  # float32's own


def keep_freed_memory() -> None:
    """Heap memory below 32 MiB is reused rather than returned to the kernel (glibc)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-2, 32 << 20)  # M_TOP_PAD


def steps(elements: int) -> dict[str, Callable[[], object]]:
    """Each per-chunk step of one rank, bound to a float32 SUM chunk of ``RANKS`` ranks."""
    element = ELEMENT_TYPES[DType.FLOAT32]
    keys = derive_group_keys(b"s" * 32, b"g" * 16)
    inputs = [np.random.default_rng(r).random(elements, dtype=np.float32) * 2 - 1 for r in range(RANKS)]
    limit = blockscale.sum_limit(WIDTH, RANKS)
    proposals = [blockscale.propose(x, element, BLOCK, limit) for x in inputs]
    agreed = np.minimum.reduce(proposals)
    header = payload.ChunkHeader(
        group_id=b"g" * 16,
        epoch=1,
        op_id=5,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.FLOAT32,
        total_elements=elements,
        chunk_elements=elements,
        chunk_index=0,
        width=WIDTH,
        block_elements=BLOCK,
        scales=agreed.astype("<i2").tobytes(),
    )

    def chunk_values(rank: int) -> np.ndarray:
        return blockscale.chunk_integers(
            inputs[rank], element, agreed, proposals[rank], BLOCK, limit, width=WIDTH
        )

    parts = [payload.seal(keys, header, rank, chunk_values(rank)) for rank in range(RANKS)]
    result = payload.combine(parts, Result)
    encoded = encode_message(result)
    everyone = frozenset(range(RANKS))
    verified = payload.open_verified(keys, result, everyone)
    own = chunk_values(0)
    # As in the endpoint, sealing keeps the chunk's coefficients and verifying
    # its Result takes them back; each timed verification gets them again.
    cache = CoefficientCache(1)
    payload.seal(keys, header, 0, own, coefficients=cache)
    chunk_id = header.chunk_id()
    kept = cache.take(keys, chunk_id, len(own))
    assert kept is not None

    def open_verified() -> np.ndarray:
        cache.keep(keys, chunk_id, kept)
        return payload.open_verified(keys, result, everyone, coefficients=cache)

    stored = np.empty(elements, dtype=np.float32)

    def dequantize() -> np.ndarray:
        return blockscale.dequantize(verified, agreed, BLOCK, 1, element, out=stored)

    def aggregate() -> object:
        combined = payload.Aggregate(parts[0])
        for part in parts[1:]:
            combined.add(part)
        return combined.message(PartialAggregate)

    return {
        "propose": lambda: blockscale.propose(inputs[0], element, BLOCK, limit),
        "quantize": lambda: chunk_values(0),
        "seal": lambda: payload.seal(keys, header, 0, own, coefficients=cache),
        "encode_message": lambda: encode_message(parts[0]),
        "decode_message": lambda: decode_message(encoded),
        "open_verified": open_verified,
        "dequantize": dequantize,
        "aggregate": aggregate,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--elements", type=int, default=1 << 17, help="float32 elements per chunk")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = {}
    for name, step in steps(args.elements).items():
        calls = 20
        seconds = min(timeit.repeat(step, number=calls, repeat=7, timer=time.process_time)) / calls
        rows[name] = seconds
        print(f"{name:16} {seconds * 1e6:8.0f} us   {args.elements * 4 / seconds / 1e6:7.0f} MB/s of float32")
    total = sum(seconds for name, seconds in rows.items() if name not in AGGREGATOR_STEPS)
    rate = args.elements * 4 / total / 1e6
    print(f"{'endpoint steps':16} {total * 1e6:8.0f} us   {rate:7.0f} MB/s of float32 per CPU second")
    moved = (RANKS + 1) * args.elements * 4  # the parts in, the aggregate out
    aggregate = rows["aggregate"]
    print(f"{'aggregator':16} {aggregate * 1e6:8.0f} us   {moved / aggregate / 1e6:7.0f} MB/s in plus out")
    path = kernels.active()
    print(f"the MAC's inner product on {path} (CCO_KERNELS=numpy or numba chooses)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": "bench_endpoint_chunk",
        "elements": args.elements,
        "ranks": RANKS,
        "inner_product": path,
        "seconds": rows,
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    keep_freed_memory()  # for this process only: not when main() is called by a test
    raise SystemExit(main())
