"""What each registered element type is: its numpy form, width and bit pattern.

``registries.DType`` only numbers the types; this table says how an application
array of each type looks in numpy, how its bit pattern is carried when a
collective moves data unchanged (broadcast, all-gather), and how a float's pattern
becomes an integer of the same order for MIN and MAX (:func:`ordered_keys`).

bfloat16 has no numpy dtype without an extra dependency, so this implementation
represents a bfloat16 tensor as a float32 array whose values are bfloat16 numbers:
inputs are rounded to bfloat16 (round half to even) on the way in, results come
back as float32 arrays holding bfloat16 values.  On the wire a bfloat16 is its
16-bit pattern, exactly as for float16.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cco.wire.errors import CcoError, ErrorCode
from cco.wire.packing import extremes
from cco.wire.registries import DType


@dataclass(frozen=True, slots=True)
class ElementType:
    """Semantics of one ``DType`` code point."""

    code: DType
    storage: np.dtype[np.generic]
    """The numpy dtype of application arrays (float32 for bfloat16)."""
    bits: int
    """Bits per element in the application's type."""
    is_float: bool
    max_finite: float
    """Largest finite value of the type."""
    pattern: np.dtype[np.signedinteger]
    """Signed integer type of one wire integer in the bit-exact form."""
    patterns_per_element: int
    """Wire integers per element in the bit-exact form: 2 for 64-bit types, whose
    patterns do not fit the range bound, so they travel as two 32-bit halves."""


def _int(code: DType, numpy_type: type[np.signedinteger]) -> ElementType:
    info = np.iinfo(numpy_type)
    halves = info.bits == 64
    return ElementType(
        code=code,
        storage=np.dtype(numpy_type),
        bits=info.bits,
        is_float=False,
        max_finite=float(info.max),
        pattern=np.dtype("<i4") if halves else np.dtype(f"<i{info.bits // 8}"),
        patterns_per_element=2 if halves else 1,
    )


def _float(code: DType, storage: type[np.floating], bits: int, max_finite: float) -> ElementType:
    halves = bits == 64
    return ElementType(
        code=code,
        storage=np.dtype(storage),
        bits=bits,
        is_float=True,
        max_finite=max_finite,
        pattern=np.dtype("<i4") if halves else np.dtype(f"<i{bits // 8}"),
        patterns_per_element=2 if halves else 1,
    )


BFLOAT16_MAX = float(np.array([0x7F7F0000], dtype="<u4").view("<f4")[0])

ELEMENT_TYPES: dict[DType, ElementType] = {
    t.code: t
    for t in (
        _int(DType.INT8, np.int8),
        _int(DType.INT16, np.int16),
        _int(DType.INT32, np.int32),
        _int(DType.INT64, np.int64),
        _float(DType.FLOAT16, np.float16, 16, float(np.finfo(np.float16).max)),
        _float(DType.BFLOAT16, np.float32, 16, BFLOAT16_MAX),
        _float(DType.FLOAT32, np.float32, 32, float(np.finfo(np.float32).max)),
        _float(DType.FLOAT64, np.float64, 64, float(np.finfo(np.float64).max)),
    )
}
assert set(ELEMENT_TYPES) == set(DType), "every registered dtype has semantics"


def element_type(code: DType) -> ElementType:
    return ELEMENT_TYPES[code]


def bfloat16_patterns(values: np.ndarray) -> np.ndarray:
    """The bfloat16 bit patterns (as int16) of ``values`` rounded half to even.

    A NaN is truncated, not rounded (rounding could carry it into an infinity), so
    a bfloat16 NaN keeps its exact pattern; a float32 NaN whose payload lies only
    in the dropped bits becomes a quiet NaN with the same sign.
    """
    bits = np.ascontiguousarray(values, dtype="<f4").view("<u4")
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    nan = np.isnan(values)
    if nan.any():
        truncated = bits >> np.uint32(16)
        lost_payload = (truncated & np.uint32(0x7F)) == 0
        rounded = np.where(nan, np.where(lost_payload, truncated | np.uint32(0x40), truncated), rounded)
    patterns: np.ndarray = rounded.astype("<u2").view("<i2")
    return patterns


def bfloat16_from_patterns(patterns: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (exact: bfloat16 is float32's top half)."""
    return (patterns.astype("<i4").view("<u4") << np.uint32(16)).view("<f4")


def round_to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (half to even)."""
    return bfloat16_from_patterns(bfloat16_patterns(values))


def _full_patterns(values: np.ndarray, element: ElementType) -> np.ndarray:
    """Each element's whole bit pattern as one signed integer of the type's width."""
    if element.code is DType.BFLOAT16:
        return bfloat16_patterns(values)
    return np.ascontiguousarray(values, dtype=element.storage).view(f"<i{element.bits // 8}")


def ordered_keys(values: np.ndarray, element: ElementType) -> np.ndarray:
    """int64 keys of float ``values`` that order as the floats do (IEEE 754 total order
    restricted to non-NaN values: -inf < ... < -0.0 < +0.0 < ... < +inf).

    A non-negative pattern is its own key; a negative one has its magnitude bits
    flipped, so larger magnitudes become smaller keys.  The map is its own inverse.
    NaN has no place in the order and is refused (OVERFLOW).
    """
    nan = np.isnan(values)
    if nan.any():
        raise CcoError(ErrorCode.OVERFLOW, f"element {int(np.argmax(nan))} is NaN, which has no order")
    patterns = _full_patterns(values, element).astype(np.int64)
    flip = np.int64((1 << (element.bits - 1)) - 1)
    return np.where(patterns < 0, patterns ^ flip, patterns)


def from_ordered_keys(keys: np.ndarray, element: ElementType) -> np.ndarray:
    """The floats whose :func:`ordered_keys` are ``keys``; OVERFLOW if a key is not a
    pattern of the type's width."""
    keys = np.asarray(keys, dtype=np.int64)
    limit = 1 << (element.bits - 1)
    lo, hi = extremes(keys)
    if not (-limit <= lo and hi < limit):
        raise CcoError(ErrorCode.OVERFLOW, f"an ordered key does not fit {element.bits} bits")
    flip = np.int64(limit - 1)
    patterns = np.where(keys < 0, keys ^ flip, keys).astype(f"<i{element.bits // 8}")
    if element.code is DType.BFLOAT16:
        return bfloat16_from_patterns(patterns)
    return patterns.view(element.storage)


def require_storage(array: np.ndarray, element: ElementType) -> np.ndarray:
    """``array`` flattened, refusing arrays whose dtype does not match the element type."""
    if array.dtype != element.storage:
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"{element.code.name} tensors are numpy {element.storage} arrays, got {array.dtype}",
        )
    return np.ascontiguousarray(array).reshape(-1)
