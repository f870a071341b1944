"""``deploy/``: the systemd units pass ``systemd-analyze verify`` and the TOML files
are configurations ``cco-node`` accepts."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cco.cli import node_parser
from cco.config import resolve

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNITS = sorted(DEPLOY.glob("*.service"))
SYSTEM_UNITS = next(
    (d for d in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if d.is_dir()), None
)


@pytest.mark.parametrize("toml", sorted(DEPLOY.glob("*.toml")), ids=lambda p: p.name)
def test_each_toml_file_is_a_configuration_cco_node_accepts(toml: Path) -> None:
    role = toml.stem
    resolved = resolve(node_parser().parse_args(["--role", role, "--config", str(toml)]), {})
    assert resolved.log_format == "json"


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None or SYSTEM_UNITS is None,
    reason="systemd-analyze is not installed (Debian's systemd package)",
)
@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_each_unit_passes_systemd_analyze_verify(unit: Path, tmp_path: Path) -> None:
    """Verified in a root of its own: the unit, a copy of the system's own units (the
    targets it names), and a stand-in for the cco-node it runs."""
    root = tmp_path / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    shutil.copy(unit, root / "etc/systemd/system" / unit.name)
    assert SYSTEM_UNITS is not None
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    node = root / "opt/cco/bin/cco-node"
    node.parent.mkdir(parents=True)
    node.write_text("#!/bin/sh\n")
    node.chmod(0o755)
    instance = unit.name.replace("@.service", "@node-0.service")
    done = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", instance], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    assert "ExecStart=/opt/cco/bin/cco-node" in unit.read_text()


def _exported_names() -> set[str]:
    """Every metric family a node can export (a rendezvous's, which has them all)."""
    import asyncio

    from prometheus_client import generate_latest

    from cco.nodes.rendezvous import RendezvousMachine
    from cco.services.metrics import NodeMetrics
    from cco.services.runner import MachineRunner

    async def scrape() -> str:
        runner = MachineRunner(RendezvousMachine(), connector=lambda command: None)  # type: ignore[arg-type, return-value]
        metrics = NodeMetrics(runner)
        return (await asyncio.to_thread(generate_latest, metrics.registry)).decode()

    text = asyncio.run(scrape())
    return {_family(line.split()[2]) for line in text.splitlines() if line.startswith("# TYPE ")}


def _family(name: str) -> str:
    return re.sub(r"_(bucket|count|sum|total)$", "", name)


def test_the_grafana_dashboard_queries_only_metrics_the_nodes_export() -> None:
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {
        re.sub(r"_(bucket|count|sum|total)$", "", name)
        for e in expressions
        for name in re.findall(r"cco_\w+", e)
    }
    exported = _exported_names()
    assert used and used <= exported, used - exported
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
    # the list: collectives, bytes, latencies, retransmissions, verification, epochs,
    # members, groups, join rejections, QUIC losses and RTT
    assert {
        "cco_collectives",
        "cco_chunk_bytes",
        "cco_chunk_seconds",
        "cco_operation_seconds",
        "cco_retransmit_requests",
        "cco_verification_failures",
        "cco_group_epoch",
        "cco_group_members",
        "cco_groups",
        "cco_join_rejections",
        "cco_quic_lost_packets",
        "cco_quic_rtt_seconds",
    } <= used
