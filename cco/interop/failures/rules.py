"""Invalid messages that break a rule between fields, or a bitmap's form.

Bounds that depend on another field (a rank below the world size, a chunk index
within the operation, a payload as long as its elements), what a collective kind
allows of root, op, dtype, scales and quorum, and a bitmap's last byte: rules the
schema cannot state, so most of these still match ``spec/cco.cddl``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from cco.interop.failures.mutation import (
    Failure,
    base_value,
    invalid_field,
    with_body,
    with_field,
    without_field,
)
from cco.interop.rawcbor import RawValue
from cco.wire.errors import ErrorCode as E


def rule_failures() -> list[Failure]:
    """Rules between fields, and bitmap form: the schema cannot state these."""
    invalid = E.INVALID_FIELD
    c = "contribution-all-reduce-sum"
    payload = base_value(c)[1][13]

    f = partial(invalid_field, cddl_valid=True)

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
        invalid_field(
            "broadcast-op-max",
            "broadcast-data",
            "A BROADCAST chunk with op MAX: BROADCAST, ALL_GATHER and BARRIER chunks carry op SUM.",
            "set op (key 5) to 4",
            (5,),
            4,
        ),
        invalid_field(
            "all-gather-op-bor",
            "result-all-gather",
            "An ALL_GATHER chunk with op BOR: ALL_GATHER chunks carry op SUM.",
            "set op (key 5) to 6",
            (5,),
            6,
        ),
        invalid_field(
            "barrier-op-min",
            "contribution-barrier",
            "A BARRIER chunk with op MIN.",
            "set op (key 5) to 3",
            (5,),
            3,
        ),
        invalid_field(
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
