"""What the transport tests that connect one aggregator and one endpoint share."""

from __future__ import annotations

from cco.wire.messages import Capabilities
from cco.wire.registries import Collective, DType, ReduceOp

CAPS = Capabilities(
    dtypes=(DType.INT32,),
    ops=(ReduceOp.SUM,),
    collectives=(Collective.ALL_REDUCE,),
    max_message_size=1 << 20,
    max_chunk_elements=1 << 16,
    extensions=(),
)
"""Only the certificate check of ``connection_factory`` reads the identity."""
