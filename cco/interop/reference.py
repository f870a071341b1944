"""The payload rules of interop/payload.md from first principles, for the vector checks.

Nothing here calls :mod:`cco.wire` arithmetic (``mac``, ``modp``, ``blockscale``,
``codec``, ``dtypes``, ``packing``): keys, coefficients, pads and tags come from
``hmac``, ``hashlib`` and AES of ``cryptography``; floats are read from their bit
patterns with :mod:`struct` and handled as exact :class:`~fractions.Fraction`;
every integer is a Python int.  The only shared piece is the deterministic CBOR
encoder, used for the chunk identifier m.  So a vector that the generator produced
with the implementation holds only if the definitions produce it too.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from cco.interop.jsonform import from_hex
from cco.wire import cbor

P = (1 << 61) - 1
B = (1 << 60) - 1
SCALE_MIN, SCALE_MAX = -(1 << 15), (1 << 15) - 1
INFO_K1, INFO_K2 = b"cco/1 mac k1", b"cco/1 mac k2"

# dtype code -> (bits, struct format of one element, or None for bfloat16's float32 carrier)
FLOATS = {5: (16, "<e"), 6: (16, "<f"), 7: (32, "<f"), 8: (64, "<d")}
INTEGERS = {1: 8, 2: 16, 3: 32, 4: 64}
SUM, AVG, MIN, MAX = 1, 2, 3, 4
REDUCTIONS = {1, 2, 6}  # ALL_REDUCE, REDUCE, REDUCE_SCATTER


# --- keys, chunk identifier, coefficients, pads, tags ---------------------------------


def hkdf(secret: bytes, group_id: bytes, info: bytes) -> tuple[bytes, bytes]:
    """(PRK, OKM) of HKDF-SHA256 with salt group_id and L = 32 (RFC 5869)."""
    prk = hmac.new(group_id, secret, hashlib.sha256).digest()
    return prk, hmac.new(prk, info + b"\x01", hashlib.sha256).digest()


def keys(secret: bytes, group_id: bytes) -> tuple[bytes, bytes]:
    """(k1, k2)."""
    return hkdf(secret, group_id, INFO_K1)[1], hkdf(secret, group_id, INFO_K2)[1]


def chunk_id(header: dict[str, Any]) -> bytes:
    """m = CBOR([group_id, epoch, op_id, kind, op, dtype, scaling, total_elements,
    chunk_elements, chunk_index, root]), scaling = null or [width, block_elements, scales];
    a quorum ALL_REDUCE's chunk appends members (or null) and [quorum, wait_ms] (or null)."""
    scaling = None
    if "scales" in header:
        scaling = [header["width"], header["block_elements"], from_hex(header["scales"])]
    fields = [
        from_hex(header["group_id"]),
        header["epoch"],
        header["op_id"],
        header["kind"],
        header["op"],
        header["dtype"],
        scaling,
        header["total_elements"],
        header["chunk_elements"],
        header["chunk_index"],
        header.get("root"),
    ]
    if "members" in header or "quorum" in header:
        members = from_hex(header["members"]) if "members" in header else None
        presence = [header["quorum"], header["wait_ms"]] if "quorum" in header else None
        fields += [members, presence]
    return cbor.encode(fields)


def keystream(k1: bytes, m: bytes, n: int) -> tuple[bytes, bytes]:
    """(key_m, the first 8n bytes of AES-256-CTR under key_m from a zero counter block)."""
    key_m = hmac.new(k1, m, hashlib.sha256).digest()
    encryptor = Cipher(algorithms.AES(key_m), modes.CTR(bytes(16))).encryptor()
    return key_m, encryptor.update(bytes(8 * n))


def words(stream: bytes) -> list[int]:
    return [int.from_bytes(stream[i : i + 8], "little") for i in range(0, len(stream), 8)]


def coefficients(stream: bytes) -> list[int]:
    return [(w % 2**61) % P for w in words(stream)]


def pad(k2: bytes, m: bytes, rank: int) -> tuple[bytes, int]:
    """(HMAC(k2, m || be32(rank)), F(k2, m, rank))."""
    digest = hmac.new(k2, m + rank.to_bytes(4, "big"), hashlib.sha256).digest()
    return digest, (int.from_bytes(digest[:8], "little") % 2**61) % P


def inner(u: Sequence[int], values: Sequence[int]) -> int:
    return sum(a * (v % P) for a, v in zip(u, values, strict=True)) % P


