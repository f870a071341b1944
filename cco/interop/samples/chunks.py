"""Valid samples of the data-plane messages: chunks of a collective and their control.

Contribution, PartialAggregate, Result and BroadcastData for every collective kind
(elements, widths, block scales, tags, quorum fields), and ChunkAck,
RetransmitRequest and Abort, which name chunks of an operation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from cco.interop.samples.common import U64_MAX, Sample, det_int, group_id
from cco.wire.errors import ErrorCode
from cco.wire.exact import MAX_ELEMENTS
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import (
    MAC_MODULUS,
    MAX_BLOCK_ELEMENTS,
    MAX_CHUNK_ELEMENTS,
    MIN_BLOCK_ELEMENTS,
    Abort,
    BroadcastData,
    ChunkAck,
    ChunkMessage,
    Contribution,
    PartialAggregate,
    Result,
    RetransmitRequest,
    chunk_length,
)
from cco.wire.registries import MAX_WORLD_SIZE, Collective, DType, ReduceOp


def pack(elements: Sequence[int], width: int) -> bytes:
    """Elements as little-endian two's complement integers of ``width`` bytes."""
    return b"".join(e.to_bytes(width, "little", signed=True) for e in elements)


def tag(label: str) -> int:
    """A stand-in MAC tag: any element of F_p is valid at the message layer."""
    return det_int(f"tag/{label}", MAC_MODULUS)


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


def chunk_samples() -> list[Sample]:
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
