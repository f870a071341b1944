"""Vector provider for block-scaled fixed point: floats under SUM and AVG, step by step.

``block_scale.json`` runs whole operations with the implementation
(:mod:`cco.wire.blockscale` and :mod:`cco.wire.payload`): every rank's block maxima
and proposals, the scale pass (an INT16 MIN all-reduce of the proposals, op_id k),
the agreed scales, and for every chunk of the data operation (op_id k + 1) the
quantized integers, the attestations, the payload, key_m, the coefficients, each
rank's pad and tag, the partial aggregates, the Result and its verification, and
the decoded output.  ``block_scale_failures.json`` holds what must be refused.

Each vector is checked before it is written by :func:`check_operation`, which
recomputes every value from the JSON alone with :mod:`cco.interop.reference`
(exact rationals, Python integers, HMAC and AES), never with the functions that
produced it, and checks the documented error bound against the exact sum.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

import numpy as np

from cco.interop import reference as ref
from cco.interop.jsonform import from_hex, message_to_json
from cco.wire import blockscale, cbor
from cco.wire.dtypes import element_type, round_to_bfloat16
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import ranks_from_bitmap
from cco.wire.messages import (
    ChunkMessage,
    PartialAggregate,
    Result,
    chunk_count,
    chunk_length,
    decode_message,
    encode_message,
)
from cco.wire.payload import ChunkHeader, combine, derive_group_keys, open_verified, seal
from cco.wire.registries import Collective, DType, ReduceOp

Vector = dict[str, Any]

SECRET = bytes(range(32))
GROUP_ID = bytes(range(0xA0, 0xB0))
EPOCH = 7
STORAGE = {
    DType.FLOAT16: np.float16,
    DType.BFLOAT16: np.float32,
    DType.FLOAT32: np.float32,
    DType.FLOAT64: np.float64,
}


# --- building blocks ---------------------------------------------------------------------


def header_json(header: ChunkHeader) -> Vector:
    """A chunk header in the vectors' JSON form; width, block_elements and scales only
    for block-scaled chunks (they are part of its identity)."""
    out: Vector = {
        "group_id": header.group_id.hex(),
        "epoch": header.epoch,
        "op_id": header.op_id,
        "kind": int(header.kind),
        "op": int(header.op),
        "dtype": int(header.dtype),
        "total_elements": header.total_elements,
        "chunk_elements": header.chunk_elements,
        "chunk_index": header.chunk_index,
    }
    if header.root is not None:
        out["root"] = header.root
    if header.scales is not None:
        out |= {"width": header.width, "block_elements": header.block_elements, "scales": header.scales.hex()}
    if header.members is not None:
        out["members"] = header.members.hex()
    if header.quorum is not None:
        out |= {"quorum": header.quorum, "wait_ms": header.wait_ms}
    return out


def integers(message: ChunkMessage) -> list[int]:
    return [int(v) for v in np.frombuffer(message.payload, dtype=f"<i{message.width}")]


def message_json(message: ChunkMessage) -> Vector:
    return {
        "message_name": message.TYPE.name,
        "contributors": sorted(ranks_from_bitmap(message.contributors)),
        "values": integers(message),
        "fields": message_to_json(message),
        "encoded": encode_message(message).hex(),
    }


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
    per_chunk = -(-o.chunk_elements // o.block_elements)
    chunks = chunk_count(total, o.chunk_elements)
    spans = [
        (i * o.chunk_elements, i * o.chunk_elements + chunk_length(total, o.chunk_elements, i))
        for i in range(chunks)
    ]
    blocks_of = [
        list(range(i * per_chunk, i * per_chunk + blockscale.block_count(stop - start, o.block_elements)))
        for i, (start, stop) in enumerate(spans)
    ]
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
    k_total = len(proposals[0])

    # The scale pass: op_id k, an ordinary INT16 MIN all-reduce of the proposals,
    # chunked like any operation.  Every rank checks each of its Results like any MIN
    # result (bitmap, consistency with its own proposals).
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
        own = {r: proposals[r][first:last].astype(np.int64) for r in ranks}
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
    agreed = np.concatenate(agreed_parts)

    # The data operation: op_id k + 1.
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
            chunk_elements=o.chunk_elements,
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
        "block_elements": o.block_elements,
        "width": o.width,
        "sum_limit": limit,
        "relative_error_bound": repr(2 * world / (2 * limit + 1)),
        "inputs": [
            {"rank": r, "input_bits": arrays[r].tobytes().hex(), "input_text": _text(arrays[r])}
            for r in ranks
        ],
        "block_maxima": [[repr(m) for m in row] for row in maxima],
        "proposals": [p.tolist() for p in proposals],
        "scale_pass": scale_chunks,
        "agreed_scales": agreed.tolist(),
        "chunks": chunk_vectors,
        "output_bits": decoded.tobytes().hex(),
        "output_text": _text(decoded),
    }


# --- the checks, from first principles ---------------------------------------------------


def _body(encoded: str) -> dict[int, Any]:
    """The body map of an encoded message, read with the generic CBOR decoder only."""
    item = cbor.decode(from_hex(encoded))
    assert isinstance(item, list) and isinstance(item[1], dict)
    return {int(k): value for k, value in item[1].items()}


_HEADER_KEYS = {
    "group_id": 1,
    "epoch": 2,
    "op_id": 3,
    "kind": 4,
    "op": 5,
    "dtype": 6,
    "scales": 7,
    "total_elements": 8,
    "chunk_elements": 9,
    "chunk_index": 10,
    "width": 12,
    "root": 15,
    "block_elements": 16,
}


def check_chunk(part: Vector, header: Vector, width: int | None) -> list[str]:
    """The encoded chunk message carries ``header``, the part's values at ``width`` (or
    the smallest width), its contributors and its tag."""
    problems = []
    body = _body(part["encoded"])
    for name, key in _HEADER_KEYS.items():
        if name == "width":
            continue
        want = header.get(name)
        got = body.get(key)
        if (got.hex() if isinstance(got, bytes) else got) != want:
            problems.append(f"{part['message_name']}: {name} differs from the header")
    values = part["values"]
    w = width if width is not None else ref.smallest_width(values)
    if body.get(12) != w or body.get(13) != ref.pack(values, w):
        problems.append(f"{part['message_name']}: payload is not the values at width {w}")
    bits = int.from_bytes(body.get(11, b""), "little")
    if [r for r in range(bits.bit_length()) if bits >> r & 1] != part["contributors"]:
        problems.append(f"{part['message_name']}: contributors differ from the bitmap")
    if body.get(14) != part["fields"].get("tag"):
        problems.append(f"{part['message_name']}: tag differs from fields")
    return problems


def _spans(total: int, chunk_elements: int) -> list[tuple[int, int]]:
    count = max(1, -(-total // chunk_elements))
    return [(i * chunk_elements, min(total, (i + 1) * chunk_elements)) for i in range(count)]


def check_operation(v: Vector) -> list[str]:
    problems: list[str] = []
    n, width, be, dtype = v["world_size"], v["width"], v["block_elements"], v["dtype"]
    limit = ref.sum_limit(width, n)
    if v["sum_limit"] != limit or v["relative_error_bound"] != repr(2 * n / (2 * limit + 1)):
        problems.append("sum_limit is not floor(min(2^(8W-1) - 1, B) / N)")
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
    if v["block_maxima"] != [[repr(float(m)) for m in row] for row in maxima]:
        problems.append("block_maxima are not the largest |x| of each block")
    proposals = [[ref.propose(m, limit) for m in row] for row in maxima]
    if v["proposals"] != proposals:
        problems.append("proposals are not the largest s with round_half_even(M * 2^s) <= Q")
    agreed = [min(column) for column in zip(*proposals, strict=True)]
    if v["agreed_scales"] != agreed:
        problems.append("agreed_scales are not the minimum of the proposals")
    scale_of = {p: agreed[b] for b, span in zip(blocks, blocks.values(), strict=True) for p in span}
    block_of = {p: b for b, span in blocks.items() for p in span}

    # The scale pass: an INT16 MIN all-reduce at op_id k, untagged, smallest widths,
    # chunked like any operation.
    data_op_id = v["chunks"][0]["header"]["op_id"]
    scale_spans = _spans(len(agreed), v["chunk_elements"])
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
            "total_elements": len(agreed),
            "chunk_elements": v["chunk_elements"],
            "chunk_index": index,
        }
        if sp["header"] != want_sp_header:
            problems.append(f"scale_pass chunk {index}: not an INT16 MIN all-reduce at op_id k")
        for r, part in enumerate(sp["contributions"]):
            if part["values"] != proposals[r][first:last] or part["contributors"] != [r]:
                problems.append(f"scale_pass chunk {index}: rank {r}'s contribution is not its proposals")
        if sp["result"]["values"] != agreed[first:last] or sp["result"]["contributors"] != list(range(n)):
            problems.append(f"scale_pass chunk {index}: result is not the minimum over every rank")
        for part in [*sp["contributions"], sp["result"]]:
            problems += check_chunk(part, sp["header"], None)
            if "tag" in part["fields"]:
                problems.append(f"scale_pass chunk {index}: a chunk carries a tag")

    # The data operation at op_id k + 1.
    k1, k2 = ref.keys(from_hex(v["group_secret"]), from_hex(v["group_id"]))
    divisor = n if v["op"] == ref.AVG else 1
    out = from_hex(v["output_bits"])
    size = len(out) // total if total else 0
    for chunk, (start, stop) in zip(v["chunks"], spans, strict=True):
        header = chunk["header"]
        ids = sorted({block_of[p] for p in range(start, stop)})
        if chunk["blocks"] != ids or header["scales"] != ref.pack([agreed[b] for b in ids], 2).hex():
            problems.append(f"chunk {chunk['chunk_index']}: scales are not the agreed scales of its blocks")
        if (header["width"], header["block_elements"], header["op_id"]) != (width, be, data_op_id):
            problems.append(f"chunk {chunk['chunk_index']}: width or block_elements is not the operation's")
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
            problems += check_chunk(entry["message"], header, width)
            sums = [s + x for s, x in zip(sums, values, strict=True)]
        for part in chunk["parts"]:
            members = part["contributors"]
            want = [
                sum(chunk["contributions"][r]["message"]["values"][j] for r in members) for j in range(count)
            ]
            if part["values"] != want or part["fields"].get("tag") != ref.tag(k1, k2, m, members, want):
                problems.append(f"chunk {chunk['chunk_index']}: a part is not the sum of its contributors")
            problems += check_chunk(part, header, width)
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
        attested = y[stop - start :]
        if chunk["attestation_sums"] != attested or not all(1 <= s <= n for s in attested):
            problems.append(f"chunk {chunk['chunk_index']}: attestation sums are not in 1..N")
        ver = chunk["verification"]
        pad_sum = sum(ref.pad(k2, m, r)[1] for r in range(n)) % ref.P
        if ver != {"inner_product": ref.inner(u, y), "pad_sum": pad_sum, "expected_tag": expected_tag}:
            problems.append(f"chunk {chunk['chunk_index']}: verification differs")
        problems += check_chunk(result, header, width)
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


# --- the operations ----------------------------------------------------------------------


def _mixed(count: int, label: int) -> list[float]:
    """Deterministic values of mixed sign and magnitude (no random state)."""
    return [
        ((-1) ** (i + label)) * (1 + ((i * 37 + label * 11) % 97) / 8) * 2.0 ** ((i * 7 + label) % 9 - 4)
        for i in range(count)
    ]


OPERATIONS = [
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
            _mixed(40, 0),
            _mixed(40, 1),
            _mixed(16, 2) + [0.0] * 16 + _mixed(8, 5),
            [*_mixed(32, 3), 1e30, -3.0, 1e-30, 0.5, 0.0, -0.0, 7.0, 1.0],
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
        [_mixed(16, 0) + [0.0] * 4, _mixed(16, 4) + [0.0] * 4, _mixed(16, 8) + [-0.0] * 4],
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
        [_mixed(40, 1), _mixed(40, 2)],
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
            [1e300] + [1.0 / 3] * 15 + [1e-300] * 16 + _mixed(4, 0),
            [-1e299] + [2.0 / 3] * 15 + [-2e-300] * 16 + _mixed(4, 1),
            [1.0] * 16 + [5e-324] * 16 + _mixed(4, 2),
            [0.1] * 16 + [0.0] * 16 + _mixed(4, 3),
        ],
    ),
    Operation(
        "float32_sum_scale_pass_in_two_chunks",
        "float32 SUM over 2 ranks at W = 2 bytes with chunks and blocks of 16: 264 elements make 17 "
        "chunks and 17 blocks, so the scale pass (17 proposals) is itself two chunks, of 16 and 1.",
        DType.FLOAT32,
        ReduceOp.SUM,
        2,
        16,
        16,
        [_mixed(264, 7), _mixed(264, 9)],
    ),
    Operation(
        "float32_reduce_avg_root_1",
        "A float32 REDUCE (root 1, which is in m) AVG over 2 ranks at W = 4 bytes.",
        DType.FLOAT32,
        ReduceOp.AVG,
        4,
        16,
        16,
        [_mixed(18, 3), _mixed(18, 6)],
        kind=Collective.REDUCE,
        root=1,
    ),
]


# --- negative vectors ----------------------------------------------------------------------


def _failure(
    name: str, description: str, mutation: str, stage: str, error: ErrorCode, check: str | None, **data: Any
) -> Vector:
    return {
        "name": name,
        "fail": True,
        "description": description,
        "mutation": mutation,
        "stage": stage,
        **data,
        "error_code": int(error),
        "error_name": error.name,
        "check": check,
    }


def _reencoded(message: ChunkMessage, values: list[int], width: int | None = None) -> ChunkMessage:
    w = width or ref.smallest_width(values)
    return dataclasses.replace(message, width=w, payload=ref.pack(values, w))


def failure_vectors() -> list[Vector]:
    keys = derive_group_keys(SECRET, GROUP_ID)
    element = element_type(DType.FLOAT32)
    world, width, be, n = 4, 4, 16, 32
    ranks = list(range(world))
    everyone = frozenset(ranks)
    limit = blockscale.sum_limit(width, world)
    xs = [np.array(_mixed(n, r), dtype=np.float32) for r in ranks]
    proposals = [blockscale.propose(x, element, be, limit) for x in xs]
    scale_header = ChunkHeader(
        group_id=GROUP_ID,
        epoch=EPOCH,
        op_id=200,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.MIN,
        dtype=DType.INT16,
        total_elements=2,
        chunk_elements=n,
        chunk_index=0,
    )
    scale_result = combine(
        [seal(keys, scale_header, r, p.astype(np.int64)) for r, p in enumerate(proposals)], Result
    )
    agreed = open_verified(keys, scale_result, everyone)
    lowest = int(np.argmin([p[0] for p in proposals]))

    def data_header(scales: np.ndarray) -> ChunkHeader:
        return ChunkHeader(
            group_id=GROUP_ID,
            epoch=EPOCH,
            op_id=201,
            kind=Collective.ALL_REDUCE,
            op=ReduceOp.SUM,
            dtype=DType.FLOAT32,
            total_elements=n,
            chunk_elements=n,
            chunk_index=0,
            width=width,
            block_elements=be,
            scales=np.asarray(scales).astype("<i2").tobytes(),
        )

    def contribution(r: int, scales: np.ndarray, attest: list[int] | None = None) -> ChunkMessage:
        q = blockscale.quantize(xs[r], element, scales, be, limit)
        a = blockscale.attestations(proposals[r], scales) if attest is None else np.array(attest)
        return seal(keys, data_header(scales), r, np.concatenate([q, a]).astype(np.int64))

    honest_header = data_header(agreed)
    honest_parts = [contribution(r, agreed) for r in ranks]
    honest = combine(honest_parts, Result)
    common = {"group_secret": SECRET.hex(), "group_id": GROUP_ID.hex(), "expected_ranks": ranks}

    def verify(
        name: str,
        description: str,
        mutation: str,
        message: ChunkMessage,
        error: ErrorCode,
        check: str | None,
        header: ChunkHeader,
        **extra: Any,
    ) -> Vector:
        return _failure(
            name,
            description,
            mutation,
            "verify",
            error,
            check,
            **common,
            expected_header=header_json(header),
            **extra,
            message=encode_message(message).hex(),
        )

    raised = [int(v) for v in agreed]
    raised[0] += 1
    lowered_scales = agreed.copy()
    lowered_scales[0] -= 1
    lowered_pass = _reencoded(scale_result, [int(v) for v in lowered_scales])
    lowered = combine([contribution(r, lowered_scales) for r in ranks], Result)
    other = agreed.copy()
    other[1] -= 1
    split_parts = [contribution(r, agreed if r < 2 else other) for r in ranks]
    disguised = [dataclasses.replace(p, scales=honest_header.scales) for p in split_parts[2:]]
    greedy_attestations = [4, *blockscale.attestations(proposals[1], agreed)[1:].tolist()]
    greedy = [contribution(r, agreed, greedy_attestations if r == 1 else None) for r in ranks]
    wide = dataclasses.replace(honest, width=8, payload=ref.pack(integers(honest), 8))
    int_message = seal(
        keys,
        ChunkHeader(
            group_id=GROUP_ID,
            epoch=EPOCH,
            op_id=202,
            kind=Collective.ALL_REDUCE,
            op=ReduceOp.SUM,
            dtype=DType.INT32,
            total_elements=2,
            chunk_elements=2,
            chunk_index=0,
        ),
        0,
        np.array([1, -1], dtype=np.int64),
    )
    nan_input = np.array([1.0, np.nan, 2.0], dtype=np.float32)
    inf_input = np.array([-np.inf, 1.0], dtype=np.float64)
    return [
        _failure(
            "proposal_nan",
            "A NaN has no scale: proposing fails.",
            "element 1 is NaN",
            "propose",
            ErrorCode.OVERFLOW,
            None,
            dtype=int(DType.FLOAT32),
            world_size=2,
            width=4,
            block_elements=16,
            input_bits=nan_input.tobytes().hex(),
        ),
        _failure(
            "proposal_infinity",
            "An infinity has no scale: proposing fails.",
            "element 0 is -inf",
            "propose",
            ErrorCode.OVERFLOW,
            None,
            dtype=int(DType.FLOAT64),
            world_size=2,
            width=8,
            block_elements=16,
            input_bits=inf_input.tobytes().hex(),
        ),
        _failure(
            "width_too_narrow_for_group",
            "W = 1 byte for 128 ranks: Q = floor(127 / 128) = 0.",
            "width 1, world_size 128",
            "sum_limit",
            ErrorCode.UNSUPPORTED_FEATURE,
            None,
            width=1,
            world_size=128,
        ),
        _failure(
            "scale_raised_in_scale_pass",
            f"The aggregator raises block 0's agreed scale by one in the scale pass Result; rank {lowest}, "
            "whose proposal was the minimum, sees a MIN above its own value (its values would not fit Q).",
            "scale pass result values[0] += 1",
            "verify",
            ErrorCode.VERIFICATION_FAILED,
            "consistency",
            **common,
            base=encode_message(scale_result).hex(),
            own_rank=lowest,
            own_values=proposals[lowest].tolist(),
            expected_header=header_json(scale_header),
            message=encode_message(_reencoded(scale_result, raised)).hex(),
        ),
        verify(
            "scale_lowered_unattested",
            "The aggregator lowers block 0's agreed scale by one in the scale pass Result (every rank "
            "accepts it: a MIN below its own value is consistent).  Every rank quantizes block 0 at that "
            "scale and attests 0, since it proposed another: the honest sum of the data chunk has "
            "attestation sum 0 for block 0.",
            "scale pass result values[0] -= 1, then an honest data operation",
            lowered,
            ErrorCode.VERIFICATION_FAILED,
            "attestation",
            data_header(lowered_scales),
            scale_pass_result=encode_message(lowered_pass).hex(),
        ),
        verify(
            "scales_rewritten_in_result",
            "The Result's scales changed (block 0 raised by one), integers and tag unchanged: the header "
            "is not the operation's.  (Without that comparison the tag fails: the scales are in m.)",
            "scales[0] += 1 in the data Result",
            dataclasses.replace(honest, scales=data_header(np.array(raised)).scales),
            ErrorCode.OPERATION_MISMATCH,
            None,
            honest_header,
            base=encode_message(honest).hex(),
        ),
        _failure(
            "children_given_different_scales_refused_by_aggregator",
            "Ranks 0 and 1 got the honest scales, ranks 2 and 3 block 1 lowered by one: their chunks "
            "differ in scales, so an honest aggregator refuses to combine them.",
            "scale pass result of ranks 2 and 3: values[1] -= 1",
            "combine",
            ErrorCode.OPERATION_MISMATCH,
            None,
            **common,
            inputs=[encode_message(p).hex() for p in split_parts],
        ),
        verify(
            "children_given_different_scales",
            "As above, but the aggregator adds all four and writes ranks 0 and 1's scales: the chunks of "
            "ranks 2 and 3 were tagged under another m, so the tag fails at rank 0.",
            "combine ranks 0..3 after setting scales of ranks 2 and 3 to those of ranks 0 and 1",
            combine([*split_parts[:2], *disguised], Result),
            ErrorCode.VERIFICATION_FAILED,
            "tag",
            honest_header,
        ),
        _failure(
            "width_differs_between_children_refused_by_aggregator",
            "Rank 3's chunk written at width 8 instead of the operation's 4.",
            "re-encode rank 3's contribution at width 8",
            "combine",
            ErrorCode.OPERATION_MISMATCH,
            None,
            **common,
            inputs=[
                encode_message(p).hex()
                for p in [*honest_parts[:3], _reencoded(honest_parts[3], integers(honest_parts[3]), 8)]
            ],
        ),
        verify(
            "width_not_the_operations",
            "The honest Result re-encoded at width 8: the integers and tag are unchanged, but a block-scaled "
            "chunk's width is the operation's (and part of m).",
            "width 4 -> 8",
            wide,
            ErrorCode.OPERATION_MISMATCH,
            None,
            honest_header,
            base=encode_message(honest).hex(),
        ),
        verify(
            "attestation_sum_above_contributors",
            "Rank 1 (a faulty member, not the aggregator) attests 4 for block 0: its chunk is tagged, so "
            "the tag holds, but block 0's attestations sum above the 4 contributors.",
            "rank 1 seals attestation 4 for block 0",
            combine(greedy, Result),
            ErrorCode.VERIFICATION_FAILED,
            "attestation",
            honest_header,
        ),
        _failure(
            "scales_on_values_form",
            "An int32 SUM chunk (form VALUES) carrying scales.",
            "add scales (key 7) = h'0000' and block_elements (key 16) = 16",
            "decode",
            ErrorCode.INVALID_FIELD,
            None,
            message=_with_keys(int_message, {7: b"\x00\x00", 16: 16}).hex(),
        ),
        _failure(
            "scales_wrong_length",
            "Two blocks need 4 bytes of scales; this chunk has 6.",
            "append 0000 to scales (key 7)",
            "decode",
            ErrorCode.INVALID_FIELD,
            None,
            message=_with_keys(honest, {7: bytes(honest_header.scales or b"") + b"\x00\x00"}).hex(),
        ),
        _failure(
            "quantize_rounds_above_sum_limit",
            "OVERFLOW is decided on the rounded integer: with W = 1 byte and N = 1, Q = 127; at scale 0, "
            "127.25 rounds to 127 and fits, 127.5 rounds half to even to 128 > Q and is OVERFLOW (the input "
            "changed after its proposal).",
            "element 1 is 127.5 at the agreed scale 0 (element 0, 127.25, alone would fit)",
            "quantize",
            ErrorCode.OVERFLOW,
            None,
            dtype=int(DType.FLOAT32),
            world_size=1,
            width=1,
            block_elements=16,
            scales=[0],
            input_bits=np.array([127.25, 127.5], dtype="<f4").tobytes().hex(),
        ),
    ]


def _with_keys(message: ChunkMessage, entries: dict[cbor.CborKey, cbor.CborValue]) -> bytes:
    """The message's encoding with body entries replaced or added (deterministic CBOR)."""
    item = cbor.decode(encode_message(message))
    assert isinstance(item, list) and isinstance(item[1], dict)
    body: dict[cbor.CborKey, cbor.CborValue] = {**item[1]}
    body.update(entries)
    return cbor.encode([item[0], body])


