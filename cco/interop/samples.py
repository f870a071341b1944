"""The catalogue of valid messages behind ``messages.json``.

Each sample is chosen to pin down one thing an independent implementation could
get wrong: the smallest and largest value of a range, an optional field present
and absent, an empty bitmap where one is allowed, a multi-byte UTF-8 string at its
byte limit, CBOR length boundaries (23/24, 255/256), nested structures.  Every
"random-looking" byte string is derived from a fixed label with SHAKE-256, so the
catalogue is the same on every run and every machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from cco.wire.errors import ErrorCode
from cco.wire.exact import MAX_ELEMENTS
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import (
    MAC_MODULUS,
    MAX_BLOCK_ELEMENTS,
    MAX_CHUNK_ELEMENTS,
    MAX_LIVENESS_MS,
    MIN_BLOCK_ELEMENTS,
    Abort,
    Address,
    AggregatorAccept,
    AggregatorRegister,
    AggregatorView,
    BroadcastData,
    Capabilities,
    ChunkAck,
    ChunkMessage,
    Contribution,
    EpochChange,
    Error,
    GroupParams,
    GroupView,
    Heartbeat,
    Hello,
    HelloAck,
    JoinAccept,
    JoinReject,
    JoinRequest,
    Leave,
    MemberView,
    Message,
    NodeRef,
    PartialAggregate,
    RecordView,
    Report,
    Result,
    RetransmitRequest,
    StatusReply,
    StatusRequest,
    TreeAssignment,
    TreeNodeView,
    chunk_length,
)
from cco.wire.registries import (
    GROUP_ID_SIZE,
    GROUP_SECRET_SIZE,
    MAX_WORLD_SIZE,
    Collective,
    DType,
    MessageType,
    ReduceOp,
    Role,
)

U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Sample:
    """One valid message with a unique name and what it is meant to exercise."""

    name: str
    description: str
    message: Message


def det_bytes(label: str, size: int) -> bytes:
    """``size`` fixed pseudo-random bytes named by ``label`` (SHAKE-256, no seed state)."""
    return hashlib.shake_256(b"cco-interop/" + label.encode("utf-8")).digest(size)


def det_int(label: str, bound: int) -> int:
    """A fixed pseudo-random integer in ``[0, bound)`` named by ``label``."""
    return int.from_bytes(det_bytes(label, 16), "big") % bound


def pack(elements: Sequence[int], width: int) -> bytes:
    """Elements as little-endian two's complement integers of ``width`` bytes."""
    return b"".join(e.to_bytes(width, "little", signed=True) for e in elements)


def group_id(label: str) -> bytes:
    return det_bytes(f"group/{label}", GROUP_ID_SIZE)


def tag(label: str) -> int:
    """A stand-in MAC tag: any element of F_p is valid at the message layer."""
    return det_int(f"tag/{label}", MAC_MODULUS)


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

PARAMS = GroupParams(
    chunk_elements=4096, window=8, heartbeat_interval_ms=1000, operation_timeout_ms=30_000, block_elements=256
)
MIN_PARAMS = GroupParams(
    chunk_elements=1,
    window=1,
    heartbeat_interval_ms=10,
    operation_timeout_ms=10,
    block_elements=MIN_BLOCK_ELEMENTS,
    float_width=1,
    liveness_ms=20,
)
MAX_PARAMS = GroupParams(
    chunk_elements=MAX_CHUNK_ELEMENTS,
    window=4096,
    heartbeat_interval_ms=600_000,
    operation_timeout_ms=86_400_000,
    block_elements=MAX_BLOCK_ELEMENTS,
    float_width=8,
    liveness_ms=MAX_LIVENESS_MS,
)

# 255 UTF-8 bytes: 85 three-byte characters (U+20AC EURO SIGN).
NODE_ID_MAX = "\u20ac" * 85
# 64 UTF-8 bytes: 32 two-byte characters (U+00E9).
LABEL_MAX = "\u00e9" * 32


def _node(name: str, host: str, port: int, ranks: Sequence[int]) -> NodeRef:
    return NodeRef(node_id=name, address=Address(host=host, port=port), ranks=bitmap_from_ranks(ranks))


