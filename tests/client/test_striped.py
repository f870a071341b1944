"""One job's collectives striped over two groups (:mod:`cco.client.striped`), over real
QUIC on 127.0.0.1.

Two aggregators each serve one group at most, so the two stripes' groups must land on
different aggregators whatever the placement policy.  Every striped call is compared
bit for bit with the same call run whole on stripe 0 (exactly the unstriped
communicator: stripe 0 is the caller's GroupSpec as it is) and with the exact values.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest
from quic_cluster import Cluster, run

from cco.client import BlockingCommunicator, Communicator, GroupSpec, StripedCommunicator
from cco.client.striped import (
    CUT_ALIGNMENT,
    MIN_STRIPE_ELEMENTS,
    cuts,
    stripe_group_id,
    stripe_node_id,
    stripe_spec,
)
from cco.nodes.endpoint import EndpointMachine
from cco.transport import TransportConfig, create_dev_pki
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import GroupParams
from cco.wire.registries import DType, Role

WORLD = 4
STRIPES = 2
RELAXED = GroupParams(chunk_elements=8192, window=4, heartbeat_interval_ms=2000, operation_timeout_ms=60_000)
"""Heartbeats 2 s apart: eight endpoint sessions, two aggregators and the rendezvous
share this test's one event loop, which a busy machine slows; every loss these tests
make is a Leave, told at once.  8192 divides CUT_ALIGNMENT, so striped float sums
are the unstriped ones bit for bit."""

LARGE = 3 * CUT_ALIGNMENT + 1000
"""Above two stripes' minimum, and not a multiple of the cut: runs of unequal length."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    nodes = [("rendezvous", Role.RENDEZVOUS), ("agg-0", Role.AGGREGATOR), ("agg-1", Role.AGGREGATOR)]
    nodes += [(stripe_node_id(f"ep-{i}", k), Role.ENDPOINT) for i in range(WORLD) for k in range(STRIPES)]
    create_dev_pki(directory, nodes)
    return directory


def test_cuts_are_contiguous_aligned_near_equal_and_only_for_large_calls() -> None:
    assert cuts(10**7, 1) is None
    assert cuts(STRIPES * MIN_STRIPE_ELEMENTS - 1, STRIPES) is None
    for elements, stripes in [(2 * MIN_STRIPE_ELEMENTS, 2), (LARGE, 2), (10**7 + 3, 3), (10**6, 4)]:
        runs = cuts(elements, stripes)
        assert runs is not None and len(runs) == stripes
        assert runs[0][0] == 0 and runs[-1][1] == elements
        assert all(a[1] == b[0] for a, b in itertools.pairwise(runs))
        assert all(start % CUT_ALIGNMENT == 0 for start, _ in runs)
        lengths = [stop - start for start, stop in runs]
        assert min(lengths) >= 1 and max(lengths) - min(lengths) <= CUT_ALIGNMENT


def test_every_rank_derives_the_same_stripe_groups_and_node_ids() -> None:
    base = bytes(range(16))
    spec = GroupSpec(group_id=base, world_size=WORLD, credential=b"pw", rank=1, labels=("x",))
    assert stripe_group_id(base, 0) == base
    derived = {stripe_group_id(base, k) for k in range(1, 4)}
    assert len(derived) == 3 and base not in derived and all(len(g) == 16 for g in derived)
    assert stripe_group_id(base, 1) == stripe_group_id(bytes(range(16)), 1)
    one = stripe_spec(spec, 1)
    assert (one.world_size, one.rank, one.credential, one.labels, one.rendezvous) == (
        WORLD,
        1,
        b"pw",
        ("x",),
        spec.rendezvous,
    )
    assert stripe_spec(spec, 0) is spec
    assert (stripe_node_id("ep-3", 0), stripe_node_id("ep-3", 2)) == ("ep-3", "ep-3.s2")


