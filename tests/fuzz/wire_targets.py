"""The wire layer's decoders as fuzz targets: each takes bytes and nothing else.

A target feeds its bytes to one decoder (or drives a structured mutation of a valid
message with them) and checks what a hostile peer must never get: an exception
other than :class:`~cco.wire.errors.CcoError` with a registered code, unbounded
buffering, an accepted input that does not encode back to itself, or a chunk the
verify path accepts although it differs from the honest one.  Anything else
propagates, so the Hypothesis tests (tests/fuzz/test_*.py) and the atheris runner
(tests/fuzz/atheris_wire.py) report the input that caused it.

Every target returns True when the decoder accepted its input and False when it
refused it with a typed error; the tests count both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import cache

import numpy as np

from cco.interop.samples import samples
from cco.wire import cbor
from cco.wire.blockscale import attestations, dequantize, propose, quantize, sum_limit
from cco.wire.chunking import Reassembler
from cco.wire.codec import decode_values, encode_values, wire_length
from cco.wire.dtypes import element_type
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import ranks_from_bitmap
from cco.wire.framing import FrameDecoder, decode_varint, encode_frame, encode_varint
from cco.wire.messages import (
    ChunkMessage,
    Result,
    decode_message,
    encode_message,
)
from cco.wire.packing import unpack
from cco.wire.payload import (
    ChunkHeader,
    check_encoding,
    check_part,
    combine,
    derive_group_keys,
    open_verified,
    seal,
)
from cco.wire.registries import Collective, DType, ReduceOp

Target = Callable[[bytes], bool]
REGISTERED = frozenset(ErrorCode)


class Draw:
    """Choices read from fuzz bytes, one at a time; zeros once they run out, so every
    input, however short, drives a whole run (as atheris's data provider does)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def below(self, n: int) -> int:
        """A choice in [0, n), from one byte (two when n > 256)."""
        value = self.byte() if n <= 256 else self.byte() << 8 | self.byte()
        return value % n

    def take(self, n: int) -> bytes:
        piece = self.data[self.pos : self.pos + n]
        self.pos += len(piece)
        return piece

    def rest(self) -> bytes:
        return self.take(len(self.data))


def refused(error: CcoError) -> bool:
    """A refusal is acceptable only with a registered code; returns False (refused)."""
    if type(error.code) is not ErrorCode or error.code not in REGISTERED:
        raise AssertionError(f"unregistered error code {error.code!r}: {error}")
    return False


def _same(a: object, b: object) -> bool:
    """Equality that tells True from 1 (CBOR tells them apart)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


# --- CBOR ---------------------------------------------------------------------------


def cbor_decode(data: bytes) -> bool:
    """The strict CBOR decoder: accepted input is the one deterministic encoding of its
    value, and the quick path (cbor2) accepts nothing the strict reader refuses."""
    try:
        strict: object = cbor._decode_strictly(data, cbor.DEFAULT_LIMITS)
    except CcoError as error:
        refused(error)
        strict = None
        strict_refused = True
    else:
        strict_refused = False
    quick = cbor._decode_quickly(data, cbor.DEFAULT_LIMITS)
    if quick is not cbor._NOT_QUICK:
        assert not strict_refused, f"the quick path accepted what the strict reader refuses: {data.hex()}"
        assert _same(quick, strict), f"the two readers disagree on {data.hex()}"
    if strict_refused:
        return False
    assert cbor.encode(strict) == data, f"accepted {data.hex()} does not encode back to itself"  # type: ignore[arg-type]
    return True


# --- framing ------------------------------------------------------------------------


def frames(data: bytes) -> bool:
    """Stream framing fed in pieces: the frames returned, framed again, are exactly
    the bytes consumed, and the decoder never holds more than one frame's worth."""
    draw = Draw(data)
    limit = 16 << draw.below(8)  # 16 B to 2 KiB frames
    cuts = sorted({draw.below(64) for _ in range(draw.below(6))})
    stream = draw.rest()
    decoder = FrameDecoder(limit)
    got: list[bytes] = []
    start = 0
    try:
        for cut in [*cuts, len(stream)]:
            piece = stream[start : max(start, cut)]
            start = max(start, cut)
            got += decoder.feed(piece)
            assert decoder.buffered <= limit + 8, f"buffered {decoder.buffered} > limit {limit} + 8"
    except CcoError as error:
        return refused(error)
    joined = b"".join(encode_frame(f, limit) for f in got)
    assert stream.startswith(joined), "the frames, framed again, are not what was fed"
    held = len(stream) - len(joined) - decoder.buffered  # the pending frame's length prefix
    assert 0 <= held <= 8, f"{held} bytes fed are neither returned nor buffered"
    assert decoder.at_boundary() == (len(joined) == len(stream))
    return True


def varint(data: bytes) -> bool:
    try:
        parsed = decode_varint(data)
    except CcoError as error:
        return refused(error)
    if parsed is None:
        return True
    value, end = parsed
    assert data[:end] == encode_varint(value), f"{data[:end].hex()} is not the shortest form of {value}"
    return True


# --- messages -----------------------------------------------------------------------


def message(data: bytes) -> bool:
    """decode_message on raw bytes: an accepted message encodes back to the same bytes."""
    try:
        decoded = decode_message(data)
    except CcoError as error:
        return refused(error)
    encoded = encode_message(decoded)
    assert encoded == data, f"{type(decoded).__name__} does not encode back to its input"
    assert decode_message(encoded) == decoded
    return True


@cache
def corpus() -> tuple[bytes, ...]:
    """Every catalogued valid message, encoded: the seeds the mutations start from."""
    return tuple(encode_message(sample.message) for sample in samples())


# Values a field mutation puts in place of a field: boundaries of every range the
# messages declare, every CBOR type, and containers of the wrong shape.
INTERESTING: tuple[cbor.CborValue, ...] = (
    0,
    1,
    -1,
    2,
    7,
    8,
    15,
    16,
    255,
    256,
    1023,
    1024,
    4096,
    65535,
    65536,
    (1 << 20),
    (1 << 20) + 1,
    (1 << 32) - 1,
    1 << 32,
    (1 << 40),
    (1 << 61) - 2,
    (1 << 61) - 1,
    (1 << 63),
    (1 << 64) - 1,
    -(1 << 64),
    b"",
    b"\x00",
    b"\x01",
    b"\x00" * 16,
    b"\xff" * 17,
    b"\x01\x00",
    "",
    "x",
    "\u20ac" * 86,
    True,
    False,
    None,
    [],
    [1],
    {},
    {1: 1},
)


def _mutate_value(draw: Draw, value: cbor.CborValue, depth: int) -> cbor.CborValue:
    """One structural mutation somewhere inside ``value``."""
    choice = draw.below(8)
    if isinstance(value, dict) and value and choice < 6 and depth < 6:
        keys = list(value)
        key = keys[draw.below(len(keys))]
        out = dict(value)
        if choice == 0:
            del out[key]
        elif choice == 1:
            out[draw.below(24)] = INTERESTING[draw.below(len(INTERESTING))]
        else:
            out[key] = _mutate_value(draw, value[key], depth + 1)
        return out
    if isinstance(value, list) and value and choice < 6 and depth < 6:
        index = draw.below(len(value))
        out_list = list(value)
        if choice == 0:
            del out_list[index]
        elif choice == 1:
            out_list.insert(index, out_list[index])
        else:
            out_list[index] = _mutate_value(draw, value[index], depth + 1)
        return out_list
    if isinstance(value, int) and not isinstance(value, bool) and choice < 4:
        return value + (draw.below(5) - 2)
    if isinstance(value, bytes) and value and choice < 4:
        at = draw.below(len(value))
        return value[:at] + bytes([value[at] ^ (1 << draw.below(8))]) + value[at + 1 :]
    return INTERESTING[draw.below(len(INTERESTING))]


def _mutate_bytes(draw: Draw, data: bytes) -> bytes:
    """A few byte-level mutations: flips, overwrites, inserts, deletes, truncation,
    a splice with another seed."""
    out = bytearray(data)
    for _ in range(1 + draw.below(4)):
        kind = draw.below(7)
        at = draw.below(len(out) + 1)
        if kind == 0 and out:
            out[at % len(out)] ^= 1 << draw.below(8)
        elif kind == 1 and out:
            out[at % len(out)] = draw.byte()
        elif kind == 2:
            out[at:at] = draw.take(1 + draw.below(8))
        elif kind == 3:
            del out[at : at + 1 + draw.below(8)]
        elif kind == 4:
            del out[at:]
        elif kind == 5:
            seeds = corpus()
            other = seeds[draw.below(len(seeds))]
            cut = draw.below(len(other) + 1)
            out[at:] = other[cut:]
        else:
            out[at:at] = bytes([0x18 + draw.below(8)])  # a long-form or reserved head
    return bytes(out)


def mutated_message(data: bytes) -> bool:
    """A catalogued message, mutated structurally (a field removed, added, changed)
    or byte by byte, then decoded."""
    draw = Draw(data)
    seeds = corpus()
    seed = seeds[draw.below(len(seeds))]
    if draw.below(2):
        raw = cbor.decode(seed)
        mutated = _mutate_value(draw, raw, 0)
        try:
            encoded = cbor.encode(mutated)
        except CcoError as error:  # a mutation the encoder itself refuses (out of CBOR's range)
            return refused(error)
    else:
        encoded = _mutate_bytes(draw, seed)
    return message(encoded)


def cbor_mutated(data: bytes) -> bool:
    """The CBOR decoder on byte-level mutations of valid messages (deep, well-formed
    prefixes reach the rules raw bytes seldom do)."""
    draw = Draw(data)
    seeds = corpus()
    return cbor_decode(_mutate_bytes(draw, seeds[draw.below(len(seeds))]))


# --- payloads: combine and verify ---------------------------------------------------

GROUP = bytes(range(16))
KEYS = derive_group_keys(b"\x5a" * 32, GROUP)
WORLD = 3
EVERYONE = frozenset(range(WORLD))


@dataclasses.dataclass(frozen=True)
class Scenario:
    """An honest chunk: every rank's contribution and their combination."""

    name: str
    contributions: tuple[ChunkMessage, ...]
    result: ChunkMessage
    values: np.ndarray  # the result's verified element integers
    own: tuple[int, np.ndarray] | None  # rank 0's values, for the ops checked by consistency


def _header(
    kind: Collective, op: ReduceOp, dtype: DType, total: int, chunk: int, **extra: object
) -> ChunkHeader:
    root = 0 if kind in (Collective.REDUCE, Collective.BROADCAST) else None
    return ChunkHeader(
        group_id=GROUP,
        epoch=3,
        op_id=11,
        kind=kind,
        op=op,
        dtype=dtype,
        total_elements=total,
        chunk_elements=chunk,
        chunk_index=0,
        root=root,
        **extra,  # type: ignore[arg-type]
    )


def _unscaled(name: str, kind: Collective, op: ReduceOp, dtype: DType, elements: int) -> Scenario:
    rng = np.random.default_rng(len(name))
    element = element_type(dtype)
    arrays = []
    for _ in range(WORLD):
        raw = rng.integers(-100, 100, elements)
        arrays.append(raw.astype(element.storage))
    wires = [encode_values(a, dtype, kind, op, WORLD) for a in arrays]
    total = wire_length(dtype, kind, elements)
    header = _header(kind, op, dtype, total, total)
    ranks = [0] if kind is Collective.BROADCAST else list(range(WORLD))
    parts = tuple(seal(KEYS, header, r, wires[r]) for r in ranks)
    result = combine(parts, Result)
    expected = frozenset(ranks)
    own = (0, wires[0]) if op in _CONSISTENCY else None
    values = open_verified(KEYS, result, expected, own)
    return Scenario(name, parts, result, values, own)


_CONSISTENCY = frozenset({ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR})


def _scaled(name: str, dtype: DType, elements: int, width: int) -> Scenario:
    rng = np.random.default_rng(7)
    element = element_type(dtype)
    block = 16
    limit = sum_limit(width, WORLD)
    inputs = [rng.normal(0, 10**r, elements).astype(element.storage) for r in range(WORLD)]
    proposals = [propose(x, element, block, limit) for x in inputs]
    agreed = np.min(np.stack(proposals), axis=0)
    header = _header(
        Collective.ALL_REDUCE,
        ReduceOp.SUM,
        dtype,
        elements,
        elements,
        width=width,
        block_elements=block,
        scales=agreed.astype("<i2").tobytes(),
    )
    parts = tuple(
        seal(
            KEYS,
            header,
            r,
            np.concatenate(
                [quantize(inputs[r], element, agreed, block, limit), attestations(proposals[r], agreed)]
            ),
        )
        for r in range(WORLD)
    )
    result = combine(parts, Result)
    return Scenario(name, parts, result, open_verified(KEYS, result, EVERYONE), None)


@cache
def scenarios() -> tuple[Scenario, ...]:
    """One honest chunk of each wire form and of each kind of check."""
    return (
        _unscaled("int32 sum", Collective.ALL_REDUCE, ReduceOp.SUM, DType.INT32, 24),
        _unscaled("int64 avg", Collective.ALL_REDUCE, ReduceOp.AVG, DType.INT64, 9),
        _unscaled("int8 reduce max", Collective.REDUCE, ReduceOp.MAX, DType.INT8, 17),
        _unscaled("int16 bor", Collective.ALL_REDUCE, ReduceOp.BOR, DType.INT16, 5),
        _unscaled("float32 min", Collective.ALL_REDUCE, ReduceOp.MIN, DType.FLOAT32, 12),
        _unscaled("float64 broadcast", Collective.BROADCAST, ReduceOp.SUM, DType.FLOAT64, 6),
        _unscaled("bfloat16 all_gather", Collective.ALL_GATHER, ReduceOp.SUM, DType.BFLOAT16, 8),
        _scaled("float32 block-scaled", DType.FLOAT32, 40, 4),
        _scaled("float16 block-scaled", DType.FLOAT16, 20, 2),
    )


def _tampered(draw: Draw, honest: ChunkMessage) -> ChunkMessage | None:
    """The honest chunk after a field-level or byte-level mutation; None if the result
    does not decode to a chunk message."""
    seed = encode_message(honest)
    if draw.below(2):
        raw = cbor.decode(seed)
        try:
            encoded = cbor.encode(_mutate_value(draw, raw, 0))
        except CcoError as error:
            refused(error)
            return None
    else:
        encoded = _mutate_bytes(draw, seed)
    try:
        decoded = decode_message(encoded)
    except CcoError as error:
        refused(error)
        return None
    return decoded if isinstance(decoded, ChunkMessage) else None


def _accepted_as_honest(tampered: ChunkMessage, values: np.ndarray, chosen: Scenario) -> None:
    """What open_verified accepted after the endpoint's own header check: for tagged
    (SUM, AVG) chunks it is the honest chunk; untagged ones (MIN, MAX, bitwise,
    moved data) are checked hop by hop and against the rank's own values only, which
    open_verified did."""
    if chosen.result.tag is None:
        return
    assert tampered.contributors == chosen.result.contributors, "a mutated bitmap verified"
    assert np.array_equal(values, chosen.values), "a mutated chunk verified with other integers"


def _endpoint_refuses(tampered: ChunkMessage, chosen: Scenario) -> bool:
    """The check an endpoint makes before open_verified (cco.nodes.endpoint): a chunk
    whose type or header is not the operation's is refused (OPERATION_MISMATCH)."""
    honest = chosen.result
    return type(tampered) is not type(honest) or ChunkHeader.of(tampered) != ChunkHeader.of(honest)


def verify(data: bytes) -> bool:
    """open_verified on a mutated honest Result: it refuses with a typed error, or what
    it accepts is the honest chunk: no mutation forges a tagged result."""
    draw = Draw(data)
    chosen = scenarios()[draw.below(len(scenarios()))]
    tampered = _tampered(draw, chosen.result)
    if tampered is None:
        return False
    expected = frozenset(ranks_from_bitmap(chosen.result.contributors))
    try:
        values = open_verified(KEYS, tampered, expected, chosen.own)
    except CcoError as error:
        return refused(error)
    if _endpoint_refuses(tampered, chosen):
        return False
    _accepted_as_honest(tampered, values, chosen)
    return True


def combine_and_verify(data: bytes) -> bool:
    """An aggregator's path fed a mutated contribution (check_part, check_encoding,
    combine), then the endpoint's open_verified on what combine built: typed errors
    only, and nothing tagged that verifies differs from the honest result."""
    draw = Draw(data)
    chosen = scenarios()[draw.below(len(scenarios()))]
    parts = list(chosen.contributions)
    victim = draw.below(len(parts))
    tampered = _tampered(draw, parts[victim])
    if tampered is None:
        return False
    parts[victim] = tampered
    try:
        check_part(tampered)
        check_encoding(tampered)
    except CcoError as error:
        refused(error)  # an honest aggregator refuses the part here; combine is fed it anyway
    try:
        combined = combine(parts[::-1] if draw.below(2) else parts, Result)
    except CcoError as error:
        return refused(error)
    expected = frozenset(ranks_from_bitmap(chosen.result.contributors))
    try:
        values = open_verified(KEYS, combined, expected, chosen.own)
    except CcoError as error:
        return refused(error)
    if _endpoint_refuses(combined, chosen):
        return False
    _accepted_as_honest(combined, values, chosen)
    return True


# --- decoding verified integers to tensors ------------------------------------------

_KINDS = list(Collective)
_OPS = list(ReduceOp)
_DTYPES = list(DType)


def tensor_decoders(data: bytes) -> bool:
    """What an endpoint does with verified integers: decode_values (every form), the
    Reassembler (chunk placement and duplicates) and block-scale dequantize, on
    integers of any value: typed errors only (OVERFLOW, INVALID_FIELD, ...)."""
    draw = Draw(data)
    kind, op, dtype = (
        _KINDS[draw.below(len(_KINDS))],
        _OPS[draw.below(len(_OPS))],
        _DTYPES[draw.below(len(_DTYPES))],
    )
    width = 1 << draw.below(4)
    count = draw.below(5)
    exact = bool(draw.below(2))
    raw = draw.take(width * draw.below(12))
    values = unpack(raw[: len(raw) // width * width], width).astype(np.int64)
    if draw.below(4) == 0:  # integers at the ends of int64
        values = values * (1 << 56) if len(values) else values
    accepted = False
    try:
        decode_values(values, dtype, kind, op, count, exact)
        accepted = True
    except CcoError as error:
        refused(error)
    element = element_type(dtype)
    if element.is_float:
        raw_scales = draw.take(2 * draw.below(4))
        scales = unpack(raw_scales[: len(raw_scales) // 2 * 2], 2)
        block = 16 + draw.below(4)
        try:
            if len(values) <= len(scales) * block:
                dequantize(values, scales, block, max(count, 1), element)
        except CcoError as error:
            refused(error)
    try:
        shape = (draw.below(20),)
        chunk = 1 + draw.below(8)
        assembler = Reassembler(dtype, kind, op, shape, chunk)
        for _ in range(3):
            assembler.add(draw.below(6), values[: draw.below(len(values) + 1)], count)
    except CcoError as error:
        refused(error)
    return accepted


TARGETS: dict[str, Target] = {
    "cbor": cbor_decode,
    "cbor_mutated": cbor_mutated,
    "frames": frames,
    "varint": varint,
    "message": message,
    "mutated_message": mutated_message,
    "verify": verify,
    "combine_and_verify": combine_and_verify,
    "tensor_decoders": tensor_decoders,
}
"""Every target by name (the atheris runner's --target)."""