def check_failure(v: Vector) -> list[str]:
    """The implementation refuses the vector with its code; for verify vectors, the rule
    named is also recomputed from the JSON with the reference definitions."""
    stage = v["stage"]
    code = ErrorCode(v["error_code"])
    try:
        if stage == "propose":
            x = np.frombuffer(from_hex(v["input_bits"]), dtype=STORAGE[DType(v["dtype"])])
            blockscale.propose(
                x,
                element_type(DType(v["dtype"])),
                v["block_elements"],
                blockscale.sum_limit(v["width"], v["world_size"]),
            )
        elif stage == "sum_limit":
            blockscale.sum_limit(v["width"], v["world_size"])
        elif stage == "quantize":
            x = np.frombuffer(from_hex(v["input_bits"]), dtype=STORAGE[DType(v["dtype"])])
            blockscale.quantize(
                x,
                element_type(DType(v["dtype"])),
                np.array(v["scales"], dtype=np.int16),
                v["block_elements"],
                blockscale.sum_limit(v["width"], v["world_size"]),
            )
        elif stage == "decode":
            decode_message(from_hex(v["message"]))
        elif stage == "combine":
            inputs = [decode_message(from_hex(m)) for m in v["inputs"]]
            combine([m for m in inputs if isinstance(m, ChunkMessage)], Result)
        else:
            message = decode_message(from_hex(v["message"]))
            assert isinstance(message, ChunkMessage)
            if header_json(ChunkHeader.of(message)) != v["expected_header"]:
                raise CcoError(ErrorCode.OPERATION_MISMATCH, "the header is not the operation's")
            keys = derive_group_keys(from_hex(v["group_secret"]), from_hex(v["group_id"]))
            own = (v["own_rank"], np.array(v["own_values"], dtype=np.int64)) if "own_rank" in v else None
            open_verified(keys, message, frozenset(v["expected_ranks"]), own)
    except CcoError as error:
        problems = []
        if error.code is not code or error.code.name != v["error_name"]:
            problems.append(f"failed with {error.code.name}, not {v['error_name']}")
        if v["check"] is not None and not error.detail.startswith(v["check"]):
            problems.append(f"failed the {error.detail.split(':')[0]} check, not {v['check']}")
        return problems + (_reference_verdict(v) if stage == "verify" else [])
    return ["was accepted"]


