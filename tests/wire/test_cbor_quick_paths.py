"""The quick paths of the CBOR codec agree with the strict ones (cco/wire/cbor.py).

Decoding first asks cbor2's C decoder and keeps its value only if the value is in
the CCO subset, within the limits, and encodes back to exactly the input; encoding
hands a value already in deterministic form straight to cbor2.  Neither may ever
accept what the strict reader refuses, return another value, or take work beyond
the input's size.  cbor2 understands much more than CCO allows (tags, bignums,
shared and string references, floats, undefined), so those are fed on purpose.
"""

from __future__ import annotations

import time

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import any_message

from cco.wire import cbor
from cco.wire.errors import DecodeError
from cco.wire.messages import encode_message

keys = st.one_of(st.integers(-(2**64), 2**64 - 1), st.text(max_size=30))
scalars = st.one_of(
    st.integers(-(2**64), 2**64 - 1),
    st.binary(max_size=40),
    st.text(max_size=40),
    st.booleans(),
    st.none(),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.dictionaries(keys, inner, max_size=6)),
    max_leaves=40,
)


def strictly(data: bytes, limits: cbor.DecodeLimits = cbor.DEFAULT_LIMITS) -> object:
    """The strict reader's verdict: the value, or the DecodeError."""
    try:
        return cbor._decode_strictly(data, limits)
    except DecodeError as exc:
        return exc


def assert_agrees(data: bytes, limits: cbor.DecodeLimits = cbor.DEFAULT_LIMITS) -> object:
    """The quick path either declines or returns exactly what the strict reader does."""
    quick = cbor._decode_quickly(data, limits)
    if quick is not cbor._NOT_QUICK:
        strict = strictly(data, limits)
        assert not isinstance(strict, DecodeError), f"quick accepted {data.hex()}, strict: {strict}"
        assert quick == strict and _shape(quick) == _shape(strict)
    return quick


def _shape(value: object) -> object:
    """``value`` with every type spelled out (True == 1 in Python, not in CBOR)."""
    if isinstance(value, list):
        return [_shape(item) for item in value]
    if isinstance(value, dict):
        return [(type(k).__name__, k, _shape(v)) for k, v in value.items()]
    return (type(value).__name__, value)


@given(values)
@settings(max_examples=300)
def test_every_deterministic_encoding_is_read_quickly_and_identically(value: cbor.CborValue) -> None:
    data = cbor.encode(value)
    assert cbor._decode_quickly(data, cbor.DEFAULT_LIMITS) is not cbor._NOT_QUICK
    assert assert_agrees(data) == value


@given(values)
@settings(max_examples=300)
def test_the_quick_encoder_writes_what_the_general_one_does(value: cbor.CborValue) -> None:
    assert cbor.encode(value) == cbor2.dumps(cbor._deterministic(value, 0))


@given(any_message)
@settings(max_examples=200)
def test_every_message_is_read_quickly(message: object) -> None:
    data = encode_message(message)  # type: ignore[arg-type]
    quick = cbor._decode_quickly(data, cbor.DEFAULT_LIMITS)
    assert (quick is not cbor._NOT_QUICK) == (len(data) <= cbor._QUICK_MAX_BYTES)
    assert_agrees(data)


@given(values, st.data())
@settings(max_examples=400)
def test_mutated_encodings_never_pass_quickly_where_strict_refuses(
    value: cbor.CborValue, data: st.DataObject
) -> None:
    encoded = bytearray(cbor.encode(value))
    for _ in range(data.draw(st.integers(1, 3))):
        position = data.draw(st.integers(0, len(encoded)))
        action = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if action == "flip" and position < len(encoded):
            encoded[position] = data.draw(st.integers(0, 255))
        elif action == "insert":
            encoded[position:position] = bytes([data.draw(st.integers(0, 255))])
        elif position < len(encoded):
            del encoded[position]
    assert_agrees(bytes(encoded))


@given(st.binary(max_size=64))
@settings(max_examples=400)
def test_arbitrary_bytes_never_pass_quickly_where_strict_refuses(data: bytes) -> None:
    assert_agrees(data)


