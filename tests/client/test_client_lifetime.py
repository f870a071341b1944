"""The client library's lifetime: joining, closing, and what a refused join looks like.

One rendezvous and one aggregator run in this event loop; every message crosses a
real UDP socket, TLS 1.3 and the CCO framing.  The rendezvous machine is read
directly (its ``status()``) to see what the group saw: who is a member, and in which
epoch.  Every scenario is bounded in time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from cco.client import OFF_LOOP_ELEMENTS, Communicator, GroupSpec
from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
from cco.nodes.rendezvous import RendezvousConfig, RendezvousMachine
from cco.nodes.rendezvous_config import DEFAULT_PARAMS
from cco.nodes.rendezvous_status import GroupStatus
from cco.services.node import NodeService
from cco.transport import TransportConfig, create_dev_pki
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Address, GroupParams
from cco.wire.registries import Role

T = TypeVar("T")

GROUP = bytes.fromhex("c1" * 16)
# A long operation timeout: a barrier that is waited for shows as a wait of seconds,
# well apart from a close that does not wait.
PARAMS = GroupParams(
    chunk_elements=1024, window=4, heartbeat_interval_ms=1000, operation_timeout_ms=10_000, liveness_ms=10_000
)
NAMES = [f"c-{i}" for i in range(3)]


def run(scenario: Callable[[], Awaitable[T]], timeout: float = 60.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(scenario(), timeout)

    return asyncio.run(bounded())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    nodes = [("rendezvous", Role.RENDEZVOUS), ("agg-0", Role.AGGREGATOR)]
    create_dev_pki(directory, nodes + [(name, Role.ENDPOINT) for name in NAMES])
    return directory


class Cluster:
    """A rendezvous that creates groups on first join, and one aggregator."""

    def __init__(self, pki: Path, params: GroupParams = PARAMS) -> None:
        self.pki = pki
        self.params = params
        self.services: list[NodeService] = []
        self.communicators: list[Communicator] = []
        self.rendezvous = ""

    def transport(self, node_id: str) -> TransportConfig:
        return TransportConfig.for_node(self.pki, node_id, max_datagram_size=16000)

    async def __aenter__(self) -> Cluster:
        machine = RendezvousMachine(RendezvousConfig(create_groups_on_join=True, params=self.params))
        service = NodeService(machine, "rendezvous", Role.RENDEZVOUS, self.transport("rendezvous"))
        host, port = await service.listen("127.0.0.1", 0)
        self.rendezvous = f"{host}:{port}"
        self.services.append(service)
        # Bind first to learn the port, then give the machine its real address.
        aggregator = NodeService(
            AggregatorMachine(AggregatorConfig(address=Address(host=host, port=1))),
            "agg-0",
            Role.AGGREGATOR,
            self.transport("agg-0"),
        )
        _, agg_port = await aggregator.listen(host, 0)
        aggregator.runner.machine = AggregatorMachine(
            AggregatorConfig(address=Address(host=host, port=agg_port))
        )
        await aggregator.join_rendezvous(host, port, "rendezvous")
        self.services.append(aggregator)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(*[c.close(linger=False) for c in self.communicators], return_exceptions=True)
        for service in reversed(self.services):
            await service.close()

    def spec(self, world_size: int, credential: bytes = b"pw") -> GroupSpec:
        return GroupSpec(
            group_id=GROUP, world_size=world_size, credential=credential, rendezvous=self.rendezvous
        )

    async def join(self, world_size: int) -> list[Communicator]:
        spec = self.spec(world_size)
        comms = await asyncio.gather(
            *[Communicator.join(spec, name, self.transport(name), timeout=20) for name in NAMES[:world_size]]
        )
        self.communicators += comms
        return sorted(comms, key=lambda c: c.rank)

    def group(self) -> GroupStatus | None:
        machine = self.services[0].machine
        assert isinstance(machine, RendezvousMachine)
        return next((g for g in machine.status().groups if g.group_id == GROUP), None)

    def member_ranks(self) -> list[int]:
        group = self.group()
        return [m.rank for m in group.members] if group else []


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def _refuses_new_collectives(comm: Communicator) -> None:
    with pytest.raises(CcoError) as info:
        await comm.all_reduce(np.ones(4, dtype=np.int32))
    assert info.value.code is ErrorCode.ABORTED


def test_close_waits_at_a_barrier_until_every_rank_closes(pki: Path) -> None:
    """A fast rank's close() must not leave (a new epoch) while a slower rank may still
    be finishing its last collective: it waits until every rank has called close()."""

    async def scenario() -> None:
        async with Cluster(pki) as cluster:
            fast, slow = await cluster.join(2)
            epoch = cluster.group().epoch  # type: ignore[union-attr]
            slow_op = slow.start_all_reduce(np.arange(3000, dtype=np.int64))
            await fast.all_reduce(np.arange(3000, dtype=np.int64))
            closing = asyncio.ensure_future(fast.close())
            await asyncio.sleep(1.0)
            assert not closing.done(), "close() returned before the other rank called close()"
            await asyncio.wait_for(fast.close(), 1.0)  # a second close() while one runs does nothing
            assert cluster.member_ranks() == [0, 1], "the fast rank left while the other was busy"
            assert cluster.group().epoch == epoch  # type: ignore[union-attr]
            # The slow rank's last collective completes, exact, in the unchanged epoch.
            assert np.array_equal(await slow_op, np.arange(3000, dtype=np.int64) * 2)
            await slow.close()
            await asyncio.wait_for(closing, 10)
            assert cluster.member_ranks() == []
            await _refuses_new_collectives(fast)
            await _refuses_new_collectives(slow)

    run(scenario)


def test_close_with_a_timeout_leaves_when_the_barrier_fails(pki: Path) -> None:
    async def scenario() -> None:
        async with Cluster(pki) as cluster:
            leaver, stayer = await cluster.join(2)
            epoch = stayer.epoch
            start = time.monotonic()
            await leaver.close(timeout=0.5)  # the other rank never closes
            assert time.monotonic() - start < 5.0
            await _until(lambda: cluster.member_ranks() == [1])
            await _until(lambda: stayer.epoch > epoch)  # the stayer was told of the Leave

    run(scenario)


def test_close_without_linger_leaves_at_once_and_aborts_pending_operations(pki: Path) -> None:
    async def scenario() -> None:
        async with Cluster(pki) as cluster:
            leaver, stayer = await cluster.join(2)
            epoch = stayer.epoch
            pending = leaver.start_all_reduce(np.ones(10, dtype=np.int32))  # the stayer never joins it
            start = time.monotonic()
            await leaver.close(linger=False)
            assert time.monotonic() - start < 5.0, "close(linger=False) waited (a barrier?)"
            with pytest.raises(CcoError) as info:
                await pending
            assert info.value.code is ErrorCode.ABORTED
            await _refuses_new_collectives(leaver)
            await _until(lambda: cluster.member_ranks() == [1])
            await _until(lambda: stayer.epoch > epoch)
            await leaver.close()  # closing again changes nothing

    run(scenario)


def test_async_context_manager_closes_collectively_on_a_normal_exit(pki: Path) -> None:
    async def scenario() -> None:
        async with Cluster(pki) as cluster:
            first, second = await cluster.join(2)
            inside = asyncio.Event()
            results: dict[int, np.ndarray] = {}

            async def use(comm: Communicator, stay: asyncio.Event | None) -> None:
                async with comm:
                    results[comm.rank] = await comm.all_reduce(np.full(5, comm.rank + 1, dtype=np.int16))
                    if stay is not None:
                        await stay.wait()

            leaving = asyncio.ensure_future(use(first, None))
            staying = asyncio.ensure_future(use(second, inside))
            await asyncio.sleep(1.0)
            assert not leaving.done(), "the first rank's exit waits at the closing barrier"
            assert cluster.member_ranks() == [0, 1]
            inside.set()
            await asyncio.wait_for(asyncio.gather(leaving, staying), 10)
            assert all(np.array_equal(results[r], np.full(5, 3, dtype=np.int16)) for r in (0, 1))
            assert cluster.member_ranks() == []
            for comm in (first, second):
                await _refuses_new_collectives(comm)

    run(scenario)


def test_async_context_manager_leaves_at_once_when_the_block_raises(pki: Path) -> None:
    """After an exception the rank does not wait for the others at a barrier: it leaves,
    and the exception propagates."""

    async def scenario() -> None:
        async with Cluster(pki) as cluster:
            failing, other = await cluster.join(2)
            epoch = other.epoch
            start = time.monotonic()
            with pytest.raises(ValueError, match="user code failed"):
                async with failing:
                    raise ValueError("user code failed inside the block")
            assert time.monotonic() - start < 5.0, "it waited (at a barrier?)"
            await _refuses_new_collectives(failing)
            await _until(lambda: cluster.member_ranks() == [1])
            await _until(lambda: other.epoch > epoch)

    run(scenario)


def test_join_rejected_by_the_rendezvous_fails_at_once_with_its_code(pki: Path) -> None:
    """A JoinReject (here: a wrong credential) fails join() at once with the
    rendezvous's code and reason, and changes nothing in the group."""

    async def scenario() -> None:
        async with Cluster(pki) as cluster:
            first = asyncio.ensure_future(
                Communicator.join(cluster.spec(2), "c-0", cluster.transport("c-0"), timeout=20)
            )
            await _until(lambda: cluster.member_ranks() == [0])
            start = time.monotonic()
            with pytest.raises(CcoError) as info:
                await Communicator.join(
                    cluster.spec(2, credential=b"wrong"), "c-1", cluster.transport("c-1"), timeout=20
                )
            assert time.monotonic() - start < 5.0, "the rejection is reported at once, not as a timeout"
            assert info.value.code is ErrorCode.BAD_CREDENTIAL
            assert GROUP.hex() in str(info.value) and "credential" in str(info.value)
            assert cluster.member_ranks() == [0], "a rejected join changes nothing"
            # The rank is still free: the right credential gets it.
            second = await Communicator.join(cluster.spec(2), "c-1", cluster.transport("c-1"), timeout=20)
            comms = [await first, second]
            cluster.communicators += comms
            assert second.rank == 1
            results = await asyncio.gather(*[c.all_reduce(np.ones(3, dtype=np.int32)) for c in comms])
            assert all(np.array_equal(r, np.full(3, 2)) for r in results)

    run(scenario)


