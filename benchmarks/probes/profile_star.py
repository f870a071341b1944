"""Where an aggregator's and an endpoint's CPU goes in a bulk all-reduce on the star.

Builds the namespace star of ``run.py`` (``--endpoints`` links, MTU ``--mtu``, each
direction shaped to ``--rate-mbit`` or left unshaped, veth GRO as ``--gro`` says),
starts the rendezvous and the aggregator in the hub, and runs ``--rounds`` verified
float32 all-reduces of ``--bytes`` per rank.  While they run, py-spy samples the
aggregator and endpoint 0 (``--native``: the frames of qh3's Rust core, OpenSSL and
numpy below the Python ones; idle threads are not sampled, so a sample is CPU the
process was using or wanted: a thread that is runnable but waits for a core counts
too).  Each sample is charged to one *category* by the innermost frame that names
one (QUIC packet work, crypto, syscalls, framing, CBOR, the MAC, combining, copies,
the event loop, ...), and the table gives each category's share of the samples and
the CPU seconds it stands for (the share times the process's CPU seconds over the
sampled span, read from /proc).  On a loaded host that overstates the places where
a process waits for a core: busy polling's ``sched_yield`` hands the core to others
and then waits its turn, so polling can show as a large share of a node's CPU that
polling less does not save; ``--perf`` samples only what ran, and is the one to
trust there.

Also prints the MB each node moved per CPU second over the rounds after the first
(``cputrace.py``: start-up and joining left out), the aggregator's N x S in plus
N x S out per round and an endpoint's S up plus S down, the figures of issue 40, and
the chunk size each round ran with (the ranks of a float sum agree it call by call,
and a chunk's fixed cost is what larger chunks save).

    python benchmarks/probes/profile_star.py --rate-mbit unshaped --gro off
    python benchmarks/probes/profile_star.py --rate-mbit 400 --rounds 3 --top 25

Writes the collapsed stacks (``*.folded``, for flame graphs) and a JSON summary to
``--out`` (default ``benchmarks/probes/results/profile_star``).
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
import netns
from cputrace import cpu_seconds

RESULTS = Path(__file__).resolve().parent / "results" / "profile_star"
MiB = 1 << 20

CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    # innermost first: the first rule any frame of a stack matches, from the leaf up, wins
    (
        "syscalls (send, receive, poll)",
        (
            "sendmsg",
            "recvmsg",
            "recvfrom",
            "sendto",
            "epoll_wait",
            "__libc_send",
            "__libc_recv",
            "syscall",
            "select.py",
        ),
    ),
    (
        "crypto (AEAD, header protection)",
        (
            "aes",
            "gcm",
            "chacha",
            "poly1305",
            "EVP_",
            "ring::",
            "aead",
            "openssl",
            "libcrypto",
            "aws_lc",
            "ghash",
            "header_protection",
        ),
    ),
    ("MAC (cco.wire.mac, kernels)", ("cco/wire/mac.py", "cco/wire/kernels.py", "cco/wire/modp.py")),
    (
        "quantize / dequantize, combine (payload, blockscale, exact)",
        (
            "cco/wire/payload.py",
            "cco/wire/blockscale.py",
            "cco/wire/exact.py",
            "cco/wire/ops.py",
            "cco/wire/packing.py",
            "cco/wire/dtypes.py",
        ),
    ),
    (
        "CBOR (cco.wire.cbor, cbor2)",
        ("cco/wire/cbor.py", "cbor2", "cco/wire/codec.py", "cco/wire/fields.py", "cco/wire/messages.py"),
    ),
    ("framing (cco.wire.framing)", ("cco/wire/framing.py",)),
    ("QUIC core (qh3 native: packets, ACKs, streams)", ("qh3::", "_hazmat", "qh3/")),
    ("QUIC (aioquic, Python)", ("aioquic/",)),
    ("CCO transport adapter (link, udp, qh3conn)", ("cco/transport/",)),
    ("aggregator / endpoint machines (cco.nodes)", ("cco/nodes/",)),
    ("services and client", ("cco/services/", "cco/client/", "cco/roles", "cco/workload")),
    ("numpy (outside the above)", ("numpy",)),
    ("memory copies (memcpy, bytes)", ("memcpy", "memmove", "__memcpy", "__memmove")),
    ("asyncio event loop", ("asyncio/",)),
]
"""Ordered rules for charging a stack: each frame is tested from the leaf outwards,
against every rule in turn, and the first match names the category.  The syscall and
crypto rules come first because their frames lie under every other."""


IDLE = "asleep in epoll_wait (not CPU; left out of the shares)"
WHOLE_STACK: list[tuple[str, str]] = [
    ("cco/services/polling.py", "busy polling (sched_yield, zero-timeout epoll)"),
    ("importlib._bootstrap", "start-up (imports, bytecode compilation)"),
    ("cco/workload.py", "workload (inputs, expected results, hashing: not the datapath)"),
]
"""Categories decided by any frame of a stack, before the leaf-up rules: what a
polling loop or an import calls is theirs, whatever it is."""


def blocking_select_frame(nodes_from: Path | None = None) -> str:
    """How py-spy names the polling selector's last, blocking ``select`` (file:line),
    in the nodes' ``cco`` (``nodes_from``'s, or this interpreter's)."""
    if nodes_from is None:
        import cco.services.polling as polling

        source = Path(polling.__file__)
    else:
        source = nodes_from / "cco" / "services" / "polling.py"
    lines = source.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if "super().select(None if timeout" in line)
    return f"cco/services/polling.py:{number})"


