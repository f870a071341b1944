"""Vector provider for authenticated payloads: keys, tags, combining, failures, wire forms.

``vector_files()`` builds the payload vectors from fixed inputs (no clock, no
random state) with :mod:`cco.wire.payload`, then checks every vector with the
checks below before returning it.  The checks read only the JSON and recompute
each value from its definition in ``interop/payload.md`` with
:mod:`cco.interop.reference` (Python integers, exact rationals, ``struct``,
``hmac``, ``hashlib`` and AES from ``cryptography``), never with :mod:`cco.wire.mac`
or the codec, so a vector the definitions do not produce is never written.
Block-scaled floats have their own provider, :mod:`cco.interop.vectors_blockscale`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from cco.interop import reference as ref
from cco.interop.jsonform import from_hex, message_to_json
from cco.interop.vectors_blockscale import header_json
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.exact import limb_count
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import (
    ChunkMessage,
    PartialAggregate,
    Result,
    decode_message,
    encode_message,
)
from cco.wire.payload import (
    RANGE_BOUND,
    ChunkHeader,
    combine,
    decode_values,
    derive_group_keys,
    encode_values,
    open_verified,
    seal,
)
from cco.wire.registries import Collective, DType, ReduceOp

Vector = dict[str, Any]
Check = Callable[[list[Vector]], list[str]]

P = ref.P
SECRET = bytes(range(32))
GROUP_ID = bytes(range(0xA0, 0xB0))
NUMPY_TYPES: dict[DType, Any] = {
    DType.INT8: np.int8,
    DType.INT16: np.int16,
    DType.INT32: np.int32,
    DType.INT64: np.int64,
    DType.FLOAT16: np.float16,
    DType.BFLOAT16: np.float32,
    DType.FLOAT32: np.float32,
    DType.FLOAT64: np.float64,
}

ref_hkdf = ref.hkdf
ref_keys = ref.keys
ref_chunk_id = ref.chunk_id
ref_keystream = ref.keystream
ref_coefficients = ref.coefficients
ref_pad = ref.pad
ref_tag = ref.tag


def ref_payload(values: Sequence[int], width: int | None = None) -> tuple[int, bytes]:
    """(width, payload): little-endian two's complement at ``width``, or the smallest width."""
    w = width if width is not None else ref.smallest_width(values)
    return w, ref.pack(values, w)


# --- building blocks -----------------------------------------------------------------


def _header(
    *,
    kind: Collective = Collective.ALL_REDUCE,
    op: ReduceOp = ReduceOp.SUM,
    dtype: DType = DType.INT32,
    total: int = 4,
    chunk: int = 4,
    index: int = 0,
    epoch: int = 7,
    op_id: int = 42,
    root: int | None = None,
    group_id: bytes = GROUP_ID,
    width: int | None = None,
    block_elements: int | None = None,
    scales: Sequence[int] | None = None,
    members: Sequence[int] | None = None,
    quorum: int | None = None,
    wait_ms: int | None = None,
) -> ChunkHeader:
    return ChunkHeader(
        group_id=group_id,
        epoch=epoch,
        op_id=op_id,
        kind=kind,
        op=op,
        dtype=dtype,
        total_elements=total,
        chunk_elements=chunk,
        chunk_index=index,
        root=root,
        width=width,
        block_elements=block_elements,
        scales=None if scales is None else ref.pack(scales, 2),
        members=None if members is None else bitmap_from_ranks(members),
        quorum=quorum,
        wait_ms=wait_ms,
    )


_header_json = header_json


def _message_json(message: ChunkMessage) -> Vector:
    return {
        "message_name": message.TYPE.name,
        "contributors": sorted(ranks_from_bitmap(message.contributors)),
        "values": _values(message).tolist(),
        "fields": message_to_json(message),
        "encoded": encode_message(message).hex(),
    }


def _values(message: ChunkMessage) -> np.ndarray:
    return np.frombuffer(message.payload, dtype=f"<i{message.width}").astype(np.int64)


def _keys_vector(name: str, description: str, secret: bytes, group_id: bytes) -> Vector:
    prk, k1 = ref_hkdf(secret, group_id, b"cco/1 mac k1")
    _, k2 = ref_hkdf(secret, group_id, b"cco/1 mac k2")
    return {
        "name": name,
        "description": description,
        "group_secret": secret.hex(),
        "group_id": group_id.hex(),
        "prk": prk.hex(),
        "info_k1": b"cco/1 mac k1".hex(),
        "k1": k1.hex(),
        "info_k2": b"cco/1 mac k2".hex(),
        "k2": k2.hex(),
    }


def _tag_vector(name: str, description: str, header: ChunkHeader, rank: int, values: list[int]) -> Vector:
    keys = derive_group_keys(SECRET, header.group_id)
    sealed = seal(keys, header, rank, np.array(values, dtype=np.int64))
    k1, k2 = ref_keys(SECRET, header.group_id)
    chunk_id = header.chunk_id()
    key_m, stream = ref_keystream(k1, chunk_id, len(values))
    u = ref_coefficients(stream)
    inner = sum(a * (v % P) for a, v in zip(u, values, strict=True)) % P
    pad_hmac, pad = ref_pad(k2, chunk_id, rank)
    return {
        "name": name,
        "description": description,
        "group_secret": SECRET.hex(),
        "k1": k1.hex(),
        "k2": k2.hex(),
        "header": _header_json(header),
        "chunk_id": chunk_id.hex(),
        "rank": rank,
        "values": values,
        "width": sealed.width,
        "payload": sealed.payload.hex(),
        "key_m": key_m.hex(),
        "keystream": stream.hex(),
        "words": [int.from_bytes(stream[i : i + 8], "little") for i in range(0, len(stream), 8)],
        "coefficients": u,
        "values_mod_p": [v % P for v in values],
        "inner_product": inner,
        "pad_input": (chunk_id + rank.to_bytes(4, "big")).hex(),
        "pad_hmac": pad_hmac.hex(),
        "pad": pad,
        "tag": sealed.tag,
        "message": _message_json(sealed),
    }


