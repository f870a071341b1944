"""Vector provider for authenticated payloads: keys, tags, combining, failures, fixed point.

``vector_files()`` builds the payload vectors from fixed inputs (no clock, no
random state) with :mod:`cco.wire.payload`, then checks every vector with the
checks below before returning it.  The checks read only the JSON and recompute
each value from its definition in ``interop/payload.md`` with Python integers,
``hmac``, ``hashlib`` and AES from ``cryptography``, never with :mod:`cco.wire.mac`,
so a vector the definitions do not produce is never written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from cco.interop.jsonform import from_hex, message_to_json
from cco.wire import cbor
from cco.wire.errors import CcoError, ErrorCode
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
    default_scale,
    derive_group_keys,
    encode_values,
    open_verified,
    seal,
)
from cco.wire.registries import Collective, DType, ReduceOp

Vector = dict[str, Any]
Check = Callable[[list[Vector]], list[str]]

P = (1 << 61) - 1
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


# --- the definitions, from first principles (used by the checks) ------------------


def ref_hkdf(secret: bytes, group_id: bytes, info: bytes) -> tuple[bytes, bytes]:
    """(PRK, OKM) of HKDF-SHA256 with L = 32 (RFC 5869)."""
    prk = hmac.new(group_id, secret, hashlib.sha256).digest()
    return prk, hmac.new(prk, info + b"\x01", hashlib.sha256).digest()


def ref_keys(secret: bytes, group_id: bytes) -> tuple[bytes, bytes]:
    return ref_hkdf(secret, group_id, b"cco/1 mac k1")[1], ref_hkdf(secret, group_id, b"cco/1 mac k2")[1]


def ref_chunk_id(header: Vector) -> bytes:
    fields = [
        "group_id",
        "epoch",
        "op_id",
        "kind",
        "op",
        "dtype",
        "scale",
        "total_elements",
        "chunk_elements",
        "chunk_index",
    ]
    items: list[Any] = [from_hex(header[f]) if f == "group_id" else header[f] for f in fields]
    return cbor.encode([*items, header.get("root")])


def ref_keystream(k1: bytes, chunk_id: bytes, n: int) -> tuple[bytes, bytes]:
    """(key_m, the first 8n keystream bytes)."""
    key_m = hmac.new(k1, chunk_id, hashlib.sha256).digest()
    encryptor = Cipher(algorithms.AES(key_m), modes.CTR(bytes(16))).encryptor()
    return key_m, encryptor.update(bytes(8 * n))


def ref_coefficients(stream: bytes) -> list[int]:
    words = [int.from_bytes(stream[i : i + 8], "little") for i in range(0, len(stream), 8)]
    return [(w % 2**61) % P for w in words]


def ref_pad(k2: bytes, chunk_id: bytes, rank: int) -> tuple[bytes, int]:
    digest = hmac.new(k2, chunk_id + rank.to_bytes(4, "big"), hashlib.sha256).digest()
    return digest, (int.from_bytes(digest[:8], "little") % 2**61) % P


def ref_tag(k1: bytes, k2: bytes, chunk_id: bytes, ranks: Sequence[int], values: Sequence[int]) -> int:
    _, stream = ref_keystream(k1, chunk_id, len(values))
    u = ref_coefficients(stream)
    inner = sum(a * (v % P) for a, v in zip(u, values, strict=True))
    return (inner + sum(ref_pad(k2, chunk_id, r)[1] for r in ranks)) % P


def ref_payload(values: Sequence[int]) -> tuple[int, bytes]:
    """(width, payload): little-endian two's complement at the smallest width."""
    lo, hi = (min(values), max(values)) if values else (0, 0)
    width = next(w for w in (1, 2, 4, 8) if -(1 << (8 * w - 1)) <= lo and hi < 1 << (8 * w - 1))
    return width, b"".join(v.to_bytes(width, "little", signed=True) for v in values)


# --- building blocks -----------------------------------------------------------------


