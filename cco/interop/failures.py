"""The catalogue of invalid messages behind ``decode_failures.json``.

Each failure starts from one valid sample and breaks exactly one rule, so every
conforming decoder must report the same error code whatever order it checks
things in.  Together they reach every error code the message decoder can raise
and every kind of rule: CBOR well-formedness and the CCO subset, deterministic
encoding, size limits, the message registry, field types and ranges, enums,
bitmaps, cross-field rules, missing and unknown keys.  The range failures are
derived from the field declarations of :mod:`cco.wire.messages` (:data:`_BOUNDS`
names the fields; each value, key path, description and mutation is computed from
the field's declared type and bounds), so the schema is stated once.

``cddl_valid`` says what ``spec/cco.cddl`` makes of the bytes: ``False`` when the
schema rejects them, ``True`` when the broken rule is one CDDL cannot state (a
cross-field rule or a bitmap's trailing zero byte), ``None`` when the CBOR layer
rejects the bytes (codes 0x02-0x06) before a schema could apply.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any

from cco.interop.rawcbor import (
    UNDEFINED,
    Indefinite,
    LongHead,
    NonShortest,
    Pairs,
    RawValue,
    Tagged,
    Verbatim,
    encode_raw,
    float64,
)
from cco.interop.samples import Sample, samples
from cco.wire import cbor
from cco.wire.cbor import DEFAULT_LIMITS, DecodeLimits
from cco.wire.errors import ErrorCode
from cco.wire.fields import Bitmap, Bytes, FieldType, ListOf, Nested, Struct, Text, UInt
from cco.wire.messages import encode_message

E = ErrorCode


@dataclass(frozen=True, slots=True)
class Failure:
    """One invalid encoding, the sample it was derived from and the error it must raise."""

    name: str
    base: str
    error: ErrorCode
    cddl_valid: bool | None
    description: str
    mutation: str
    encoded: bytes
    limits: DecodeLimits = field(default=DEFAULT_LIMITS)


@cache
def _samples_by_name() -> dict[str, Sample]:
    return {s.name: s for s in samples()}


def base_bytes(name: str) -> bytes:
    """The encoding of the valid sample ``name``."""
    return encode_message(_samples_by_name()[name].message)


def base_value(name: str) -> list[Any]:
    """A fresh copy of the sample's CBOR data item ``[type, body]``, to mutate."""
    value = cbor.decode(base_bytes(name))
    assert isinstance(value, list)
    return copy.deepcopy(value)


Path = tuple[int | str, ...]
"""Keys and list indices leading from the body to one item."""


def _walk(container: Any, path: Path) -> Any:
    for step in path:
        container = container[step]
    return container


def with_field(name: str, path: Path, value: RawValue) -> bytes:
    """The sample with the item at ``path`` inside its body replaced by ``value``."""
    item = base_value(name)
    _walk(item[1], path[:-1])[path[-1]] = value
    return encode_raw(item)


def without_field(name: str, path: Path) -> bytes:
    """The sample with the body entry at ``path`` removed."""
    item = base_value(name)
    del _walk(item[1], path[:-1])[path[-1]]
    return encode_raw(item)


def with_body(name: str, body: RawValue) -> bytes:
    """The sample's type code with ``body`` in place of its body."""
    return encode_raw([base_value(name)[0], body])


def cut_after(data: bytes, marker: bytes) -> bytes:
    """``data`` up to and including the only occurrence of ``marker``."""
    assert data.count(marker) == 1
    return data[: data.index(marker) + len(marker)]


_STRING_CLAIM = b"\x5a\xff\xff\xff\xff"
_ARRAY_CLAIM = b"\x9a\x00\x01\x00\x01"


