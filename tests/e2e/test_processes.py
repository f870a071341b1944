"""End to end with real processes over loopback UDP.

One rendezvous, three aggregators in a two-level tree and eight endpoints, each a
separate ``cco-node`` process.  Every endpoint runs the conformance workload (every
collective; int32 and float32; SUM, AVG and MAX) on inputs derived from a seed, and
saves its results.  This test recomputes every rank's input from the seed, computes
exact references with Python integers and rationals, and checks every result
against them and bit for bit across ranks.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import reference
from logcheck import log_problems

from cco.jobs import WORKLOAD_SEED
from cco.localcluster import ClusterSpec, LocalCluster
from cco.wire.blockscale import DEFAULT_BLOCK_ELEMENTS
from cco.wire.registries import Collective, DType, ReduceOp
from cco.workload import Case, conformance_cases, exact_reduce, make_input

WORLD = 8
ELEMENTS = 4096
CHUNK = 1024


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, np.ndarray]]:
    workdir = tmp_path_factory.mktemp("e2e")
    spec = ClusterSpec(
        aggregators=3,
        endpoints=WORLD,
        max_fan_in=4,
        workload="conformance",
        elements=ELEMENTS,
        chunk_elements=CHUNK,
    )
    with LocalCluster(spec, workdir) as cluster:
        cluster.start()
        files = cluster.run_endpoints(timeout=240)
        aggregator_logs = [p.read_text() for p in cluster.infrastructure_logs[1:]]
    logs = sorted(workdir.glob("*.log"))
    assert len(logs) == 1 + 3 + WORLD, "a log for every node"
    assert log_problems(logs) == [], "no node logged an ERROR or a traceback"
    # The run used epoch 1 (later epochs come from the endpoints leaving at the end):
    # a two-level tree, one root without a parent over two leaves with four ranks each.
    assignments = [
        line for text in aggregator_logs for line in text.splitlines() if "epoch 1: tree parent" in line
    ]
    assert len(assignments) == 3, assignments
    assert sum("tree parent none" in line for line in assignments) == 1
    assert (
        sum(
            line.endswith("expected [0, 1, 2, 3]") or line.endswith("expected [4, 5, 6, 7]")
            for line in assignments
        )
        == 2
    )
    loaded = []
    for path in files:
        with np.load(path) as archive:
            loaded.append({name: archive[name] for name in archive.files})
    return loaded


def _inputs(index: int, case: Case) -> list[np.ndarray]:
    return [make_input(WORKLOAD_SEED, index, rank, case.dtype, ELEMENTS) for rank in range(WORLD)]


def _check_reduction(
    result: np.ndarray, exact: list[Fraction], case: Case, inputs: list[np.ndarray], part: slice
) -> None:
    """``result`` is ``part`` of the reduction: exact for integers and for MAX (floats
    travel as order-preserving keys); within the block-scaled bound for float sums."""
    want = exact[part]
    if case.dtype is DType.INT32:
        expected = [round(value) for value in want]  # round() on a Fraction: half to even
        assert result.dtype == np.int32
        assert [int(v) for v in result] == expected
        return
    assert result.dtype == np.float32
    if case.op is ReduceOp.MAX:
        assert [Fraction(float(v)) for v in result] == want
        return
    divisor = WORLD if case.op is ReduceOp.AVG else 1
    wanted = np.array([float(v) for v in exact])
    bound = reference.block_scaled_tolerance(
        inputs, CHUNK, DEFAULT_BLOCK_ELEMENTS, 32, WORLD, 24, wanted, divisor
    )
    assert (np.abs(result.astype(np.float64) - wanted[part]) <= bound[part]).all()


@pytest.mark.parametrize("index", range(len(conformance_cases(WORLD))))
def test_case_matches_reference_on_every_rank(results: list[dict[str, np.ndarray]], index: int) -> None:
    case = conformance_cases(WORLD)[index]
    holders = [rank for rank in range(WORLD) if case.name in results[rank]]
    if case.kind is Collective.BARRIER:
        assert holders == [], "a barrier returns no array"
        return
    if case.kind is Collective.REDUCE:
        assert holders == [case.root], "only the root of a reduce gets the result"
    elif case.kind is not Collective.REDUCE_SCATTER:
        assert holders == list(range(WORLD))
        # Bit-identical on every rank.
        first = results[0][case.name]
        assert all(results[r][case.name].tobytes() == first.tobytes() for r in range(WORLD))
    inputs = _inputs(index, case)
    if case.kind is Collective.BROADCAST:
        assert results[0][case.name].tobytes() == inputs[case.root or 0].tobytes()
    elif case.kind is Collective.ALL_GATHER:
        assert results[0][case.name].tobytes() == np.stack(inputs).tobytes()
    elif case.kind is Collective.REDUCE_SCATTER:
        exact = exact_reduce(inputs, case.op)
        size = ELEMENTS // WORLD
        for rank in range(WORLD):
            part = slice(rank * size, (rank + 1) * size)
            _check_reduction(results[rank][case.name], exact, case, inputs, part)
    else:
        _check_reduction(
            results[holders[0]][case.name], exact_reduce(inputs, case.op), case, inputs, slice(None)
        )
