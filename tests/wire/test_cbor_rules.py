"""Every rule the strict CBOR codec (cco/wire/cbor.py) enforces, one test per rule.

The draft's "Encoding" section allows one encoding per message: core deterministic
CBOR (RFC 8949, section 4.2.1) over a small subset.  Each test below feeds the
decoder (or the encoder) an input that only that rule refuses, and where a rule has
a boundary, the value just inside it too, so removing or loosening any one check
makes a test here fail.  Inputs are hand-written hex, so the expected bytes do not
come from the code under test.
"""

from __future__ import annotations

from typing import Any

import pytest

from cco.wire import cbor
from cco.wire.errors import DecodeError, EncodeError, ErrorCode
from cco.wire.messages import Heartbeat, decode_message


def refused(hex_input: str, limits: cbor.DecodeLimits = cbor.DEFAULT_LIMITS) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        cbor.decode(bytes.fromhex(hex_input), limits)
    return info.value


# --- map keys --------------------------------------------------------------------


@pytest.mark.parametrize(
    "hex_input",
    [
        "a1410000",  # key h'00' (byte string)
        "a1810000",  # key [0] (array)
        "a1a00000",  # key {} (map)
        "a1f400",  # key false
        "a1f500",  # key true
        "a1f600",  # key null
    ],
)
def test_map_key_that_is_not_an_integer_or_text_is_refused(hex_input: str) -> None:
    error = refused(hex_input)
    assert error.code is ErrorCode.MALFORMED_CBOR
    assert "not int or text" in error.detail


@pytest.mark.parametrize(
    ("hex_input", "value"),
    [
        ("a10000", {0: 0}),
        ("a12000", {-1: 0}),  # a negative key is valid CBOR; messages refuse it (below)
        ("a1616100", {"a": 0}),
        ("a318180020006161f5", {24: 0, -1: 0, "a": True}),  # bytewise order of encodings
        ("a2616100626161f6", {"a": 0, "aa": None}),
    ],
)
def test_integer_and_text_keys_in_bytewise_order_are_accepted(hex_input: str, value: object) -> None:
    assert cbor.decode(bytes.fromhex(hex_input)) == value


@pytest.mark.parametrize(
    "hex_input",
    [
        "a202000100",  # 2 then 1
        "a220001818",  # -1 (0x20) before 24 (0x18 0x18)
        "a2626161006161f6",  # "aa" before "a"
        "a2616100010000",  # text before int
    ],
)
def test_map_keys_out_of_bytewise_order_are_refused(hex_input: str) -> None:
    assert refused(hex_input).code is ErrorCode.NON_DETERMINISTIC_ENCODING


@pytest.mark.parametrize("hex_input", ["a201000101", "a2616100616101"])
def test_repeated_map_key_is_refused(hex_input: str) -> None:
    assert refused(hex_input).code is ErrorCode.DUPLICATE_MAP_KEY


@pytest.mark.parametrize(
    ("body_hex", "code"),
    [
        ("a1616101", ErrorCode.UNKNOWN_FIELD),  # Heartbeat {"a": 1}
        ("a12001", ErrorCode.UNKNOWN_FIELD),  # Heartbeat {-1: 1}
        ("a1410101", ErrorCode.MALFORMED_CBOR),  # Heartbeat {h'01': 1}
    ],
)
def test_message_body_keys_are_small_unsigned_integers(body_hex: str, code: ErrorCode) -> None:
    """A message body is a map keyed by the small unsigned integers its type defines."""
    heartbeat = f"82{int(Heartbeat.TYPE):02x}"
    assert decode_message(bytes.fromhex(heartbeat + "a10107")) == Heartbeat(seq=7)
    with pytest.raises(DecodeError) as info:
        decode_message(bytes.fromhex(heartbeat + body_hex))
    assert info.value.code is code


# --- integers and lengths: shortest form -------------------------------------------


@pytest.mark.parametrize(
    ("hex_input", "value"),
    [
        ("17", 23),
        ("1818", 24),
        ("18ff", 255),
        ("190100", 256),
        ("19ffff", 65535),
        ("1a00010000", 65536),
        ("1affffffff", (1 << 32) - 1),
        ("1b0000000100000000", 1 << 32),
        ("1bffffffffffffffff", (1 << 64) - 1),
        ("20", -1),
        ("3818", -25),
        ("3bffffffffffffffff", -(1 << 64)),
    ],
)
def test_shortest_arguments_decode(hex_input: str, value: int) -> None:
    assert cbor.decode(bytes.fromhex(hex_input)) == value