def test_elastic_groups_are_refused_at_join(pki: Path) -> None:
    spec = GroupSpec(group_id=b"e" * 16, world_size=WORLD, elastic=True, rendezvous="127.0.0.1:9")
    transports = [TransportConfig.for_node(pki, stripe_node_id("ep-0", k)) for k in range(STRIPES)]

    async def join() -> None:
        await StripedCommunicator.join(spec, "ep-0", transports, timeout=5)

    with pytest.raises(CcoError) as refused:
        run(join)
    assert refused.value.code is ErrorCode.UNSUPPORTED_FEATURE and "elastic" in str(refused.value)


async def _striped_cluster(pki: Path, group: bytes) -> tuple[Cluster, list[StripedCommunicator]]:
    cluster = Cluster(pki, aggregators=2, params=RELAXED, capacity=1)
    await cluster.start()
    spec = GroupSpec(group_id=group, world_size=WORLD, credential=b"pw", rendezvous=cluster.rendezvous)
    try:
        comms = await asyncio.gather(
            *[
                StripedCommunicator.join(
                    spec,
                    f"ep-{i}",
                    [cluster.transport(stripe_node_id(f"ep-{i}", k)) for k in range(STRIPES)],
                    timeout=60,
                )
                for i in range(WORLD)
            ]
        )
    except BaseException:
        await cluster.close()
        raise
    for comm in comms:
        cluster.communicators += comm.stripes
    return cluster, sorted(comms, key=lambda c: c.rank)


def _operations(comm: Communicator) -> int:
    """How many wire operations this stripe's session has started."""
    machine = comm.service.machine
    assert isinstance(machine, EndpointMachine)
    return machine.next_op_id


async def _on_all(
    comms: list[StripedCommunicator], call: Callable[[StripedCommunicator], Awaitable[object]]
) -> list[object]:
    return list(await asyncio.gather(*(call(c) for c in comms)))


def _same(results: list[object], expected: np.ndarray) -> bool:
    """Every result has exactly ``expected``'s shape, dtype and bits."""
    return all(
        isinstance(r, np.ndarray)
        and r.shape == expected.shape
        and r.dtype == expected.dtype
        and r.tobytes() == expected.tobytes()
        for r in results
    )


