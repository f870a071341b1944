"""``block_scale.json``: whole block-scaled float SUM and AVG operations, step by step.

Each operation runs with the implementation (:mod:`cco.wire.blockscale` and
:mod:`cco.wire.payload`): every rank's block maxima and proposals, the scale pass (an
INT16 MIN all-reduce of the proposals, op_id k), the agreed scales, and for every
chunk of the data operation (op_id k + 1) the quantized integers, the attestations,
the payload, key_m, the coefficients, each rank's pad and tag, the partial
aggregates, the Result and its verification, and the decoded output.

The check recomputes every value from the JSON alone with :mod:`cco.interop.reference`
(exact rationals, Python integers, HMAC and AES), never with the functions that
produced it, and checks the documented error bound against the exact sum.
"""

from __future__ import annotations

import dataclasses
import struct
from fractions import Fraction
from typing import Any

import numpy as np

from cco.interop import reference as ref
from cco.interop.jsonform import from_hex
from cco.interop.vectorfiles.common import (
    EPOCH,
    GROUP_ID,
    SECRET,
    Vector,
    checked,
    header_json,
    integers,
    message_json,
    raw_chunk_problems,
    run,
)
from cco.wire import blockscale
from cco.wire.dtypes import element_type, round_to_bfloat16
from cco.wire.messages import ChunkMessage, PartialAggregate, Result, chunk_count, chunk_length
from cco.wire.payload import ChunkHeader, combine, derive_group_keys, open_verified, seal
from cco.wire.registries import Collective, DType, ReduceOp

FILE = "block_scale.json"
SPEC_SECTION = "block-scaled"
STORAGE = {
    DType.FLOAT16: np.float16,
    DType.BFLOAT16: np.float32,
    DType.FLOAT32: np.float32,
    DType.FLOAT64: np.float64,
}


def binary64(value: float) -> str:
    """A value as its IEEE 754 binary64 bit pattern: 16 hex digits, most significant
    first (1.0 is 3ff0000000000000); every value of every float dtype has one, exactly."""
    return struct.pack(">d", value).hex()


def _text(values: np.ndarray) -> list[str]:
    return [repr(float(v)) for v in values]


