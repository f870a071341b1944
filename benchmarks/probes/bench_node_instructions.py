"""Instructions per round of one node process of the 8-byte latency case, counted by callgrind.

``bench_latency.py`` times the loopback cluster of ``run.py``'s latency case (four
endpoints, one aggregator and the rendezvous as separate ``cco-node`` processes,
the endpoints' ``allreduce`` workload); on a shared host its times move by tens of
percent from one minute to the next.  Here the same cluster runs with one node, the
aggregator or the endpoint of rank 0, under valgrind's callgrind, which counts the
instructions that process executes whatever the host is doing: a figure that two
versions of the code can be compared on without alternating runs.  The count is of
user space only (the kernel's share of a system call is not in it), and moves by
about 3% between runs, with the order in which datagrams meet the event loops.
Every node runs with ``--busy-poll-us 0``: polling while waiting would add
instructions that count the wait, not the work.

Every node is started through this file, which hands the chosen one to valgrind and
runs the others as ``cco-node``.  Endpoints are new processes for each run of the
cluster, so the endpoint's figure is the difference between a run of ``--long``
rounds and one of ``--short`` rounds, divided by the difference in rounds (start-up
and joining cancel out); the aggregator lives across runs, so its counters are
dumped (``callgrind_control --dump``) after a first short run, then after a second
short run and after a long one, and the last two dumps are compared the same way.
Under valgrind a node runs some 50 times slower: the other nodes wait for it, and
the run takes a minute or two.

    python benchmarks/probes/bench_node_instructions.py --node endpoint
    python benchmarks/probes/bench_node_instructions.py --node aggregator --short 50 --long 250
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

OUT_ENV = "CCOBENCH_CALLGRIND_OUT"
"""Set in a process started through this file: the callgrind output file prefix."""
NODE_ENV = "CCOBENCH_CALLGRIND_NODE"
"""Set in a process started through this file: which node runs under callgrind."""
NODES = ("endpoint", "aggregator")


# --- in a node -------------------------------------------------------------------------------


def counted(argv: Sequence[str], node: str) -> bool:
    """Whether the ``cco-node`` arguments ``argv`` start the node to count: the
    aggregator, or the endpoint of rank 0."""
    role = argv[argv.index("--role") + 1] if "--role" in argv else None
    if node == "aggregator":
        return role == "aggregator"
    return role == "endpoint" and "--rank" in argv and argv[argv.index("--rank") + 1] == "0"


def valgrind_command(argv: Sequence[str], out: str) -> list[str]:
    """``cco-node argv`` under callgrind, writing to ``out`` (dumps add ``.1``, ``.2``...)."""
    return [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        "cco.cli",
        *argv,
    ]


def _node_main(argv: list[str]) -> int:
    """Run ``cco-node argv``, under callgrind if it is the node to count."""
    if counted(argv, os.environ[NODE_ENV]):
        out = f"{os.environ[OUT_ENV]}.{os.getpid()}"
        os.execvp("valgrind", valgrind_command(argv, out))
    from cco.cli import main

    return main(argv)


# --- reading callgrind's files ---------------------------------------------------------------


def instructions(path: Path) -> int:
    """The instructions a callgrind output file (or one dump of it) counted."""
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split(":", 1)[1].split()[0])
    raise ValueError(f"{path}: no summary line (did valgrind finish writing it?)")


def per_round(short: int, long: int, short_rounds: int, long_rounds: int) -> float:
    """Instructions per round from a short and a long run's counts."""
    if long_rounds <= short_rounds:
        raise ValueError("the long run must have more rounds than the short one")
    return (long - short) / (long_rounds - short_rounds)


def _complete(path: Path) -> bool:
    """Whether callgrind has finished writing ``path`` (its summary line is there)."""
    try:
        instructions(path)
    except ValueError:
        return False
    return True


def _new_files(prefix: Path, before: set[Path], timeout: float) -> list[Path]:
    """Callgrind files under ``prefix`` that appeared since ``before``, once each is complete."""
    deadline = time.monotonic() + timeout
    while True:
        new = sorted(set(prefix.parent.glob(prefix.name + ".*")) - before)
        if new and all(_complete(path) for path in new):
            return new
        if time.monotonic() > deadline:
            raise SystemExit(f"no complete callgrind file under {prefix} after {timeout:.0f} s")
        time.sleep(0.2)


# --- the measurement -------------------------------------------------------------------------


def measure(node: str, short_rounds: int, long_rounds: int, workdir: Path) -> float:
    import netns

    prefix = workdir / "callgrind"
    os.environ[OUT_ENV] = str(prefix)
    os.environ[NODE_ENV] = node
    os.environ["PYTHONHASHSEED"] = "0"  # the same dict and set orders in every run
    settings = netns.CcoSettings(
        max_datagram_size=16000,
        operation_timeout_ms=600_000,
        heartbeat_ms=20_000,
        dtype="float32",
        busy_poll_us=0,  # count the round's work, not the polls while waiting for it
        launcher=Path(__file__).resolve(),
    )
    counts: list[int] = []
    with netns.CcoCluster(None, workdir, 4, settings) as cluster:
        cluster.start()
        runs = [short_rounds, long_rounds]
        if node == "aggregator":
            runs.insert(0, short_rounds)  # its first dump holds its start-up and joining
        for rounds in runs:
            before = set(workdir.glob(prefix.name + ".*"))
            cluster.run(2, rounds, timeout=1800)
            if node == "aggregator":
                dump = ["callgrind_control", "--dump", str(cluster.aggregator_pid)]
                subprocess.run(dump, capture_output=True, check=False)
            new = _new_files(prefix, before, timeout=120)
            counts.append(instructions(new[-1]))
            print(f"  {node}: {rounds} rounds, {counts[-1]:,} instructions", flush=True)
    return per_round(counts[-2], counts[-1], short_rounds, long_rounds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--node", choices=NODES, default="endpoint", help="the node run under callgrind")
    parser.add_argument("--short", type=int, default=50, help="rounds of the short run")
    parser.add_argument("--long", type=int, default=250, help="rounds of the long run")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("bench_node_instructions.py: needs valgrind (callgrind) on PATH", file=sys.stderr)
        return 2
    if args.long <= args.short:
        parser.error("--long must be more than --short")
    with tempfile.TemporaryDirectory(prefix="cco-instructions-") as tmp:
        figure = measure(args.node, args.short, args.long, Path(tmp))
    print(f"{args.node}: {figure / 1e6:.3f} M instructions per round (8-byte all-reduce, 4 ranks)")
    return 0


if __name__ == "__main__":
    if os.environ.get(NODE_ENV) and "--role" in sys.argv:
        sys.exit(_node_main(sys.argv[1:]))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
    sys.exit(main())
