#!/usr/bin/env python3
"""Mutation testing of the checks the draft requires: does breaking one make a test fail?

For each target file, mutants are generated from the file's text at run time (by
its syntax tree, so line numbers never go stale), each a one-line change to a check:

* a check removed (``if cond: raise ...`` becomes ``if False: ...``) or negated;
* a comparison changed (``<`` and ``<=``, ``>`` and ``>=``, ``==`` and ``!=``,
  ``in`` and ``not in``, ``is`` and ``is not`` swapped);
* ``and`` and ``or`` swapped, a ``not`` dropped;
* an arithmetic or bitwise operator flipped (``+``/``-``, ``*``/``//``, ``%``/``//``,
  ``<<``/``>>``, ``&``/``|``, ``^``/``|``);
* an integer constant off by one (``n`` becomes ``n + 1`` and ``n - 1``).

Where they apply depends on the target: in ``mac.py`` and ``cbor.py`` every
expression of every function is fair game (the whole file is a check); in
``payload.py`` and the role machines only the conditions of *refusal paths*: ``if``
statements whose body raises, refuses, rejects or names an error code, and the
conditions of ``while`` loops that bound memory.  In a role's transition tables
(``*_states.py``) each move's next state is changed to another state of its machine.

Every mutant runs the target's chosen fast tests (``pytest -x``, stopping at the
first failure) with a per-mutant timeout; a mutant is *killed* when they fail or
time out.  The work happens in a private copy of the working tree under /tmp (the
shared tree is never modified), with bytecode caching off so a mutant is never
hidden by a stale .pyc, and the target file is restored after every mutant.  The
report gives the kill rate per file and every survivor, to be judged by hand as
equivalent (no behaviour changes) or as a missing test.

Usage: ``python scripts/mutate.py [--target cco/wire/cbor.py ...] [--role aggregator] [--list]``;
a role's targets are its machine and the parts it is composed of.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Target:
    path: str
    tests: tuple[str, ...]
    everything: bool  # mutate every expression, not only refusal conditions


AGGREGATOR_TESTS = (
    "tests/nodes/test_aggregator_registration.py",
    "tests/nodes/test_aggregator_tree_assignments.py",
    "tests/nodes/test_aggregator_combining.py",
    "tests/nodes/test_aggregator_late_and_lost_chunks.py",
    "tests/nodes/test_aggregator_presence_passes.py",
    "tests/nodes/test_aggregator_tables.py",
    "tests/nodes/test_sim_clusters.py",
)
"""The aggregator's files (the machine and its parts: group, slots, pending queues) and
the tests that drive them."""

RENDEZVOUS_TESTS = (
    "tests/nodes/test_rendezvous_membership.py",
    "tests/nodes/test_rendezvous_trees.py",
    "tests/nodes/test_rendezvous_tables.py",
    "tests/nodes/test_rendezvous_restore.py",
    "tests/nodes/test_rendezvous_tampering.py",
    "tests/nodes/test_sim_clusters.py",
)
ENDPOINT_TESTS = (
    "tests/nodes/test_endpoint_session.py",
    "tests/nodes/test_endpoint_collectives.py",
    "tests/nodes/test_endpoint_calls.py",
    "tests/nodes/test_endpoint_results_chunk_by_chunk.py",
    "tests/nodes/test_endpoint_presence_passes.py",
    "tests/nodes/test_endpoint_restarts.py",
    "tests/nodes/test_endpoint_tables.py",
    "tests/nodes/test_endpoint_tamper_reports.py",
    "tests/nodes/test_sim_clusters.py",
)

TARGETS = (
    Target(
        "cco/wire/cbor.py",
        ("tests/wire/test_cbor_rules.py", "tests/wire/test_codec_roundtrip.py"),
        everything=True,
    ),
    Target(
        "cco/wire/mac.py",
        (
            "tests/wire/test_mac_inputs.py",
            "tests/wire/payload/test_mac_construction.py",
            "tests/interop/test_payload_vectors.py",
            "tests/wire/payload/test_aggregator_attacks_detected.py",
            "tests/interop/test_vectors.py",
        ),
        everything=True,
    ),
    Target(
        "cco/wire/payload.py",
        (
            "tests/wire/payload/test_aggregator_attacks_detected.py",
            "tests/wire/payload/test_aggregation_any_tree.py",
            "tests/wire/payload/test_chunking.py",
            "tests/wire/payload/test_block_scaled_forms.py",
            "tests/wire/payload/test_mac_construction.py",
            "tests/interop/test_payload_vectors.py",
            "tests/wire/payload/test_payload_refusals.py",
            "tests/interop/test_vectors.py",
        ),
        everything=False,
    ),
    *(
        Target(path, AGGREGATOR_TESTS, False)
        for path in (
            "cco/nodes/aggregator.py",
            "cco/nodes/aggregator_group.py",
            "cco/nodes/aggregator_slots.py",
            "cco/nodes/aggregator_pending.py",
            "cco/nodes/aggregator_states.py",
        )
    ),
    *(
        Target(path, RENDEZVOUS_TESTS, False)
        for path in (
            "cco/nodes/rendezvous.py",
            "cco/nodes/rendezvous_trees.py",
            "cco/nodes/rendezvous_config.py",
            "cco/nodes/rendezvous_durable.py",
            "cco/nodes/rendezvous_states.py",
            "cco/nodes/rendezvous_joins.py",
            "cco/nodes/rendezvous_reports.py",
        )
    ),
    *(
        Target(path, ENDPOINT_TESTS, False)
        for path in (
            "cco/nodes/endpoint.py",
            "cco/nodes/engine.py",
            "cco/nodes/verification.py",
            "cco/nodes/tree_reports.py",
            "cco/nodes/planning.py",
            "cco/nodes/membership.py",
            "cco/nodes/operation.py",
            "cco/nodes/data_operation.py",
            "cco/nodes/endpoint_states.py",
        )
    ),
)


ROLES = {
    role: tuple(t.path for t in TARGETS if t.tests == tests)
    for role, tests in (
        ("aggregator", AGGREGATOR_TESTS),
        ("rendezvous", RENDEZVOUS_TESTS),
        ("endpoint", ENDPOINT_TESTS),
    )
}
"""Each role machine's files, as targets: a role's kill count is theirs together."""


@dataclass(frozen=True)
class Mutant:
    path: str
    line: int
    column: int
    kind: str
    before: str
    after: str
    source: str  # the whole mutated file

    def describe(self) -> str:
        return f"{self.path}:{self.line}:{self.column}: {self.kind}: `{self.before}` -> `{self.after}`"


# --- generating mutants ------------------------------------------------------------

_COMPARE_SWAPS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_BINOP_SWAPS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
    ast.BitXor: ast.BitOr,
}
_REFUSING_NAMES = {"refuse", "JoinReject", "Error", "Abort", "CcoError", "DecodeError", "EncodeError"}
_INTERNAL_ERRORS = {"RuntimeError", "AssertionError", "NotImplementedError"}


def _refuses(statements: list[ast.stmt]) -> bool:
    """Does this ``if`` body refuse: raise, build an error reply, or name an error code?
    (An internal-invariant guard raising RuntimeError refuses no input: not a check.)"""
    for statement in statements:
        for node in ast.walk(statement):
            if isinstance(node, ast.Raise):
                raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if not (isinstance(raised, ast.Name) and raised.id in _INTERNAL_ERRORS):
                    return True
            if isinstance(node, ast.Name) and node.id in _REFUSING_NAMES:
                return True
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "ErrorCode"
                and node.attr != "NO_ERROR"
            ):
                return True
    return False


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _expression_nodes(root: ast.AST, skip: set[int]) -> Iterator[ast.AST]:
    """Nodes under ``root`` worth mutating, not inside f-strings, docstrings or annotations."""
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in skip or isinstance(node, ast.JoinedStr):
            continue
        if isinstance(node, ast.Compare | ast.BoolOp | ast.BinOp | ast.UnaryOp | ast.Constant):
            yield node
        for name, value in ast.iter_fields(node):
            if name in ("annotation", "returns", "decorator_list"):
                continue
            children = value if isinstance(value, list) else [value]
            stack.extend(child for child in reversed(children) if isinstance(child, ast.AST))


def _variants(node: ast.AST) -> Iterator[tuple[str, ast.AST | str]]:
    """(kind, replacement node or text) for every one-line mutation of ``node`` itself."""
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            swap = _COMPARE_SWAPS.get(type(op))
            if swap is not None:
                mutated = copy.deepcopy(node)
                mutated.ops[i] = swap()
                yield "comparison changed", mutated
    elif isinstance(node, ast.BoolOp):
        swapped = copy.deepcopy(node)
        swapped.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield "and/or swapped", swapped
    elif isinstance(node, ast.BinOp):
        swap_op = _BINOP_SWAPS.get(type(node.op))
        if swap_op is not None:
            flipped = copy.deepcopy(node)
            flipped.op = swap_op()
            yield "operator flipped", flipped
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "not dropped", node.operand
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        yield "constant off by one", str(node.value + 1)
        yield "constant off by one", f"({node.value - 1})"


def _sites(tree: ast.Module, everything: bool) -> Iterator[tuple[ast.expr, str, ast.AST | str]]:
    skip = _docstrings(tree)
    conditions: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (everything or _refuses(node.body)):
            if _refuses(node.body):
                yield node.test, "check removed", "False"
                yield node.test, "check negated", ast.UnaryOp(op=ast.Not(), operand=node.test)
            conditions.append(node.test)
        elif isinstance(node, ast.While) and (everything or _has_compare(node.test)):
            yield node.test, "loop condition removed", "False"
            conditions.append(node.test)
    roots: list[ast.AST] = []
    if everything:
        roots = [
            n
            for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Assign)
        ]
    else:
        roots = list(conditions)
    seen: set[int] = set()
    for root in roots:
        for node in _expression_nodes(root, skip):
            if id(node) in seen or not isinstance(node, ast.expr):
                continue
            seen.add(id(node))
            for kind, replacement in _variants(node):
                yield node, kind, replacement


def _has_compare(test: ast.expr) -> bool:
    return any(isinstance(n, ast.Compare) for n in ast.walk(test))


def _splice(source: bytes, node: ast.expr, text: str) -> bytes:
    """Replace ``node``'s span (ast offsets are UTF-8 byte columns) with ``text``."""
    assert node.end_lineno is not None and node.end_col_offset is not None
    lines = source.splitlines(keepends=True)
    start = sum(len(line) for line in lines[: node.lineno - 1]) + node.col_offset
    end = sum(len(line) for line in lines[: node.end_lineno - 1]) + node.end_col_offset
    return source[:start] + text.encode() + source[end:]


