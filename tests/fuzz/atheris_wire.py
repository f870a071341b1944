"""Long coverage-guided runs of the wire decoders' fuzz targets, with atheris.

The suite feeds each target of :mod:`wire_targets` a fixed 12,000 inputs per run
(tests/fuzz/test_wire_decoders_fuzzed.py); this runner is for the hours in between:
atheris (libFuzzer) mutates towards new coverage of cco/wire and keeps going until
a target raises anything but a typed refusal, which it reports with the input.

    pip install -e '.[fuzz]'
    python tests/fuzz/atheris_wire.py --target verify -- -runs=1000000
    python tests/fuzz/atheris_wire.py --target all -- -max_total_time=3600

``--target all`` spreads each input over every target (the first byte chooses).
Arguments after ``--`` go to libFuzzer unchanged: ``-runs=N``, ``-max_total_time=S``,
``-max_len=N``, a corpus directory, ``-jobs=N``, ``-artifact_prefix=DIR/`` (where a
failing or slow input is written; the current directory by default: on a busy
machine an input that waited for the CPU is reported slow, so time it again).  At the end it prints the inputs
fed, accepted and refused per target every 100,000 inputs (libFuzzer ends the
process without running Python's exit handlers; its own last line, ``Done N runs``,
is the total).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))

ACCEPTED: Counter[str] = Counter()
REFUSED: Counter[str] = Counter()
REPORT_EVERY = 100_000


def one_input(targets: ModuleType, names: list[str]) -> Callable[[bytes], None]:
    """libFuzzer's callback: the chosen target on ``data``, counted."""

    def feed(data: bytes) -> None:
        name = names[0]
        if len(names) > 1 and data:
            name, data = names[data[0] % len(names)], data[1:]
        accepted = targets.TARGETS[name](data)
        (ACCEPTED if accepted else REFUSED)[name] += 1
        if (ACCEPTED.total() + REFUSED.total()) % REPORT_EVERY == 0:
            report()

    return feed


def report() -> None:
    total = ACCEPTED.total() + REFUSED.total()
    print(f"atheris_wire: {total:,} inputs fed, every refusal a typed error", file=sys.stderr)
    for name in sorted(ACCEPTED.keys() | REFUSED.keys()):
        print(f"  {name:20} accepted {ACCEPTED[name]:>10,}  refused {REFUSED[name]:>10,}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default="all", help="a target of wire_targets.TARGETS, or 'all'")
    parser.add_argument("libfuzzer", nargs="*", help="arguments for libFuzzer (after --)")
    args = parser.parse_args()
    try:
        import atheris
    except ImportError:
        raise SystemExit("atheris_wire: atheris is not installed (pip install -e '.[fuzz]')") from None
    with atheris.instrument_imports(include=["cco.wire"]):  # coverage of cco/wire guides the mutations
        targets = importlib.import_module("wire_targets")
    if args.target != "all" and args.target not in targets.TARGETS:
        parser.error(f"--target must be 'all' or one of {', '.join(sorted(targets.TARGETS))}")
    names = sorted(targets.TARGETS) if args.target == "all" else [args.target]
    targets.scenarios()
    targets.corpus()
    atheris.Setup([sys.argv[0], *args.libfuzzer], one_input(targets, names))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
