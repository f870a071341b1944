"""How an endpoint node's workload meets SIGINT/SIGTERM (cco/jobs.py).

When a whole job is stopped, the first rank to leave fails the collective the
others had in flight; a rank can read that failure in the same turn of the event
loop as its own signal.  The signal must win there (exit 0), while a failure
that came before any signal still fails the node.  Found by the rendezvous
restart test on a loaded CI machine: three of four ranks exited 1 when stopped.
"""

from __future__ import annotations

import asyncio

import pytest

from cco.jobs import _unless_stopped
from cco.wire.errors import CcoError, ErrorCode


def _run(coro_factory):  # type: ignore[no-untyped-def]
    async def main() -> tuple[bool, asyncio.Event]:
        stop = asyncio.Event()
        return await _unless_stopped(coro_factory(stop), stop, "ep-test"), stop

    return asyncio.run(main())


def test_a_failure_read_with_the_signal_is_a_stop() -> None:
    async def workload(stop: asyncio.Event) -> None:
        await asyncio.sleep(0)
        stop.set()  # the signal handler and the failure run in the same turn
        raise CcoError(ErrorCode.PEER_LOST, "rank 0 left")

    stopped, _ = _run(workload)
    assert stopped is True


def test_a_failure_before_any_signal_raises() -> None:
    async def workload(stop: asyncio.Event) -> None:
        await asyncio.sleep(0)
        raise CcoError(ErrorCode.PEER_LOST, "rank 0 left")

    with pytest.raises(CcoError, match="rank 0 left"):
        _run(workload)


def test_a_signal_cancels_the_running_workload() -> None:
    cancelled = []

    async def workload(stop: asyncio.Event) -> None:
        asyncio.get_running_loop().call_later(0.01, stop.set)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    stopped, _ = _run(workload)
    assert stopped is True
    assert cancelled == [True]


def test_a_finished_workload_is_not_a_stop() -> None:
    async def workload(stop: asyncio.Event) -> None:
        await asyncio.sleep(0)

    stopped, stop = _run(workload)
    assert stopped is False
    assert not stop.is_set()
