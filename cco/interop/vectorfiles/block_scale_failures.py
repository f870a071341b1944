"""``block_scale_failures.json``: what block scaling must refuse: inputs that have no
scale, widths too narrow for the group, and every attack on the scales.

The check runs this implementation on each vector and confirms the error code; for a
verify vector it also recomputes, from the message bytes and the definitions
(:mod:`cco.interop.reference`), that the rule named fails.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from cco.interop import reference as ref
from cco.interop.jsonform import from_hex, header_from_json
from cco.interop.vectorfiles.block_scale import STORAGE, mixed
from cco.interop.vectorfiles.common import (
    EPOCH,
    GROUP_ID,
    HEADER_KEYS,
    SECRET,
    Vector,
    checked,
    header_json,
    integers,
    raw_body,
    run,
    verify_as_endpoint,
)
from cco.wire import blockscale, cbor
from cco.wire.dtypes import element_type
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import ChunkMessage, Result, chunk_length, decode_message, encode_message
from cco.wire.payload import ChunkHeader, combine, derive_group_keys, open_verified, seal
from cco.wire.registries import Collective, DType, ReduceOp

FILE = "block_scale_failures.json"
SPEC_SECTION = "block-scales"


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


def _vectors() -> list[Vector]:
    keys = derive_group_keys(SECRET, GROUP_ID)
    element = element_type(DType.FLOAT32)
    world, width, be, n = 4, 4, 16, 32
    ranks = list(range(world))
    everyone = frozenset(ranks)
    limit = blockscale.sum_limit(width, world)
    xs = [np.array(mixed(n, r), dtype=np.float32) for r in ranks]
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


def vectors() -> list[Vector]:
    return [v | {"spec_section": SPEC_SECTION} for v in checked(FILE, _vectors(), check)]


def _check_one(v: Vector) -> list[str]:
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
            keys = derive_group_keys(from_hex(v["group_secret"]), from_hex(v["group_id"]))
            own = (v["own_rank"], np.array(v["own_values"], dtype=np.int64)) if "own_rank" in v else None
            header = header_from_json(v["expected_header"])
            if verify_as_endpoint(keys, message, header, frozenset(v["expected_ranks"]), own) is None:
                return ["was ignored (another epoch)"]
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
    body = raw_body(v["message"])
    header = v["expected_header"]
    if v["error_name"] == "OPERATION_MISMATCH":
        same = all(
            _json_value(body.get(key)) == header.get(name)
            for name, key in HEADER_KEYS.items()
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


def check(vectors: list[Vector]) -> list[str]:
    return run(vectors, _check_one)
