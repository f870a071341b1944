"""``payload_tags.json``: one contribution tagged, with every intermediate value.

The vectors are sealed with :func:`cco.wire.payload.seal`; the check recomputes the
chunk identifier, key_m, the keystream, the coefficients, the pad and the tag from
their definitions (:mod:`cco.interop.reference`) and reads the message back with
this implementation's decoder.
"""

from __future__ import annotations

import numpy as np

from cco.interop import reference as ref
from cco.interop.jsonform import from_hex
from cco.interop.vectorfiles.common import (
    SECRET,
    Vector,
    checked,
    chunk_header,
    header_json,
    message_json,
    message_problems,
    ref_payload,
    run,
)
from cco.wire.payload import RANGE_BOUND, ChunkHeader, derive_group_keys, encode_values, seal
from cco.wire.registries import Collective, DType, ReduceOp

FILE = "payload_tags.json"
SPEC_SECTION = "mac-construction"
P = ref.P


def _tag_vector(name: str, description: str, header: ChunkHeader, rank: int, values: list[int]) -> Vector:
    keys = derive_group_keys(SECRET, header.group_id)
    sealed = seal(keys, header, rank, np.array(values, dtype=np.int64))
    k1, k2 = ref.keys(SECRET, header.group_id)
    chunk_id = header.chunk_id()
    key_m, stream = ref.keystream(k1, chunk_id, len(values))
    u = ref.coefficients(stream)
    inner = sum(a * (v % P) for a, v in zip(u, values, strict=True)) % P
    pad_hmac, pad = ref.pad(k2, chunk_id, rank)
    return {
        "name": name,
        "description": description,
        "group_secret": SECRET.hex(),
        "k1": k1.hex(),
        "k2": k2.hex(),
        "header": header_json(header),
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
        "message": message_json(sealed),
    }


def _vectors() -> list[Vector]:
    return [
        _tag_vector(
            "int32_sum_rank0",
            "An all-reduce SUM contribution of int32 values; width 2 is the smallest that holds them.",
            chunk_header(),
            0,
            [1, -2, 300, -32768],
        ),
        _tag_vector(
            "int8_width1_rank5",
            "Width 1: every value fits a signed byte.  Rank 5 sets bit 5 of the bitmap.",
            chunk_header(dtype=DType.INT8, total=6, chunk=6),
            5,
            [0, 1, -1, 127, -128, 64],
        ),
        _tag_vector(
            "int64_range_bound",
            "Width 8 with both ends of the range bound B = 2^60 - 1 (a group of one may send |x| = B).",
            chunk_header(dtype=DType.INT64, total=3, chunk=3),
            0,
            [RANGE_BOUND, -RANGE_BOUND, 2**32 + 5],
        ),
        _tag_vector(
            "float32_block_scaled_last_chunk",
            "Block-scaled float32 (-1.0 and 1.5 at scale 20) in the shorter last chunk (index 2 of 3) "
            "of an 18-element operation, then rank 3's attestation 1 for the chunk's one block.  The "
            "width (4), block_elements (16) and scales (1400: int16 20) are in m, at its seventh place.",
            chunk_header(
                dtype=DType.FLOAT32, total=18, chunk=8, index=2, width=4, block_elements=16, scales=[20]
            ),
            3,
            [-(1 << 20), 3 << 19, 1],
        ),
        _tag_vector(
            "reduce_with_root",
            "REDUCE carries a root, which is part of the chunk id.",
            chunk_header(kind=Collective.REDUCE, root=2, total=2, chunk=2),
            1,
            [10, -10],
        ),
        _tag_vector(
            "broadcast_float32_patterns",
            "BROADCAST from root 3: float32 1.0, -2.5, +inf and -0.0 as their bit patterns (int32).",
            chunk_header(kind=Collective.BROADCAST, dtype=DType.FLOAT32, root=3, total=4, chunk=4),
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
            chunk_header(dtype=DType.INT8, total=1, chunk=4, quorum=3, wait_ms=250),
            2,
            [1],
        ),
        _tag_vector(
            "quorum_decided_members",
            "A chunk of an operation its presence pass decided: m appends members (0d: ranks 0, 2 "
            "and 3) and null after root.",
            chunk_header(total=2, chunk=4, members=[0, 2, 3]),
            3,
            [5, -5],
        ),
        _tag_vector(
            "barrier_no_elements",
            "A BARRIER chunk has no elements: the inner product is 0 and the tag is the pad alone.",
            chunk_header(kind=Collective.BARRIER, dtype=DType.INT8, total=0, chunk=1),
            9,
            [],
        ),
    ]


def vectors() -> list[Vector]:
    return [v | {"spec_section": SPEC_SECTION} for v in checked(FILE, _vectors(), check)]


def _check_one(v: Vector) -> list[str]:
    k1, k2 = ref.keys(from_hex(v["group_secret"]), from_hex(v["header"]["group_id"]))
    chunk_id = ref.chunk_id(v["header"])
    key_m, stream = ref.keystream(k1, chunk_id, len(v["values"]))
    u = ref.coefficients(stream)
    inner = sum(a * (x % P) for a, x in zip(u, v["values"], strict=True)) % P
    pad_hmac, pad = ref.pad(k2, chunk_id, v["rank"])
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
    problems += message_problems(v["message"], v["header"])
    if v["message"]["values"] != v["values"] or v["message"]["contributors"] != [v["rank"]]:
        problems.append("message does not carry the values of the rank")
    if v["message"]["fields"].get("tag") != v["tag"]:
        problems.append("message does not carry the tag")
    return problems


def check(vectors: list[Vector]) -> list[str]:
    return run(vectors, _check_one)
