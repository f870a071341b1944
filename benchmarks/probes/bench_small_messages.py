"""What the wire layer costs per message of a small collective (issue 8, latency).

An 8-byte float32 all-reduce over four ranks is one EXACT chunk of 18 limbs per rank.
Per round an endpoint seals and encodes its Contribution, decodes and verifies the
Result; the aggregator decodes four Contributions, checks the first, combines the
others into it and encodes the Result.  This times each of those functions on such a
chunk (best of five runs) and writes JSON.

Timings on a shared host move by tens of percent; instruction counts do not.  To
count one function's instructions, run it ``--calls`` times under valgrind and
subtract a run of 0 calls::

    python benchmarks/probes/bench_small_messages.py
    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python benchmarks/probes/bench_small_messages.py --only decode_message --calls 1000
    (the same with --calls 0; the difference of the "Collected" totals / 1000)
"""

from __future__ import annotations

import argparse
import json
import timeit
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cco.wire import payload
from cco.wire.dtypes import ELEMENT_TYPES
from cco.wire.exact import to_limbs
from cco.wire.mac import derive_group_keys
from cco.wire.messages import Result, decode_message, encode_message
from cco.wire.registries import Collective, DType, ReduceOp

RESULTS = Path(__file__).resolve().parent / "results" / "small_messages.json"
RANKS = 4


def operations() -> dict[str, Callable[[], object]]:
    """Each function of a round, bound to one 2-element float32 SUM chunk of 4 ranks."""
    keys = derive_group_keys(b"s" * 32, b"g" * 16)
    header = payload.ChunkHeader(
        group_id=b"g" * 16,
        epoch=1,
        op_id=5,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.FLOAT32,
        total_elements=18,
        chunk_elements=65536,
        chunk_index=0,
    )
    element = ELEMENT_TYPES[DType.FLOAT32]
    data = np.array([1.5, -2.25], dtype=np.float32)
    limbs = to_limbs(data, element)
    parts = [payload.seal(keys, header, rank, limbs) for rank in range(RANKS)]
    result = payload.combine(parts, Result)
    encoded = encode_message(result)
    everyone = frozenset(range(RANKS))
    return {
        "to_limbs": lambda: to_limbs(data, element),
        "seal": lambda: payload.seal(keys, header, 1, limbs),
        "encode_message": lambda: encode_message(result),
        "decode_message": lambda: decode_message(encoded),
        "check_part": lambda: payload.check_part(parts[1]),
        "combine": lambda: payload.combine([parts[0], parts[1]], Result),
        "open_verified": lambda: payload.open_verified(keys, result, everyone),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", help="run just this function --calls times (for valgrind), print nothing")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    ops = operations()
    if args.only is not None:
        if args.only not in ops:
            parser.error(f"--only takes one of {', '.join(ops)}")
        for _ in range(args.calls):
            ops[args.only]()
        return 0
    figures = {}
    for name, call in ops.items():
        best = min(timeit.repeat(call, number=args.calls, repeat=5)) / args.calls
        figures[name] = best
        print(f"{name:16} {best * 1e6:7.1f} us per call   (report)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"seconds_per_call": figures, "ranks": RANKS}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
