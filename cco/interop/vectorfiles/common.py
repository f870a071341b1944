"""What the vector files share: the fixed group of the payload vectors, the JSON forms
of chunk headers and chunk messages, and how a file's check runs.

Each module of this package writes one vector file and checks it: ``FILE`` is its
name, ``vectors()`` builds it from fixed inputs (no clock, no random state) and
refuses to return a vector its own ``check`` does not accept, and ``check(vectors)``
lists what is wrong with a file (empty when every vector holds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cco.interop import reference as ref
from cco.interop.jsonform import from_hex, message_to_json
from cco.wire import cbor
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import ChunkMessage, decode_message, encode_message
from cco.wire.payload import ChunkHeader, GroupKeys, open_verified
from cco.wire.registries import Collective, DType, ReduceOp

Vector = dict[str, Any]
Check = Callable[[list[Vector]], list[str]]

SECRET = bytes(range(32))
"""The group secret of every payload vector but the key derivation's."""
GROUP_ID = bytes(range(0xA0, 0xB0))
EPOCH = 7


def name_of(vector: Vector) -> str:
    return str(vector.get("name", "<unnamed>"))


def run(vectors: list[Vector], check_one: Callable[[Vector], list[str]]) -> list[str]:
    """Every problem of a file: names that repeat, then each vector's, named; a vector
    the check cannot even read is a problem too, not a crash."""
    names = [name_of(v) for v in vectors]
    problems = [f"{n}: name is not unique" for n in sorted({n for n in names if names.count(n) > 1})]
    for vector in vectors:
        try:
            found = check_one(vector)
        except (KeyError, TypeError, ValueError, AssertionError, OverflowError, CcoError) as exc:
            found = [f"malformed or failing: {exc!r}"]
        problems += [f"{name_of(vector)}: {p}" for p in found]
    return problems


def checked(file_name: str, vectors: list[Vector], check: Check) -> list[Vector]:
    """``vectors`` if ``check`` accepts them all; a generator never writes one it does not."""
    problems = check(vectors)
    if problems:
        raise AssertionError(f"{file_name}: generated vectors do not hold:\n" + "\n".join(problems))
    return vectors


def header_json(header: ChunkHeader) -> Vector:
    """A chunk header in the vectors' JSON form; width, block_elements and scales only
    for block-scaled chunks (they are part of its identity)."""
    out: Vector = {
        "group_id": header.group_id.hex(),
        "epoch": header.epoch,
        "op_id": header.op_id,
        "kind": int(header.kind),
        "op": int(header.op),
        "dtype": int(header.dtype),
        "total_elements": header.total_elements,
        "chunk_elements": header.chunk_elements,
        "chunk_index": header.chunk_index,
    }
    if header.root is not None:
        out["root"] = header.root
    if header.scales is not None:
        out |= {"width": header.width, "block_elements": header.block_elements, "scales": header.scales.hex()}
    if header.members is not None:
        out["members"] = header.members.hex()
    if header.quorum is not None:
        out |= {"quorum": header.quorum, "wait_ms": header.wait_ms}
    return out


def integers(message: ChunkMessage) -> list[int]:
    """The payload's integers, attestations included."""
    return [int(v) for v in np.frombuffer(message.payload, dtype=f"<i{message.width}")]


def message_json(message: ChunkMessage) -> Vector:
    return {
        "message_name": message.TYPE.name,
        "contributors": sorted(ranks_from_bitmap(message.contributors)),
        "values": integers(message),
        "fields": message_to_json(message),
        "encoded": encode_message(message).hex(),
    }


def message_problems(part: Vector, header: Vector) -> list[str]:
    """What is wrong with a chunk message in its JSON form (decoded with this
    implementation): its fields, values, width, contributors and header."""
    message = decode_message(from_hex(part["encoded"]))
    problems = []
    if not isinstance(message, ChunkMessage) or message.TYPE.name != part["message_name"]:
        return [f"{part['message_name']} does not decode as that chunk message"]
    if message_to_json(message) != part["fields"]:
        problems.append("fields differ from the decoded message")
    if ref_payload(part["values"], header.get("width")) != (message.width, message.payload):
        problems.append("payload is not the values at the smallest (or the block-scaled) width")
    if sorted(ranks_from_bitmap(message.contributors)) != part["contributors"]:
        problems.append("contributors differ from the bitmap")
    for name, value in header.items():
        got = getattr(message, name)
        if (got.hex() if isinstance(got, bytes) else got) != value:
            problems.append(f"header field {name} differs")
    return problems


