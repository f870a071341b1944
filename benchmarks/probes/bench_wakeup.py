"""What it costs this host to wake a process for a datagram, and what polling saves.

Two processes pass one 40-byte UDP datagram back and forth on 127.0.0.1, ``--trips``
times, each waiting for it in one of three ways:

* ``sleep``: ``epoll_wait`` until it comes (what a node does with ``--busy-poll-us 0``):
  each datagram wakes a sleeping process, on the other core if the scheduler put it
  there;
* ``poll``: ``epoll_wait`` with a zero timeout, yielding the core between looks
  (what :mod:`cco.services.polling` does within its budget): nobody sleeps, so
  nobody is woken;
* ``sleep, one core``: as ``sleep`` with both processes pinned to core 0, so a
  wakeup never crosses cores.

Prints the round trip and each process's CPU per round trip for each, and writes
JSON.  On the reference host (a 2-vCPU VM) sleeping cost 59 us a round trip against
8.5 us polling: the gap is what every datagram of a small collective pays to wake
its receiver.

    python benchmarks/probes/bench_wakeup.py --trips 20000
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "bench_wakeup.json"
MODES = ("sleep", "poll", "sleep, one core")


def _bounce(me: socket.socket, peer: tuple[str, int], trips: int, poll: bool, serve: bool) -> None:
    """Wait for the datagram and send it back, ``trips`` times (the server sends first)."""
    waiter = select.epoll()
    waiter.register(me.fileno(), select.EPOLLIN)
    if serve:
        me.sendto(b"x" * 40, peer)
    for _ in range(trips):
        while True:
            try:
                data = me.recv(64)
                break
            except BlockingIOError:
                if poll:
                    os.sched_yield()
                    waiter.poll(0)
                else:
                    waiter.poll(-1)
        me.sendto(data, peer)
    waiter.close()


def measure(mode: str, trips: int) -> dict[str, Any]:
    """Round trip and CPU per round trip of one mode, from the parent's side."""
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for sock in (a, b):
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
    poll = mode == "poll"
    affinity = os.sched_getaffinity(0)
    child = os.fork()
    if child == 0:
        if mode == "sleep, one core":
            os.sched_setaffinity(0, {0})
        _bounce(b, a.getsockname(), trips, poll, serve=False)
        os._exit(0)
    if mode == "sleep, one core":
        os.sched_setaffinity(0, {0})
    try:
        start, cpu = time.perf_counter(), time.process_time()
        _bounce(a, b.getsockname(), trips, poll, serve=True)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        os.sched_setaffinity(0, affinity)
        os.waitpid(child, 0)
        a.close()
        b.close()
    per_trip = 1e6 / trips
    return {"mode": mode, "trips": trips, "round_trip_us": wall * per_trip, "cpu_us_per_trip": cpu * per_trip}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trips", type=int, default=20000, help="round trips per mode")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if not hasattr(select, "epoll") or not hasattr(os, "sched_setaffinity"):
        print("bench_wakeup.py: needs Linux (epoll, sched_setaffinity)", file=sys.stderr)
        return 2
    results = []
    for mode in MODES:
        result = measure(mode, args.trips)
        results.append(result)
        print(
            f"{mode:16} round trip {result['round_trip_us']:6.1f} us, "
            f"CPU {result['cpu_us_per_trip']:5.1f} us per trip (one side)",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