def _chunk(
    cls: type[ChunkMessage],
    label: str,
    *,
    kind: Collective,
    op: ReduceOp,
    dtype: DType,
    elements: Sequence[int],
    total_elements: int,
    chunk_elements: int,
    chunk_index: int,
    contributors: Sequence[int],
    width: int,
    scales: Sequence[int] | None = None,
    block_elements: int | None = None,
    tagged: bool = True,
    root: int | None = None,
    epoch: int = 3,
    op_id: int = 7,
    members: Sequence[int] | None = None,
    quorum: int | None = None,
    wait_ms: int | None = None,
) -> ChunkMessage:
    n = chunk_length(total_elements, chunk_elements, chunk_index)
    blocks = 0 if block_elements is None else -(-n // block_elements)
    assert len(elements) == n + blocks, "a block-scaled chunk's elements end with one attestation per block"
    assert (scales is None) == (block_elements is None) and len(scales or ()) == blocks
    assert scales is None or total_elements > MAX_ELEMENTS, "a float sum of at most 16 elements is EXACT"
    return cls(
        group_id=group_id("training"),
        epoch=epoch,
        op_id=op_id,
        kind=kind,
        op=op,
        dtype=dtype,
        scales=None if scales is None else pack(scales, 2),
        total_elements=total_elements,
        chunk_elements=chunk_elements,
        chunk_index=chunk_index,
        contributors=bitmap_from_ranks(contributors),
        width=width,
        payload=pack(elements, width),
        tag=tag(label) if tagged else None,
        root=root,
        block_elements=block_elements,
        members=None if members is None else bitmap_from_ranks(members),
        quorum=quorum,
        wait_ms=wait_ms,
    )


def _connection_samples() -> list[Sample]:
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


def _status_samples() -> list[Sample]:
    group = group_id("training")
    members = (
        *(MemberView(rank=rank, node_id=f"ep-{rank}", state="assigned", connected=1) for rank in range(3)),
        MemberView(rank=3, node_id="ep-3", state="joined", connected=0),
    )
    tree = (
        TreeNodeView(node_id="agg-0", ranks=bitmap_from_ranks(range(4))),
        TreeNodeView(node_id="agg-1", ranks=bitmap_from_ranks([2, 3]), parent="agg-0"),
    )
    record = RecordView(
        group_id=group,
        epoch=2,
        op_id=52,
        chunk_index=17,
        kind=Collective.ALL_REDUCE,
        state="collecting",
        elements=32768,
        missing=bitmap_from_ranks([3]),
        started_ms=120_500,
        updated_ms=120_512,
    )
    return [
        Sample(
            "status-request-no-records",
            "StatusRequest without flight-recorder entries.",
            StatusRequest(records=0),
        ),
        Sample(
            "status-request-max",
            "StatusRequest for the most entries a reply may carry.",
            StatusRequest(records=4096),
        ),
        Sample(
            "status-reply-rendezvous",
            "A rendezvous's StatusReply: a group of 4 over a two-level tree (one member away, "
            "optional world_size present) and the aggregators with their load.",
            StatusReply(
                role=Role.RENDEZVOUS,
                node_id="rendezvous",
                uptime_ms=3_600_000,
                groups=(
                    GroupView(
                        group_id=group, epoch=2, state="active", world_size=4, members=members, tree=tree
                    ),
                ),
                aggregators=(
                    AggregatorView(
                        node_id="agg-0",
                        address=Address(host="10.0.0.1", port=4434),
                        capacity=16,
                        max_fan_in=8,
                        groups=1,
                        connected=1,
                        labels=("rack-a",),
                    ),
                    AggregatorView(
                        node_id="agg-1",
                        address=Address(host="10.0.0.2", port=4434),
                        capacity=1,
                        max_fan_in=2,
                        groups=1,
                        connected=0,
                        labels=(),
                    ),
                ),
                records=(),
                omitted=0,
            ),
        ),
        Sample(
            "status-reply-aggregator",
            "An aggregator's StatusReply: its place in one tree (no world_size), an operation "
            "entry (chunk_index absent) and a chunk still missing rank 3; 5 entries omitted.",
            StatusReply(
                role=Role.AGGREGATOR,
                node_id="agg-1",
                uptime_ms=0,
                groups=(GroupView(group_id=group, epoch=2, state="active", members=(), tree=tree[1:]),),
                aggregators=(),
                records=(
                    RecordView(
                        group_id=group,
                        epoch=2,
                        op_id=52,
                        kind=Collective.ALL_REDUCE,
                        state="collecting",
                        elements=1 << 20,
                        missing=b"",
                        started_ms=120_400,
                        updated_ms=120_512,
                    ),
                    record,
                ),
                omitted=5,
            ),
        ),
    ]


def _membership_samples() -> list[Sample]:
    return [
        Sample(
            "join-request-any-rank",
            "JoinRequest without a rank (optional key 4 absent): the rendezvous assigns one.",
            JoinRequest(
                group_id=group_id("training"),
                world_size=4,
                credential=det_bytes("credential/training", 32),
                labels=("rack-a",),
            ),
        ),
        Sample(
            "join-request-rank",
            "JoinRequest asking for rank 3 of 4, with an empty credential and no labels.",
            JoinRequest(group_id=group_id("training"), world_size=4, credential=b"", rank=3, labels=()),
        ),
        Sample(
            "join-request-max",
            "JoinRequest at its bounds: world_size 2^16, rank 2^16-1, a 1024-byte credential, 16 labels "
            "of 64 UTF-8 bytes each.",
            JoinRequest(
                group_id=group_id("large"),
                world_size=MAX_WORLD_SIZE,
                credential=det_bytes("credential/large", 1024),
                rank=MAX_WORLD_SIZE - 1,
                labels=(LABEL_MAX,) * 16,
            ),
        ),
        Sample(
            "join-accept",
            "JoinAccept giving rank 2 of 4 in epoch 3, with the group secret and parameters.",
            JoinAccept(
                group_id=group_id("training"),
                rank=2,
                world_size=4,
                epoch=3,
                group_secret=det_bytes("secret/training", GROUP_SECRET_SIZE),
                params=PARAMS,
            ),
        ),
        Sample(
            "join-accept-bounds",
            "JoinAccept for a group of one (rank 0) at the largest epoch, with the smallest parameters.",
            JoinAccept(
                group_id=group_id("solo"),
                rank=0,
                world_size=1,
                epoch=U64_MAX,
                group_secret=det_bytes("secret/solo", GROUP_SECRET_SIZE),
                params=MIN_PARAMS,
            ),
        ),
        Sample(
            "join-reject",
            "JoinReject: the group is full.",
            JoinReject(group_id=group_id("training"), code=ErrorCode.GROUP_FULL, detail="4 of 4 ranks taken"),
        ),
        Sample(
            "leave",
            "An orderly Leave of rank 1.",
            Leave(group_id=group_id("training"), rank=1, code=ErrorCode.NO_ERROR),
        ),
        Sample(
            "leave-max-rank",
            "The rendezvous removes rank 2^16-1 after it stopped responding.",
            Leave(group_id=group_id("large"), rank=MAX_WORLD_SIZE - 1, code=ErrorCode.PEER_LOST),
        ),
        Sample(
            "report",
            "An endpoint reports that the Result of operation 12 in epoch 3, delivered by agg-7, "
            "failed verification.",
            Report(
                group_id=group_id("training"),
                epoch=3,
                op_id=12,
                code=ErrorCode.VERIFICATION_FAILED,
                parent="agg-7",
                detail="chunk 0: the tag does not verify",
            ),
        ),
        Sample(
            "report-operation-mismatch",
            "An endpoint reports a Result, delivered by agg-7, whose header is not that of "
            "operation 13 to which it contributed.",
            Report(
                group_id=group_id("training"),
                epoch=3,
                op_id=13,
                code=ErrorCode.OPERATION_MISMATCH,
                parent="agg-7",
                detail="chunk 0: Result of another length",
            ),
        ),
        Sample(
            "report-bounds",
            "A Report at the largest epoch and op_id, with the longest parent node_id (255 bytes "
            "of UTF-8) and an empty detail.",
            Report(
                group_id=group_id("large"),
                epoch=U64_MAX,
                op_id=U64_MAX,
                code=ErrorCode.VERIFICATION_FAILED,
                parent=NODE_ID_MAX,
                detail="",
            ),
        ),
        Sample(
            "aggregator-register",
            "An aggregator offers 64 slots and a fan-in of 16.",
            AggregatorRegister(
                address=Address(host="198.18.0.2", port=4433), capacity=64, max_fan_in=16, labels=("rack-a",)
            ),
        ),
        Sample(
            "aggregator-register-bounds",
            "AggregatorRegister at its lower bounds: capacity 1, fan-in 2, port 1, a one-byte host, "
            "no labels.",
            AggregatorRegister(address=Address(host="h", port=1), capacity=1, max_fan_in=2, labels=()),
        ),
        Sample(
            "aggregator-register-max",
            "AggregatorRegister at its upper bounds: a 255-byte host name, port 65535, capacity 2^20, "
            "fan-in 1024, 16 labels.",
            AggregatorRegister(
                address=Address(host=".".join(["a" * 63] * 4), port=65535),
                capacity=1 << 20,
                max_fan_in=1024,
                labels=("x",) * 16,
            ),
        ),
        Sample(
            "aggregator-accept",
            "The rendezvous accepts an aggregator with a 1 s heartbeat interval.",
            AggregatorAccept(node_id="agg-1", heartbeat_interval_ms=1000),
        ),
        Sample(
            "aggregator-accept-max",
            "AggregatorAccept with a 255-byte node_id (three-byte UTF-8 characters: valid in a message, "
            "outside the certificate alphabet) and the longest heartbeat interval (600000 ms).",
            AggregatorAccept(node_id=NODE_ID_MAX, heartbeat_interval_ms=600_000),
        ),
    ]


def _topology_samples() -> list[Sample]:
    root = _node("agg-root", "198.18.0.1", 4433, range(4))
    return [
        Sample(
            "tree-assignment-endpoint",
            "An endpoint's assignment (rank 1): a parent aggregator, no children, expected is the "
            "bitmap of the endpoint's own rank.",
            TreeAssignment(
                group_id=group_id("training"),
                epoch=3,
                world_size=4,
                expected=bitmap_from_ranks([1]),
                children=(),
                params=PARAMS,
                parent=_node("agg-1", "198.18.0.2", 4433, [0, 1]),
            ),
        ),
        Sample(
            "tree-assignment-root",
            "The root aggregator's assignment: two child aggregators, every rank expected, no parent.",
            TreeAssignment(
                group_id=group_id("training"),
                epoch=3,
                world_size=4,
                expected=bitmap_from_ranks(range(4)),
                children=(
                    _node("agg-1", "198.18.0.2", 4433, [0, 1]),
                    _node("agg-2", "198.18.0.3", 4433, [2, 3]),
                ),
                params=PARAMS,
            ),
        ),
        Sample(
            "tree-assignment-inner",
            "An inner aggregator: endpoint children, a parent, and ranks 0, 1 and 9 expected "
            "(a two-byte bitmap).",
            TreeAssignment(
                group_id=group_id("training"),
                epoch=4,
                world_size=10,
                expected=bitmap_from_ranks([0, 1, 9]),
                children=(
                    _node("endpoint-0", "198.18.1.1", 5000, [0]),
                    _node("endpoint-1", "198.18.1.2", 5000, [1]),
                    _node("endpoint-9", "198.18.1.10", 5000, [9]),
                ),
                params=MAX_PARAMS,
                parent=root,
            ),
        ),
        Sample(
            "epoch-change",
            "The group moves to epoch 4 after rank 2 was lost: members 0, 1, 3.",
            EpochChange(
                group_id=group_id("training"),
                epoch=4,
                members=bitmap_from_ranks([0, 1, 3]),
                code=ErrorCode.PEER_LOST,
            ),
        ),
        Sample(
            "epoch-change-empty",
            "EpochChange with an empty members bitmap (the group is dissolved).",
            EpochChange(group_id=group_id("training"), epoch=5, members=b"", code=ErrorCode.SHUTTING_DOWN),
        ),
        Sample(
            "epoch-change-rank-max",
            "EpochChange whose only member is rank 2^16-1: an 8192-byte bitmap, the largest allowed.",
            EpochChange(
                group_id=group_id("large"),
                epoch=1,
                members=bitmap_from_ranks([MAX_WORLD_SIZE - 1]),
                code=ErrorCode.NO_ERROR,
            ),
        ),
    ]


def _chunk_samples() -> list[Sample]:
    return [
        Sample(
            "contribution-presence-pass",
            "Rank 2's presence pass of a quorum all-reduce: one int8 element 1, SUM, tagged; "
            "quorum 3 (key 18) and wait_ms 250 (key 19).",
            _chunk(
                Contribution,
                "presence",
                kind=Collective.ALL_REDUCE,
                op=ReduceOp.SUM,
                dtype=DType.INT8,
                elements=[1],
                total_elements=1,
                chunk_elements=4,
                chunk_index=0,
                contributors=[2],
                width=1,
                op_id=6,
                quorum=3,
                wait_ms=250,
            ),
        ),
        Sample(
            "result-decided-members",
            "The Result of an operation a presence pass decided: members (key 17) ranks 0, 2 and 3 "
            "(bitmap 0d), who are exactly its contributors; int32 SUM, width 2.",
            _chunk(
                Result,
                "members",
                kind=Collective.ALL_REDUCE,
                op=ReduceOp.SUM,
                dtype=DType.INT32,
                elements=[6, -300],
                total_elements=2,
                chunk_elements=4,
                chunk_index=0,
                contributors=[0, 2, 3],
                width=2,
                members=[0, 2, 3],
            ),
        ),
        Sample(
            "contribution-all-reduce-sum",
            "Rank 0's first chunk of a 10-element int32 SUM all-reduce in chunks of 4: elements "
            "[1, -2, 300, -20000], width 2 (the smallest holding them), tagged.",
            _chunk(
                Contribution,
                "c0",
                kind=Collective.ALL_REDUCE,
                op=ReduceOp.SUM,
                dtype=DType.INT32,
                elements=[1, -2, 300, -20000],
                total_elements=10,
                chunk_elements=4,
                chunk_index=0,
                contributors=[0],
                width=2,
            ),
        ),
        Sample(
            "contribution-last-chunk",
            "The last, shorter chunk (index 2 holds 2 of 10 elements) of the same operation, from rank 3.",
            _chunk(
                Contribution,
                "c2",
                kind=Collective.ALL_REDUCE,
                op=ReduceOp.SUM,
                dtype=DType.INT32,
                elements=[7, -7],
                total_elements=10,
                chunk_elements=4,
                chunk_index=2,
                contributors=[3],
                width=1,
            ),
        ),
        Sample(
            "contribution-reduce-root",
            "A REDUCE contribution: root (key 15) present; a float32 AVG of 18 elements (more than 16, "
            "so block-scaled) in chunks of 16: its last chunk (index 1) holds 2 elements in one block "
            "(key 16: blocks of 16) with scale -16 (scales f0ff: int16, little-endian), width 4 "
            "(float32's own), the two element integers then the attestation 1.",
            _chunk(
                Contribution,
                "reduce",
                kind=Collective.REDUCE,
                op=ReduceOp.AVG,
                dtype=DType.FLOAT32,
                elements=[65536, -32768, 1],
                total_elements=18,
                chunk_elements=16,
                chunk_index=1,
                contributors=[1],
                width=4,
                scales=[-16],
                block_elements=16,
                root=2,
            ),
        ),
        Sample(
            "contribution-max-untagged",
            "A MAX all-reduce contribution: no tag (key 14 absent), width 8, int64 extremes, "
            "chunk_elements 2^20 (its largest value).",
            _chunk(
                Contribution,
                "max",
                kind=Collective.ALL_REDUCE,
                op=ReduceOp.MAX,
                dtype=DType.INT64,
                elements=[-(1 << 63), (1 << 63) - 1],
                total_elements=2,
                chunk_elements=MAX_CHUNK_ELEMENTS,
                chunk_index=0,
                contributors=[2],
                width=8,
                tagged=False,
            ),
        ),
        Sample(
            "contribution-barrier",
            "A barrier: zero elements, one empty chunk (index 0), empty payload, tagged.",
            _chunk(
                Contribution,
                "barrier",
                kind=Collective.BARRIER,
                op=ReduceOp.SUM,
                dtype=DType.INT8,
                elements=[],
                total_elements=0,
                chunk_elements=1,
                chunk_index=0,
                contributors=[0],
                width=1,
            ),
        ),
        Sample(
            "contribution-bounds",
            "Header fields at their bounds: epoch and op_id 2^64-1, total_elements 2^40 "
            "in chunks of 2^20-1, so the last chunk (index 2^20+1) holds one element; rank 2^16-1 "
            "contributing (an 8192-byte bitmap), tag p-1.",
            dataclasses.replace(
                _chunk(
                    Contribution,
                    "bounds",
                    kind=Collective.ALL_REDUCE,
                    op=ReduceOp.SUM,
                    dtype=DType.INT8,
                    elements=[-128],
                    total_elements=1 << 40,
                    chunk_elements=MAX_CHUNK_ELEMENTS - 1,
                    chunk_index=MAX_CHUNK_ELEMENTS + 1,
                    contributors=[MAX_WORLD_SIZE - 1],
                    width=1,
                    epoch=U64_MAX,
                    op_id=U64_MAX,
                ),
                tag=MAC_MODULUS - 1,
            ),
        ),
        Sample(
            "partial-aggregate-bitand",
            "A partial BAND aggregate of ranks 0-3 and 8 (a two-byte contributors bitmap), untagged.",
            _chunk(
                PartialAggregate,
                "band",
                kind=Collective.ALL_REDUCE,
                op=ReduceOp.BAND,
                dtype=DType.INT16,
                elements=[0x0F0F, -1, 0],
                total_elements=3,
                chunk_elements=8,
                chunk_index=0,
                contributors=[0, 1, 2, 3, 8],
                width=2,
                tagged=False,
            ),
        ),
        Sample(
            "partial-aggregate-reduce-scatter",
            "A partial float64 SUM aggregate of a reduce-scatter (unrooted) of 34 elements from ranks 0 "
            "and 1: block-scaled with the largest block_elements (2^16, so one block per chunk) and the "
            "smallest scale (-32768); chunk 1 holds two element integers then the attestation sum 2, "
            "width 8.",
            _chunk(
                PartialAggregate,
                "rs",
                kind=Collective.REDUCE_SCATTER,
                op=ReduceOp.SUM,
                dtype=DType.FLOAT64,
                elements=[1 << 40, -(1 << 40), 2],
                total_elements=34,
                chunk_elements=2,
                chunk_index=1,
                contributors=[0, 1],
                width=8,
                scales=[-(1 << 15)],
                block_elements=MAX_BLOCK_ELEMENTS,
            ),
        ),
        Sample(
            "result-all-reduce",
            "The complete result of a 100-rank all-reduce chunk: contributors 0..99 (13-byte bitmap).",
            _chunk(
                Result,
                "result",
                kind=Collective.ALL_REDUCE,
                op=ReduceOp.SUM,
                dtype=DType.INT32,
                elements=[4950, -100, 0, 123456],
                total_elements=4,
                chunk_elements=4,
                chunk_index=0,
                contributors=range(100),
                width=4,
            ),
        ),
        Sample(
            "result-block-scaled",
            "The result of a 4-rank float32 SUM chunk of 40 elements in blocks of 16 (the smallest "
            "block_elements): three blocks (16, 16, 8 elements) with scales 12, 32767 (a block of "
            "zeros) and -3; width 2 (a narrower width than float32's, by request), 40 element "
            "integers then the attestation sums 1, 4 and 2.",
            _chunk(
                Result,
                "result-scaled",
                kind=Collective.ALL_REDUCE,
                op=ReduceOp.SUM,
                dtype=DType.FLOAT32,
                elements=[*(det_int(f"rs/{i}", 65535) - 32767 for i in range(16)), *[0] * 16]
                + [det_int(f"rs/{i}", 20001) - 10000 for i in range(16, 24)]
                + [1, 4, 2],
                total_elements=40,
                chunk_elements=40,
                chunk_index=0,
                contributors=range(4),
                width=2,
                scales=[12, (1 << 15) - 1, -3],
                block_elements=MIN_BLOCK_ELEMENTS,
            ),
        ),
        Sample(
            "result-max-float32-ordered",
            "The result of a float32 MAX: ordered keys of -inf, -0.0, the smallest subnormal and "
            "+inf (a negative pattern has its 31 magnitude bits flipped); untagged, no scales, width 4.",
            _chunk(
                Result,
                "max-ordered",
                kind=Collective.ALL_REDUCE,
                op=ReduceOp.MAX,
                dtype=DType.FLOAT32,
                elements=[-0x7F800001, -1, 1, 0x7F800000],
                total_elements=4,
                chunk_elements=4,
                chunk_index=0,
                contributors=range(3),
                width=4,
                tagged=False,
            ),
        ),
        Sample(
            "result-all-gather",
            "An all-gather result chunk carrying rank 5's slot, tagged.",
            _chunk(
                Result,
                "gather",
                kind=Collective.ALL_GATHER,
                op=ReduceOp.SUM,
                dtype=DType.INT8,
                elements=[5, 5, -5],
                total_elements=24,
                chunk_elements=3,
                chunk_index=5,
                contributors=[5],
                width=1,
            ),
        ),
        Sample(
            "result-reduce",
            "The result of a MIN reduce, delivered to root 1: root present, untagged, contributors 0..3.",
            _chunk(
                Result,
                "reduce-min",
                kind=Collective.REDUCE,
                op=ReduceOp.MIN,
                dtype=DType.INT16,
                elements=[-300, 2],
                total_elements=2,
                chunk_elements=2,
                chunk_index=0,
                contributors=range(4),
                width=2,
                tagged=False,
                root=1,
            ),
        ),
        Sample(
            "broadcast-data",
            "A broadcast chunk from root 0: kind BROADCAST, root present, tagged; bfloat16 as 16-bit "
            "patterns (form PATTERNS), so no scales.",
            _chunk(
                BroadcastData,
                "bcast",
                kind=Collective.BROADCAST,
                op=ReduceOp.SUM,
                dtype=DType.BFLOAT16,
                elements=[1000, -1000],
                total_elements=2,
                chunk_elements=2,
                chunk_index=0,
                contributors=[0],
                width=2,
                root=0,
            ),
        ),
        Sample(
            "chunk-ack",
            "ChunkAck for chunk 0.",
            ChunkAck(group_id=group_id("training"), epoch=3, op_id=7, chunks=(0,)),
        ),
        Sample(
            "chunk-ack-many",
            "ChunkAck listing 4096 chunks (the most allowed), crossing the 23/24 and 255/256 "
            "integer boundaries.",
            ChunkAck(group_id=group_id("training"), epoch=3, op_id=8, chunks=tuple(range(4096))),
        ),
        Sample(
            "retransmit-request",
            "RetransmitRequest for chunks 1 and 2 without a missing bitmap (key 5 absent).",
            RetransmitRequest(group_id=group_id("training"), epoch=3, op_id=7, chunks=(1, 2)),
        ),
        Sample(
            "retransmit-request-missing",
            "RetransmitRequest naming ranks 2 and 3 as missing, for the largest chunk index 2^64-1.",
            RetransmitRequest(
                group_id=group_id("training"),
                epoch=3,
                op_id=7,
                chunks=(U64_MAX,),
                missing=bitmap_from_ranks([2, 3]),
            ),
        ),
        Sample(
            "retransmit-request-empty-missing",
            "RetransmitRequest with an empty missing bitmap (present but no rank set).",
            RetransmitRequest(group_id=group_id("training"), epoch=3, op_id=7, chunks=(0,), missing=b""),
        ),
        Sample(
            "abort",
            "Abort of operation 7 after a timeout, naming rank 2 as missing.",
            Abort(
                group_id=group_id("training"),
                epoch=3,
                op_id=7,
                code=ErrorCode.TIMEOUT,
                detail="rank 2 did not contribute within 30000 ms",
                missing=bitmap_from_ranks([2]),
            ),
        ),
        Sample(
            "abort-no-missing",
            "Abort by the application: no missing bitmap (key 6 absent), empty detail.",
            Abort(group_id=group_id("training"), epoch=3, op_id=9, code=ErrorCode.ABORTED, detail=""),
        ),
    ]


def samples() -> list[Sample]:
    """Every valid sample, grouped by message type in registry order."""
    found = [
        *_connection_samples(),
        *_status_samples(),
        *_membership_samples(),
        *_topology_samples(),
        *_chunk_samples(),
    ]
    names = [s.name for s in found]
    assert len(set(names)) == len(names), "sample names are unique"
    assert {s.message.TYPE for s in found} == set(MessageType), "every message type has a sample"
    return sorted(found, key=lambda s: int(s.message.TYPE))
