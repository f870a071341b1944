"""The groups beside an attack: a victim that keeps all-reducing, and a newcomer.

``victim``: two ranks (two sessions, each on its own event loop thread, in this one
process) of a group that run int32 all-reduces back to back until SIGTERM; each
round's inputs depend on the rank and the round, so its exact sum is known.  One
JSON line per round: when it started, how long it took (both ranks done), whether
it completed, whether it was exact, and the error otherwise.

``newgroup``: two ranks join a group nobody has used, then run one all-reduce; one
JSON line with the seconds to both joined and to that first result (the group
formed and works), or the error.

    python benchmarks/support/hostile_victim.py victim --pki DIR --rendezvous 127.0.0.1:4433 \\
        --group 00112233445566778899aabbccddeeff --out victim.jsonl
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from cco.client import BlockingCommunicator, GroupSpec
from cco.wire import kernels
from cco.wire.errors import CcoError

ELEMENTS = 4096


def inputs(rank: int, round_: int, elements: int) -> np.ndarray:
    return ((np.arange(elements, dtype=np.int64) * (rank + 1) + round_ * 7) % 2001 - 1000).astype(np.int32)


def exact(world: int, round_: int, elements: int) -> np.ndarray:
    return sum(inputs(r, round_, elements).astype(np.int64) for r in range(world)).astype(np.int32)


def join_all(spec: GroupSpec, names: list[str], pki: Path, timeout: float) -> list[BlockingCommunicator]:
    """Every rank joins at once (a group forms only when all are in)."""
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        futures = [
            pool.submit(
                BlockingCommunicator,
                GroupSpec(**{**_spec_fields(spec), "rank": rank}),
                name,
                _transport(pki, name),
                timeout,
            )
            for rank, name in enumerate(names)
        ]
        return [f.result(timeout + 5) for f in futures]


def close_all(comms: list[BlockingCommunicator]) -> None:
    """Close every rank at once: closing is collective (each rank waits at a barrier
    for the others), so ranks closed one after another from one thread would each
    wait for the next until the barrier timed out."""
    if comms:
        with concurrent.futures.ThreadPoolExecutor(len(comms)) as pool:
            list(pool.map(lambda comm: comm.close(), comms))


def _spec_fields(spec: GroupSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in spec.__dataclass_fields__}


def _transport(pki: Path, node_id: str) -> Any:
    from cco.transport import TransportConfig

    return TransportConfig.for_node(pki, node_id, max_datagram_size=16000)


def one_round(comms: list[BlockingCommunicator], round_: int, elements: int) -> dict[str, Any]:
    world = len(comms)
    started_wall, started = time.time(), time.perf_counter()
    futures = [c.start_all_reduce(inputs(c.rank, round_, elements)) for c in comms]
    line: dict[str, Any] = {"round": round_, "t": started_wall, "ok": True, "exact": True, "error": None}
    want = exact(world, round_, elements)
    for future in futures:
        try:
            result = future.result(120)
        except (CcoError, concurrent.futures.TimeoutError) as error:
            line.update(ok=False, exact=False, error=str(error)[:300])
            continue
        if not np.array_equal(result, want):
            line["exact"] = False
    line["seconds"] = time.perf_counter() - started
    return line


def victim(args: argparse.Namespace, out: TextIO) -> int:
    spec = GroupSpec(group_id=bytes.fromhex(args.group), world_size=2, rendezvous=args.rendezvous)
    comms = join_all(spec, ["victim-0", "victim-1"], args.pki, 60.0)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    round_ = 0
    try:
        while not stop.is_set():
            line = one_round(comms, round_, args.elements)
            out.write(json.dumps(line) + "\n")
            out.flush()
            if not line["ok"]:
                time.sleep(0.05)  # a failing session fails at once: do not spin
            round_ += 1
    finally:
        close_all(comms)
    return 0


def newgroup(args: argparse.Namespace, out: TextIO) -> int:
    group = os.urandom(16)
    spec = GroupSpec(group_id=group, world_size=2, rendezvous=args.rendezvous)
    started = time.perf_counter()
    line: dict[str, Any] = {
        "group": group.hex(),
        "t": time.time(),
        "joined_seconds": None,
        "formed_seconds": None,
        "error": None,
    }
    comms: list[BlockingCommunicator] = []
    try:
        comms = join_all(spec, ["newcomer-0", "newcomer-1"], args.pki, args.timeout)
        line["joined_seconds"] = time.perf_counter() - started
        first = one_round(comms, 0, 64)
        if first["ok"] and first["exact"]:
            line["formed_seconds"] = time.perf_counter() - started
        else:
            line["error"] = first["error"] or "the first all-reduce was not exact"
    except (CcoError, concurrent.futures.TimeoutError, OSError) as error:
        line["error"] = str(error)[:300]
    finally:
        close_all(comms)
    out.write(json.dumps(line) + "\n")
    out.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=["victim", "newgroup"])
    parser.add_argument("--pki", type=Path, required=True)
    parser.add_argument("--rendezvous", required=True, help="HOST:PORT")
    parser.add_argument("--group", default="ee" * 16, help="victim: the group id (32 hex digits)")
    parser.add_argument("--elements", type=int, default=ELEMENTS, help="victim: elements per all-reduce")
    parser.add_argument("--timeout", type=float, default=20.0, help="newgroup: seconds to join")
    parser.add_argument("--out", type=Path, help="JSON lines here (default: stdout)")
    parser.add_argument("--at", type=float, default=0.0, help="start at this Unix time (imports done before)")
    args = parser.parse_args(argv)
    # The compiled loops too are start-up: loaded in the join, after --at, they put a
    # couple of CPU seconds (many more on a loaded host) into the newcomer's time to
    # form, which is meant to measure the attack.
    kernels.preload()
    time.sleep(max(0.0, args.at - time.time()))
    run = victim if args.mode == "victim" else newgroup
    if args.out is None:
        return run(args, sys.stdout)
    with open(args.out, "a", encoding="utf-8") as out:
        return run(args, out)


if __name__ == "__main__":
    sys.exit(main())