def _reference_verdict(v: Vector) -> list[str]:
    """Recompute, from the message bytes and the definitions, that the named rule fails."""
    body = _body(v["message"])
    header = v["expected_header"]
    if v["error_name"] == "OPERATION_MISMATCH":
        same = all(
            _json_value(body.get(key)) == header.get(name)
            for name, key in _HEADER_KEYS.items()
            if name in header
        )
        return ["the header is the operation's"] if same else []
    width = body[12]
    y = ref.unpack(body[13], width)
    bits = int.from_bytes(body[11], "little")
    ranks = [r for r in range(bits.bit_length()) if bits >> r & 1]
    k1, k2 = ref.keys(from_hex(v["group_secret"]), from_hex(v["group_id"]))
    tag_holds = 14 not in body or body[14] == ref.tag(k1, k2, ref.chunk_id(header), ranks, y)
    elements = chunk_length(header["total_elements"], header["chunk_elements"], header["chunk_index"])
    if v["check"] == "tag":
        return [] if not tag_holds else ["the tag relation holds"]
    if v["check"] == "attestation":
        attested = y[elements:]
        ok = all(1 <= a <= len(ranks) for a in attested)
        return [] if tag_holds and not ok else ["the attestations are in 1..|S| (or the tag fails first)"]
    if v["check"] == "consistency":
        return [] if any(a > b for a, b in zip(y, v["own_values"], strict=True)) else ["MIN is not above own"]
    return [f"no reference rule for check {v['check']}"]


