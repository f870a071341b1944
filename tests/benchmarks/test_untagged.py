"""benchmarks/support/untagged.py, the "tags off" side of the authentication-cost figure: with
tagging disabled every tag an endpoint seals or expects is zero, whichever path the
MAC takes (coefficients and pads kept between sealing and verifying, or not), so a
group of such endpoints completes its rounds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks" / "support"

ROUND = """
import sys
sys.path.insert(0, {benchmarks!r})
import numpy as np
import untagged
untagged.disable_tagging()
from cco.wire import payload
from cco.wire.mac import CoefficientCache, derive_group_keys
from cco.wire.messages import Result
from cco.wire.registries import Collective, DType, ReduceOp

keys = derive_group_keys(b"s" * 32, b"g" * 16)
header = payload.ChunkHeader(group_id=b"g" * 16, epoch=1, op_id=5, kind=Collective.ALL_REDUCE,
    op=ReduceOp.SUM, dtype=DType.INT32, total_elements={elements}, chunk_elements=65536, chunk_index=0)
caches = [CoefficientCache(4) for _ in range(4)]
values = [np.arange({elements}, dtype=np.int64) * (rank + 1) for rank in range(4)]
parts = [payload.seal(keys, header, rank, values[rank], coefficients=caches[rank]) for rank in range(4)]
assert [part.tag for part in parts] == [0, 0, 0, 0], [part.tag for part in parts]
result = payload.combine(parts, Result)
assert result.tag == 0
for rank in range(4):
    total = payload.open_verified(keys, result, frozenset(range(4)), coefficients=caches[rank])
    assert total.tolist() == (np.arange({elements}) * 10).tolist()
print("ok")
"""


def run_round(elements: int) -> subprocess.CompletedProcess[str]:
    code = ROUND.format(benchmarks=str(BENCHMARKS), elements=elements)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_tags_off_seals_and_expects_zero_for_small_and_large_chunks() -> None:
    for elements in (2, 18, 4096):  # the small-chunk path and the block loop
        done = run_round(elements)
        assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
