"""Parts combined into one aggregate per chunk: sent up or down once complete, a copy
never counted twice, a child speaking only for its own ranks, memory bounded by
the window.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from aggregator_rig import (
    ADDRESS,
    GROUP,
    KEYS,
    OTHER,
    PARAMS,
    Rig,
    assignment,
    chunk,
    errors,
    leaf_rig,
    root_rig,
    sent,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
from cco.nodes.aggregator_states import GroupState, SlotState
from cco.nodes.events import (
    ClosePeer,
    MessageMalformed,
    PeerConnected,
    SendMessage,
)
from cco.wire import payload
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import (
    Abort,
    AggregatorAccept,
    BroadcastData,
    ChunkMessage,
    PartialAggregate,
    Result,
)
from cco.wire.packing import unpack
from cco.wire.registries import Collective, DType, ReduceOp, Role


def test_root_combines_children_and_sends_result_to_every_child() -> None:
    rig = root_rig()
    assert rig.send("ep0", chunk(0)) == []
    assert rig.send("ep2", chunk(2)) == []
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.COLLECTING
    out = rig.send("ep1", chunk(1))
    results = {c.peer: c.message for c in out if isinstance(c, SendMessage)}
    assert set(results) == {"ep0", "ep1", "ep2"}
    result = results["ep0"]
    assert isinstance(result, Result)
    assert ranks_from_bitmap(result.contributors) == {0, 1, 2}
    values = payload.open_verified(KEYS[GROUP], result, frozenset({0, 1, 2}))
    assert values.tolist() == [6, 6, 6, 6]
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.COMPLETE
    assert rig.machine.slot_bytes == 0 and rig.machine.peak_slot_bytes > 0


def test_non_root_sends_partial_up_and_forwards_results_down() -> None:
    rig, parent = leaf_rig()
    rig.send("ep0", chunk(0))
    out = rig.send("ep1", chunk(1))
    (partial,) = sent(out, parent, PartialAggregate)
    assert ranks_from_bitmap(partial.contributors) == {0, 1}
    assert sent(out, "ep0") == []
    result = payload.combine([partial, chunk(2), chunk(3), chunk(4), chunk(5)], Result)
    down = rig.send(parent, result)
    assert sent(down, "ep0") == [result] and sent(down, "ep1") == [result]


def test_partial_waits_for_parent_connection() -> None:
    rig, parent = leaf_rig(connect_parent=False)
    assert rig.machine.group_state(GROUP) is GroupState.CONNECTING
    rig.send("ep0", chunk(0))
    assert rig.send("ep1", chunk(1)) == []
    assert rig.machine.slot_bytes > 0  # the partial is held, and counted
    out = rig.feed(PeerConnected(parent, "root", Role.AGGREGATOR))
    assert len(sent(out, parent, PartialAggregate)) == 1
    assert rig.machine.group_state(GROUP) is GroupState.ACTIVE and rig.machine.slot_bytes == 0


def test_identical_retransmission_is_never_counted_twice_and_gets_the_result_again() -> None:
    rig = root_rig()
    first = chunk(0)
    rig.send("ep0", first)
    assert rig.send("ep0", first) == []
    rig.send("ep1", chunk(1))
    (result, *_) = sent(rig.send("ep2", chunk(2)), None, Result)
    # after completion the copy is recognised: nothing counted twice, and since a child
    # sends a chunk again only when it lacks the result, it gets the same Result again
    assert sent(rig.send("ep0", first), "ep0", Result) == [result]
    assert sent(rig.send("ep2", chunk(2)), "ep2", Result) == [result]
    assert rig.machine.kept_result_bytes == len(result.payload)


def test_kept_results_are_bounded_by_twice_the_window() -> None:
    rig = root_rig({"ep0": [0], "ep1": [1]})
    for op_id in range(3 * PARAMS.window):
        rig.send("ep0", chunk(0, op_id=op_id, total=4))
        rig.send("ep1", chunk(1, op_id=op_id, total=4))
    assert rig.machine.kept_result_bytes == 2 * PARAMS.window * 4  # 4 one-byte integers each
    assert rig.send("ep0", chunk(0, op_id=0, total=4)) == []  # too old: recognised, not resent


def test_different_chunk_in_place_of_one_taken_is_a_duplicate_contribution() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0, values=[1, 1, 1, 1]))
    assert errors(rig.send("ep0", chunk(0, values=[9, 9, 9, 9])), "ep0") == [ErrorCode.DUPLICATE_CONTRIBUTION]
    rig.send("ep1", chunk(1))
    out = rig.send("ep2", chunk(2))
    (result, *_) = sent(out, None, Result)
    assert payload.open_verified(KEYS[GROUP], result, frozenset({0, 1, 2})).tolist() == [6, 6, 6, 6]
    assert errors(rig.send("ep1", chunk(1, values=[0, 0, 0, 0])), "ep1") == [ErrorCode.DUPLICATE_CONTRIBUTION]


def test_a_changed_payload_under_the_same_tag_is_taken_for_a_copy_and_not_added() -> None:
    """A tagged chunk's fingerprint is its header with the tag, which seals the
    payload: another payload under the same tag is a forged MAC, and its sender
    gains nothing, since a chunk taken for a copy is not added either."""
    rig = root_rig()
    first = chunk(0, values=[1, 1, 1, 1])
    rig.send("ep0", first)
    forged = dataclasses.replace(first, payload=bytes([1, 1, 1, 9]))
    assert rig.send("ep0", forged) == []  # not added, not answered
    rig.send("ep1", chunk(1))
    (result, *_) = sent(rig.send("ep2", chunk(2)), None, Result)
    assert payload.open_verified(KEYS[GROUP], result, frozenset({0, 1, 2})).tolist() == [6, 6, 6, 6]


def test_a_changed_payload_of_an_untagged_chunk_is_a_duplicate_contribution() -> None:
    """MIN, MAX and the bitwise ops carry no tag: their payload itself is fingerprinted."""
    rig = root_rig()
    first = chunk(0, values=[1, 1, 1, 1], op=ReduceOp.MAX)
    assert first.tag is None
    rig.send("ep0", first)
    changed = dataclasses.replace(first, payload=bytes([1, 1, 1, 2]))
    assert errors(rig.send("ep0", changed), "ep0") == [ErrorCode.DUPLICATE_CONTRIBUTION]
    assert rig.send("ep0", first) == []  # the copy of what was taken is still a copy


def test_children_may_speak_only_for_their_own_ranks() -> None:
    rig = root_rig()
    rig.connect("stranger")
    assert errors(rig.send("stranger", chunk(0))) == [ErrorCode.UNAUTHORIZED]
    assert errors(rig.send("ep0", chunk(1))) == [ErrorCode.UNAUTHORIZED]
    assert rig.machine.open_slots(GROUP) == 0
    rig.send("ep0", chunk(0))
    rig.send("ep1", chunk(1))
    assert len(sent(rig.send("ep2", chunk(2)), None, Result)) == 3  # other peers unaffected


def test_member_of_one_group_cannot_send_into_another() -> None:
    rig = root_rig()
    rig.connect("b0", "b1")
    rig.rendezvous(assignment({"b0": [0], "b1": [1]}, group=OTHER))
    forged = chunk(0, group=OTHER)  # ep0 is rank 0 of GROUP, not of OTHER
    assert errors(rig.send("ep0", forged), "ep0") == [ErrorCode.UNAUTHORIZED]
    assert rig.machine.open_slots(OTHER) == 0
    rig.send("b0", chunk(0, group=OTHER, values=[5, 5, 5, 5]))
    out = rig.send("b1", chunk(1, group=OTHER, values=[7, 7, 7, 7]))
    (result, _) = sent(out, None, Result)
    assert payload.open_verified(KEYS[OTHER], result, frozenset({0, 1})).tolist() == [12] * 4
    assert rig.machine.open_slots(GROUP) == 0


def test_groups_are_isolated_on_a_shared_aggregator() -> None:
    rig = root_rig({"ep0": [0], "ep1": [1]})
    rig.connect("b0", "b1")
    rig.rendezvous(assignment({"b0": [0], "b1": [1]}, group=OTHER))
    rig.send("ep0", chunk(0))
    rig.send("b0", chunk(0, group=OTHER, values=[100] * 4))
    out_a = rig.send("ep1", chunk(1))
    out_b = rig.send("b1", chunk(1, group=OTHER, values=[200] * 4))
    assert {c.peer for c in out_a if isinstance(c, SendMessage)} == {"ep0", "ep1"}
    assert {c.peer for c in out_b if isinstance(c, SendMessage)} == {"b0", "b1"}
    (ra, _) = sent(out_a, None, Result)
    (rb, _) = sent(out_b, None, Result)
    assert payload.open_verified(KEYS[GROUP], ra, frozenset({0, 1})).tolist() == [3] * 4
    assert payload.open_verified(KEYS[OTHER], rb, frozenset({0, 1})).tolist() == [300] * 4


def test_window_bounds_open_slots() -> None:
    rig = root_rig()
    rig.send("ep0", chunk(0, index=0))
    rig.send("ep0", chunk(0, index=1))
    assert errors(rig.send("ep0", chunk(0, op_id=1))) == [ErrorCode.RESOURCE_EXHAUSTED]
    assert rig.machine.open_slots(GROUP) == 2
    rig.send("ep1", chunk(1))
    rig.send("ep2", chunk(2))  # slot (0, 0) completes and frees room
    assert rig.send("ep0", chunk(0, op_id=1)) == []
    assert rig.machine.open_slots(GROUP) == 2


def test_broadcast_goes_up_unchanged_then_down_to_everyone() -> None:
    leaf, parent = leaf_rig()
    data = chunk(1, cls=BroadcastData, kind=Collective.BROADCAST, root=1, values=[9, 8, 7, 6])
    assert sent(leaf.send("ep1", data), parent) == [data]
    assert errors(leaf.send("ep0", data)) == [ErrorCode.UNAUTHORIZED]  # ep0 is not the root
    down = leaf.send(parent, data)
    assert sent(down, "ep0") == [data] and sent(down, "ep1") == [data]
    root = root_rig()
    assert {c.peer for c in root.send("ep1", data) if isinstance(c, SendMessage)} == {"ep0", "ep1", "ep2"}


def test_broadcast_data_must_come_from_its_root_alone() -> None:
    rig = Rig()
    rig.register()
    rig.connect("ep0")
    rig.connect("sub", role=Role.AGGREGATOR)
    rig.rendezvous(assignment({"ep0": [0], "sub": [1, 2]}))
    data = chunk(1, cls=BroadcastData, kind=Collective.BROADCAST, root=1)
    widened = dataclasses.replace(data, contributors=bitmap_from_ranks([1, 2]))
    assert errors(rig.send("sub", widened), "sub") == [ErrorCode.UNAUTHORIZED]
    assert sent(rig.send("sub", data), "ep0") == [data]


def test_memory_is_window_times_chunk_not_tensor() -> None:
    rig = root_rig({"ep0": [0], "ep1": [1]})
    total = 4 * 1000  # 1000 chunks of 4 elements
    for index in range(1000):
        rig.send("ep0", chunk(0, index=index, total=total, values=[1 << 30] * 4))
        rig.send("ep1", chunk(1, index=index, total=total, values=[1 << 30] * 4))
    assert rig.machine.slot_bytes == 0
    assert rig.machine.peak_slot_bytes <= PARAMS.window * PARAMS.chunk_elements * 8


def test_remembered_chunk_fingerprints_are_bounded_by_record_limit() -> None:
    """Completed slots are remembered (to recognise late retransmissions) only up to
    ``record_limit`` per group, oldest forgotten first: the aggregator's memory stays
    bounded however many operations a group runs."""
    rig = Rig(AggregatorMachine(AggregatorConfig(address=ADDRESS, record_limit=2)))
    rig.register()
    rig.connect("ep0", "ep1")
    rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}))
    for op_id in range(3):
        rig.send("ep0", chunk(0, op_id=op_id, total=4))
        assert len(sent(rig.send("ep1", chunk(1, op_id=op_id, total=4)), None, Result)) == 2
    assert rig.machine.slot_state(GROUP, 0, 0) is None, "the oldest record is forgotten"
    assert rig.machine.slot_state(GROUP, 1, 0) is SlotState.COMPLETE
    assert rig.machine.slot_state(GROUP, 2, 0) is SlotState.COMPLETE
    # A late copy of a remembered chunk is still recognised (and answered with its kept
    # Result); one of a forgotten chunk opens a fresh slot (which will time out):
    # nothing is counted twice either way.
    assert [m.op_id for m in sent(rig.send("ep0", chunk(0, op_id=2, total=4)), "ep0")] == [2]
    assert rig.machine.open_slots(GROUP) == 0
    assert rig.send("ep0", chunk(0, op_id=0, total=4)) == []
    assert rig.machine.slot_state(GROUP, 0, 0) is SlotState.COLLECTING


def test_remembered_aborted_operations_are_bounded_by_record_limit() -> None:
    rig = Rig(AggregatorMachine(AggregatorConfig(address=ADDRESS, record_limit=2)))
    rig.register()
    rig.connect("ep0", "ep1")
    rig.rendezvous(assignment({"ep0": [0], "ep1": [1]}))
    for op_id in range(3):
        abort = Abort(group_id=GROUP, epoch=1, op_id=op_id, code=ErrorCode.TIMEOUT, detail="gave up")
        assert sent(rig.send("ep0", abort), "ep1", Abort)
    assert rig.machine.slot_state(GROUP, 0, 0) is None, "the oldest aborted operation is forgotten"
    assert rig.machine.slot_state(GROUP, 1, 0) is SlotState.ABORTED
    assert rig.machine.slot_state(GROUP, 2, 0) is SlotState.ABORTED


def _float_chunk(
    rank: int, block_elements: int, values: list[int], chunk_elements: int = PARAMS.chunk_elements
) -> ChunkMessage:
    """Rank ``rank``'s block-scaled float32 SUM chunk (one block, scale 0)."""
    header = payload.ChunkHeader(
        group_id=GROUP,
        epoch=1,
        op_id=0,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.FLOAT32,
        total_elements=len(values),
        chunk_elements=chunk_elements,
        chunk_index=0,
        width=4,
        block_elements=block_elements,
        scales=bytes(2),
    )
    return payload.seal(KEYS[GROUP], header, rank, np.array([*values, 1], dtype=np.int64))


