"""Bytes on one endpoint's link per float32 element of a full all-reduce (issue 7).

Every figure comes from real encoded messages: for a tensor of ``--mib`` MiB of
gradient-like float32 values (normal, sigma 1e-3) and the group's default chunk and
block sizes, this endpoint's scale-pass Contribution and Result and its data
Contributions and Results are built with the reference code (proposals, agreed
scales, quantization, attestations, tags), encoded and framed; their lengths are
added up per direction.  Up: what the endpoint sends (scale proposals, data).  Down:
what it receives (agreed scales, results, with all N ranks in the bitmap).  Payload,
scales, attestations, tags, message headers and framing are all counted.

QUIC, UDP and IP headers are reported beside, not in the target: per packet of a
``max_datagram_size`` D, 20 (IPv4) + 8 (UDP) + 1 (short header) + 8 (connection id)
+ 2 (packet number) + 16 (AEAD tag) + 12 (STREAM frame header) = 67 bytes, every
packet full.

Targets: at most 1.03 x (W / 8) bytes per element for N <= 16, 1.06 x for N = 64,
in each direction.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from cco.nodes.rendezvous_config import DEFAULT_PARAMS
from cco.wire import blockscale, payload
from cco.wire.dtypes import element_type
from cco.wire.fields import bitmap_from_ranks
from cco.wire.framing import encode_frame
from cco.wire.messages import (
    ChunkMessage,
    Contribution,
    Result,
    chunk_count,
    chunk_length,
    encode_message,
)
from cco.wire.modp import P
from cco.wire.registries import Collective, DType, ReduceOp

RESULTS = Path(__file__).resolve().parent / "results" / "bench_wire.json"
GROUP = bytes(16)
KEYS = payload.derive_group_keys(bytes(32), GROUP)
PACKET_OVERHEAD = 20 + 8 + 1 + 8 + 2 + 16 + 12
DATAGRAM_SIZES = (1452, 8952)


def framed(message: ChunkMessage) -> int:
    return len(encode_frame(encode_message(message)))


def as_result(message: ChunkMessage, world: int) -> Result:
    """The Result of a chunk like ``message``: same payload size, every rank in the
    bitmap, the largest tag (sizes only)."""
    values = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
    values.update(
        contributors=bitmap_from_ranks(range(world)), tag=P - 1 if message.tag is not None else None
    )
    return Result(**values)


def header(
    op_id: int, kind_op: tuple[DType, ReduceOp], total: int, chunk: int, index: int
) -> payload.ChunkHeader:
    dtype, op = kind_op
    return payload.ChunkHeader(
        group_id=GROUP,
        epoch=1,
        op_id=op_id,
        kind=Collective.ALL_REDUCE,
        op=op,
        dtype=dtype,
        total_elements=total,
        chunk_elements=chunk,
        chunk_index=index,
    )


def link_bytes(data: np.ndarray, world: int, width: int, chunk: int, block: int) -> dict[str, float]:
    """Bytes up and down one endpoint's link for one all-reduce of ``data``."""
    element = element_type(DType.FLOAT32)
    limit = blockscale.sum_limit(width, world)
    total = data.size
    chunks = chunk_count(total, chunk)
    per_chunk = blockscale.block_count(chunk, block)
    proposals = np.concatenate(
        [
            blockscale.propose(
                data[i * chunk : i * chunk + chunk_length(total, chunk, i)], element, block, limit
            )
            for i in range(chunks)
        ]
    )
    up = down = 0
    # the scale pass: a MIN all-reduce of INT16 proposals (this rank's are the agreed ones here)
    scale_total = proposals.size
    for index in range(chunk_count(scale_total, chunk)):
        start = index * chunk
        part = proposals[start : start + chunk_length(scale_total, chunk, index)].astype(np.int64)
        sealed = payload.seal(
            KEYS, header(0, (DType.INT16, ReduceOp.MIN), scale_total, chunk, index), 0, part
        )
        up += framed(sealed)
        down += framed(as_result(sealed, world))
    # the data: block-scaled at the agreed scales, with attestations
    for index in range(chunks):
        start = index * chunk
        stop = start + chunk_length(total, chunk, index)
        scales = proposals[
            index * per_chunk : index * per_chunk + blockscale.block_count(stop - start, block)
        ]
        base = header(1, (DType.FLOAT32, ReduceOp.SUM), total, chunk, index)
        scaled = dataclasses.replace(
            base, width=width, block_elements=block, scales=scales.astype("<i2").tobytes()
        )
        values = blockscale.chunk_integers(data[start:stop], element, scales, scales, block, limit)
        sealed = payload.seal(KEYS, scaled, 0, values, Contribution)
        up += framed(sealed)
        down += framed(as_result(sealed, world))
    return {"up": up / total, "down": down / total}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=float, default=16.0, help="MiB of float32 per rank")
    parser.add_argument("--chunk-elements", type=int, default=DEFAULT_PARAMS.chunk_elements)
    parser.add_argument("--block-elements", type=int, default=DEFAULT_PARAMS.block_elements)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    elements = int(args.mib * (1 << 20)) // 4
    data = np.random.default_rng(1).normal(0.0, 1e-3, elements).astype(np.float32)
    rows = []
    print(f"float32 all-reduce of {args.mib:g} MiB, chunk {args.chunk_elements}, block {args.block_elements}")
    print("dtype's own size: 4 bytes per element; version 1 carried 8")
    print(f"{'N':>3} {'W':>3} {'up B/el':>8} {'down B/el':>9} {'target':>7} {'met':>4}   QUIC+UDP+IP B/el")
    for world in (2, 4, 16, 64):
        for width in (8, 4, 2, 1):
            try:
                figures = link_bytes(data, world, width, args.chunk_elements, args.block_elements)
            except Exception as error:  # a width too narrow for the group
                print(f"{world:>3} {8 * width:>3}  not possible: {error}")
                continue
            target = (1.03 if world <= 16 else 1.06) * width
            worst = max(figures.values())
            quic = {
                d: math.ceil(worst * elements / (d - PACKET_OVERHEAD + 28)) * PACKET_OVERHEAD / elements
                for d in DATAGRAM_SIZES
            }
            met = worst <= target
            quic_text = ", ".join(f"{v:.4f} at D={d}" for d, v in quic.items())
            print(
                f"{world:>3} {8 * width:>3} {figures['up']:>8.4f} {figures['down']:>9.4f} "
                f"{target:>7.4f} {'yes' if met else 'NO':>4}   {quic_text}"
            )
            rows.append(
                {
                    "world_size": world,
                    "width_bits": 8 * width,
                    "bytes_per_element_up": figures["up"],
                    "bytes_per_element_down": figures["down"],
                    "target": target,
                    "met": met,
                    "quic_udp_ip_bytes_per_element": {str(d): v for d, v in quic.items()},
                }
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"mib": args.mib, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
