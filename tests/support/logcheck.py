"""Reading node logs for trouble: what the end-to-end tests assert is absent.

A ``cco-node`` process logs ``<date> <time> <logger> <LEVEL> <message>`` lines
(cco/services/roles.py); an uncaught exception shows as a ``Traceback`` block.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

_BAD_LEVEL = re.compile(r"^\S+ \S+ \S+ (ERROR|CRITICAL) ")


def log_problems(logs: Iterable[Path]) -> list[str]:
    """Every ERROR or CRITICAL line and every traceback line, as ``file:line: text``."""
    problems = []
    for log in logs:
        for number, line in enumerate(log.read_text(errors="replace").splitlines(), 1):
            if _BAD_LEVEL.match(line) or line.startswith("Traceback"):
                problems.append(f"{log.name}:{number}: {line}")
    return problems
