"""``cco-interop`` works from an installed package, away from the source checkout.

A wheel holds ``cco/`` only: the vectors travel as package data
(``cco/interop/vectors``, a link to ``interop/vectors`` in the checkout) and the
live runner's relay is a module of the package.  The package is copied, links
followed as a wheel build follows them, into a directory with no checkout around
it, and run from there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _installed_copy(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    shutil.copytree(ROOT / "cco", site / "cco", ignore=shutil.ignore_patterns("__pycache__"))
    assert not (site / "cco" / "interop" / "vectors").is_symlink()
    return site


def _run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )


def test_the_wheel_takes_the_vectors_as_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert config["tool"]["setuptools"]["package-data"]["cco.interop"] == ["vectors/*.json"]
    shipped = ROOT / "cco" / "interop" / "vectors"
    assert shipped.resolve() == (ROOT / "interop" / "vectors").resolve()


def test_check_finds_the_vectors_it_ships_with(tmp_path: Path) -> None:
    site = _installed_copy(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run(site, elsewhere, "-c", "import cco.interop.generate as g; print(g.default_vector_dir())")
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()) == site / "cco" / "interop" / "vectors"
    result = _run(site, elsewhere, "-m", "cco.interop.cli", "check")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "regeneration: identical" in result.stdout
    assert not (elsewhere / "interop").exists()


def test_the_live_runner_relays_without_the_checkout(tmp_path: Path) -> None:
    site = _installed_copy(tmp_path)
    code = (
        "from cco.interop import live\n"
        "relays = live.Relays()\n"
        "port = live.free_port()\n"
        "relay = relays.start(('127.0.0.1', port), ('127.0.0.1', 9))\n"
        "print(type(relay).__module__)\n"
        "relays.close()\n"
    )
    result = _run(site, tmp_path, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "cco.interop.relay"