BLOCKING_SELECT = blocking_select_frame()


def categorize(stack: list[str]) -> str:
    if "epoll_wait" in stack[-1]:
        polled = [frame for frame in stack if "cco/services/polling.py" in frame]
        if not polled or BLOCKING_SELECT in polled[-1]:
            return IDLE
    for needle, name in WHOLE_STACK:
        if any(needle in frame for frame in stack):
            return name
    for frame in reversed(stack):
        for name, needles in CATEGORIES:
            if any(needle in frame for needle in needles):
                return name
    return "other (interpreter, libc)"


def read_folded(path: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw output (``--threads``: a thread frame first), one ``frame;...;leaf
    count`` line per distinct stack: the main thread's stacks, without that frame.

    The other threads (an executor's, the logging queue's) wait in a futex nearly all
    the time, which py-spy's idle test misses when it unwinds native frames."""
    stacks = []
    if not path.exists():
        return stacks
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        thread, _, rest = frames.partition(";")
        if rest and count.isdigit() and "MainThread" in thread:
            stacks.append((rest.split(";"), int(count)))
    return stacks


def leaf_functions(stacks: list[tuple[list[str], int]], top: int) -> list[tuple[str, int]]:
    """The innermost frames carrying most samples (self time)."""
    counter: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        counter[frames[-1]] += count
    return counter.most_common(top)


def endpoint_pid(star: netns.Star, index: int, timeout: float) -> int:
    """The endpoint process in namespace ``index`` (the only process there)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["ip", "netns", "pids", star.endpoint_ns[index]], capture_output=True, text=True
        ).stdout.split()
        for pid in out:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"--role\x00endpoint" in cmdline:
                return int(pid)
        time.sleep(0.05)
    raise RuntimeError(f"no endpoint process appeared in {star.endpoint_ns[index]}")


def py_spy() -> str | None:
    """py-spy's path: on PATH, or beside this interpreter (a virtualenv's ``bin``, which
    is not on PATH when the probe runs as ``.venv/bin/python``, as under sudo)."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.is_file() else None)