def test_every_collective_striped_is_bit_identical_to_unstriped_and_exact(pki: Path) -> None:
    group = bytes.fromhex("5e" * 16)

    async def scenario() -> None:
        cluster, comms = await _striped_cluster(pki, group)
        try:
            placed = [
                {
                    g
                    for g in (group, stripe_group_id(group, 1))
                    if cluster.aggregator(a).group_epoch(g) is not None
                }
                for a in ("agg-0", "agg-1")
            ]
            assert sorted(len(p) for p in placed) == [1, 1] and placed[0] != placed[1], placed

            async def both(
                call: Callable[[StripedCommunicator | Communicator], Awaitable[object]],
            ) -> tuple[list[object], list[object]]:
                """The call striped on every rank, then whole on stripe 0 (unstriped);
                checks that the striped one ran on both stripes."""
                second = [_operations(c.stripes[1]) for c in comms]
                striped = await _on_all(comms, call)
                assert all(_operations(c.stripes[1]) > n for c, n in zip(comms, second, strict=True))
                whole = list(await asyncio.gather(*(call(c.stripes[0]) for c in comms)))
                return striped, whole

            index = np.arange(LARGE)
            inputs = [((index % 1000) * 0.25 * (r + 1)).astype(np.float32) for r in range(WORLD)]
            expected = ((index % 1000) * 0.25 * sum(range(1, WORLD + 1))).astype(np.float32)
            striped, whole = await both(lambda c: c.all_reduce(inputs[c.rank]))
            assert _same(striped, expected) and _same(whole, expected), "float32 SUM"

            noise = [np.random.default_rng(r).standard_normal(LARGE).astype(np.float32) for r in range(WORLD)]
            striped, whole = await both(lambda c: c.all_reduce(noise[c.rank]))
            assert _same(striped, np.asarray(whole[0])) and _same(whole, np.asarray(whole[0])), (
                "rounded alike"
            )
            exact = np.sum(noise, axis=0, dtype=np.float64)
            assert np.abs(np.asarray(whole[0]) - exact).max() < 1e-5 * np.abs(exact).max()

            ints = [(index * (r + 1) - (1 << 40)).astype(np.int64) for r in range(WORLD)]
            total = sum(ints[1:], ints[0])
            striped, whole = await both(lambda c: c.all_reduce(ints[c.rank]))
            assert _same(striped, total) and _same(whole, total), "int64 SUM"

            matrix = [x.reshape(-1, 8)[: LARGE // 8] for x in inputs]  # 2-D, rows cut alike
            striped, whole = await both(lambda c: c.reduce(matrix[c.rank], root=2))
            assert _same([striped[2], whole[2]], expected.reshape(-1, 8)[: LARGE // 8])
            assert striped[:2] + striped[3:] == [None] * 3

            shape = (LARGE // 8, 8)
            source = np.arange(LARGE // 8 * 8, dtype=np.float64).reshape(shape) * 1.5
            sent = [source if r == 1 else np.zeros(shape) for r in range(WORLD)]
            striped, whole = await both(lambda c: c.broadcast(sent[c.rank], root=1))
            assert _same(striped, source) and _same(whole, source), "broadcast"

            segment = 2 * MIN_STRIPE_ELEMENTS + 123
            own = [np.arange(segment, dtype=np.int32) * (r + 1) for r in range(WORLD)]
            striped, whole = await both(lambda c: c.all_gather(own[c.rank]))
            assert _same(striped, np.stack(own)) and _same(whole, np.stack(own)), "all_gather"

            part = 2 * MIN_STRIPE_ELEMENTS + 8192  # a whole number of chunks
            scattered = [((np.arange(WORLD * part) % 777) * (r + 1)).astype(np.float32) for r in range(WORLD)]
            reduced = ((np.arange(WORLD * part) % 777) * sum(range(1, WORLD + 1))).astype(np.float32)
            striped, whole = await both(lambda c: c.reduce_scatter(scattered[c.rank]))
            for rank in range(WORLD):
                mine = reduced[rank * part : (rank + 1) * part]
                assert _same([striped[rank], whole[rank]], mine), f"reduce_scatter, rank {rank}"

            outs = [np.full(LARGE, -1.0, dtype=np.float32) for _ in comms]
            results = await _on_all(comms, lambda c: c.all_reduce(inputs[c.rank], out=outs[c.rank]))
            assert all(r is o for r, o in zip(results, outs, strict=True)) and _same(outs, expected)

            first, second = (
                [_operations(c.stripes[0]) for c in comms],
                [_operations(c.stripes[1]) for c in comms],
            )
            small = np.arange(STRIPES * MIN_STRIPE_ELEMENTS - 1, dtype=np.int64)
            assert _same(await _on_all(comms, lambda c: c.all_reduce(small)), small * WORLD)
            assert [_operations(c.stripes[1]) for c in comms] == second, "a small call stays off stripe 1"
            assert all(_operations(c.stripes[0]) > n for c, n in zip(comms, first, strict=True))

            for comm in comms:  # refused at the call, before anything starts
                with pytest.raises(CcoError) as quorum:
                    await comm.all_reduce_quorum(small, min_ranks=2, wait=1.0)
                assert quorum.value.code is ErrorCode.UNSUPPORTED_FEATURE
                with pytest.raises(CcoError) as accept:
                    comm.accept_membership()
                assert accept.value.code is ErrorCode.UNSUPPORTED_FEATURE
            with pytest.raises(CcoError) as receiver:
                await comms[0].broadcast(None, root=1, dtype=DType.FLOAT32)  # rank 0 receives
            assert receiver.value.code is ErrorCode.INVALID_FIELD and "receiver" in str(receiver.value)
            assert [_operations(c.stripes[1]) for c in comms] == second
        finally:
            await cluster.close()

    run(scenario, timeout=300)


def test_a_failed_part_fails_the_whole_call_with_its_typed_error(pki: Path) -> None:
    group = bytes.fromhex("5f" * 16)

    async def scenario() -> None:
        cluster, comms = await _striped_cluster(pki, group)
        try:
            await comms[3].stripes[1].close(linger=False)  # rank 3 leaves stripe 1's group only
            while any(3 in c.stripes[1].members for c in comms[:3]):
                await asyncio.sleep(0.05)
            values = np.ones(LARGE, dtype=np.int64)
            results = await asyncio.gather(*(c.all_reduce(values) for c in comms), return_exceptions=True)
            for rank, result in enumerate(results):
                assert isinstance(result, CcoError), f"rank {rank}: {result!r}"
                wanted = ErrorCode.ABORTED if rank == 3 else ErrorCode.PEER_LOST
                assert result.code is wanted, f"rank {rank}: {result!r}"
            # stripe 0 alone still works: the failure was stripe 1's part
            small = np.arange(10, dtype=np.int64)
            assert _same(await _on_all(comms, lambda c: c.all_reduce(small)), small * WORLD)
        finally:
            await cluster.close()

    run(scenario, timeout=300)


def test_the_blocking_communicator_runs_over_stripes(pki: Path) -> None:
    """``BlockingCommunicator.from_pki(..., stripes=2)`` on four threads: a striped sum,
    and the guard against inf (its one-byte all-gather on stripe 0 beside the cut call)."""
    group = bytes.fromhex("60" * 16)

    async def scenario() -> None:
        cluster = Cluster(pki, aggregators=2, params=RELAXED, capacity=1)
        await cluster.start()
        spec = GroupSpec(group_id=group, world_size=WORLD, credential=b"pw", rendezvous=cluster.rendezvous)

        def rank(i: int) -> tuple[np.ndarray, np.ndarray, int]:
            with BlockingCommunicator.from_pki(
                spec, f"ep-{i}", pki, timeout=60, stripes=STRIPES, max_datagram_size=16000
            ) as comm:
                total = comm.all_reduce(np.full(LARGE, i + 1, dtype=np.int32))
                values = np.ones(LARGE, dtype=np.float32)
                if i == 2:
                    values[LARGE - 1] = np.inf  # in stripe 1's run
                guarded = comm.all_reduce(values, nonfinite="propagate")
                return total, guarded, comm.world_size

        try:
            results = await asyncio.gather(*(asyncio.to_thread(rank, i) for i in range(WORLD)))
        finally:
            await cluster.close()
        for total, guarded, world in results:
            assert world == WORLD and (total == sum(range(1, WORLD + 1))).all()
            assert np.isnan(guarded).all(), "NaN on every rank, in every stripe's run"

    run(scenario, timeout=300)


def test_a_stripe_that_cannot_join_leaves_none_joined(pki: Path) -> None:
    """Stripe 1 presents another node's certificate: its join fails, stripe 0 (joined)
    leaves, and the same rank can join again at once."""
    group = bytes.fromhex("61" * 16)

    async def scenario() -> None:
        cluster = Cluster(pki, aggregators=2, params=RELAXED, capacity=1)
        await cluster.start()
        try:
            spec = GroupSpec(group_id=group, world_size=1, credential=b"pw", rendezvous=cluster.rendezvous)
            wrong = [cluster.transport("ep-0"), cluster.transport("ep-1")]  # ep-1's for ep-0.s1
            with pytest.raises(ValueError, match=r"not 'ep-0\.s1'"):
                await StripedCommunicator.join(spec, "ep-0", wrong, timeout=30)
            right = [cluster.transport(stripe_node_id("ep-0", k)) for k in range(STRIPES)]
            async with await StripedCommunicator.join(spec, "ep-0", right, timeout=30) as comm:
                ones = np.ones(LARGE, dtype=np.int64)
                assert _same([await comm.all_reduce(ones)], ones)
        finally:
            await cluster.close()

    run(scenario, timeout=300)