def _cbor_failures() -> list[Failure]:
    hb = "heartbeat-24"
    malformed = E.MALFORMED_CBOR
    return [
        Failure(
            "truncated-argument",
            hb,
            malformed,
            None,
            "The message ends inside the one-byte argument of seq.",
            "remove the last byte",
            base_bytes(hb)[:-1],
        ),
        Failure(
            "truncated-string",
            "join-accept",
            malformed,
            None,
            "The message ends in the middle of group_secret.",
            "keep only the first 40 bytes",
            base_bytes("join-accept")[:40],
        ),
        Failure(
            "empty-input", hb, malformed, None, "Zero bytes are not a message.", "remove every byte", b""
        ),
        Failure(
            "indefinite-array",
            hb,
            malformed,
            None,
            "The top-level array has an indefinite length (0x9f ... 0xff).",
            "write the top-level array with an indefinite length",
            encode_raw(Indefinite(base_value(hb))),
        ),
        Failure(
            "indefinite-map",
            hb,
            malformed,
            None,
            "The body map has an indefinite length (0xbf ... 0xff).",
            "write the body map with an indefinite length",
            with_body(hb, Indefinite(base_value(hb)[1])),
        ),
        Failure(
            "indefinite-byte-string",
            "chunk-ack",
            malformed,
            None,
            "group_id is an indefinite-length byte string holding one definite chunk.",
            "write group_id (key 1) as 0x5f, its definite encoding, 0xff",
            with_field("chunk-ack", (1,), Indefinite(base_value("chunk-ack")[1][1])),
        ),
        Failure(
            "indefinite-text-string",
            "error-with-type",
            malformed,
            None,
            "detail is an indefinite-length text string holding one definite chunk.",
            "write detail (key 2) as 0x7f, its definite encoding, 0xff",
            with_field("error-with-type", (2,), Indefinite(base_value("error-with-type")[1][2])),
        ),
        Failure(
            "tag-on-field",
            hb,
            malformed,
            None,
            "seq is wrapped in tag 2 (unsigned bignum): CCO messages carry no tags.",
            "replace seq (key 1) by tag 2 around the byte string h'18'",
            with_field(hb, (1,), Tagged(2, b"\x18")),
        ),
        Failure(
            "tag-on-message",
            hb,
            malformed,
            None,
            "The whole message is wrapped in tag 55799 (self-described CBOR).",
            "prefix the message with d9 d9 f7",
            encode_raw(Tagged(55799, base_value(hb))),
        ),
        Failure(
            "float64",
            hb,
            malformed,
            None,
            "seq is the double-precision float 24.0: CCO messages carry no floats.",
            "replace seq (key 1) by fb 4038000000000000",
            with_field(hb, (1,), float64(24.0)),
        ),
        Failure(
            "float16",
            hb,
            malformed,
            None,
            "seq is the half-precision float 24.0.",
            "replace seq (key 1) by f9 4e00",
            with_field(hb, (1,), Verbatim(b"\xf9\x4e\x00")),
        ),
        Failure(
            "undefined",
            "error-with-type",
            malformed,
            None,
            "message_type is the simple value undefined (0xf7).",
            "replace message_type (key 3) by f7",
            with_field("error-with-type", (3,), UNDEFINED),
        ),
        Failure(
            "simple-value",
            hb,
            malformed,
            None,
            "seq is the unassigned simple value 16 (0xf0).",
            "replace seq (key 1) by f0",
            with_field(hb, (1,), Verbatim(b"\xf0")),
        ),
        Failure(
            "simple-value-two-byte",
            hb,
            malformed,
            None,
            "seq is the simple value 32 in its two-byte form (0xf8 0x20).",
            "replace seq (key 1) by f8 20",
            with_field(hb, (1,), Verbatim(b"\xf8\x20")),
        ),
        Failure(
            "reserved-additional-info",
            hb,
            malformed,
            None,
            "seq starts with 0x1c: additional information 28 is reserved.",
            "replace seq (key 1) by 1c",
            with_field(hb, (1,), Verbatim(b"\x1c")),
        ),
        Failure(
            "lone-break",
            hb,
            malformed,
            None,
            "seq is a break byte (0xff) outside any indefinite-length item.",
            "replace seq (key 1) by ff",
            with_field(hb, (1,), Verbatim(b"\xff")),
        ),
        Failure(
            "invalid-utf8",
            "aggregator-accept",
            malformed,
            None,
            "node_id is a text string whose bytes are not UTF-8 (0xff).",
            "replace node_id (key 1) by 61 ff (a one-byte text string holding 0xff)",
            with_field("aggregator-accept", (1,), Verbatim(b"\x61\xff")),
        ),
        Failure(
            "utf8-surrogate",
            "aggregator-accept",
            malformed,
            None,
            "node_id holds ed a0 80, the UTF-8 form of the surrogate U+D800, which UTF-8 excludes.",
            "replace node_id (key 1) by 63 eda080",
            with_field("aggregator-accept", (1,), Verbatim(b"\x63\xed\xa0\x80")),
        ),
        Failure(
            "byte-string-map-key",
            hb,
            malformed,
            None,
            "The body has a byte-string key: CCO map keys are integers or text.",
            "add the entry h'01' => 0 to the body",
            with_body(hb, Pairs(((1, 24), (b"\x01", 0)))),
        ),
    ]


def _determinism_failures() -> list[Failure]:
    hb = "heartbeat-24"
    nd = E.NON_DETERMINISTIC_ENCODING
    return [
        Failure(
            "non-shortest-uint",
            hb,
            nd,
            None,
            "seq 24 is written with a two-byte argument (19 0018) instead of one (18 18).",
            "rewrite seq (key 1) as 19 0018",
            with_field(hb, (1,), NonShortest(24, 2)),
        ),
        Failure(
            "non-shortest-small-uint",
            "heartbeat-zero",
            nd,
            None,
            "seq 0 is written with a one-byte argument (18 00) instead of in the initial byte.",
            "rewrite seq (key 1) as 18 00",
            with_field("heartbeat-zero", (1,), NonShortest(0, 1)),
        ),
        Failure(
            "non-shortest-eight-byte",
            "heartbeat-65536",
            nd,
            None,
            "seq 65536 is written with an eight-byte argument instead of four.",
            "rewrite seq (key 1) as 1b 0000000000010000",
            with_field("heartbeat-65536", (1,), NonShortest(65536, 8)),
        ),
        Failure(
            "non-shortest-type",
            hb,
            nd,
            None,
            "The message type 4 is written as 18 04.",
            "rewrite the first array element as 18 04",
            encode_raw([NonShortest(4, 1), base_value(hb)[1]]),
        ),
        Failure(
            "non-shortest-map-key",
            hb,
            nd,
            None,
            "Map key 1 is written as 18 01.",
            "rewrite the body's key 1 as 18 01",
            with_body(hb, Pairs(((NonShortest(1, 1), 24),))),
        ),
        Failure(
            "non-shortest-byte-string-length",
            "chunk-ack",
            nd,
            None,
            "group_id's length 16 is written with a one-byte argument (58 10).",
            "rewrite group_id (key 1) with head 58 10",
            with_field("chunk-ack", (1,), LongHead(base_value("chunk-ack")[1][1], 1)),
        ),
        Failure(
            "non-shortest-text-length",
            "aggregator-accept",
            nd,
            None,
            "node_id's length 5 is written with a two-byte argument (79 0005).",
            "rewrite node_id (key 1) with head 79 0005",
            with_field("aggregator-accept", (1,), LongHead("agg-1", 2)),
        ),
        Failure(
            "non-shortest-array-length",
            hb,
            nd,
            None,
            "The top-level array's length 2 is written as 98 02.",
            "rewrite the top-level array head as 98 02",
            encode_raw(LongHead(base_value(hb), 1)),
        ),
        Failure(
            "non-shortest-map-length",
            hb,
            nd,
            None,
            "The body map's length 1 is written as b8 01.",
            "rewrite the body map head as b8 01",
            with_body(hb, LongHead(base_value(hb)[1], 1)),
        ),
        Failure(
            "unsorted-keys",
            "join-reject",
            nd,
            None,
            "The body's keys appear in the order 1, 3, 2 instead of 1, 2, 3.",
            "swap the body entries for keys 2 and 3",
            with_body("join-reject", Pairs(tuple((k, base_value("join-reject")[1][k]) for k in (1, 3, 2)))),
        ),
        Failure(
            "unsorted-nested-keys",
            "aggregator-register",
            nd,
            None,
            "The nested address map has its keys in the order 2, 1.",
            "write address (key 1) with port before host",
            with_field("aggregator-register", (1,), Pairs(((2, 4433), (1, "198.18.0.2")))),
        ),
    ]


