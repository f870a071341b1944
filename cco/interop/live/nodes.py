"""The nodes of one live case: started as processes, stopped, and read afterwards.

A :class:`Run` is one case in one combination of implementations: its directory
(PKI, logs, qlogs, TLS key logs, results files), the environment contract of
``interop/README.md`` for each node, and the processes started from each
implementation's command.  :class:`Relays` put loss in front of a node and count
what it carried.  :class:`CaseFailed` and :class:`Unsupported` are how a case ends
otherwise than passing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cco.interop.relay import Profile, Relay
from cco.interop.relay import start as start_relay
from cco.transport.certs import create_dev_pki
from cco.wire.registries import Role

UNSUPPORTED_EXIT = 127
GROUP_ID = "c0ffee00" * 4
CREDENTIAL = "interop-secret"
HOST = "127.0.0.1"


class Unsupported(Exception):
    """A node said (exit code 127) that it does not support its role in this case."""


class CaseFailed(Exception):
    """The artifacts show that the case did not do what it must."""


# --- relays (loss, and evidence of which aggregator carried traffic) ------------------------


class Relays:
    """UDP relays running in a background event loop thread; their counters are live."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._relays: list[Relay] = []

    def start(
        self, listen: tuple[str, int], target: tuple[str, int], loss: float = 0.0, seed: int = 1
    ) -> Relay:
        profile = Profile(delay_ms=0.0, loss=loss, seed=seed)
        future = asyncio.run_coroutine_threadsafe(start_relay(listen, target, profile), self._loop)
        running = future.result(timeout=10)
        self._relays.append(running)
        return running

    def close(self) -> None:
        for running in self._relays:
            self._loop.call_soon_threadsafe(running.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


# --- nodes ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def udp_bound(port: int) -> bool:
    """Whether some socket listens on UDP ``port`` (from /proc, so any implementation counts)."""
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as f:
            for line in f.readlines()[1:]:
                local = line.split()[1]
                if int(local.rsplit(":", 1)[1], 16) == port:
                    return True
    return False


@dataclass
class Node:
    name: str
    role: str
    impl: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ended: float | None = None
    log: Path | None = None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode


@dataclass
class Run:
    """One case in one combination of implementations: its directory and nodes."""

    case: str
    directory: Path
    impls: dict[str, str]  # role -> implementation name
    commands: dict[str, str]  # implementation name -> command
    tool: str  # command of the runner's own bad aggregator (our adapter)
    nodes: list[Node] = field(default_factory=list)
    relays: Relays | None = None

    def __post_init__(self) -> None:
        for sub in ("pki", "logs", "qlog", "keys", "results"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)

    def pki(self, nodes: list[tuple[str, str]]) -> None:
        roles = {"rendezvous": Role.RENDEZVOUS, "aggregator": Role.AGGREGATOR, "endpoint": Role.ENDPOINT}
        create_dev_pki(self.directory / "pki", [(n, roles[r]) for n, r in nodes])

    def node_env(self, name: str, role: str, **extra: Any) -> dict[str, str]:
        pki = self.directory / "pki"
        qlog = self.directory / "qlog" / name
        qlog.mkdir(exist_ok=True)
        env = {
            "ROLE": role,
            "TESTCASE": self.case,
            "NODE_ID": name,
            "CERTS": str(pki),
            "CA": str(pki / "ca.pem"),
            "CERT": str(pki / f"{name}.pem"),
            "KEY": str(pki / f"{name}.key"),
            "SSLKEYLOGFILE": str(self.directory / "keys" / f"{name}.log"),
            "QLOGDIR": str(qlog),
            "GROUP_ID": GROUP_ID,
            "CREDENTIAL": CREDENTIAL,
            "RENDEZVOUS_ID": "rendezvous",
        }
        env.update({k.upper(): str(v) for k, v in extra.items()})
        return env

    def start(self, name: str, role: str, env: dict[str, str], bad: bool = False) -> Node:
        impl = "runner" if bad else self.impls[role]
        command = self.tool if bad else self.commands[impl]
        node = Node(name, role, impl, env, log=self.directory / "logs" / f"{name}.log")
        full = {**os.environ, **env}
        if bad:
            full["CCO_INTEROP_FAULT"] = "flip-result"
        assert node.log is not None
        with open(node.log, "ab") as log:  # a node started again (a restart) keeps its first log
            node.proc = subprocess.Popen(
                shlex.split(command), env=full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        node.started = time.monotonic()
        self.nodes.append(node)
        return node

    def start_server(
        self, name: str, role: str, env: dict[str, str], bad: bool = False, timeout: float = 15
    ) -> Node:
        node = self.start(name, role, env, bad)
        port = int(env["LISTEN"].rsplit(":", 1)[1])
        deadline = time.monotonic() + timeout
        while not udp_bound(port):
            assert node.proc is not None
            if node.proc.poll() is not None:
                self.check_supported(node)
                raise CaseFailed(f"{name} exited with {node.proc.returncode} before listening")
            if time.monotonic() > deadline:
                raise CaseFailed(f"{name} does not listen on UDP port {port} after {timeout} s")
            time.sleep(0.05)
        return node

    def check_supported(self, node: Node) -> None:
        if node.returncode == UNSUPPORTED_EXIT:
            raise Unsupported(f"{node.name} ({node.impl}) does not support role {node.role} in {self.case}")

    def wait(self, nodes: list[Node], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for node in nodes:
            assert node.proc is not None
            try:
                node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                node.ended = time.monotonic()
            except subprocess.TimeoutExpired:
                self.kill(node)
                raise CaseFailed(f"{node.name} did not finish within {timeout} s") from None
            self.check_supported(node)

    def kill(self, node: Node, sig: int = signal.SIGKILL) -> None:
        if node.proc is not None and node.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=5)
            node.ended = time.monotonic()

    def stop(self) -> None:
        """SIGTERM every node still running (servers), SIGKILL what does not stop."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, signal.SIGTERM)
        for node in self.nodes:
            if node.proc is not None:
                try:
                    node.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.kill(node)
        if self.relays is not None:
            self.relays.close()

    def results(self, node: Node) -> dict[str, Any]:
        path = Path(node.env["RESULTS"])
        if not path.is_file():
            raise CaseFailed(f"{node.name} wrote no results file")
        try:
            data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise CaseFailed(f"{node.name}: results file is not JSON: {error}") from error
        return data

    def log_text(self, node: Node) -> str:
        assert node.log is not None
        return node.log.read_text(encoding="utf-8", errors="replace")
