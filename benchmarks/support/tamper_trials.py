"""Live trials of a malicious aggregator's tamperings (issue 41, third bullet).

For one attack: a rendezvous (``cco-node``) and one aggregator that tampers
(:mod:`cco.interop.hostile`, the only aggregator, so every group's tree goes through
it) on loopback; group A (two ranks, in this process) runs ``2 x trials`` all-reduces
of random shapes and types, in pairs of the same shape; the aggregator attacks the
second call of each pair and says so in its tamper log.  Group B runs the same
shape before each of A's calls for the other-group attack, whose results the
aggregator passes off as A's.  Checked per call, against the log:

* a call the log names failed on every rank with a typed error: detected, and no
  data returned (a rank that returned data counts as undetected, whatever it got);
* every other call returned on every rank, bit-identical between the ranks, and
  exact for integers: nothing honest was refused.

    python benchmarks/support/tamper_trials.py --attack swap-chunks --trials 200
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hostile_victim import join_all

from cco.client import BlockingCommunicator, GroupSpec
from cco.interop.hostile import ATTACKS, SCALE_ATTACKS
from cco.localcluster import free_udp_port
from cco.transport.certs import create_dev_pki
from cco.wire.errors import CcoError
from cco.wire.registries import Role

HOST = "127.0.0.1"
CHUNK_ELEMENTS = 256
GROUP_A = bytes.fromhex("a1" * 16)
GROUP_B = bytes.fromhex("b2" * 16)


@dataclass
class Trials:
    attack: str
    trials: int
    calls: int = 0
    tampered_calls: int = 0
    detected: int = 0
    undetected: list[dict[str, Any]] = field(default_factory=list)
    honest_refused: list[dict[str, Any]] = field(default_factory=list)
    codes: Counter[str] = field(default_factory=Counter)
    details: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def held(self) -> bool:
        return self.tampered_calls >= self.trials and not self.undetected and not self.honest_refused

    def as_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["codes"], out["details"] = dict(self.codes), dict(self.details)  # asdict miscopies a Counter
        out["held"] = self.held
        out["undetected"] = self.undetected[:10]
        out["honest_refused"] = self.honest_refused[:10]
        return out


def _call_plan(attack: str, rng: np.random.Generator) -> tuple[np.dtype[Any], int]:
    """The dtype and element count of one pair of calls."""
    if attack in SCALE_ATTACKS:
        return np.dtype(np.float32), int(rng.integers(64, 3000))
    if attack == "swap-chunks":
        dtype = np.dtype(rng.choice([np.int32, np.float32, np.int64]))
        return dtype, int(rng.integers(2 * CHUNK_ELEMENTS, 3000))
    if attack in ("drop-with-bit", "drop-keep-bit", "count-twice"):
        dtype = np.dtype(rng.choice([np.int32, np.int64, np.int16, np.float32]))
        top = 16 if dtype.kind == "f" else 3000  # floats: the EXACT form (block scales fix the width)
        return dtype, int(rng.integers(1, top + 1))
    dtype = np.dtype(rng.choice([np.int32, np.int64, np.int16, np.float32, np.float64]))
    return dtype, int(rng.integers(1, 3000))


def _inputs(dtype: np.dtype[Any], elements: int, rng: np.random.Generator) -> np.ndarray:
    if dtype.kind == "f":
        return rng.normal(0, 10.0 ** int(rng.integers(-3, 4)), elements).astype(dtype)
    return rng.integers(-1000, 1000, elements).astype(dtype)


def _run_call(comms: list[BlockingCommunicator], arrays: list[np.ndarray]) -> list[np.ndarray | CcoError]:
    futures = [c.start_all_reduce(a) for c, a in zip(comms, arrays, strict=True)]
    out: list[np.ndarray | CcoError] = []
    for future in futures:
        try:
            out.append(future.result(60))
        except CcoError as error:
            out.append(error)
    return out


class _Nodes:
    def __init__(self, workdir: Path, attack: str, seed: int) -> None:
        self.workdir = workdir
        self.pki = workdir / "pki"
        self.log = workdir / "tamper.jsonl"
        self.port = free_udp_port()
        self.processes: list[subprocess.Popen[str]] = []
        self.handles: list[IO[str]] = []
        workdir.mkdir(parents=True, exist_ok=True)
        names = [f"{g}-{r}" for g in "ab" for r in range(2)]
        create_dev_pki(
            self.pki,
            [
                ("rendezvous", Role.RENDEZVOUS),
                ("evil", Role.AGGREGATOR),
                *((n, Role.ENDPOINT) for n in names),
            ],
        )
        common = ["--pki-dir", str(self.pki), "--max-datagram-size", "16000"]
        self._spawn(
            "rendezvous",
            [
                "-m",
                "cco.cli",
                "--role",
                "rendezvous",
                "--node-id",
                "rendezvous",
                *common,
                "--listen",
                f"{HOST}:{self.port}",
                "--store",
                ":memory:",
                "--chunk-elements",
                str(CHUNK_ELEMENTS),
                "--window",
                "4",
                "--operation-timeout-ms",
                "5000",
            ],
        )
        self._wait("rendezvous", "listening")
        self._spawn(
            "evil",
            [
                "-m",
                "cco.interop.hostile",
                "--attack",
                attack,
                "--target-group",
                GROUP_A.hex(),
                "--seed",
                str(seed),
                "--tamper-log",
                str(self.log),
                "--",
                "--node-id",
                "evil",
                *common,
                "--listen",
                f"{HOST}:{free_udp_port()}",
                "--rendezvous",
                f"{HOST}:{self.port}",
            ],
        )
        self._wait("evil", "registered")

    def _spawn(self, name: str, argv: list[str]) -> None:
        handle = open(self.workdir / f"{name}.log", "w")  # noqa: SIM115 - closed in close()
        self.handles.append(handle)
        self.processes.append(
            subprocess.Popen(
                [sys.executable, *argv],
                stdout=handle,
                stderr=handle,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "CCO_STORE": ":memory:"},
            )
        )

    def _wait(self, name: str, needle: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while needle not in (self.workdir / f"{name}.log").read_text(errors="replace"):
            if time.monotonic() > deadline or self.processes[-1].poll() is not None:
                tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"{name} did not log '{needle}': {tail}")
            time.sleep(0.05)

    def tampered(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for handle in self.handles:
            handle.close()


def run_trials(attack: str, trials: int, workdir: Path, seed: int = 41) -> Trials:
    """``trials`` tampered calls of ``attack`` (and as many honest ones between)."""
    started = time.monotonic()
    outcome = Trials(attack, trials)
    nodes = _Nodes(workdir, attack, seed)
    handler = logging.FileHandler(workdir / "endpoints.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.getLogger("cco").addHandler(handler)
    logging.getLogger("cco").setLevel(logging.INFO)
    comms: list[BlockingCommunicator] = []
    try:
        rendezvous = f"{HOST}:{nodes.port}"
        group_a = join_all(
            GroupSpec(group_id=GROUP_A, world_size=2, rendezvous=rendezvous), ["a-0", "a-1"], nodes.pki, 60
        )
        comms += group_a
        group_b: list[BlockingCommunicator] = []
        if attack == "other-group":
            spec_b = GroupSpec(group_id=GROUP_B, world_size=2, rendezvous=rendezvous)
            group_b = join_all(spec_b, ["b-0", "b-1"], nodes.pki, 60)
            comms += group_b
        rng = np.random.default_rng(seed)
        results: list[tuple[list[np.ndarray], list[np.ndarray | CcoError]]] = []
        for pair in range(trials):
            dtype, elements = _call_plan(attack, rng)
            for _ in range(2):
                arrays = [_inputs(dtype, elements, rng) for _ in group_a]
                if group_b:
                    _run_call(group_b, [_inputs(dtype, elements, rng) for _ in group_b])
                results.append((arrays, _run_call(group_a, arrays)))
            if pair % 50 == 49:
                print(f"  {attack}: {pair + 1} pairs", file=sys.stderr, flush=True)
        time.sleep(0.5)  # the aggregator's last log lines
        _judge(outcome, results, nodes.tampered())
    finally:
        for comm in comms:
            comm.close()
        nodes.close()
        logging.getLogger("cco").removeHandler(handler)
        handler.close()
    outcome.seconds = time.monotonic() - started
    return outcome


def _judge(
    outcome: Trials,
    results: list[tuple[list[np.ndarray], list[np.ndarray | CcoError]]],
    log: list[dict[str, Any]],
) -> None:
    attacked = {line["ordinal"] for line in log}
    for line in log:
        outcome.details[line["detail"].split(" ")[0]] += 1
    outcome.calls = len(results)
    for call, (arrays, got) in enumerate(results):
        errors = [g for g in got if isinstance(g, CcoError)]
        data = [g for g in got if not isinstance(g, CcoError)]
        if call in attacked:
            outcome.tampered_calls += 1
            for error in errors:
                outcome.codes[error.code.name] += 1
            if data:
                outcome.undetected.append(
                    {"call": call, "ranks_with_data": len(data), "errors": [str(e) for e in errors]}
                )
            else:
                outcome.detected += 1
            continue
        if errors:
            outcome.honest_refused.append({"call": call, "errors": [str(e)[:200] for e in errors]})
            continue
        identical = all(np.array_equal(d, data[0]) for d in data)
        want = sum(a.astype(np.float64 if a.dtype.kind == "f" else np.int64) for a in arrays)
        close = all(
            np.array_equal(d.astype(np.int64), want)
            if d.dtype.kind != "f"
            else np.allclose(d, want, rtol=1e-2, atol=1e-3)
            for d in data
        )
        if not (identical and close):
            outcome.honest_refused.append({"call": call, "errors": ["an honest call returned other data"]})


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--attack", choices=ATTACKS, required=True)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--workdir", type=Path, default=Path("tamper-trials"))
    args = parser.parse_args()
    outcome = run_trials(args.attack, args.trials, args.workdir / args.attack, args.seed)
    print(json.dumps(outcome.as_dict(), indent=2))


if __name__ == "__main__":
    main()
