"""HeapTrimmer: memory freed when peers leave goes back to the system, in one trim
however many leave together."""

from __future__ import annotations

import asyncio

import pytest

from cco.services.heap import HeapTrimmer


def test_connections_that_end_together_share_each_trim_after_its_delay() -> None:
    async def scenario() -> tuple[int, int, int]:
        trimmer = HeapTrimmer(delays=(0.05, 0.3))
        if trimmer._trim is None:
            pytest.skip("this C library has no malloc_trim (not glibc): nothing to trim")
        for _ in range(5):
            trimmer.released()
        before = trimmer.trims
        await asyncio.sleep(0.2)
        first = trimmer.trims
        await asyncio.sleep(0.3)
        return before, first, trimmer.trims

    assert asyncio.run(scenario()) == (0, 1, 2)


def test_a_cancelled_trimmer_does_not_trim() -> None:
    async def scenario() -> int:
        trimmer = HeapTrimmer(delays=(0.05, 0.1))
        trimmer.released()
        trimmer.cancel()
        await asyncio.sleep(0.3)
        return trimmer.trims

    assert asyncio.run(scenario()) == 0