def tag(k1: bytes, k2: bytes, m: bytes, ranks: Sequence[int], values: Sequence[int]) -> int:
    """<u, values> + sum of the ranks' pads, mod p."""
    u = coefficients(keystream(k1, m, len(values))[1])
    return (inner(u, values) + sum(pad(k2, m, r)[1] for r in ranks)) % P


def smallest_width(values: Sequence[int]) -> int:
    lo, hi = (min(values), max(values)) if values else (0, 0)
    return next(w for w in (1, 2, 4, 8) if -(1 << (8 * w - 1)) <= lo and hi < 1 << (8 * w - 1))


def pack(values: Sequence[int], width: int) -> bytes:
    """Little-endian two's complement, ``width`` bytes each (OverflowError if one does not fit)."""
    return b"".join(v.to_bytes(width, "little", signed=True) for v in values)


def unpack(data: bytes, width: int) -> list[int]:
    return [int.from_bytes(data[i : i + width], "little", signed=True) for i in range(0, len(data), width)]


# --- floats as exact rationals --------------------------------------------------------


def bfloat16_bits(f32_bits: int) -> int:
    """The bfloat16 pattern of a binary32 pattern (draft section "Element Types and Wire
    Forms", BFLOAT16 elements): nearest, ties to even; a NaN keeps its upper half, with
    the quiet bit set if that half alone would be an infinity."""
    if (f32_bits >> 23) & 0xFF == 0xFF and f32_bits & 0x7FFFFF:
        upper = f32_bits >> 16
        return upper if upper & 0x7F else upper | 0x40
    return ((f32_bits + 0x7FFF + ((f32_bits >> 16) & 1)) & 0xFFFFFFFF) >> 16


def bfloat16_patterns(data: bytes) -> list[int]:
    """The bfloat16 patterns (unsigned) of binary32 elements given as their bytes: from
    the bits themselves, since a signaling NaN may not survive a trip through a float."""
    return [bfloat16_bits(int.from_bytes(data[i : i + 4], "little")) for i in range(0, len(data), 4)]


def integers(dtype: int, data: bytes) -> list[int]:
    """The elements of ``data`` of an integer dtype."""
    size = INTEGERS[dtype] // 8
    return [int.from_bytes(data[i : i + size], "little", signed=True) for i in range(0, len(data), size)]


def elements(dtype: int, data: bytes) -> list[Any]:
    """The application elements of ``data``: ints, or floats (bfloat16: float32 values
    rounded to bfloat16)."""
    if dtype in INTEGERS:
        size = INTEGERS[dtype] // 8
        return [int.from_bytes(data[i : i + size], "little", signed=True) for i in range(0, len(data), size)]
    fmt = FLOATS[dtype][1]
    size = struct.calcsize(fmt)
    values = [struct.unpack(fmt, data[i : i + size])[0] for i in range(0, len(data), size)]
    if dtype == 6:
        values = [struct.unpack("<f", struct.pack("<I", p << 16))[0] for p in bfloat16_patterns(data)]
    return values


def pattern(dtype: int, value: float) -> int:
    """The element's bit pattern as a signed integer of its width."""
    bits, fmt = FLOATS[dtype]
    if dtype == 6:
        raw = int.from_bytes(struct.pack("<f", value), "little") >> 16
    else:
        raw = int.from_bytes(struct.pack(fmt, value), "little")
    return raw - (1 << bits) if raw >> (bits - 1) else raw


def ordered_key(dtype: int, value: float) -> int:
    """key = p if p >= 0 else p XOR (2^(bits-1) - 1); ValueError for NaN."""
    if math.isnan(value):
        raise ValueError("NaN has no order")
    bits = FLOATS[dtype][0]
    p = pattern(dtype, value)
    return p if p >= 0 else p ^ ((1 << (bits - 1)) - 1)


