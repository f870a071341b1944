"""Launching CCO jobs: torchrun under ``cco-node standalone`` on one machine, and the
documented procedure for several machines (examples/README.md), played on loopback
with a directory per "machine"."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'cco[torch]')")

from torch_ranks import free_tcp_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CCO_NODE = [sys.executable, "-m", "cco.cli"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def clean_env() -> dict[str, str]:
    """This process's environment without the CCO settings a test run may carry."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCO_") or k == "CCO_QUIC_BACKEND"}
    return {**env, "OMP_NUM_THREADS": "1"}


def test_torchrun_runs_the_ddp_example_under_one_standalone_command(tmp_path: Path) -> None:
    out = tmp_path / "losses.json"
    command = [*CCO_NODE, "standalone", "--dir", str(tmp_path / "job"), "--listen", "127.0.0.1:0"]
    command += ["--"]
    command += [*TORCHRUN, "--standalone", "--nproc-per-node", "4", str(EXAMPLES / "ddp_train.py")]
    command += ["--backend", "cco", "--width", "8", "--steps", "5", "--out", str(out)]
    done = subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    record = json.loads(out.read_text())
    assert record["backend"] == "cco" and len(record["losses"]) == 5


def test_the_procedure_for_several_machines(tmp_path: Path) -> None:
    """The head machine runs the services and holds the CA; each other machine gets the
    CA certificate and the certificates of its own ranks only, and its workers name the
    rendezvous and that directory.  Two "machines" of two ranks each, one torchrun each."""
    head = tmp_path / "head"
    command = [*CCO_NODE, "standalone", "--dir", str(head), "--listen", "127.0.0.1:0", "--endpoints", "4"]
    services = subprocess.Popen(
        command,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert services.stdout is not None
        exports = dict(
            services.stdout.readline().removeprefix("export ").strip().split("=", 1) for _ in range(3)
        )
        rendezvous = exports["CCO_RENDEZVOUS"]
        master = str(free_tcp_port())
        runs = []
        for machine, ranks in enumerate(((0, 1), (2, 3))):
            pki = tmp_path / f"machine-{machine}" / "pki"
            pki.mkdir(parents=True)
            shutil.copy(head / "pki" / "ca.pem", pki)
            for rank in ranks:
                for suffix in (".pem", ".key"):
                    shutil.copy(head / "pki" / f"ep-{rank}{suffix}", pki)
            env = {**clean_env(), "CCO_RENDEZVOUS": rendezvous, "CCO_PKI_DIR": str(pki)}
            out = tmp_path / f"losses-{machine}.json"
            argv = [*TORCHRUN, "--nnodes", "2", "--node-rank", str(machine), "--nproc-per-node", "2"]
            argv += ["--master-addr", "127.0.0.1", "--master-port", master, str(EXAMPLES / "ddp_train.py")]
            argv += ["--backend", "cco", "--steps", "3", "--out", str(out)]
            log = open(tmp_path / f"machine-{machine}.log", "w")  # noqa: SIM115 - the child owns it
            runs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
            log.close()
        codes = []
        for run in runs:
            try:
                codes.append(run.wait(400))
            except subprocess.TimeoutExpired:
                run.kill()
                codes.append(run.wait())
        logs = [(tmp_path / f"machine-{m}.log").read_text()[-1500:] for m in range(2)]
        assert codes == [0, 0], logs
        assert len(json.loads((tmp_path / "losses-0.json").read_text())["losses"]) == 3  # global rank 0
        for machine in range(2):
            assert not (
                tmp_path / f"machine-{machine}" / "pki" / "ca.key"
            ).exists()  # no CA key left the head
    finally:
        services.terminate()
        services.wait(30)
