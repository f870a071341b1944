"""A node exempts what start-up built from garbage collection before it serves."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from cco import launch
from cco.config import NodeConfig


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # leave the test process as it was


def tracked(value: object) -> bool:
    """Whether the collector still walks ``value`` (frozen objects it skips)."""
    return any(candidate is value for candidate in gc.get_objects())


def test_a_node_exempts_its_start_up_objects_but_not_what_it_makes_later(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    built_at_start = [[1], [2]]
    made_while_serving: list[object] = []
    seen: list[bool] = []

    async def role_main(cfg: NodeConfig) -> int:
        made_while_serving.append([3])
        seen.append(tracked(built_at_start))
        seen.append(tracked(made_while_serving[0]))
        return 0

    monkeypatch.setitem(launch.ROLE_MAINS, "endpoint", role_main)
    assert tracked(built_at_start)
    values = {"log_level": "info", "busy_poll_us": 0, "elements": 2}
    assert launch.run_role(NodeConfig(role="endpoint", values=values)) == 0
    assert seen == [False, True]
    assert gc.get_freeze_count() > 0


@pytest.mark.parametrize(
    ("role", "elements", "preloads"),
    [
        ("endpoint", 33, True),
        ("endpoint", 32, False),
        ("aggregator", 65536, False),
        ("rendezvous", 65536, False),
    ],
)
def test_an_endpoint_loads_its_compiled_loops_before_its_start_up_objects_are_exempted(
    role: str, elements: int, preloads: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """numba's objects are then exempted with the rest of start-up.  An endpoint whose
    workload's chunks are too small for the loops, the aggregators and the rendezvous
    never run them, and never load them (numba adds some 110 MiB to a process)."""
    order: list[str] = []

    def preload() -> bool:
        order.append("preload")
        return True

    async def role_main(cfg: NodeConfig) -> int:
        return 0

    monkeypatch.setattr(launch.kernels, "preload", preload)
    monkeypatch.setattr(launch, "settle_heap", lambda: order.append("settle"))
    monkeypatch.setitem(launch.ROLE_MAINS, role, role_main)
    values = {"log_level": "info", "busy_poll_us": 0, "elements": elements}
    assert launch.run_role(NodeConfig(role=role, values=values)) == 0
    assert order == (["preload", "settle"] if preloads else ["settle"])
