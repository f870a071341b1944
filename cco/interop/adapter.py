"""This implementation's adapter for ``cco-interop vectors``: the example to copy.

An adapter is a process that reads one JSON request per line on stdin and writes
one JSON response per line on stdout, in order, until stdin closes.  The
protocol (``interop/README.md``, "Vector mode") is small on purpose: each
operation is one function of the draft (decode, encode, frame, keys, tag,
combine, verify, wire forms, block scales), its inputs and outputs in the
vectors' JSON spelling (bytes as lowercase hex, integers as numbers).  The
runner holds the vectors and judges; the adapter only computes.

Response forms::

    {"id": N, "ok": {...}}                   the operation's result
    {"id": N, "error": {"code": C, ...}}     the input was refused with CCO error code C
    {"id": N, "unsupported": true}           this implementation lacks the operation
    {"id": N, "bad_request": "..."}          the adapter could not read the request

A request is ``{"id": N, "call": NAME, ...arguments}``.

Run it with ``cco-interop adapter`` or ``python -m cco.interop.adapter``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

import numpy as np

from cco.interop.jsonform import (
    from_hex,
    header_from_json,
    limits_from_json,
    message_from_json,
    message_to_json,
)
from cco.interop.vectorfiles.common import verify_as_endpoint
from cco.wire import blockscale
from cco.wire.cbor import DecodeLimits
from cco.wire.dtypes import element_type
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.framing import FrameDecoder, encode_frame
from cco.wire.mac import INFO_K1, INFO_K2, contribution_tag, hkdf_expand_32, hkdf_extract
from cco.wire.messages import ChunkMessage, PartialAggregate, Result, decode_message, encode_message
from cco.wire.ops import Form, form, sums_exactly
from cco.wire.payload import (
    combine,
    decode_values,
    derive_group_keys,
    encode_values,
)
from cco.wire.registries import Collective, DType, ReduceOp
from cco.workload import NUMPY_TYPES, make_input

Json = dict[str, Any]

STORAGE: dict[DType, Any] = {
    DType.INT8: np.int8,
    DType.INT16: np.int16,
    DType.INT32: np.int32,
    DType.INT64: np.int64,
    DType.FLOAT16: np.float16,
    DType.BFLOAT16: np.float32,  # bfloat16 elements travel in the vectors as float32 values
    DType.FLOAT32: np.float32,
    DType.FLOAT64: np.float64,
}


def _chunk(hex_text: str) -> ChunkMessage:
    message = decode_message(from_hex(hex_text))
    if not isinstance(message, ChunkMessage):
        raise CcoError(ErrorCode.INVALID_FIELD, f"{type(message).__name__} is not a chunk message")
    return message


def _elements(dtype: DType, bits: str) -> np.ndarray:
    return np.frombuffer(from_hex(bits), dtype=np.dtype(STORAGE[dtype]).newbyteorder("<"))


def op_decode(req: Json) -> Json:
    limits = limits_from_json(req["limits"]) if "limits" in req else DecodeLimits()
    message = decode_message(from_hex(req["message"]), limits)
    return {"message_type": int(message.TYPE), "fields": message_to_json(message)}


def op_encode(req: Json) -> Json:
    return {"message": encode_message(message_from_json(req["message_type"], req["fields"])).hex()}


def op_frame(req: Json) -> Json:
    return {"framed": encode_frame(from_hex(req["message"]), req["max_message_size"]).hex()}


def op_unframe(req: Json) -> Json:
    data = from_hex(req["framed"])
    decoder = FrameDecoder(req["max_message_size"])
    pieces = [data[i : i + 1] for i in range(len(data))] if req.get("bytewise") else [data]
    messages: list[bytes] = []
    for piece in pieces:
        messages += decoder.feed(piece)
    return {"messages": [m.hex() for m in messages], "buffered": decoder.buffered}


def op_keys(req: Json) -> Json:
    prk = hkdf_extract(from_hex(req["group_id"]), from_hex(req["group_secret"]))
    return {"k1": hkdf_expand_32(prk, INFO_K1).hex(), "k2": hkdf_expand_32(prk, INFO_K2).hex()}


def op_tag(req: Json) -> Json:
    header = header_from_json(req["header"])
    keys = derive_group_keys(from_hex(req["group_secret"]), header.group_id)
    values = np.array(req["values"], dtype=np.int64)
    return {
        "chunk_id": header.chunk_id().hex(),
        "tag": contribution_tag(keys, header.chunk_id(), req["rank"], values),
    }


def op_combine(req: Json) -> Json:
    cls = PartialAggregate if req.get("as") == "PARTIAL_AGGREGATE" else Result
    return {"message": encode_message(combine([_chunk(m) for m in req["inputs"]], cls)).hex()}


def op_verify(req: Json) -> Json:
    message = _chunk(req["message"])
    header = header_from_json(req["expected_header"]) if "expected_header" in req else None
    keys = derive_group_keys(from_hex(req["group_secret"]), from_hex(req["group_id"]))
    own = (req["own_rank"], np.array(req["own_values"], dtype=np.int64)) if "own_values" in req else None
    expected = frozenset(req["expected_ranks"])
    values = verify_as_endpoint(keys, message, header, expected, own, req.get("at_least"))
    if values is None:
        return {"ignored": True}
    return {"values": [int(v) for v in values]}


def op_wire_form(req: Json) -> Json:
    """A float SUM or AVG in a reduction is EXACT here (encoding: of at most 16
    elements); block-scaled operations have calls of their own (propose, quantize)."""
    dtype, kind, op = DType(req["dtype"]), Collective(req["kind"]), ReduceOp(req["op"])
    if req["direction"] == "encode":
        elements = _elements(dtype, req["input_bits"])
        exact = sums_exactly(kind, op, dtype, len(elements))
        wire = encode_values(elements, dtype, kind, op, req["world_size"], exact)
        return {"wire": [int(v) for v in wire]}
    exact = form(kind, op, dtype) is Form.BLOCK_SCALED
    wire = np.array(req["wire"], dtype=np.int64)
    out = decode_values(wire, dtype, kind, op, req["contributor_count"], exact)
    return {"output_bits": np.asarray(out, dtype=np.dtype(STORAGE[dtype]).newbyteorder("<")).tobytes().hex()}


def op_sum_limit(req: Json) -> Json:
    return {"sum_limit": blockscale.sum_limit(req["width"], req["world_size"])}


def op_propose(req: Json) -> Json:
    dtype = DType(req["dtype"])
    limit = blockscale.sum_limit(req["width"], req["world_size"])
    scales = blockscale.propose(
        _elements(dtype, req["input_bits"]), element_type(dtype), req["block_elements"], limit
    )
    return {"proposals": [int(s) for s in scales]}


def op_quantize(req: Json) -> Json:
    dtype = DType(req["dtype"])
    limit = blockscale.sum_limit(req["width"], req["world_size"])
    scales = np.array(req["scales"], dtype=np.int16)
    values = blockscale.quantize(
        _elements(dtype, req["input_bits"]), element_type(dtype), scales, req["block_elements"], limit
    )
    return {"values": [int(v) for v in values]}


def op_live_input(req: Json) -> Json:
    """The live-mode generator's input (interop/README.md, "Live inputs")."""
    dtype = DType(req["dtype"])
    if dtype not in NUMPY_TYPES:
        raise CcoError(ErrorCode.UNSUPPORTED_FEATURE, f"live inputs have no {dtype.name}")
    x = make_input(req["seed"], req["case"], req["rank"], dtype, req["elements"])
    return {"input_bits": x.astype(x.dtype.newbyteorder("<")).tobytes().hex()}


