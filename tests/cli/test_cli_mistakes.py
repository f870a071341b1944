"""Every routine mistake with ``cco-node`` ends in one line and the right exit status.

Each case runs the real command line (``python -m cco``) as a subprocess in a
session of its own, and checks what an operator sees: stderr is exactly one line,
``cco-node: ...``, naming the cause and the file, address or option; the exit
status is 2 for bad usage or configuration and 1 for a failed run; and when the
command has ended, no process of its session is still running.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from cco.transport import create_dev_pki
from cco.wire.registries import Role

GROUP = "c0" * 16


def session_processes(sid: int) -> list[int]:
    """Processes still alive (not zombies) in session ``sid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[4]) == sid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


@dataclass
class Outcome:
    status: int
    stdout: str
    stderr: str


def cco_node(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> Outcome:
    """Run ``python -m cco ARGS`` in its own session, bounded in time; check that
    nothing of its session outlives it."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CCO_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "cco", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env={**environ, **(env or {})},
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    left = session_processes(process.pid)  # the session's id is its leader's pid
    assert not left, f"processes of the command's session are still running: {left}"
    return Outcome(process.returncode, stdout, stderr)


def assert_one_line(outcome: Outcome, status: int, *needles: str) -> str:
    """The command failed with ``status`` and exactly one stderr line holding ``needles``."""
    lines = outcome.stderr.splitlines()
    assert outcome.status == status, f"exit {outcome.status}, not {status}: {outcome.stderr}"
    assert len(lines) == 1, f"not one line: {outcome.stderr}"
    line = lines[0]
    assert line.startswith("cco-node: "), line
    assert "Traceback" not in line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    return line


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    create_dev_pki(
        directory,
        [
            ("rendezvous", Role.RENDEZVOUS),
            ("agg-0", Role.AGGREGATOR),
            ("agg-1", Role.AGGREGATOR),
            ("ep-0", Role.ENDPOINT),
        ],
    )
    return directory


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another group's PKI, with node ids like ours."""
    directory = tmp_path_factory.mktemp("foreign")
    create_dev_pki(directory, [("agg-0", Role.AGGREGATOR)])
    return directory


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def aggregator(pki: Path, *extra: str) -> list[str]:
    return ["--role", "aggregator", "--node-id", "agg-0", "--pki-dir", str(pki), *extra]


# --- usage ----------------------------------------------------------------------------


def test_bare_cco_node_shows_usage_pointing_at_demo_certs_and_help() -> None:
    outcome = cco_node()
    assert outcome.status == 2
    for pointer in ("cco-node demo", "cco-node certs", "--help", "--role"):
        assert pointer in outcome.stderr
    assert "INVALID_FIELD" not in outcome.stderr


def test_version_names_the_package_the_protocol_and_the_quic_stacks() -> None:
    outcome = cco_node("--version")
    assert outcome.status == 0
    assert outcome.stdout.startswith("cco-node 0.") and "cco/2" in outcome.stdout and "qh3" in outcome.stdout


def test_python_dash_m_cco_is_cco_node() -> None:
    outcome = cco_node("--help")
    assert outcome.status == 0 and "--role" in outcome.stdout and "--log-format" in outcome.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["demo", "--endpoints", "0"], "--endpoints: must be at least 1, got 0"),
        (["demo", "--endpoints", "-1"], "--endpoints: must be at least 1, got -1"),
        (["demo", "--rounds", "0"], "--rounds: must be at least 1, got 0"),
        (["demo", "--fan-in", "1"], "--fan-in: must be at least 2, got 1"),
        (["demo", "--elements", "many"], "--elements: expected a whole number, got 'many'"),
        (["--role", "janitor"], "argument --role: invalid choice: 'janitor'"),
        (["--role", "rendezvous", "--log-level", "verbose"], "--log-level: 'verbose' is not one of debug"),
        (["--role", "rendezvous", "--log-format", "xml"], "--log-format: 'xml' is not one of text, json"),
        (["--role", "endpoint", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
    ids=lambda value: "_".join(value) if isinstance(value, list) else None,
)
def test_a_bad_argument_is_one_line_with_status_2(args: list[str], needle: str) -> None:
    assert_one_line(cco_node(*args), 2, needle)


def test_a_misspelled_cco_variable_is_refused_with_a_suggestion() -> None:
    line = assert_one_line(cco_node("--role", "endpoint", env={"CCO_ROUND": "1"}), 2, "CCO_ROUND")
    assert "did you mean CCO_ROUNDS?" in line


def test_a_config_file_key_that_is_not_an_option_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text('role = "endpoint"\nround = 3\n')
    assert_one_line(cco_node("--config", str(config)), 2, str(config), "'round'", "did you mean rounds?")


# --- certificates and keys, checked at start -------------------------------------------


def test_a_malformed_ca_file_is_named_at_start_not_retried(pki: Path, tmp_path: Path) -> None:
    """An aggregator with a malformed ca.pem used to retry for ever as 'rendezvous
    unreachable', logging an asyncio traceback each time."""
    ca = tmp_path / "ca.pem"
    ca.write_text("this is not a certificate\n")
    line = assert_one_line(cco_node(*aggregator(pki, "--ca", str(ca))), 2, str(ca))
    assert "no PEM certificate" in line


def test_a_truncated_ca_file_is_named(pki: Path, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes((pki / "ca.pem").read_bytes()[:200])
    assert_one_line(cco_node(*aggregator(pki, "--ca", str(ca))), 2, str(ca), "truncated")


def test_a_truncated_key_is_named(pki: Path, tmp_path: Path) -> None:
    key = tmp_path / "agg-0.key"
    key.write_bytes((pki / "agg-0.key").read_bytes()[:100])
    assert_one_line(cco_node(*aggregator(pki, "--key", str(key))), 2, str(key), "truncated")


def test_a_missing_key_is_named(pki: Path, tmp_path: Path) -> None:
    key = tmp_path / "absent.key"
    assert_one_line(cco_node(*aggregator(pki, "--key", str(key))), 2, str(key), "no such file")


def test_a_key_of_another_certificate_is_refused(pki: Path) -> None:
    key = pki / "agg-1.key"
    assert_one_line(cco_node(*aggregator(pki, "--key", str(key))), 2, str(key), "not the private key of")


def test_a_certificate_for_another_node_id_is_refused(pki: Path) -> None:
    args = aggregator(pki, "--cert", str(pki / "agg-1.pem"), "--key", str(pki / "agg-1.key"))
    assert_one_line(cco_node(*args), 2, "agg-1.pem", "for node 'agg-1', not 'agg-0'")


def test_an_endpoint_with_an_aggregators_certificate_is_refused(pki: Path) -> None:
    """It used to print a Python traceback (issue 41)."""
    args = ["--role", "endpoint", "--node-id", "agg-0", "--pki-dir", str(pki)]
    args += ["--group-id", GROUP, "--world-size", "2"]
    assert_one_line(cco_node(*args), 2, "agg-0.pem", "aggregator role, not the endpoint")


def test_an_aggregator_with_a_certificate_from_a_foreign_ca_exits_at_once(pki: Path, foreign: Path) -> None:
    """It used to retry for more than 30 s (issue 41)."""
    args = aggregator(pki, "--cert", str(foreign / "agg-0.pem"), "--key", str(foreign / "agg-0.key"))
    assert_one_line(cco_node(*args), 2, "agg-0.pem", f"not issued by the CA in {pki / 'ca.pem'}")


# --- addresses ----------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["rendezvous", "aggregator"])
def test_a_port_already_in_use_is_named(role: str, pki: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        node_id = "rendezvous" if role == "rendezvous" else "agg-0"
        args = ["--role", role, "--node-id", node_id, "--pki-dir", str(pki), "--listen", address]
        assert_one_line(cco_node(*args, "--store", ":memory:"), 1, f"cannot listen on {address}", "in use")


def test_an_address_not_of_this_host_is_named(pki: Path) -> None:
    assert_one_line(
        cco_node(*aggregator(pki, "--listen", "198.18.255.254:4500")),
        1,
        "cannot listen on 198.18.255.254:4500",
    )


# --- cco-node certs -------------------------------------------------------------------------


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_certs_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    assert cco_node("certs", "--dir", str(tmp_path), "agg-0:aggregator").status == 0
    before = _digests(tmp_path)
    line = assert_one_line(cco_node("certs", "--dir", str(tmp_path), "agg-0:aggregator", "ep-0:endpoint"), 2)
    assert "agg-0.pem" in line and "--force" in line
    assert _digests(tmp_path) == before  # nothing written, not even ep-0
    assert cco_node("certs", "--dir", str(tmp_path), "--force", "agg-0:aggregator").status == 0
    after = _digests(tmp_path)
    assert after["agg-0.key"] != before["agg-0.key"] and after["ca.pem"] == before["ca.pem"]


def test_certs_refuses_a_node_id_listed_twice(tmp_path: Path) -> None:
    outcome = cco_node("certs", "--dir", str(tmp_path / "pki"), "ep-0:endpoint", "ep-0:aggregator")
    assert_one_line(outcome, 2, "'ep-0' listed more than once")
    assert not (tmp_path / "pki").exists()


# --- running nodes: logs and the store ------------------------------------------------------


def _first_lines_then_stop(args: list[str], env: dict[str, str], until: str) -> list[str]:
    """Start a node, read its stderr until a line holds ``until``, stop it with SIGTERM."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CCO_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "cco", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**environ, **env},
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line.rstrip("\n"))
            if until in line:
                break
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert any(until in line for line in lines), lines
    return lines


def test_log_format_json_writes_one_object_per_line(pki: Path) -> None:
    import json

    args = ["--role", "rendezvous", "--node-id", "rendezvous", "--pki-dir", str(pki)]
    args += ["--listen", f"127.0.0.1:{free_port()}", "--store", ":memory:", "--log-format", "json"]
    lines = _first_lines_then_stop(args, {}, "listening")
    entries = [json.loads(line) for line in lines]
    assert entries[-1]["level"] == "info" and entries[-1]["logger"] == "cco.node"
    assert "listening on 127.0.0.1" in entries[-1]["message"] and entries[-1]["time"]


def test_the_default_store_is_per_node_id_port_and_ca(pki: Path, tmp_path: Path) -> None:
    """Two unrelated jobs with a rendezvous of the same node id on one host used to
    share one store, and the second restored the first one's groups."""
    port = free_port()
    args = ["--role", "rendezvous", "--node-id", "rendezvous", "--listen", f"127.0.0.1:{port}"]
    xdg = {"XDG_STATE_HOME": str(tmp_path)}
    lines = _first_lines_then_stop([*args, "--pki-dir", str(pki)], xdg, "listening")
    stores = sorted((tmp_path / "cco").glob("*.sqlite3"))
    assert len(stores) == 1 and stores[0].name.startswith(f"rendezvous-rendezvous-{port}-")
    assert str(stores[0]) in lines[-1]
    other = tmp_path / "other-job"
    create_dev_pki(other, [("rendezvous", Role.RENDEZVOUS)])
    _first_lines_then_stop([*args, "--pki-dir", str(other)], xdg, "listening")
    assert len(sorted((tmp_path / "cco").glob("*.sqlite3"))) == 2  # another CA, another store
    state = tmp_path / "systemd-state"
    _first_lines_then_stop([*args, "--pki-dir", str(pki)], {"STATE_DIRECTORY": str(state)}, "listening")
    assert [p.name for p in state.glob("*.sqlite3")] == [stores[0].name]


def test_an_aggregator_of_an_entirely_foreign_pki_stops_at_its_first_refusal(
    pki: Path, foreign: Path, tmp_path: Path
) -> None:
    """Its own CA, certificate and key agree, so nothing is wrong at start; the rendezvous
    (of another CA) refuses the handshake.  It used to retry forever; now the first
    refusal is final: one line, exit status 3, which systemd does not restart."""
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CCO_")}
    log = tmp_path / "rendezvous.log"
    with open(log, "w") as handle:
        command = [sys.executable, "-m", "cco", "--role", "rendezvous", "--node-id", "rendezvous"]
        command += ["--pki-dir", str(pki), "--listen", f"127.0.0.1:{port}", "--store", ":memory:"]
        rendezvous = subprocess.Popen(
            command,
            stderr=handle,
            env=environ,
        )
    try:
        deadline = time.monotonic() + 60
        while "listening" not in log.read_text():
            assert rendezvous.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        args = [
            "--role",
            "aggregator",
            "--node-id",
            "agg-0",
            "--pki-dir",
            str(foreign),
            "--log-level",
            "warning",
        ]
        args += ["--rendezvous", f"127.0.0.1:{port}", "--listen", f"127.0.0.1:{free_port()}"]
        outcome = cco_node(*args)
    finally:
        rendezvous.terminate()
        rendezvous.wait(20)
    lines = outcome.stderr.splitlines()
    assert outcome.status == 3 and len(lines) == 1, outcome.stderr
    assert (
        "do not trust each other" in lines[0] and "same group CA" in lines[0] and "Traceback" not in lines[0]
    )