def _limit_failures() -> list[Failure]:
    hb = "heartbeat-24"
    large = E.MESSAGE_TOO_LARGE
    nested: RawValue = 0
    for _ in range(64):
        nested = [nested]
    return [
        Failure(
            "duplicate-key",
            hb,
            E.DUPLICATE_MAP_KEY,
            None,
            "The body holds key 1 twice, with the same value.",
            "repeat the body entry 1 => 24",
            with_body(hb, Pairs(((1, 24), (1, 24)))),
        ),
        Failure(
            "duplicate-nested-key",
            "aggregator-register",
            E.DUPLICATE_MAP_KEY,
            None,
            "The nested address map holds key 2 twice, with different values.",
            "add a second entry 2 => 4434 to address (key 1)",
            with_field("aggregator-register", (1,), Pairs(((1, "198.18.0.2"), (2, 4433), (2, 4434)))),
        ),
        Failure(
            "trailing-byte",
            hb,
            E.TRAILING_BYTES,
            None,
            "One zero byte follows the message.",
            "append 00",
            base_bytes(hb) + b"\x00",
        ),
        Failure(
            "two-messages",
            hb,
            E.TRAILING_BYTES,
            None,
            "Two complete messages in one: a message is exactly one CBOR item.",
            "append a second copy of the message",
            base_bytes(hb) * 2,
        ),
        Failure(
            "too-deep",
            hb,
            large,
            None,
            "seq is 64 nested arrays around 0: deeper than the decoder's max_depth of 16.",
            "replace seq (key 1) by [[[...[0]...]]] (64 levels)",
            with_field(hb, (1,), nested),
        ),
        Failure(
            "string-over-limit",
            "join-request-any-rank",
            large,
            None,
            "With max_string_bytes 16, the 32-byte credential exceeds the limit (the message is "
            "otherwise valid).",
            "none: decode the base with the stated limits",
            base_bytes("join-request-any-rank"),
            DecodeLimits(max_string_bytes=16),
        ),
        Failure(
            "array-over-limit",
            "chunk-ack",
            large,
            None,
            "With max_container_items 4, a chunks array of 5 entries exceeds the limit.",
            "replace chunks (key 4) by [0, 1, 2, 3, 4]",
            with_field("chunk-ack", (4,), [0, 1, 2, 3, 4]),
            DecodeLimits(max_container_items=4),
        ),
        Failure(
            "string-length-claim",
            "join-request-any-rank",
            large,
            None,
            "credential claims 2^32-1 bytes (5a ffffffff) and the message ends there; the claim "
            "exceeds max_string_bytes (64 MiB) and must be refused before anything is allocated.",
            "replace credential (key 3) and everything after it by 5a ffffffff",
            cut_after(with_field("join-request-any-rank", (3,), Verbatim(_STRING_CLAIM)), _STRING_CLAIM),
        ),
        Failure(
            "array-length-claim",
            "chunk-ack",
            large,
            None,
            "chunks claims 65537 entries (9a 00010001) and the message ends there; the claim "
            "exceeds max_container_items (65536).",
            "replace chunks (key 4), the last entry, by 9a 00010001",
            cut_after(with_field("chunk-ack", (4,), Verbatim(_ARRAY_CLAIM)), _ARRAY_CLAIM),
        ),
    ]


def _type_failures() -> list[Failure]:
    hb = "heartbeat-24"
    unknown = E.UNKNOWN_MESSAGE_TYPE
    body = base_value(hb)[1]
    return [
        Failure(
            "type-zero",
            hb,
            unknown,
            False,
            "Message type 0 is not registered.",
            "set the type to 0",
            encode_raw([0, body]),
        ),
        Failure(
            "type-unassigned",
            hb,
            unknown,
            False,
            "Message type 7 lies in a gap of the registry.",
            "set the type to 7",
            encode_raw([7, body]),
        ),
        Failure(
            "type-after-last",
            hb,
            unknown,
            False,
            "Message type 0x27, one past ABORT, is not registered.",
            "set the type to 39",
            encode_raw([0x27, body]),
        ),
        Failure(
            "type-max",
            hb,
            unknown,
            False,
            "Message type 2^64-1 is not registered.",
            "set the type to 18446744073709551615",
            encode_raw([(1 << 64) - 1, body]),
        ),
        Failure(
            "type-negative",
            hb,
            unknown,
            False,
            "Message type -1 is not registered.",
            "set the type to -1",
            encode_raw([-1, body]),
        ),
    ]


