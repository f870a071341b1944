"""Valid samples of the membership messages: joining a group, leaving it, and an
aggregator registering with the rendezvous.

Optional fields present and absent, and the ranges of ranks, world sizes, labels and
group parameters at their bounds.
"""

from __future__ import annotations

from cco.interop.samples.common import MIN_PARAMS, NODE_ID_MAX, PARAMS, U64_MAX, Sample, det_bytes, group_id
from cco.wire.errors import ErrorCode
from cco.wire.messages import (
    Address,
    AggregatorAccept,
    AggregatorRegister,
    JoinAccept,
    JoinReject,
    JoinRequest,
    Leave,
    Report,
)
from cco.wire.registries import GROUP_SECRET_SIZE, MAX_WORLD_SIZE

# 64 UTF-8 bytes: 32 two-byte characters (U+00E9).
LABEL_MAX = "\u00e9" * 32


def membership_samples() -> list[Sample]:
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
