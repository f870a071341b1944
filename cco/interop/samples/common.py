"""The sample record, and the fixed inputs the sample groups share.

Every "random-looking" byte string is derived from a fixed label with SHAKE-256
(:func:`det_bytes`), so the catalogue is the same on every run and every machine;
the group parameters and the longest node_id are the values several message types
carry.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from cco.wire.messages import (
    MAX_BLOCK_ELEMENTS,
    MAX_CHUNK_ELEMENTS,
    MAX_LIVENESS_MS,
    MIN_BLOCK_ELEMENTS,
    GroupParams,
    Message,
)
from cco.wire.registries import GROUP_ID_SIZE

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


def group_id(label: str) -> bytes:
    return det_bytes(f"group/{label}", GROUP_ID_SIZE)


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
    scaled_chunk_elements=MIN_BLOCK_ELEMENTS,
)
MAX_PARAMS = GroupParams(
    chunk_elements=MAX_CHUNK_ELEMENTS,
    window=4096,
    heartbeat_interval_ms=600_000,
    operation_timeout_ms=86_400_000,
    block_elements=MAX_BLOCK_ELEMENTS,
    float_width=8,
    liveness_ms=MAX_LIVENESS_MS,
    scaled_chunk_elements=MAX_CHUNK_ELEMENTS,
)

# 255 UTF-8 bytes: 85 three-byte characters (U+20AC EURO SIGN).
NODE_ID_MAX = "\u20ac" * 85