def _move_targets(tree: ast.Module) -> Iterator[tuple[ast.expr, str, ast.AST | str]]:
    """Every ``Move(Class.STATE, action)`` of a transition table with its state changed
    to the next one the class declares (``Class`` possibly an alias such as ``_S``)."""
    members: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names = [t.id for stmt in node.body if isinstance(stmt, ast.Assign) for t in stmt.targets]
            members[node.name] = [n for n in names if isinstance(n, str) and n.isupper()]
    aliases: dict[str, str] = {name: name for name in members}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple | ast.Name):
            targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else node.targets
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for target, value in zip(targets, values, strict=False):
                if isinstance(target, ast.Name) and isinstance(value, ast.Name) and value.id in members:
                    aliases[target.id] = value.id
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Move"):
            continue
        state = node.args[0] if node.args else None
        if not (isinstance(state, ast.Attribute) and isinstance(state.value, ast.Name)):
            continue
        declared = members.get(aliases.get(state.value.id, ""), [])
        if state.attr in declared and len(declared) > 1:
            other = declared[(declared.index(state.attr) + 1) % len(declared)]
            yield state, "move target changed", f"{state.value.id}.{other}"


def mutants(path: str, text: str, everything: bool) -> list[Mutant]:
    source = text.encode()
    tree = ast.parse(source)
    found: list[Mutant] = []
    seen = {text}
    sites = _move_targets(tree) if path.endswith("_states.py") else _sites(tree, everything)
    for node, kind, replacement in sites:
        after = replacement if isinstance(replacement, str) else f"({ast.unparse(replacement)})"
        mutated = _splice(source, node, after).decode()
        if mutated in seen:
            continue
        try:
            compile(mutated, path, "exec")
        except SyntaxError:
            continue
        seen.add(mutated)
        before = ast.get_source_segment(text, node) or ""
        line, column = node.lineno, node.col_offset + 1
        found.append(Mutant(path, line, column, kind, " ".join(before.split()), after, mutated))
    return sorted(found, key=lambda m: (m.line, m.column, m.kind, m.after))


