"""Counts the inputs the fuzz tests feed the decoders and prints the total at the end
of the run (issue 41 asks for at least 100,000 per CI run)."""

from __future__ import annotations

from collections import Counter

import pytest

_FED: Counter[str] = Counter()


@pytest.fixture
def fed() -> Counter[str]:
    """Inputs fed per target in this run; a test adds what it fed."""
    return _FED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _FED:
        parts = ", ".join(f"{name} {count:,}" for name, count in sorted(_FED.items()))
        terminalreporter.write_line(f"fuzzed inputs: {sum(_FED.values()):,} ({parts})")