def test_a_group_no_aggregator_can_serve_fails_to_join_with_no_aggregator(pki: Path) -> None:
    """The rendezvous tells a formed group without capacity NO_AGGREGATOR at once; a
    join() still waiting for its tree then fails with that code and its reason, not
    with a bare timeout."""

    async def scenario() -> None:
        async with Cluster(pki) as cluster:
            await cluster.services.pop().close()  # the only aggregator goes
            await _until(lambda: not cluster.services[0].machine.status().aggregators)  # type: ignore[attr-defined]
            with pytest.raises(CcoError) as info:
                await Communicator.join(cluster.spec(1), "c-0", cluster.transport("c-0"), timeout=2)
            assert info.value.code is ErrorCode.NO_AGGREGATOR
            assert "no aggregator can serve the group" in str(info.value)

    run(scenario)


def test_a_members_small_max_message_size_lowers_the_groups_chunk_size(pki: Path) -> None:
    """Capabilities travel from Hello to the rendezvous: a member that accepts only
    4 KiB messages gets chunks that fit, and the collective still completes exactly."""

    async def scenario() -> None:
        async with Cluster(pki) as cluster:
            spec = cluster.spec(2)
            small = TransportConfig.for_node(pki, "c-1", max_datagram_size=16000, max_message_size=4096)
            comms = await asyncio.gather(
                Communicator.join(spec, "c-0", cluster.transport("c-0"), timeout=20),
                Communicator.join(spec, "c-1", small, timeout=20),
            )
            cluster.communicators += comms
            chunk = cluster.group().params.chunk_elements  # type: ignore[union-attr]
            assert 0 < chunk < 512 < PARAMS.chunk_elements, chunk
            data = np.arange(5000, dtype=np.int64) - 2500
            results = await asyncio.gather(*[c.all_reduce(data) for c in comms])
            assert all(np.array_equal(r, data * 2) for r in results)

    run(scenario)


