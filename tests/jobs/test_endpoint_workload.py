"""The endpoint ``allreduce`` workload: a small run draws every input before its first
call and hashes every result after its last, and only yields the core between calls;
a large one hashes and draws between calls on a worker thread.  Both keep the same
records, and end with a barrier before they report."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from typing import Any

import numpy as np
import pytest

from cco import jobs
from cco.client import PartialResult
from cco.nodes.operation import Quorum
from cco.wire.registries import DType, ReduceOp
from cco.workload import make_input


class SummingComm:
    """Stands in for a Communicator of ``world`` ranks that all draw as this one does;
    counts its calls."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank = rank
        self.world_size = world
        self.calls = 0
        self.last_chunk_elements: int | None = None

    async def all_reduce(
        self, data: np.ndarray, op: ReduceOp, *, width: int | None, out: np.ndarray
    ) -> np.ndarray:
        assert op is ReduceOp.SUM
        self.calls += 1
        self.last_chunk_elements = 1024 << self.calls  # as if each call agreed a larger size
        np.copyto(out, data * self.world_size)
        return out

    async def all_reduce_quorum(
        self, data: np.ndarray, op: ReduceOp, *, min_ranks: int, wait: float, **kw: Any
    ) -> PartialResult:
        result = await self.all_reduce(data, op, **kw)
        return PartialResult(result, frozenset(range(self.world_size)))

    async def barrier(self) -> None:
        pass


def run_rounds(
    elements: int, rounds: int, monkeypatch: pytest.MonkeyPatch, quorum: Quorum | None = None
) -> tuple[dict[str, Any], list[tuple[str, str, int]]]:
    """The workload's summary, and each draw, hash and ``sched_yield`` as (what,
    thread, calls made before it), the thread being "loop" or "worker"."""
    seen: list[tuple[str, str, int]] = []
    loop_thread = threading.get_ident()
    comm = SummingComm(rank=1, world=3)

    def noting(what: str, work: Any) -> Any:
        def noted(*args: Any, **kwargs: Any) -> Any:
            thread = "loop" if threading.get_ident() == loop_thread else "worker"
            seen.append((what, thread, comm.calls))
            return work(*args, **kwargs)

        return noted

    monkeypatch.setattr(jobs, "make_input", noting("draw", jobs.make_input))
    monkeypatch.setattr(jobs, "_digest", noting("hash", jobs._digest))
    monkeypatch.setattr(os, "sched_yield", noting("yield", lambda: None))
    monkeypatch.setattr(comm, "barrier", noting("barrier", comm.barrier))
    summary = asyncio.run(jobs._allreduce_rounds(comm, rounds, elements, DType.FLOAT32, None, quorum))  # type: ignore[arg-type]
    return summary, seen


def check_records(summary: dict[str, Any], elements: int, rounds: int) -> None:
    assert [record["round"] for record in summary["rounds"]] == list(range(rounds))
    for index, record in enumerate(summary["rounds"]):
        expected = make_input(jobs.WORKLOAD_SEED, index, 1, DType.FLOAT32, elements) * 3
        assert record["sha256"] == hashlib.sha256(expected.tobytes()).hexdigest()
        assert record["bytes"] == 4 * elements
        assert record["chunk_elements"] == 1024 << (index + 1)  # each call's own


@pytest.mark.parametrize("elements", [2, jobs.PREDRAWN_BYTES // 4 // 3])
def test_a_small_run_draws_before_its_first_call_and_hashes_after_its_last(
    elements: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both on a worker thread: drawing 100,000 small rounds held the event loop (and
    so the node's heartbeats) for seconds, long enough for the rendezvous to evict
    the rank."""
    summary, seen = run_rounds(elements, 3, monkeypatch)
    yields = [("yield", "loop", calls) for calls in range(3)]  # the core offered before each call
    # every rank has its last result before any rank hashes and reports
    hashes = [("hash", "worker", 3)] * 3
    assert seen == [("draw", "worker", 0)] * 3 + yields + [("barrier", "loop", 3)] + hashes
    check_records(summary, elements, 3)


LARGE = jobs.PREDRAWN_BYTES // 4 // 3 + 1
"""Elements per round of a large run: three rounds are one element over the bound."""


def test_a_large_run_hashes_and_draws_between_calls_on_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """And meets the other ranks before each call, so that no rank's call times
    another's drawing."""
    summary, seen = run_rounds(LARGE, 3, monkeypatch)
    assert seen == [
        ("draw", "worker", 0),
        ("barrier", "loop", 0),
        ("hash", "worker", 1),
        ("draw", "worker", 1),
        ("barrier", "loop", 1),
        ("hash", "worker", 2),
        ("draw", "worker", 2),
        ("barrier", "loop", 2),
        ("hash", "worker", 3),
        ("barrier", "loop", 3),
    ]
    check_records(summary, LARGE, 3)


def test_a_large_run_reports_the_cpu_its_hashing_and_drawing_took(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmarks leave it out of a node's CPU per byte; a small run does neither
    between its calls."""
    large, _ = run_rounds(LARGE, 3, monkeypatch)
    small, _ = run_rounds(2, 3, monkeypatch)
    # hashing and drawing a quarter of a million floats takes at least a CPU tick
    assert all(record["workload_cpu_seconds"] > 0 for record in large["rounds"])
    assert [record["workload_cpu_seconds"] for record in small["rounds"]] == [0.0] * 3


def test_a_large_quorum_run_meets_no_barrier(monkeypatch: pytest.MonkeyPatch) -> None:
    """A quorum round does not wait for every member, and neither may its start."""
    _, seen = run_rounds(LARGE, 3, monkeypatch, Quorum(min_ranks=2, wait=0.1))
    assert [what for what, _, _ in seen] == ["draw", "hash", "draw", "hash", "draw", "hash"]


def test_a_quorum_run_does_not_wait_for_every_member_at_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    summary, seen = run_rounds(2, 3, monkeypatch, Quorum(min_ranks=2, wait=0.1))
    assert [what for what, _, _ in seen] == ["draw"] * 3 + ["yield"] * 3 + ["hash"] * 3
    assert [record["contributors"] for record in summary["rounds"]] == [[0, 1, 2]] * 3


def test_no_rounds_draw_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    summary, seen = run_rounds(2, 0, monkeypatch)
    assert summary["rounds"] == [] and seen == []


class Writes:
    """An unbuffered stdout stand-in: every ``write`` call kept as it came."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_each_round_prints_its_progress_line_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """One write per line: on an unbuffered stdout (``PYTHONUNBUFFERED``) each write is
    a system call, and ``print`` made two (the line, then its newline)."""
    out = Writes()
    monkeypatch.setattr(jobs.sys, "stdout", out)
    run_rounds(2, 3, monkeypatch)
    assert len(out.calls) == 3
    for index, line in enumerate(out.calls):
        assert line.startswith(f"rank 1: round {index + 1}/3 verified, 0.0 MB in ")
        assert line.endswith(" MB/s)\n") and line.count("\n") == 1
