"""``cco-node``'s main once its configuration is resolved and logging set up: a settled
heap, the event loop, and the main of the role it runs (:mod:`cco.services.roles` for the
rendezvous and the aggregator, :mod:`cco.jobs` for an endpoint)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from cco.config import NodeConfig
from cco.jobs import run_endpoint
from cco.services.polling import event_loop_factory
from cco.services.roles import run_aggregator, run_rendezvous, settle_heap
from cco.wire import kernels

log = logging.getLogger("cco.node")

RoleMain = Callable[[NodeConfig], Coroutine[Any, Any, int]]

ROLE_MAINS: dict[str, RoleMain] = {
    "rendezvous": run_rendezvous,
    "aggregator": run_aggregator,
    "endpoint": run_endpoint,
}


def run_role(cfg: NodeConfig) -> int:
    """Run the role ``cfg`` names until it ends; its exit status.  The caller has set up
    logging (``cco.cli``)."""
    if cfg.role == "endpoint" and cfg.elements > kernels.SMALL:
        # The workload's chunks will run the compiled loops: load them with the rest
        # of start-up, before settle_heap() (see kernels.preload).
        kernels.preload()
    settle_heap()
    if cfg.busy_poll_us:
        log.info("event loop polls %d us before it sleeps", cfg.busy_poll_us)
    with asyncio.Runner(loop_factory=event_loop_factory(cfg.busy_poll_us)) as runner:
        return runner.run(ROLE_MAINS[cfg.role](cfg))


__all__ = ["ROLE_MAINS", "run_role"]
