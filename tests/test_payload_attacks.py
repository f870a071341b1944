"""Every attack an on-path aggregator could try is detected by the receiving endpoint.

The aggregator holds no key, so each attack below edits values, tags, bitmaps or
headers directly (``dataclasses.replace``) the way a compromised aggregator would,
and the endpoint's ``open_verified`` must refuse the result with the right check.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.mac import expected_tag
from cco.wire.messages import ChunkMessage, PartialAggregate, Result
from cco.wire.modp import P
from cco.wire.packing import minimal_width
from cco.wire.payload import (
    RANGE_BOUND,
    ChunkHeader,
    combine,
    derive_group_keys,
    open_verified,
    seal,
)
from cco.wire.registries import Collective, DType, ReduceOp

GROUP = bytes(16)
KEYS = derive_group_keys(b"\x07" * 32, GROUP)
WORLD = 4
EVERYONE = frozenset(range(WORLD))
N = 8


def header(
    *, index: int = 0, epoch: int = 5, op_id: int = 9, group: bytes = GROUP, op: ReduceOp = ReduceOp.SUM
) -> ChunkHeader:
    return ChunkHeader(
        group_id=group,
        epoch=epoch,
        op_id=op_id,
        kind=Collective.ALL_REDUCE,
        op=op,
        dtype=DType.INT32,
        scale=0,
        total_elements=2 * N,
        chunk_elements=N,
        chunk_index=index,
    )


def inputs(rank: int) -> np.ndarray:
    return np.arange(N, dtype=np.int64) * (rank + 1) - 3


def contributions(make: ChunkHeader | None = None) -> list[ChunkMessage]:
    make = make or header()
    return [seal(KEYS, make, r, inputs(r)) for r in range(WORLD)]


def refused(message: ChunkMessage, expected: frozenset[int] = EVERYONE) -> str:
    with pytest.raises(CcoError) as caught:
        open_verified(KEYS, message, expected)
    assert caught.value.code is ErrorCode.VERIFICATION_FAILED
    return caught.value.detail


def with_values(message: ChunkMessage, values: list[int]) -> ChunkMessage:
    """``message`` carrying other integers, re-encoded at their minimal width."""
    width = minimal_width(min(values), max(values))
    return dataclasses.replace(message, width=width, payload=np.array(values).astype(f"<i{width}").tobytes())


def honest() -> ChunkMessage:
    return combine(contributions(), Result)


def test_the_honest_result_verifies() -> None:
    values = open_verified(KEYS, honest(), EVERYONE)
    assert values.tolist() == [sum(int(inputs(r)[j]) for r in range(WORLD)) for j in range(N)]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(position=st.integers(0, N - 1), delta=st.integers(-(2**40), 2**40).filter(bool))
def test_one_element_changed(position: int, delta: int) -> None:
    result = honest()
    values = open_verified(KEYS, result, EVERYONE).tolist()
    values[position] += delta
    assert refused(with_values(result, values)).startswith("tag")


def test_a_contributor_dropped_without_changing_the_bitmap() -> None:
    parts = contributions()
    partial = combine(parts[:3], Result)
    forged = dataclasses.replace(partial, contributors=bitmap_from_ranks(EVERYONE))
    assert refused(forged).startswith("tag")


def test_a_contributor_dropped_with_its_bit() -> None:
    assert refused(combine(contributions()[:3], Result)).startswith("bitmap")


def test_a_contributor_counted_twice() -> None:
    parts = contributions()
    with pytest.raises(CcoError) as caught:
        combine([*parts, parts[2]], Result)
    assert caught.value.code is ErrorCode.DUPLICATE_CONTRIBUTION
    # An aggregator that adds the values and tag twice anyway, keeping the bitmap.
    result = honest()
    values = open_verified(KEYS, result, EVERYONE)
    doubled = with_values(result, (values + inputs(2)).tolist())
    tag = parts[2].tag
    assert result.tag is not None and tag is not None
    assert refused(dataclasses.replace(doubled, tag=(result.tag + tag) % P)).startswith("tag")
    assert refused(doubled).startswith("tag")


@pytest.mark.parametrize(
    "replayed_from",
    [
        {"epoch": 4},
        {"op_id": 8},
        {"group": b"\x01" * 16},
    ],
    ids=["other-epoch", "other-operation", "other-group"],
)
def test_a_contribution_replayed_from_another_epoch_operation_or_group(
    replayed_from: dict[str, object],
) -> None:
    parts = contributions()
    old = seal(KEYS, header(**replayed_from), 3, inputs(3))  # type: ignore[arg-type]
    with pytest.raises(CcoError) as caught:
        combine([*parts[:3], old], Result)
    assert caught.value.code is ErrorCode.OPERATION_MISMATCH
    # The aggregator rewrites the replayed chunk's header to make it fit.
    disguised = dataclasses.replace(old, group_id=GROUP, epoch=5, op_id=9)
    assert refused(combine([*parts[:3], disguised], Result)).startswith("tag")


def test_a_replay_sealed_with_another_groups_keys() -> None:
    other_keys = derive_group_keys(b"\x08" * 32, GROUP)
    stranger = seal(other_keys, header(), 3, inputs(3))
    assert refused(combine([*contributions()[:3], stranger], Result)).startswith("tag")


def test_two_chunks_swapped() -> None:
    first = combine(contributions(header(index=0)), Result)
    second_parts = [seal(KEYS, header(index=1), r, inputs(r) * 7) for r in range(WORLD)]
    second = combine(second_parts, Result)
    swapped_payloads = dataclasses.replace(first, width=second.width, payload=second.payload, tag=second.tag)
    assert refused(swapped_payloads).startswith("tag")
    swapped_index = dataclasses.replace(second, chunk_index=0)
    assert refused(swapped_index).startswith("tag")


def test_a_contributor_added_who_did_not_contribute() -> None:
    parts = contributions()[:3]
    # Rank 3 is expected but never sent anything: the aggregator invents its chunk.
    invented = dataclasses.replace(parts[0], contributors=bitmap_from_ranks([3]), tag=12345)
    assert refused(combine([*parts, invented], Result)).startswith("tag")
    # Or claims a rank outside the expected set.
    outsider = dataclasses.replace(parts[0], contributors=bitmap_from_ranks([7]))
    forged = combine([*contributions(), dataclasses.replace(outsider, tag=0)], Result)
    assert refused(forged).startswith("bitmap")


@settings(max_examples=50, deadline=None)
@given(position=st.integers(0, N - 1), multiple=st.integers(-3, 3).filter(bool))
def test_a_value_shifted_by_a_multiple_of_p(position: int, multiple: int) -> None:
    result = honest()
    values = open_verified(KEYS, result, EVERYONE).tolist()
    values[position] += multiple * P
    shifted = with_values(result, values)
    # The tag alone cannot see the shift (u * p = 0 mod p): only the range check can.
    chunk_id = ChunkHeader.of(result).chunk_id()
    assert expected_tag(KEYS, chunk_id, EVERYONE, np.array(values, dtype=np.int64)) == result.tag
    assert refused(shifted).startswith("range")


def test_a_guessed_tag_is_refused() -> None:
    result = honest()
    assert result.tag is not None
    for guess in (0, 1, P - 1, result.tag ^ 1, (result.tag + 1) % P):
        assert refused(dataclasses.replace(result, tag=guess)).startswith("tag")
    assert refused(dataclasses.replace(result, tag=None)).startswith("tag")
    assert refused(dataclasses.replace(result, tag=result.tag + P)).startswith("tag")


def test_values_beyond_the_bound_are_refused_even_with_a_valid_tag() -> None:
    make = header()
    big = np.full(N, RANGE_BOUND, dtype=np.int64)
    sealed = seal(KEYS, make, 0, big)
    values = big.tolist()
    values[0] = RANGE_BOUND + 1
    raw = dataclasses.replace(sealed, payload=np.array(values, dtype="<i8").tobytes())
    assert refused(raw, frozenset({0})).startswith("range")


@pytest.mark.parametrize(
    ("op", "tamper", "rule"),
    [
        (ReduceOp.MAX, lambda v: v - 1, "MAX below"),
        (ReduceOp.MIN, lambda v: v + 1, "MIN above"),
        (ReduceOp.BOR, lambda v: v & ~np.int64(1), "BOR lacks"),
        (ReduceOp.BAND, lambda v: v | np.int64(1 << 20), "BAND has"),
    ],
)
def test_untagged_results_inconsistent_with_own_values(op: ReduceOp, tamper: object, rule: str) -> None:
    make = header(op=op)
    own = np.arange(N, dtype=np.int64) | 1  # odd values, bit 20 clear
    parts = [seal(KEYS, make, r, own) for r in range(WORLD)]
    result = combine(parts, PartialAggregate)
    values = open_verified(KEYS, result, EVERYONE, own=(0, own))
    forged = with_values(result, tamper(values).tolist())  # type: ignore[operator]
    with pytest.raises(CcoError) as caught:
        open_verified(KEYS, forged, EVERYONE, own=(0, own))
    assert caught.value.code is ErrorCode.VERIFICATION_FAILED
    assert caught.value.detail.startswith(f"consistency: {rule}")
