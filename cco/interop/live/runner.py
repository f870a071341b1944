"""``cco-interop live`` itself: every case in every combination of implementations,
and the results matrix.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cco.interop.live.cases import CASE_NAMES, CASES, Case
from cco.interop.live.nodes import CaseFailed, Run, Unsupported

PASSED, FAILED, UNSUPPORTED = "passed", "failed", "unsupported"
OUR_ADAPTER = f"{shlex.quote(sys.executable)} -m cco.interop.live_adapter"


@dataclass
class Outcome:
    case: str
    impls: dict[str, str]
    outcome: str
    reason: str = ""
    seconds: float = 0.0

    def label(self) -> str:
        return ",".join(f"{role[:2]}={impl}" for role, impl in self.impls.items())


def run_case(
    case: Case, impls: dict[str, str], commands: dict[str, str], directory: Path, tool: str = OUR_ADAPTER
) -> Outcome:
    run = Run(case.name, directory, impls, commands, tool)
    start = time.monotonic()
    try:
        case.run(run)
        result = Outcome(case.name, impls, PASSED)
    except Unsupported as why:
        result = Outcome(case.name, impls, UNSUPPORTED, str(why))
    except CaseFailed as why:
        result = Outcome(case.name, impls, FAILED, str(why))
    except Exception as why:  # a broken node can break the runner's tools too: still a failure
        result = Outcome(case.name, impls, FAILED, f"{type(why).__name__}: {why}")
    finally:
        run.stop()
    result.seconds = time.monotonic() - start
    return result


def combinations(case: Case, names: list[str]) -> Iterator[dict[str, str]]:
    """Every assignment of implementations to the case's roles; with several
    implementations, only those that put at least two of them together (or one alone)."""
    for choice in itertools.product(names, repeat=len(case.roles)):
        yield dict(zip(case.roles, choice, strict=True))


def run_matrix(
    cases: list[Case],
    commands: dict[str, str],
    directory: Path,
    tool: str = OUR_ADAPTER,
    report: Callable[[Outcome], None] = lambda o: None,
) -> list[Outcome]:
    outcomes = []
    for case in cases:
        for index, impls in enumerate(combinations(case, list(commands))):
            outcome = run_case(case, impls, commands, directory / f"{case.name}-{index}", tool)
            report(outcome)
            outcomes.append(outcome)
    return outcomes


def matrix_text(outcomes: list[Outcome]) -> str:
    rows = [("case", "roles", "outcome", "seconds", "reason")]
    rows += [(o.case, o.label(), o.outcome, f"{o.seconds:.1f}", o.reason[:100]) for o in outcomes]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + ("  " + r[4] if r[4] else "")
        for r in rows
    )


def matrix_json(outcomes: list[Outcome]) -> dict[str, Any]:
    return {
        "cases": [
            {
                "case": o.case,
                "roles": o.impls,
                "outcome": o.outcome,
                "reason": o.reason,
                "seconds": round(o.seconds, 2),
            }
            for o in outcomes
        ],
        "summary": {k: sum(1 for o in outcomes if o.outcome == k) for k in (PASSED, FAILED, UNSUPPORTED)},
    }


def add_parser(commands: Any) -> None:
    live = commands.add_parser(
        "live",
        help="run the live test cases between implementations",
        description="Start the nodes of each case from the configured implementations (every role "
        "combination), judge from their artifacts, print a results matrix; exit 1 if any case failed.",
    )
    live.add_argument(
        "--impl",
        action="append",
        default=[],
        metavar="NAME=CMD",
        help=f"an implementation's live adapter command (default: cco={OUR_ADAPTER})",
    )
    live.add_argument(
        "--case",
        action="append",
        default=[],
        choices=CASE_NAMES,
        metavar="CASE",
        help=f"run only these cases (repeatable): {', '.join(CASE_NAMES)}",
    )
    live.add_argument("--ci", action="store_true", help="only the cases CI runs")
    live.add_argument(
        "--workdir", type=Path, help="keep every run's artifacts here (default: a temporary dir)"
    )
    live.add_argument("--json", type=Path, metavar="FILE", help="write the results matrix as JSON")
    live.set_defaults(run=lambda args: main(args))


def main(args: argparse.Namespace) -> int:
    commands: dict[str, str] = {}
    for item in args.impl or [f"cco={OUR_ADAPTER}"]:
        name, sep, command = item.partition("=")
        if not sep or not name or not command:
            print(f"cco-interop live: --impl wants NAME=CMD, got {item!r}", file=sys.stderr)
            return 2
        commands[name] = command
    cases = [c for c in CASES if (not args.case or c.name in args.case) and (not args.ci or c.ci)]

    def show(outcome: Outcome) -> None:
        print(
            f"{outcome.outcome.upper():11} {outcome.case} [{outcome.label()}] {outcome.seconds:.1f} s"
            + (f": {outcome.reason}" if outcome.reason else ""),
            flush=True,
        )

    with contextlib.ExitStack() as stack:
        import tempfile

        directory = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cco-live-")))
        outcomes = run_matrix(cases, commands, directory, report=show)
    print()
    print(matrix_text(outcomes))
    if args.json is not None:
        args.json.write_text(json.dumps(matrix_json(outcomes), indent=2) + "\n", encoding="utf-8")
    return 1 if any(o.outcome == FAILED for o in outcomes) else 0
