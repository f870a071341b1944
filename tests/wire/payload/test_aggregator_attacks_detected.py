"""Every attack an on-path aggregator could try is detected by the receiving endpoint.

The aggregator holds no key, so each attack below edits values, tags, bitmaps or
headers directly (``dataclasses.replace``) the way a compromised aggregator would,
and the endpoint's ``open_verified`` must refuse the result with the right check.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cco.wire.blockscale import attestations, propose, quantize, sum_limit
from cco.wire.dtypes import element_type
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.mac import expected_tag
from cco.wire.messages import BroadcastData, ChunkMessage, PartialAggregate, Result
from cco.wire.modp import P
from cco.wire.packing import minimal_width
from cco.wire.payload import (
    RANGE_BOUND,
    ChunkHeader,
    check_encoding,
    combine,
    derive_group_keys,
    open_verified,
    seal,
)
from cco.wire.registries import Collective, DType, ReduceOp

pytestmark = pytest.mark.both_kernels

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


# --- widths: one encoding per chunk ---------------------------------------------------


def widened(message: ChunkMessage, width: int) -> ChunkMessage:
    """``message`` with the same integers written at another width."""
    values = np.frombuffer(message.payload, dtype=f"<i{message.width}")
    return dataclasses.replace(message, width=width, payload=values.astype(f"<i{width}").tobytes())


def test_a_result_not_at_its_smallest_width_is_invalid() -> None:
    """The width of an unscaled chunk is not in its id (the tag still matches), so only
    the smallest-width rule keeps its encoding unique."""
    result = honest()
    assert result.width == 1
    for width in (2, 4, 8):
        wide = widened(result, width)
        with pytest.raises(CcoError) as caught:
            open_verified(KEYS, wide, EVERYONE)
        assert caught.value.code is ErrorCode.INVALID_FIELD and "smallest" in caught.value.detail
        with pytest.raises(CcoError) as caught:
            check_encoding(wide)
        assert caught.value.code is ErrorCode.INVALID_FIELD and "smallest" in caught.value.detail
    assert check_encoding(result).tolist() == open_verified(KEYS, result, EVERYONE).tolist()


@pytest.mark.parametrize("form", ["ordered", "patterns"])
def test_ordered_and_pattern_chunks_also_use_their_smallest_width(form: str) -> None:
    if form == "ordered":  # float16 MAX: keys of 1.0 and -2.0 need two bytes
        make = dataclasses.replace(header(op=ReduceOp.MAX), dtype=DType.FLOAT16)
        keys = np.array([15360, -16385] * (N // 2), dtype=np.int64)
        message: ChunkMessage = combine([seal(KEYS, make, r, keys) for r in range(WORLD)], Result)
        expected = EVERYONE
    else:
        make = dataclasses.replace(header(), kind=Collective.BROADCAST, root=2)
        message = seal(KEYS, make, 2, inputs(2), BroadcastData)
        expected = frozenset({2})
    assert message.width == (2 if form == "ordered" else 1)
    open_verified(KEYS, message, expected)
    with pytest.raises(CcoError) as caught:
        open_verified(KEYS, widened(message, 8), expected)
    assert caught.value.code is ErrorCode.INVALID_FIELD


# --- block-scaled chunks: scales, attestations and width --------------------------------

SCALED_N = 40
BLOCK = 16  # three blocks: 16, 16 and 8 elements
SCALED_WIDTH = 4
LIMIT = sum_limit(SCALED_WIDTH, WORLD)
FLOAT32 = element_type(DType.FLOAT32)


def float_inputs(rank: int) -> np.ndarray:
    """Rank r's float32 chunk; each block's largest value belongs to a different rank."""
    x = np.linspace(-1, 1, SCALED_N).astype(np.float32) * np.float32(rank + 1)
    x[(rank * 13) % SCALED_N] = np.float32(100.0 * (rank + 1))
    return x


def proposals(rank: int) -> np.ndarray:
    return propose(float_inputs(rank), FLOAT32, BLOCK, LIMIT)


def honest_scales() -> np.ndarray:
    """What the scale pass agrees: the minimum of every rank's proposals."""
    return np.min(np.stack([proposals(r) for r in range(WORLD)]), axis=0)


def scaled_header(scales: np.ndarray, width: int = SCALED_WIDTH) -> ChunkHeader:
    return ChunkHeader(
        group_id=GROUP,
        epoch=5,
        op_id=10,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.FLOAT32,
        total_elements=SCALED_N,
        chunk_elements=SCALED_N,
        chunk_index=0,
        width=width,
        block_elements=BLOCK,
        scales=scales.astype("<i2").tobytes(),
    )


def scaled_contribution(rank: int, scales: np.ndarray) -> ChunkMessage:
    """What an honest rank seals once told the agreed ``scales``: its quantized chunk and
    its attestations."""
    values = quantize(float_inputs(rank), FLOAT32, scales, BLOCK, LIMIT)
    return seal(
        KEYS, scaled_header(scales), rank, np.concatenate([values, attestations(proposals(rank), scales)])
    )


def scaled_result(scales: np.ndarray | None = None) -> ChunkMessage:
    agreed = honest_scales() if scales is None else scales
    return combine([scaled_contribution(r, agreed) for r in range(WORLD)], Result)


def attestation_counts(message: ChunkMessage) -> list[int]:
    return np.frombuffer(message.payload, dtype=f"<i{message.width}")[SCALED_N:].tolist()


