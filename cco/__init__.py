"""CCO: Collective Communication Optimization over QUIC, the reference implementation.

The client API is available from the top level::

    import cco
    comm = await cco.Communicator.join(cco.GroupSpec(...), "ep-0", cco.TransportConfig.for_node(pki, "ep-0"))
    total = await comm.all_reduce(x, cco.ReduceOp.SUM)

Names are imported on first use, so ``import cco.wire`` (the pure wire layer) does
not load the QUIC stack.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Communicator": "cco.client",
    "BlockingCommunicator": "cco.client",
    "GroupSpec": "cco.client",
    "FallbackAggregator": "cco.client",
    "PartialResult": "cco.client",
    "Quorum": "cco.nodes.operation",
    "CollectiveRequest": "cco.nodes.calls",
    "OperationError": "cco.nodes.calls",
    "TransportConfig": "cco.transport",
    "create_dev_pki": "cco.transport",
    "CcoError": "cco.wire.errors",
    "ErrorCode": "cco.wire.errors",
    "Collective": "cco.wire.registries",
    "DType": "cco.wire.registries",
    "ReduceOp": "cco.wire.registries",
    "Role": "cco.wire.registries",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cco' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