@pytest.mark.parametrize(
    "hex_input",
    [
        "c249010000000000000000",  # tag 2: 2^64 as a bignum, beyond CBOR's integer range
        "c349010000000000000000",  # tag 3: -(2^64) - 1
        "c24101",  # tag 2: 1, which cbor2 reads as the int 1
        "a1c2490100000000000000000000",  # {2^64: 0}, the key a bignum
        "d9d9f7a10102",  # self-described CBOR (tag 55799) around {1: 2}
        "d81c81d81d00",  # shared reference (tags 28, 29): a list holding itself
        "d9010082636162636378797ad81900",  # string references (tags 256, 25)
        "f93c00",  # half-precision 1.0
        "fa3f800000",  # single-precision 1.0
        "f7",  # undefined
        "f0",  # simple(16)
        "9f01ff",  # indefinite-length array
        "bf0102ff",  # indefinite-length map
        "5f4101ff",  # indefinite-length byte string
        "a201020103",  # repeated key: cbor2 keeps the last
        "a202010102",  # keys out of order
        "a1f50102",  # key true
        "a2200101f5",  # keys -1, 1: -1 encodes after 1
        "a2616100616200",  # keys "a" < "b": in order (accepted by both)
        "a2616200616100",  # keys "b", "a": out of order
        "1817",  # 23 in two bytes
        "0101",  # trailing byte
        "63ed9fbf",  # text with an encoded surrogate (invalid UTF-8)
    ],
)
def test_what_cbor2_reads_but_ccos_subset_does_not_allow_goes_to_the_strict_reader(hex_input: str) -> None:
    data = bytes.fromhex(hex_input)
    quick = assert_agrees(data)
    strict = strictly(data)
    if isinstance(strict, DecodeError):
        assert quick is cbor._NOT_QUICK
        with pytest.raises(DecodeError) as info:
            cbor.decode(data)
        assert info.value.code == strict.code


def test_shared_references_cannot_multiply_the_work() -> None:
    """[L0, L1, ..., L40] where L0 = [0] and each Lk = [Lk-1, Lk-1] by shared
    reference: 2^40 leaves from about 300 bytes, if anything walked them all."""
    levels = [bytes.fromhex("d81c8100")]  # L0, shared index 0
    for k in range(1, 41):
        reference = bytes.fromhex("d81d") + cbor2.dumps(k - 1)
        levels.append(bytes.fromhex("d81c82") + reference + reference)
    data = bytes.fromhex("9829") + b"".join(levels)
    assert len(cbor2.loads(data)) == 41  # cbor2 builds it: the walk must stop itself
    start = time.process_time()
    assert assert_agrees(data) is cbor._NOT_QUICK
    assert time.process_time() - start < 5  # walking 2^40 items would not end


@pytest.mark.parametrize(
    ("limits", "value"),
    [
        (cbor.DecodeLimits(max_depth=2), [[[0]]]),
        (cbor.DecodeLimits(max_container_items=3), [0, 1, 2, 3]),
        (cbor.DecodeLimits(max_container_items=1), {0: 1, 2: 3}),
        (cbor.DecodeLimits(max_string_bytes=3), b"abcd"),
    ],
)
def test_limits_hold_on_the_quick_path(limits: cbor.DecodeLimits, value: cbor.CborValue) -> None:
    data = cbor.encode(value)
    assert cbor._decode_quickly(data, limits) is cbor._NOT_QUICK
    with pytest.raises(DecodeError):
        cbor.decode(data, limits)


def test_long_inputs_go_to_the_strict_reader_and_decode_the_same() -> None:
    """Above 32 KiB cbor2 reads byte strings in pieces and is the slower of the two."""
    value = {1: b"x" * cbor._QUICK_MAX_BYTES, 2: [True, None, "t"]}
    data = cbor.encode(value)
    assert len(data) > cbor._QUICK_MAX_BYTES
    assert cbor._decode_quickly(data, cbor.DEFAULT_LIMITS) is cbor._NOT_QUICK
    assert cbor.decode(data) == value
