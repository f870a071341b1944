"""The quorum policy at an endpoint: the presence pass first, then the data over the
members it decided; a rank the quorum went on without only receives.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from endpoint_rig import (
    KEYS,
    QUORUM,
    RANK,
    failures,
    int_header,
    int_request,
    joined,
    quorum_results,
    sent,
)

from cco.nodes.events import (
    OperationCompleted,
)
from cco.nodes.operation import Quorum
from cco.wire import payload
from cco.wire.errors import ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import (
    Contribution,
    Result,
)
from cco.wire.registries import DType


def test_a_quorum_all_reduce_sends_its_presence_first_and_its_data_over_the_decided_members() -> None:
    rig = joined()
    op_id, out = rig.start(int_request([5, 6, 7], quorum=QUORUM))
    (presence,) = sent(out, rig.parent, Contribution)
    assert (presence.op_id, presence.quorum, presence.wait_ms) == (op_id - 1, 1, 500)
    assert presence.dtype is DType.INT8 and presence.total_elements == 1
    ranks = [0, RANK, 3]
    presence_result, data_result = quorum_results(op_id - 1, 1, [5, 6, 7], [0, 3], ranks)
    everyone = payload.combine([presence_result, presence], Result)  # this rank came in time
    (data,) = sent(rig.from_parent(everyone), rig.parent, Contribution)
    assert data.op_id == op_id and data.members == bitmap_from_ranks(ranks) and data.quorum is None
    result = payload.combine([data_result, data], Result)
    (done,) = [c for c in rig.from_parent(result) if isinstance(c, OperationCompleted)]
    assert done.contributors == frozenset(ranks)
    assert done.result is not None and done.result.tolist() == [0 + 3 + 5, 0 + 3 + 6, 0 + 3 + 7]


def test_a_rank_the_quorum_went_on_without_sends_no_data_and_gets_the_result() -> None:
    rig = joined()
    op_id, _ = rig.start(int_request([5, 6], quorum=QUORUM))
    presence, data = quorum_results(op_id - 1, 1, [5, 6], [0, 2])
    assert sent(rig.from_parent(presence), rig.parent, Contribution) == []
    (done,) = [c for c in rig.from_parent(data) if isinstance(c, OperationCompleted)]
    assert done.contributors == {0, 2} and done.result is not None and done.result.tolist() == [2, 2]


def test_a_presence_result_short_of_the_quorum_fails_verification() -> None:
    rig = joined()
    op_id, _ = rig.start(int_request([5], quorum=Quorum(min_ranks=3, wait=0.5)))
    header = dataclasses.replace(int_header(op_id - 1, 1, 1), dtype=DType.INT8, quorum=3, wait_ms=500)
    two = payload.combine([payload.seal(KEYS, header, r, np.ones(1, dtype=np.int64)) for r in (0, 2)], Result)
    (error,) = failures(rig.from_parent(two))
    assert error.code is ErrorCode.VERIFICATION_FAILED and error.op_id == op_id
    assert "presence pass" in str(error) and "a quorum of 3 needed" in str(error)
