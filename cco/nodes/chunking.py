"""How large the chunks of a block-scaled operation are: proposed by each rank from its
own path, agreed in the operation's scale pass.

Every chunk costs each node a fixed amount of CPU whatever its size, so on a fast path
larger chunks move more bytes per CPU second; on a slow one they cost time instead (the
last chunk's Result crosses the link after everything else has gone up, and a window
of large chunks outgrows the queue of a shaped link).  No one size suits both, and the
ranks of a group need not share a path's speed, so each rank proposes a size from
what its own operations have measured, and the smallest proposal wins: it is the last
element of the rank's scale pass, a MIN all-reduce (draft section "Block Scales").
The result is bit-identical on every rank, so every rank cuts the data alike, and a
rank that runs the scale pass again (a new tree) proposes what it proposed before.

A proposal is in blocks, so that every agreed chunk is a whole number of blocks and a
block's scale keeps its place whatever the chunking: ``0`` keeps the chunking the
operation was planned with (its group's chunk_elements is not a whole number of blocks).
A rank proposes its group's chunk_elements until it has measured its path, and only
ever doubles it from there: the group's setting stays the floor (unless the group's
limit for block-scaled chunks is lower still).
"""

from __future__ import annotations

CHUNK_SECONDS = 0.032
"""A chunk is proposed no larger than what the rank's measured goodput moves in this
long, so that on a slow path the last chunk's drain stays short and a window of chunks
stays within a shaped link's queue (three chunks: about 0.1 s of the link's rate, what
a 100 ms queue holds).  Not shorter: a path that is slow because the hosts' CPU is
busy measures a low goodput too, and it is the path that larger chunks help most."""

MIN_CHUNKS = 8
"""Nor larger than an eighth of the operation, so that a large one still pipelines."""

MAX_PROPOSAL = (1 << 15) - 1
"""A proposal travels as an int16 element of the scale pass."""


def proposal(
    planned: int, limit: int, block_elements: int, elements: int, width: int, goodput: float | None
) -> int:
    """This rank's proposed chunk size in blocks, for an operation of ``elements``
    elements at ``width`` bytes each, planned with chunks of ``planned`` elements, in a
    group whose block-scaled chunks may be up to ``limit`` elements; ``goodput`` is the
    bytes per second of payload its recent operations moved one way (None: unmeasured)."""
    largest = min(limit // block_elements, MAX_PROPOSAL)
    if planned % block_elements or largest < 1:
        return 0
    blocks = planned // block_elements
    if blocks >= largest or goodput is None:
        return min(blocks, largest)
    wanted = min(goodput * CHUNK_SECONDS / (width * block_elements), elements / (MIN_CHUNKS * block_elements))
    while blocks * 2 <= largest and blocks * 2 <= wanted:
        blocks *= 2
    return blocks


def agreed_chunk_elements(planned: int, agreed: int, block_elements: int) -> int:
    """The chunk_elements of the data, from the scale pass's agreed (smallest) proposal."""
    return planned if agreed <= 0 else agreed * block_elements


class Goodput:
    """The payload bytes per second, one way, of this rank's last block-scaled operation
    large enough to tell: from its first chunk sent to its last chunk verified, so
    waiting for the slowest rank counts too (which only makes the proposal smaller)."""

    MIN_BYTES = 1 << 19
    """Operations smaller than this (a few default chunks) measure latency, not the path's rate."""

    def __init__(self) -> None:
        self.value: float | None = None

    def observe(self, payload_bytes: int, seconds: float) -> None:
        if payload_bytes >= self.MIN_BYTES and seconds > 0:
            self.value = payload_bytes / seconds
