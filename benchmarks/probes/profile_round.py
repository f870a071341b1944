"""Where the CPU of an 8-byte all-reduce goes, process by process, sampled by perf.

Starts the loopback cluster of ``run.py``'s latency case (four endpoints, one
aggregator and the rendezvous as separate ``cco-node`` processes on 127.0.0.1, the
endpoints' ``allreduce`` workload) with every node run through this file, which
notes its pid and role before ``cco-node``'s own main.  Once the rounds are under
way, ``perf record -a`` samples every CPU of the host (the ``cpu-clock`` event, so
it needs no hardware counters) for ``--seconds``.  Each sample is charged to the
process it interrupted (an endpoint, the aggregator, the rendezvous, anything else,
or the idle task) and to the shared object it was in: the interpreter, the kernel,
numpy, qh3, cbor2, cryptography, OpenSSL.

Under Python 3.12 or later the nodes turn on perf support
(``sys.activate_stack_trampoline``), the samples carry call chains, and each is also
charged to the innermost Python function on its stack, with the C it called: the CPU
each function costs.  py-spy's samples are of wall time, and on a host where five
processes share two cores a function that is descheduled, or waits in the kernel
while a peer it woke runs, looks expensive there.

The CPU per round of every row is its samples over the rounds the endpoints started
inside the sampled window.  Sampling costs CPU of its own, the more with call chains
(perf copies 16 KiB of each sample's stack): the rounds are slower while it runs, and
perf drops samples it cannot keep up with (the header says how many it kept).  The
shares are the figures to read.  Prints the table and writes JSON to
``results/profile_round.json``.

    python benchmarks/probes/profile_round.py --rounds 6000 --seconds 3

By function, with an interpreter of 3.12 or later that has cco installed:

    python3.12 -m venv /tmp/v312 && /tmp/v312/bin/pip install -e .
    /tmp/v312/bin/python benchmarks/probes/profile_round.py --rounds 6000 --seconds 3
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PID_DIR = "CCOBENCH_PROFILE_PID_DIR"
"""Set in a process started through this file: it is a node, and notes its pid and role there."""

RESULTS = Path(__file__).resolve().parent / "results" / "profile_round.json"
FREQUENCY = 1999
"""Samples per second and CPU: odd, so they do not beat with a 1 ms timer."""

PYTHON_FRAMES = sys.version_info >= (3, 12)
"""perf support (named Python frames in the samples' call chains) came in Python 3.12."""


# --- in a node -------------------------------------------------------------------------------


def _node_main(argv: list[str]) -> int:
    """Note this process's pid and role, then run ``cco-node`` with ``argv``."""
    role = argv[argv.index("--role") + 1] if "--role" in argv else "other"
    Path(os.environ[PID_DIR], str(os.getpid())).write_text(role)
    if PYTHON_FRAMES:
        sys.activate_stack_trampoline("perf")  # type: ignore[attr-defined]  # 3.12's API
    from cco.cli import main

    return main(argv)


# --- reading perf's samples ------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One sample: the process it interrupted, when (CLOCK_MONOTONIC seconds), the
    object it was in, and the innermost Python function on its stack ("" where the
    stack has none or perf had no names)."""

    pid: int
    time: float
    library: str
    function: str


_FRAME = re.compile(r"^\s*[0-9a-f]+ (?P<symbol>.*) \((?P<dso>[^()]*)\)$")
_HEADER = re.compile(r"^\s*\S.*?\s+(?P<pid>\d+)\s+(?P<time>\d+\.\d+):(?P<rest>.*)$")


def library_of(dso: str) -> str:
    """A readable name for the shared object ``dso`` (a path, or perf's bracketed name)."""
    if dso == "[kernel.kallsyms]" or dso.startswith("[kernel"):
        return "kernel"
    if "/qh3/" in dso:
        return "qh3"
    if "/cryptography/" in dso:
        return "cryptography"
    if "/numpy/" in dso:
        return "numpy"
    if "/numba/" in dso or "llvmlite" in dso:
        return "numba"
    name = Path(dso).name
    for prefix, library in (
        ("libpython", "interpreter"),
        ("python3", "interpreter"),
        ("_cbor2", "cbor2"),
        ("libcrypto", "OpenSSL"),
        ("libssl", "OpenSSL"),
        ("libc.so", "libc"),
        ("perf-", "interpreter"),
    ):
        if name.startswith(prefix):
            return library
    return name or dso


def python_function(symbol: str) -> str:
    """``py::Class.method:/path/to/cco/wire/x.py`` as ``Class.method (wire/x.py)``."""
    name, _, path = symbol.removeprefix("py::").partition(":")
    if "/cco/" in path:
        short = path.rsplit("/cco/", 1)[1]
    elif "/site-packages/" in path:
        short = path.rsplit("/site-packages/", 1)[1]
    else:
        short = Path(path).name
    return f"{name} ({short})"


def parse_samples(lines: Iterable[str]) -> Iterator[Sample]:
    """The samples of ``perf script -F comm,pid,time,ip,sym,dso`` output, with or
    without call chains (a header line, then one tab-indented line per frame,
    innermost first)."""
    header: re.Match[str] | None = None
    frames: list[tuple[str, str]] = []

    def finish() -> Sample | None:
        if header is None or not frames:
            return None
        dso = next((d for _, d in frames if d != "inlined"), frames[0][1])
        named = next((s for s, _ in frames if s.startswith("py::")), "")
        function = python_function(named) if named else ""
        return Sample(int(header["pid"]), float(header["time"]), library_of(dso), function)

    for raw in lines:
        line = raw.rstrip("\n")
        if not line.strip():
            continue
        if line.startswith("\t"):  # a frame of the sample above
            frame = _FRAME.match(line)
            if frame and header is not None:
                frames.append((frame["symbol"], frame["dso"]))
            continue
        done = finish()
        if done is not None:
            yield done
        header = _HEADER.match(line)
        frames = []
        # without call chains the header carries the one frame: comm pid time: ip sym (dso)
        flat = _FRAME.match(header["rest"]) if header else None
        if flat:
            frames.append((flat["symbol"], flat["dso"]))
    done = finish()
    if done is not None:
        yield done


# --- the tally -------------------------------------------------------------------------------


@dataclass
class Tally:
    """Samples by role, and within each role by library and by Python function."""

    samples: collections.Counter[str] = field(default_factory=collections.Counter)
    libraries: dict[str, collections.Counter[str]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    functions: dict[str, collections.Counter[str]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )

    def add(self, sample: Sample, roles: dict[int, str]) -> None:
        role = "idle" if sample.pid == 0 else roles.get(sample.pid, "other")
        self.samples[role] += 1
        if role != "idle":
            self.libraries[role][sample.library] += 1
            if sample.function:
                self.functions[role][sample.function] += 1


def tally(samples: Iterable[Sample], roles: dict[int, str]) -> Tally:
    result = Tally()
    for sample in samples:
        result.add(sample, roles)
    return result


def report(result: Tally, rounds: int, seconds: float, top: int) -> dict[str, Any]:
    """The JSON form: each role's share of the samples and CPU per round, its
    libraries and its ``top`` Python functions, each as a share of that role."""
    total = sum(result.samples.values())
    per_sample_ms = 1e3 / FREQUENCY
    roles: dict[str, Any] = {}
    for role, count in result.samples.most_common():
        roles[role] = {
            "share": count / total,
            "cpu_ms_per_round": count * per_sample_ms / rounds if rounds else None,
            "libraries": {k: v / count for k, v in result.libraries[role].most_common()},
            "functions": {k: v / count for k, v in result.functions[role].most_common(top)},
        }
    expected = round(seconds * FREQUENCY * (os.cpu_count() or 1))
    return {"samples": total, "expected": expected, "seconds": seconds, "rounds": rounds, "roles": roles}


def print_report(figures: dict[str, Any], endpoints: int) -> None:
    rounds = figures["rounds"]
    sampled = f"{figures['samples']} samples (of {figures['expected']}) in {figures['seconds']:.1f} s"
    print(
        f"{sampled}, {rounds} rounds started in them ({figures['seconds'] / rounds * 1e3:.2f} ms a round)"
        if rounds
        else f"{sampled}, no round started in them"
    )
    print(f"{'process':12s} {'share':>7s} {'CPU per round':>14s}")
    for role, row in figures["roles"].items():
        per_round = row["cpu_ms_per_round"]
        scaled = f"{per_round:11.3f} ms" if per_round is not None else ""
        label = f"{role} x{endpoints}" if role == "endpoint" else role
        print(f"{label:12s} {row['share'] * 100:6.1f}% {scaled}")
    for role, row in figures["roles"].items():
        if role == "idle":
            continue
        libraries = ", ".join(f"{k} {v * 100:.0f}%" for k, v in row["libraries"].items() if v >= 0.01)
        print(f"\n{role}: {libraries}")
        for name, share in row["functions"].items():
            print(f"  {share * 100:5.1f}%  {name}")


# --- the run ---------------------------------------------------------------------------------


def _roles(pid_dir: Path) -> dict[int, str]:
    return {int(p.name): p.read_text() for p in pid_dir.iterdir()}


def _wait_first_round(cluster: Any, endpoints: int, worker: threading.Thread) -> None:
    """Until every endpoint has verified its first round (or the run ended): joining
    takes seconds on a loaded machine, and a fixed settling time alone then sampled
    nothing but start-up."""
    logs = [f"run1-ep-{i}" for i in range(endpoints)]
    deadline = time.monotonic() + 120
    while worker.is_alive() and time.monotonic() < deadline:
        if all("round 1/" in cluster.log(name) for name in logs):
            return
        time.sleep(0.05)


def _rounds_in(reports: list[dict[str, Any]], start: float, end: float) -> int:
    """Rounds whose first call fell in [start, end] (CLOCK_MONOTONIC, as the records)."""
    calls = [[r["started"] for r in rep["rounds"]] for rep in reports]
    firsts = [min(one_round) for one_round in zip(*calls, strict=True)]
    return sum(1 for t in firsts if start <= t <= end)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=6000, help="rounds of the run (enough to outlast it)")
    parser.add_argument("--seconds", type=float, default=3.0, help="how long perf samples")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds of rounds before sampling starts")
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument("--elements", type=int, default=2, help="elements per rank (2 float32: 8 bytes)")
    parser.add_argument("--top", type=int, default=25, help="Python functions listed per process")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    perf = shutil.which("perf")
    if perf is None:
        print("profile_round.py: needs perf (linux-tools) on PATH", file=sys.stderr)
        return 2
    import netns  # benchmarks/support on sys.path, as for the other benchmarks

    with tempfile.TemporaryDirectory(prefix="cco-profile-") as tmp:
        workdir, pid_dir = Path(tmp), Path(tmp, "pids")
        pid_dir.mkdir()
        os.environ[PID_DIR] = str(pid_dir)
        settings = netns.CcoSettings(
            max_datagram_size=16000,
            operation_timeout_ms=600_000,
            heartbeat_ms=20_000,
            dtype="float32",
            launcher=Path(__file__).resolve(),
        )
        data = workdir / "perf.data"
        record = [perf, "record", "-a", "-e", "cpu-clock", "-F", str(FREQUENCY), "-k", "CLOCK_MONOTONIC"]
        record += ["-o", str(data)]
        if PYTHON_FRAMES:
            record += ["--call-graph", "dwarf,16384"]
        with netns.CcoCluster(None, workdir, args.endpoints, settings) as cluster:
            cluster.start()
            outcome: dict[str, Any] = {}

            def rounds() -> None:
                try:
                    outcome["run"] = cluster.run(args.elements, args.rounds, timeout=600)
                except Exception as error:  # reported below, after perf has stopped
                    outcome["error"] = error

            worker = threading.Thread(target=rounds)
            worker.start()
            _wait_first_round(cluster, args.endpoints, worker)
            time.sleep(args.settle)
            sampled = subprocess.run(
                [*record, "--", "sleep", str(args.seconds)], capture_output=True, text=True
            )
            sampling_ended = time.monotonic()
            worker.join()
        if sampled.returncode != 0:
            print(f"profile_round.py: perf record failed: {sampled.stderr.strip()}", file=sys.stderr)
            return 2
        if "error" in outcome:
            raise outcome["error"]
        run = outcome["run"]
        if sampling_ended > max(r["started"] for rep in run.reports for r in rep["rounds"]):
            print("profile_round.py: the rounds ended before sampling did: raise --rounds", file=sys.stderr)
            return 2
        read = [perf, "script", "-i", str(data), "-F", "comm,pid,time,ip,sym,dso"]
        script = subprocess.run(read, capture_output=True, text=True)
        roles = _roles(pid_dir)
        for pid in roles:  # the nodes' perf maps, left in /tmp by the interpreter
            Path(f"/tmp/perf-{pid}.map").unlink(missing_ok=True)
        samples = list(parse_samples(script.stdout.splitlines()))
        if script.returncode != 0 or not samples:
            problem = script.stderr.strip() or "no samples"
            print(f"profile_round.py: perf script read no samples: {problem}", file=sys.stderr)
            return 2
        result = tally(samples, roles)
    start, end = min(s.time for s in samples), max(s.time for s in samples)
    figures = report(result, _rounds_in(run.reports, start, end), end - start, args.top)
    figures["python"] = sys.version.split()[0]
    figures["python_frames"] = PYTHON_FRAMES
    print_report(figures, args.endpoints)
    if not PYTHON_FRAMES:
        print("\n(Python 3.12 or later names the Python functions; this one is", figures["python"] + ")")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    if os.environ.get(PID_DIR) and "--role" in sys.argv:
        sys.exit(_node_main(sys.argv[1:]))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
    sys.exit(main())