def tag_vectors() -> list[Vector]:
    return [
        _tag_vector(
            "int32_sum_rank0",
            "An all-reduce SUM contribution of int32 values; width 2 is the smallest that holds them.",
            _header(),
            0,
            [1, -2, 300, -32768],
        ),
        _tag_vector(
            "int8_width1_rank5",
            "Width 1: every value fits a signed byte.  Rank 5 sets bit 5 of the bitmap.",
            _header(dtype=DType.INT8, total=6, chunk=6),
            5,
            [0, 1, -1, 127, -128, 64],
        ),
        _tag_vector(
            "int64_range_bound",
            "Width 8 with both ends of the range bound B = 2^60 - 1 (a group of one may send |x| = B).",
            _header(dtype=DType.INT64, total=3, chunk=3),
            0,
            [RANGE_BOUND, -RANGE_BOUND, 2**32 + 5],
        ),
        _tag_vector(
            "float32_block_scaled_last_chunk",
            "Block-scaled float32 (-1.0 and 1.5 at scale 20) in the shorter last chunk (index 2 of 3) "
            "of an 18-element operation, then rank 3's attestation 1 for the chunk's one block.  The "
            "width (4), block_elements (16) and scales (1400: int16 20) are in m, at its seventh place.",
            _header(dtype=DType.FLOAT32, total=18, chunk=8, index=2, width=4, block_elements=16, scales=[20]),
            3,
            [-(1 << 20), 3 << 19, 1],
        ),
        _tag_vector(
            "reduce_with_root",
            "REDUCE carries a root, which is part of the chunk id.",
            _header(kind=Collective.REDUCE, root=2, total=2, chunk=2),
            1,
            [10, -10],
        ),
        _tag_vector(
            "broadcast_float32_patterns",
            "BROADCAST from root 3: float32 1.0, -2.5, +inf and -0.0 as their bit patterns (int32).",
            _header(kind=Collective.BROADCAST, dtype=DType.FLOAT32, root=3, total=4, chunk=4),
            3,
            encode_values(
                np.array([1.0, -2.5, np.inf, -0.0], dtype=np.float32),
                DType.FLOAT32,
                Collective.BROADCAST,
                ReduceOp.SUM,
                4,
            ).tolist(),
        ),
        _tag_vector(
            "quorum_presence_pass",
            "The presence pass of a quorum all-reduce: one int8 1 from rank 2.  m appends null (no "
            "members) and [quorum, wait_ms] = [3, 250] after root.",
            _header(dtype=DType.INT8, total=1, chunk=4, quorum=3, wait_ms=250),
            2,
            [1],
        ),
        _tag_vector(
            "quorum_decided_members",
            "A chunk of an operation its presence pass decided: m appends members (0d: ranks 0, 2 "
            "and 3) and null after root.",
            _header(total=2, chunk=4, members=[0, 2, 3]),
            3,
            [5, -5],
        ),
        _tag_vector(
            "barrier_no_elements",
            "A BARRIER chunk has no elements: the inner product is 0 and the tag is the pad alone.",
            _header(kind=Collective.BARRIER, dtype=DType.INT8, total=0, chunk=1),
            9,
            [],
        ),
    ]


# --- combining ---------------------------------------------------------------------


def _combine_vector(
    name: str,
    description: str,
    header: ChunkHeader,
    inputs: dict[int, list[int]],
    groups: list[list[int]] | None = None,
) -> Vector:
    """Seal ``inputs`` (rank -> values); combine each of ``groups`` into a partial aggregate
    first (as an aggregator below the root would), then everything into a Result."""
    keys = derive_group_keys(SECRET, header.group_id)
    sealed = {r: seal(keys, header, r, np.array(v, dtype=np.int64)) for r, v in inputs.items()}
    grouped = groups or [[r] for r in inputs]
    parts = [
        sealed[g[0]] if len(g) == 1 else combine([sealed[r] for r in g], PartialAggregate) for g in grouped
    ]
    result = combine(parts, Result)
    ranks = sorted(inputs)
    values = open_verified(keys, result, frozenset(ranks)).tolist()
    k1, k2 = ref_keys(SECRET, header.group_id)
    chunk_id = header.chunk_id()
    vector: Vector = {
        "name": name,
        "description": description,
        "group_secret": SECRET.hex(),
        "header": _header_json(header),
        "chunk_id": chunk_id.hex(),
        "expected_ranks": ranks,
        "contributions": [_message_json(sealed[r]) for r in ranks],
        "parts": [_message_json(p) for p in parts],
        "result": _message_json(result),
    }
    if result.tag is not None:
        _, stream = ref_keystream(k1, chunk_id, len(values))
        u = ref_coefficients(stream)
        pads = [{"rank": r, "pad": ref_pad(k2, chunk_id, r)[1]} for r in ranks]
        inner = sum(a * (v % P) for a, v in zip(u, values, strict=True)) % P
        pad_sum = sum(p["pad"] for p in pads) % P
        vector["verification"] = {
            "coefficients": u,
            "inner_product": inner,
            "pads": pads,
            "pad_sum": pad_sum,
            "expected_tag": (inner + pad_sum) % P,
        }
    vector["verified_values"] = values
    return vector