def _shape_failures() -> list[Failure]:
    hb = "heartbeat-24"
    invalid = E.INVALID_FIELD
    body = base_value(hb)[1]
    return [
        Failure(
            "not-an-array",
            hb,
            invalid,
            False,
            "The message is the body map alone, not [type, body].",
            "remove the array and the type",
            encode_raw(body),
        ),
        Failure(
            "array-of-three",
            hb,
            invalid,
            False,
            "The message array has a third element.",
            "append 0 to the top-level array",
            encode_raw([4, body, 0]),
        ),
        Failure(
            "array-of-one",
            hb,
            invalid,
            False,
            "The message array holds only the type.",
            "remove the body",
            encode_raw([4]),
        ),
        Failure(
            "type-as-text",
            hb,
            invalid,
            False,
            'The message type is the text "4".',
            'replace the type by "4"',
            encode_raw(["4", body]),
        ),
        Failure(
            "body-as-array",
            hb,
            invalid,
            False,
            "The body is an array, not a map.",
            "replace the body by [24]",
            encode_raw([4, [24]]),
        ),
        Failure(
            "nested-as-array",
            "hello-minimal",
            invalid,
            False,
            "capabilities is an array, not a map.",
            "replace capabilities (key 4) by []",
            with_field("hello-minimal", (4,), []),
        ),
    ]


def _type_mismatch_failures() -> list[Failure]:
    hb = "heartbeat-24"
    invalid = E.INVALID_FIELD
    return [
        Failure(
            "uint-as-text",
            hb,
            invalid,
            False,
            'seq is the text "24".',
            'replace seq (key 1) by "24"',
            with_field(hb, (1,), "24"),
        ),
        Failure(
            "uint-as-bool",
            hb,
            invalid,
            False,
            "seq is true: booleans are not integers.",
            "replace seq (key 1) by true",
            with_field(hb, (1,), True),
        ),
        Failure(
            "uint-negative",
            hb,
            invalid,
            False,
            "seq is -1: the field is unsigned.",
            "replace seq (key 1) by -1",
            with_field(hb, (1,), -1),
        ),
        Failure(
            "optional-as-null",
            "error-with-type",
            invalid,
            False,
            "message_type is null: an absent optional field is omitted, never null.",
            "replace message_type (key 3) by null",
            with_field("error-with-type", (3,), None),
        ),
        Failure(
            "bytes-as-text",
            "join-reject",
            invalid,
            False,
            "group_id is a 16-character text string instead of a byte string.",
            'replace group_id (key 1) by "0123456789abcdef"',
            with_field("join-reject", (1,), "0123456789abcdef"),
        ),
        Failure(
            "text-as-bytes",
            "aggregator-accept",
            invalid,
            False,
            "node_id is a byte string instead of a text string.",
            "replace node_id (key 1) by h'6167672d31'",
            with_field("aggregator-accept", (1,), b"agg-1"),
        ),
        Failure(
            "list-as-text",
            "join-request-any-rank",
            invalid,
            False,
            "labels is a text string instead of an array.",
            'replace labels (key 5) by "rack-a"',
            with_field("join-request-any-rank", (5,), "rack-a"),
        ),
        Failure(
            "list-item-type",
            "join-request-any-rank",
            invalid,
            False,
            "An entry of labels is an integer instead of a text string.",
            "replace labels (key 5) by [1]",
            with_field("join-request-any-rank", (5,), [1]),
        ),
    ]


def _invalid_field(
    name: str,
    base: str,
    description: str,
    mutation: str,
    path: Path,
    value: RawValue,
    *,
    cddl_valid: bool = False,
) -> Failure:
    """Base vector ``base`` with the field at ``path`` set to ``value``: INVALID_FIELD.

    ``cddl_valid`` says whether the result still matches the schema (the rule broken
    is one CDDL cannot state) or not.
    """
    return Failure(
        name, base, E.INVALID_FIELD, cddl_valid, description, mutation, with_field(base, path, value)
    )


@dataclass(frozen=True, slots=True)
class _Bound:
    """One declared bound of one field, broken by one step: the vector ``name`` starts
    from the sample ``base`` and sets ``field`` (field names joined by dots, ``[0]``
    for a list's first entry) just ``below`` or ``above`` the range its declaration
    in :mod:`cco.wire.messages` gives, or (``utf8``) above it with two-byte characters,
    so that it is over in UTF-8 bytes but not in characters.  The value, the map keys,
    the description and the mutation all come from the declaration."""

    name: str
    base: str
    field: str
    side: str


_BOUNDS = (
    _Bound("world-size-zero", "join-request-any-rank", "world_size", "below"),
    _Bound("world-size-over", "join-request-any-rank", "world_size", "above"),
    _Bound("rank-over", "leave", "rank", "above"),
    _Bound("port-zero", "aggregator-register", "address.port", "below"),
    _Bound("port-over", "aggregator-register", "address.port", "above"),
    _Bound("capacity-zero", "aggregator-register", "capacity", "below"),
    _Bound("fan-in-one", "aggregator-register", "max_fan_in", "below"),
    _Bound("heartbeat-interval-short", "aggregator-accept", "heartbeat_interval_ms", "below"),
    _Bound("max-message-size-small", "hello-minimal", "capabilities.max_message_size", "below"),
    _Bound("version-over-u32", "hello-ack-rendezvous", "version", "above"),
    _Bound("message-type-over", "error-with-type", "message_type", "above"),
    _Bound("window-zero", "join-accept", "params.window", "below"),
    _Bound("liveness-over", "join-accept-bounds", "params.liveness_ms", "above"),
    _Bound("block-elements-under", "contribution-reduce-root", "block_elements", "below"),
    _Bound("block-elements-over", "contribution-reduce-root", "block_elements", "above"),
    _Bound("block-elements-in-params-under", "join-accept", "params.block_elements", "below"),
    _Bound("tag-equals-modulus", "contribution-all-reduce-sum", "tag", "above"),
    _Bound("width-zero", "contribution-all-reduce-sum", "width", "below"),
    _Bound("chunk-elements-zero", "contribution-all-reduce-sum", "chunk_elements", "below"),
    _Bound("total-elements-over", "contribution-barrier", "total_elements", "above"),
    _Bound("root-over", "contribution-reduce-root", "root", "above"),
    _Bound("group-id-short", "join-reject", "group_id", "below"),
    _Bound("group-id-long", "join-reject", "group_id", "above"),
    _Bound("group-secret-short", "join-accept", "group_secret", "below"),
    _Bound("credential-long", "join-request-rank", "credential", "above"),
    _Bound("node-id-empty", "aggregator-accept", "node_id", "below"),
    _Bound("node-id-long", "aggregator-accept", "node_id", "above"),
    _Bound("node-id-long-utf8", "aggregator-accept", "node_id", "utf8"),
    _Bound("report-parent-empty", "report", "parent", "below"),
    _Bound("report-detail-long", "report", "detail", "above"),
    _Bound("detail-long", "error-without-type", "detail", "above"),
    _Bound("label-empty", "join-request-any-rank", "labels[0]", "below"),
    _Bound("versions-empty", "hello-endpoint", "versions", "below"),
    _Bound("versions-too-many", "hello-endpoint", "versions", "above"),
    _Bound("labels-too-many", "join-request-any-rank", "labels", "above"),
    _Bound("chunks-empty", "chunk-ack", "chunks", "below"),
    _Bound("chunks-too-many", "chunk-ack", "chunks", "above"),
    _Bound("bitmap-too-long", "epoch-change", "members", "above"),
)
"""The field bounds the vectors break: at least one of each kind of field (integer,
byte string, bitmap, text, list), in messages and in nested structures."""


