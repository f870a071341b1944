"""Invalid messages the schema rejects: the registry, the shape, the types, the keys.

An unregistered message type, a message that is not ``[type, body]``, a field of the
wrong CBOR type, an enum value outside its registry, a missing or an unknown key:
each is a rule ``spec/cco.cddl`` states too, so every failure here has
``cddl_valid`` ``False``.
"""

from __future__ import annotations

from cco.interop.failures.mutation import Failure, base_value, invalid_field, with_field, without_field
from cco.interop.rawcbor import encode_raw
from cco.wire.errors import ErrorCode as E


def type_failures() -> list[Failure]:
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


def shape_failures() -> list[Failure]:
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


def type_mismatch_failures() -> list[Failure]:
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


def enum_failures() -> list[Failure]:
    c = "contribution-all-reduce-sum"

    f = invalid_field

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


def key_failures() -> list[Failure]:
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