def test_block_scaled_chunks_must_use_the_groups_block_size() -> None:
    rig = root_rig()
    wrong = _float_chunk(0, PARAMS.block_elements * 2, [1, 2])
    assert errors(rig.send("ep0", wrong), "ep0") == [ErrorCode.OPERATION_MISMATCH]
    assert rig.machine.open_slots(GROUP) == 0
    right = [_float_chunk(r, PARAMS.block_elements, [r, r]) for r in range(3)]
    out = [c for r, part in enumerate(right) for c in rig.send(f"ep{r}", part)]
    (result,) = sent(out, "ep0", Result)
    assert result.width == 4 and unpack(result.payload, 4).tolist() == [3, 3, 3]  # two sums, 3 attestations


def test_a_bad_first_part_is_refused_to_the_child_that_sent_it() -> None:
    """The first part of a slot is kept as it is, so it is checked on arrival: a
    missing tag is refused to its sender, and the honest children still complete."""
    rig = root_rig()
    untagged = dataclasses.replace(chunk(0), tag=None)
    assert errors(rig.send("ep0", untagged), "ep0") == [ErrorCode.INVALID_FIELD]
    assert rig.machine.open_slots(GROUP) == 0
    rig.send("ep0", chunk(0))
    rig.send("ep1", chunk(1))
    assert len(sent(rig.send("ep2", chunk(2)), None, Result)) == 3


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["ep0", "ep1", "ep2", "stranger"]),
            st.integers(0, 2),
            st.integers(0, 1),
            st.booleans(),
        ),
        max_size=25,
    ),
    st.randoms(use_true_random=False),
)
@settings(max_examples=60, deadline=None)
def test_random_arrivals_never_double_count(arrivals: list[tuple[str, int, int, bool]], rnd: object) -> None:
    """Any interleaving of (re)transmissions, strangers and conflicting copies: each
    completed slot's Result is exactly the sum of the first chunk taken from each child."""
    rig = root_rig()
    rig.connect("stranger")
    taken: dict[tuple[int, str], int] = {}
    results: dict[int, list[int]] = {}
    for peer, index, op_id, variant in arrivals:
        rank = {"ep0": 0, "ep1": 1, "ep2": 2, "stranger": 0}[peer]
        value = rank + 1 + (10 if variant else 0)
        out = rig.send(peer, chunk(rank, op_id=op_id, index=index % 2, values=[value] * 4))
        key = (op_id * 2 + index % 2, peer)
        if peer != "stranger" and not errors(out) and key not in taken:
            taken[key] = value
        for message in sent(out, "ep0", Result):
            results[message.op_id * 2 + message.chunk_index] = payload.open_verified(
                KEYS[GROUP], message, frozenset({0, 1, 2})
            ).tolist()
        assert rig.machine.open_slots(GROUP) <= PARAMS.window
    for slot, values in results.items():
        expected = sum(v for (s, _), v in taken.items() if s == slot)
        assert values == [expected] * 4


