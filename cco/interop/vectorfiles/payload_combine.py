"""``payload_combine.json``: contributions combined, some through partial aggregates,
and the verification of the result, every pad listed.

The vectors are built with :func:`cco.wire.payload.seal`, :func:`~cco.wire.payload.combine`
and :func:`~cco.wire.payload.open_verified`; the check recomputes the combination and
the tag relation from their definitions (:mod:`cco.interop.reference`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
    run,
)
from cco.wire.messages import ChunkMessage, PartialAggregate, Result, decode_message
from cco.wire.payload import (
    RANGE_BOUND,
    ChunkHeader,
    combine,
    derive_group_keys,
    encode_values,
    open_verified,
    seal,
)
from cco.wire.registries import Collective, DType, ReduceOp

FILE = "payload_combine.json"
SPEC_SECTION = "payload-linearity"
P = ref.P


def _combine_vector(
    name: str,
    description: str,
    header: ChunkHeader,
    inputs: dict[int, list[int]],
    groups: list[list[int]] | None = None,
    *,
    expected: Sequence[int] | None = None,
    at_least: int | None = None,
    verifiers: dict[int, list[int] | None] | None = None,
) -> Vector:
    """Seal ``inputs`` (rank -> values); combine each of ``groups`` into a partial aggregate
    first (as an aggregator below the root would), then everything into a Result.

    The Result is verified against ``expected`` (the ranks of ``inputs`` unless given;
    with ``at_least``, a presence pass's quorum), and by each rank of ``verifiers``
    with its own integers (None: a rank that contributed nothing)."""
    keys = derive_group_keys(SECRET, header.group_id)
    sealed = {r: seal(keys, header, r, np.array(v, dtype=np.int64)) for r, v in inputs.items()}
    grouped = groups or [[r] for r in inputs]
    parts = [
        sealed[g[0]] if len(g) == 1 else combine([sealed[r] for r in g], PartialAggregate) for g in grouped
    ]
    result = combine(parts, Result)
    ranks = sorted(inputs)
    wanted = sorted(expected) if expected is not None else ranks
    values = open_verified(keys, result, frozenset(wanted), None, at_least).tolist()
    k1, k2 = ref.keys(SECRET, header.group_id)
    chunk_id = header.chunk_id()
    vector: Vector = {
        "name": name,
        "description": description,
        "group_secret": SECRET.hex(),
        "header": header_json(header),
        "chunk_id": chunk_id.hex(),
        "expected_ranks": wanted,
        **({"at_least": at_least} if at_least is not None else {}),
        "contributions": [message_json(sealed[r]) for r in ranks],
        "parts": [message_json(p) for p in parts],
        "result": message_json(result),
    }
    if result.tag is not None:
        _, stream = ref.keystream(k1, chunk_id, len(values))
        u = ref.coefficients(stream)
        pads = [{"rank": r, "pad": ref.pad(k2, chunk_id, r)[1]} for r in ranks]
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
    if verifiers is not None:
        vector["verifiers"] = [
            {"own_rank": r} if own is None else {"own_rank": r, "own_values": own}
            for r, own in verifiers.items()
        ]
    return vector


def _vectors() -> list[Vector]:
    return [
        _combine_vector(
            "sum_four_ranks_two_levels",
            "SUM of four int32 contributions: ranks 0 and 1 are combined by one aggregator, 2 and 3 by "
            "another, and the two partial aggregates by the root.  Widths grow from 1 and 2 to 4.",
            chunk_header(),
            {0: [1, 2, 3, 4], 1: [-1, 100, 0, 127], 2: [5, -32768, 7, 8], 3: [0, -32768, -70000, 1]},
            [[0, 1], [2, 3]],
        ),
        _combine_vector(
            "widening_int8",
            "Two int8 contributions whose sum needs 2 bytes: the aggregate widens.",
            chunk_header(dtype=DType.INT8, total=3, chunk=3),
            {0: [127, -128, 1], 1: [127, -128, -1]},
        ),
        _combine_vector(
            "max_float32_ordered",
            "float32 MAX travels as ordered keys (form ORDERED), untagged, at the smallest width: -0.0 "
            "against +0.0, infinities, the smallest subnormals.  The integer maximum is the float one.",
            chunk_header(op=ReduceOp.MAX, dtype=DType.FLOAT32, total=5, chunk=5),
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
            chunk_header(op=ReduceOp.MIN, dtype=DType.FLOAT64, total=3, chunk=3),
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
            chunk_header(op=ReduceOp.MAX, dtype=DType.INT64, total=3, chunk=3),
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
            chunk_header(op=ReduceOp.MAX, total=3, chunk=3),
            {0: [1, -5, 9], 1: [4, -7, 2], 2: [0, -6, 3]},
        ),
        _combine_vector(
            "presence_pass_with_a_rank_missing",
            "The presence pass of a quorum all-reduce (quorum 3, wait_ms 250) of ranks 0..3 that went "
            "on without rank 1: contributors 0, 2 and 3, at least 3 of the 4 expected.  The tag "
            "relation sums the pads of the ranks the Result names (0, 2, 3), not of all four.",
            chunk_header(dtype=DType.INT8, total=1, chunk=4, quorum=3, wait_ms=250),
            {0: [1], 2: [1], 3: [1]},
            [[0, 2], [3]],
            expected=[0, 1, 2, 3],
            at_least=3,
        ),
        _combine_vector(
            "scale_pass_of_decided_members",
            "The scale pass (an INT16 MIN of proposals) of an operation its presence pass decided to "
            "run over ranks 0, 2 and 3 (members 0d): rank 1, late, sent no proposals.  Rank 2 checks "
            "consistency with its own proposals; rank 1 verifies the same Result against the members "
            "with the bitmap check alone, having no proposal to compare.",
            chunk_header(op=ReduceOp.MIN, dtype=DType.INT16, total=2, chunk=4, op_id=43, members=[0, 2, 3]),
            {0: [12, 32767], 2: [9, 30], 3: [15, 31]},
            verifiers={2: [9, 30], 1: None},
        ),
        _combine_vector(
            "barrier_three_ranks",
            "A BARRIER of ranks 0, 1 and 2: no elements, the tag is the sum of the three pads.",
            chunk_header(kind=Collective.BARRIER, dtype=DType.INT8, total=0, chunk=1),
            {0: [], 1: [], 2: []},
        ),
        _combine_vector(
            "all_gather_float64_halves",
            "ALL_GATHER of one float64 per rank: each is two int32 halves (low, high) in its own slot "
            "of a zero-padded vector; the SUM is the concatenation.",
            chunk_header(kind=Collective.ALL_GATHER, dtype=DType.FLOAT64, total=4, chunk=4),
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


def vectors() -> list[Vector]:
    built = checked(FILE, _vectors(), check)
    return [v | {"spec_section": SPEC_SECTION} for v in built]


def _check_one(v: Vector) -> list[str]:
    header, expected, at_least = v["header"], v["expected_ranks"], v.get("at_least")
    ranks = v["result"]["contributors"]  # S, the ranks whose pads the tag holds
    problems: list[str] = []
    for part in [*v["contributions"], *v["parts"], v["result"]]:
        problems += message_problems(part, header)
    columns = zip(*(c["values"] for c in v["contributions"]), strict=True)
    op = ReduceOp(header["op"])
    fold: Callable[[Sequence[int]], int] = {ReduceOp.MAX: max, ReduceOp.MIN: min}.get(op, sum)
    if (
        v["result"]["values"] != [fold(list(c)) for c in columns]
        or v["verified_values"] != v["result"]["values"]
    ):
        problems.append("result values are not the combination of the contributions")
    if ranks != [c["contributors"][0] for c in v["contributions"]]:
        problems.append("result contributors are not the contributions' ranks")
    quorum = at_least is not None and set(ranks) <= set(expected) and len(ranks) >= at_least
    if ranks != expected and not quorum:
        problems.append("result contributors are not the expected ranks (or a quorum of them)")
    tag = v["result"]["fields"].get("tag")
    if "verification" in v:
        k1, k2 = ref.keys(from_hex(v["group_secret"]), from_hex(header["group_id"]))
        want = ref.tag(k1, k2, ref.chunk_id(header), ranks, v["result"]["values"])
        if tag != want or v["verification"]["expected_tag"] != want:
            problems.append("result tag is not <u, y> + sum of pads")
        if sum(c["fields"]["tag"] for c in v["contributions"]) % P != tag:
            problems.append("result tag is not the sum of the contribution tags")
    elif tag is not None:
        problems.append("an untagged op's result carries a tag")
    keys = derive_group_keys(from_hex(v["group_secret"]), from_hex(header["group_id"]))
    result = decode_message(from_hex(v["result"]["encoded"]))
    assert isinstance(result, ChunkMessage)
    for verifier in v.get("verifiers", []):
        own_values = verifier.get("own_values")
        own = None if own_values is None else (verifier["own_rank"], np.array(own_values, dtype=np.int64))
        got = open_verified(keys, result, frozenset(expected), own, at_least).tolist()
        if got != v["verified_values"]:
            problems.append(f"rank {verifier['own_rank']} verifies other values")
    return problems


def check(vectors: list[Vector]) -> list[str]:
    return run(vectors, _check_one)
