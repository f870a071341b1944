"""What busy polling costs a node that has nothing to do: CPU per second while idle.

An aggregator or endpoint started by ``cco-node`` keeps polling for datagrams for
``--busy-poll-us`` (1 ms by default) each time its event loop runs out of work,
before it sleeps.  Busy, that is time it would otherwise spend being woken; idle, it
is the price.  This starts the loopback cluster of ``run.py``'s latency case (the
rendezvous and one aggregator as ``cco-node`` processes), runs one group of
endpoints through ``--rounds`` 8-byte all-reduces so the aggregator has served a
group, then, with the endpoints gone, reads the aggregator's and the rendezvous's
CPU time over ``--seconds`` of idleness; once per ``--busy-poll-us`` value,
alternated ``--repeats`` times.  Prints CPU milliseconds per second (0.1% of a core
is 1 ms/s) and writes JSON.

    python benchmarks/probes/bench_idle.py --busy-poll-us 0 1000 --seconds 10 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # the shared support modules
import netns

RESULTS = Path(__file__).resolve().parent / "results" / "bench_idle.json"


def cpu_seconds(pid: int) -> float:
    """A process's CPU time, from the scheduler's nanosecond count (/proc's user and
    system times tick in hundredths of a second, too coarse for an idle node)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def measure(busy_poll_us: int, rounds: int, seconds: float, workdir: Path) -> dict[str, Any]:
    settings = netns.CcoSettings(max_datagram_size=16000, busy_poll_us=busy_poll_us)
    with netns.CcoCluster(None, workdir, 4, settings) as cluster:
        cluster.start()
        cluster.run(2, rounds, timeout=120)
        pids = cluster.service_pids()
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        time.sleep(seconds)
        after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    return {
        "busy_poll_us": busy_poll_us,
        "seconds": seconds,
        "cpu_ms_per_second": {name: (after[name] - before[name]) * 1e3 / seconds for name in before},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--busy-poll-us", type=int, nargs="+", default=[0, 1000], help="values, alternated")
    parser.add_argument("--rounds", type=int, default=100, help="all-reduces the group runs first")
    parser.add_argument("--seconds", type=float, default=10.0, help="idle time measured")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="cco-idle-") as tmp:
        for repeat in range(args.repeats):
            for budget in args.busy_poll_us:
                result = measure(budget, args.rounds, args.seconds, Path(tmp) / f"{budget}-{repeat}")
                results.append(result)
                usage = ", ".join(f"{name} {ms:.2f}" for name, ms in result["cpu_ms_per_second"].items())
                print(f"--busy-poll-us {budget:>5}: idle CPU, ms per second: {usage}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