def op_dequantize(req: Json) -> Json:
    dtype = DType(req["dtype"])
    out = blockscale.dequantize(
        np.array(req["values"], dtype=np.int64),
        np.array(req["scales"], dtype=np.int16),
        req["block_elements"],
        req["divisor"],
        element_type(dtype),
    )
    return {"output_bits": np.asarray(out, dtype=np.dtype(STORAGE[dtype]).newbyteorder("<")).tobytes().hex()}


OPERATIONS: dict[str, Callable[[Json], Json]] = {
    "decode": op_decode,
    "encode": op_encode,
    "frame": op_frame,
    "unframe": op_unframe,
    "keys": op_keys,
    "tag": op_tag,
    "combine": op_combine,
    "verify": op_verify,
    "wire_form": op_wire_form,
    "sum_limit": op_sum_limit,
    "propose": op_propose,
    "quantize": op_quantize,
    "dequantize": op_dequantize,
    "live_input": op_live_input,
}
"""Every operation of the adapter protocol, by name."""


def answer(request: Json, operations: dict[str, Callable[[Json], Json]] = OPERATIONS) -> Json:
    """The response to one request; never raises for bad input."""
    ident = request.get("id")
    handler = operations.get(str(request.get("call")))
    if handler is None:
        return {"id": ident, "unsupported": True}
    try:
        return {"id": ident, "ok": handler(request)}
    except CcoError as error:
        return {
            "id": ident,
            "error": {"code": int(error.code), "name": error.code.name, "detail": error.detail},
        }
    except (KeyError, TypeError, ValueError) as error:  # a request this adapter cannot read
        return {"id": ident, "bad_request": f"{type(error).__name__}: {error}"}


def serve(stdin: TextIO, stdout: TextIO, operations: dict[str, Callable[[Json], Json]] = OPERATIONS) -> None:
    """Answer requests line by line until stdin closes (``operations``: what this
    adapter supports; a variant with fewer or different ones is a one-line change)."""
    for line in stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as error:
            response: Json = {"id": None, "bad_request": f"not JSON: {error}"}
        else:
            not_object: Json = {"id": None, "bad_request": "not an object"}
            response = answer(request, operations) if isinstance(request, dict) else not_object
        stdout.write(json.dumps(response) + "\n")
        stdout.flush()


def main() -> int:
    serve(sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
