"""What an aggregator's accumulator costs per part, with numpy and with numba.

For each wire width, the best of ``--repeats`` timings of adding one part of
``--elements`` integers into an int64 accumulator and finding its extremes
(``kernels.accumulate``), numpy against the compiled loop; and what loading numba
and compiling the loop costs a fresh process (resident memory and CPU), which is
why ``accumulate`` compiles only on request.

    python benchmarks/probes/bench_accumulate.py --elements 32768
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

from cco.wire import kernels

LOAD = """
import time, numpy as np
import cco.transport, cco.wire.payload
from cco.wire import kernels
def rss():  # KiB resident now (ru_maxrss would carry the parent's peak across exec)
    status = open("/proc/self/status").read().split("VmRSS:")[1]
    return int(status.split()[0])
before = rss()
cpu = time.process_time()
kernels.accumulate(np.zeros(64, np.int64), np.zeros(64, np.int32), compiled=True)
print(kernels.active(), before, rss(), time.process_time() - cpu)
"""


def best(function: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--elements", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(1)
    print(f"one part of {args.elements} integers into int64, best of {args.repeats} (us):")
    for width in (1, 2, 4, 8):
        part = rng.integers(-100, 100, args.elements, dtype=f"<i{width}")
        part.flags.writeable = False  # as a received payload's view
        total = np.zeros(args.elements, np.int64)
        kernels.accumulate(total, part, compiled=True)  # compiled before it is timed
        numpy_path = best(functools.partial(kernels.accumulate, total, part), args.repeats)
        compiled = best(functools.partial(kernels.accumulate, total, part, compiled=True), args.repeats)
        print(f"  width {width}: numpy {numpy_path * 1e6:6.1f}   {kernels.active()} {compiled * 1e6:6.1f}")
    out = subprocess.run(
        [sys.executable, "-c", LOAD], capture_output=True, text=True, check=True
    ).stdout.split()
    active, before, after, cpu = out[0], int(out[1]), int(out[2]), float(out[3])
    print(
        f"a fresh process (Linux) loading the loop ({active}): RSS {before / 1024:.0f} -> "
        f"{after / 1024:.0f} MiB, {cpu:.2f} CPU s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
