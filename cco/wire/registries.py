"""Code points of the CCO registries (draft section "IANA Considerations").

Only numbers and names live here; how a dtype is carried and how an op combines
values belong to the payload modules.  Adding a code point means adding it here,
in ``spec/cco.cddl`` and in the draft's registry tables, in one change.
"""

from __future__ import annotations

from enum import IntEnum

PROTOCOL_VERSION_2 = 2
"""Version 2 carries floats at their own width (block-scaled fixed point); version 1,
which carried every float as a 64-bit fixed-point integer, is not spoken."""
SUPPORTED_VERSIONS = (PROTOCOL_VERSION_2,)
ALPN = "cco/2"

MAX_WORLD_SIZE = 1 << 16
GROUP_ID_SIZE = 16
GROUP_SECRET_SIZE = 32


class MessageType(IntEnum):
    """Registry "CCO Message Types"."""

    HELLO = 0x01
    HELLO_ACK = 0x02
    ERROR = 0x03
    HEARTBEAT = 0x04
    STATUS_REQUEST = 0x05
    STATUS_REPLY = 0x06
    JOIN_REQUEST = 0x10
    JOIN_ACCEPT = 0x11
    JOIN_REJECT = 0x12
    LEAVE = 0x13
    AGGREGATOR_REGISTER = 0x14
    AGGREGATOR_ACCEPT = 0x15
    TREE_ASSIGNMENT = 0x16
    EPOCH_CHANGE = 0x17
    REPORT = 0x18
    CONTRIBUTION = 0x20
    PARTIAL_AGGREGATE = 0x21
    RESULT = 0x22
    BROADCAST_DATA = 0x23
    CHUNK_ACK = 0x24
    RETRANSMIT_REQUEST = 0x25
    ABORT = 0x26


class Role(IntEnum):
    """Registry "CCO Roles"."""

    ENDPOINT = 1
    AGGREGATOR = 2
    RENDEZVOUS = 3


class DType(IntEnum):
    """Registry "CCO Data Types": the application's element type."""

    INT8 = 1
    INT16 = 2
    INT32 = 3
    INT64 = 4
    FLOAT16 = 5
    BFLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8


class ReduceOp(IntEnum):
    """Registry "CCO Reduction Operations"."""

    SUM = 1
    AVG = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7


class Collective(IntEnum):
    """Registry "CCO Collective Kinds"."""

    ALL_REDUCE = 1
    REDUCE = 2
    BROADCAST = 3
    BARRIER = 4
    ALL_GATHER = 5
    REDUCE_SCATTER = 6
