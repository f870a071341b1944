"""benchmarks/probes/bench_endpoint_chunk.py: the steps it times are those of a real float32
chunk (what it seals is the rank's quantized input, and the Result it verifies
dequantizes to the four ranks' sum), and it writes every figure, so the figures in
BENCHMARKS.md stay reproducible."""

from __future__ import annotations

import json
from pathlib import Path

import bench_endpoint_chunk  # benchmarks/ is not a package: found through the path set above
import numpy as np

from cco.wire.messages import Contribution, Result

ELEMENTS = 1024


def test_the_timed_steps_are_a_real_chunk() -> None:
    steps = bench_endpoint_chunk.steps(ELEMENTS)
    blocks = ELEMENTS // bench_endpoint_chunk.BLOCK
    sealed = steps["seal"]()
    assert isinstance(sealed, Contribution) and sealed.width == 4
    assert len(sealed.payload) == 4 * (ELEMENTS + blocks)
    decoded = steps["decode_message"]()
    assert isinstance(decoded, Result) and decoded.contributors == b"\x0f"
    inputs = [np.random.default_rng(r).random(ELEMENTS, dtype=np.float32) * 2 - 1 for r in range(4)]
    exact = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    total = steps["dequantize"]()
    assert isinstance(total, np.ndarray) and total.dtype == np.float32
    # the block-scaled error bound: four conversions of at most 2^-29 each (every block's
    # scale is 28 or 29 here), then half a float32 ulp of a sum below 4 (2^-22)
    np.testing.assert_allclose(total, exact, rtol=0, atol=1e-6)
    assert not np.array_equal(total, inputs[0])


def test_it_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "chunk.json"
    assert bench_endpoint_chunk.main(["--elements", str(ELEMENTS), "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert set(record["seconds"]) == set(bench_endpoint_chunk.steps(ELEMENTS))
    assert record["elements"] == ELEMENTS and all(s > 0 for s in record["seconds"].values())