def _json_value(value: Any) -> Any:
    return value.hex() if isinstance(value, bytes) else value


def _run(vectors: list[Vector], check: Any) -> list[str]:
    problems = []
    names = [v["name"] for v in vectors]
    problems += [f"{n}: name is not unique" for n in sorted({n for n in names if names.count(n) > 1})]
    for vector in vectors:
        try:
            found = check(vector)
        except (KeyError, TypeError, ValueError, AssertionError, OverflowError, CcoError) as exc:
            found = [f"malformed or failing: {exc!r}"]
        problems += [f"{vector.get('name')}: {p}" for p in found]
    return problems


VECTOR_CHECKS = {
    "block_scale.json": lambda vs: _run(vs, check_operation),
    "block_scale_failures.json": lambda vs: _run(vs, check_failure),
}
SPEC_SECTIONS = {"block_scale.json": "block-scaled", "block_scale_failures.json": "block-scales"}


def vector_files() -> dict[str, list[Vector]]:
    files = {
        "block_scale.json": [operation_vector(o) for o in OPERATIONS],
        "block_scale_failures.json": failure_vectors(),
    }
    for name, vectors in files.items():
        problems = VECTOR_CHECKS[name](vectors)
        if problems:
            raise AssertionError(f"{name}: generated vectors do not hold:\n" + "\n".join(problems))
        for vector in vectors:
            vector["spec_section"] = SPEC_SECTIONS[name]
    return files
