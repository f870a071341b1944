"""The quorum policy at an aggregator: presence passes that go on with the ranks in
time, late ranks, and the operations over the members they decided.
"""

from __future__ import annotations

import dataclasses

import pytest
from aggregator_rig import (
    GROUP,
    PARAMS,
    QUORUM_WAIT_MS,
    Rig,
    assignment,
    chunk,
    errors,
    leaf_rig,
    root_rig,
    sent,
)

from cco.nodes.aggregator_states import SlotState
from cco.nodes.events import (
    MessageReceived,
    SendMessage,
)
from cco.wire import payload
from cco.wire.errors import ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import (
    Abort,
    ChunkMessage,
    PartialAggregate,
    Result,
    RetransmitRequest,
)
from cco.wire.registries import Role

WAIT = QUORUM_WAIT_MS / 1000


def test_a_presence_pass_at_the_root_completes_with_the_ranks_in_time_at_the_end_of_its_wait() -> None:
    rig = root_rig()
    assert rig.send("ep0", chunk(0, quorum=2)) == []
    assert rig.send("ep1", chunk(1, quorum=2)) == []
    assert rig.machine.next_deadline() == pytest.approx(WAIT)
    out = rig.timer(WAIT)
    for child in ("ep0", "ep1", "ep2"):  # the late rank gets the result too
        (result,) = sent(out, child, Result)
        assert ranks_from_bitmap(result.contributors) == {0, 1}
    late = rig.send("ep2", chunk(2, quorum=2))  # not counted: answered with the result
    assert [ranks_from_bitmap(m.contributors) for m in sent(late, "ep2", Result)] == [{0, 1}]
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.RELEASED


def test_a_presence_pass_short_of_its_quorum_waits_for_more_then_fails_naming_them() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0, quorum=2))
    assert sent(rig.timer(WAIT), None, Result) == []  # 1 of a quorum of 2: wait on
    out = rig.send("ep1", chunk(1, quorum=2))  # the quorum, after the wait: at once
    assert [ranks_from_bitmap(m.contributors) for m in sent(out, "ep2", Result)] == [{0, 1}]
    rig2 = root_rig()
    rig2.send("ep0", chunk(0, quorum=3))
    rig2.send("ep1", chunk(1, quorum=3))
    rig2.timer(WAIT)
    out = rig2.timer(PARAMS.operation_timeout_ms / 1000)
    (abort,) = sent(out, "ep0", Abort)
    assert abort.code is ErrorCode.TIMEOUT and abort.missing == bitmap_from_ranks([2])


def test_a_presence_pass_with_every_rank_in_time_does_not_wait() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0, quorum=1))
    rig.send("ep1", chunk(1, quorum=1))
    out = rig.send("ep2", chunk(2, quorum=1))
    assert [ranks_from_bitmap(m.contributors) for m in sent(out, "ep0", Result)] == [{0, 1, 2}]


def test_below_the_root_a_presence_pass_goes_up_with_what_came_in_time() -> None:
    rig, parent = leaf_rig()
    rig.send("ep0", chunk(0, quorum=2))  # a quorum is the root's to judge
    (partial,) = sent(rig.timer(WAIT), parent, PartialAggregate)
    assert ranks_from_bitmap(partial.contributors) == {0} and partial.quorum == 2
    # late here is not necessarily late at the root, which may still lack its quorum:
    late = chunk(1, quorum=2)
    (up,) = sent(rig.send("ep1", late), parent, PartialAggregate)
    assert ranks_from_bitmap(up.contributors) == {1} and up.payload == late.payload
    assert sent(rig.send("ep1", late), parent) == []  # a copy goes up once
    result = payload.combine([partial, up], Result)
    rig.feed(MessageReceived(parent, result))
    assert sent(rig.send("ep1", late), "ep1", Result) == [result]  # once the result is known


def test_the_root_takes_the_late_ranks_a_child_aggregator_sends_while_short_of_its_quorum() -> None:
    rig = Rig()
    rig.register()
    rig.connect("ep0")
    rig.connect("mid", role=Role.AGGREGATOR)
    rig.rendezvous(assignment({"ep0": [0], "mid": [1, 2]}))
    rig.send("mid", _retype(chunk(1, quorum=3), PartialAggregate))  # mid went on with rank 1
    assert sent(rig.timer(2 * WAIT), None, Result) == []  # 1 of 3 at the end of the waits
    assert sent(rig.send("ep0", chunk(0, quorum=3)), None, Result) == []
    again = rig.send("mid", _retype(chunk(1, quorum=3), PartialAggregate))
    assert errors(again) == [] and sent(again, None, Result) == []  # a copy: not counted twice
    out = rig.send("mid", _retype(chunk(2, quorum=3), PartialAggregate))  # rank 2, late at mid
    assert [ranks_from_bitmap(m.contributors) for m in sent(out, "ep0", Result)] == [{0, 1, 2}]


def test_a_presence_pass_waits_once_more_for_a_silent_child_aggregator() -> None:
    rig = Rig()
    rig.register()
    rig.connect("ep0")
    rig.connect("mid", role=Role.AGGREGATOR)
    rig.rendezvous(assignment({"ep0": [0], "mid": [1, 2]}))
    rig.send("ep0", chunk(0, quorum=1))
    assert sent(rig.timer(WAIT), None, Result) == []  # mid releases at the end of its own wait
    rig.now = 1.5 * WAIT  # mid's wait began later, and its rank 2 was late
    assert sent(rig.send("mid", _retype(chunk(1, quorum=1), PartialAggregate)), None, Result) == []
    out = rig.timer(2 * WAIT)
    assert [ranks_from_bitmap(m.contributors) for m in sent(out, "ep0", Result)] == [{0, 1}]


def _retype(message: ChunkMessage, cls: type[ChunkMessage]) -> ChunkMessage:
    return cls(**{f.name: getattr(message, f.name) for f in dataclasses.fields(message)})


def test_an_operation_over_decided_members_waits_for_those_only() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0, members=[0, 2]))
    out = rig.send("ep2", chunk(2, members=[0, 2]))
    for child in ("ep0", "ep1", "ep2"):
        (result,) = sent(out, child, Result)
        assert ranks_from_bitmap(result.contributors) == {0, 2}
        assert result.members == bitmap_from_ranks([0, 2])
    rig.send("ep0", chunk(0, op_id=1, members=[0, 2]))
    nudged = rig.timer(PARAMS.operation_timeout_ms / 2000)  # half the timeout: ask the silent
    assert {c.peer for c in nudged if isinstance(c, SendMessage)} == {"ep2"}
    (abort,) = sent(rig.timer(PARAMS.operation_timeout_ms / 1000), "ep0", Abort)
    assert abort.missing == bitmap_from_ranks([2])  # rank 1 is not a member of this operation


def test_children_that_disagree_on_the_members_abort_the_operation() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0, members=[0, 1]))
    out = rig.send("ep1", chunk(1, members=[0, 1, 2]))
    assert [m.code for m in sent(out, "ep0", Abort)] == [ErrorCode.OPERATION_MISMATCH]


def test_a_released_presence_pass_is_not_reopened_when_asked_again() -> None:
    rig, parent = leaf_rig()
    rig.send("ep0", chunk(0, quorum=2))
    assert len(sent(rig.timer(WAIT), parent, PartialAggregate)) == 1
    asked = RetransmitRequest(group_id=GROUP, epoch=1, op_id=0, chunks=(0,))
    assert rig.feed(MessageReceived(parent, asked)) == []  # no child is asked; nothing goes up again
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.RELEASED
