"""A rank's chunk proposal for a block-scaled operation (cco.nodes.chunking)."""

from __future__ import annotations

import pytest

from cco.nodes.chunking import CHUNK_SECONDS, Goodput, agreed_chunk_elements, proposal

BLOCK = 256
BIG = 1 << 24  # elements: large enough that the op's size never caps the proposal


def chunk(goodput: float | None, *, planned: int = 32768, limit: int = 131072, elements: int = BIG) -> int:
    """The proposed chunk_elements, for float32 at width 4."""
    return proposal(planned, limit, BLOCK, elements, 4, goodput) * BLOCK


def test_before_measuring_a_rank_proposes_the_groups_chunk_size() -> None:
    assert chunk(None) == 32768
    assert chunk(None, planned=256) == 256


@pytest.mark.parametrize(
    ("goodput", "expected"),
    [
        (5e6, 32768),  # 40 Mbit/s: a 256 KiB chunk would take 52 ms
        (10e6, 65536),  # 80 Mbit/s: 256 KiB moves in under CHUNK_SECONDS
        (20e6, 131072),
        (40e6, 131072),
        (1e9, 131072),  # never above the group's limit
    ],
)
def test_the_proposal_follows_the_measured_goodput(goodput: float, expected: int) -> None:
    assert chunk(goodput) == expected
    assert expected == 32768 or expected * 4 <= goodput * CHUNK_SECONDS


def test_the_proposal_grows_from_the_groups_chunk_size_by_doubling() -> None:
    assert chunk(1e6, planned=256) == 4096  # 32 kB in 32 ms is 8000 elements
    assert chunk(1e9, planned=256) == 131072
    assert chunk(1e9, planned=768) == 98304  # 768 x 2^7: the limit stops the next doubling


def test_an_operation_keeps_eight_chunks_or_the_groups_chunk_size() -> None:
    assert chunk(1e9, elements=8 * 65536) == 65536
    assert chunk(1e9, elements=1000) == 32768  # never below the group's


def test_a_limit_below_the_groups_chunk_size_is_the_proposal() -> None:
    assert chunk(None, planned=32768, limit=4096) == 4096
    assert chunk(1e9, planned=4096, limit=4096) == 4096


def test_chunks_that_are_not_whole_blocks_keep_the_planned_chunking() -> None:
    assert proposal(30000, 131072, BLOCK, BIG, 4, 1e9) == 0
    assert proposal(32768, 100, BLOCK, BIG, 4, 1e9) == 0  # the limit holds no whole block
    assert agreed_chunk_elements(30000, 0, BLOCK) == 30000
    assert agreed_chunk_elements(32768, 512, BLOCK) == 131072


def test_the_proposal_fits_the_int16_element_that_carries_it() -> None:
    assert proposal(2048, 1 << 20, 16, BIG, 8, 1e12) < 1 << 15


def test_goodput_counts_only_operations_large_enough_to_tell() -> None:
    goodput = Goodput()
    goodput.observe(Goodput.MIN_BYTES - 1, 0.001)
    assert goodput.value is None
    goodput.observe(Goodput.MIN_BYTES, 0.5)
    assert goodput.value == Goodput.MIN_BYTES / 0.5
    goodput.observe(Goodput.MIN_BYTES, 0.0)  # no time measured: nothing learnt
    assert goodput.value == Goodput.MIN_BYTES / 0.5
