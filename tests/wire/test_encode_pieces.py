"""Encoding in pieces (cco.wire.cbor.encode_in_order_pieces, messages.encode_message_pieces):
the pieces joined are exactly the one deterministic encoding, and every large byte
string is a piece of its own, the very object given (a sender hands it to QUIC
without copying it into an encoded message)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import any_message

from cco.wire import cbor
from cco.wire.messages import ChunkMessage, Message, encode_message, encode_message_pieces

keys = st.one_of(st.integers(0, 2**64 - 1), st.integers(-(2**64), -1), st.text(max_size=8))
byte_strings = st.one_of(st.binary(max_size=40), st.sampled_from([23, 24, 255, 256, 300]).map(bytes))
scalars = st.one_of(
    st.integers(-(2**64), 2**64 - 1), byte_strings, st.text(max_size=10), st.booleans(), st.none()
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=30), st.dictionaries(keys, inner, max_size=30)),
    max_leaves=60,
)
larges = st.sampled_from([2, 24, 25, 256, 1 << 20])  # 0 and 1 byte strings are shared objects


def in_order(value: cbor.CborValue) -> cbor.CborValue:
    """``value`` with every map in the key order encode_in_order expects."""
    return cbor.decode(cbor.encode(value))


def large_strings(value: object, large: int) -> list[bytes]:
    if isinstance(value, bytes):
        return [value] if len(value) >= large else []
    if isinstance(value, list):
        return [found for item in value for found in large_strings(item, large)]
    if isinstance(value, dict):
        return [found for item in value.values() for found in large_strings(item, large)]
    return []


def check_pieces(value: cbor.CborValue, pieces: list[bytes], large: int, expected: bytes) -> None:
    assert b"".join(pieces) == expected
    own = [piece for piece in pieces if any(piece is s for s in large_strings(value, large))]
    assert [id(piece) for piece in own] == [id(s) for s in large_strings(value, large)]
    for before, after in itertools.pairwise(pieces):
        assert len(before) >= large or len(after) >= large, "two small pieces left unjoined"


@settings(max_examples=300, deadline=None)
@given(values, larges)
def test_pieces_join_to_the_deterministic_encoding(value: cbor.CborValue, large: int) -> None:
    ordered = in_order(value)
    check_pieces(ordered, cbor.encode_in_order_pieces(ordered, large), large, cbor.encode(value))


def test_heads_of_every_size_class() -> None:
    """Lengths and counts whose heads take 1, 2, 3 and 5 bytes, before and after a
    large string, in an array and in a map."""
    big = bytes(70_000)
    for count in (0, 23, 24, 255, 256, 65_536):
        ordered: cbor.CborValue = {
            0: list(range(count)),
            1: bytes(count),
            2: big,
            3: [big, *range(count)],
            **{key: key for key in range(4, 4 + count % 40)},
        }
        for large in (24, 256, 65_536):
            check_pieces(ordered, cbor.encode_in_order_pieces(ordered, large), large, cbor.encode(ordered))


@settings(max_examples=200, deadline=None)
@given(any_message, st.sampled_from([1, 16, 1024, 16 * 1024]))
def test_message_pieces_join_to_the_message(message: Message, large: int) -> None:
    pieces = encode_message_pieces(message, large)
    assert b"".join(pieces) == encode_message(message)
    if isinstance(message, ChunkMessage) and len(message.payload) >= large:
        assert any(piece is message.payload for piece in pieces)  # not copied
    else:
        assert len(pieces) == 1
