"""``wire_forms.json``: application elements to wire integers and back in the VALUES,
PATTERNS, ORDERED and EXACT forms, refusals included.

The vectors come from this implementation's codec (:func:`~cco.wire.payload.encode_values`,
:func:`~cco.wire.payload.decode_values`); the check runs the codec again and also
recomputes every outcome from the rules of interop/payload.md alone
(:mod:`cco.interop.reference`).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from cco.interop import reference as ref
from cco.interop.jsonform import from_hex
from cco.interop.vectorfiles.common import Vector, bits, checked, run
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.exact import limb_count
from cco.wire.payload import RANGE_BOUND, decode_values, encode_values
from cco.wire.registries import Collective, DType, ReduceOp

FILE = "wire_forms.json"
SPEC_SECTION = "payload-elements"
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


FLOAT_DTYPES = frozenset({DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64})
REDUCE = Collective.ALL_REDUCE
_REDUCTIONS = frozenset({Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER})


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
        "input_bits": bits(x),
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
    return vector | {"output_bits": bits(out), "output_text": _text(dtype, out)}


ORDER_F32 = [-np.inf, -3.4028235e38, -1.0, -1e-45, -0.0, 0.0, 1e-45, 1.1754944e-38, 1.0, 3.4028235e38, np.inf]


def _vectors() -> list[Vector]:
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
            "bfloat16_signaling_nan_kept",
            "BROADCAST carries a signaling bfloat16 NaN (7f81) unchanged when it is given exactly: "
            "its float32 carrier's low half is zero.",
            DType.BFLOAT16,
            Collective.BROADCAST,
            sum_,
            2,
            np.array([0x7F810000, 0xFF810000], dtype=np.uint32).view(np.float32),
        ),
        e(
            "bfloat16_nan_conversion",
            "A float32 NaN becomes a bfloat16 NaN of the same sign and upper half, never an infinity: "
            "7f800001 and ff800001 (payload only in the low half) get the quiet bit (7fc0, ffc0); "
            "7f810001 keeps 7f81 (truncated, not rounded, and not quieted); ffc12345 keeps ffc1.",
            DType.BFLOAT16,
            Collective.BROADCAST,
            sum_,
            2,
            np.array([0x7F800001, 0xFF800001, 0x7F810001, 0xFFC12345], dtype=np.uint32).view(np.float32),
        ),
        e(
            "bfloat16_rounds_to_infinity",
            "float32 values converted to bfloat16 round to nearest, ties to even: the largest float32 "
            "(7f7fffff) and -(2^128 - 2^119) (ff7f8000, a tie) become infinities (7f80, ff80), "
            "7f7f7fff becomes the largest finite bfloat16 (7f7f), and 3f808000 (a tie) the even 3f80.",
            DType.BFLOAT16,
            Collective.BROADCAST,
            sum_,
            2,
            np.array([0x7F7FFFFF, 0xFF7F8000, 0x7F7F7FFF, 0x3F808000], dtype=np.uint32).view(np.float32),
        ),
        e(
            "bfloat16_max_of_an_infinity_rounded_to",
            "ORDERED: a finite float32 that rounds to a bfloat16 infinity is ordered as that infinity "
            "(key 7f80 for 7f7fffff, the key of ff80 for ff7f8000); 7f7f7fff is the largest finite.",
            DType.BFLOAT16,
            REDUCE,
            max_,
            2,
            np.array([0x7F7FFFFF, 0xFF7F8000, 0x7F7F7FFF], dtype=np.uint32).view(np.float32),
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
            "bfloat16_sum_exact_rounds_to_infinity",
            "EXACT: a finite float32 (7f7fffff, the largest) that rounds to a bfloat16 infinity cannot "
            "be carried: OVERFLOW.",
            bf16,
            REDUCE,
            sum_,
            4,
            np.array([1.0, np.finfo(np.float32).max], dtype=np.float32),
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


def vectors() -> list[Vector]:
    built = checked(FILE, _vectors(), check)
    return [
        v | {"spec_section": "ordered-form" if v.get("form") == "ORDERED" else SPEC_SECTION} for v in built
    ]


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
            got = {"output_bits": bits(out)}
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
            elif dtype == int(DType.BFLOAT16):
                bits, patterns = 16, ref.bfloat16_patterns(from_hex(v["input_bits"]))
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


def _check_one(v: Vector) -> list[str]:
    return _check_wire_form(v) + _check_wire_form_reference(v)


def check(vectors: list[Vector]) -> list[str]:
    return run(vectors, _check_one)
