"""README.md's set-up section: exactly two commands, the demo's and the one CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Set up on a fresh machine") : text.index("## Using it")]
    return re.findall(r"```sh\n(.*?)\n```", section, re.S)


def test_the_readme_gives_two_setup_commands_the_demo_and_the_suite() -> None:
    demo, suite = _setup_commands()
    assert demo.endswith("cco-node demo"), demo
    assert suite.endswith("python -m pytest"), suite


def test_ci_runs_the_readmes_test_command() -> None:
    _, suite = _setup_commands()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert suite in ci, f".ci/run does not run the README's test command {suite!r}"