def test_quorum_all_reduce_over_real_connections_goes_on_without_a_late_rank(pki: Path) -> None:
    """Two ranks complete without waiting for the third, which was late; it gets the
    same verified result without having contributed, and the next (strict) operation
    counts everybody again."""

    async def scenario() -> None:
        async with Cluster(pki) as cluster:
            comms = await cluster.join(3)
            data = [np.arange(6, dtype=np.float32) * (c.rank + 1) for c in comms]
            quorum = [
                asyncio.ensure_future(c.all_reduce_quorum(d, min_ranks=2, wait=0.3))
                for c, d in zip(comms[:2], data[:2], strict=True)
            ]
            done, _ = await asyncio.wait(quorum, timeout=5)
            assert len(done) == 2  # within the wait, not the 10 s operation timeout
            late = await comms[2].all_reduce_quorum(data[2], min_ranks=2, wait=0.3)
            results = [q.result() for q in quorum] + [late]
            for partial in results:
                assert partial.contributors == {0, 1}
                assert partial.array.tobytes() == results[0].array.tobytes()
            assert np.allclose(results[0].array, data[0] + data[1], rtol=1e-6)
            everyone = await asyncio.gather(*[c.all_reduce(d) for c, d in zip(comms, data, strict=True)])
            assert all(np.allclose(r, data[0] + data[1] + data[2], rtol=1e-6) for r in everyone)

    run(scenario)


