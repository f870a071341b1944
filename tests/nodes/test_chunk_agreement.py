"""A float SUM's ranks agree its chunk size in its scale pass: the smallest proposal,
cut alike on every rank, bit-identical results, and the same again after a restart."""

from __future__ import annotations

import numpy as np
import pytest

from cco.nodes.calls import CollectiveRequest
from cco.nodes.events import ChunkAgreement, OperationCompleted
from cco.nodes.rendezvous_config import DEFAULT_PARAMS
from cco.nodes.sim import Deployment, GroupSpec, build_cluster
from cco.wire.messages import Contribution, Result
from cco.wire.registries import Collective, DType, ReduceOp

GROUP = bytes.fromhex("c2" * 16)
RANKS = 4
ELEMENTS = 1 << 20  # 4 MiB of float32 per rank: eight chunks of the largest size
FAST = 1e9  # bytes per second: proposes the group's largest chunk
BASE = DEFAULT_PARAMS.chunk_elements
LARGEST = DEFAULT_PARAMS.scaled_chunk_limit


def deployment(aggregators: int = 1) -> Deployment:
    cluster = build_cluster(
        [GroupSpec(GROUP, RANKS)], aggregators=aggregators, params=DEFAULT_PARAMS, max_fan_in=RANKS
    )
    cluster.cluster.record = True
    return cluster


def inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    # integers in float32: the sum is exact, so every rank must hold it bit for bit
    return [rng.integers(-1000, 1000, ELEMENTS).astype(np.float32) for _ in range(RANKS)]


def set_goodput(cluster: Deployment, goodputs: list[float | None]) -> None:
    for rank, value in enumerate(goodputs):
        goodput = cluster.endpoint(GROUP, rank).goodput
        assert goodput is not None
        goodput.value = value


def all_reduce(cluster: Deployment, arrays: list[np.ndarray]) -> list[np.ndarray]:
    requests = {
        rank: CollectiveRequest(kind=Collective.ALL_REDUCE, op=ReduceOp.SUM, array=x)
        for rank, x in enumerate(arrays)
    }
    outcomes = cluster.collective(GROUP, requests)
    results = []
    for rank in range(RANKS):
        outcome = outcomes[rank]
        assert isinstance(outcome, OperationCompleted), outcome
        assert outcome.result is not None
        results.append(outcome.result)
    return results


def data_chunk_sizes(cluster: Deployment) -> dict[str, set[int]]:
    """chunk_elements of the float32 Contributions and Results delivered, by kind."""
    sizes: dict[str, set[int]] = {"up": set(), "down": set(), "scale pass": set()}
    for delivery in cluster.cluster.deliveries:
        message = delivery.message
        if isinstance(message, Contribution | Result):
            if message.dtype is DType.INT16:
                sizes["scale pass"].add(message.chunk_elements)
            elif message.dtype is DType.FLOAT32:
                sizes["up" if isinstance(message, Contribution) else "down"].add(message.chunk_elements)
    return sizes


@pytest.mark.parametrize(
    ("goodputs", "agreed"),
    [
        ([None] * RANKS, BASE),  # nobody has measured: the base chunk
        ([FAST] * RANKS, LARGEST),
        ([FAST, FAST, None, FAST], BASE),  # the slowest (here, unmeasured) rank decides
        ([FAST, 10e6, FAST, FAST], 2 * BASE),
    ],
)
def test_the_ranks_cut_the_data_at_the_smallest_proposal(goodputs: list[float | None], agreed: int) -> None:
    cluster = deployment()
    set_goodput(cluster, goodputs)
    arrays = inputs()
    results = all_reduce(cluster, arrays)
    expected = np.sum(arrays, axis=0, dtype=np.float64).astype(np.float32)
    for result in results:
        np.testing.assert_array_equal(result, expected)
    assert data_chunk_sizes(cluster) == {"up": {agreed}, "down": {agreed}, "scale pass": {BASE}}


def test_each_rank_reports_the_planned_agreed_and_proposed_chunk_sizes() -> None:
    """With the results, as data for its service: the size its data was cut at, the
    one planned, and this rank's own proposal (the slowest rank's is the agreed one)."""
    cluster = deployment()
    set_goodput(cluster, [FAST, 10e6, FAST, FAST])
    requests = {
        rank: CollectiveRequest(kind=Collective.ALL_REDUCE, op=ReduceOp.SUM, array=x)
        for rank, x in enumerate(inputs())
    }
    outcomes = cluster.collective(GROUP, requests)
    proposed = [LARGEST, 2 * BASE, LARGEST, LARGEST]
    for rank in range(RANKS):
        outcome = outcomes[rank]
        assert isinstance(outcome, OperationCompleted), outcome
        assert outcome.chunk_elements == 2 * BASE
        assert outcome.agreement == ChunkAgreement(planned=BASE, agreed=2 * BASE, proposed=proposed[rank])
    ones = np.ones(9, np.int32)
    ints = {rank: CollectiveRequest(kind=Collective.ALL_REDUCE, array=ones) for rank in range(RANKS)}
    for outcome in cluster.collective(GROUP, ints).values():
        assert isinstance(outcome, OperationCompleted)
        assert outcome.agreement is None and outcome.chunk_elements == BASE  # no scale pass


def test_a_rank_measures_its_goodput_from_its_operations() -> None:
    """In the simulation no time passes while messages move, so nothing is measured;
    a rank's own figure is what it proposes from, whatever the others'."""
    cluster = deployment()
    all_reduce(cluster, inputs())
    assert all(cluster.endpoint(GROUP, r).goodput.value is None for r in range(RANKS))  # type: ignore[union-attr]


def test_an_operation_restarted_in_a_new_tree_agrees_the_same_chunks() -> None:
    """The tree fails after the scale pass agreed a size: the ranks run it again in
    the next tree, from the same proposals, and cut the data alike again."""
    cluster = deployment(aggregators=2)
    set_goodput(cluster, [FAST] * RANKS)
    arrays = inputs()
    requests = {
        rank: CollectiveRequest(kind=Collective.ALL_REDUCE, op=ReduceOp.SUM, array=x)
        for rank, x in enumerate(arrays)
    }
    op_ids = cluster.start(GROUP, requests)

    def some_data_sent() -> bool:
        return bool(data_chunk_sizes(cluster)["up"])

    assert cluster.cluster.run(some_data_sent)
    used = {d.destination for d in cluster.cluster.deliveries if isinstance(d.message, Contribution)}
    (aggregator,) = used & set(cluster.aggregators)
    set_goodput(cluster, [None] * RANKS)  # what they measure now does not change the restarted call
    cluster.cluster.kill(aggregator)
    cluster.cluster.run(lambda: len(cluster.outcomes(GROUP, op_ids)) == RANKS, duration=300)
    outcomes = cluster.outcomes(GROUP, op_ids)
    expected = np.sum(arrays, axis=0, dtype=np.float64).astype(np.float32)
    for rank in range(RANKS):
        outcome = outcomes[rank]
        assert isinstance(outcome, OperationCompleted), outcome
        np.testing.assert_array_equal(outcome.result, expected)
    assert data_chunk_sizes(cluster)["up"] == {LARGEST}