def test_malformed_input_and_stray_messages_get_typed_errors() -> None:
    rig = root_rig()
    out = rig.feed(MessageMalformed("ep0", CcoError(ErrorCode.MALFORMED_CBOR, "bad")))
    assert errors(out, "ep0") == [ErrorCode.MALFORMED_CBOR]
    assert ClosePeer("ep0", ErrorCode.MALFORMED_CBOR, "bad") in out  # a connection error
    rig.connect("ep0")
    assert errors(rig.send("ep0", AggregatorAccept(node_id="x", heartbeat_interval_ms=100))) == [
        ErrorCode.PROTOCOL_VIOLATION
    ]
    assert errors(rig.send("ep0", chunk(0, cls=Result))) == [ErrorCode.PROTOCOL_VIOLATION]
    assert errors(rig.send("nobody", chunk(0))) == [ErrorCode.UNAUTHORIZED]


SCALED = dataclasses.replace(PARAMS, block_elements=16, scaled_chunk_elements=64)
"""Chunks of 4 elements, but block-scaled ones of up to 64 (four blocks of 16)."""


def scaled_rig() -> Rig:
    children = {"ep0": [0], "ep1": [1], "ep2": [2]}
    rig = Rig()
    rig.register()
    rig.connect(*children)
    rig.rendezvous(assignment(children, params=SCALED))
    return rig


