"""HeapTrimmer: memory freed when peers leave goes back to the system, in one trim
however many leave together."""

from __future__ import annotations

import asyncio

import pytest

from cco.services.heap import HeapTrimmer


def test_connections_that_end_together_share_each_trim() -> None:
    async def scenario() -> int:
        trimmer = HeapTrimmer(delays=(0.05, 0.1))
        if trimmer._trim is None:
            pytest.skip("this C library has no malloc_trim (not glibc): nothing to trim")
        trimmer.released()
        scheduled = list(trimmer._pending)
        for _ in range(4):
            trimmer.released()
        assert trimmer._pending == scheduled, "ends that come together share the trims already due"
        assert trimmer.trims == 0, "never at once"
        while any(trimmer._pending):
            await asyncio.sleep(0.02)
        return trimmer.trims

    assert asyncio.run(scenario()) == 2


def test_a_cancelled_trimmer_does_not_trim() -> None:
    async def scenario() -> int:
        trimmer = HeapTrimmer(delays=(0.05, 0.1))
        trimmer.released()
        trimmer.cancel()
        await asyncio.sleep(0.3)
        return trimmer.trims

    assert asyncio.run(scenario()) == 0
