"""mkdocs hook: the pages that are generated from the code, so that they cannot go stale.

* ``<!-- generated: cli -->``: ``cco-node``'s, ``cco-node certs``' and ``cco-node
  demo``'s ``--help``, from their argument parsers.
* ``<!-- generated: options -->``: every node option with its flag, variable, TOML
  key, roles and default, from :data:`cco.config.OPTIONS`.
* ``<!-- generated: api -->``: one reference section per name ``cco`` exports, and
  one per integration module that exists (``cco.torch``), from their docstrings.
* ``<!-- include: PATH -->``: the text of a file of the repository (the systemd
  units and TOML files of ``deploy/``, which their own tests check).

The benchmark figures are added to the site from ``benchmarks/figures``.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
FIGURES = "benchmarks/figures"
INTEGRATIONS = ("cco.torch",)


def _cli() -> str:
    from cco.cli import certs_parser, node_parser
    from cco.demo import demo_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps its help at the terminal's width
    sections = []
    for title, parser in (
        ("cco-node", node_parser()),
        ("cco-node certs", certs_parser()),
        ("cco-node demo", demo_parser()),
    ):
        sections.append(f"## `{title}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
    return "\n".join(sections)


def _options() -> str:
    from cco.config import OPTIONS

    rows = ["| option | flag | variable | roles | default | what |", "|---|---|---|---|---|---|"]
    for option in OPTIONS:
        defaults = [] if option.default in (None, ()) else [f"`{option.default}`"]
        defaults += [f"`{value}` ({role})" for role, value in (option.role_defaults or {}).items()]
        what = option.help.replace("|", "\\|")
        rows.append(
            f"| `{option.name}` | `{option.flag}` | `{option.env}` | {', '.join(option.roles)} "
            f"| {'; '.join(defaults) or '-'} | {what} |"
        )
    return "\n".join(rows)


def _api() -> str:
    import cco

    sections = [f"::: {module}.{name}\n" for name, module in sorted(cco._EXPORTS.items())]
    sections += [f"::: {module}\n" for module in INTEGRATIONS if importlib.util.find_spec(module) is not None]
    return "\n".join(sections)


def _include(match: re.Match[str]) -> str:
    return (ROOT / match.group(1)).read_text().rstrip()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = markdown.replace("<!-- generated: cli -->", _cli())
    markdown = markdown.replace("<!-- generated: options -->", _options())
    markdown = markdown.replace("<!-- generated: api -->", _api())
    return re.sub(r"<!-- include: (\S+) -->", _include, markdown)


def on_files(files: Files, config: Any) -> Files:
    for figure in sorted((ROOT / FIGURES).glob("*.png")):
        files.append(
            File(f"{FIGURES}/{figure.name}", str(ROOT), config["site_dir"], config["use_directory_urls"])
        )
    return files