def _number(n: int) -> str:
    """An integer as the draft writes it: 2^k, 2^k-1 or 2^k+1 near a large power of two."""
    for k in range(16, 65):
        offset = n - (1 << k)
        if -2 <= offset <= 1:
            return f"2^{k}{offset:+d}" if offset else f"2^{k}"
    return str(n)


def _count(n: int, unit: str) -> str:
    """``n`` bytes or entries, in English."""
    return f"{n} {unit}" if n == 1 else f"{n} {'entries' if unit == 'entry' else unit + 's'}"


def _declared(struct: type[Struct], field: str) -> tuple[Path, str, FieldType[Any]]:
    """The map keys and list indices that lead to ``field`` of ``struct``, the same as
    the mutations name them ("key 4, index 0, key 3"), and the field's type."""
    path: list[int | str] = []
    steps: list[str] = []
    kind: FieldType[Any] | None = None
    for step in field.split("."):
        name, _, index = step.partition("[")
        if kind is not None:
            assert isinstance(kind, Nested), f"{field}: {name} is not inside a structure"
            struct = kind.struct_type
        spec = dict(struct.wire_fields())[name]
        path.append(spec.key)
        steps.append(f"key {spec.key}")
        kind = spec.kind
        if index:
            assert isinstance(kind, ListOf), f"{field}: {name} is not a list"
            path.append(int(index.rstrip("]")))
            steps.append(f"index {path[-1]}")
            kind = kind.item
    assert kind is not None
    return tuple(path), ", ".join(steps), kind


def _outside(bound: _Bound) -> Failure:
    """The vector of one broken bound, every detail read from the field's declaration."""
    message = _samples_by_name()[bound.base].message
    path, keys, kind = _declared(type(message), bound.field)
    old = _walk(base_value(bound.base)[1], path)
    below = bound.side == "below"
    if isinstance(kind, UInt):
        value, state, change = _integer_outside(kind, below)
    elif isinstance(kind, ListOf):
        value, state, change = _list_outside(kind, below, old)
    elif isinstance(kind, Text):
        value, state, change = _text_outside(kind, bound.side, old)
    else:
        assert isinstance(kind, Bytes), f"{bound.field}: {type(kind).__name__} has no range"
        value, state, change = _bytes_outside(kind, below, old)
    description = f"{bound.field} {state}."
    mutation = change.format(f"{bound.field} ({keys})")
    return Failure(
        bound.name,
        bound.base,
        E.INVALID_FIELD,
        False,
        description,
        mutation,
        with_field(bound.base, path, value),
    )


_Outside = tuple[RawValue, str, str]
"""A value just outside a range, what the description says of it, and the mutation
(``{}`` stands for the field)."""


def _integer_outside(kind: UInt, below: bool) -> _Outside:
    value = kind.minimum - 1 if below else kind.maximum + 1
    span = f"range {_number(kind.minimum)}..{_number(kind.maximum)}"
    return value, f"is {_number(value)} ({span})", f"set {{}} to {value}"


def _list_outside(kind: ListOf[Any], below: bool, old: list[Any]) -> _Outside:
    count = kind.min_items - 1 if below else kind.max_items + 1
    state = f"has {_count(count, 'entry')} ({kind.min_items}..{kind.max_items} entries)"
    if not below:
        return [old[0]] * count, state, f"set {{}} to {count} copies of its first entry"
    return old[:count], state, f"keep the first {_count(count, 'entry')} of {{}}" if count else "set {} to []"