def test_the_honest_block_scaled_result_verifies() -> None:
    agreed = honest_scales()
    assert len(set(agreed.tolist())) > 1  # the blocks really have different scales
    result = scaled_result()
    values = open_verified(KEYS, result, EVERYONE)
    expected = [
        sum(
            round(Fraction(float(float_inputs(r)[j])) * Fraction(2) ** int(agreed[j // BLOCK]))
            for r in range(WORLD)
        )
        for j in range(SCALED_N)
    ]
    assert values.tolist() == expected
    assert all(1 <= a <= WORLD for a in attestation_counts(result))


@pytest.mark.parametrize("block", [0, 1, 2])
def test_a_scale_lowered_by_the_aggregator_is_attested_by_nobody(block: int) -> None:
    """The scale pass is an untagged MIN, so an aggregator can send every rank a lower
    scale: all of them fit it and seal valid tags, but none attests the block."""
    lowered = honest_scales()
    lowered[block] -= 1
    result = scaled_result(lowered)
    assert attestation_counts(result)[block] == 0
    detail = refused(result)
    assert detail.startswith("attestation") and f"block {block} " in detail


def test_a_scale_raised_by_the_aggregator_is_refused_by_the_rank_it_does_not_fit() -> None:
    agreed = honest_scales()
    raised = agreed.copy()
    raised[0] += 1
    lowest = [r for r in range(WORLD) if proposals(r)[0] == agreed[0]]
    assert lowest
    # In the scale pass (an ordinary untagged MIN over INT16 proposals) the result is
    # above that rank's own proposal: a consistency failure.
    scale_pass = dataclasses.replace(
        header(op=ReduceOp.MIN), dtype=DType.INT16, total_elements=3, chunk_elements=3
    )
    parts = [seal(KEYS, scale_pass, r, proposals(r).astype(np.int64)) for r in range(WORLD)]
    honest_pass = combine(parts, Result)
    assert (
        open_verified(KEYS, honest_pass, EVERYONE, own=(lowest[0], proposals(lowest[0]))).tolist()
        == agreed.tolist()
    )
    forged = with_values(honest_pass, raised.tolist())
    with pytest.raises(CcoError) as caught:
        open_verified(KEYS, forged, EVERYONE, own=(lowest[0], proposals(lowest[0])))
    assert caught.value.code is ErrorCode.VERIFICATION_FAILED
    assert caught.value.detail.startswith("consistency: MIN above own value")
    # And its values do not fit the raised scale: it cannot even seal them.
    with pytest.raises(CcoError) as caught:
        scaled_contribution(lowest[0], raised)
    assert caught.value.code is ErrorCode.OVERFLOW


def test_more_attestations_than_contributors_are_refused() -> None:
    agreed = honest_scales()
    parts = [scaled_contribution(r, agreed) for r in range(WORLD)]
    # A contributor that attests with 2 (valid tag: it sealed that itself).
    values = np.frombuffer(parts[1].payload, dtype=f"<i{SCALED_WIDTH}").astype(np.int64)
    values[SCALED_N:] = WORLD
    parts[1] = seal(KEYS, scaled_header(agreed), 1, values)
    result = combine(parts, Result)
    assert max(attestation_counts(result)) > WORLD
    assert refused(result).startswith("attestation")


def test_attestations_changed_in_transit_break_the_tag() -> None:
    lowered = honest_scales()
    lowered[1] -= 1
    result = scaled_result(lowered)
    counts = np.frombuffer(result.payload, dtype=f"<i{SCALED_WIDTH}").astype(np.int64)
    counts[SCALED_N + 1] = 1  # hide the lowered scale
    forged = dataclasses.replace(result, payload=counts.astype(f"<i{SCALED_WIDTH}").tobytes())
    assert refused(forged).startswith("tag")


def test_a_changed_scales_field_breaks_the_tag() -> None:
    result = scaled_result()
    agreed = honest_scales()
    for change in ((0, 1), (1, -1), (2, 1000)):
        other = agreed.copy()
        other[change[0]] += change[1]
        assert refused(dataclasses.replace(result, scales=other.astype("<i2").tobytes())).startswith("tag")


def test_the_width_of_a_block_scaled_chunk_is_part_of_its_identity() -> None:
    """The same integers at another width are another chunk: the tag no longer matches,
    wider or narrower, although a block-scaled chunk may use any width."""
    make = scaled_header(honest_scales())
    small = np.concatenate([np.arange(SCALED_N) - 20, np.ones(3)]).astype(np.int64)
    result = combine([seal(KEYS, make, r, small) for r in range(WORLD)], Result)
    assert result.width == SCALED_WIDTH
    assert open_verified(KEYS, result, EVERYONE).tolist() == (WORLD * small[:SCALED_N]).tolist()
    for width in (2, 8):
        other = widened(result, width)
        assert check_encoding(other).tolist() == check_encoding(result).tolist()
        assert refused(other).startswith("tag")


def test_different_scales_for_different_children() -> None:
    """An aggregator that gives one rank other scales (to skew its weight) changes that
    rank's chunk id: combining refuses it, and rewriting its header breaks the tag."""
    agreed = honest_scales()
    skewed = agreed.copy()
    skewed[0] -= 3
    parts = [scaled_contribution(r, agreed) for r in range(3)] + [scaled_contribution(3, skewed)]
    with pytest.raises(CcoError) as caught:
        combine(parts, Result)
    assert caught.value.code is ErrorCode.OPERATION_MISMATCH and "scales" in caught.value.detail
    parts[3] = dataclasses.replace(parts[3], scales=agreed.astype("<i2").tobytes())
    assert refused(combine(parts, Result)).startswith("tag")