@pytest.mark.parametrize("chunk_elements", [16, 48, 64])
def test_block_scaled_chunks_may_be_cut_in_whole_blocks_up_to_the_scaled_limit(chunk_elements: int) -> None:
    """The ranks of a float SUM agree its chunk size in its scale pass: the aggregator
    takes any whole number of blocks up to scaled_chunk_elements."""
    rig = scaled_rig()
    parts = [_float_chunk(r, 16, [r, 2 * r], chunk_elements) for r in range(3)]
    out = [c for r, part in enumerate(parts) for c in rig.send(f"ep{r}", part)]
    (result,) = sent(out, "ep0", Result)
    assert result.chunk_elements == chunk_elements
    assert unpack(result.payload, 4).tolist() == [3, 6, 3]  # two sums, 3 attestations


@pytest.mark.parametrize("chunk_elements", [8, 24, 80])
def test_block_scaled_chunks_of_part_blocks_or_above_the_limit_are_refused(chunk_elements: int) -> None:
    rig = scaled_rig()
    wrong = _float_chunk(0, 16, [1, 2], chunk_elements)
    assert errors(rig.send("ep0", wrong), "ep0") == [ErrorCode.OPERATION_MISMATCH]
    assert rig.machine.open_slots(GROUP) == 0


def test_other_chunks_keep_the_groups_chunk_elements_whatever_the_scaled_limit() -> None:
    rig = scaled_rig()
    wrong = dataclasses.replace(chunk(0), chunk_elements=16)  # refused before any key would be needed
    assert errors(rig.send("ep0", wrong), "ep0") == [ErrorCode.OPERATION_MISMATCH]


def test_parts_cut_in_different_sizes_abort_the_operation() -> None:
    """Ranks that did not agree the same chunk size called different operations: every
    rank learns it at once (an Abort), instead of waiting for its timeout."""
    rig = scaled_rig()
    assert not rig.send("ep0", _float_chunk(0, 16, [1, 2], 32))
    out = rig.send("ep1", _float_chunk(1, 16, [1, 2], 64))
    aborts = sent(out, None, Abort)
    assert aborts and all(a.code is ErrorCode.OPERATION_MISMATCH for a in aborts)
