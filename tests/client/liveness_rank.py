"""One rank of tests/client/test_liveness.py, as its own process (so that it can be
stopped and killed): joins with the job's PKI (``CCO_PKI_DIR``, ``CCO_RENDEZVOUS``),
then answers each line on stdin with one JSON line on stdout:

* ``allreduce N``: an int64 all-reduce of ``arange(N) * (rank + 1)``; prints the result
  (or the error: code, missing ranks, text) and the epoch the session is in;
* ``close``: leaves and exits.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from cco.client import BlockingCommunicator, GroupSpec
from cco.nodes.calls import OperationError
from cco.wire.errors import CcoError


def main() -> int:
    rank = int(sys.argv[1])
    world = int(sys.argv[2])
    spec = GroupSpec(group_id=bytes.fromhex("1e" * 16), world_size=world, credential=b"liveness", rank=rank)
    comm = BlockingCommunicator.from_pki(spec, f"ep-{rank}", os.environ["CCO_PKI_DIR"], timeout=60)
    say({"joined": comm.rank, "epoch": comm._comm.epoch})
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["allreduce"]:
            x = np.arange(int(words[1]), dtype=np.int64) * (rank + 1)
            try:
                total = comm.all_reduce(x, timeout=120)
            except CcoError as exc:
                missing = exc.missing_ranks if isinstance(exc, OperationError) else None
                say(
                    {
                        "error": exc.code.name,
                        "missing": sorted(missing or ()),
                        "text": str(exc),
                        "epoch": comm._comm.epoch,
                    }
                )
                continue
            expected = np.arange(x.size, dtype=np.int64) * sum(range(1, world + 1))
            say({"exact": bool(np.array_equal(total, expected)), "epoch": comm._comm.epoch})
        elif words[:1] == ["close"]:
            comm.close(linger=False)
            return 0
    return 0


def say(record: dict[str, object]) -> None:
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    sys.exit(main())