def chunk_header(
    *,
    kind: Collective = Collective.ALL_REDUCE,
    op: ReduceOp = ReduceOp.SUM,
    dtype: DType = DType.INT32,
    total: int = 4,
    chunk: int = 4,
    index: int = 0,
    epoch: int = EPOCH,
    op_id: int = 42,
    root: int | None = None,
    group_id: bytes = GROUP_ID,
    width: int | None = None,
    block_elements: int | None = None,
    scales: Sequence[int] | None = None,
    members: Sequence[int] | None = None,
    quorum: int | None = None,
    wait_ms: int | None = None,
) -> ChunkHeader:
    """A header of the payload vectors' group; small defaults, any field set by name."""
    return ChunkHeader(
        group_id=group_id,
        epoch=epoch,
        op_id=op_id,
        kind=kind,
        op=op,
        dtype=dtype,
        total_elements=total,
        chunk_elements=chunk,
        chunk_index=index,
        root=root,
        width=width,
        block_elements=block_elements,
        scales=None if scales is None else ref.pack(scales, 2),
        members=None if members is None else bitmap_from_ranks(members),
        quorum=quorum,
        wait_ms=wait_ms,
    )


def ref_payload(values: Sequence[int], width: int | None = None) -> tuple[int, bytes]:
    """(width, payload): little-endian two's complement at ``width``, or the smallest width."""
    w = width if width is not None else ref.smallest_width(values)
    return w, ref.pack(values, w)


def bits(x: np.ndarray) -> str:
    """An array's bytes, as they are in memory (little-endian here), in hex."""
    return np.ascontiguousarray(x).tobytes().hex()


# --- chunk messages read with the generic CBOR decoder only ---------------------------------


def raw_body(encoded: str) -> dict[int, Any]:
    """The body map of an encoded message, read with the generic CBOR decoder only."""
    item = cbor.decode(from_hex(encoded))
    assert isinstance(item, list) and isinstance(item[1], dict)
    return {int(k): value for k, value in item[1].items()}


HEADER_KEYS = {
    "group_id": 1,
    "epoch": 2,
    "op_id": 3,
    "kind": 4,
    "op": 5,
    "dtype": 6,
    "scales": 7,
    "total_elements": 8,
    "chunk_elements": 9,
    "chunk_index": 10,
    "width": 12,
    "root": 15,
    "block_elements": 16,
}


def raw_chunk_problems(part: Vector, header: Vector, width: int | None) -> list[str]:
    """The encoded chunk message carries ``header``, the part's values at ``width`` (or
    the smallest width), its contributors and its tag."""
    problems = []
    body = raw_body(part["encoded"])
    for name, key in HEADER_KEYS.items():
        if name == "width":
            continue
        want = header.get(name)
        got = body.get(key)
        if (got.hex() if isinstance(got, bytes) else got) != want:
            problems.append(f"{part['message_name']}: {name} differs from the header")
    values = part["values"]
    w = width if width is not None else ref.smallest_width(values)
    if body.get(12) != w or body.get(13) != ref.pack(values, w):
        problems.append(f"{part['message_name']}: payload is not the values at width {w}")
    bits = int.from_bytes(body.get(11, b""), "little")
    if [r for r in range(bits.bit_length()) if bits >> r & 1] != part["contributors"]:
        problems.append(f"{part['message_name']}: contributors differ from the bitmap")
    if body.get(14) != part["fields"].get("tag"):
        problems.append(f"{part['message_name']}: tag differs from fields")
    return problems


def verify_as_endpoint(
    keys: GroupKeys,
    message: ChunkMessage,
    header: ChunkHeader | None,
    expected: frozenset[int],
    own: tuple[int, np.ndarray] | None = None,
    at_least: int | None = None,
) -> np.ndarray | None:
    """What an endpoint running the operation whose chunk has the identifying fields
    ``header`` does with ``message`` (draft section "Endpoint Processing of Results"):
    None when the message is of another epoch (ignored), OPERATION_MISMATCH when another
    header field differs, else the verification's element integers or its error."""
    if header is not None:
        if message.epoch != header.epoch:
            return None
        if ChunkHeader.of(message) != header:
            raise CcoError(ErrorCode.OPERATION_MISMATCH, "the header is not the operation's")
    return open_verified(keys, message, expected, own, at_least)
