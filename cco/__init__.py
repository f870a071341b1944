"""CCO: Collective Communication Optimization over QUIC, the reference implementation.

The client API is available from the top level::

    import cco
    spec = cco.GroupSpec(group_id=bytes.fromhex("c0" * 16), world_size=4, credential=b"secret")
    comm = await cco.Communicator.from_pki(spec, "ep-0", "pki")   # rank 0: the node id's number
    total = await comm.all_reduce(x, "sum")

Groups and sessions: GroupSpec, Communicator (asyncio), BlockingCommunicator (threads),
FallbackAggregator, PartialResult, StripedCommunicator (one job's calls cut over
several groups, and so several aggregators).  Calls and their errors: CollectiveRequest,
Collective, ReduceOp, DType, Quorum, CcoError, ErrorCode, OperationError
(``cco.client.NonFiniteError`` for ``nonfinite="report"``).  Identity: TransportConfig,
create_dev_pki, Role.  torch.distributed: ``import cco.torch`` registers the "cco"
backend.

Names are imported on first use, so ``import cco.wire`` (the pure wire layer) does
not load the QUIC stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cco.client import (
        BlockingCommunicator,
        Communicator,
        FallbackAggregator,
        GroupSpec,
        PartialResult,
        StripedCommunicator,
    )
    from cco.nodes.calls import CollectiveRequest, OperationError
    from cco.nodes.operation import Quorum
    from cco.transport import TransportConfig, create_dev_pki
    from cco.wire.errors import CcoError, ErrorCode
    from cco.wire.registries import Collective, DType, ReduceOp, Role

_EXPORTS = {
    "Communicator": "cco.client",
    "BlockingCommunicator": "cco.client",
    "GroupSpec": "cco.client",
    "FallbackAggregator": "cco.client",
    "PartialResult": "cco.client",
    "StripedCommunicator": "cco.client",
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

__all__ = [
    "BlockingCommunicator",
    "CcoError",
    "Collective",
    "CollectiveRequest",
    "Communicator",
    "DType",
    "ErrorCode",
    "FallbackAggregator",
    "GroupSpec",
    "OperationError",
    "PartialResult",
    "Quorum",
    "ReduceOp",
    "Role",
    "StripedCommunicator",
    "TransportConfig",
    "create_dev_pki",
]
assert sorted(_EXPORTS) == __all__, "every export listed once, in both"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cco' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    """The exported names with the module's own: what ``dir(cco)`` and ``help(cco)`` list."""
    return sorted(set(globals()) | set(__all__))
