"""Decoding from pieces (cco.wire.cbor.decode_pieces) gives exactly what decoding the
joined input gives: the same value, or the same DecodeError (code and detail, with
offsets into the whole input), wherever the input is cut.  A byte string that spans
pieces is joined once, into the bytes returned."""

from __future__ import annotations

import itertools

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

from cco.wire import cbor
from cco.wire.errors import DecodeError

LARGE = 40_000  # above the quick path's limit: these go to the reader of pieces

keys = st.one_of(st.integers(0, 2**64 - 1), st.integers(-(2**64), -1), st.text(max_size=8))
scalars = st.one_of(
    st.integers(-(2**64), 2**64 - 1),
    st.binary(max_size=40),
    st.text(max_size=10),
    st.booleans(),
    st.none(),
    st.integers(LARGE, LARGE + 5000).map(lambda n: bytes(range(256)) * (n // 256)),
    st.integers(LARGE, LARGE + 100).map(lambda n: "é" * n),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=8), st.dictionaries(keys, inner, max_size=8)),
    max_leaves=20,
)


def verdict(decode: object, data: object) -> object:
    try:
        return decode(data)  # type: ignore[operator]
    except DecodeError as exc:
        return (exc.code, exc.detail)


def cut(data: bytes, points: list[int]) -> list[bytes | memoryview]:
    """``data`` in pieces at ``points`` (some of them empty), bytes and views alike."""
    bounds = [0, *sorted(p % (len(data) + 1) for p in points), len(data)]
    view = memoryview(data)
    return [data[a:b] if i % 2 else view[a:b] for i, (a, b) in enumerate(itertools.pairwise(bounds))]


def assert_same(data: bytes, points: list[int]) -> None:
    whole = verdict(cbor.decode, data)
    pieces = verdict(cbor.decode_pieces, cut(data, points))
    assert pieces == whole
    assert type(pieces) is type(whole)


@settings(max_examples=150, deadline=None)
@given(values, st.lists(st.integers(0, 1 << 20), max_size=40))
def test_values_in_any_pieces(value: cbor.CborValue, points: list[int]) -> None:
    assert_same(cbor.encode(value), points)


@settings(max_examples=300, deadline=None)
@given(values, st.lists(st.integers(0, 1 << 20), max_size=12), st.data())
def test_damaged_inputs_fail_alike(value: cbor.CborValue, points: list[int], data: st.DataObject) -> None:
    """Cut short, lengthened, or with a byte changed: the same error at the same offset."""
    encoded = cbor.encode([value, bytes(LARGE)])  # large enough for the reader of pieces
    damage = data.draw(st.sampled_from(["truncate", "trail", "flip"]))
    where = data.draw(st.integers(0, len(encoded) - 1))
    if damage == "truncate":
        encoded = encoded[:where]
    elif damage == "trail":
        encoded += bytes([where % 256])
    else:
        encoded = encoded[:where] + bytes([data.draw(st.integers(0, 255))]) + encoded[where + 1 :]
    assert_same(encoded, points)


def test_hostile_forms_fail_alike_across_pieces() -> None:
    """Forms the strict reader refuses, placed after a large string so that they
    straddle pieces: a non-shortest head, an indefinite length, a tag, a float,
    keys out of order or repeated, a claim longer than the input."""
    big = cbor2.dumps(bytes(LARGE))
    tails = [
        b"\x18\x05",  # 5 in two bytes
        b"\x5f\x41\x00\xff",  # indefinite byte string
        b"\xc1\x00",  # tag 1
        b"\xf9\x3c\x00",  # half float
        b"\xa2\x02\x00\x01\x00",  # keys 2, 1
        b"\xa2\x01\x00\x01\x00",  # key 1 twice
        b"\x5a\xff\xff\xff\xf0",  # a string of 4 GiB
        b"\x9a\x00\x01\x00\x00",  # 65536 items promised
    ]
    for tail in tails:
        encoded = b"\x82" + big + tail
        for point in range(len(big) - 3, len(encoded) + 1):
            assert_same(encoded, [point])
            assert_same(encoded, [point, point + 1, 7])


def test_a_string_across_pieces_is_joined_into_the_bytes_returned() -> None:
    payload = bytes(range(256)) * 200
    encoded = cbor.encode({13: payload, 14: 7})
    value = cbor.decode_pieces(cut(encoded, [100, 30_000]))
    assert isinstance(value, dict) and type(value[13]) is bytes and value == {13: payload, 14: 7}