def _header(
    *,
    kind: Collective = Collective.ALL_REDUCE,
    op: ReduceOp = ReduceOp.SUM,
    dtype: DType = DType.INT32,
    scale: int = 0,
    total: int = 4,
    chunk: int = 4,
    index: int = 0,
    epoch: int = 7,
    op_id: int = 42,
    root: int | None = None,
    group_id: bytes = GROUP_ID,
) -> ChunkHeader:
    return ChunkHeader(
        group_id=group_id,
        epoch=epoch,
        op_id=op_id,
        kind=kind,
        op=op,
        dtype=dtype,
        scale=scale,
        total_elements=total,
        chunk_elements=chunk,
        chunk_index=index,
        root=root,
    )


def _header_json(header: ChunkHeader) -> Vector:
    out: Vector = {
        "group_id": header.group_id.hex(),
        "epoch": header.epoch,
        "op_id": header.op_id,
        "kind": int(header.kind),
        "op": int(header.op),
        "dtype": int(header.dtype),
        "scale": header.scale,
        "total_elements": header.total_elements,
        "chunk_elements": header.chunk_elements,
        "chunk_index": header.chunk_index,
    }
    if header.root is not None:
        out["root"] = header.root
    return out


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
            "float32_fixed_point_last_chunk",
            "Fixed-point integers of float32 data at scale 20, in the shorter last chunk (index 2 of 3).",
            _header(dtype=DType.FLOAT32, scale=20, total=10, chunk=4, index=2),
            3,
            [-(1 << 20), 3 << 19],
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
                0,
                4,
            ).tolist(),
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
            "avg_float32",
            "AVG is carried as a SUM of fixed-point integers (scale 16); the endpoint divides by 3.",
            _header(op=ReduceOp.AVG, dtype=DType.FLOAT32, scale=16, total=2, chunk=2),
            {
                r: encode_values(
                    np.array(x, dtype=np.float32), DType.FLOAT32, Collective.ALL_REDUCE, 16, 3
                ).tolist()
                for r, x in enumerate([[1.5, -0.25], [2.0, 0.125], [-0.5, 1.0]])
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
                    *encode_values(np.array([1.0]), DType.FLOAT64, Collective.ALL_GATHER, 0, 2).tolist(),
                    0,
                    0,
                ],
                1: [
                    0,
                    0,
                    *encode_values(np.array([-3.75]), DType.FLOAT64, Collective.ALL_GATHER, 0, 2).tolist(),
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
            "counted_twice_refused_by_aggregator",
            "An honest aggregator refuses a second copy of rank 2's contribution.",
            "inputs are ranks 0..3 and rank 2 again",
            stage="combine",
            expected_ranks=everyone,
            messages=[*parts, parts[2]],
            error=ErrorCode.DUPLICATE_CONTRIBUTION,
            check=None,
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


# --- fixed point ---------------------------------------------------------------------


def _bits(x: np.ndarray) -> str:
    return np.ascontiguousarray(x).tobytes().hex()


def _encode_vector(
    name: str, description: str, dtype: DType, kind: Collective, scale: int, world: int, x: np.ndarray
) -> Vector:
    vector: Vector = {
        "name": name,
        "description": description,
        "direction": "encode",
        "dtype": int(dtype),
        "kind": int(kind),
        "scale": scale,
        "world_size": world,
        "input_bits": _bits(x),
        "input_text": [repr(float(v)) if dtype in FLOAT_DTYPES else str(int(v)) for v in x],
    }
    try:
        vector["wire"] = encode_values(x, dtype, kind, scale, world).tolist()
    except CcoError as error:
        vector |= {"fail": True, "error_code": int(error.code), "error_name": error.code.name}
    return vector


def _decode_vector(
    name: str,
    description: str,
    dtype: DType,
    kind: Collective,
    op: ReduceOp,
    scale: int,
    count: int,
    wire: list[int],
) -> Vector:
    vector: Vector = {
        "name": name,
        "description": description,
        "direction": "decode",
        "dtype": int(dtype),
        "kind": int(kind),
        "op": int(op),
        "scale": scale,
        "contributor_count": count,
        "wire": wire,
    }
    try:
        out = decode_values(np.array(wire, dtype=np.int64), dtype, kind, op, scale, count)
    except CcoError as error:
        return vector | {"fail": True, "error_code": int(error.code), "error_name": error.code.name}
    return vector | {
        "output_bits": _bits(out),
        "output_text": [repr(float(v)) if dtype in FLOAT_DTYPES else str(int(v)) for v in out],
    }


FLOAT_DTYPES = frozenset({DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64})
REDUCE = Collective.ALL_REDUCE


def fixed_point_vectors() -> list[Vector]:
    f16_scale = default_scale(DType.FLOAT16, 4)
    f32_scale = default_scale(DType.FLOAT32, 8)
    return [
        _encode_vector(
            "float32_ties_to_even",
            "x * 2^1 for x = 0.25, 0.75, -0.25, -0.75, 1.25: ties round to even.",
            DType.FLOAT32,
            REDUCE,
            1,
            2,
            np.array([0.25, 0.75, -0.25, -0.75, 1.25], dtype=np.float32),
        ),
        _encode_vector(
            "float16_default_scale",
            f"float16 at the default scale for 4 ranks ({f16_scale}): exact.",
            DType.FLOAT16,
            REDUCE,
            f16_scale,
            4,
            np.array([65504.0, -6.103515625e-05, 5.960464477539063e-08, 0.0], dtype=np.float16),
        ),
        _encode_vector(
            "float32_default_scale",
            f"float32 at the default scale for 8 ranks ({f32_scale}).",
            DType.FLOAT32,
            REDUCE,
            f32_scale,
            8,
            np.array([1.0, -0.1, 16777216.0, 1e-12], dtype=np.float32),
        ),
        _encode_vector(
            "bfloat16_from_float32",
            "bfloat16 tensors are float32 arrays rounded to bfloat16 first (ties to even).",
            DType.BFLOAT16,
            REDUCE,
            0,
            2,
            np.array([1.00390625, 1.01171875, 1.0039063, 255.5], dtype=np.float32),
        ),
        _encode_vector(
            "nan_overflows",
            "NaN has no fixed-point value.",
            DType.FLOAT32,
            REDUCE,
            10,
            2,
            np.array([1.0, np.nan], dtype=np.float32),
        ),
        _encode_vector(
            "infinity_overflows",
            "An infinity has no fixed-point value.",
            DType.FLOAT64,
            REDUCE,
            10,
            2,
            np.array([-np.inf], dtype=np.float64),
        ),
        _encode_vector(
            "beyond_contribution_bound",
            "2^24 at scale 36 is 2^60 > floor(B / 2).",
            DType.FLOAT32,
            REDUCE,
            36,
            2,
            np.array([2.0**24], dtype=np.float32),
        ),
        _encode_vector(
            "int64_beyond_contribution_bound",
            "floor(B / 3) + 1 from one of 3 ranks.",
            DType.INT64,
            REDUCE,
            0,
            3,
            np.array([RANGE_BOUND // 3 + 1], dtype=np.int64),
        ),
        _encode_vector(
            "float64_bit_exact_halves",
            "BROADCAST carries a float64 as two int32 halves, low then high.",
            DType.FLOAT64,
            Collective.BROADCAST,
            0,
            2,
            np.array([1.0, -0.0, np.nan], dtype=np.float64),
        ),
        _encode_vector(
            "int64_bit_exact_halves",
            "ALL_GATHER carries any int64, even beyond B, as two int32 halves.",
            DType.INT64,
            Collective.ALL_GATHER,
            0,
            2,
            np.array([-1, 2**63 - 1], dtype=np.int64),
        ),
        _encode_vector(
            "float16_bit_exact",
            "BROADCAST carries float16 bit patterns as int16, NaN and -inf included.",
            DType.FLOAT16,
            Collective.BROADCAST,
            0,
            2,
            np.array([np.nan, -np.inf, -2.0], dtype=np.float16),
        ),
        _decode_vector(
            "float32_sum",
            "A sum of fixed-point integers at scale 16 back to float32.",
            DType.FLOAT32,
            REDUCE,
            ReduceOp.SUM,
            16,
            3,
            [196608, -8192, 1],
        ),
        _decode_vector(
            "float32_avg",
            "AVG divides the decoded sum by the contributor count.",
            DType.FLOAT32,
            REDUCE,
            ReduceOp.AVG,
            16,
            3,
            [196608, -8192],
        ),
        _decode_vector(
            "int32_avg_ties_to_even",
            "Integer AVG rounds the exact quotient half to even: 10/4, 30/4, -10/4.",
            DType.INT32,
            REDUCE,
            ReduceOp.AVG,
            0,
            4,
            [10, 30, -10, 7],
        ),
        _decode_vector(
            "float16_sum_overflows",
            "A float16 sum of 2 * 60000 does not fit float16.",
            DType.FLOAT16,
            REDUCE,
            ReduceOp.SUM,
            0,
            2,
            [120000],
        ),
        _decode_vector(
            "int8_sum_overflows",
            "An int8 sum of 200 does not fit int8.",
            DType.INT8,
            REDUCE,
            ReduceOp.SUM,
            0,
            2,
            [200],
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
    if ref_payload(part["values"]) != (message.width, message.payload):
        problems.append("payload is not the values at the smallest width")
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
    width, payload = ref_payload(v["values"])
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
    try:
        if v["stage"] == "combine":
            inputs = [decode_message(from_hex(m)) for m in v["inputs"]]
            combine([m for m in inputs if isinstance(m, ChunkMessage)], Result)
        else:
            message = decode_message(from_hex(v["message"]))
            if not isinstance(message, ChunkMessage):
                return ["message is not a chunk message"]
            open_verified(keys, message, expected, own)
    except CcoError as error:
        problems = []
        if int(error.code) != v["error_code"] or error.code.name != v["error_name"]:
            problems.append(f"failed with {error.code.name}, not {v['error_name']}")
        if v["check"] is not None and not error.detail.startswith(v["check"]):
            problems.append(f"failed the {error.detail.split(':')[0]} check, not {v['check']}")
        return problems
    return ["was accepted"]


def _check_fixed_point(v: Vector) -> list[str]:
    dtype, kind = DType(v["dtype"]), Collective(v["kind"])
    try:
        if v["direction"] == "encode":
            x = np.frombuffer(from_hex(v["input_bits"]), dtype=NUMPY_TYPES[dtype])
            got: Vector = {"wire": encode_values(x, dtype, kind, v["scale"], v["world_size"]).tolist()}
        else:
            out = decode_values(
                np.array(v["wire"], dtype=np.int64),
                dtype,
                kind,
                ReduceOp(v["op"]),
                v["scale"],
                v["contributor_count"],
            )
            got = {"output_bits": _bits(out)}
    except CcoError as error:
        got = {"fail": True, "error_code": int(error.code)}
    return [f"{k} differs" for k, value in got.items() if v.get(k) != value]


def _check_fixed_point_reference(v: Vector) -> list[str]:
    """Reductions of floats: wire = round_half_even(x * 2^scale), computed exactly."""
    dtype, kind = DType(v["dtype"]), Collective(v["kind"])
    if v["direction"] != "encode" or dtype not in FLOAT_DTYPES or kind is not REDUCE or v.get("fail"):
        return []
    x = np.frombuffer(from_hex(v["input_bits"]), dtype=NUMPY_TYPES[dtype])
    if dtype is DType.BFLOAT16:
        bits = x.view("<u4").astype(np.uint64)
        x = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype("<u4").view("<f4")
    want = [round(Fraction(float(a)) * Fraction(2) ** v["scale"]) for a in x]
    return [] if want == v["wire"] else ["wire is not round_half_even(x * 2^scale)"]


VECTOR_CHECKS: dict[str, Check] = {
    "payload_keys.json": lambda vs: _run(vs, _check_keys),
    "payload_tags.json": lambda vs: _run(vs, _check_tag),
    "payload_combine.json": lambda vs: _run(vs, _check_combine),
    "payload_verify_failures.json": lambda vs: _run(vs, _check_failure),
    "fixed_point.json": lambda vs: _run(
        vs, lambda v: _check_fixed_point(v) + _check_fixed_point_reference(v)
    ),
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
        "fixed_point.json": fixed_point_vectors(),
    }
    for file_name, vectors in files.items():
        problems = VECTOR_CHECKS[file_name](vectors)
        if problems:
            raise AssertionError(f"{file_name}: generated vectors do not hold:\n" + "\n".join(problems))
        for vector in vectors:
            vector["spec_section"] = SPEC_SECTIONS[file_name]
    return files


SPEC_SECTIONS = {
    "payload_keys.json": "mac-construction",
    "payload_tags.json": "mac-construction",
    "payload_combine.json": "payload-linearity",
    "payload_verify_failures.json": "mac-security",
    "fixed_point.json": "fixed-point",
}
"""The draft anchor each payload vector file exercises."""
