"""Valid samples of the connection messages: Hello, HelloAck, Error and Heartbeat.

Capability lists empty, full and at their upper bounds, an optional field present
and absent, and the heartbeat's seq at every CBOR integer length boundary.
"""

from __future__ import annotations

from cco.interop.samples.common import NODE_ID_MAX, U32_MAX, U64_MAX, Sample
from cco.wire.errors import ErrorCode
from cco.wire.messages import MAX_CHUNK_ELEMENTS, Capabilities, Error, Heartbeat, Hello, HelloAck
from cco.wire.registries import Collective, DType, ReduceOp, Role

FULL_CAPABILITIES = Capabilities(
    dtypes=tuple(DType),
    ops=tuple(ReduceOp),
    collectives=tuple(Collective),
    max_message_size=16 * 1024 * 1024,
    max_chunk_elements=65536,
    extensions=(),
)

MINIMAL_CAPABILITIES = Capabilities(
    dtypes=(),
    ops=(),
    collectives=(),
    max_message_size=1024,
    max_chunk_elements=1,
    extensions=(),
)

MAXIMAL_CAPABILITIES = Capabilities(
    dtypes=(DType.INT64, DType.INT8) * 32,
    ops=(ReduceOp.BXOR,) * 64,
    collectives=(Collective.REDUCE_SCATTER,) * 64,
    max_message_size=U32_MAX,
    max_chunk_elements=MAX_CHUNK_ELEMENTS,
    extensions=tuple(range(U32_MAX - 63, U32_MAX + 1)),
)


def connection_samples() -> list[Sample]:
    return [
        Sample(
            "hello-endpoint",
            "An endpoint's Hello offering version 2 and every registered dtype, op and collective.",
            Hello(versions=(2,), role=Role.ENDPOINT, node_id="endpoint-0", capabilities=FULL_CAPABILITIES),
        ),
        Sample(
            "hello-minimal",
            "Hello with empty capability lists and the smallest max_message_size (1024) and "
            "max_chunk_elements (1); a one-character node_id.",
            Hello(versions=(2,), role=Role.AGGREGATOR, node_id="a", capabilities=MINIMAL_CAPABILITIES),
        ),
        Sample(
            "hello-maximal",
            "Hello at every upper bound: 16 versions up to 2^32-1, a 255-byte node_id of three-byte "
            "UTF-8 characters, 64-entry capability lists, max_message_size 2^32-1, max_chunk_elements "
            "2^20, extensions 2^32-64 .. 2^32-1.  A valid message: decoders check a node_id's length and "
            "UTF-8 only; the a-z 0-9 - . alphabet binds certificates, so this Hello could never match one.",
            Hello(
                versions=(*range(1, 16), U32_MAX),
                role=Role.RENDEZVOUS,
                node_id=NODE_ID_MAX,
                capabilities=MAXIMAL_CAPABILITIES,
            ),
        ),
        Sample(
            "hello-ack-rendezvous",
            "The rendezvous accepts version 2.",
            HelloAck(version=2, role=Role.RENDEZVOUS, node_id="rendezvous", capabilities=FULL_CAPABILITIES),
        ),
        Sample(
            "hello-ack-version-max",
            "HelloAck selecting version 2^32-1 (the largest encodable), with minimal capabilities.",
            HelloAck(
                version=U32_MAX, role=Role.AGGREGATOR, node_id="agg-1", capabilities=MINIMAL_CAPABILITIES
            ),
        ),
        Sample(
            "error-with-type",
            "Error naming the offending message type (optional key 3 present).",
            Error(
                code=ErrorCode.UNKNOWN_MESSAGE_TYPE,
                detail="message type 39 is not registered",
                message_type=39,
            ),
        ),
        Sample(
            "error-without-type",
            "Error with an empty detail and no message_type (optional key 3 absent).",
            Error(code=ErrorCode.NO_ERROR, detail=""),
        ),
        Sample(
            "error-max",
            "Error at its bounds: the largest registered code, a 1024-byte detail, message_type 255.",
            Error(code=ErrorCode.SHUTTING_DOWN, detail="x" * 1024, message_type=255),
        ),
        Sample("heartbeat-zero", "Heartbeat with seq 0.", Heartbeat(seq=0)),
        Sample("heartbeat-23", "seq 23: the largest integer encoded in the initial byte.", Heartbeat(seq=23)),
        Sample(
            "heartbeat-24", "seq 24: the smallest integer needing a one-byte argument.", Heartbeat(seq=24)
        ),
        Sample(
            "heartbeat-256", "seq 256: the smallest integer needing a two-byte argument.", Heartbeat(seq=256)
        ),
        Sample(
            "heartbeat-65536",
            "seq 2^16: the smallest integer needing a four-byte argument.",
            Heartbeat(seq=65536),
        ),
        Sample(
            "heartbeat-4294967296",
            "seq 2^32: the smallest integer needing an eight-byte argument.",
            Heartbeat(seq=1 << 32),
        ),
        Sample("heartbeat-max", "seq 2^64-1: the largest unsigned CBOR integer.", Heartbeat(seq=U64_MAX)),
    ]