def from_ordered_key(dtype: int, key: int) -> bytes:
    """The element bytes whose ordered key is ``key`` (bfloat16 as a float32 carrier)."""
    bits = FLOATS[dtype][0]
    p = key if key >= 0 else key ^ ((1 << (bits - 1)) - 1)
    raw = p % (1 << bits)
    if dtype == 6:
        return (raw << 16).to_bytes(4, "little")
    return raw.to_bytes(bits // 8, "little")


# --- block scaling --------------------------------------------------------------------


def sum_limit(width: int, world_size: int) -> int:
    """Q = floor(min(2^(8W-1) - 1, B) / N); below 1 the width is UNSUPPORTED_FEATURE."""
    return min((1 << (8 * width - 1)) - 1, B) // world_size


def shifted(x: Fraction, s: int) -> Fraction:
    return x * Fraction(2) ** s


def propose(block_max: Fraction, limit: int) -> int:
    """The largest s in int16 with round_half_even(M * 2^s) <= Q; SCALE_MAX for M = 0."""
    if block_max == 0:
        return SCALE_MAX
    # Start where M * 2^s is about Q, then walk: round(M * 2^s) grows with s.
    s = limit.bit_length() - (block_max.numerator.bit_length() - block_max.denominator.bit_length())
    while s > SCALE_MIN and round(shifted(block_max, s)) > limit:
        s -= 1
    while s < SCALE_MAX and round(shifted(block_max, s + 1)) <= limit:
        s += 1
    return s


def quantize(x: Fraction, s: int) -> int:
    """round_half_even(x * 2^s), exactly (Python rounds a Fraction half to even)."""
    return round(shifted(x, s))


def decode_block_scaled(y: int, s: int, divisor: int, dtype: int) -> bytes:
    """z = y * 2^-s (/ divisor) in binary64, then rounded once to the dtype (bfloat16
    through binary32); OverflowError if z does not fit the dtype."""
    z = math.ldexp(float(y), -s)
    if divisor != 1:
        z /= divisor
    if dtype == 8:
        return struct.pack("<d", z)
    if dtype == 5:
        return struct.pack("<e", z)
    f32 = struct.pack("<f", z)
    if dtype == 7:
        return f32
    bf = bfloat16_bits(int.from_bytes(f32, "little"))
    if (bf >> 7) & 0xFF == 0xFF:
        raise OverflowError("the result does not fit bfloat16")
    return (bf << 16).to_bytes(4, "little")


# --- exact limbs ----------------------------------------------------------------------

EXACT_MAX_ELEMENTS = 16
# dtype code -> (precision in bits, emin, emax) of the dtype's own format
EXACT_FORMATS = {5: (11, -14, 15), 6: (8, -126, 127), 7: (24, -126, 127), 8: (53, -1022, 1023)}


def exact_unit(dtype: int) -> int:
    """e0, the exponent of the dtype's smallest subnormal."""
    precision, emin, _ = EXACT_FORMATS[dtype]
    return emin - precision + 1


def exact_limb_count(dtype: int) -> int:
    """L = ceil((emax + 1 - e0) / 32)."""
    return -(-(EXACT_FORMATS[dtype][2] + 1 - exact_unit(dtype)) // 32)


def exact_limbs(dtype: int, value: float) -> list[int]:
    """The L signed base-2^32 digits of value * 2^-e0, least significant first;
    ValueError for NaN or an infinity."""
    if math.isnan(value) or math.isinf(value):
        raise ValueError("not finite")
    v = Fraction(value) / Fraction(2) ** exact_unit(dtype)
    assert v.denominator == 1, "every finite value is a multiple of the smallest subnormal"
    magnitude, sign = abs(v.numerator), (-1 if v < 0 else 1)
    return [sign * ((magnitude >> (32 * k)) % (1 << 32)) for k in range(exact_limb_count(dtype))]


def exact_decode(dtype: int, limbs: Sequence[int], divisor: int) -> bytes | None:
    """S * 2^e0 / divisor rounded to the dtype, ties to even, as the element's bytes
    (bfloat16: its float32 carrier); None beyond the largest finite value."""
    precision, emin, emax = EXACT_FORMATS[dtype]
    total = sum(y * (1 << (32 * k)) for k, y in enumerate(limbs))
    x = Fraction(total) * Fraction(2) ** exact_unit(dtype) / divisor
    if x == 0:
        rounded = 0.0
    else:
        e = 0
        while Fraction(2) ** e > abs(x):
            e -= 1
        while Fraction(2) ** (e + 1) <= abs(x):
            e += 1
        quantum = Fraction(2) ** (max(e, emin) - precision + 1)
        n = round(abs(x) / quantum)  # Python rounds a Fraction half to even
        largest = (2 - Fraction(2) ** (1 - precision)) * Fraction(2) ** emax
        if n * quantum > largest:
            return None
        rounded = float(n * quantum) * (1 if x > 0 else -1)
    fmt = {5: "<e", 6: "<f", 7: "<f", 8: "<d"}[dtype]
    return struct.pack(fmt, rounded)