@pytest.mark.parametrize(
    "hex_input",
    [
        "1800",  # 0 in one extra byte
        "1817",  # 23 in one extra byte
        "1900ff",  # 255 in two bytes
        "1a0000ffff",  # 65535 in four bytes
        "1b00000000ffffffff",  # 2^32 - 1 in eight bytes
        "3817",  # -24 in one extra byte
        "5800",  # empty byte string, length in one extra byte
        "780161",  # one-character text, length in one extra byte
        "980100",  # one-item array, count in one extra byte
        "b8010000",  # one-entry map, count in one extra byte
    ],
)
def test_non_shortest_argument_is_refused(hex_input: str) -> None:
    assert refused(hex_input).code is ErrorCode.NON_DETERMINISTIC_ENCODING


@pytest.mark.parametrize(
    ("hex_input", "what"),
    [
        ("5f", "indefinite"),  # indefinite-length byte string
        ("9f", "indefinite"),  # indefinite-length array
        ("ff", "indefinite"),  # break
        ("1c", "reserved"),
        ("1d", "reserved"),
        ("1e", "reserved"),
    ],
)
def test_indefinite_lengths_and_reserved_additional_info_are_refused(hex_input: str, what: str) -> None:
    error = refused(hex_input)
    assert error.code is ErrorCode.MALFORMED_CBOR and what in error.detail


# --- types outside the subset ----------------------------------------------------


@pytest.mark.parametrize(
    "hex_input", ["c100", "d818f6", "f93c00", "f90001", "fa3f800000", "fb3ff0000000000000"]
)
def test_tags_and_floats_are_refused(hex_input: str) -> None:
    assert refused(hex_input).code is ErrorCode.MALFORMED_CBOR


@pytest.mark.parametrize(
    "hex_input",
    [
        "e0",
        "f3",
        "f7",
        "f810",
        "f814",
        "f815",
        "f816",
        "f820",
        "f8ff",
    ],  # f814..f816: false/true/null, long form
)
def test_simple_values_other_than_false_true_null_are_refused(hex_input: str) -> None:
    assert refused(hex_input).code is ErrorCode.MALFORMED_CBOR


@pytest.mark.parametrize("hex_input", ["c100", "d818f6", "c0f6"])
def test_tag_is_named_as_such(hex_input: str) -> None:
    assert "tag" in refused(hex_input).detail


def test_false_true_null_bytes_and_text_decode() -> None:
    assert cbor.decode(bytes.fromhex("83f4f5f6")) == [False, True, None]
    assert cbor.decode(bytes.fromhex("4201ff")) == b"\x01\xff"
    assert cbor.decode(bytearray.fromhex("62c3a9")) == "\u00e9"
    assert cbor.decode(memoryview(bytes.fromhex("40"))) == b""


def test_invalid_utf8_text_is_refused() -> None:
    assert refused("62c328").code is ErrorCode.MALFORMED_CBOR


# --- lengths against the bytes present, and limits --------------------------------


@pytest.mark.parametrize(
    ("hex_input", "what"),
    [
        ("", "item head"),
        ("19", "item argument"),  # a two-byte argument, no bytes
        ("1901", "item argument"),  # a two-byte argument, one byte
        ("4301", "string body"),  # three bytes claimed, one present
        ("83", "container items"),  # three items claimed, none present
        ("a20000", "container items"),  # two entries need at least four bytes
    ],
)
def test_claims_beyond_the_input_are_refused_before_reading(hex_input: str, what: str) -> None:
    error = refused(hex_input)
    assert error.code is ErrorCode.MALFORMED_CBOR and what in error.detail


def test_trailing_bytes_are_refused() -> None:
    assert cbor.decode(bytes.fromhex("01")) == 1
    assert refused("0100").code is ErrorCode.TRAILING_BYTES


def test_string_limit_is_inclusive() -> None:
    limits = cbor.DecodeLimits(max_string_bytes=2)
    assert cbor.decode(bytes.fromhex("420102"), limits) == b"\x01\x02"
    assert cbor.decode(bytes.fromhex("626162"), limits) == "ab"
    assert refused("43010203", limits).code is ErrorCode.MESSAGE_TOO_LARGE
    assert refused("63616263", limits).code is ErrorCode.MESSAGE_TOO_LARGE


