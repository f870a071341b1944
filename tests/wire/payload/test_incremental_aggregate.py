"""An Aggregate adds parts as they arrive and builds one message: the same bytes as
``combine`` of the same parts in any order, and a refused part changes nothing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import ChunkMessage, PartialAggregate, Result
from cco.wire.packing import RANGE_BOUND
from cco.wire.payload import (
    Aggregate,
    ChunkHeader,
    check_part,
    combine,
    derive_group_keys,
    open_verified,
    seal,
)
from cco.wire.registries import Collective, DType, ReduceOp

GROUP = bytes(range(16))
KEYS = derive_group_keys(bytes(range(64, 96)), GROUP)
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def header(op: ReduceOp = ReduceOp.SUM, width: int | None = None, elements: int = 5) -> ChunkHeader:
    scaled = width is not None
    return ChunkHeader(
        group_id=GROUP,
        epoch=3,
        op_id=7,
        kind=Collective.ALL_REDUCE,
        op=op,
        dtype=DType.FLOAT32 if scaled else DType.INT64,
        total_elements=elements,
        chunk_elements=8,
        chunk_index=0,
        width=width,
        block_elements=64 if scaled else None,
        scales=b"\x00\x00" if scaled else None,
    )


def part(rank: int, values: list[int], chunk: ChunkHeader) -> ChunkMessage:
    return seal(KEYS, chunk, rank, np.array(values, dtype=np.int64))


@st.composite
def parts(draw: st.DrawFn) -> tuple[ChunkHeader, list[ChunkMessage]]:
    op = draw(st.sampled_from([ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR]))
    bits = draw(st.sampled_from([7, 15, 31, 60]))
    bound = (1 << bits) - 1 if op is ReduceOp.SUM and bits == 60 else (1 << bits)
    chunk = header(op)
    ranks = draw(st.lists(st.integers(0, 40), min_size=1, max_size=6, unique=True))
    values = (
        st.integers(-bound // len(ranks), bound // len(ranks))
        if op is ReduceOp.SUM
        else st.integers(0, bound)
    )
    made = [part(r, draw(st.lists(values, min_size=5, max_size=5)), chunk) for r in ranks]
    return chunk, draw(st.permutations(made))


@SETTINGS
@given(parts(), st.sampled_from([PartialAggregate, Result]))
def test_the_aggregate_of_parts_in_any_order_is_their_combination(
    drawn: tuple[ChunkHeader, list[ChunkMessage]], cls: type[ChunkMessage]
) -> None:
    _, made = drawn
    aggregate = Aggregate(made[0])
    for later in made[1:]:
        aggregate.add(later)
    built = aggregate.message(cls)
    assert built == combine(sorted(made, key=lambda m: m.contributors), cls)
    assert type(built) is cls


def test_a_lone_part_goes_on_as_it_is_under_the_outgoing_class() -> None:
    only = part(3, [1, 2, 3, 4, 5], header())
    aggregate = Aggregate(only)
    assert aggregate.held_bytes == len(only.payload)
    sent = aggregate.message(PartialAggregate)
    assert isinstance(sent, PartialAggregate) and sent.payload == only.payload and sent.tag == only.tag


def test_a_refused_part_leaves_the_aggregate_as_it_was() -> None:
    chunk = header()
    first, second = part(0, [B := RANGE_BOUND // 2 + 1, 0, 0, 0, 0], chunk), part(1, [B, 0, 0, 0, 0], chunk)
    aggregate = Aggregate(first)
    with pytest.raises(CcoError) as beyond:
        aggregate.add(second)  # B + B leaves [-B, B]: OVERFLOW, as combine says
    assert beyond.value.code is ErrorCode.OVERFLOW
    with pytest.raises(CcoError) as twice:
        aggregate.add(first)  # rank 0 again
    assert twice.value.code is ErrorCode.DUPLICATE_CONTRIBUTION
    other = part(2, [1, 1, 1, 1, 1], dataclasses.replace(chunk, op_id=8))
    with pytest.raises(CcoError) as mismatch:
        aggregate.add(other)
    assert mismatch.value.code is ErrorCode.OPERATION_MISMATCH and "op_id" in mismatch.value.detail
    aggregate.add(part(2, [-B, 1, 1, 1, 1], chunk))
    result = aggregate.message(Result)
    assert open_verified(KEYS, result, frozenset({0, 2})).tolist() == [0, 1, 1, 1, 1]


def test_a_block_scaled_sum_is_checked_against_its_width_part_by_part() -> None:
    chunk = header(width=1, elements=3)
    fits = [part(r, [60, -60, 0, 1], chunk) for r in range(2)]
    aggregate = Aggregate(fits[0])
    aggregate.add(fits[1])  # 120 fits one byte
    with pytest.raises(CcoError) as wide:
        aggregate.add(part(2, [60, 0, 0, 1], chunk))  # 180 does not
    assert wide.value.code is ErrorCode.OVERFLOW and "does not fit 1 bytes" in wide.value.detail
    assert aggregate.message(Result) == combine(fits, Result)


def test_a_block_scaled_sum_adds_at_its_width_until_the_bound_cannot_clear_it() -> None:
    """Parts the bound clears add at the payload's width (the sums held are one byte
    each here); one it cannot clear (100 + 100 may not fit a byte) is measured in
    int64 and taken, since the combination fits; a later part that would not fit is
    refused and changes nothing.  Every message is combine's."""
    chunk = header(width=1, elements=3)
    small = [part(r, [20, -20, 0, 1], chunk) for r in range(2)]
    aggregate = Aggregate(small[0])
    aggregate.add(small[1])
    assert aggregate.held_bytes == 4  # four integers at one byte
    assert aggregate.message(Result) == combine(small, Result)
    with pytest.raises(CcoError) as wide:
        aggregate.add(part(2, [100, -100, 0, 1], chunk))  # 140 and -140 do not fit a byte
    assert wide.value.code is ErrorCode.OVERFLOW
    assert aggregate.held_bytes == 4 and aggregate.message(Result) == combine(small, Result)
    back = part(2, [-100, 100, 0, 1], chunk)
    aggregate.add(back)  # the bound (140) cannot clear it; the combination (-60, 60) fits
    assert aggregate.held_bytes == 4 * 8  # widened to int64 for good
    beyond = part(3, [-100, 0, 0, 1], chunk)
    with pytest.raises(CcoError) as wide:
        aggregate.add(beyond)  # -160 does not fit
    assert wide.value.code is ErrorCode.OVERFLOW
    aggregate.add(part(4, [1, 2, 3, 1], chunk))
    assert aggregate.message(Result) == combine([*small, back, part(4, [1, 2, 3, 1], chunk)], Result)


def test_the_first_part_is_checked_as_combine_checks_each_part() -> None:
    bad = dataclasses.replace(part(0, [1, 2, 3, 4, 5], header()), tag=None)
    for attempt in (lambda: Aggregate(bad), lambda: check_part(bad)):
        with pytest.raises(CcoError) as refused:
            attempt()
        assert refused.value.code is ErrorCode.INVALID_FIELD


def test_open_verified_refuses_a_chunk_other_than_the_header_it_is_given() -> None:
    chunk = header()
    result = combine([part(0, [1, 1, 1, 1, 1], chunk)], Result)
    assert open_verified(KEYS, result, frozenset({0}), header=chunk).tolist() == [1] * 5
    with pytest.raises(CcoError) as refused:
        open_verified(KEYS, result, frozenset({0}), header=dataclasses.replace(chunk, epoch=4))
    assert refused.value.code is ErrorCode.OPERATION_MISMATCH
