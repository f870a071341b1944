"""The asyncio services and the client library over real QUIC on 127.0.0.1.

Everything runs in one process and one event loop (fast, deterministic enough), but
every message crosses a real UDP socket, TLS 1.3 and the CCO framing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from quic_cluster import Cluster, run

from cco.client import BlockingCommunicator, Communicator, GroupSpec
from cco.nodes.calls import OperationError
from cco.nodes.events import Command, ConnectTo, Input, PeerDisconnected, TimerFired
from cco.services.polling import PollingSelector
from cco.services.runner import MachineRunner
from cco.transport import PeerLink, TransportConfig, connect, create_dev_pki
from cco.transport.handshake import LocalIdentity
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import Contribution, Error
from cco.wire.registries import Collective, DType, ReduceOp, Role

GROUP_A = bytes.fromhex("aa" * 16)
GROUP_B = bytes.fromhex("bb" * 16)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    nodes = [("rendezvous", Role.RENDEZVOUS)] + [(f"agg-{i}", Role.AGGREGATOR) for i in range(3)]
    nodes += [(f"a-{i}", Role.ENDPOINT) for i in range(4)] + [(f"b-{i}", Role.ENDPOINT) for i in range(4)]
    create_dev_pki(directory, nodes)
    return directory


def test_two_groups_share_aggregators_with_independent_results(pki: Path) -> None:
    async def scenario() -> None:
        cluster = Cluster(pki, aggregators=2, max_fan_in=4)
        await cluster.start()
        try:
            group_a = await cluster.join(GROUP_A, [f"a-{i}" for i in range(4)])
            group_b = await cluster.join(GROUP_B, [f"b-{i}" for i in range(4)])
            inputs_a = [np.arange(5000, dtype=np.int32) * (c.rank + 1) for c in group_a]
            inputs_b = [np.full(3000, 7 - c.rank, dtype=np.int64) for c in group_b]
            results = await asyncio.gather(
                *[c.all_reduce(x) for c, x in zip(group_a, inputs_a, strict=True)],
                *[c.all_reduce(x, ReduceOp.MAX) for c, x in zip(group_b, inputs_b, strict=True)],
            )
            for result in results[:4]:
                assert result.dtype == np.int32
                assert np.array_equal(result, np.arange(5000, dtype=np.int64) * 10)
            for result in results[4:]:
                assert result.dtype == np.int64
                assert np.array_equal(result, np.full(3000, 7))
        finally:
            await cluster.close()
        with pytest.raises(CcoError) as info:
            await group_a[0].all_reduce(inputs_a[0])
        assert info.value.code is ErrorCode.ABORTED, "a closed communicator refuses new collectives"

    run(scenario)


def test_member_of_group_a_cannot_send_into_group_b(pki: Path) -> None:
    async def scenario() -> None:
        cluster = Cluster(pki, aggregators=1, max_fan_in=8)
        await cluster.start()
        try:
            group_a = await cluster.join(GROUP_A, ["a-0", "a-1"])
            group_b = await cluster.join(GROUP_B, ["b-0", "b-1"])
            # a-0 dials the shared aggregator itself and injects a chunk into group B,
            # claiming to be rank 0 of B.
            identity = LocalIdentity(
                node_id="a-0", role=Role.ENDPOINT, capabilities=cluster.services[0].identity.capabilities
            )
            agg = next(s for s in cluster.services if s.identity.node_id == "agg-0")
            assert agg.server is not None
            link = await connect(
                "127.0.0.1", agg.server.address[1], cluster.transport("a-0"), identity, "agg-0"
            )
            forged = Contribution(
                group_id=GROUP_B,
                epoch=group_b[0].epoch,
                op_id=0,
                kind=Collective.ALL_REDUCE,
                op=ReduceOp.SUM,
                dtype=DType.INT32,
                total_elements=4,
                chunk_elements=1024,
                chunk_index=0,
                contributors=bitmap_from_ranks([0]),
                width=1,
                payload=b"\x63" * 4,
                tag=1,
            )
            link.send(forged)
            reply = await asyncio.wait_for(link.receive(), 10)
            assert isinstance(reply, Error)
            assert reply.code is ErrorCode.UNAUTHORIZED
            link.close()
            # Group B is unaffected: its real all-reduce gives the right answer.
            results = await asyncio.gather(*[c.all_reduce(np.ones(4, dtype=np.int32)) for c in group_b])
            assert all(np.array_equal(r, np.full(4, 2)) for r in results)
            results = await asyncio.gather(*[c.all_reduce(np.ones(4, dtype=np.int32)) for c in group_a])
            assert all(np.array_equal(r, np.full(4, 2)) for r in results)
        finally:
            await cluster.close()

    run(scenario)


def test_endpoint_with_certificate_from_another_ca_is_refused(pki: Path, tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    create_dev_pki(foreign, [("a-0", Role.ENDPOINT)])
    # The intruder trusts the real CA (so it could verify the rendezvous) but its own
    # certificate comes from another CA.
    intruder = TransportConfig(
        ca_file=pki / "ca.pem", cert_file=foreign / "a-0.pem", key_file=foreign / "a-0.key"
    )

    async def scenario() -> None:
        cluster = Cluster(pki, aggregators=1)
        await cluster.start()
        try:
            spec = GroupSpec(group_id=GROUP_A, world_size=2, rendezvous=cluster.rendezvous)
            with pytest.raises(CcoError) as info:
                await Communicator.join(spec, "a-0", intruder, timeout=10)
            assert info.value.code in (ErrorCode.UNAUTHORIZED, ErrorCode.PEER_LOST, ErrorCode.TIMEOUT)
            assert info.value.code is not ErrorCode.TIMEOUT, "the handshake itself must refuse it"
        finally:
            await cluster.close()

    run(scenario)


def test_timeout_names_the_missing_rank(pki: Path) -> None:
    async def scenario() -> None:
        cluster = Cluster(pki, aggregators=1)
        await cluster.start()
        try:
            comms = await cluster.join(GROUP_A, ["a-0", "a-1", "a-2"])
            # Rank 2 never calls all_reduce.
            outcomes = await asyncio.gather(
                *[c.all_reduce(np.ones(10, dtype=np.int32), timeout=5) for c in comms[:2]],
                return_exceptions=True,
            )
            for outcome in outcomes:
                assert isinstance(outcome, OperationError), outcome
                assert outcome.code is ErrorCode.TIMEOUT
                assert outcome.missing_ranks == frozenset({2})
                assert GROUP_A.hex() in str(outcome) and "missing ranks" in str(outcome)
        finally:
            await cluster.close()

    run(scenario)


@pytest.mark.parametrize("busy_poll_us", [0, 2000])
def test_blocking_api_and_non_blocking_handles(pki: Path, busy_poll_us: int) -> None:
    async def start() -> Cluster:
        cluster = Cluster(pki, aggregators=1)
        await cluster.start()
        return cluster

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        cluster = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
        spec = GroupSpec(group_id=GROUP_B, world_size=2, credential=b"pw", rendezvous=cluster.rendezvous)
        comms: list[BlockingCommunicator] = [None, None]

        def join(i: int) -> None:
            comms[i] = BlockingCommunicator(
                spec, f"b-{i}", cluster.transport(f"b-{i}"), timeout=20, busy_poll_us=busy_poll_us
            )

        threads = [threading.Thread(target=join, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert all(c is not None for c in comms)
        polling = [isinstance(c._loop._selector, PollingSelector) for c in comms]  # type: ignore[attr-defined]
        assert polling == [busy_poll_us > 0] * 2
        handles = [
            c.start_all_reduce(np.full(8, c.rank + 1.5, dtype=np.float32), ReduceOp.AVG) for c in comms
        ]
        results = [h.result(30) for h in handles]
        assert all(np.array_equal(r, np.full(8, 2.0, dtype=np.float32)) for r in results)
        gathered = [None, None]

        def gather(i: int) -> None:
            gathered[i] = comms[i].all_gather(np.array([comms[i].rank], dtype=np.int16))

        threads = [threading.Thread(target=gather, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert all(np.array_equal(g, np.array([[0], [1]], dtype=np.int16)) for g in gathered), gathered
        for c in comms:
            c.close()
        asyncio.run_coroutine_threadsafe(cluster.close(), loop).result(30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


# --- the runner's timer -----------------------------------------------------------


class _DueTimerMachine:
    """Wants TimerFired at ``deadline`` and counts the inputs it sees."""

    def __init__(self, deadline: float) -> None:
        self.deadline: float | None = deadline
        self.inputs = 0
        self.fired_at_input: int | None = None

    def handle(self, event: Input, now: float) -> list[Command]:
        if isinstance(event, TimerFired):
            assert self.deadline is not None and now >= self.deadline
            self.fired_at_input = self.inputs
            self.deadline = None
        else:
            self.inputs += 1
        return []

    def next_deadline(self) -> float | None:
        return self.deadline


def _no_connections(command: ConnectTo) -> asyncio.Task[PeerLink]:
    raise AssertionError(f"unexpected {command}")


def test_a_due_timer_fires_under_a_steady_flow_of_inputs() -> None:
    """An input in every loop turn must not postpone a due timer forever (it did:
    each input re-armed the timer, cancelling the TimerFired queued for that turn)."""

    async def main() -> _DueTimerMachine:
        loop = asyncio.get_running_loop()
        machine = _DueTimerMachine(deadline=time.monotonic() + 0.02)
        runner = MachineRunner(machine, connector=_no_connections)
        done = loop.create_future()

        def one_input_per_turn(remaining: int) -> None:
            runner.dispatch(PeerDisconnected(peer="p", code=ErrorCode.PEER_LOST, detail=""))
            if remaining and machine.deadline is not None:
                loop.call_soon(one_input_per_turn, remaining - 1)
            else:
                done.set_result(None)

        started = time.monotonic()
        one_input_per_turn(1_000_000)
        await asyncio.wait_for(done, 10)
        assert time.monotonic() - started < 5
        return machine

    machine = asyncio.run(main())
    assert machine.fired_at_input is not None
    assert machine.inputs < 1_000_000