def test_container_limit_is_inclusive_for_arrays_and_maps() -> None:
    limits = cbor.DecodeLimits(max_container_items=2)
    assert cbor.decode(bytes.fromhex("820102"), limits) == [1, 2]
    assert cbor.decode(bytes.fromhex("a201010202"), limits) == {1: 1, 2: 2}
    assert refused("83010203", limits).code is ErrorCode.MESSAGE_TOO_LARGE
    assert refused("a3010102020303", limits).code is ErrorCode.MESSAGE_TOO_LARGE


def test_default_limits_are_the_drafts() -> None:
    """Draft section "Limits": nesting depth 16 below the top-level item, 65536 elements
    or pairs per container, strings up to 64 MiB.  A claim just at a limit passes the
    limit check and then fails for want of bytes (MALFORMED_CBOR); one above fails the
    limit check itself (MESSAGE_TOO_LARGE), so nothing that large is ever allocated."""
    assert cbor.decode(bytes.fromhex("81" * 16 + "00")) is not None
    assert refused("81" * 17 + "00").code is ErrorCode.MESSAGE_TOO_LARGE
    for at_limit, above in [
        ("9a00010000", "9a00010001"),  # array of 65536 / 65537 elements
        ("ba00010000", "ba00010001"),  # map of 65536 / 65537 pairs
        ("5a04000000", "5a04000001"),  # byte string of 64 MiB / 64 MiB + 1
        ("7a04000000", "7a04000001"),  # text string of 64 MiB / 64 MiB + 1
    ]:
        assert refused(at_limit).code is ErrorCode.MALFORMED_CBOR, at_limit
        assert refused(above).code is ErrorCode.MESSAGE_TOO_LARGE, above


def test_depth_limit_is_inclusive() -> None:
    limits = cbor.DecodeLimits(max_depth=3)
    assert cbor.decode(bytes.fromhex("81818100"), limits) == [[[0]]]  # the 0 is at depth 3
    assert refused("8181818100", limits).code is ErrorCode.MESSAGE_TOO_LARGE
    assert cbor.decode(bytes.fromhex("a101a101a10100"), limits) == {1: {1: {1: 0}}}  # keys count too
    assert refused("a101a101a10100", cbor.DecodeLimits(max_depth=2)).code is ErrorCode.MESSAGE_TOO_LARGE
    # A key is one level down, like a value, and depth is checked before the key's type.
    assert refused("a1818100f6", limits).code is ErrorCode.MALFORMED_CBOR  # key [[0]]: depth 3
    assert refused("a181818100f6", limits).code is ErrorCode.MESSAGE_TOO_LARGE  # key [[[0]]]: depth 4


# --- the encoder ---------------------------------------------------------------------


def test_encoder_writes_maps_in_bytewise_key_order() -> None:
    assert cbor.encode({"a": True, -1: 0, 24: 0}).hex() == "a318180020006161f5"
    assert cbor.encode({"aa": None, "a": 0}).hex() == "a2616100626161f6"
    assert cbor.encode({2: [1, {1: b""}], 1: "x"}).hex() == "a2016178028201a10140"


@pytest.mark.parametrize(
    ("value", "hex_output"),
    [((1 << 64) - 1, "1bffffffffffffffff"), (-(1 << 64), "3bffffffffffffffff"), (-1, "20")],
)
def test_encoder_accepts_the_whole_integer_range(value: int, hex_output: str) -> None:
    assert cbor.encode(value).hex() == hex_output


@pytest.mark.parametrize(
    "value",
    [
        1 << 64,
        -(1 << 64) - 1,
        1.5,
        (1, 2),
        {b"k": 1},
        {True: 1},
        {None: 1},
        {1: 1.0},
        [bytearray(b"x")],
    ],
)
def test_encoder_refuses_values_outside_the_subset(value: object) -> None:
    with pytest.raises(EncodeError) as info:
        cbor.encode(value)  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.INVALID_FIELD


@pytest.mark.parametrize("wrap", [lambda inner: [inner], lambda inner: {1: inner}], ids=["array", "map"])
def test_encoder_depth_limit(wrap: Any) -> None:
    nested: Any = 0
    for _ in range(cbor.DEFAULT_LIMITS.max_depth):
        nested = wrap(nested)
    assert cbor.decode(cbor.encode(nested)) == nested
    with pytest.raises(EncodeError):
        cbor.encode(wrap(nested))
