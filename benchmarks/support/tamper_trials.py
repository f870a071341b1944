"""Live trials of a malicious aggregator's tamperings (issue 41, third bullet).

For one attack: a rendezvous (``cco-node``), one aggregator that tampers
(:mod:`cco.interop.hostile`, "evil") and one honest aggregator ("honest") on
loopback.  Every trial is a pair of all-reduces of one random shape and type in a
group of two ranks (in this process) formed for it, on the evil aggregator (it
offers more capacity than the honest one, and the planner puts a group where the
most is spare): block-scaled calls, or the others
(integers, and floats small enough for the EXACT form), trial by trial as the attack
allows.  The aggregator attacks the second call of the pair (never-started: the
first, sending a result for the second) and says so in its tamper log.  For the
other-group attack a source group runs the same shape before each call; the
aggregator passes its results off as the attacked group's.  Checked per call,
against the log:

* a call the log names failed on every rank with a typed error: detected, and no
  data returned (a rank that returned data counts as undetected, whatever it got);
* every other call returned on every rank, bit-identical between the ranks, and
  exact for integers: nothing honest was refused.

And per tampered trial, whether the group continued without the evil aggregator:
a third call of the same shape, made at once, returned the exact result on every
rank, and the rendezvous (asked for its status) has the group in a later epoch, in
a tree without the evil aggregator.  The members' Reports moved it there.

    python benchmarks/support/tamper_trials.py --attack swap-chunks --trials 200
"""

from __future__ import annotations

import argparse
import asyncio
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
from cco.status_cli import ask
from cco.transport import TransportConfig
from cco.transport.certs import create_dev_pki
from cco.wire.errors import CcoError
from cco.wire.messages import GroupView
from cco.wire.registries import Role

HOST = "127.0.0.1"
CHUNK_ELEMENTS = 256
SCALED, UNSCALED = "scaled", "unscaled"
HEARTBEAT_MS = 3000
"""Members are lost after three intervals without a message: long enough that a
machine busy with other work does not lose them (the trials judge tampering, not
liveness)."""
PREFIXES = {UNSCALED: b"\xa1", SCALED: b"\xc3"}
"""The first byte of the attacked groups' ids, one per form (a group's calls keep one
form: see cco.interop.hostile); the rest is the trial's number."""
SOURCE = bytes.fromhex("b2" * 16)
"""The group whose results the other-group attack passes off as another's."""
EVIL, HONEST = "evil", "honest"
EVIL_CAPACITY = 64
"""Four times the honest aggregator's (the default 16): with the source group of the
other-group attack on it too, evil still has the most spare capacity, so every group
forms there."""
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
    continued: int = 0
    """Tampered trials after which the group went on, exact, without the evil aggregator."""
    stuck: list[dict[str, Any]] = field(default_factory=list)
    codes: Counter[str] = field(default_factory=Counter)
    details: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def held(self) -> bool:
        return (
            self.tampered_calls >= self.trials
            and not self.undetected
            and not self.honest_refused
            and self.continued == self.tampered_calls
        )

    def as_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["codes"], out["details"] = dict(self.codes), dict(self.details)  # asdict miscopies a Counter
        out["held"] = self.held
        out["undetected"] = self.undetected[:10]
        out["honest_refused"] = self.honest_refused[:10]
        out["stuck"] = self.stuck[:10]
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


def run_call(comms: list[BlockingCommunicator], arrays: list[np.ndarray]) -> list[np.ndarray | CcoError]:
    futures = [c.start_all_reduce(a) for c, a in zip(comms, arrays, strict=True)]
    out: list[np.ndarray | CcoError] = []
    for future in futures:
        try:
            out.append(future.result(60))
        except CcoError as error:
            out.append(error)
    return out