class Sampler:
    """py-spy recording one process until stopped (or until the process ends)."""

    def __init__(self, pid: int, path: Path, rate: int) -> None:
        self.pid = pid
        self.path = path
        self.cpu_start = cpu_seconds(pid)
        self.wall_start = time.monotonic()
        self.cpu_end = self.cpu_start
        argv = [py_spy() or "py-spy", "record", "--pid", str(pid), "--native", "--rate", str(rate)]
        argv += ["--format", "raw", "--threads", "--output", str(path)]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._watch = threading.Thread(target=self._follow_cpu, daemon=True)
        self._watch.start()

    def _follow_cpu(self) -> None:
        while self.process.poll() is None:
            try:
                self.cpu_end = cpu_seconds(self.pid)
            except OSError:
                return
            time.sleep(0.1)

    def stop(self) -> float:
        """Stop sampling; the CPU seconds the process used while sampled."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._watch.join()
        return self.cpu_end - self.cpu_start


class PerfSampler:
    """``perf record`` of one process's on-CPU samples (``cpu-clock``), until stopped.

    py-spy samples a thread whenever it is runnable, and on a host where more
    processes want the cores than there are, a runnable thread often waits for one:
    inside ``sched_yield`` above all, so a polling node's samples overstate what its
    polling costs.  perf's samples are taken on the CPU only, so their shares by
    library and symbol are CPU; they have no Python frames (Python 3.11)."""

    def __init__(self, pid: int, path: Path, rate: int) -> None:
        self.path = path
        argv = ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(rate), "-p", str(pid), "-o", str(path)]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def report(self, sort: str, top: int) -> list[tuple[float, str]]:
        """The ``top`` rows of ``perf report --sort <sort>``: (share, name)."""
        out = subprocess.run(
            ["perf", "report", "-i", str(self.path), "--stdio", "--sort", sort, "--percent-limit", "0.3"],
            capture_output=True,
            text=True,
        ).stdout
        rows = []
        for line in out.splitlines():
            fields = line.split(None, 1)
            if len(fields) == 2 and fields[0].endswith("%") and not line.startswith("#"):
                rows.append((float(fields[0][:-1]) / 100, fields[1].strip()))
        return rows[:top]


def summarize(name: str, stacks: list[tuple[list[str], int]], cpu: float, top: int) -> dict[str, Any]:
    shares: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        shares[categorize(frames)] += count
    idle = shares.pop(IDLE, 0)
    stacks = [(frames, count) for frames, count in stacks if categorize(frames) != IDLE]
    total = sum(shares.values()) or 1
    print(f"\n{name}: {cpu:.2f} CPU s sampled, {total} samples on CPU ({idle} more asleep in epoll_wait)")
    rows = []
    for category, count in shares.most_common():
        share = count / total
        rows.append({"category": category, "share": share, "cpu_seconds": share * cpu})
        print(f"  {share:6.1%}  {share * cpu:6.2f} s  {category}")
    print("  innermost frames:")
    leaves = leaf_functions(stacks, top)
    for frame, count in leaves:
        print(f"  {count / total:6.1%}  {frame[:150]}")
    return {"cpu_seconds": cpu, "samples": total, "categories": rows, "leaves": leaves}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument("--bytes", type=int, default=64 * MiB, help="float32 bytes per rank")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--rate-mbit", default="unshaped", help="Mbit/s of each link direction, or 'unshaped'"
    )
    parser.add_argument("--mtu", type=int, default=9000)
    parser.add_argument("--gro", choices=("on", "off"), default="off")
    parser.add_argument("--sample-rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--quic-backend", default=None)
    parser.add_argument("--chunk-elements", type=int, default=None)
    parser.add_argument(
        "--scaled-chunk-elements",
        type=int,
        default=None,
        help="the largest chunk a float sum's ranks may agree (the rendezvous's option)",
    )
    parser.add_argument("--busy-poll-us", type=int, default=None, help="every node's (default: theirs)")
    parser.add_argument("--window", type=int, default=None)
    parser.add_argument(
        "--nodes-from",
        type=Path,
        default=None,
        help="a source tree whose cco the nodes run (an A/B of two trees with one harness)",
    )
    parser.add_argument("--top", type=int, default=15, help="innermost frames listed per process")
    parser.add_argument("--no-profile", action="store_true", help="CPU figures only, no py-spy")
    parser.add_argument(
        "--perf", action="store_true", help="also perf's on-CPU samples by library and symbol"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    reason = netns.unavailable_reason()
    if reason is not None:
        print(f"profile_star.py: {reason}", file=sys.stderr)
        return 2
    if args.perf and shutil.which("perf") is None:
        print("profile_star.py: perf is not installed (apt-get install linux-perf)", file=sys.stderr)
        return 2
    if not args.no_profile and py_spy() is None:
        print("profile_star.py: py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 2
    rate = None if args.rate_mbit == "unshaped" else float(args.rate_mbit)
    args.out.mkdir(parents=True, exist_ok=True)
    spec = netns.StarSpec(endpoints=args.endpoints, rate_mbit=rate, mtu=args.mtu, gro=args.gro == "on")
    settings = netns.CcoSettings(
        max_datagram_size=netns.quic_datagram_size(args.mtu),
        operation_timeout_ms=600_000,
        heartbeat_ms=20_000,
        quic_backend=args.quic_backend,
        chunk_elements=args.chunk_elements,
        scaled_chunk_elements=args.scaled_chunk_elements,
        window=args.window,
        busy_poll_us=args.busy_poll_us,
        nodes_from=args.nodes_from,
    )
    if args.nodes_from is not None:
        global BLOCKING_SELECT
        BLOCKING_SELECT = blocking_select_frame(args.nodes_from)
    label = f"N={args.endpoints} {args.rate_mbit} MTU {args.mtu} GRO {args.gro}"
    with (
        netns.Star(spec) as star,
        netns.CcoCluster(star, args.out / "nodes", args.endpoints, settings) as cluster,
    ):
        cluster.start()
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["run"] = cluster.run(args.bytes // 4, args.rounds, 600)
            except Exception as exc:  # reported below
                outcome["error"] = exc

        worker = threading.Thread(target=run)
        worker.start()
        samplers = {}
        if not args.no_profile:
            ep_pid = endpoint_pid(star, 0, 60)
            aggregator = cluster.aggregator_pid
            samplers["aggregator"] = Sampler(aggregator, args.out / "aggregator.folded", args.sample_rate)
            samplers["endpoint 0"] = Sampler(ep_pid, args.out / "endpoint0.folded", args.sample_rate)
        perfs = {}
        if args.perf:
            perfs["aggregator"] = PerfSampler(cluster.aggregator_pid, args.out / "aggregator.perf", 499)
            perfs["endpoint 0"] = PerfSampler(endpoint_pid(star, 0, 60), args.out / "endpoint0.perf", 499)
        worker.join()
        sampled = {name: sampler.stop() for name, sampler in samplers.items()}
        for perf in perfs.values():
            perf.stop()
    if "error" in outcome:
        print(f"the run failed: {outcome['error']}", file=sys.stderr)
        return 1
    result = outcome["run"]
    rounds = result.round_seconds()
    chunks = [sorted({c for c in ranks if c is not None}) for ranks in result.chunk_elements()]
    summary: dict[str, Any] = {
        "network": label,
        "round_seconds": rounds,
        "round_chunk_elements": chunks,
        "bit_identical": result.bit_identical(),
        "endpoint_cpu_seconds": result.cpu_seconds,
    }
    print(
        f"{label}: rounds {', '.join(f'{s:.2f}' for s in rounds)} s, bit-identical {result.bit_identical()}"
    )
    print(f"chunk elements by round: {', '.join('/'.join(map(str, c)) or '?' for c in chunks)}")
    print(f"endpoints' whole-process CPU: {', '.join(f'{c:.2f}' for c in result.cpu_seconds)} s")
    cpu = result.rounds_cpu(1)
    if cpu is not None:
        aggregator_cpu, endpoint_cpus = cpu
        warm = args.rounds - 1
        mean = sum(endpoint_cpus) / len(endpoint_cpus)
        summary["aggregator_mb_per_cpu_second"] = (
            2 * args.endpoints * args.bytes * warm / 1e6 / aggregator_cpu
        )
        summary["endpoint_mb_per_cpu_second"] = 2 * args.bytes * warm / 1e6 / mean
        print(
            f"rounds 2 to {args.rounds}: aggregator {aggregator_cpu / warm:.2f} CPU s per round, "
            f"{summary['aggregator_mb_per_cpu_second']:.0f} MB per CPU second (in+out); endpoints "
            f"{mean / warm:.2f} CPU s per round, {summary['endpoint_mb_per_cpu_second']:.0f} MB per CPU "
            "second (up+down)"
        )
    for name, sampler in samplers.items():
        stacks = read_folded(sampler.path)
        summary[name] = summarize(name, stacks, sampled[name], args.top)
    for name, perf in perfs.items():
        summary[f"{name} (perf)"] = {
            "dso": perf.report("dso", args.top),
            "symbol": perf.report("dso,sym", args.top),
        }
        print(f"\n{name}, on-CPU samples (perf) by library:")
        for share, dso in summary[f"{name} (perf)"]["dso"]:
            print(f"  {share:6.1%}  {dso}")
        print("  by symbol:")
        for share, symbol in summary[f"{name} (perf)"]["symbol"]:
            print(f"  {share:6.1%}  {symbol[:140]}")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
