"""What the flight recorder and the metrics cost one chunk message, in CPU time.

The runner hands every chunk message it receives or sends to the flight recorder
(always on) and to the metrics (``--metrics-listen``).  This probe replays an
aggregator's view of many all-reduce chunks through them (a part from each of four
children, the partial aggregate sent up, the result received and sent down to the
four) and reports CPU microseconds per chunk message, beside what decoding one such
chunk message costs the same process (the work a node does per message anyway).
CPU time (``time.process_time``), so a loaded machine slows it little.

    python benchmarks/probes/bench_observer_cost.py --chunks 20000 --elements 32768
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable

import numpy as np

from cco.services.recorder import Recorder
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import (
    Address,
    Contribution,
    GroupParams,
    Message,
    NodeRef,
    PartialAggregate,
    Result,
    TreeAssignment,
    decode_message,
    encode_message,
)
from cco.wire.registries import Collective, DType, ReduceOp

GROUP = bytes(range(16))


def _chunk(
    cls: type[Contribution] | type[PartialAggregate] | type[Result],
    ranks: list[int],
    op_id: int,
    index: int,
    elements: int,
    chunks: int,
) -> Message:
    return cls(
        group_id=GROUP,
        epoch=1,
        op_id=op_id,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.INT32,
        total_elements=elements * chunks,
        chunk_elements=elements,
        chunk_index=index,
        contributors=bitmap_from_ranks(ranks),
        width=4,
        payload=np.zeros(elements, dtype="<i4").tobytes(),
    )


def _traffic(chunks: int, elements: int, per_op: int) -> list[tuple[bool, Message]]:
    """(sent?, message) as an aggregator with four endpoint children sees them."""
    out: list[tuple[bool, Message]] = []
    for n in range(chunks):
        op_id, index = divmod(n, per_op)
        for rank in range(4):
            out.append((False, _chunk(Contribution, [rank], op_id, index, elements, per_op)))
        out.append((True, _chunk(PartialAggregate, [0, 1, 2, 3], op_id, index, elements, per_op)))
        result = _chunk(Result, [0, 1, 2, 3], op_id, index, elements, per_op)
        out.append((False, result))
        out += [(True, result)] * 4
    return out


def _cpu(run: Callable[[], None]) -> float:
    started = time.process_time()
    run()
    return time.process_time() - started


async def main(chunks: int, elements: int) -> None:
    traffic = _traffic(chunks, elements, per_op=8)
    assignment = TreeAssignment(
        group_id=GROUP,
        epoch=1,
        world_size=4,
        expected=bitmap_from_ranks(range(4)),
        children=tuple(
            NodeRef(node_id=f"ep-{r}", address=Address(host="h", port=1), ranks=bitmap_from_ranks([r]))
            for r in range(4)
        ),
        params=GroupParams(
            chunk_elements=elements, window=8, heartbeat_interval_ms=1000, operation_timeout_ms=30_000
        ),
    )
    recorder = Recorder(started=0.0)
    recorder.received(assignment, 0.0)

    def record() -> None:
        for now, (sent, message) in enumerate(traffic):
            (recorder.sent if sent else recorder.received)(message, float(now))

    from cco.services.metrics import NodeMetrics

    class Runner:  # what NodeMetrics reads of a runner
        machine = None
        recorder = Recorder(started=0.0)

        def links(self) -> list[object]:
            return []

    metrics = NodeMetrics(Runner())  # type: ignore[arg-type]

    def count() -> None:
        for now, (sent, message) in enumerate(traffic):
            (metrics.sent if sent else metrics.received)(message, float(now))

    encoded = encode_message(traffic[0][1])

    def decode() -> None:
        for _ in range(len(traffic) // 10):
            decode_message(encoded)

    messages = len(traffic)
    recorder_us = _cpu(record) / messages * 1e6
    metrics_us = _cpu(count) / messages * 1e6
    decode_us = _cpu(decode) / (messages // 10) * 1e6
    print(f"{messages} chunk messages of {elements} int32 elements ({chunks} chunks at an aggregator)")
    print(f"flight recorder: {recorder_us:.2f} us CPU per message")
    print(f"metrics:         {metrics_us:.2f} us CPU per message")
    print(f"decoding one such message (for scale): {decode_us:.2f} us CPU")
    print(f"recorder + metrics = {100 * (recorder_us + metrics_us) / decode_us:.1f}% of decoding it")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=20000)
    parser.add_argument("--elements", type=int, default=32768)
    args = parser.parse_args()
    asyncio.run(main(args.chunks, args.elements))