def test_a_large_input_is_prepared_off_the_loop_and_calls_still_start_in_order(pki: Path) -> None:
    """A large all-reduce then a small one, started back to back on every rank: the
    large one's scale proposals are computed on a worker thread, the small one waits
    for it to start first, and both results are exact on every rank.

    In chunks of the default size: in PARAMS's small ones, the whole cluster on this
    test's one thread moved a thousand chunks, and beside CPU hogs that took longer
    than the operation timeout."""

    async def scenario() -> None:
        async with Cluster(
            pki, dataclasses.replace(PARAMS, chunk_elements=DEFAULT_PARAMS.chunk_elements)
        ) as cluster:
            comms = await cluster.join(2)
            large = [np.full(OFF_LOOP_ELEMENTS, c.rank + 1, dtype=np.float32) for c in comms]
            small = [np.array([c.rank + 10], dtype=np.int32) for c in comms]
            first = [c.start_all_reduce(x) for c, x in zip(comms, large, strict=True)]
            second = [c.start_all_reduce(x) for c, x in zip(comms, small, strict=True)]
            assert all(not f.done() for f in first)  # not started yet: preparing on a thread
            for result in await asyncio.gather(*first):
                assert result.shape == (OFF_LOOP_ELEMENTS,) and (result == 3).all()
            for result in await asyncio.gather(*second):
                assert result.tolist() == [21]
            with pytest.raises(CcoError) as misuse:  # misuse still raises at the call
                comms[0].start_all_reduce(np.zeros(OFF_LOOP_ELEMENTS, dtype=np.complex64))
            assert misuse.value.code is ErrorCode.UNSUPPORTED_FEATURE

    run(scenario)