class TamperCluster:
    def __init__(self, workdir: Path, attack: str, seed: int, trials: int = 1) -> None:
        self.workdir = workdir
        self.pki = workdir / "pki"
        self.log = workdir / "tamper.jsonl"
        self.port = free_udp_port()
        self.processes: list[subprocess.Popen[str]] = []
        self.handles: list[IO[str]] = []
        workdir.mkdir(parents=True, exist_ok=True)
        # node ids of their own for every trial's ranks and status question: a node id
        # used again could meet the rendezvous before it saw the last connection end
        names = [name for trial in range(trials) for name in (*trial_names(trial), f"operator-{trial}")]
        create_dev_pki(
            self.pki,
            [
                ("rendezvous", Role.RENDEZVOUS),
                (EVIL, Role.AGGREGATOR),
                (HONEST, Role.AGGREGATOR),
                *((n, Role.ENDPOINT) for n in [*names, "source-0", "source-1"]),
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
        to_rendezvous = ["--rendezvous", f"{HOST}:{self.port}"]
        self._spawn(
            EVIL,
            [
                "-m",
                "cco.interop.hostile",
                "--attack",
                attack,
                "--target-group",
                ",".join(prefix.hex() for prefix in PREFIXES.values()),
                "--seed",
                str(seed),
                "--tamper-log",
                str(self.log),
                "--",
                "--node-id",
                EVIL,
                "--capacity",
                str(EVIL_CAPACITY),
                *common,
                "--listen",
                f"{HOST}:{free_udp_port()}",
                *to_rendezvous,
            ],
        )
        self._spawn(
            HONEST,
            [
                *("-m", "cco.cli", "--role", "aggregator", "--node-id", HONEST, *common),
                *("--listen", f"{HOST}:{free_udp_port()}", *to_rendezvous),
            ],
        )
        self._wait(EVIL, "registered")
        self._wait(HONEST, "registered")

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
        process = self.processes[[Path(h.name).stem for h in self.handles].index(name)]
        while needle not in (self.workdir / f"{name}.log").read_text(errors="replace"):
            if time.monotonic() > deadline or process.poll() is not None:
                tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"{name} did not log '{needle}': {tail}")
            time.sleep(0.05)

    def tampered(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def group_view(self, group_id: bytes, trial: int) -> GroupView | None:
        """The rendezvous's view of ``group_id`` (its StatusReply, asked as trial's operator)."""
        transport = TransportConfig.for_node(self.pki, f"operator-{trial}", max_datagram_size=16000)
        reply = asyncio.run(ask(HOST, self.port, "rendezvous", transport, 0, 20.0))
        return next((g for g in reply.groups if g.group_id == group_id), None)

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


Call = tuple[list[np.ndarray], list[np.ndarray | CcoError]]


def run_trials(attack: str, trials: int, workdir: Path, seed: int = 41) -> Trials:
    """``trials`` tampered calls of ``attack`` (and as many honest ones between), each
    in a group of its own, then the group's next call."""
    started = time.monotonic()
    outcome = Trials(attack, trials)
    nodes = TamperCluster(workdir, attack, seed, trials)
    handler = logging.FileHandler(workdir / "endpoints.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logger = logging.getLogger("cco")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    source: list[BlockingCommunicator] = []
    try:
        rendezvous = f"{HOST}:{nodes.port}"
        forms = _forms(attack)
        if attack == "other-group":
            source = join_group(rendezvous, nodes.pki, SOURCE, ["source-0", "source-1"])
        rng = np.random.default_rng(seed)
        for trial in range(trials):
            form = forms[trial % len(forms)]
            group_id = PREFIXES[form] + trial.to_bytes(15, "big")
            dtype, elements = _call_plan(attack, form, rng)
            comms = join_group(rendezvous, nodes.pki, group_id, trial_names(trial))
            try:
                calls: list[Call] = []
                for _ in range(3):
                    arrays = [_inputs(dtype, elements, rng) for _ in range(2)]
                    if source:
                        run_call(source, [_inputs(dtype, elements, rng) for _ in range(2)])
                    calls.append((arrays, run_call(comms, arrays)))
                view = nodes.group_view(group_id, trial)
            finally:
                close_all(comms)
            log = [line for line in nodes.tampered() if line["group"] == group_id.hex()]
            _judge(outcome, calls[:2], log)
            if log:
                _judge_continuation(outcome, trial, calls[2], view)
            if trial % 50 == 49:
                print(f"  {attack}: {trial + 1} trials", file=sys.stderr, flush=True)
    finally:
        close_all(source)
        nodes.close()
        logger.removeHandler(handler)
        logger.setLevel(level)  # as it was: the hostile e2e tests run the trials in the suite's process
        handler.close()
    outcome.seconds = time.monotonic() - started
    return outcome


def trial_names(trial: int) -> list[str]:
    """The node ids of trial ``trial``'s two ranks."""
    return [f"trial-{trial}-{rank}" for rank in range(2)]


def join_group(rendezvous: str, pki: Path, group_id: bytes, names: list[str]) -> list[BlockingCommunicator]:
    """The ranks of a group of two, joined."""
    return join_all(GroupSpec(group_id=group_id, world_size=2, rendezvous=rendezvous), names, pki, 60)


def _exact(arrays: list[np.ndarray], data: list[np.ndarray]) -> bool:
    """Whether every rank got the same result, exact for integers (close for floats,
    whose block-scaled sum rounds)."""
    identical = all(np.array_equal(d, data[0]) for d in data)
    want = sum(a.astype(np.float64 if a.dtype.kind == "f" else np.int64) for a in arrays)
    close = all(
        np.array_equal(d.astype(np.int64), want)
        if d.dtype.kind != "f"
        else np.allclose(d, want, rtol=1e-2, atol=1e-3)
        for d in data
    )
    return identical and close


def _judge_continuation(outcome: Trials, trial: int, after: Call, view: GroupView | None) -> None:
    """After a tampered call: the group's next call is exact on every rank, and the
    rendezvous has it in a later epoch without the evil aggregator."""
    arrays, got = after
    errors = [str(g)[:200] for g in got if isinstance(g, CcoError)]
    tree = [node.node_id for node in view.tree] if view is not None else []
    if errors or not _exact(arrays, [g for g in got if not isinstance(g, CcoError)]):
        outcome.stuck.append({"trial": trial, "next call": errors or ["returned other data"], "tree": tree})
    elif view is None or view.epoch < 2 or not tree or EVIL in tree:
        epoch = view.epoch if view is not None else None
        outcome.stuck.append({"trial": trial, "epoch": epoch, "tree": tree})
    else:
        outcome.continued += 1


def _judge(outcome: Trials, results: list[Call], log: list[dict[str, Any]]) -> None:
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
        if not _exact(arrays, data):
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