def combine_vectors() -> list[Vector]:
    return [
        _combine_vector(
            "sum_four_ranks_two_levels",
            "SUM of four int32 contributions: ranks 0 and 1 are combined by one aggregator, 2 and 3 by "
            "another, and the two partial aggregates by the root.  Widths grow from 1 and 2 to 4.",
            _header(),
            {0: [1, 2, 3, 4], 1: [-1, 100, 0, 127], 2: [5, -32768, 7, 8], 3: [0, -32768, -70000, 1]},
            [[0, 1], [2, 3]],
        ),
        _combine_vector(
            "widening_int8",
            "Two int8 contributions whose sum needs 2 bytes: the aggregate widens.",
            _header(dtype=DType.INT8, total=3, chunk=3),
            {0: [127, -128, 1], 1: [127, -128, -1]},
        ),
        _combine_vector(
            "max_float32_ordered",
            "float32 MAX travels as ordered keys (form ORDERED), untagged, at the smallest width: -0.0 "
            "against +0.0, infinities, the smallest subnormals.  The integer maximum is the float one.",
            _header(op=ReduceOp.MAX, dtype=DType.FLOAT32, total=5, chunk=5),
            {
                r: encode_values(
                    np.array(x, dtype=np.float32), DType.FLOAT32, Collective.ALL_REDUCE, ReduceOp.MAX, 3
                ).tolist()
                for r, x in enumerate(
                    [
                        [-0.0, -np.inf, 1e-45, -1.0, 3.0],
                        [0.0, -3.4028235e38, -1e-45, -2.0, np.inf],
                        [-0.0, -np.inf, 0.0, -1.5, -np.inf],
                    ]
                )
            },
        ),
        _combine_vector(
            "min_float64_ordered",
            "float64 MIN as ordered 64-bit keys: -0.0 is below +0.0, -inf below everything.",
            _header(op=ReduceOp.MIN, dtype=DType.FLOAT64, total=3, chunk=3),
            {
                r: encode_values(
                    np.array(x, dtype=np.float64), DType.FLOAT64, Collective.ALL_REDUCE, ReduceOp.MIN, 2
                ).tolist()
                for r, x in enumerate([[0.0, 5e-324, 1e308], [-0.0, 1.0, -np.inf]])
            },
        ),
        _combine_vector(
            "max_int64_beyond_sum_bound",
            "INT64 MAX is untagged, so its integers are bounded by 64 bits only, not by floor(B / N): "
            "2^63 - 1, -2^63 and floor(B / 3) + 1 from 3 ranks are accepted.",
            _header(op=ReduceOp.MAX, dtype=DType.INT64, total=3, chunk=3),
            {
                0: [(1 << 63) - 1, -(1 << 63), RANGE_BOUND // 3 + 1],
                1: [0, -(1 << 63), -(RANGE_BOUND // 3 + 1)],
                2: [-1, -(1 << 62), 5],
            },
        ),
        _combine_vector(
            "max_untagged",
            "MAX carries no tag: aggregators take the elementwise maximum and the endpoint checks the "
            "bitmap, the range and consistency with its own contribution.",
            _header(op=ReduceOp.MAX, total=3, chunk=3),
            {0: [1, -5, 9], 1: [4, -7, 2], 2: [0, -6, 3]},
        ),
        _combine_vector(
            "barrier_three_ranks",
            "A BARRIER of ranks 0, 1 and 2: no elements, the tag is the sum of the three pads.",
            _header(kind=Collective.BARRIER, dtype=DType.INT8, total=0, chunk=1),
            {0: [], 1: [], 2: []},
        ),
        _combine_vector(
            "all_gather_float64_halves",
            "ALL_GATHER of one float64 per rank: each is two int32 halves (low, high) in its own slot "
            "of a zero-padded vector; the SUM is the concatenation.",
            _header(kind=Collective.ALL_GATHER, dtype=DType.FLOAT64, total=4, chunk=4),
            {
                0: [
                    *encode_values(
                        np.array([1.0]), DType.FLOAT64, Collective.ALL_GATHER, ReduceOp.SUM, 2
                    ).tolist(),
                    0,
                    0,
                ],
                1: [
                    0,
                    0,
                    *encode_values(
                        np.array([-3.75]), DType.FLOAT64, Collective.ALL_GATHER, ReduceOp.SUM, 2
                    ).tolist(),
                ],
            },
        ),
    ]


# --- negative vectors: the attacks ----------------------------------------------------


def _failure(
    name: str,
    description: str,
    mutation: str,
    *,
    stage: str,
    expected_ranks: Sequence[int],
    messages: Sequence[ChunkMessage],
    error: ErrorCode,
    check: str | None,
    base: ChunkMessage | None = None,
    own: tuple[int, list[int]] | None = None,
    extra: Vector | None = None,
) -> Vector:
    vector: Vector = {
        "name": name,
        "fail": True,
        "description": description,
        "mutation": mutation,
        "stage": stage,
        "group_secret": SECRET.hex(),
        "group_id": GROUP_ID.hex(),
        "expected_ranks": list(expected_ranks),
    }
    if base is not None:
        vector["base"] = encode_message(base).hex()
    key = "inputs" if stage == "combine" else "message"
    encoded = [encode_message(m).hex() for m in messages]
    vector[key] = encoded if stage == "combine" else encoded[0]
    if own is not None:
        vector["own_rank"], vector["own_values"] = own
    vector |= {"error_code": int(error), "error_name": error.name, "check": check}
    return vector | (extra or {})


def _with_values(message: ChunkMessage, values: list[int]) -> ChunkMessage:
    width, payload = ref_payload(values)
    return dataclasses.replace(message, width=width, payload=payload)


def failure_vectors() -> list[Vector]:
    keys = derive_group_keys(SECRET, GROUP_ID)
    world = range(4)
    inputs = {r: [r + 1, -(r + 2), 1000 * r, 7] for r in world}

    def contributions(header: ChunkHeader) -> list[ChunkMessage]:
        return [seal(keys, header, r, np.array(inputs[r], dtype=np.int64)) for r in world]

    header = _header()
    parts = contributions(header)
    honest = combine(parts, Result)
    values = _values(honest).tolist()
    assert honest.tag is not None and parts[2].tag is not None
    everyone = list(world)
    presence = _header(dtype=DType.INT8, total=1, chunk=4, quorum=3, wait_ms=250)

    def verify_failure(
        name: str, description: str, mutation: str, forged: ChunkMessage, check: str
    ) -> Vector:
        return _failure(
            name,
            description,
            mutation,
            stage="verify",
            expected_ranks=everyone,
            messages=[forged],
            error=ErrorCode.VERIFICATION_FAILED,
            check=check,
            base=honest,
        )

    changed = list(values)
    changed[1] += 1
    shifted = list(values)
    shifted[2] += P
    other_keys = derive_group_keys(bytes(32), GROUP_ID)
    second_chunk_header = _header(total=8, chunk=4, index=1)
    first_chunk = combine(contributions(_header(total=8, chunk=4, index=0)), Result)
    second_chunk = combine(
        [seal(keys, second_chunk_header, r, np.array(inputs[r], dtype=np.int64) * 3) for r in world], Result
    )
    replays = {
        "epoch": contributions(_header(epoch=6))[3],
        "operation": contributions(_header(op_id=41))[3],
        "group": seal(other_keys, _header(group_id=bytes(16)), 3, np.array(inputs[3], dtype=np.int64)),
    }
    vectors = [
        verify_failure(
            "element_changed",
            "One element of an honest result changed by one.",
            "values[1] += 1, re-encoded at the smallest width",
            _with_values(honest, changed),
            "tag",
        ),
        verify_failure(
            "contributor_dropped_bitmap_kept",
            "Rank 3's contribution left out of the sum (values and tag), its bit kept.",
            "combine ranks 0..2 only, then set contributors to {0,1,2,3}",
            dataclasses.replace(combine(parts[:3], Result), contributors=bitmap_from_ranks(everyone)),
            "tag",
        ),
        verify_failure(
            "contributor_dropped",
            "Rank 3 left out entirely: the bitmap shows it.",
            "combine ranks 0..2 only",
            combine(parts[:3], Result),
            "bitmap",
        ),
        _failure(
            "presence_short_of_quorum",
            "A presence pass's Result from ranks 0 and 1 only, where at_least 3 of ranks 0..3 "
            "must be there: a quorum lets ranks be missing, but not more than it allows.",
            "combine the presence passes of ranks 0 and 1 only",
            stage="verify",
            expected_ranks=everyone,
            messages=[combine([seal(keys, presence, r, np.ones(1, dtype=np.int64)) for r in (0, 1)], Result)],
            error=ErrorCode.VERIFICATION_FAILED,
            check="bitmap",
            extra={"at_least": 3},
        ),
        _failure(
            "identical_copy_refused_by_combine",
            "Combining refuses a byte-identical second copy of rank 2's contribution: overlapping "
            "contributor sets.  (An aggregator never combines a retransmission: it recognises a copy "
            "from the same child before combining; a copy that reaches combine counts rank 2 twice.)",
            "inputs are ranks 0..3 and rank 2 again",
            stage="combine",
            expected_ranks=everyone,
            messages=[*parts, parts[2]],
            error=ErrorCode.DUPLICATE_CONTRIBUTION,
            check=None,
        ),
        _failure(
            "overlapping_sets_refused_by_combine",
            "A partial aggregate of ranks 1 and 2 combined with rank 2's contribution: the sets overlap.",
            "inputs are combine(rank 1, rank 2), rank 0 and rank 2",
            stage="combine",
            expected_ranks=everyone,
            messages=[combine(parts[1:3], PartialAggregate), parts[0], parts[2]],
            error=ErrorCode.DUPLICATE_CONTRIBUTION,
            check=None,
        ),
        _failure(
            "mismatch_before_overlap_in_combine",
            "Rank 3's contribution to another epoch offered with ranks 0..3: the headers differ and "
            "rank 3 is in two chunks.  Combining checks the headers first: OPERATION_MISMATCH.",
            "inputs are ranks 0..3 and rank 3's chunk of epoch 6",
            stage="combine",
            expected_ranks=everyone,
            messages=[*parts, replays["epoch"]],
            error=ErrorCode.OPERATION_MISMATCH,
            check=None,
        ),
        _failure(
            "tag_missing_refused_by_combine",
            "Rank 1's SUM contribution without its tag: an aggregator refuses it with INVALID_FIELD "
            "(an endpoint, verifying, would say VERIFICATION_FAILED).",
            "remove the tag (key 14) of rank 1's contribution",
            stage="combine",
            expected_ranks=everyone,
            messages=[parts[0], dataclasses.replace(parts[1], tag=None)],
            error=ErrorCode.INVALID_FIELD,
            check=None,
        ),
        _failure(
            "overlap_before_missing_tag_in_combine",
            "Rank 0 twice, the second copy without its tag: the overlap is checked before the tags.",
            "inputs are rank 0, rank 0 without tag",
            stage="combine",
            expected_ranks=everyone,
            messages=[parts[0], dataclasses.replace(parts[0], tag=None)],
            error=ErrorCode.DUPLICATE_CONTRIBUTION,
            check=None,
        ),
        _failure(
            "result_not_at_smallest_width",
            "An honest result (integers fit 2 bytes) written at width 4: not the unique encoding.  "
            "The message decodes; the endpoint fails the operation with INVALID_FIELD.",
            "re-encode the honest result's integers at width 4",
            stage="verify",
            expected_ranks=everyone,
            messages=[dataclasses.replace(honest, width=4, payload=ref_payload(values, 4)[1])],
            error=ErrorCode.INVALID_FIELD,
            check=None,
            base=honest,
        ),
        verify_failure(
            "counted_twice",
            "Rank 2's values and tag added a second time, bitmap unchanged.",
            "values += x_2 and tag += t_2 (mod p)",
            dataclasses.replace(
                _with_values(honest, [v + x for v, x in zip(values, inputs[2], strict=True)]),
                tag=(honest.tag + parts[2].tag) % P,
            ),
            "tag",
        ),
    ]
    for what, replay in replays.items():
        vectors.append(
            _failure(
                f"replay_other_{what}_refused_by_aggregator",
                f"Rank 3's contribution to another {what} offered with ranks 0..2: the headers differ.",
                f"inputs are ranks 0..2 and rank 3's chunk of another {what}",
                stage="combine",
                expected_ranks=everyone,
                messages=[*parts[:3], replay],
                error=ErrorCode.OPERATION_MISMATCH,
                check=None,
            )
        )
        disguised = dataclasses.replace(replay, group_id=GROUP_ID, epoch=header.epoch, op_id=header.op_id)
        vectors.append(
            verify_failure(
                f"replay_other_{what}",
                f"Rank 3's contribution to another {what}, header rewritten to fit, summed with ranks 0..2.",
                "rewrite group_id, epoch and op_id of the replayed chunk, then combine",
                combine([*parts[:3], disguised], Result),
                "tag",
            )
        )
    vectors += [
        _failure(
            "chunks_swapped",
            "The result of chunk 1 delivered as chunk 0 (payload and tag moved, header of chunk 0).",
            "width, payload and tag of chunk 1's result in chunk 0's message",
            stage="verify",
            expected_ranks=everyone,
            base=first_chunk,
            error=ErrorCode.VERIFICATION_FAILED,
            check="tag",
            messages=[
                dataclasses.replace(
                    first_chunk, width=second_chunk.width, payload=second_chunk.payload, tag=second_chunk.tag
                )
            ],
        ),
        _failure(
            "chunks_swapped_index",
            "The result of chunk 1 relabelled as chunk 0.",
            "chunk_index 1 -> 0",
            stage="verify",
            expected_ranks=everyone,
            base=second_chunk,
            messages=[dataclasses.replace(second_chunk, chunk_index=0)],
            error=ErrorCode.VERIFICATION_FAILED,
            check="tag",
        ),
        verify_failure(
            "contributor_added",
            "Rank 3 never contributed; the aggregator invents a chunk for it (copying rank 0's values).",
            "combine ranks 0..2 with rank 0's chunk relabelled as rank 3",
            combine([*parts[:3], dataclasses.replace(parts[0], contributors=bitmap_from_ranks([3]))], Result),
            "tag",
        ),
        verify_failure(
            "contributor_added_outside_group",
            "A rank that is not expected (rank 9) appears in the bitmap.",
            "contributors |= {9}, tag unchanged",
            dataclasses.replace(honest, contributors=bitmap_from_ranks([*everyone, 9])),
            "bitmap",
        ),
        _failure(
            "value_shifted_by_p",
            "values[2] += p.  The tag still matches (u * p = 0 mod p): only the range check catches it.",
            "values[2] += 2^61 - 1, width 8",
            stage="verify",
            expected_ranks=everyone,
            base=honest,
            messages=[_with_values(honest, shifted)],
            error=ErrorCode.VERIFICATION_FAILED,
            check="range",
            extra={"tag_matches_without_range_check": True},
        ),
        verify_failure(
            "tag_guessed",
            "A tag changed in its lowest bit.",
            "tag ^= 1",
            dataclasses.replace(honest, tag=honest.tag ^ 1),
            "tag",
        ),
        verify_failure(
            "tag_missing",
            "The tag of a SUM result removed.",
            "tag absent",
            dataclasses.replace(honest, tag=None),
            "tag",
        ),
    ]
    max_header = _header(op=ReduceOp.MAX)
    max_parts = [seal(keys, max_header, r, np.array(inputs[r], dtype=np.int64)) for r in world]
    max_result = combine(max_parts, Result)
    lowered = [v - 1 for v in _values(max_result).tolist()]
    vectors.append(
        _failure(
            "max_below_own_value",
            "A MAX result lowered below rank 3's own values (MAX carries no tag).",
            "every value -= 1",
            stage="verify",
            expected_ranks=everyone,
            base=max_result,
            messages=[_with_values(max_result, lowered)],
            error=ErrorCode.VERIFICATION_FAILED,
            check="consistency",
            own=(3, inputs[3]),
        )
    )
    return vectors


# --- wire forms ------------------------------------------------------------------------


def _bits(x: np.ndarray) -> str:
    return np.ascontiguousarray(x).tobytes().hex()


FLOAT_DTYPES = frozenset({DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64})
REDUCE = Collective.ALL_REDUCE
_REDUCTIONS = frozenset({Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER})
FORMS = {"values": "VALUES", "patterns": "PATTERNS", "ordered": "ORDERED"}


def _form(kind: Collective, op: ReduceOp, dtype: DType, elements: int) -> str:
    """The form of an operation of ``elements`` elements, from the rules of
    interop/payload.md (block-scaled operations have vectors of their own)."""
    if kind in (Collective.BROADCAST, Collective.ALL_GATHER, Collective.BARRIER):
        return "PATTERNS"
    if dtype not in FLOAT_DTYPES:
        return "VALUES"
    if op not in (ReduceOp.SUM, ReduceOp.AVG):
        return "ORDERED"
    return "EXACT" if elements <= ref.EXACT_MAX_ELEMENTS else "BLOCK_SCALED"


def _elements(v: Vector) -> int:
    """The element count of a wire-form vector: its inputs, or its wire integers."""
    dtype = v["dtype"]
    if v["direction"] == "encode":
        return len(ref.elements(dtype, from_hex(v["input_bits"])))
    if dtype in ref.EXACT_FORMATS and v["op"] in (ref.SUM, ref.AVG) and v["kind"] in ref.REDUCTIONS:
        return len(v["wire"]) // ref.exact_limb_count(dtype)
    return len(v["wire"])


def _text(dtype: DType, x: np.ndarray) -> list[str]:
    return [repr(float(v)) if dtype in FLOAT_DTYPES else str(int(v)) for v in x]


def _encode_vector(
    name: str, description: str, dtype: DType, kind: Collective, op: ReduceOp, world: int, x: np.ndarray
) -> Vector:
    exact = _form(kind, op, dtype, len(x)) == "EXACT"
    vector: Vector = {
        "name": name,
        "description": description,
        "direction": "encode",
        "form": _form(kind, op, dtype, len(x)),
        "dtype": int(dtype),
        "kind": int(kind),
        "op": int(op),
        "world_size": world,
        "input_bits": _bits(x),
        "input_text": _text(dtype, x),
    }
    try:
        vector["wire"] = encode_values(x, dtype, kind, op, world, exact).tolist()
    except CcoError as error:
        vector |= {"fail": True, "error_code": int(error.code), "error_name": error.code.name}
    return vector


def _decode_vector(
    name: str,
    description: str,
    dtype: DType,
    kind: Collective,
    op: ReduceOp,
    count: int,
    wire: list[int],
) -> Vector:
    exact = dtype in FLOAT_DTYPES and op in (ReduceOp.SUM, ReduceOp.AVG) and kind in _REDUCTIONS
    elements = len(wire) // limb_count(dtype) if exact else len(wire)
    vector: Vector = {
        "name": name,
        "description": description,
        "direction": "decode",
        "form": _form(kind, op, dtype, elements),
        "dtype": int(dtype),
        "kind": int(kind),
        "op": int(op),
        "contributor_count": count,
        "wire": wire,
    }
    try:
        out = decode_values(np.array(wire, dtype=np.int64), dtype, kind, op, count, exact)
    except CcoError as error:
        return vector | {"fail": True, "error_code": int(error.code), "error_name": error.code.name}
    return vector | {"output_bits": _bits(out), "output_text": _text(dtype, out)}


ORDER_F32 = [-np.inf, -3.4028235e38, -1.0, -1e-45, -0.0, 0.0, 1e-45, 1.1754944e-38, 1.0, 3.4028235e38, np.inf]


def wire_form_vectors() -> list[Vector]:
    e, d = _encode_vector, _decode_vector
    max_, min_, sum_, avg = ReduceOp.MAX, ReduceOp.MIN, ReduceOp.SUM, ReduceOp.AVG
    bound3 = RANGE_BOUND // 3
    return [
        e(
            "int32_sum_values",
            "VALUES: integers in a SUM are themselves.",
            DType.INT32,
            REDUCE,
            sum_,
            4,
            np.array([0, -1, 2**31 - 1, -(2**31)], dtype=np.int32),
        ),
        e(
            "int64_sum_at_contribution_bound",
            "floor(B / 3) from one of 3 ranks: the largest tagged value.",
            DType.INT64,
            REDUCE,
            sum_,
            3,
            np.array([bound3, -bound3], dtype=np.int64),
        ),
        e(
            "int64_sum_beyond_contribution_bound",
            "floor(B / 3) + 1 in a tagged SUM of 3 ranks: OVERFLOW.",
            DType.INT64,
            REDUCE,
            sum_,
            3,
            np.array([bound3 + 1], dtype=np.int64),
        ),
        e(
            "int64_max_beyond_contribution_bound",
            "Untagged ops have no range bound: INT64 MAX carries any int64, floor(B / 3) + 1 and both ends "
            "included.",
            DType.INT64,
            REDUCE,
            max_,
            3,
            np.array([bound3 + 1, 2**63 - 1, -(2**63)], dtype=np.int64),
        ),
        e(
            "int64_bxor_any",
            "BXOR, untagged, carries any int64.",
            DType.INT64,
            REDUCE,
            ReduceOp.BXOR,
            3,
            np.array([-1, 2**62 + 5], dtype=np.int64),
        ),
        e(
            "float32_max_ordered",
            "ORDERED: float32 keys, from -inf through the negative subnormal, -0.0, +0.0, the smallest "
            "subnormal and normal, to +inf; the keys increase as the floats do.",
            DType.FLOAT32,
            REDUCE,
            max_,
            4,
            np.array(ORDER_F32, dtype=np.float32),
        ),
        e(
            "float16_min_ordered",
            "float16 MIN keys: the largest finite values, subnormals and signed zeros.",
            DType.FLOAT16,
            REDUCE,
            min_,
            2,
            np.array(
                [65504.0, -65504.0, 5.960464477539063e-08, -5.960464477539063e-08, -0.0, 0.0, -np.inf],
                dtype=np.float16,
            ),
        ),
        e(
            "bfloat16_max_ordered",
            "bfloat16 keys of float32 values rounded to bfloat16 first.",
            DType.BFLOAT16,
            REDUCE,
            max_,
            2,
            np.array([1.00390625, -1.01171875, -0.0, np.inf], dtype=np.float32),
        ),
        e(
            "float64_min_ordered",
            "float64 keys: 64-bit patterns, beyond B (no bound untagged).",
            DType.FLOAT64,
            REDUCE,
            min_,
            2,
            np.array([-np.inf, -5e-324, -0.0, 0.0, 1e308], dtype=np.float64),
        ),
        e(
            "float32_max_nan_refused",
            "NaN has no order: OVERFLOW.",
            DType.FLOAT32,
            REDUCE,
            max_,
            2,
            np.array([1.0, np.nan], dtype=np.float32),
        ),
        e(
            "float64_min_nan_refused",
            "A negative NaN is refused too.",
            DType.FLOAT64,
            REDUCE,
            min_,
            2,
            np.array([-np.nan], dtype=np.float64),
        ),
        e(
            "float64_bit_exact_halves",
            "PATTERNS: a BROADCAST float64 is two int32 halves, low, high.",
            DType.FLOAT64,
            Collective.BROADCAST,
            sum_,
            2,
            np.array([1.0, -0.0, np.nan], dtype=np.float64),
        ),
        e(
            "int64_bit_exact_halves",
            "ALL_GATHER carries any int64, even beyond B, as two int32 halves.",
            DType.INT64,
            Collective.ALL_GATHER,
            sum_,
            2,
            np.array([-1, 2**63 - 1], dtype=np.int64),
        ),
        e(
            "bfloat16_bit_exact",
            "BROADCAST carries bfloat16 bit patterns as int16: a quiet NaN with payload (7fc1), -inf, "
            "-0.0 and 1.5.  The inputs are given as float32 values whose low 16 bits are zero, so the "
            "bfloat16 pattern is exactly their upper half and no rounding happens.",
            DType.BFLOAT16,
            Collective.BROADCAST,
            sum_,
            2,
            np.array([0x7FC10000, 0xFF800000, 0x80000000, 0x3FC00000], dtype=np.uint32).view(np.float32),
        ),
        e(
            "float16_bit_exact",
            "BROADCAST carries float16 bit patterns as int16, NaN and -inf included.",
            DType.FLOAT16,
            Collective.BROADCAST,
            sum_,
            2,
            np.array([np.nan, -np.inf, -2.0], dtype=np.float16),
        ),
        d(
            "float32_max_ordered_decode",
            "Ordered keys back to float32: -inf, -0.0, +0.0, the smallest subnormal, +inf.",
            DType.FLOAT32,
            REDUCE,
            max_,
            3,
            [-2139095041, -1, 0, 1, 2139095040],
        ),
        d(
            "float64_min_ordered_decode",
            "Ordered keys back to float64.",
            DType.FLOAT64,
            REDUCE,
            min_,
            2,
            [-9218868437227405313, -1, 1, 4607182418800017408],
        ),
        d(
            "float16_ordered_key_too_wide",
            "A float16 key must fit 16 bits: 40000 does not (OVERFLOW).",
            DType.FLOAT16,
            REDUCE,
            max_,
            2,
            [40000],
        ),
        d(
            "int32_avg_ties_to_even",
            "Integer AVG rounds the exact quotient half to even: 10/4, 30/4, -10/4.",
            DType.INT32,
            REDUCE,
            avg,
            4,
            [10, 30, -10, 7],
        ),
        d("int8_sum_overflows", "An int8 sum of 200 does not fit int8.", DType.INT8, REDUCE, sum_, 2, [200]),
        d(
            "int64_max_decode",
            "INT64 MAX results are the values, whatever their size.",
            DType.INT64,
            REDUCE,
            max_,
            3,
            [2**63 - 1, -(2**63)],
        ),
        *exact_vectors(),
    ]


def _limbs(dtype: DType, values: list[float]) -> list[int]:
    """The EXACT wire integers of ``values`` (a contribution, or a sum of them)."""
    x = np.array(values, dtype=NUMPY_TYPES[dtype])
    return [int(y) for y in encode_values(x, dtype, REDUCE, ReduceOp.SUM, 4, exact=True)]


def _added(*wires: list[int]) -> list[int]:
    return [sum(column) for column in zip(*wires, strict=True)]


def exact_vectors() -> list[Vector]:
    """EXACT: float sums of at most 16 elements as limbs, and their rounding."""
    e, d = _encode_vector, _decode_vector
    sum_, avg, f16, bf16, f32, f64 = (
        ReduceOp.SUM,
        ReduceOp.AVG,
        DType.FLOAT16,
        DType.BFLOAT16,
        DType.FLOAT32,
        DType.FLOAT64,
    )
    tie = _added(_limbs(f32, [1.0, 3.0, 1.0 + 2.0**-23]), _limbs(f32, [2.0**-24, 2.0**-23, 2.0**-24]))
    return [
        e(
            "float32_sum_exact_limbs",
            "EXACT: 1, -2.5, the smallest subnormal, the largest finite value and -0 as nine "
            "base-2^32 digits each of x * 2^149, least significant first, signed like x.",
            f32,
            REDUCE,
            sum_,
            4,
            np.array([1.0, -2.5, 2.0**-149, np.finfo(np.float32).max, -0.0], dtype=np.float32),
        ),
        e(
            "float16_avg_exact_limbs",
            "EXACT: binary16 in two limbs of x * 2^24 (65504 = 2^15 * 1.999).",
            f16,
            REDUCE,
            avg,
            4,
            np.array([65504.0, -(2.0**-24), 1.5], dtype=np.float16),
        ),
        e(
            "bfloat16_sum_exact_limbs_rounded_first",
            "EXACT: a bfloat16 element given as float32 is rounded to bfloat16 first: "
            "1 + 2^-9 becomes 1 (a tie to even), 1 + 3 * 2^-9 becomes 1 + 2^-7.",
            bf16,
            REDUCE,
            sum_,
            4,
            np.array([1.0 + 2.0**-9, 1.0 + 3 * 2.0**-9], dtype=np.float32),
        ),
        e(
            "float64_sum_exact_limbs",
            "EXACT: binary64 in 66 limbs of x * 2^1074.",
            f64,
            Collective.REDUCE_SCATTER,
            sum_,
            4,
            np.array([5e-324, -1.0], dtype=np.float64),
        ),
        e(
            "float32_sum_exact_nan",
            "EXACT: NaN cannot be carried: OVERFLOW.",
            f32,
            REDUCE,
            sum_,
            4,
            np.array([1.0, np.nan], dtype=np.float32),
        ),
        d(
            "float32_sum_exact_ties_to_even",
            "EXACT decode: 1 + 2^-24 and 3 + 2^-23 are ties that go down to the even 1 and 3, "
            "(1 + 2^-23) + 2^-24 one that goes up to the even 1 + 2^-22.",
            f32,
            REDUCE,
            sum_,
            2,
            tie,
        ),
        d(
            "float32_avg_exact_rounds_once",
            "EXACT decode: (1 + 0 + 0) / 3 is rounded once from the exact quotient.",
            f32,
            REDUCE,
            avg,
            3,
            _limbs(f32, [1.0]),
        ),
        d(
            "float32_sum_exact_cancellation",
            "EXACT decode: 2^100 + 2^-100 - 2^100 is exactly 2^-100 (binary32 additions give 0 "
            "or 2^-100 by order).",
            f32,
            REDUCE,
            sum_,
            3,
            _added(_limbs(f32, [2.0**100]), _limbs(f32, [2.0**-100]), _limbs(f32, [-(2.0**100)])),
        ),
        d(
            "float32_sum_exact_zero_is_positive",
            "EXACT decode: -0.0 + -0.0 and 1.5 - 1.5 are exact zeros: +0.0.",
            f32,
            REDUCE,
            sum_,
            2,
            _added(_limbs(f32, [-0.0, 1.5]), _limbs(f32, [-0.0, -1.5])),
        ),
        d(
            "float16_sum_exact_subnormal",
            "EXACT decode: 3 * 2^-24 / 2 (AVG of 2) is a tie between the subnormals 2^-24 "
            "and 2^-23; it goes to the even 2^-23.",
            f16,
            REDUCE,
            avg,
            2,
            _limbs(f16, [3 * 2.0**-24]),
        ),
        d(
            "bfloat16_sum_exact_rounds_to_bfloat16",
            "EXACT decode: 1 + 2^-8 is a bfloat16 tie between 1 and 1 + 2^-7: it goes to 1.",
            bf16,
            REDUCE,
            sum_,
            2,
            _added(_limbs(bf16, [1.0]), _limbs(bf16, [2.0**-8])),
        ),
        d(
            "float32_sum_exact_overflows",
            "EXACT decode: twice the largest binary32 does not fit: OVERFLOW.",
            f32,
            REDUCE,
            sum_,
            2,
            _added(*[_limbs(f32, [float(np.finfo(np.float32).max)])] * 2),
        ),
    ]


# --- checks: the rules of interop/payload.md as code ------------------------------------


def _name(vector: Vector) -> str:
    return str(vector.get("name", "<unnamed>"))


def _run(vectors: list[Vector], check: Callable[[Vector], list[str]]) -> list[str]:
    problems = []
    names = [_name(v) for v in vectors]
    problems += [f"{n}: name is not unique" for n in sorted({n for n in names if names.count(n) > 1})]
    for vector in vectors:
        try:
            found = check(vector)
        except (KeyError, TypeError, ValueError, CcoError) as exc:
            found = [f"malformed or failing: {exc!r}"]
        problems += [f"{_name(vector)}: {p}" for p in found]
    return problems


def _check_keys(v: Vector) -> list[str]:
    secret, group_id = from_hex(v["group_secret"]), from_hex(v["group_id"])
    prk, k1 = ref_hkdf(secret, group_id, from_hex(v["info_k1"]))
    _, k2 = ref_hkdf(secret, group_id, from_hex(v["info_k2"]))
    want = {"prk": prk.hex(), "k1": k1.hex(), "k2": k2.hex(), "info_k1": b"cco/1 mac k1".hex()}
    want["info_k2"] = b"cco/1 mac k2".hex()
    return [f"{k} differs" for k, value in want.items() if v[k] != value]


def _check_message(part: Vector, header: Vector) -> list[str]:
    message = decode_message(from_hex(part["encoded"]))
    problems = []
    if not isinstance(message, ChunkMessage) or message.TYPE.name != part["message_name"]:
        return [f"{part['message_name']} does not decode as that chunk message"]
    if message_to_json(message) != part["fields"]:
        problems.append("fields differ from the decoded message")
    if ref_payload(part["values"], header.get("width")) != (message.width, message.payload):
        problems.append("payload is not the values at the smallest (or the block-scaled) width")
    if sorted(ranks_from_bitmap(message.contributors)) != part["contributors"]:
        problems.append("contributors differ from the bitmap")
    for name, value in header.items():
        got = getattr(message, name)
        if (got.hex() if isinstance(got, bytes) else got) != value:
            problems.append(f"header field {name} differs")
    return problems


def _check_tag(v: Vector) -> list[str]:
    k1, k2 = ref_keys(from_hex(v["group_secret"]), from_hex(v["header"]["group_id"]))
    chunk_id = ref_chunk_id(v["header"])
    key_m, stream = ref_keystream(k1, chunk_id, len(v["values"]))
    u = ref_coefficients(stream)
    inner = sum(a * (x % P) for a, x in zip(u, v["values"], strict=True)) % P
    pad_hmac, pad = ref_pad(k2, chunk_id, v["rank"])
    width, payload = ref_payload(v["values"], v["header"].get("width"))
    want = {
        "k1": k1.hex(),
        "k2": k2.hex(),
        "chunk_id": chunk_id.hex(),
        "width": width,
        "payload": payload.hex(),
        "key_m": key_m.hex(),
        "keystream": stream.hex(),
        "words": [int.from_bytes(stream[i : i + 8], "little") for i in range(0, len(stream), 8)],
        "coefficients": u,
        "values_mod_p": [x % P for x in v["values"]],
        "inner_product": inner,
        "pad_input": (chunk_id + v["rank"].to_bytes(4, "big")).hex(),
        "pad_hmac": pad_hmac.hex(),
        "pad": pad,
        "tag": (inner + pad) % P,
    }
    problems = [f"{k} differs" for k, value in want.items() if v[k] != value]
    problems += _check_message(v["message"], v["header"])
    if v["message"]["values"] != v["values"] or v["message"]["contributors"] != [v["rank"]]:
        problems.append("message does not carry the values of the rank")
    if v["message"]["fields"].get("tag") != v["tag"]:
        problems.append("message does not carry the tag")
    return problems


def _check_combine(v: Vector) -> list[str]:
    header, ranks = v["header"], v["expected_ranks"]
    problems: list[str] = []
    for part in [*v["contributions"], *v["parts"], v["result"]]:
        problems += _check_message(part, header)
    columns = zip(*(c["values"] for c in v["contributions"]), strict=True)
    op = ReduceOp(header["op"])
    fold: Callable[[Sequence[int]], int] = {ReduceOp.MAX: max, ReduceOp.MIN: min}.get(op, sum)
    if (
        v["result"]["values"] != [fold(list(c)) for c in columns]
        or v["verified_values"] != v["result"]["values"]
    ):
        problems.append("result values are not the combination of the contributions")
    if v["result"]["contributors"] != ranks:
        problems.append("result contributors are not the expected ranks")
    tag = v["result"]["fields"].get("tag")
    if "verification" in v:
        k1, k2 = ref_keys(from_hex(v["group_secret"]), from_hex(header["group_id"]))
        expected = ref_tag(k1, k2, ref_chunk_id(header), ranks, v["result"]["values"])
        if tag != expected or v["verification"]["expected_tag"] != expected:
            problems.append("result tag is not <u, y> + sum of pads")
        if sum(c["fields"]["tag"] for c in v["contributions"]) % P != tag:
            problems.append("result tag is not the sum of the contribution tags")
    elif tag is not None:
        problems.append("an untagged op's result carries a tag")
    return problems


def _check_failure(v: Vector) -> list[str]:
    keys = derive_group_keys(from_hex(v["group_secret"]), from_hex(v["group_id"]))
    expected = frozenset(v["expected_ranks"])
    own = (v["own_rank"], np.array(v["own_values"], dtype=np.int64)) if "own_rank" in v else None
    at_least = v.get("at_least")
    try:
        if v["stage"] == "combine":
            inputs = [decode_message(from_hex(m)) for m in v["inputs"]]
            combine([m for m in inputs if isinstance(m, ChunkMessage)], Result)
        else:
            message = decode_message(from_hex(v["message"]))
            if not isinstance(message, ChunkMessage):
                return ["message is not a chunk message"]
            open_verified(keys, message, expected, own, at_least)
    except CcoError as error:
        problems = []
        if int(error.code) != v["error_code"] or error.code.name != v["error_name"]:
            problems.append(f"failed with {error.code.name}, not {v['error_name']}")
        if v["check"] is not None and not error.detail.startswith(v["check"]):
            problems.append(f"failed the {error.detail.split(':')[0]} check, not {v['check']}")
        return problems
    return ["was accepted"]


def _check_wire_form(v: Vector) -> list[str]:
    """The implementation's codec gives the vector's output (or refusal)."""
    dtype, kind, op = DType(v["dtype"]), Collective(v["kind"]), ReduceOp(v["op"])
    exact = v["form"] == "EXACT"
    try:
        if v["direction"] == "encode":
            x = np.frombuffer(from_hex(v["input_bits"]), dtype=NUMPY_TYPES[dtype])
            got: Vector = {"wire": encode_values(x, dtype, kind, op, v["world_size"], exact).tolist()}
        else:
            wire = np.array(v["wire"], dtype=np.int64)
            out = decode_values(wire, dtype, kind, op, v["contributor_count"], exact)
            got = {"output_bits": _bits(out)}
    except CcoError as error:
        got = {"fail": True, "error_code": int(error.code)}
    return [f"{k} differs" for k, value in got.items() if v.get(k) != value]


def _reference_wire(v: Vector) -> Vector:
    """The vector's outcome from the definitions of interop/payload.md alone."""
    dtype, form, op = v["dtype"], v["form"], v["op"]
    if v["direction"] == "encode":
        x = ref.elements(dtype, from_hex(v["input_bits"]))
        if form == "EXACT":
            if any(math.isnan(a) or math.isinf(a) for a in x):
                return {"fail": True, "error_code": int(ErrorCode.OVERFLOW)}
            return {"wire": [limb for a in x for limb in ref.exact_limbs(dtype, a)]}
        if form == "ORDERED":
            if any(math.isnan(a) for a in x):
                return {"fail": True, "error_code": int(ErrorCode.OVERFLOW)}
            return {"wire": [ref.ordered_key(dtype, a) for a in x]}
        if form == "PATTERNS":
            if dtype in ref.INTEGERS:
                bits = ref.INTEGERS[dtype]
                patterns = [a % (1 << bits) for a in ref.integers(dtype, from_hex(v["input_bits"]))]
            else:
                bits = ref.FLOATS[dtype][0]
                patterns = [ref.pattern(dtype, a) % (1 << bits) for a in x]
            if bits < 64:
                return {"wire": [p - (1 << bits) if p >> (bits - 1) else p for p in patterns]}
            halves = [h for p in patterns for h in (p & 0xFFFFFFFF, p >> 32)]
            return {"wire": [h - (1 << 32) if h >> 31 else h for h in halves]}
        tagged = op in (ref.SUM, ref.AVG)
        if tagged and any(abs(a) > ref.B // v["world_size"] for a in x):
            return {"fail": True, "error_code": int(ErrorCode.OVERFLOW)}
        return {"wire": list(x)}
    wire, count = v["wire"], v["contributor_count"]
    if form == "EXACT":
        size = ref.exact_limb_count(dtype)
        divisor = count if op == ref.AVG else 1
        decoded = [ref.exact_decode(dtype, wire[j : j + size], divisor) for j in range(0, len(wire), size)]
        if any(d is None for d in decoded):
            return {"fail": True, "error_code": int(ErrorCode.OVERFLOW)}
        return {"output_bits": b"".join(d for d in decoded if d is not None).hex()}
    if form == "ORDERED":
        bits = ref.FLOATS[dtype][0]
        if any(not -(1 << (bits - 1)) <= k < 1 << (bits - 1) for k in wire):
            return {"fail": True, "error_code": int(ErrorCode.OVERFLOW)}
        return {"output_bits": b"".join(ref.from_ordered_key(dtype, k) for k in wire).hex()}
    bits = ref.INTEGERS[dtype]
    out = [round(Fraction(y, count)) if op == ref.AVG else y for y in wire]
    if any(not -(1 << (bits - 1)) <= y < 1 << (bits - 1) for y in out):
        return {"fail": True, "error_code": int(ErrorCode.OVERFLOW)}
    return {"output_bits": ref.pack(out, bits // 8).hex()}


def _check_wire_form_reference(v: Vector) -> list[str]:
    want = _reference_wire(v)
    problems = [f"{k} is not what the definitions give" for k, value in want.items() if v.get(k) != value]
    if v["form"] != _form(Collective(v["kind"]), ReduceOp(v["op"]), DType(v["dtype"]), _elements(v)):
        problems.append("form is not the one of kind, op and dtype")
    if (
        "input_text" in v
        and v["input_text"]
        != [
            repr(float(a)) if v["dtype"] in ref.FLOATS else str(a)
            for a in ref.elements(v["dtype"], from_hex(v["input_bits"]))
        ]
        and v["dtype"] != int(DType.BFLOAT16)
    ):
        problems.append("input_text differs from input_bits")
    return problems


VECTOR_CHECKS: dict[str, Check] = {
    "payload_keys.json": lambda vs: _run(vs, _check_keys),
    "payload_tags.json": lambda vs: _run(vs, _check_tag),
    "payload_combine.json": lambda vs: _run(vs, _check_combine),
    "payload_verify_failures.json": lambda vs: _run(vs, _check_failure),
    "wire_forms.json": lambda vs: _run(vs, lambda v: _check_wire_form(v) + _check_wire_form_reference(v)),
}
"""File name -> check of every vector in it (an empty list when all hold)."""


def vector_files() -> dict[str, list[Vector]]:
    """File name -> array of vector objects, each checked before it is returned."""
    files = {
        "payload_keys.json": [
            _keys_vector("keys_counting", "group_secret 00..1f, group_id a0..af.", SECRET, GROUP_ID),
            _keys_vector("keys_zero", "All-zero secret and group id.", bytes(32), bytes(16)),
            _keys_vector(
                "keys_ff", "All-ones secret, group id 0f..00.", b"\xff" * 32, bytes(range(15, -1, -1))
            ),
        ],
        "payload_tags.json": tag_vectors(),
        "payload_combine.json": combine_vectors(),
        "payload_verify_failures.json": failure_vectors(),
        "wire_forms.json": wire_form_vectors(),
    }
    for file_name, vectors in files.items():
        problems = VECTOR_CHECKS[file_name](vectors)
        if problems:
            raise AssertionError(f"{file_name}: generated vectors do not hold:\n" + "\n".join(problems))
        for vector in vectors:
            vector["spec_section"] = (
                "ordered-form" if vector.get("form") == "ORDERED" else SPEC_SECTIONS[file_name]
            )
    return files


SPEC_SECTIONS = {
    "payload_keys.json": "mac-construction",
    "payload_tags.json": "mac-construction",
    "payload_combine.json": "payload-linearity",
    "payload_verify_failures.json": "mac-security",
    "wire_forms.json": "payload-elements",
}
"""The draft anchor each payload vector file exercises."""
