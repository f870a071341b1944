"""Properties and edge cases of the CBOR codec, the message codec and the framing.

The issue asks for: decode(encode(m)) == m for every message type; decoding arbitrary
bytes raises only the codec's typed error; encoding is deterministic.  The strict
decoding rules of the draft's "Encoding" section are checked one by one below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import cast

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import ALL_MESSAGE_CLASSES, any_message, message_strategy

from cco.wire import cbor
from cco.wire.errors import DecodeError, EncodeError, ErrorCode
from cco.wire.fields import Bitmap, Bytes
from cco.wire.framing import FrameDecoder, decode_varint, encode_frame, encode_varint, frame_prefix
from cco.wire.messages import (
    Contribution,
    GroupParams,
    Heartbeat,
    Message,
    NodeRef,
    Result,
    decode_message,
    encode_message,
)
from cco.wire.registries import Collective, DType, MessageType, ReduceOp

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- message round trips -----------------------------------------------------------


@pytest.mark.parametrize("cls", ALL_MESSAGE_CLASSES, ids=lambda c: c.__name__)
def test_every_message_type_round_trips(cls: type[Message]) -> None:
    @SETTINGS
    @given(message_strategy(cls))
    def check(message: Message) -> None:
        encoded = encode_message(message)
        decoded = decode_message(encoded)
        assert decoded == message
        assert type(decoded) is cls
        # Deterministic: the same message always has the same bytes, and re-encoding
        # the decoded message reproduces them exactly.
        assert encode_message(decoded) == encoded

    check()


@SETTINGS
@given(any_message)
def test_encoding_is_core_deterministic(message: Message) -> None:
    encoded = encode_message(message)
    # An independent decoder sees the same structure...
    generic = cbor2.loads(encoded)
    assert generic[0] == int(message.TYPE)
    # ...and every map in it is in bytewise order of encoded keys with shortest forms,
    # which our strict decoder enforces: decoding succeeds iff the encoding is canonical.
    assert cbor.decode(encoded) == generic


# --- hostile input -----------------------------------------------------------------


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_decode_error(data: bytes) -> None:
    try:
        decode_message(data)
    except DecodeError as exc:
        assert isinstance(exc.code, ErrorCode)


@SETTINGS
@given(any_message, st.data())
def test_mutated_messages_raise_only_decode_error(message: Message, data: st.DataObject) -> None:
    encoded = bytearray(encode_message(message))
    position = data.draw(st.integers(0, len(encoded) - 1))
    encoded[position] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(0, len(encoded)))
    for candidate in (bytes(encoded), bytes(encoded[:cut])):
        try:
            decoded = decode_message(candidate)
        except DecodeError:
            continue
        # A mutation may land on another valid message; then it must be canonical.
        assert encode_message(decoded) == candidate


@pytest.mark.parametrize(
    ("hex_input", "code"),
    [
        ("", ErrorCode.MALFORMED_CBOR),  # nothing at all
        ("5f4101ff", ErrorCode.MALFORMED_CBOR),  # indefinite-length byte string
        ("9f01ff", ErrorCode.MALFORMED_CBOR),  # indefinite-length array
        ("bf0101ff", ErrorCode.MALFORMED_CBOR),  # indefinite-length map
        ("c101", ErrorCode.MALFORMED_CBOR),  # tag
        ("f93c00", ErrorCode.MALFORMED_CBOR),  # half float
        ("f7", ErrorCode.MALFORMED_CBOR),  # undefined
        ("f0", ErrorCode.MALFORMED_CBOR),  # unassigned simple value
        ("1c", ErrorCode.MALFORMED_CBOR),  # reserved additional info
        ("62c328", ErrorCode.MALFORMED_CBOR),  # invalid UTF-8
        ("1817", ErrorCode.NON_DETERMINISTIC_ENCODING),  # 23 in two bytes
        ("190010", ErrorCode.NON_DETERMINISTIC_ENCODING),  # 16 in three bytes
        ("a202010101", ErrorCode.NON_DETERMINISTIC_ENCODING),  # keys 2 then 1
        ("a201010102", ErrorCode.DUPLICATE_MAP_KEY),  # key 1 twice
        ("0101", ErrorCode.TRAILING_BYTES),
        ("5b7fffffffffffffff", ErrorCode.MESSAGE_TOO_LARGE),  # absurd claimed length
        ("5a00010000", ErrorCode.MALFORMED_CBOR),  # 65536 bytes claimed, none present
        ("9a00010000", ErrorCode.MALFORMED_CBOR),  # 65536 items claimed, none present
    ],
)
def test_strict_cbor_rules(hex_input: str, code: ErrorCode) -> None:
    with pytest.raises(DecodeError) as info:
        cbor.decode(bytes.fromhex(hex_input))
    assert info.value.code is code


def test_depth_limit_stops_deep_nesting_without_recursion_error() -> None:
    data = b"\x81" * 10_000 + b"\x00"
    with pytest.raises(DecodeError) as info:
        cbor.decode(data)
    assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE


def test_container_limit_is_enforced() -> None:
    limits = cbor.DecodeLimits(max_container_items=3)
    assert cbor.decode(bytes.fromhex("83010203"), limits) == [1, 2, 3]
    with pytest.raises(DecodeError) as info:
        cbor.decode(bytes.fromhex("8401020304"), limits)
    assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ([2, {}], ErrorCode.MISSING_FIELD),  # HelloAck without fields
        ([0xFF, {}], ErrorCode.UNKNOWN_MESSAGE_TYPE),
        ([4, {1: 1, 9: 0}], ErrorCode.UNKNOWN_FIELD),
        ([4, {1: -1}], ErrorCode.INVALID_FIELD),
        ([4, {1: "x"}], ErrorCode.INVALID_FIELD),
        ([4, {}], ErrorCode.MISSING_FIELD),
        ([4], ErrorCode.INVALID_FIELD),
        ({"type": 4}, ErrorCode.INVALID_FIELD),
    ],
)
def test_message_level_errors(value: cbor.CborValue, code: ErrorCode) -> None:
    with pytest.raises(DecodeError) as info:
        decode_message(cbor.encode(value))
    assert info.value.code is code


@pytest.mark.parametrize(
    ("value", "code", "detail"),
    [
        ([4, {}], ErrorCode.MISSING_FIELD, "Heartbeat.seq (key 1) is missing"),
        ([4, {1: 1, 9: 0}], ErrorCode.UNKNOWN_FIELD, "Heartbeat: key 9 is not defined"),
        ([4, {1: "x"}], ErrorCode.INVALID_FIELD, "Heartbeat.seq: expected an integer, got str"),
        ([4, {1: True}], ErrorCode.INVALID_FIELD, "Heartbeat.seq: expected an integer, got bool"),
    ],
)
def test_decode_errors_name_the_message_and_field(
    value: cbor.CborValue, code: ErrorCode, detail: str
) -> None:
    with pytest.raises(DecodeError) as info:
        decode_message(cbor.encode(value))
    assert (info.value.code, info.value.detail) == (code, detail)


def test_nested_and_enum_errors_name_the_whole_path() -> None:
    """A field of a nested structure is named from the outermost message down, and an
    enum field refuses a code its registry does not have (and a bool for an integer)."""
    with pytest.raises(DecodeError) as info:
        NodeRef.from_map({1: "agg-0", 2: {1: "h", 2: 0}, 3: b"\x01"}, "TreeAssignment.parent")
    assert info.value.detail == "TreeAssignment.parent.address.port: 0 is outside [1, 65535]"
    body = block_scaled_body()
    for raw, detail in ((99, "99 is not a registered DType"), (True, "expected an integer code, got bool")):
        with pytest.raises(DecodeError) as info:
            Result.from_map({**body, 6: raw})
        assert (info.value.code, info.value.detail) == (ErrorCode.INVALID_FIELD, f"Result.dtype: {detail}")


def test_each_message_class_names_itself_in_errors() -> None:
    """Contribution and Result share ChunkMessage's fields; each decodes, and is named
    in its errors, as itself."""
    body = block_scaled_body()
    del body[13]
    for cls in (Contribution, Result):
        with pytest.raises(DecodeError) as info:
            cls.from_map(body)
        assert info.value.detail == f"{cls.__name__}.payload (key 13) is missing"


def test_encoder_refuses_invalid_messages() -> None:
    with pytest.raises(EncodeError) as info:
        encode_message(Heartbeat(seq=-1))
    assert info.value.code is ErrorCode.INVALID_FIELD


def test_a_chunk_message_validated_once_is_still_checked_whenever_it_is_another() -> None:
    # ChunkMessage.validate skips the message that last passed it: the one the payload
    # layer validated right before encoding it.  Any other message, valid or not, and
    # an invalid one however often it is asked, gets the full checks and their errors.
    body = cast(dict[cbor.CborKey, cbor.CborValue], block_scaled_body())  # typed for cbor.encode
    valid = decode_message(cbor.encode([int(MessageType.RESULT), body]))
    assert isinstance(valid, Result)
    valid.validate("Result", encoding=True)
    invalid = replace(valid, payload=bytes(20 * 4))  # no attestations
    for _ in range(2):
        with pytest.raises(EncodeError) as info:
            encode_message(invalid)
        assert info.value.code is ErrorCode.INVALID_FIELD
        assert info.value.detail == "Result: payload has 80 bytes, chunk needs 88"
    assert (
        encode_message(valid)
        == encode_message(replace(valid))
        == cbor.encode([int(MessageType.RESULT), body])
    )
    with pytest.raises(DecodeError, match="payload has 80 bytes"):
        decode_message(cbor.encode([int(MessageType.RESULT), {**body, 13: bytes(80)}]))


def test_encoder_uses_rfc8949_key_order_for_mixed_keys() -> None:
    # RFC 7049 "canonical" (shorter first) would put -1 before 24; RFC 8949 core
    # deterministic encoding orders by bytes, so 24 (0x1818) precedes -1 (0x20).
    assert cbor.encode({-1: 0, 24: 0}).hex() == "a21818002000"


# --- version 2 chunk fields: scales (7), block_elements (16) ------------------------


def block_scaled_body() -> dict[int, cbor.CborValue]:
    """A valid block-scaled Result's map: 20 float32 elements in blocks of 16, so two
    scales (4 bytes) and a payload of 20 + 2 attestation integers at width 4."""
    message = Result(
        group_id=bytes(16),
        epoch=1,
        op_id=2,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.FLOAT32,
        scales=bytes.fromhex("0300fdff"),  # 3, -3
        total_elements=20,
        chunk_elements=20,
        chunk_index=0,
        contributors=b"\x03",
        width=4,
        payload=bytes(22 * 4),
        tag=5,
        block_elements=16,
    )
    body = message.to_map()
    assert decode_message(cbor.encode([int(MessageType.RESULT), body])) == message
    return body


def _without(body: dict[int, cbor.CborValue], key: int) -> dict[int, cbor.CborValue]:
    return {k: v for k, v in body.items() if k != key}


def _values_with_block_elements(body: dict[int, cbor.CborValue]) -> dict[int, cbor.CborValue]:
    body = {k: v for k, v in body.items() if k != 7}
    return {**body, 6: int(DType.INT32), 13: bytes(20 * 4)}


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda b: _without(b, 7), id="block-scaled-without-scales"),
        pytest.param(lambda b: _without(b, 16), id="block-scaled-without-block-elements"),
        pytest.param(lambda b: {**b, 7: bytes(2)}, id="one-scale-for-two-blocks"),
        pytest.param(lambda b: {**b, 7: bytes(6)}, id="three-scales-for-two-blocks"),
        pytest.param(lambda b: {**b, 7: bytes(3)}, id="scales-not-whole-int16"),
        pytest.param(lambda b: {**b, 7: 3}, id="version-1-integer-scale"),
        pytest.param(lambda b: {**b, 13: bytes(20 * 4)}, id="elements-without-attestations"),
        pytest.param(lambda b: {**b, 16: 15}, id="block-elements-15"),
        pytest.param(lambda b: {**b, 16: 65537}, id="block-elements-65537"),
        pytest.param(lambda b: {**b, 5: int(ReduceOp.MAX)}, id="ordered-with-scales"),
        pytest.param(lambda b: {**b, 6: int(DType.INT32)}, id="values-with-scales"),
        pytest.param(lambda b: {**b, 4: int(Collective.BROADCAST), 15: 0}, id="patterns-with-scales"),
        pytest.param(_values_with_block_elements, id="values-with-block-elements"),
    ],
)
def test_decoder_checks_scales_and_block_elements_against_the_form(
    change: Callable[[dict[int, cbor.CborValue]], dict[int, cbor.CborValue]],
) -> None:
    with pytest.raises(DecodeError) as info:
        decode_message(cbor.encode([int(MessageType.RESULT), change(block_scaled_body())]))
    assert info.value.code is ErrorCode.INVALID_FIELD


def test_block_count_follows_block_elements() -> None:
    # The same 20 elements in one block of 32: one scale, one attestation.
    body = {**block_scaled_body(), 16: 32, 7: bytes(2), 13: bytes(21 * 4)}
    assert decode_message(cbor.encode([int(MessageType.RESULT), body])).to_map() == body


def test_group_params_block_elements_and_float_width() -> None:
    base = {1: 4, 2: 2, 3: 100, 4: 1000}
    params = GroupParams.from_map({**base, 5: 256})
    assert params.block_elements == 256 and params.float_width is None
    assert (
        GroupParams(chunk_elements=4, window=2, heartbeat_interval_ms=100, operation_timeout_ms=1000)
        == params
    )
    with pytest.raises(DecodeError) as info:
        GroupParams.from_map(base)
    assert info.value.code is ErrorCode.MISSING_FIELD
    for width in (1, 2, 4, 8):
        assert GroupParams.from_map({**base, 5: 16, 6: width}).float_width == width
    for bad in ({5: 15}, {5: 65537}, {5: 256, 6: 3}, {5: 256, 6: 0}, {5: 256, 6: 16}):
        with pytest.raises(DecodeError) as info:
            GroupParams.from_map({**base, **bad})
        assert info.value.code is ErrorCode.INVALID_FIELD, bad


def test_group_params_liveness_window_absent_means_three_intervals() -> None:
    base = {1: 4, 2: 2, 3: 100, 4: 1000, 5: 256}
    assert GroupParams.from_map(base).liveness_ms is None
    assert GroupParams.from_map(base).loss_window == pytest.approx(0.3)
    params = GroupParams.from_map({**base, 7: 15_000})
    assert params.liveness_ms == 15_000 and params.loss_window == 15.0
    assert params.to_map() == {**base, 7: 15_000}
    assert GroupParams.from_map({**base, 7: 200}).loss_window == 0.2  # two intervals: the least
    for bad in (199, 19, 3_600_001):
        with pytest.raises(DecodeError) as info:
            GroupParams.from_map({**base, 7: bad})
        assert info.value.code is ErrorCode.INVALID_FIELD, bad
    under_two = GroupParams(
        chunk_elements=4, window=2, heartbeat_interval_ms=100, operation_timeout_ms=1000, liveness_ms=150
    )
    with pytest.raises(EncodeError, match="under two heartbeat intervals"):
        under_two.to_map()


# --- framing -----------------------------------------------------------------------


@given(st.integers(0, (1 << 62) - 1))
def test_varint_round_trip(value: int) -> None:
    encoded = encode_varint(value)
    assert decode_varint(encoded) == (value, len(encoded))
    assert decode_varint(encoded[:-1]) is None


def test_non_shortest_varint_is_refused() -> None:
    with pytest.raises(DecodeError) as info:
        decode_varint(bytes.fromhex("4005"))
    assert info.value.code is ErrorCode.FRAMING_ERROR


@SETTINGS
@given(st.lists(any_message, min_size=1, max_size=5), st.data())
def test_frames_survive_arbitrary_stream_splits(messages: list[Message], data: st.DataObject) -> None:
    stream = b"".join(encode_frame(encode_message(m)) for m in messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    decoder = FrameDecoder()
    frames: list[bytes] = []
    previous = 0
    for cut in [*cuts, len(stream)]:
        frames += decoder.feed(stream[previous:cut])
        previous = cut
    assert [decode_message(f) for f in frames] == messages
    assert decoder.at_boundary()


def test_oversized_frame_is_refused_before_buffering() -> None:
    decoder = FrameDecoder(max_message_size=1024)
    with pytest.raises(DecodeError) as info:
        decoder.feed(encode_varint(1025))
    assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE
    assert decoder.buffered <= 8


def test_encode_frame_refuses_oversized_message() -> None:
    with pytest.raises(EncodeError):
        encode_frame(b"x" * 2000, max_message_size=1024)


@pytest.mark.parametrize("length", [0, 63, 64, 16383, 16384, 1 << 20])
def test_a_frame_written_as_prefix_and_message_is_the_encoded_frame(length: int) -> None:
    # Links write a message's prefix and body as two pieces of the stream.
    message = bytes(range(256)) * (length // 256) + bytes(length % 256)
    assert frame_prefix(len(message)) + message == encode_frame(message)
    decoder = FrameDecoder(max_message_size=1 << 21)
    assert decoder.feed(frame_prefix(len(message))) == ([message] if length == 0 else [])
    assert decoder.feed(message) == ([] if length == 0 else [message])


def test_frame_prefix_refuses_a_length_over_the_limit() -> None:
    assert frame_prefix(1024, max_message_size=1024) == encode_varint(1024)
    with pytest.raises(EncodeError) as info:
        frame_prefix(1025, max_message_size=1024)
    assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE


class _BytesSubclass(bytes):
    pass


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"\x01",
        b"\x80\x01",
        b"\x00",
        b"\x01\x00",
        b"\x01\x02\x03",
        _BytesSubclass(b"\x01"),
        bytearray(b"\x01"),
        1,
    ],
)
def test_bitmap_fast_path_agrees_with_its_full_checks(value: object) -> None:
    # The one-test fast path of Bitmap must accept exactly what Bytes' checks followed
    # by the trailing-byte check accept, and leave every refusal to them.
    bitmap = Bitmap(max_len=2)
    for encoding, convert in ((True, bitmap.to_cbor), (False, bitmap.from_cbor)):
        try:
            expected: object = Bitmap._without_trailing_zero(
                Bytes._check(bitmap, value, "m.f", encoding), "m.f", encoding
            )
        except (EncodeError, DecodeError) as error:
            expected = (type(error), error.code, error.detail)
        try:
            got: object = convert(value, "m.f")  # type: ignore[arg-type]
        except (EncodeError, DecodeError) as error:
            got = (type(error), error.code, error.detail)
        assert got == expected
