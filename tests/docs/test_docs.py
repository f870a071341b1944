"""The documentation site builds with no warning, and every example in it runs.

Fences and what runs them:

* ``python``: on both ranks of a live two-rank group at once (a rendezvous and an
  aggregator as ``cco-node`` processes), with ``comm``, ``rank``, ``np``, ``cco``,
  ``asyncio``, ``pki`` and ``rendezvous`` in scope;
* ``sh``: as a bash script in a fresh directory, in a network namespace of its own
  (so the examples' default ports collide with nothing), with ``cco-node`` on PATH;
* ``toml`` and ``ini``: the files of ``deploy/`` they include, checked by
  ``tests/docs/test_deploy.py``;
* ``text``: what cannot run here (installing, systemctl, a firewall, a capture).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import cco
from cco.localcluster import ClusterSpec, LocalCluster

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
GROUP = bytes.fromhex("c0" * 16)


def blocks(language: str) -> list[tuple[str, str]]:
    """(``page:line``, code) of every ``language`` block in the docs."""
    found = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == language:
                line = text[: match.start()].count("\n") + 1
                found.append((f"{page.name}:{line}", match.group(2)))
    return found


def test_the_site_builds_with_no_warning(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in cco.__all__:
        assert name in api, f"{name} is not in the API reference"
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    assert "--log-format" in cli and "--force" in cli and "--endpoints" in cli


def test_every_public_function_has_an_example() -> None:
    """Each public method of the communicators, and each name ``cco`` exports,
    appears in a Python example."""
    code = "\n".join(block for _, block in blocks("python"))
    public = {name for name in dir(cco.Communicator) if not name.startswith("_")}
    public |= {name for name in dir(cco.BlockingCommunicator) if not name.startswith("_")}
    public |= set(cco.__all__)
    missing = sorted(name for name in public if not re.search(rf"\b{name}\b", code))
    assert not missing, f"no example uses {missing}"


async def _run_python_examples(pki: Path, rendezvous: str) -> None:
    def transport(rank: int) -> cco.TransportConfig:
        return cco.TransportConfig.for_node(pki, f"ep-{rank}")

    spec = [
        cco.GroupSpec(group_id=GROUP, world_size=2, credential=b"demo", rank=rank, rendezvous=rendezvous)
        for rank in range(2)
    ]
    comms = await asyncio.gather(
        *(cco.Communicator.join(spec[rank], f"ep-{rank}", transport(rank), timeout=120) for rank in range(2))
    )
    try:
        for where, code in blocks("python"):
            scope = {"np": np, "cco": cco, "asyncio": asyncio}
            source = "async def example(comm, rank, pki, rendezvous):\n" + textwrap.indent(code, "    ")
            exec(compile(source, where, "exec"), scope)
            runs = [scope["example"](comm, comm.rank, pki, rendezvous) for comm in comms]
            results = await asyncio.gather(*runs, return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException)]
            assert not failures, f"{where}: {failures[0]!r}"
    finally:
        await asyncio.gather(*(comm.close() for comm in comms))


def test_every_python_example_runs(tmp_path: Path) -> None:
    assert blocks("python"), "no Python examples found"
    spec = ClusterSpec(aggregators=1, endpoints=6, max_fan_in=4)
    with LocalCluster(spec, tmp_path) as cluster:
        cluster.start(timeout=120)
        rendezvous = f"127.0.0.1:{cluster.rendezvous_port}"
        asyncio.run(asyncio.wait_for(_run_python_examples(cluster.pki, rendezvous), 600))


def _own_network() -> list[str]:
    """A command prefix running its command in a new network namespace with loopback up."""
    return ["unshare", "--net", "--", "bash", "-c", 'ip link set lo up && exec bash -e "$0"']


@pytest.mark.skipif(
    shutil.which("unshare") is None or shutil.which("ip") is None or os.geteuid() != 0,
    reason="running the shell examples in a network namespace of their own needs root, unshare and ip",
)
@pytest.mark.parametrize(("where", "script"), blocks("sh"), ids=[where for where, _ in blocks("sh")])
def test_every_shell_example_runs(where: str, script: str, tmp_path: Path) -> None:
    path = tmp_path / "example.sh"
    path.write_text(script)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CCO_")}
    environ["PATH"] = f"{Path(sys.executable).parent}:{environ.get('PATH', '')}"
    environ["XDG_STATE_HOME"] = str(tmp_path / "state")
    done = subprocess.run(
        [*_own_network(), str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=environ,
        timeout=280,
        start_new_session=True,
    )
    assert done.returncode == 0, f"{where} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
