"""Two ranks of tests/client/test_compiled_loops_at_join.py in one fresh process, on one
event loop: they join the job (``CCO_PKI_DIR``, ``CCO_RENDEZVOUS``) and run their first
collectives (float32 all-reduces that take the compiled loops) while a probe on the loop
measures how long the loop went without turning, in the loop thread's CPU seconds
(time.thread_time: what the loop itself ran, whatever else competes for the host's
cores).  Prints one JSON line: that longest stall, whether numba was imported before
the join and after it, and the argument types numba loaded during the collectives.

``--no-preload`` joins without loading the compiled loops first (the test's contrast).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import numpy as np

from cco.client import Communicator, GroupSpec
from cco.transport import TransportConfig

PROBE_INTERVAL = 0.005
ELEMENTS = 1 << 18
ROUNDS = 3


class StallProbe:
    """Wakes every few milliseconds and keeps the largest loop-thread CPU time spent
    between two of its turns: the longest stretch the loop ran something else."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            before = time.thread_time()
            await asyncio.sleep(PROBE_INTERVAL)
            self.longest = max(self.longest, time.thread_time() - before)

    def stop(self) -> float:
        assert self._task is not None
        self._task.cancel()
        return self.longest


def loaded_types() -> set[str]:
    """The argument types numba holds loops for, over every loop cco compiles."""
    if "numba" not in sys.modules:
        return set()
    from cco.wire import kernels

    types: set[str] = set()
    for function in (kernels.offset_product_sums, kernels.scaled_back):
        dispatcher: Any = kernels._compiled(function)
        if dispatcher is not None:
            types |= {f"{function.__name__}{signature}" for signature in dispatcher.overloads}
    return types


async def main(preload: bool) -> dict[str, Any]:
    pki = os.environ["CCO_PKI_DIR"]
    numba_before = "numba" in sys.modules
    probe = StallProbe()
    probe.start()
    specs = [
        GroupSpec(group_id=bytes.fromhex("f1" * 16), world_size=2, credential=b"first", rank=rank)
        for rank in range(2)
    ]
    transports = [TransportConfig.for_node(pki, f"fc-{rank}") for rank in range(2)]
    comms = await asyncio.gather(
        *(Communicator.join(specs[r], f"fc-{r}", transports[r], 60, preload=preload) for r in range(2))
    )
    joined_stall = probe.stop()
    numba_at_join = "numba" in sys.modules
    types_at_join = loaded_types()
    probe = StallProbe()
    probe.start()
    inputs = [np.linspace(-1, 1, ELEMENTS, dtype=np.float32) * (r + 1) for r in range(2)]
    for _ in range(ROUNDS):
        results = await asyncio.gather(*(comm.all_reduce(inputs[comm.rank], timeout=120) for comm in comms))
        assert np.array_equal(results[0], results[1])
    stall = probe.stop()
    loaded = sorted(loaded_types() - types_at_join)
    await asyncio.gather(*(comm.close() for comm in comms))
    return {
        "numba_before": numba_before,
        "numba_at_join": numba_at_join,
        "join_stall": joined_stall,
        "stall": stall,
        "loaded_in_session": loaded,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main("--no-preload" not in sys.argv))), flush=True)
