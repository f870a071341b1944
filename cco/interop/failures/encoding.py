"""Invalid messages the CBOR layer rejects before any schema applies.

CBOR well-formedness and the CCO subset of CBOR, deterministic encoding, duplicate
keys, trailing bytes and the decoder's size limits: codes 0x02-0x06, each failure
with ``cddl_valid`` ``None``.
"""

from __future__ import annotations

from cco.interop.failures.mutation import Failure, base_bytes, base_value, cut_after, with_body, with_field
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
from cco.wire.cbor import DecodeLimits
from cco.wire.errors import ErrorCode as E

_STRING_CLAIM = b"\x5a\xff\xff\xff\xff"
_ARRAY_CLAIM = b"\x9a\x00\x01\x00\x01"


def cbor_failures() -> list[Failure]:
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


def determinism_failures() -> list[Failure]:
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


def limit_failures() -> list[Failure]:
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
