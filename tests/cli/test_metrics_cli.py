"""``--metrics-listen`` on a real ``cco-node``: the rendezvous serves /metrics, and an
address already in use ends in one line naming it and the option."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from cco.localcluster import free_udp_port
from cco.transport import create_dev_pki
from cco.wire.registries import Role


def _free_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _command(pki: Path, metrics: str, listen: int | None = None) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cco",
        "--role",
        "rendezvous",
        "--node-id",
        "rendezvous",
        "--pki-dir",
        str(pki),
        "--listen",
        f"127.0.0.1:{listen or free_udp_port()}",
        "--store",
        ":memory:",
        "--metrics-listen",
        metrics,
    ]


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CCO_")}


def test_a_rendezvous_process_serves_its_metrics_and_its_status(tmp_path: Path) -> None:
    create_dev_pki(tmp_path, [("rendezvous", Role.RENDEZVOUS), ("operator", Role.ENDPOINT)])
    port, listen = _free_tcp_port(), free_udp_port()
    log = tmp_path / "rendezvous.log"
    with open(log, "w") as handle:
        command = _command(tmp_path, f"127.0.0.1:{port}", listen)
        node = subprocess.Popen(command, stderr=handle, env=_environ())
    try:
        deadline = time.monotonic() + 60
        while "serves metrics on" not in log.read_text():
            assert node.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        assert "\ncco_groups 0.0\n" in text and "\ncco_aggregators 0.0\n" in text, text
        assert "# TYPE cco_collectives_total counter" in text
        asked = [sys.executable, "-m", "cco", "status", "--rendezvous", f"127.0.0.1:{listen}", "--json"]
        asked += ["--pki-dir", str(tmp_path), "--node-id", "operator"]
        done = subprocess.run(asked, capture_output=True, text=True, timeout=60, env=_environ(), check=False)
        assert done.returncode == 0, done.stderr
        reply = json.loads(done.stdout)
        assert (reply["role"], reply["groups"], reply["aggregators"]) == ("rendezvous", [], [])
    finally:
        node.send_signal(signal.SIGTERM)
        assert node.wait(20) == 0


def test_a_metrics_address_in_use_is_one_line(tmp_path: Path) -> None:
    create_dev_pki(tmp_path, [("rendezvous", Role.RENDEZVOUS)])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        done = subprocess.run(
            _command(tmp_path, address),
            capture_output=True,
            text=True,
            timeout=60,
            env=_environ(),
            check=False,
        )
    assert done.returncode == 1
    assert done.stderr == (
        f"cco-node: cannot serve metrics on {address} (TCP): the address is already in use; "
        "choose another with --metrics-listen\n"
    )
