"""Stragglers: the strict and the quorum policy, in the in-memory cluster (issue 9).

Eight ranks under a two-level tree (a root and two leaf aggregators).  One rank
never starts the operation, or starts it late.  Strict (the default) waits for
every accepted member and fails naming the missing rank; quorum completes with the
ranks that came within the wait, names them, divides AVG by their number, and
gives a late rank the same verified result.  Nothing hangs: every outcome arrives
within the operation's timeout.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from cco.nodes.calls import CollectiveRequest, OperationError
from cco.nodes.events import Command, OperationCompleted, OperationFailed
from cco.nodes.operation import Quorum
from cco.nodes.sim import Deployment, GroupSpec, build_cluster
from cco.wire.errors import ErrorCode
from cco.wire.messages import GroupParams
from cco.wire.registries import Collective, ReduceOp

GROUP = bytes.fromhex("9e" * 16)
WORLD = 8
PARAMS = GroupParams(chunk_elements=4, window=3, heartbeat_interval_ms=1000, operation_timeout_ms=2000)
WAIT = 0.3
ABSENT = 7
EVERYONE_ELSE = frozenset(range(WORLD)) - {ABSENT}


def deploy(seed: int = 0) -> Deployment:
    return build_cluster([GroupSpec(GROUP, WORLD)], aggregators=3, params=PARAMS, max_fan_in=4, seed=seed)


def data(rank: int, dtype: type = np.int32, elements: int = 24) -> np.ndarray:
    """24 elements by default: float sums of them are block-scaled (a scale pass)."""
    return (np.arange(elements) * (rank + 1) + rank).astype(dtype)


def request(
    rank: int, quorum: Quorum | None, op: ReduceOp = ReduceOp.SUM, dtype: type = np.int32
) -> CollectiveRequest:
    return CollectiveRequest(kind=Collective.ALL_REDUCE, op=op, array=data(rank, dtype), quorum=quorum)


def wait_for(d: Deployment, op_ids: dict[int, int], duration: float = 10.0) -> dict[int, Command]:
    d.cluster.run(lambda: len(d.outcomes(GROUP, op_ids)) == len(op_ids), duration=duration)
    return d.outcomes(GROUP, op_ids)


def completed(outcomes: dict[int, Command]) -> dict[int, OperationCompleted]:
    assert all(isinstance(o, OperationCompleted) for o in outcomes.values()), outcomes
    return {r: o for r, o in outcomes.items() if isinstance(o, OperationCompleted)}


# --- a rank that never sends --------------------------------------------------------------


def test_strict_fails_every_rank_naming_the_rank_that_never_sent() -> None:
    d = deploy()
    started = d.cluster.now
    op_ids = d.start(GROUP, {r: request(r, None) for r in EVERYONE_ELSE})
    outcomes = wait_for(d, op_ids)
    assert set(outcomes) == EVERYONE_ELSE
    for outcome in outcomes.values():
        assert isinstance(outcome, OperationFailed) and isinstance(outcome.error, OperationError)
        assert outcome.error.code is ErrorCode.TIMEOUT and outcome.error.missing_ranks == frozenset({ABSENT})
    bound = PARAMS.operation_timeout_ms / 1000 + PARAMS.heartbeat_interval_ms / 1000
    assert d.cluster.now - started <= bound + 1.0


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX])
def test_quorum_completes_over_the_ranks_that_sent_and_names_them(op: ReduceOp) -> None:
    d = deploy(seed=1)
    started = d.cluster.now
    quorum = Quorum(min_ranks=WORLD - 1, wait=WAIT)
    outcomes = completed(wait_for(d, d.start(GROUP, {r: request(r, quorum, op) for r in EVERYONE_ELSE})))
    assert set(outcomes) == EVERYONE_ELSE
    stacked = np.stack([data(r).astype(np.int64) for r in sorted(EVERYONE_ELSE)])
    want = {ReduceOp.SUM: stacked.sum(0), ReduceOp.MAX: stacked.max(0)}.get(op)
    for outcome in outcomes.values():
        assert outcome.contributors == EVERYONE_ELSE
        assert outcome.result is not None
        if op is ReduceOp.AVG:  # over the 7 that contributed, rounded to the dtype
            exact = stacked.sum(0) / len(EVERYONE_ELSE)
            assert np.all(np.abs(outcome.result - exact) <= 0.5 + 1e-9)
        else:
            assert want is not None and outcome.result.tolist() == want.tolist()
    assert len({o.result.tobytes() for o in outcomes.values() if o.result is not None}) == 1
    assert d.cluster.now - started < PARAMS.operation_timeout_ms / 1000  # no timeout was waited for


def test_quorum_of_floats_agrees_its_scales_among_the_ranks_that_sent() -> None:
    """A float SUM is three passes under quorum: presence, scales, data; the scale of
    every block is set by a rank that contributes, so every attestation holds."""
    d = deploy(seed=2)
    quorum = Quorum(min_ranks=6, wait=WAIT)
    requests = {r: request(r, quorum, ReduceOp.SUM, np.float32) for r in EVERYONE_ELSE}
    outcomes = completed(wait_for(d, d.start(GROUP, requests)))
    exact = np.stack([data(r, np.float64) for r in sorted(EVERYONE_ELSE)]).sum(0)
    results = {o.result.tobytes() for o in outcomes.values() if o.result is not None}
    assert len(results) == 1
    some = next(iter(outcomes.values()))
    assert some.contributors == EVERYONE_ELSE and some.result is not None
    assert np.allclose(some.result, exact, rtol=1e-5, atol=1e-3)


def test_quorum_of_few_floats_is_exact_in_two_passes() -> None:
    """At most 16 floats: presence, then the data as exact limbs (no scale pass), and
    the average over the ranks that sent, rounded once."""
    d = deploy(seed=2)
    quorum = Quorum(min_ranks=6, wait=WAIT)
    requests = {
        r: CollectiveRequest(
            kind=Collective.ALL_REDUCE, op=ReduceOp.AVG, array=data(r, np.float32, 3), quorum=quorum
        )
        for r in EVERYONE_ELSE
    }
    op_ids = d.start(GROUP, requests)
    assert set(op_ids.values()) == {1}  # presence pass 0, data 1: no scale pass
    outcomes = completed(wait_for(d, op_ids))
    sums = [sum(Fraction(int(data(r)[j])) for r in EVERYONE_ELSE) for j in range(3)]
    want = [float(np.float32(float(s / len(EVERYONE_ELSE)))) for s in sums]
    for outcome in outcomes.values():
        assert outcome.contributors == EVERYONE_ELSE and outcome.result is not None
        assert outcome.result.tolist() == want


def test_a_quorum_not_reached_waits_then_fails_naming_the_missing() -> None:
    d = deploy(seed=3)
    quorum = Quorum(min_ranks=WORLD, wait=WAIT)
    outcomes = wait_for(d, d.start(GROUP, {r: request(r, quorum) for r in EVERYONE_ELSE}))
    for outcome in outcomes.values():
        assert isinstance(outcome, OperationFailed) and isinstance(outcome.error, OperationError)
        assert outcome.error.code is ErrorCode.TIMEOUT and outcome.error.missing_ranks == frozenset({ABSENT})
        assert "presence pass" in outcome.error.detail


# --- a rank that is late --------------------------------------------------------------------


def _late(quorum: Quorum | None, late_by: float, seed: int) -> tuple[Deployment, dict[int, Command]]:
    d = deploy(seed)
    op_ids = d.start(GROUP, {r: request(r, quorum) for r in EVERYONE_ELSE})
    d.cluster.run(lambda: False, duration=late_by)
    op_ids |= d.start(GROUP, {ABSENT: request(ABSENT, quorum)})
    return d, wait_for(d, op_ids)


def test_strict_waits_for_a_late_rank_and_counts_it() -> None:
    _, outcomes = _late(None, late_by=0.6, seed=4)
    want = np.stack([data(r).astype(np.int64) for r in range(WORLD)]).sum(0)
    for outcome in completed(outcomes).values():
        assert outcome.result is not None and outcome.result.tolist() == want.tolist()
        assert outcome.contributors is None  # strict: over every accepted member


def test_quorum_goes_on_without_a_late_rank_which_gets_the_same_result() -> None:
    d, outcomes = _late(Quorum(min_ranks=4, wait=WAIT), late_by=4 * WAIT, seed=5)
    done = completed(outcomes)
    assert set(done) == set(range(WORLD))
    want = np.stack([data(r).astype(np.int64) for r in sorted(EVERYONE_ELSE)]).sum(0)
    for outcome in done.values():
        assert outcome.contributors == EVERYONE_ELSE  # the late rank too: it did not contribute
        assert outcome.result is not None and outcome.result.tolist() == want.tolist()
    # every rank's sequence of operations stays aligned: the next one counts everybody
    everyone = {r: request(r, None) for r in range(WORLD)}
    after = completed(wait_for(d, d.start(GROUP, everyone)))
    total = np.stack([data(r).astype(np.int64) for r in range(WORLD)]).sum(0)
    assert all(o.result is not None and o.result.tolist() == total.tolist() for o in after.values())


def test_quorum_counts_a_rank_late_by_less_than_the_wait() -> None:
    _, outcomes = _late(Quorum(min_ranks=4, wait=1.0), late_by=0.2, seed=6)
    for outcome in completed(outcomes).values():
        assert outcome.contributors == frozenset(range(WORLD))


def test_quorum_is_not_lost_to_one_early_rank() -> None:
    """Rank 0 comes long before the others: its leaf goes on with it alone, so the
    others are late there, but not at the root, which still lacks its quorum and takes
    them as they come up."""
    d = deploy(seed=7)
    quorum = Quorum(min_ranks=6, wait=WAIT)
    op_ids = d.start(GROUP, {0: request(0, quorum)})
    d.cluster.run(lambda: False, duration=4 * WAIT)
    op_ids |= d.start(GROUP, {r: request(r, quorum) for r in range(1, WORLD)})
    done = completed(wait_for(d, op_ids))
    contributors = {o.contributors for o in done.values()}
    assert len(contributors) == 1
    (ranks,) = contributors
    assert ranks is not None and 0 in ranks and len(ranks) >= quorum.min_ranks
    want = np.stack([data(r).astype(np.int64) for r in sorted(ranks)]).sum(0)
    assert all(o.result is not None and o.result.tolist() == want.tolist() for o in done.values())


@pytest.mark.parametrize("when", ["presence", "data"])
def test_a_quorum_all_reduce_survives_the_loss_of_an_aggregator(when: str) -> None:
    """An aggregator dies during the presence pass, or once its members are decided
    and the data is on its way: the tree is re-planned over the spare, the operation
    starts again in the new epoch over the members its presence pass decided (or
    decides there), and every rank gets the same result."""
    d = build_cluster([GroupSpec(GROUP, WORLD)], aggregators=4, params=PARAMS, max_fan_in=4, seed=8)
    quorum = Quorum(min_ranks=6, wait=WAIT)
    requests = {r: request(r, quorum, ReduceOp.SUM, np.float32) for r in EVERYONE_ELSE}
    op_ids = d.start(GROUP, requests)

    def data_moving() -> bool:  # some rank's presence pass is done: its scale pass or data left
        return any(d.endpoint(GROUP, r).operation_state(op_ids[r] - 2) is None for r in EVERYONE_ELSE)

    if when == "presence":
        d.cluster.run(lambda: False, duration=0.5 * WAIT)
        assert not data_moving()
    else:
        assert d.cluster.run(data_moving, duration=5 * WAIT)
        assert not d.outcomes(GROUP, op_ids)
    in_tree = [a for a in d.aggregators if d.aggregator(a).group_epoch(GROUP) is not None]
    d.cluster.kill(next(a for a in in_tree if a != in_tree[0]))
    done = completed(wait_for(d, op_ids, duration=30.0))
    assert d.endpoint(GROUP, 0).epoch > 1
    exact = np.stack([data(r, np.float64) for r in sorted(EVERYONE_ELSE)]).sum(0)
    assert {o.contributors for o in done.values()} == {EVERYONE_ELSE}
    assert len({o.result.tobytes() for o in done.values() if o.result is not None}) == 1
    some = next(iter(done.values())).result
    assert some is not None and np.allclose(some, exact, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("seed", range(16))
def test_quorum_with_absent_late_ranks_and_a_lost_aggregator_never_hangs_or_disagrees(seed: int) -> None:
    """Random absent and late ranks, and an aggregator killed at a random moment: every
    rank that started the operation gets an outcome within the timeout, and the ranks
    that complete all have the same contributors and the same bits.  (A late rank
    that enters a presence pass run again after the loss can make the decision differ
    from the one some ranks kept: then every rank fails with OPERATION_MISMATCH.)"""
    rng = np.random.default_rng(seed)
    d = build_cluster([GroupSpec(GROUP, WORLD)], aggregators=5, params=PARAMS, max_fan_in=4, seed=seed)
    quorum = Quorum(min_ranks=5, wait=WAIT)
    dtype = np.float32 if seed % 2 else np.int32
    absent = set(rng.choice(WORLD, size=int(rng.integers(0, 3)), replace=False).tolist())
    late = {r for r in range(WORLD) if r not in absent and rng.random() < 0.2}
    on_time = set(range(WORLD)) - absent - late
    op_ids = d.start(GROUP, {r: request(r, quorum, ReduceOp.SUM, dtype) for r in on_time})
    d.cluster.run(lambda: False, duration=float(rng.uniform(0, 3 * WAIT)))
    tree = [a for a in d.aggregators if d.aggregator(a).group_epoch(GROUP) is not None]
    if rng.random() < 0.7:
        d.cluster.kill(tree[int(rng.integers(0, len(tree)))])
    op_ids |= d.start(GROUP, {r: request(r, quorum, ReduceOp.SUM, dtype) for r in late})
    outcomes = wait_for(d, op_ids, duration=PARAMS.operation_timeout_ms / 1000 + 5)
    assert set(outcomes) == set(op_ids), "every rank has an outcome: nothing hangs"
    done = [o for o in outcomes.values() if isinstance(o, OperationCompleted)]
    failed = [o for o in outcomes.values() if isinstance(o, OperationFailed)]
    assert len({o.contributors for o in done}) <= 1
    assert len({o.result.tobytes() for o in done if o.result is not None}) <= 1
    if done:
        (ranks,) = {o.contributors for o in done}
        assert ranks is not None and len(ranks) >= quorum.min_ranks and not ranks & absent
        want = np.stack([data(r, np.float64) for r in sorted(ranks)]).sum(0)
        result = done[0].result
        assert result is not None and np.allclose(result, want, rtol=1e-5, atol=1e-3)
    assert all(isinstance(o.error, OperationError) for o in failed)