def _text_outside(kind: Text, side: str, old: str) -> _Outside:
    span = f"{kind.min_len}..{kind.max_len} bytes"
    if side == "below":
        size = kind.min_len - 1
        cut = f"keep the first {_count(size, 'byte')} of {{}}" if size else 'set {} to ""'
        return old.encode()[:size].decode(), f"has {_count(size, 'byte')} ({span})", cut
    size = kind.max_len + 1
    if side == "above":
        return "x" * size, f"has {size} bytes ({span})", f'set {{}} to {size} times "x"'
    wide = "\u00e9" * -(-size // 2)  # two UTF-8 bytes each
    state = (
        f"has {len(wide)} characters but {len(wide.encode())} UTF-8 bytes ({span}): text limits count bytes"
    )
    return wide, state, f"set {{}} to {len(wide)} times U+00E9"


def _bytes_outside(kind: Bytes, below: bool, old: bytes) -> _Outside:
    size = kind.min_len - 1 if below else kind.max_len + 1
    span = f"exactly {kind.min_len}" if kind.min_len == kind.max_len else f"{kind.min_len}..{kind.max_len}"
    state = f"has {_count(size, 'byte')} ({span} bytes)"
    if below:
        return (
            old[:size],
            state,
            f"keep the first {_count(size, 'byte')} of {{}}" if size else "set {} to h''",
        )
    last = b"\x01" if isinstance(kind, Bitmap) else b"\x00"  # a bitmap's last byte is never zero
    change = f"extend {{}} to {size} bytes with zero bytes, the last one {last.hex()}"
    return old.ljust(size - 1, b"\x00") + last, state, change


def _range_failures() -> list[Failure]:
    return [_outside(bound) for bound in _BOUNDS]


def _enum_failures() -> list[Failure]:
    c = "contribution-all-reduce-sum"

    f = _invalid_field

    return [
        f(
            "role-unregistered",
            "hello-endpoint",
            "role is 4, not a registered role.",
            "set role (key 2) to 4",
            (2,),
            4,
        ),
        f(
            "role-zero",
            "hello-ack-rendezvous",
            "role is 0, not a registered role.",
            "set role (key 2) to 0",
            (2,),
            0,
        ),
        f(
            "dtype-in-list",
            "hello-endpoint",
            "capabilities.dtypes contains 9, not a registered dtype.",
            "set capabilities.dtypes (key 4, key 1) to [1, 9]",
            (4, 1),
            [1, 9],
        ),
        f("dtype-zero", c, "dtype is 0, not a registered dtype.", "set dtype (key 6) to 0", (6,), 0),
        f("op-unregistered", c, "op is 8, not a registered reduction.", "set op (key 5) to 8", (5,), 8),
        f(
            "kind-unregistered",
            c,
            "kind is 7, not a registered collective.",
            "set kind (key 4) to 7",
            (4,),
            7,
        ),
        f(
            "error-code-unassigned",
            "error-without-type",
            "code is 12, unassigned in the error registry.",
            "set code (key 1) to 12",
            (1,),
            12,
        ),
        f("error-code-negative", "leave", "code is -1.", "set code (key 3) to -1", (3,), -1),
        f(
            "report-code-not-verification",
            "report",
            "code is 0x31 (PEER_LOST), a registered code that a Report does not carry.",
            "set code (key 4) to 49",
            (4,),
            49,
        ),
        f(
            "report-code-unassigned",
            "report",
            "code is 12, unassigned in the error registry.",
            "set code (key 4) to 12",
            (4,),
            12,
        ),
    ]


def _rule_failures() -> list[Failure]:
    """Rules between fields, and bitmap form: the schema cannot state these."""
    invalid = E.INVALID_FIELD
    c = "contribution-all-reduce-sum"
    payload = base_value(c)[1][13]

    f = partial(_invalid_field, cddl_valid=True)

    def rebuilt(name: str, base: str, description: str, mutation: str, body: RawValue, cddl: bool) -> Failure:
        return Failure(name, base, invalid, cddl, description, mutation, with_body(base, body))

    def quorum(name: str, base: str, description: str, mutation: str, changes: dict[int, Any]) -> Failure:
        body = {**base_value(base)[1], **changes}
        for key in [k for k, v in changes.items() if v is None]:
            del body[key]
        return Failure(name, base, invalid, True, description, mutation, with_body(base, body))

    scaled = "contribution-reduce-root"
    scaled_payload = base_value(scaled)[1][13]
    reduce_body = base_value("contribution-reduce-root")[1]
    del reduce_body[15]
    broadcast_body = base_value("broadcast-data")[1]
    del broadcast_body[15]
    return [
        f(
            "liveness-under-two-intervals",
            "join-accept",
            "params.liveness_ms is 1999 with heartbeat_interval_ms 1000: at least two intervals.",
            "set params.liveness_ms (key 6, key 7) to 1999",
            (6, 7),
            1999,
        ),
        f(
            "width-three",
            c,
            "width is 3: element widths are 1, 2, 4 or 8.",
            "set width (key 12) to 3",
            (12,),
            3,
            cddl_valid=False,
        ),
        f(
            "float-width-three",
            "join-accept-bounds",
            "params.float_width is 3: widths are 1, 2, 4 or 8.",
            "set params.float_width (key 6, key 6) to 3",
            (6, 6),
            3,
            cddl_valid=False,
        ),
        f(
            "bitmap-trailing-zero",
            c,
            "contributors is 01 00: a bitmap has no trailing zero byte.",
            "append 00 to contributors (key 11)",
            (11,),
            b"\x01\x00",
        ),
        f(
            "bitmap-zero-byte",
            "tree-assignment-endpoint",
            "expected is the single byte 00: the empty bitmap is the empty byte string.",
            "set expected (key 4) to h'00'",
            (4,),
            b"\x00",
        ),
        f(
            "bitmap-trailing-zero-optional",
            "abort",
            "missing is 04 00: a trailing zero byte.",
            "append 00 to missing (key 6)",
            (6,),
            b"\x04\x00",
        ),
        f(
            "tree-assignment-rank-beyond-world",
            "tree-assignment-root",
            "expected is 1f (ranks 0..4) but world_size is 4: every bitmap of a TreeAssignment "
            "names ranks below world_size.",
            "set expected (key 4) to h'1f'",
            (4,),
            b"\x1f",
        ),
        f(
            "tree-assignment-child-rank-beyond-world",
            "tree-assignment-root",
            "children[1].ranks is 14 (ranks 2 and 4) but world_size is 4.",
            "set children[1].ranks (key 5, index 1, key 3) to h'14'",
            (5, 1, 3),
            b"\x14",
        ),
        f(
            "tree-assignment-parent-rank-beyond-world",
            "tree-assignment-endpoint",
            "parent.ranks is 13 (ranks 0, 1 and 4) but world_size is 4: the parent's ranks are "
            "checked against world_size like expected and every child's.",
            "set parent.ranks (key 7, key 3) to h'13'",
            (7, 3),
            b"\x13",
        ),
        f(
            "bitmap-trailing-zero-nested",
            "tree-assignment-root",
            "children[0].ranks is 03 00: a trailing zero byte inside a nested structure.",
            "append 00 to children[0].ranks (key 5, index 0, key 3)",
            (5, 0, 3),
            b"\x03\x00",
        ),
        Failure(
            "contributors-empty",
            c,
            invalid,
            False,
            "contributors is empty: a chunk has at least one contributor.",
            "set contributors (key 11) to h''",
            with_field(c, (11,), b""),
        ),
        f(
            "payload-short",
            c,
            "payload has 7 bytes; 4 elements of width 2 need 8.",
            "drop the last byte of payload (key 13)",
            (13,),
            payload[:-1],
        ),
        f(
            "payload-long",
            c,
            "payload has 10 bytes; 4 elements of width 2 need 8.",
            "append 0000 to payload (key 13)",
            (13,),
            payload + b"\x00\x00",
        ),
        f(
            "payload-width-mismatch",
            c,
            "width is 4 but payload holds 8 bytes; 4 elements of width 4 need 16.",
            "set width (key 12) to 4",
            (12,),
            4,
        ),
        f(
            "rank-not-below-world-size",
            "join-request-rank",
            "rank 4 is not below world_size 4.",
            "set rank (key 4) to 4",
            (4,),
            4,
        ),
        f(
            "assigned-rank-not-below-world-size",
            "join-accept",
            "rank 4 is not below world_size 4.",
            "set rank (key 2) to 4",
            (2,),
            4,
        ),
        Failure(
            "chunk-index-past-end",
            "contribution-last-chunk",
            invalid,
            True,
            "chunk_index 3, but 10 elements in chunks of 4 make 3 chunks (0..2); the payload is empty, "
            "as a chunk past the end would be.",
            "set chunk_index (key 10) to 3 and payload (key 13) to h''",
            with_body(
                "contribution-last-chunk", {**base_value("contribution-last-chunk")[1], 10: 3, 13: b""}
            ),
        ),
        Failure(
            "chunk-index-empty-operation",
            "contribution-barrier",
            invalid,
            True,
            "chunk_index 1 of an operation with 0 elements, which has exactly one (empty) chunk.",
            "set chunk_index (key 10) to 1",
            with_field("contribution-barrier", (10,), 1),
        ),
        f(
            "scales-on-integer-sum",
            c,
            "An int32 SUM chunk (form VALUES) with scales (key 7): only block-scaled chunks carry them.",
            "add scales (key 7) = h'0000'",
            (7,),
            b"\x00\x00",
        ),
        f(
            "block-elements-on-integer-sum",
            c,
            "An int32 SUM chunk (form VALUES) with block_elements (key 16).",
            "add block_elements (key 16) = 16",
            (16,),
            16,
        ),
        Failure(
            "scales-on-ordered-max",
            "result-max-float32-ordered",
            invalid,
            True,
            "A float32 MAX chunk (form ORDERED) with scales and block_elements for its one block.",
            "add scales (key 7) = h'0000' and block_elements (key 16) = 16",
            with_body(
                "result-max-float32-ordered",
                {**base_value("result-max-float32-ordered")[1], 7: b"\x00\x00", 16: 16},
            ),
        ),
        Failure(
            "scales-absent-block-scaled",
            scaled,
            invalid,
            True,
            "A float32 AVG chunk (form BLOCK_SCALED) without scales (key 7).",
            "remove scales (key 7)",
            without_field(scaled, (7,)),
        ),
        Failure(
            "block-elements-absent-block-scaled",
            scaled,
            invalid,
            True,
            "A float32 AVG chunk (form BLOCK_SCALED) without block_elements (key 16).",
            "remove block_elements (key 16)",
            without_field(scaled, (16,)),
        ),
        f(
            "scales-empty",
            scaled,
            "scales is empty, but the chunk has one block: 2 bytes.",
            "set scales (key 7) to h''",
            (7,),
            b"",
        ),
        f(
            "scales-length-wrong",
            scaled,
            "scales has 4 bytes, but 2 elements in blocks of 16 make one block: 2 bytes.",
            "set scales (key 7) to h'f0fff0ff'",
            (7,),
            b"\xf0\xff\xf0\xff",
        ),
        f(
            "scales-length-odd",
            scaled,
            "scales has 3 bytes: two per block.",
            "set scales (key 7) to h'f0ff00'",
            (7,),
            b"\xf0\xff\x00",
        ),
        f(
            "attestations-missing",
            scaled,
            "payload has 8 bytes: 2 elements and 1 attestation of width 4 need 12.",
            "drop the last 4 bytes of payload (key 13)",
            (13,),
            scaled_payload[:-4],
        ),
        rebuilt(
            "root-absent-reduce",
            "contribution-reduce-root",
            "A REDUCE chunk without root (key 15).",
            "remove root (key 15)",
            reduce_body,
            True,
        ),
        rebuilt(
            "root-absent-broadcast",
            "broadcast-data",
            "A BROADCAST chunk without root (key 15).",
            "remove root (key 15)",
            broadcast_body,
            True,
        ),
        rebuilt(
            "root-present-all-reduce",
            c,
            "An ALL_REDUCE chunk with root (key 15): root is only for REDUCE and BROADCAST.",
            "add root (key 15) = 0",
            {**base_value(c)[1], 15: 0},
            True,
        ),
        quorum(
            "quorum-without-wait",
            "contribution-presence-pass",
            "A presence pass with quorum (key 18) but no wait_ms (key 19): they come together.",
            "remove wait_ms (key 19)",
            {19: None},
        ),
        quorum(
            "presence-with-members",
            "contribution-presence-pass",
            "A presence pass (quorum, key 18) that also names members (key 17): a presence pass "
            "decides the members, it carries none.",
            "add members (key 17) = h'0c'",
            {17: b"\x0c"},
        ),
        quorum(
            "contributors-outside-members",
            "result-decided-members",
            "contributors 0, 2 and 3 (0d) but members 0 and 2 (05): contributors lie within members.",
            "set members (key 17) to h'05'",
            {17: b"\x05"},
        ),
        quorum(
            "members-not-all-reduce",
            "contribution-barrier",
            "A BARRIER chunk with members (key 17): members, quorum and wait_ms are for ALL_REDUCE only.",
            "add members (key 17) = h'01'",
            {17: b"\x01"},
        ),
        quorum(
            "members-on-reduce",
            "contribution-reduce-root",
            "A REDUCE chunk with members (key 17) that hold its contributor: keys 17 to 19 are defined "
            "for every chunk message (never UNKNOWN_FIELD), and outside ALL_REDUCE they are INVALID_FIELD.",
            "add members (key 17) = h'02'",
            {17: b"\x02"},
        ),
        quorum(
            "quorum-on-broadcast",
            "broadcast-data",
            "A BROADCAST chunk with quorum (key 18) and wait_ms (key 19): INVALID_FIELD, not UNKNOWN_FIELD.",
            "add quorum (key 18) = 2 and wait_ms (key 19) = 100",
            {18: 2, 19: 100},
        ),
        _invalid_field(
            "broadcast-op-max",
            "broadcast-data",
            "A BROADCAST chunk with op MAX: BROADCAST, ALL_GATHER and BARRIER chunks carry op SUM.",
            "set op (key 5) to 4",
            (5,),
            4,
        ),
        _invalid_field(
            "all-gather-op-bor",
            "result-all-gather",
            "An ALL_GATHER chunk with op BOR: ALL_GATHER chunks carry op SUM.",
            "set op (key 5) to 6",
            (5,),
            6,
        ),
        _invalid_field(
            "barrier-op-min",
            "contribution-barrier",
            "A BARRIER chunk with op MIN.",
            "set op (key 5) to 3",
            (5,),
            3,
        ),
        _invalid_field(
            "barrier-dtype-float32",
            "contribution-barrier",
            "A BARRIER chunk with dtype FLOAT32: a BARRIER carries no elements, as dtype INT8.",
            "set dtype (key 6) to 7",
            (6,),
            7,
        ),
        rebuilt(
            "barrier-with-an-element",
            "contribution-barrier",
            "A BARRIER chunk of one element, its one-byte payload present: a BARRIER has none.",
            "set total_elements (key 8) to 1 and payload (key 13) to h'00'",
            {**base_value("contribution-barrier")[1], 8: 1, 13: b"\x00"},
            True,
        ),
    ]


def _key_failures() -> list[Failure]:
    hb = "heartbeat-24"
    missing = E.MISSING_FIELD
    unknown = E.UNKNOWN_FIELD
    c = "contribution-all-reduce-sum"
    return [
        Failure(
            "missing-only-field",
            hb,
            missing,
            False,
            "The body of a heartbeat is empty: seq is required.",
            "remove seq (key 1)",
            without_field(hb, (1,)),
        ),
        Failure(
            "missing-payload",
            c,
            missing,
            False,
            "A contribution without payload (key 13).",
            "remove payload (key 13)",
            without_field(c, (13,)),
        ),
        Failure(
            "missing-nested",
            "aggregator-register",
            missing,
            False,
            "The nested address has no port.",
            "remove address.port (key 1, key 2)",
            without_field("aggregator-register", (1, 2)),
        ),
        Failure(
            "missing-in-capabilities",
            "hello-endpoint",
            missing,
            False,
            "capabilities lacks extensions (key 6), which is required even when empty.",
            "remove capabilities.extensions (key 4, key 6)",
            without_field("hello-endpoint", (4, 6)),
        ),
        Failure(
            "missing-params",
            "tree-assignment-root",
            missing,
            False,
            "A tree assignment without params (key 6).",
            "remove params (key 6)",
            without_field("tree-assignment-root", (6,)),
        ),
        Failure(
            "unknown-key",
            hb,
            unknown,
            False,
            "The heartbeat body has key 2, which it does not define.",
            "add 2 => 0 to the body",
            with_field(hb, (2,), 0),
        ),
        Failure(
            "unknown-key-after-last",
            c,
            unknown,
            False,
            "A contribution with key 20 (the largest chunk key is 19).",
            "add 20 => 0 to the body",
            with_field(c, (20,), 0),
        ),
        Failure(
            "unknown-key-zero",
            "join-reject",
            unknown,
            False,
            "A join-reject with key 0.",
            "add 0 => 0 to the body",
            with_field("join-reject", (0,), 0),
        ),
        Failure(
            "unknown-key-negative",
            hb,
            unknown,
            False,
            "The heartbeat body has key -1.",
            "add -1 => 0 to the body",
            with_field(hb, (-1,), 0),
        ),
        Failure(
            "unknown-text-key",
            hb,
            unknown,
            False,
            'The heartbeat body has the text key "seq".',
            'add "seq" => 24 to the body',
            with_field(hb, ("seq",), 24),
        ),
        Failure(
            "unknown-nested-key",
            "aggregator-register",
            unknown,
            False,
            "The nested address has key 3.",
            "add address.3 (key 1, key 3) => 0",
            with_field("aggregator-register", (1, 3), 0),
        ),
    ]


def failures() -> list[Failure]:
    """Every negative message vector, grouped by the error it must raise."""
    found = [
        *_cbor_failures(),
        *_determinism_failures(),
        *_limit_failures(),
        *_type_failures(),
        *_shape_failures(),
        *_type_mismatch_failures(),
        *_range_failures(),
        *_enum_failures(),
        *_rule_failures(),
        *_key_failures(),
    ]
    names = [f.name for f in found]
    assert len(set(names)) == len(names), "failure names are unique"
    return found
