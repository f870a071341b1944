"""Membership is explicit (issue 9), over real QUIC on 127.0.0.1.

A collective runs over the members the caller agreed to: when a rank leaves, the
survivors' collectives fail naming it until they accept the new membership, and
``world_size`` and ``members`` always tell the truth.  A join the rendezvous refuses
fails at once with the rendezvous's code and reason, not after a timeout.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
from quic_cluster import Cluster, run

from cco.client import Communicator, GroupSpec
from cco.nodes.calls import OperationError
from cco.transport import create_dev_pki
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.registries import ReduceOp, Role

GROUP = bytes.fromhex("5e" * 16)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    nodes = [("rendezvous", Role.RENDEZVOUS), ("agg-0", Role.AGGREGATOR)]
    nodes += [(f"m-{i}", Role.ENDPOINT) for i in range(4)]
    create_dev_pki(directory, nodes)
    return directory


def test_a_rank_that_leaves_is_never_silently_left_out(pki: Path) -> None:
    async def scenario() -> None:
        cluster = Cluster(pki, aggregators=1)
        await cluster.start()
        try:
            comms = await cluster.join(GROUP, [f"m-{i}" for i in range(3)])
            assert [c.world_size for c in comms] == [3, 3, 3]
            leaver, survivors = comms[2], comms[:2]
            await asyncio.gather(*[c.barrier() for c in comms])
            epoch = survivors[0].epoch
            await leaver.close(linger=False)
            while any(c.epoch == epoch or c.world_size == 3 for c in survivors):
                await asyncio.sleep(0.05)
            assert all(c.world_size == 2 and c.members == {0, 1} for c in survivors)
            ones = np.ones(8, np.float32)
            outcomes = await asyncio.gather(*[c.all_reduce(ones) for c in survivors], return_exceptions=True)
            for outcome in outcomes:  # never 2.0 without a word
                assert isinstance(outcome, OperationError) and outcome.code is ErrorCode.PEER_LOST
                assert outcome.missing_ranks == {2} and "ranks {2} left" in str(outcome)
            assert all(c.accept_membership() == {0, 1} for c in survivors)
            sums = await asyncio.gather(*[c.all_reduce(ones) for c in survivors])
            averages = await asyncio.gather(*[c.all_reduce(ones, ReduceOp.AVG) for c in survivors])
            assert all(s.tolist() == [2.0] * 8 for s in sums)
            assert all(a.tolist() == [1.0] * 8 for a in averages)
        finally:
            await cluster.close()

    run(scenario)


@pytest.mark.parametrize(
    ("credential", "world_size", "code"),
    [(b"wrong", 2, ErrorCode.BAD_CREDENTIAL), (b"pw", 3, ErrorCode.WORLD_SIZE_MISMATCH)],
)
def test_a_refused_join_fails_at_once_with_the_rendezvous_reason(
    pki: Path, credential: bytes, world_size: int, code: ErrorCode
) -> None:
    async def scenario() -> None:
        cluster = Cluster(pki, aggregators=1)
        await cluster.start()
        try:
            first = asyncio.ensure_future(
                Communicator.join(
                    GroupSpec(group_id=GROUP, world_size=2, credential=b"pw", rendezvous=cluster.rendezvous),
                    "m-0",
                    cluster.transport("m-0"),
                    timeout=20,
                )
            )
            await asyncio.sleep(0.5)  # the group exists, waiting for its second member
            spec = GroupSpec(
                group_id=GROUP, world_size=world_size, credential=credential, rendezvous=cluster.rendezvous
            )
            started = time.monotonic()
            with pytest.raises(CcoError) as info:
                await Communicator.join(spec, "m-1", cluster.transport("m-1"), timeout=20)
            assert info.value.code is code and GROUP.hex() in str(info.value)
            assert time.monotonic() - started < 5, "the refusal is reported at once, not after the timeout"
            first.cancel()
        finally:
            await cluster.close()

    run(scenario)