# --- running them ------------------------------------------------------------------


def copy_tree(destination: Path) -> None:
    """The working tree as it is now (tracked and untracked files, not ignored ones)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def run_tests(work: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, float]:
    """'passed', 'failed' or 'timeout', and the seconds it took."""
    env = {**os.environ, "PYTHONPATH": str(work), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=work,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return "timeout", time.monotonic() - started
    return ("passed" if code == 0 else "failed"), time.monotonic() - started


def check_isolation(work: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(work), "PYTHONDONTWRITEBYTECODE": "1"}
    where = subprocess.run(
        [sys.executable, "-c", "import cco; print(cco.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(where).resolve().is_relative_to(work.resolve()):
        raise SystemExit(f"the copy imports cco from {where}, not from {work}: refusing to run")


@dataclass
class FileReport:
    path: str
    mutants: int
    killed: int
    timeouts: int
    survivors: list[str]
    baseline_seconds: float
    error: str = ""

    @property
    def rate(self) -> float:
        return self.killed / self.mutants if self.mutants else 1.0


def mutate_target(work: Path, target: Target, timeout: float | None) -> FileReport:
    file = work / target.path
    original = file.read_text(encoding="utf-8")
    found = mutants(target.path, original, target.everything)
    baseline, seconds = run_tests(work, target.tests, timeout or 1800)
    report = FileReport(target.path, len(found), 0, 0, [], round(seconds, 1))
    if baseline != "passed":
        report.error = f"the unmutated tests did not pass ({baseline}): nothing measured"
        print(f"{target.path}: {report.error}", flush=True)
        return report
    limit = timeout or max(60.0, 4 * seconds)
    print(
        f"{target.path}: {len(found)} mutants, tests {seconds:.0f} s unmutated, timeout {limit:.0f} s",
        flush=True,
    )
    for number, mutant in enumerate(found, 1):
        try:
            file.write_text(mutant.source, encoding="utf-8")
            outcome, took = run_tests(work, target.tests, limit)
        finally:
            file.write_text(original, encoding="utf-8")
        if outcome == "passed":
            report.survivors.append(mutant.describe())
        else:
            report.killed += 1
            report.timeouts += outcome == "timeout"
        print(f"  [{number}/{len(found)}] {outcome:7} {took:5.1f} s  {mutant.describe()}", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", action="append", help="only this file (repeatable); default: all")
    parser.add_argument(
        "--role", action="append", choices=sorted(ROLES), help="the files of one role machine (repeatable)"
    )
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    parser.add_argument("--timeout", type=float, help="seconds per mutant (default: 4x the unmutated run)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--keep", action="store_true", help="keep the working copy in /tmp")
    args = parser.parse_args(argv)
    chosen = set(args.target or ()) | {path for role in args.role or () for path in ROLES[role]}
    targets = [t for t in TARGETS if not chosen or t.path in chosen]
    unknown = chosen - {t.path for t in targets}
    if unknown:
        parser.error(f"not a target: {', '.join(sorted(unknown))} (targets: {[t.path for t in TARGETS]})")
    if args.list:
        for target in targets:
            text = (ROOT / target.path).read_text(encoding="utf-8")
            for mutant in mutants(target.path, text, target.everything):
                print(mutant.describe())
        return 0
    work = Path(tempfile.mkdtemp(prefix="cco-mutate-"))
    reports = []
    try:
        copy_tree(work)
        check_isolation(work)
        print(f"working copy: {work}", flush=True)
        for target in targets:
            reports.append(mutate_target(work, target, args.timeout))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("\nkill rate per file")
    for report in reports:
        status = report.error or (
            f"{report.killed}/{report.mutants} killed ({100 * report.rate:.1f}%), "
            f"{report.timeouts} by timeout, {len(report.survivors)} survived"
        )
        print(f"  {report.path:28} {status}")
    total = sum(r.mutants for r in reports if not r.error)
    killed = sum(r.killed for r in reports if not r.error)
    if total:
        print(f"  {'total':28} {killed}/{total} killed ({100 * killed / total:.1f}%)")
    for report in reports:
        if report.survivors:
            print(f"\nsurvivors in {report.path}:")
            for survivor in report.survivors:
                print(f"  {survivor}")
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "rate": r.rate} for r in reports], indent=2) + "\n")
    return 0 if all(not r.error for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
