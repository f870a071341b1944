"""The CCO error-code registry and the typed exceptions every layer raises.

One registry serves the codec, the state machines, the services and the client
library, so that a failure seen by a user carries the same code a peer would put on
the wire in an ``Error`` or ``Abort`` message (draft section "Error Codes").
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Protocol error codes (draft registry "CCO Error Codes").

    Ranges: 0x00-0x0f codec and framing, 0x10-0x1f session and membership,
    0x20-0x2f collective data, 0x30-0x3f resources and liveness.
    """

    NO_ERROR = 0x00
    INTERNAL_ERROR = 0x01
    MALFORMED_CBOR = 0x02
    NON_DETERMINISTIC_ENCODING = 0x03
    DUPLICATE_MAP_KEY = 0x04
    TRAILING_BYTES = 0x05
    MESSAGE_TOO_LARGE = 0x06
    UNKNOWN_MESSAGE_TYPE = 0x07
    INVALID_FIELD = 0x08
    MISSING_FIELD = 0x09
    UNKNOWN_FIELD = 0x0A
    FRAMING_ERROR = 0x0B

    UNSUPPORTED_VERSION = 0x10
    UNSUPPORTED_FEATURE = 0x11
    UNKNOWN_GROUP = 0x12
    NOT_A_MEMBER = 0x13
    BAD_CREDENTIAL = 0x14
    RANK_UNAVAILABLE = 0x15
    GROUP_FULL = 0x16
    WORLD_SIZE_MISMATCH = 0x17
    STALE_EPOCH = 0x18
    UNAUTHORIZED = 0x19
    PROTOCOL_VIOLATION = 0x1A

    VERIFICATION_FAILED = 0x20
    OVERFLOW = 0x21
    DUPLICATE_CONTRIBUTION = 0x22
    OPERATION_MISMATCH = 0x23
    UNKNOWN_OPERATION = 0x24
    ABORTED = 0x25

    TIMEOUT = 0x30
    PEER_LOST = 0x31
    RESOURCE_EXHAUSTED = 0x32
    NO_AGGREGATOR = 0x33
    SHUTTING_DOWN = 0x34

    @property
    def description(self) -> str:
        return ERROR_DESCRIPTIONS[self]


ERROR_DESCRIPTIONS: dict[ErrorCode, str] = {
    ErrorCode.NO_ERROR: "No error; used when closing normally.",
    ErrorCode.INTERNAL_ERROR: "The sender hit an internal fault unrelated to the peer's input.",
    ErrorCode.MALFORMED_CBOR: "The bytes are not well-formed CBOR, or use a CBOR feature "
    "this protocol excludes (indefinite lengths, tags, floats, undefined).",
    ErrorCode.NON_DETERMINISTIC_ENCODING: "Well-formed CBOR that is not in core deterministic "
    "encoding (non-shortest argument, or map keys out of order).",
    ErrorCode.DUPLICATE_MAP_KEY: "A CBOR map contains the same key twice.",
    ErrorCode.TRAILING_BYTES: "Bytes follow the single top-level CBOR item of a message.",
    ErrorCode.MESSAGE_TOO_LARGE: "A message, string, array or map exceeds a negotiated or fixed size limit.",
    ErrorCode.UNKNOWN_MESSAGE_TYPE: "The message type is not registered or not supported.",
    ErrorCode.INVALID_FIELD: "A field has the wrong CBOR type or a value out of range.",
    ErrorCode.MISSING_FIELD: "A required field is absent.",
    ErrorCode.UNKNOWN_FIELD: "A map carries a key this message type does not define.",
    ErrorCode.FRAMING_ERROR: "The stream framing (length prefix) is invalid.",
    ErrorCode.UNSUPPORTED_VERSION: "No protocol version in common with the peer.",
    ErrorCode.UNSUPPORTED_FEATURE: "A dtype, op, collective or extension is not supported.",
    ErrorCode.UNKNOWN_GROUP: "The group id is not known to the receiver.",
    ErrorCode.NOT_A_MEMBER: "The sender is not a member of the group it names.",
    ErrorCode.BAD_CREDENTIAL: "The join credential is invalid for the group.",
    ErrorCode.RANK_UNAVAILABLE: "The requested rank is taken or out of range.",
    ErrorCode.GROUP_FULL: "The group already has world_size members.",
    ErrorCode.WORLD_SIZE_MISMATCH: "The world size disagrees with the group's.",
    ErrorCode.STALE_EPOCH: "The message names an epoch that is no longer current.",
    ErrorCode.UNAUTHORIZED: "The peer's role or identity does not allow this message.",
    ErrorCode.PROTOCOL_VIOLATION: "The message is not allowed in the receiver's current state.",
    ErrorCode.VERIFICATION_FAILED: "An aggregate failed homomorphic tag verification, the "
    "range check or the contributor policy.",
    ErrorCode.OVERFLOW: "A value or an aggregate exceeds the exact integer range.",
    ErrorCode.DUPLICATE_CONTRIBUTION: "A contributor's chunk was received twice with different content.",
    ErrorCode.OPERATION_MISMATCH: "Chunks of one operation disagree on kind, op, dtype, "
    "width, scales, length or chunk count.",
    ErrorCode.UNKNOWN_OPERATION: "The operation id is unknown to the receiver.",
    ErrorCode.ABORTED: "The operation was aborted by a peer or by the application.",
    ErrorCode.TIMEOUT: "A deadline passed before the operation completed.",
    ErrorCode.PEER_LOST: "A peer stopped responding (missed heartbeats or closed).",
    ErrorCode.RESOURCE_EXHAUSTED: "The receiver has no slot, window or memory left.",
    ErrorCode.NO_AGGREGATOR: "No aggregator capacity is available for the group.",
    ErrorCode.SHUTTING_DOWN: "The sender is shutting down.",
}


class CcoError(Exception):
    """Base of every error this package raises on purpose; carries a protocol code."""

    def __init__(self, code: ErrorCode, detail: str) -> None:
        super().__init__(f"{code.name} (0x{int(code):02x}): {detail}")
        self.code = code
        self.detail = detail


class DecodeError(CcoError):
    """Raised by every decoder for bytes that are not a valid CCO message."""


class EncodeError(CcoError):
    """Raised when a message cannot be encoded (a field out of its declared range)."""
