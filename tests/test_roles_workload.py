"""The endpoint ``allreduce`` workload: small inputs are hashed and drawn on the event
loop after yielding the core, large ones on a worker thread, with the same records."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from typing import Any

import numpy as np
import pytest

from cco.services import roles
from cco.wire.registries import DType, ReduceOp
from cco.workload import make_input


class SummingComm:
    """Stands in for a Communicator of ``world`` ranks that all draw as this one does."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank = rank
        self.world_size = world

    async def all_reduce(
        self, data: np.ndarray, op: ReduceOp, *, width: int | None, out: np.ndarray
    ) -> np.ndarray:
        assert op is ReduceOp.SUM
        np.copyto(out, data * self.world_size)
        return out


def run_rounds(
    elements: int, rounds: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, Any], list[str]]:
    """The workload's summary, and which thread each round's hash and draw ran on
    ("loop" or "worker"), with each ``sched_yield`` noted as "yield"."""
    seen: list[str] = []
    loop_thread = threading.get_ident()
    work = roles._digest_then_draw

    def noting(*args: Any) -> str:
        seen.append("loop" if threading.get_ident() == loop_thread else "worker")
        return work(*args)

    monkeypatch.setattr(roles, "_digest_then_draw", noting)
    monkeypatch.setattr(roles.os, "sched_yield", lambda: seen.append("yield"))
    comm = SummingComm(rank=1, world=3)
    summary = asyncio.run(roles._allreduce_rounds(comm, rounds, elements, DType.FLOAT32, None, None))  # type: ignore[arg-type]
    return summary, seen


@pytest.mark.parametrize(
    ("elements", "where"),
    [
        (2, ["yield", "loop"]),
        (roles.INLINE_WORKLOAD_BYTES // 4, ["yield", "loop"]),
        (roles.INLINE_WORKLOAD_BYTES // 4 + 1, ["worker"]),
    ],
)
def test_small_inputs_stay_on_the_loop_after_a_yield_and_large_ones_go_to_the_worker(
    elements: int, where: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    summary, seen = run_rounds(elements, 3, monkeypatch)
    assert seen == where * 3
    for index, record in enumerate(summary["rounds"]):
        expected = make_input(roles.WORKLOAD_SEED, index, 1, DType.FLOAT32, elements) * 3
        assert record["sha256"] == hashlib.sha256(expected.tobytes()).hexdigest()
        assert record["bytes"] == 4 * elements
