"""Live trials of a malicious aggregator's tamperings (issue 41, third bullet).

For one attack: a rendezvous (``cco-node``) and one aggregator that tampers
(:mod:`cco.interop.hostile`, the only aggregator, so every group's tree goes through
it) on loopback; attacked groups of two ranks (in this process) run ``2 x trials``
all-reduces of random shapes and types, in pairs of the same shape, one group for
block-scaled calls and one for the others (integers, and floats small enough for
the EXACT form), pair by pair as the attack allows.  The aggregator attacks the
second call of each pair (never-started: the first, sending a result for the
second) and says so in its tamper log.  For the other-group attack a source group
runs the same shape before each call; the aggregator passes its results off as
the attacked group's.  Checked per call, against the log:

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
from hostile_victim import close_all, join_all

from cco.client import BlockingCommunicator, GroupSpec
from cco.interop.hostile import ATTACKS, SCALE_ATTACKS
from cco.localcluster import free_udp_port
from cco.transport.certs import create_dev_pki
from cco.wire.errors import CcoError
from cco.wire.registries import Role

HOST = "127.0.0.1"
CHUNK_ELEMENTS = 256
SCALED, UNSCALED = "scaled", "unscaled"
HEARTBEAT_MS = 3000
"""Members are lost after three intervals without a message: long enough that a
machine busy with other work does not lose them (the trials judge tampering, not
liveness)."""
GROUPS = {UNSCALED: bytes.fromhex("a1" * 16), SCALED: bytes.fromhex("c3" * 16)}
"""The attacked groups, one per form (a group's calls keep one form: see cco.interop.hostile)."""
SOURCE = bytes.fromhex("b2" * 16)
"""The group whose results the other-group attack passes off as another's."""
EXACT_ELEMENTS = 16  # cco.wire.exact.MAX_ELEMENTS: float sums this small are unscaled


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


def _forms(attack: str) -> tuple[str, ...]:
    """The forms ``attack`` is tried in: block-scaled calls (a scale pass, then the
    data), unscaled ones (integers, and floats of up to 16 elements in the EXACT form),
    or both, pair by pair."""
    if attack in SCALE_ATTACKS:
        return (SCALED,)
    if attack in ("drop-with-bit", "drop-keep-bit", "count-twice"):
        return (UNSCALED,)  # a sum with a contributor again would not fit a block-scaled width
    return (UNSCALED, SCALED)


def _call_plan(attack: str, form: str, rng: np.random.Generator) -> tuple[np.dtype[Any], int]:
    """The dtype and element count of one pair of calls of ``form``."""
    least = 2 * CHUNK_ELEMENTS if attack == "swap-chunks" else 1
    if form == SCALED:
        return np.dtype(rng.choice([np.float32, np.float64])), int(rng.integers(max(least, 17), 3000))
    choices = [np.int32, np.int64, np.int16, np.float32, np.float64]
    if attack == "swap-chunks":
        choices = choices[:3]  # a float sum small enough to be EXACT may be a single chunk
    dtype = np.dtype(rng.choice(choices))
    if dtype.kind == "f":
        return dtype, int(rng.integers(1, EXACT_ELEMENTS + 1))
    return dtype, int(rng.integers(least, 3000))


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
        names = [f"{who}-{r}" for who in (SCALED, UNSCALED, "source") for r in range(2)]
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
                "--heartbeat-ms",
                str(HEARTBEAT_MS),
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
                ",".join(g.hex() for g in GROUPS.values()),
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

        def group(group_id: bytes, names: list[str]) -> list[BlockingCommunicator]:
            members = join_all(
                GroupSpec(group_id=group_id, world_size=2, rendezvous=rendezvous), names, nodes.pki, 60
            )
            comms.extend(members)
            return members

        forms = _forms(attack)
        attacked = {form: group(GROUPS[form], [f"{form}-0", f"{form}-1"]) for form in forms}
        source = group(SOURCE, ["source-0", "source-1"]) if attack == "other-group" else []
        rng = np.random.default_rng(seed)
        results: dict[str, list[tuple[list[np.ndarray], list[np.ndarray | CcoError]]]] = {
            f: [] for f in forms
        }
        for pair in range(trials):
            form = forms[pair % len(forms)]
            dtype, elements = _call_plan(attack, form, rng)
            for _ in range(2):
                arrays = [_inputs(dtype, elements, rng) for _ in range(2)]
                if source:
                    _run_call(source, [_inputs(dtype, elements, rng) for _ in range(2)])
                results[form].append((arrays, _run_call(attacked[form], arrays)))
            if pair % 50 == 49:
                print(f"  {attack}: {pair + 1} pairs", file=sys.stderr, flush=True)
        time.sleep(0.5)  # the aggregator's last log lines
        log = nodes.tampered()
        for form, calls in results.items():
            _judge(outcome, calls, [line for line in log if line["group"] == GROUPS[form].hex()])
    finally:
        close_all(comms)
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
    outcome.calls += len(results)
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