@dataclasses.dataclass(frozen=True)
class Operation:
    """One float SUM or AVG operation of a group, and the tree that carries it."""

    name: str
    description: str
    dtype: DType
    op: ReduceOp
    width: int
    block_elements: int
    chunk_elements: int
    inputs: list[list[float]]
    groups: list[list[int]] | None = None  # ranks combined by an aggregator below the root
    kind: Collective = Collective.ALL_REDUCE
    root: int | None = None
    op_id: int = 100
    chunk_proposals: list[int] | None = None
    """Each rank's chunk proposal in blocks; None: the group's chunk_elements, in blocks
    (0 when it is not a whole number of blocks), so that the data is cut as planned."""
    scaled_chunk_elements: int | None = None

    def proposed(self) -> list[int]:
        if self.chunk_proposals is not None:
            return self.chunk_proposals
        whole = self.chunk_elements % self.block_elements == 0
        return [self.chunk_elements // self.block_elements if whole else 0] * len(self.inputs)


def _chunk_spans(total: int, chunk_elements: int) -> list[tuple[int, int]]:
    return [
        (i * chunk_elements, i * chunk_elements + chunk_length(total, chunk_elements, i))
        for i in range(chunk_count(total, chunk_elements))
    ]


def _header(o: Operation, op_id: int, **fields: Any) -> ChunkHeader:
    return ChunkHeader(group_id=GROUP_ID, epoch=EPOCH, op_id=op_id, kind=o.kind, root=o.root, **fields)


def _tree(
    parts: dict[int, ChunkMessage], groups: list[list[int]] | None
) -> tuple[list[ChunkMessage], Result]:
    grouped = groups or [[r] for r in sorted(parts)]
    below = [
        parts[g[0]] if len(g) == 1 else combine([parts[r] for r in g], PartialAggregate) for g in grouped
    ]
    result = combine(below, Result)
    assert isinstance(result, Result)
    return below, result


def operation_vector(o: Operation) -> Vector:
    """Run ``o`` with the implementation, recording every intermediate."""
    keys = derive_group_keys(SECRET, GROUP_ID)
    element = element_type(o.dtype)
    world = len(o.inputs)
    ranks = list(range(world))
    arrays = [np.array(x, dtype=STORAGE[o.dtype]) for x in o.inputs]
    total = len(arrays[0])
    limit = blockscale.sum_limit(o.width, world)
    spans = _chunk_spans(total, o.chunk_elements)
    proposals = [
        np.concatenate(
            [
                blockscale.propose(a[start:stop], element, o.block_elements, limit, start)
                for start, stop in spans
            ]
        )
        for a in arrays
    ]
    maxima = []
    for a in arrays:
        wide = np.abs(np.asarray(round_to_bfloat16(a) if o.dtype is DType.BFLOAT16 else a, dtype=np.float64))
        maxima.append(
            [
                float(
                    wide[start + b * o.block_elements : min(stop, start + (b + 1) * o.block_elements)].max()
                )
                for start, stop in spans
                for b in range(blockscale.block_count(stop - start, o.block_elements))
            ]
        )
    chunk_proposals = o.proposed()
    passed = [np.append(proposals[r], chunk_proposals[r]) for r in ranks]  # K_total + 1 elements
    k_total = len(passed[0])

    # The scale pass: op_id k, an ordinary INT16 MIN all-reduce of the proposals and
    # the chunk proposal, chunked like any operation.  Every rank checks each of its
    # Results like any MIN result (bitmap, consistency with its own values).
    scale_chunks = []
    agreed_parts = []
    for index in range(chunk_count(k_total, o.chunk_elements)):
        first = index * o.chunk_elements
        last = first + chunk_length(k_total, o.chunk_elements, index)
        scale_header = ChunkHeader(
            group_id=GROUP_ID,
            epoch=EPOCH,
            op_id=o.op_id,
            kind=Collective.ALL_REDUCE,
            op=ReduceOp.MIN,
            dtype=DType.INT16,
            total_elements=k_total,
            chunk_elements=o.chunk_elements,
            chunk_index=index,
        )
        own = {r: passed[r][first:last].astype(np.int64) for r in ranks}
        scale_parts = {r: seal(keys, scale_header, r, own[r]) for r in ranks}
        _, scale_result = _tree(scale_parts, o.groups)
        accepted = [open_verified(keys, scale_result, frozenset(ranks), (r, own[r])) for r in ranks]
        agreed_parts.append(accepted[0])
        scale_chunks.append(
            {
                "header": header_json(scale_header),
                "contributions": [message_json(scale_parts[r]) for r in ranks],
                "result": message_json(scale_result),
            }
        )
    agreed_pass = np.concatenate(agreed_parts)
    agreed, agreed_chunk = agreed_pass[:-1], int(agreed_pass[-1])
    data_chunk_elements = o.chunk_elements if agreed_chunk <= 0 else agreed_chunk * o.block_elements
    spans = _chunk_spans(total, data_chunk_elements)
    per_chunk = -(-data_chunk_elements // o.block_elements)
    blocks_of = [
        list(range(i * per_chunk, i * per_chunk + blockscale.block_count(stop - start, o.block_elements)))
        for i, (start, stop) in enumerate(spans)
    ]

    # The data operation: op_id k + 1, cut at the agreed chunk size.
    divisor = world if o.op is ReduceOp.AVG else 1
    decoded = np.zeros(total, dtype=STORAGE[o.dtype])
    chunk_vectors = []
    for index, ((start, stop), blocks) in enumerate(zip(spans, blocks_of, strict=True)):
        scales = agreed[blocks]
        header = _header(
            o,
            o.op_id + 1,
            op=o.op,
            dtype=o.dtype,
            total_elements=total,
            chunk_elements=data_chunk_elements,
            chunk_index=index,
            width=o.width,
            block_elements=o.block_elements,
            scales=scales.astype("<i2").tobytes(),
        )
        contributions = []
        sealed = {}
        for r in ranks:
            quantized = blockscale.quantize(
                arrays[r][start:stop], element, scales, o.block_elements, limit, start
            )
            attested = blockscale.attestations(proposals[r][blocks], scales)
            sealed[r] = seal(keys, header, r, np.concatenate([quantized, attested]))
            contributions.append(
                {"rank": r, "quantized": quantized.tolist(), "attestations": attested.tolist()}
            )
        below, result = _tree(sealed, o.groups)
        verified = open_verified(keys, result, frozenset(ranks))
        decoded[start:stop] = blockscale.dequantize(verified, scales, o.block_elements, divisor, element)
        m = header.chunk_id()
        k1, k2 = ref.keys(SECRET, GROUP_ID)
        key_m, stream = ref.keystream(k1, m, header.integer_count)
        u = ref.coefficients(stream)
        for entry in contributions:
            message = sealed[entry["rank"]]
            entry |= {
                "pad": ref.pad(k2, m, entry["rank"])[1],
                "tag": message.tag,
                "message": message_json(message),
            }
        y = integers(result)
        pads = [ref.pad(k2, m, r)[1] for r in ranks]
        chunk_vectors.append(
            {
                "chunk_index": index,
                "blocks": blocks,
                "header": header_json(header),
                "chunk_id": m.hex(),
                "key_m": key_m.hex(),
                "coefficients": u,
                "contributions": contributions,
                "parts": [message_json(p) for p in below],
                "result": message_json(result),
                "verified_values": [int(x) for x in verified],
                "attestation_sums": y[header.element_count :],
                "verification": {
                    "inner_product": ref.inner(u, y),
                    "pad_sum": sum(pads) % ref.P,
                    "expected_tag": (ref.inner(u, y) + sum(pads)) % ref.P,
                },
            }
        )
    return {
        "name": o.name,
        "description": o.description,
        "group_secret": SECRET.hex(),
        "group_id": GROUP_ID.hex(),
        "epoch": EPOCH,
        "world_size": world,
        "kind": int(o.kind),
        **({"root": o.root} if o.root is not None else {}),
        "op": int(o.op),
        "dtype": int(o.dtype),
        "total_elements": total,
        "chunk_elements": o.chunk_elements,
        **({"scaled_chunk_elements": o.scaled_chunk_elements} if o.scaled_chunk_elements is not None else {}),
        "block_elements": o.block_elements,
        "width": o.width,
        "sum_limit": limit,
        "relative_error_bound": {"numerator": 2 * world, "denominator": 2 * limit + 1},
        "inputs": [
            {"rank": r, "input_bits": arrays[r].tobytes().hex(), "input_text": _text(arrays[r])}
            for r in ranks
        ],
        "block_maxima": [[binary64(m) for m in row] for row in maxima],
        "proposals": [p.tolist() for p in proposals],
        "chunk_proposals": chunk_proposals,
        "scale_pass": scale_chunks,
        "agreed_scales": agreed.tolist(),
        "agreed_chunk_elements": data_chunk_elements,
        "chunks": chunk_vectors,
        "output_bits": decoded.tobytes().hex(),
        "output_text": _text(decoded),
    }


def vectors() -> list[Vector]:
    built = checked(FILE, [operation_vector(o) for o in _OPERATIONS], check)
    return [v | {"spec_section": SPEC_SECTION} for v in built]


# --- the check, from first principles ------------------------------------------------------


def _spans(total: int, chunk_elements: int) -> list[tuple[int, int]]:
    count = max(1, -(-total // chunk_elements))
    return [(i * chunk_elements, min(total, (i + 1) * chunk_elements)) for i in range(count)]


def _check_one(v: Vector) -> list[str]:
    problems: list[str] = []
    n, width, be, dtype = v["world_size"], v["width"], v["block_elements"], v["dtype"]
    limit = ref.sum_limit(width, n)
    if v["sum_limit"] != limit:
        problems.append("sum_limit is not floor(min(2^(8W-1) - 1, B) / N)")
    if v["relative_error_bound"] != {"numerator": 2 * n, "denominator": 2 * limit + 1}:
        problems.append("relative_error_bound is not 2N / (2Q + 1)")
    xs = [ref.elements(dtype, from_hex(i["input_bits"])) for i in v["inputs"]]
    if [i["input_text"] for i in v["inputs"]] != [[repr(float(a)) for a in x] for x in xs]:
        problems.append("input_text differs from input_bits")
    total = len(xs[0])
    per_chunk = -(-v["chunk_elements"] // be)
    spans = _spans(total, v["chunk_elements"])
    # Global block b -> the element positions it covers.
    blocks: dict[int, range] = {}
    for i, (start, stop) in enumerate(spans):
        for j in range(-(-(stop - start) // be)):
            blocks[i * per_chunk + j] = range(start + j * be, min(stop, start + (j + 1) * be))
    maxima = [[max(abs(Fraction(x[p])) for p in span) for span in blocks.values()] for x in xs]
    if v["block_maxima"] != [[binary64(float(m)) for m in row] for row in maxima]:
        problems.append("block_maxima are not the largest |x| of each block")
    proposals = [[ref.propose(m, limit) for m in row] for row in maxima]
    if v["proposals"] != proposals:
        problems.append("proposals are not the largest s with round_half_even(M * 2^s) <= Q")
    agreed = [min(column) for column in zip(*proposals, strict=True)]
    if v["agreed_scales"] != agreed:
        problems.append("agreed_scales are not the minimum of the proposals")
    # Each rank's chunk proposal, in blocks: 0 when chunk_elements is not whole blocks,
    # else 1 .. min(L / be, 32767); the data is cut at the smallest (section "Agreed Chunk Size").
    ce = v["chunk_elements"]
    largest = min(v.get("scaled_chunk_elements", ce) // be, 32767)
    chunk_proposals = v["chunk_proposals"]
    if len(chunk_proposals) != n or not all(
        p == 0 if ce % be or largest < 1 else 1 <= p <= largest for p in chunk_proposals
    ):
        problems.append("chunk_proposals break the rule of the agreed chunk size")
    agreed_chunk = min(chunk_proposals)
    data_ce = agreed_chunk * be if agreed_chunk >= 1 else ce
    if v["agreed_chunk_elements"] != data_ce:
        problems.append("agreed_chunk_elements is not the smallest chunk proposal in blocks")
    scale_of = {p: agreed[b] for b, span in zip(blocks, blocks.values(), strict=True) for p in span}
    block_of = {p: b for b, span in blocks.items() for p in span}

    # The scale pass: an INT16 MIN all-reduce at op_id k, untagged, smallest widths,
    # chunked like any operation.
    data_op_id = v["chunks"][0]["header"]["op_id"]
    passed = [[*row, p] for row, p in zip(proposals, chunk_proposals, strict=True)]
    agreed_pass = [*agreed, agreed_chunk]
    scale_spans = _spans(len(agreed_pass), v["chunk_elements"])
    if len(v["scale_pass"]) != len(scale_spans):
        problems.append("scale_pass does not have one chunk per chunk_elements proposals")
    for index, (sp, (first, last)) in enumerate(zip(v["scale_pass"], scale_spans, strict=False)):
        want_sp_header = {
            "group_id": v["group_id"],
            "epoch": v["epoch"],
            "op_id": data_op_id - 1,
            "kind": 1,
            "op": ref.MIN,
            "dtype": 2,
            "total_elements": len(agreed_pass),
            "chunk_elements": v["chunk_elements"],
            "chunk_index": index,
        }
        if sp["header"] != want_sp_header:
            problems.append(f"scale_pass chunk {index}: not an INT16 MIN all-reduce at op_id k")
        for r, part in enumerate(sp["contributions"]):
            if part["values"] != passed[r][first:last] or part["contributors"] != [r]:
                problems.append(f"scale_pass chunk {index}: rank {r}'s contribution is not its proposals")
        pass_result = sp["result"]
        if pass_result["values"] != agreed_pass[first:last] or pass_result["contributors"] != list(range(n)):
            problems.append(f"scale_pass chunk {index}: result is not the minimum over every rank")
        for part in [*sp["contributions"], sp["result"]]:
            problems += raw_chunk_problems(part, sp["header"], None)
            if "tag" in part["fields"]:
                problems.append(f"scale_pass chunk {index}: a chunk carries a tag")

    # The data operation at op_id k + 1.
    k1, k2 = ref.keys(from_hex(v["group_secret"]), from_hex(v["group_id"]))
    divisor = n if v["op"] == ref.AVG else 1
    out = from_hex(v["output_bits"])
    size = len(out) // total if total else 0
    data_spans = _spans(total, data_ce)
    if len(v["chunks"]) != len(data_spans):
        problems.append("the data does not have one chunk per agreed chunk size")
    for chunk, (start, stop) in zip(v["chunks"], data_spans, strict=False):
        header = chunk["header"]
        ids = sorted({block_of[p] for p in range(start, stop)})
        if chunk["blocks"] != ids or header["scales"] != ref.pack([agreed[b] for b in ids], 2).hex():
            problems.append(f"chunk {chunk['chunk_index']}: scales are not the agreed scales of its blocks")
        if (header["width"], header["block_elements"], header["op_id"]) != (width, be, data_op_id):
            problems.append(f"chunk {chunk['chunk_index']}: width or block_elements is not the operation's")
        if header["chunk_elements"] != data_ce:
            problems.append(f"chunk {chunk['chunk_index']}: chunk_elements is not the agreed chunk size")
        m = ref.chunk_id(header)
        count = stop - start + len(ids)
        key_m, stream = ref.keystream(k1, m, count)
        u = ref.coefficients(stream)
        if (chunk["chunk_id"], chunk["key_m"], chunk["coefficients"]) != (m.hex(), key_m.hex(), u):
            problems.append(f"chunk {chunk['chunk_index']}: chunk_id, key_m or coefficients differ")
        sums = [0] * count
        for r, entry in enumerate(chunk["contributions"]):
            q = [ref.quantize(Fraction(xs[r][p]), scale_of[p]) for p in range(start, stop)]
            a = [1 if proposals[r][b] == agreed[b] else 0 for b in ids]
            if entry["quantized"] != q or any(abs(i) > limit for i in q):
                problems.append(
                    f"chunk {chunk['chunk_index']}: rank {r}'s integers are not round_half_even(x * 2^s)"
                )
            if entry["attestations"] != a:
                problems.append(f"chunk {chunk['chunk_index']}: rank {r}'s attestations differ")
            values = q + a
            t = ref.tag(k1, k2, m, [r], values)
            if (
                entry["message"]["values"] != values
                or entry["tag"] != t
                or entry["pad"] != ref.pad(k2, m, r)[1]
            ):
                problems.append(f"chunk {chunk['chunk_index']}: rank {r}'s values, pad or tag differ")
            if entry["message"]["fields"].get("tag") != t:
                problems.append(f"chunk {chunk['chunk_index']}: rank {r}'s message does not carry its tag")
            problems += raw_chunk_problems(entry["message"], header, width)
            sums = [s + x for s, x in zip(sums, values, strict=True)]
        for part in chunk["parts"]:
            members = part["contributors"]
            want = [
                sum(chunk["contributions"][r]["message"]["values"][j] for r in members) for j in range(count)
            ]
            if part["values"] != want or part["fields"].get("tag") != ref.tag(k1, k2, m, members, want):
                problems.append(f"chunk {chunk['chunk_index']}: a part is not the sum of its contributors")
            problems += raw_chunk_problems(part, header, width)
        result = chunk["result"]
        y = result["values"]
        expected_tag = ref.tag(k1, k2, m, list(range(n)), y)
        if (
            y != sums
            or result["contributors"] != list(range(n))
            or result["fields"].get("tag") != expected_tag
        ):
            problems.append(
                f"chunk {chunk['chunk_index']}: result is not the verified sum of every contribution"
            )
        if any(abs(i) > ref.B or not -(1 << (8 * width - 1)) <= i < 1 << (8 * width - 1) for i in y):
            problems.append(f"chunk {chunk['chunk_index']}: result leaves [-B, B] or the width")
        if chunk["verified_values"] != y[: stop - start]:
            problems.append(f"chunk {chunk['chunk_index']}: verified_values are not the element integers")
        attested = y[stop - start :]
        if chunk["attestation_sums"] != attested or not all(1 <= s <= n for s in attested):
            problems.append(f"chunk {chunk['chunk_index']}: attestation sums are not in 1..N")
        ver = chunk["verification"]
        pad_sum = sum(ref.pad(k2, m, r)[1] for r in range(n)) % ref.P
        if ver != {"inner_product": ref.inner(u, y), "pad_sum": pad_sum, "expected_tag": expected_tag}:
            problems.append(f"chunk {chunk['chunk_index']}: verification differs")
        problems += raw_chunk_problems(result, header, width)
        for j, p in enumerate(range(start, stop)):
            s = scale_of[p]
            try:
                want_bits = ref.decode_block_scaled(y[j], s, divisor, dtype)
            except OverflowError:
                problems.append(f"element {p}: the decoded value does not fit the dtype")
                continue
            if out[p * size : (p + 1) * size] != want_bits:
                problems.append(f"element {p}: output is not y * 2^-s rounded to the dtype")
            exact = sum(Fraction(x[p]) for x in xs) / divisor
            err = abs(Fraction(y[j]) * Fraction(2) ** -s / divisor - exact)
            block_max = max(row[block_of[p]] for row in maxima)
            if err > Fraction(n, divisor) / 2 ** (s + 1) or err > Fraction(2 * n, divisor) * block_max / (
                2 * limit + 1
            ):
                problems.append(f"element {p}: error {float(err)} exceeds the documented bound")
    if v["output_text"] != [repr(float(a)) for a in ref.elements(dtype, out)]:
        problems.append("output_text differs from output_bits")
    return problems


def check(vectors: list[Vector]) -> list[str]:
    return run(vectors, _check_one)


# --- the operations ----------------------------------------------------------------------


def mixed(count: int, label: int) -> list[float]:
    """Deterministic values of mixed sign and magnitude (no random state)."""
    return [
        ((-1) ** (i + label)) * (1 + ((i * 37 + label * 11) % 97) / 8) * 2.0 ** ((i * 7 + label) % 9 - 4)
        for i in range(count)
    ]


_OPERATIONS = [
    Operation(
        "float32_sum_4_ranks_width_32",
        "float32 SUM over 4 ranks at float32's own width (W = 4 bytes, Q = 536870911), 40 elements in "
        "chunks of 32 and blocks of 16: chunk 0 has blocks 0 and 1, chunk 1 (8 elements) block 2 "
        "(index 1 * ceil(32 / 16)).  Block 1 is zero at rank 2 (proposal 32767) and rank 3 has an "
        "outlier of 1e30 in block 2; ranks 0+1 and 2+3 are combined by two aggregators first.",
        DType.FLOAT32,
        ReduceOp.SUM,
        4,
        16,
        32,
        [
            mixed(40, 0),
            mixed(40, 1),
            mixed(16, 2) + [0.0] * 16 + mixed(8, 5),
            [*mixed(32, 3), 1e30, -3.0, 1e-30, 0.5, 0.0, -0.0, 7.0, 1.0],
        ],
        groups=[[0, 1], [2, 3]],
    ),
    Operation(
        "float32_avg_3_ranks_width_16",
        "float32 AVG over 3 ranks at W = 2 bytes (narrower than float32, by request): Q = 10922; the "
        "decoded sum is divided by 3 in binary64 before rounding to float32.  Block 1 (4 elements) "
        "is zero everywhere: scale 32767, attested by all 3.",
        DType.FLOAT32,
        ReduceOp.AVG,
        2,
        16,
        64,
        [mixed(16, 0) + [0.0] * 4, mixed(16, 4) + [0.0] * 4, mixed(16, 8) + [-0.0] * 4],
    ),
    Operation(
        "float16_sum_4_ranks_width_16",
        "float16 SUM at float16's own width (W = 2 bytes, Q = 8191): the largest finite value 65504, "
        "the smallest normal and subnormal, and ties; 24 elements, since a float SUM of at most 16 "
        "is EXACT instead.",
        DType.FLOAT16,
        ReduceOp.SUM,
        2,
        16,
        16,
        [
            [65504.0, -6.103515625e-05, 5.960464477539063e-08, 0.0, 1.0, -1.0, 0.5, 3.0] * 3,
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0] * 3,
            [-0.25, 0.125, 1024.0, -2048.0, 0.0, 0.0, 0.0, 0.0] * 3,
            [0.0009765625, -0.0009765625, 100.0, 200.0, -300.0, 400.0, -500.0, 600.0] * 3,
        ],
    ),
    Operation(
        "bfloat16_sum_2_ranks_width_8",
        "bfloat16 SUM over 2 ranks at W = 1 byte (opt-in compression): Q = floor(127 / 2) = 63, so "
        "each block keeps about 6 bits; inputs are float32 values rounded to bfloat16 first.  Chunks "
        "of 24 elements are not a multiple of the blocks of 16: blocks count from each chunk's first "
        "element, so chunk 0 has blocks 0 (16 elements) and 1 (8), and chunk 1 (16 elements) block "
        "2 = 1 * ceil(24 / 16).",
        DType.BFLOAT16,
        ReduceOp.SUM,
        1,
        16,
        24,
        [mixed(40, 1), mixed(40, 2)],
    ),
    Operation(
        "float64_sum_4_ranks_width_64",
        "float64 SUM at W = 8 bytes: Q = floor(B / 4) = 2^58 - 1 (B, not 2^63 - 1, bounds it).  "
        "Magnitudes from 1e-300 to 1e300 in separate blocks; the 8-byte integers round to binary64 "
        "when decoded.",
        DType.FLOAT64,
        ReduceOp.SUM,
        8,
        16,
        48,
        [
            [1e300] + [1.0 / 3] * 15 + [1e-300] * 16 + mixed(4, 0),
            [-1e299] + [2.0 / 3] * 15 + [-2e-300] * 16 + mixed(4, 1),
            [1.0] * 16 + [5e-324] * 16 + mixed(4, 2),
            [0.1] * 16 + [0.0] * 16 + mixed(4, 3),
        ],
    ),
    Operation(
        "float32_sum_scale_pass_in_two_chunks",
        "float32 SUM over 2 ranks at W = 2 bytes with chunks and blocks of 16: 264 elements make 17 "
        "chunks and 17 blocks, so the scale pass (17 proposals and the chunk proposal) is itself two "
        "chunks, of 16 and 2.",
        DType.FLOAT32,
        ReduceOp.SUM,
        2,
        16,
        16,
        [mixed(264, 7), mixed(264, 9)],
    ),
    Operation(
        "float32_sum_agreed_chunks",
        "float32 SUM over 3 ranks at W = 4 bytes, chunks and blocks of 16 and scaled_chunk_elements "
        "64: the ranks propose chunks of 2, 4 and 3 blocks, so the scale pass (5 proposals and the "
        "chunk proposal, one chunk of 6) agrees 2 and the data's 80 elements go in chunks of 32, "
        "32 and 16 elements.  Block b still covers elements 16 b to 16 b + 15.",
        DType.FLOAT32,
        ReduceOp.SUM,
        4,
        16,
        16,
        [mixed(80, 2), mixed(80, 4), mixed(80, 6)],
        chunk_proposals=[2, 4, 3],
        scaled_chunk_elements=64,
    ),
    Operation(
        "float32_reduce_avg_root_1",
        "A float32 REDUCE (root 1, which is in m) AVG over 2 ranks at W = 4 bytes.",
        DType.FLOAT32,
        ReduceOp.AVG,
        4,
        16,
        16,
        [mixed(18, 3), mixed(18, 6)],
        kind=Collective.REDUCE,
        root=1,
    ),
]
