"""The package's layers, read from its import statements: no module imports from a
layer above its own, and the two halves of the middle (the sans-I/O machines and the
QUIC transport) do not import each other.

Every import statement counts, wherever it stands (inside a function, under
``TYPE_CHECKING``): a lazy import of a higher layer is still an arrow pointing up.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cco

PACKAGE = Path(cco.__file__).resolve().parent

LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("wire", frozenset({"cco.wire"})),
    (
        "machines, transport and settings",
        frozenset({"cco.nodes", "cco.transport", "cco.config", "cco.logs", "cco.workload"}),
    ),
    ("services", frozenset({"cco.services"})),
    ("client", frozenset({"cco.client"})),
    (
        "applications",
        frozenset(
            {
                "cco",
                "cco.__main__",
                "cco.jobs",
                "cco.launch",
                "cco.cli",
                "cco.demo",
                "cco.interop",
                "cco.localcluster",
                "cco.standalone",
                "cco.status_cli",
                "cco.torch",
                "cco.trace",
                "cco.workers",
            }
        ),
    ),
)
"""Lowest first.  A unit (a subpackage, or a top-level module) may import its own
modules and the units of lower layers; of its own layer, only the applications may
import each other (the CLI runs the demo, the node's main and its workers
(``cco.workers``), the interop runner
drives the CLI; ``cco.status_cli`` and ``cco.trace`` are its status and trace-analyze
commands).  ``cco.logs`` sets up a
process's logging and imports nothing of the package."""

PEERS_MAY_IMPORT = frozenset({"applications"})


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    """The layered unit a module belongs to: ``cco.nodes.endpoint`` -> ``cco.nodes``
    (the package itself, ``cco``, is a unit of its own, never a catch-all)."""
    parts = module.split(".")
    candidates = [".".join(parts[:n]) for n in range(len(parts), 1, -1)] or [module]
    for candidate in candidates:
        if any(candidate in units for _, units in LAYERS):
            return candidate
    raise LookupError(module)


def _layer(unit: str) -> int:
    return next(index for index, (_, units) in enumerate(LAYERS) if unit in units)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every ``cco`` import in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, name) for name in names if name == "cco" or name.startswith("cco.")]
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    unplaced = []
    for path in MODULES:
        try:
            _unit(_module_name(path))
        except LookupError:
            unplaced.append(_module_name(path))
    assert not unplaced, f"put these in LAYERS: {unplaced}"


def test_no_relative_imports() -> None:
    """Relative imports would escape the check below."""
    relative = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path in MODULES
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.level
    ]
    assert not relative


@pytest.mark.parametrize("path", MODULES, ids=_module_name)
def test_no_import_reaches_a_higher_layer_or_a_sibling(path: Path) -> None:
    unit = _unit(_module_name(path))
    layer = _layer(unit)
    wrong = []
    for line, imported in _imports(path):
        target = _unit(imported)
        if target == unit:
            continue
        target_layer = _layer(target)
        upward = target_layer > layer
        sideways = target_layer == layer and LAYERS[layer][0] not in PEERS_MAY_IMPORT
        if upward or sideways:
            wrong.append(
                f"line {line}: {unit} ({LAYERS[layer][0]}) imports {imported} ({LAYERS[target_layer][0]})"
            )
    assert not wrong, "\n".join(wrong)


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The check itself: an import of the client from the machines is found."""
    module = tmp_path / "bad.py"
    module.write_text("def f():\n    from cco.client import Communicator\n", encoding="utf-8")
    ((line, imported),) = _imports(module)
    assert (line, imported) == (2, "cco.client")
    assert _layer(_unit(imported)) > _layer(_unit("cco.nodes.endpoint"))
