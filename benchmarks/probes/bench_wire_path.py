"""What the wire layer costs per chunk message of a bulk all-reduce, on each side of QUIC.

A 64 MiB float32 SUM on the star moves chunks of 131072 elements: messages of a
little over 512 KiB, which QUIC delivers as stream data of about one datagram per
piece (``--piece`` bytes).  Per message a sender encodes it and hands it to QUIC; a
receiver reassembles its frame from the pieces and decodes it.  Each step is timed
both ways the code offers, so the gain of the bulk path's way is measured on one
tree:

* ``encode_whole``: :func:`encode_message` and its frame prefix joined, every byte of
  the payload copied into the encoded message; ``encode_pieces``:
  :func:`encode_message_pieces`, the payload left as the message's own object (what
  :meth:`~cco.transport.link.LinkProtocol.send_message` does).
* ``reassemble_by_piece``: :meth:`FrameDecoder.feed` once per piece, as one stream
  event each once was, the frame joined; ``reassemble_run``:
  :meth:`FrameDecoder.feed_run` over the pieces, the frame left in its pieces (what
  the link does with a run of stream data).
* ``decode_joined``: :func:`decode_message` of the joined frame, the payload copied
  out of it; ``decode_pieces``: :func:`decode_message_pieces` of the frame's pieces,
  the payload joined straight out of them.

Timings on a shared host move by tens of percent; instruction counts do not.  To
count one step's instructions, run it ``--calls`` times under valgrind and subtract a
run of 0 calls::

    python benchmarks/probes/bench_wire_path.py
    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python benchmarks/probes/bench_wire_path.py --only reassemble_run --calls 100
    (the same with --calls 0; the difference of the "Collected" totals / 100)
"""

from __future__ import annotations

import argparse
import json
import timeit
from collections.abc import Callable
from pathlib import Path

from cco.transport.link import JOIN_BELOW
from cco.wire.framing import FrameDecoder, encode_frame, frame_prefix
from cco.wire.messages import (
    Contribution,
    decode_message,
    decode_message_pieces,
    encode_message,
    encode_message_pieces,
)
from cco.wire.registries import Collective, DType, ReduceOp

RESULTS = Path(__file__).resolve().parent / "results" / "wire_path.json"
ELEMENTS = 131072


def chunk() -> Contribution:
    """A chunk of the star's bulk all-reduce: 131072 4-byte integers, sealed."""
    return Contribution(
        group_id=b"g" * 16,
        epoch=1,
        op_id=5,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.INT32,
        total_elements=64 * ELEMENTS,
        chunk_elements=ELEMENTS,
        chunk_index=3,
        contributors=b"\x01",
        width=4,
        payload=bytes(range(256)) * (ELEMENTS * 4 // 256),
        tag=(1 << 60) + 12345,
    )


def operations(piece: int) -> dict[str, Callable[[], object]]:
    """Each step, bound to one chunk message and its frame cut into ``piece``-byte pieces."""
    message = chunk()
    frame = encode_frame(encode_message(message))
    pieces = [frame[start : start + piece] for start in range(0, len(frame), piece)]
    body = encode_message(message)
    (frame_pieces,) = FrameDecoder().feed_run(pieces)

    def encode_whole() -> object:
        encoded = encode_message(message)
        return frame_prefix(len(encoded)) + encoded

    def encode_pieces() -> object:
        encoded = encode_message_pieces(message, JOIN_BELOW)
        return frame_prefix(sum(map(len, encoded))) + encoded[0], *encoded[1:]

    def reassemble_by_piece() -> object:
        decoder = FrameDecoder()
        return [frame for data in pieces for frame in decoder.feed(data)]

    def reassemble_run() -> object:
        return FrameDecoder().feed_run(pieces)

    return {
        "encode_whole": encode_whole,
        "encode_pieces": encode_pieces,
        "reassemble_by_piece": reassemble_by_piece,
        "reassemble_run": reassemble_run,
        "decode_joined": lambda: decode_message(body),
        "decode_pieces": lambda: decode_message_pieces(frame_pieces),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--piece", type=int, default=8900, help="bytes of stream data per piece (one datagram's)"
    )
    parser.add_argument("--only", help="run just this step --calls times (for valgrind), print nothing")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    ops = operations(args.piece)
    if args.only is not None:
        if args.only not in ops:
            parser.error(f"--only takes one of {', '.join(ops)}")
        for _ in range(args.calls):
            ops[args.only]()
        return 0
    figures = {}
    for name, call in ops.items():
        best = min(timeit.repeat(call, number=args.calls, repeat=5)) / args.calls
        figures[name] = best
        print(f"{name:20} {best * 1e6:8.1f} us per message   (report)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"seconds_per_message": figures, "piece_bytes": args.piece, "elements": ELEMENTS}
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
