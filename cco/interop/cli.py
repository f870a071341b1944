"""``cco-interop``: the vectors, and the runner that tests implementations with them.

``generate`` rewrites every vector file; ``check`` reads the committed files,
verifies each vector against this implementation (the equations of
``interop/README.md``) and confirms that a fresh generation reproduces every
file byte for byte.  ``vectors --impl CMD`` feeds every vector to another
implementation's adapter (``adapter`` is ours); ``live`` runs the live test
cases between implementations.  Each exits 1 on any failure, so CI can run it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from cco.interop.generate import VECTOR_FILES, compare, default_output_dir, default_vector_dir, write


def _generate(args: argparse.Namespace) -> int:
    out: Path = args.out or default_output_dir()
    for path in write(out):
        count = len(json.loads(path.read_text(encoding="utf-8")))
        print(f"wrote {path} ({count} vectors)")
    return 0


def _check(args: argparse.Namespace) -> int:
    directory: Path = args.dir or default_vector_dir()
    problems: list[str] = []
    for module in VECTOR_FILES:
        file_name = module.FILE
        path = directory / file_name
        if not path.is_file():
            continue  # reported by compare() below
        try:
            vectors = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            problems.append(f"{file_name}: not JSON: {exc}")
            continue
        if not isinstance(vectors, list) or not all(isinstance(v, dict) for v in vectors):
            problems.append(f"{file_name}: not an array of objects")
            continue
        found = module.check(vectors)
        failed = sum(1 for v in vectors if any(p.startswith(f"{v.get('name')}:") for p in found))
        print(f"{file_name}: {len(vectors)} vectors, {len(vectors) - failed} hold, {failed} fail")
        problems += [f"{file_name}: {p}" for p in found]
    reproduced = compare(directory)
    summary = "identical" if not reproduced else f"{len(reproduced)} file(s) missing or different"
    print(f"regeneration: {summary}")
    problems += reproduced
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    print("OK" if not problems else f"{len(problems)} problem(s)")
    return 0 if not problems else 1


def _vectors(args: argparse.Namespace) -> int:
    from cco.interop import vectormode

    directory: Path = args.dir or default_vector_dir()
    reports = vectormode.run(args.impl, directory, timeout=args.timeout)
    for report in reports:
        print(report.line())
        for name, outcome in report.outcomes.items():
            if outcome != vectormode.PASSED and (args.verbose or outcome == vectormode.FAILED):
                print(f"  {outcome.upper()} {name}: {report.reasons.get(name, '')}")
    if args.json is not None:
        args.json.write_text(json.dumps(vectormode.as_json(reports), indent=2) + "\n", encoding="utf-8")
    failed = sum(r.count(vectormode.FAILED) for r in reports)
    print("OK" if not failed else f"{failed} vector(s) failed")
    return 0 if not failed else 1


def _adapter(args: argparse.Namespace) -> int:
    from cco.interop import adapter

    return adapter.main()


def _live(args: argparse.Namespace) -> int:
    from cco.interop.live import runner

    return runner.main(args)


_VECTOR_DIR_HELP = (
    "vector directory (default: interop/vectors of the checkout, else the vectors installed with cco)"
)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="cco-interop",
        description="Generate and check the CCO interoperability test vectors (see interop/README.md).",
    )
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gen = commands.add_parser(
        "generate", help="rewrite every vector file", description="Rewrite every vector file (deterministic)."
    )
    gen.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="output directory (default: interop/vectors of the checkout, else of the current directory)",
    )
    gen.set_defaults(run=_generate)
    chk = commands.add_parser(
        "check",
        help="verify committed vectors against this implementation",
        description="Verify every vector against this implementation and check that a fresh "
        "generation reproduces the files byte for byte; exit 1 on any problem.",
    )
    chk.add_argument(
        "--dir",
        type=Path,
        metavar="DIR",
        help=_VECTOR_DIR_HELP,
    )
    chk.set_defaults(run=_check)
    vec = commands.add_parser(
        "vectors",
        help="feed every vector to an implementation's adapter",
        description="Start the adapter CMD (JSON lines on stdin/stdout, see interop/README.md), feed it "
        "every vector and print passed / failed / unsupported per vector file; exit 1 if any failed.",
    )
    vec.add_argument(
        "--impl", required=True, metavar="CMD", help="the adapter command line, e.g. 'cco-interop adapter'"
    )
    vec.add_argument(
        "--dir",
        type=Path,
        metavar="DIR",
        help=_VECTOR_DIR_HELP,
    )
    vec.add_argument(
        "--json", type=Path, metavar="FILE", help="also write the outcome of every vector as JSON"
    )
    vec.add_argument(
        "--timeout", type=float, default=30.0, metavar="S", help="seconds to wait for one answer"
    )
    vec.add_argument("-v", "--verbose", action="store_true", help="list unsupported vectors too")
    vec.set_defaults(run=_vectors)
    ada = commands.add_parser(
        "adapter",
        help="this implementation's vector-mode adapter (JSON lines on stdin/stdout)",
        description="Answer vector-mode requests on stdin, one JSON object per line, until stdin closes.",
    )
    ada.set_defaults(run=_adapter)
    from cco.interop.live import runner

    runner.add_parser(commands)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
