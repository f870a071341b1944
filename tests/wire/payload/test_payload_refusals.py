"""Every refusal of cco/wire/payload.py, reached directly (issue 11).

Most of these checks repeat what the message decoder enforces, so messages that
arrive from the wire never reach them; they guard callers that build chunks in
memory (a node's own code, another implementation linked in, a test).  Each test
here builds such a chunk with ``dataclasses.replace`` (which does not validate) and
checks the typed error, so that removing any one check makes a test fail.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cco.wire import payload
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import BroadcastData, ChunkMessage, PartialAggregate, Result
from cco.wire.modp import P
from cco.wire.packing import RANGE_BOUND
from cco.wire.registries import MAX_WORLD_SIZE, Collective, DType, ReduceOp

KEYS = payload.derive_group_keys(bytes(range(32)), bytes(16))
B = RANGE_BOUND


def header(
    op: ReduceOp = ReduceOp.SUM,
    dtype: DType = DType.INT64,
    kind: Collective = Collective.ALL_REDUCE,
    n: int = 3,
) -> payload.ChunkHeader:
    return payload.ChunkHeader(
        group_id=bytes(16),
        epoch=1,
        op_id=7,
        kind=kind,
        op=op,
        dtype=dtype,
        total_elements=n,
        chunk_elements=n,
        chunk_index=0,
        root=0 if kind in (Collective.REDUCE, Collective.BROADCAST) else None,
    )


def scaled_header(n: int = 3) -> payload.ChunkHeader:
    return dataclasses.replace(
        header(dtype=DType.FLOAT32, n=n), width=1, block_elements=16, scales=np.zeros(1, "<i2").tobytes()
    )


def part(rank: int, values: list[int], h: payload.ChunkHeader | None = None) -> ChunkMessage:
    return payload.seal(KEYS, h or header(), rank, np.array(values, dtype=np.int64))


def check(error: pytest.ExceptionInfo[CcoError], code: ErrorCode) -> None:
    assert error.value.code is code, error.value


# --- seal -------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [-1, MAX_WORLD_SIZE])
def test_seal_refuses_a_rank_out_of_range(rank: int) -> None:
    with pytest.raises(CcoError, match="out of range") as error:
        payload.seal(KEYS, header(), rank, np.zeros(3, np.int64))
    check(error, ErrorCode.INVALID_FIELD)


def test_only_the_root_seals_broadcast_data() -> None:
    with pytest.raises(CcoError, match="only the root 0") as error:
        payload.seal(KEYS, header(kind=Collective.BROADCAST), 1, np.zeros(3, np.int64), BroadcastData)
    check(error, ErrorCode.INVALID_FIELD)


@pytest.mark.parametrize("values", [np.zeros(3, np.int32), np.zeros(4, np.int64), np.zeros((3, 1), np.int64)])
def test_seal_refuses_values_of_another_type_or_length(values: np.ndarray) -> None:
    with pytest.raises(CcoError, match="int64 values") as error:
        payload.seal(KEYS, header(), 0, values)
    check(error, ErrorCode.INVALID_FIELD)


def test_seal_refuses_tagged_values_beyond_b_and_block_scaled_ones_beyond_the_width() -> None:
    with pytest.raises(CcoError, match=r"leaves \[-B, B\]") as error:
        part(0, [0, B + 1, 0])
    check(error, ErrorCode.OVERFLOW)
    assert part(0, [0, -B, B]).width == 8  # the bound itself is fine
    with pytest.raises(CcoError, match="does not fit 1 bytes") as error:
        part(0, [1, 128, 1, 1], scaled_header())
    check(error, ErrorCode.OVERFLOW)
    untagged = payload.seal(KEYS, header(op=ReduceOp.MAX), 0, np.array([2**62, 0, -(2**63)], np.int64))
    assert untagged.tag is None and untagged.width == 8  # MIN/MAX: any int64


# --- combine ----------------------------------------------------------------------


def test_combine_refuses_nothing() -> None:
    with pytest.raises(CcoError, match="nothing to combine") as error:
        payload.combine([], PartialAggregate)
    check(error, ErrorCode.INVALID_FIELD)


@pytest.mark.parametrize(
    ("change", "code", "text"),
    [
        ({"contributors": b""}, ErrorCode.INVALID_FIELD, "no contributors"),
        ({"tag": None}, ErrorCode.INVALID_FIELD, r"carry a tag in \[0, p\)"),
        ({"tag": P}, ErrorCode.INVALID_FIELD, r"carry a tag in \[0, p\)"),
        ({"tag": -1}, ErrorCode.INVALID_FIELD, r"carry a tag in \[0, p\)"),
        ({"width": 3}, ErrorCode.INVALID_FIELD, "width 3 is not one of"),
        ({"payload": b"\x01\x02"}, ErrorCode.INVALID_FIELD, "payload has 2 bytes, chunk needs 3"),
    ],
)
def test_combine_and_check_part_refuse_a_malformed_part(
    change: dict[str, object], code: ErrorCode, text: str
) -> None:
    good = part(0, [1, 2, 3])
    bad = dataclasses.replace(good, **change)  # type: ignore[arg-type]
    for attempt in (
        lambda: payload.combine([part(1, [1, 1, 1]), bad], PartialAggregate),
        lambda: payload.check_part(bad),
    ):
        with pytest.raises(CcoError, match=text) as error:
            attempt()
        check(error, code)


def test_untagged_parts_carry_no_tag() -> None:
    maximum = part(0, [1, 2, 3], header(op=ReduceOp.MAX))
    with pytest.raises(CcoError, match="carry no tag") as error:
        payload.combine(
            [dataclasses.replace(maximum, tag=5), part(1, [0, 0, 0], header(op=ReduceOp.MAX))], Result
        )
    check(error, ErrorCode.INVALID_FIELD)


def test_combine_refuses_an_8_byte_input_beyond_b() -> None:
    good = part(0, [0, 0, B])
    beyond = dataclasses.replace(good, payload=np.array([0, 0, B + 1], "<i8").tobytes())
    for attempt in (
        lambda: payload.combine([beyond, part(1, [0, 0, 0])], Result),
        lambda: payload.check_part(beyond),
    ):
        with pytest.raises(CcoError, match="an input value leaves") as error:
            attempt()
        check(error, ErrorCode.OVERFLOW)


def test_sums_beyond_b_are_overflow_however_many_parts() -> None:
    half = B // 2 + 1
    with pytest.raises(CcoError, match=r"the combination in \[.*\] leaves") as error:
        payload.combine([part(0, [half, 0, 0]), part(1, [half, 0, 0])], Result)  # two parts: the final check
    check(error, ErrorCode.OVERFLOW)
    with pytest.raises(CcoError, match=r"the combination leaves \[-B, B\]") as error:  # three: while folding
        payload.combine([part(r, [half, 0, 0]) for r in range(3)], Result)
    check(error, ErrorCode.OVERFLOW)
    with pytest.raises(CcoError, match="the combination leaves") as error:
        payload.combine([part(r, [-half, 0, 0]) for r in range(3)], Result)
    check(error, ErrorCode.OVERFLOW)
    third = B // 3
    assert payload.combine([part(r, [third, -third, 0]) for r in range(3)], Result).width == 8


def test_a_block_scaled_sum_must_fit_its_width() -> None:
    parts = [part(r, [100, 0, 0, 1], scaled_header()) for r in range(2)]
    with pytest.raises(CcoError, match="does not fit 1 bytes") as error:
        payload.combine(parts, Result)
    check(error, ErrorCode.OVERFLOW)


# --- open_verified -------------------------------------------------------------------


def result(values: list[int], h: payload.ChunkHeader | None = None) -> ChunkMessage:
    parts = [part(0, values, h), part(1, [0] * len(values), h)]
    return payload.combine(parts, Result)


@pytest.mark.parametrize(
    ("change", "code", "text"),
    [
        ({"tag": None}, ErrorCode.VERIFICATION_FAILED, "tag: missing"),
        ({"tag": P}, ErrorCode.VERIFICATION_FAILED, "tag: not an element of F_p"),
        ({"tag": -1}, ErrorCode.VERIFICATION_FAILED, "tag: not an element of F_p"),
        ({"width": 3}, ErrorCode.INVALID_FIELD, "width 3 is not one of"),
        ({"payload": b""}, ErrorCode.INVALID_FIELD, "payload has 0 bytes"),
    ],
)
def test_open_verified_refuses_a_malformed_result(
    change: dict[str, object], code: ErrorCode, text: str
) -> None:
    bad = dataclasses.replace(result([1, 2, 3]), **change)  # type: ignore[arg-type]
    with pytest.raises(CcoError, match=text) as error:
        payload.open_verified(KEYS, bad, frozenset({0, 1}))
    check(error, code)


def test_open_verified_checks_the_range_before_the_tag() -> None:
    good = result([0, 0, B])
    beyond = dataclasses.replace(good, payload=np.array([0, 0, B + 1], "<i8").tobytes())
    with pytest.raises(CcoError, match="range: integer 2") as error:
        payload.open_verified(KEYS, beyond, frozenset({0, 1}))
    check(error, ErrorCode.VERIFICATION_FAILED)


def test_untagged_results_carry_no_tag() -> None:
    maximum = result([1, 2, 3], header(op=ReduceOp.MAX))
    with pytest.raises(CcoError, match="carry no tag") as error:
        payload.open_verified(KEYS, dataclasses.replace(maximum, tag=1), frozenset({0, 1}))
    check(error, ErrorCode.INVALID_FIELD)


def test_consistency_needs_own_rank_and_own_length() -> None:
    maximum = result([1, 2, 3], header(op=ReduceOp.MAX))
    ranks = frozenset({0, 1})
    assert payload.open_verified(KEYS, maximum, ranks, (0, np.array([1, 2, 3]))).tolist() == [1, 2, 3]
    with pytest.raises(CcoError, match="own rank 2 is not a contributor") as error:
        payload.open_verified(KEYS, maximum, ranks, (2, np.array([1, 2, 3])))
    check(error, ErrorCode.VERIFICATION_FAILED)
    with pytest.raises(CcoError, match="own values do not have the chunk's length") as error:
        payload.open_verified(KEYS, maximum, ranks, (0, np.array([1, 2])))
    check(error, ErrorCode.INVALID_FIELD)
    with pytest.raises(CcoError, match="consistency: MAX below own value at element 1") as error:
        payload.open_verified(KEYS, maximum, ranks, (0, np.array([1, 5, 3])))
    check(error, ErrorCode.VERIFICATION_FAILED)


def test_every_block_needs_an_attestation_and_at_most_one_per_contributor() -> None:
    good = result([5, 0, 0, 1], scaled_header())
    assert payload.open_verified(KEYS, good, frozenset({0, 1})).tolist() == [5, 0, 0]
    for attested in (0, 3):
        values = [part(0, [5, 0, 0, attested], scaled_header()), part(1, [0, 0, 0, 0], scaled_header())]
        with pytest.raises(
            CcoError, match=f"attestation: block 0 has {attested} attestations for 2"
        ) as error:
            payload.open_verified(KEYS, payload.combine(values, Result), frozenset({0, 1}))
        check(error, ErrorCode.VERIFICATION_FAILED)


def test_the_bitmap_must_be_exactly_the_expected_ranks() -> None:
    with pytest.raises(CcoError, match=r"bitmap: unexpected ranks \[\], missing ranks \[2\]") as error:
        payload.open_verified(KEYS, result([1, 2, 3]), frozenset({0, 1, 2}))
    check(error, ErrorCode.VERIFICATION_FAILED)
    assert bitmap_from_ranks([0, 1]) == result([1, 2, 3]).contributors
