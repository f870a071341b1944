"""What a caller's ``out`` holds after a call that failed: verified chunks decode
straight into it, so a call that fails midway leaves it part result, part what it
held (the chunk that failed to decode, garbage), while the input is only read and a
call made again with the same arrays starts from it (CollectiveRequest's ``out``)."""

from __future__ import annotations

import numpy as np

from cco.nodes.calls import CollectiveRequest
from cco.nodes.events import OperationFailed
from cco.nodes.sim import GroupSpec, build_cluster
from cco.wire.errors import ErrorCode
from cco.wire.messages import GroupParams
from cco.wire.registries import Collective

GROUP = bytes.fromhex("c3" * 16)
RANKS = 4
CHUNK = 512
PARAMS = GroupParams(
    chunk_elements=CHUNK,
    block_elements=256,
    window=2,
    heartbeat_interval_ms=600_000,
    operation_timeout_ms=60_000,
)
BEFORE = -7.0  # what every out holds before the call


def test_a_chunk_that_does_not_decode_fails_the_call_and_leaves_out_part_written() -> None:
    """Chunk 2's sum, 4 x 60000, is past float16's range: every rank fails naming it.
    Chunks 0 and 1 came back verified first and hold their sums; chunk 3, after the
    failure, was never decoded."""
    cluster = build_cluster([GroupSpec(GROUP, RANKS)], aggregators=1, params=PARAMS, max_fan_in=RANKS)
    inputs = [np.ones(4 * CHUNK, np.float16) for _ in range(RANKS)]
    for array in inputs:
        array[2 * CHUNK : 3 * CHUNK] = 60000
    kept = [array.copy() for array in inputs]
    outs = [np.full(4 * CHUNK, BEFORE, np.float16) for _ in range(RANKS)]
    requests = {
        rank: CollectiveRequest(kind=Collective.ALL_REDUCE, array=inputs[rank], out=outs[rank])
        for rank in range(RANKS)
    }
    outcomes = cluster.collective(GROUP, requests)
    for rank in range(RANKS):
        outcome = outcomes[rank]
        assert isinstance(outcome, OperationFailed), outcome
        assert outcome.error.code is ErrorCode.OVERFLOW and "chunk 2: result element 0" in str(outcome.error)
        np.testing.assert_array_equal(inputs[rank], kept[rank])  # only read
        out = outs[rank]
        assert (out[: 2 * CHUNK] == RANKS).all()  # verified and decoded before the failure
        assert (out[3 * CHUNK :] == BEFORE).all()  # never decoded
