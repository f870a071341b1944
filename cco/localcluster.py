"""A CCO cluster of real processes on loopback, for the demo and end-to-end tests.

It creates a fresh development PKI, starts one rendezvous and the aggregators as
``cco-node`` processes, waits until every aggregator has registered, then starts the
endpoints with a workload and collects what they report.  Every process is stopped
when the cluster is closed, whatever happened; logs stay in the work directory.
Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from cco.transport import create_dev_pki
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.registries import Role

HOST = "127.0.0.1"


def free_udp_port() -> int:
    """A UDP port on loopback that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """Shape and workload of a local cluster."""

    aggregators: int = 3
    endpoints: int = 8
    max_fan_in: int = 4
    workload: str = "allreduce"
    rounds: int = 5
    elements: int = 1 << 18
    chunk_elements: int = 65536
    window: int = 8
    max_datagram_size: int = 16000
    group_id: str = "c0" * 16
    credential: str = "demo"
    labels: tuple[str, ...] = ()
    extra_endpoint_args: tuple[str, ...] = field(default=())
    extra_rendezvous_args: tuple[str, ...] = field(default=())


@dataclass(slots=True)
class _Process:
    name: str
    popen: subprocess.Popen[str]
    log: Path
    log_handle: IO[str]


class LocalCluster:
    """Start with :meth:`start`, run endpoints with :meth:`run_endpoints`, then :meth:`close`."""

    def __init__(self, spec: ClusterSpec, workdir: Path) -> None:
        self.spec = spec
        self.workdir = workdir
        self.pki = workdir / "pki"
        self.store = workdir / "rendezvous.sqlite3"
        """The rendezvous's store: in the work directory, so that a restart
        (:meth:`restart_rendezvous`) carries on from it and nothing is written elsewhere."""
        self.rendezvous_port = free_udp_port()
        self._infra: list[_Process] = []
        self._taken_signals: list[signal.Signals] = []

    # --- processes -----------------------------------------------------------------

    def _common(self, node_id: str) -> list[str]:
        return [
            "--node-id",
            node_id,
            "--pki-dir",
            str(self.pki),
            "--max-datagram-size",
            str(self.spec.max_datagram_size),
        ]

    def _spawn(self, name: str, args: list[str], stdout: int | IO[str] | None = None) -> _Process:
        log = self.workdir / f"{name}.log"
        handle = open(log, "w")  # noqa: SIM115 - closed by _stop() when the process is reaped
        popen = subprocess.Popen(
            [sys.executable, "-m", "cco.cli", *args],
            stdout=stdout if stdout is not None else handle,
            stderr=handle,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        return _Process(name, popen, log, handle)

    def start(self, timeout: float = 30.0) -> None:
        """PKI, rendezvous, aggregators; returns once every aggregator has registered."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        nodes = [("rendezvous", Role.RENDEZVOUS)]
        nodes += [(f"agg-{i}", Role.AGGREGATOR) for i in range(self.spec.aggregators)]
        nodes += [(f"ep-{i}", Role.ENDPOINT) for i in range(self.spec.endpoints)]
        create_dev_pki(self.pki, nodes)
        for stale in (self.store, self.store.with_name(self.store.name + "-wal")):
            stale.unlink(missing_ok=True)  # a new cluster: no groups of an earlier run in this work dir
        self._infra.append(self._spawn("rendezvous", self._rendezvous_args()))
        self._wait_for_line(self._infra[0], "listening", timeout)
        for i in range(self.spec.aggregators):
            self._infra.append(self._spawn(f"agg-{i}", self._aggregator_args(f"agg-{i}")))
        for process in self._infra[1:]:
            self._wait_for_line(process, "registered", timeout)

    def _rendezvous_args(self) -> list[str]:
        return [
            "--role",
            "rendezvous",
            *self._common("rendezvous"),
            "--listen",
            f"{HOST}:{self.rendezvous_port}",
            "--store",
            str(self.store),
            "--chunk-elements",
            str(self.spec.chunk_elements),
            "--window",
            str(self.spec.window),
            *self.spec.extra_rendezvous_args,
        ]

    def _aggregator_args(self, node_id: str) -> list[str]:
        return [
            "--role",
            "aggregator",
            *self._common(node_id),
            "--listen",
            f"{HOST}:{free_udp_port()}",
            "--rendezvous",
            f"{HOST}:{self.rendezvous_port}",
            "--max-fan-in",
            str(self.spec.max_fan_in),
        ]

    def restart_rendezvous(self, sig: signal.Signals = signal.SIGKILL, timeout: float = 30.0) -> None:
        """Stop the rendezvous with ``sig`` and start it again on the same port."""
        old = self._infra[0]
        old.popen.send_signal(sig)
        old.popen.wait(10)
        old.log_handle.close()
        old.log.rename(old.log.with_suffix(".before-restart.log"))
        self._infra[0] = self._spawn("rendezvous", self._rendezvous_args())
        self._wait_for_line(self._infra[0], "listening", timeout)

    def start_aggregator(self, node_id: str) -> subprocess.Popen[str]:
        """One more aggregator process (stopped with the cluster), with its own log."""
        process = self._spawn(node_id, self._aggregator_args(node_id))
        self._infra.append(process)
        return process.popen

    def start_endpoint(self, index: int, results: Path) -> subprocess.Popen[str]:
        """Endpoint ``index`` running the workload in the background (stopped with the
        cluster); :meth:`run_endpoints` is the blocking way to run them all."""
        process = self._spawn(f"ep-{index}", self.endpoint_args(index, results))
        self._infra.append(process)
        return process.popen

    def log(self, name: str) -> str:
        """What node ``name`` has logged so far."""
        path = self.workdir / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def infrastructure(self, name: str) -> subprocess.Popen[str]:
        """The rendezvous or aggregator process called ``name``."""
        return next(p.popen for p in self._infra if p.name == name)

    def _wait_for_line(self, process: _Process, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in process.log.read_text():
                return
            if process.popen.poll() is not None:
                raise CcoError(
                    ErrorCode.INTERNAL_ERROR,
                    f"{process.name} exited with {process.popen.returncode}: {self.tail(process.log)}",
                )
            time.sleep(0.05)
        raise CcoError(ErrorCode.TIMEOUT, f"{process.name} did not report '{needle}' within {timeout} s")

    def endpoint_args(self, index: int, results: Path) -> list[str]:
        spec = self.spec
        args = [
            "--role",
            "endpoint",
            *self._common(f"ep-{index}"),
            "--rendezvous",
            f"{HOST}:{self.rendezvous_port}",
            "--group-id",
            spec.group_id,
            "--world-size",
            str(spec.endpoints),
            "--credential",
            spec.credential,
            "--rank",
            str(index),
            "--workload",
            spec.workload,
            "--rounds",
            str(spec.rounds),
            "--elements",
            str(spec.elements),
            "--results",
            str(results),
            *spec.extra_endpoint_args,
        ]
        if spec.labels:
            args += ["--labels", spec.labels[index % len(spec.labels)]]
        return args

    def run_endpoints(self, timeout: float, progress: IO[str] | None = None) -> list[Path]:
        """Run every endpoint to completion; returns their result files, by rank.

        Endpoint 0's progress lines are copied to ``progress`` as they come.
        Raises CcoError naming the endpoints that failed or did not finish.
        """
        results = [self.workdir / f"ep-{i}.result" for i in range(self.spec.endpoints)]
        if self.spec.workload == "conformance":
            results = [path.with_suffix(".npz") for path in results]
        processes = [
            self._spawn(
                f"ep-{i}",
                self.endpoint_args(i, results[i]),
                stdout=subprocess.PIPE if i == 0 and progress else None,
            )
            for i in range(self.spec.endpoints)
        ]
        deadline = time.monotonic() + timeout
        copier = None
        if progress is not None and processes[0].popen.stdout is not None:
            copier = threading.Thread(
                target=_copy_lines, args=(processes[0].popen.stdout, progress), daemon=True
            )
            copier.start()
        try:
            failed = []
            for process in processes:
                remaining = max(0.1, deadline - time.monotonic())
                try:
                    code = process.popen.wait(remaining)
                except subprocess.TimeoutExpired:
                    failed.append(f"{process.name} did not finish within {timeout} s")
                    continue
                if code != 0:
                    failed.append(f"{process.name} exited with {code}: {self.tail(process.log)}")
            if failed:
                raise CcoError(ErrorCode.ABORTED, "; ".join(failed))
        finally:
            for process in processes:
                _stop(process)
            if copier is not None:
                copier.join(timeout=5)
        return results

    @staticmethod
    def tail(log: Path, lines: int = 5) -> str:
        text = log.read_text().strip().splitlines() if log.exists() else []
        return " | ".join(text[-lines:]) or "(no output)"

    def close(self) -> None:
        """Stop rendezvous and aggregators (SIGTERM, then SIGKILL after 5 s)."""
        for process in self._infra:
            if process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
        for process in self._infra:
            _stop(process)
        self._infra.clear()

    def __enter__(self) -> LocalCluster:
        self._taken_signals = unwind_on_signals()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            for sig in self._taken_signals:
                signal.signal(sig, signal.SIG_DFL)

    @property
    def infrastructure_logs(self) -> list[Path]:
        return [process.log for process in self._infra]


def unwind_on_signals() -> list[signal.Signals]:
    """Make SIGTERM and SIGHUP end this process as Ctrl-C does, by an exception that
    unwinds through the ``with`` blocks in progress (``with LocalCluster(...)``, the
    benchmarks' clusters and stars) and so stops every node they started; the
    signals taken, which a caller may give back to their default action.  Left at
    that default they end the process at once: a demo stopped with ``kill`` left its
    rendezvous and aggregators running.  Only signals at their default action are
    taken, and only on the main thread (the only one Python delivers signals to)."""
    taken: list[signal.Signals] = []
    if threading.current_thread() is not threading.main_thread():
        return taken
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _exit_on_signal)
            taken.append(sig)
    return taken


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _stop(process: _Process) -> None:
    if process.popen.poll() is None:
        process.popen.terminate()
        try:
            process.popen.wait(5)
        except subprocess.TimeoutExpired:
            process.popen.kill()
            process.popen.wait()
    process.log_handle.close()


def _copy_lines(stream: IO[str], sink: IO[str]) -> None:
    """Copy lines until the stream ends (the process exited or was stopped)."""
    with stream:
        for line in stream:
            sink.write(line)
            sink.flush()
