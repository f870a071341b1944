"""Nodes against one hostile peer (issue 41, "What it must show", first bullet).

For each attack, on a fresh cluster of real processes on loopback (a rendezvous, two
aggregators with 16 group slots each): a victim group of two ranks all-reduces 4096
int32 elements back to back; after an unloaded window one hostile peer attacks for
``--duration`` seconds and stops by itself; a newcomer group tries to form two
seconds into the attack; the nodes then settle for ``--settle`` seconds.  The
attacks (benchmarks/support/hostile_peer.py):

* join-flood: 5,000 JoinRequests for new groups of two on one connection;
* capacity: one-member groups until every aggregator slot is taken, held;
* spoofed-initials: two waves of 10,000 Initial-shaped datagrams with random
  connection ids to every server;
* slow-reader: a member of its own group that sends contributions and never reads
  the Results its aggregator owes it;
* parked-chunks: 512 KiB Contributions for groups nobody assigned, from 8 connections;
* unfinished-frames: 16 MiB frames begun and never finished on every stream;
* garbage-frames: 19 kinds of hostile input to every server (which got neither an
  Error nor a close), then random garbage frames from new connections.

Then (``--tamper-trials``, 200 by default) a malicious aggregator (cco/interop/hostile.py)
tampers with the results of groups of two, each attack in that many randomised trials
live (benchmarks/support/tamper_trials.py), each trial a group of its own formed on
the malicious aggregator with an honest one beside it: change an element, drop a
contributor with and without its bit, count one twice, replay an old result, pass
off another group's result, swap chunks, invent a contributor, send a result for an
operation never started, inflate or split a block scale.  Target: every tampered
call fails on every rank (no unverified data returned), every honest call in between
succeeds, and after every tampering the group continues in a new epoch without the
malicious aggregator (its members' Reports), its next call exact.

Printed per attack, beside issue 41's targets: the victim's failed and inexact rounds,
its median round time under attack against unloaded (wall clock: noisy on a busy
machine, see the p90 too), the seconds the newcomer took to form, and each node's
RSS (baseline, peak, settled, seconds to come back within 10%).  All of it goes to
``--out`` as JSON.

    python benchmarks/bench_hostile.py                       # everything: the attacks, then the
                                                             # tampering trials (a group formed per
                                                             # trial, about 0.7 s each: 25 minutes)
    python benchmarks/bench_hostile.py --attacks join-flood,slow-reader --settle 30 --tamper-trials 0
    python benchmarks/bench_hostile.py --attacks "" --tampering swap-chunks,split-scale
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))  # the shared support modules
from hostile_cluster import (
    NEW_GROUP_SECONDS,
    RSS_BOUND_MIB,
    RSS_RETURN_FRACTION,
    RSS_RETURN_SECONDS,
    VICTIM_FACTOR,
    Outcome,
    Plan,
    measure,
)
from hostile_peer import ATTACKS
from tamper_trials import Trials, run_trials

from cco.interop.hostile import ATTACKS as TAMPERINGS

RESULTS = Path(__file__).resolve().parent / "results" / "bench_hostile.json"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def report(outcome: Outcome) -> str:
    lines = [f"== {outcome.attack}"]
    factor = outcome.victim_factor
    lines.append(
        f"  victim: {outcome.victim_rounds_attacked} rounds under attack, {outcome.victim_failed} failed, "
        f"{outcome.victim_inexact} inexact (target 0 and 0)"
        + (f"; first error: {outcome.victim_first_error}" if outcome.victim_first_error else "")
    )
    lines.append(
        f"  victim round: {_ms(outcome.victim_attacked_ms)} median under attack "
        f"(p90 {_ms(outcome.victim_attacked_p90_ms)}) vs {_ms(outcome.victim_unloaded_ms)} unloaded: "
        + ("-" if factor is None else f"{factor:.2f}x")
        + f" (target <= {VICTIM_FACTOR:g}x)"
    )
    newcomer = outcome.newcomer
    formed = newcomer.get("formed_seconds")
    lines.append(
        "  new group: "
        + (f"formed in {formed:.2f} s" if formed is not None else f"did not form ({newcomer.get('error')})")
        + f" (target <= {NEW_GROUP_SECONDS:g} s)"
    )
    for name, memory in outcome.memory.items():
        back = memory.returned_after_seconds
        lines.append(
            f"  RSS {name:10} baseline {memory.baseline_mib:6.1f}  peak {memory.peak_mib:6.1f}  "
            f"settled {memory.settled_mib:6.1f} MiB  "
            + ("never back" if back is None else f"back within {RSS_RETURN_FRACTION:.0%} after {back:.1f} s")
            + f" (targets: peak <= {RSS_BOUND_MIB:g} MiB, back within {RSS_RETURN_SECONDS:g} s)"
        )
    attacker = outcome.attacker
    summary = {k: attacker.get(k) for k in ("sent", "answers", "closes", "error") if attacker.get(k)}
    lines.append(f"  attacker: {json.dumps(summary)[:600]}")
    if attacker.get("unanswered") is not None:
        lines.append(f"  hostile inputs without Error or close: {attacker['unanswered']}")
    verdicts = outcome.verdicts()
    lines.append(
        "  targets: " + ", ".join(f"{name}: {'met' if met else 'MISSED'}" for name, met in verdicts.items())
    )
    return "\n".join(lines)


def tamper_report(trials: Trials) -> str:
    codes = ", ".join(f"{code} {count}" for code, count in trials.codes.most_common())
    verdict = "held" if trials.held else "DID NOT HOLD"
    line = (
        f"  {trials.attack:20} {trials.detected}/{trials.tampered_calls} tampered calls failed on all ranks, "
        f"{len(trials.undetected)} returned data, {len(trials.honest_refused)} of "
        f"{trials.calls - trials.tampered_calls} honest calls refused ({codes}); "
        f"{trials.continued}/{trials.tampered_calls} groups continued without the aggregator: {verdict}"
    )
    if trials.undetected or trials.honest_refused or trials.stuck:
        line += f"\n    first: {(trials.undetected or trials.honest_refused or trials.stuck)[0]}"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--attacks", default=",".join(ATTACKS), help="comma-separated, from: " + ", ".join(ATTACKS)
    )
    parser.add_argument("--duration", type=float, default=20.0, help="seconds each attack lasts")
    parser.add_argument("--settle", type=float, default=RSS_RETURN_SECONDS, help="seconds watched after it")
    parser.add_argument("--unloaded", type=float, default=5.0, help="seconds of victim rounds before it")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every attack's counts")
    parser.add_argument(
        "--heartbeat-ms",
        type=int,
        default=1000,
        help="the rendezvous's heartbeat interval (cco-node's default)",
    )
    parser.add_argument("--tampering", default=",".join(TAMPERINGS), help="malicious aggregator attacks")
    parser.add_argument("--tamper-trials", type=int, default=200, help="tampered calls per attack (0: none)")
    parser.add_argument("--workdir", type=Path, help="logs and PKI here (default: a temporary directory)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    attacks = [a for a in args.attacks.split(",") if a]
    unknown = sorted(set(attacks) - set(ATTACKS))
    if unknown:
        parser.error(f"unknown attacks {unknown}")
    tamperings = [a for a in args.tampering.split(",") if a] if args.tamper_trials else []
    if unknown := sorted(set(tamperings) - set(TAMPERINGS)):
        parser.error(f"unknown tamperings {unknown}")
    outcomes = []
    tampered: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="bench_hostile-") as scratch:
        base = args.workdir or Path(scratch)
        for attack in attacks:
            plan = Plan(
                attack=attack,
                duration=args.duration,
                scale=args.scale,
                unloaded=args.unloaded,
                settle=args.settle,
                heartbeat_ms=args.heartbeat_ms,
            )
            outcome = measure(plan, base / attack, sys.stderr)
            print(report(outcome), flush=True)
            outcomes.append(outcome.as_dict())
        if tamperings:
            print(f"== malicious aggregator, {args.tamper_trials} tampered calls per attack", flush=True)
        for attack in tamperings:
            trials = run_trials(attack, args.tamper_trials, base / "tampering" / attack)
            print(tamper_report(trials), flush=True)
            tampered.append(trials.as_dict())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"attacks": outcomes, "tampering": tampered}, indent=2, default=str) + "\n"
    )
    missed = [o["attack"] for o in outcomes if not all(o["verdicts"].values())]
    missed += [f"tampering {t['attack']}" for t in tampered if not t["held"]]
    print(f"targets missed in: {', '.join(missed)}" if missed else "every target met")


if __name__ == "__main__":
    main()
