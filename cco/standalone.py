"""``cco-node standalone``: what a CCO job on one machine needs, from one command.

    cco-node standalone [--dir DIR] [--listen HOST:PORT] [--endpoints N] [-- COMMAND ...]

It writes a development PKI to ``DIR/pki`` (a CA, the rendezvous's and the aggregators'
certificates, and ``ep-0`` .. ``ep-<N-1>`` for the endpoints), starts a rendezvous and
an aggregator as ``cco-node`` processes, and writes ``DIR/cco.toml``: the rendezvous
address, the PKI directory and the datagram size, which is all an endpoint needs
besides its node id.  Then it either runs COMMAND (``torchrun ...``, a script) with
``CCO_CONFIG`` pointing at that file, stopping the services when the command ends and
exiting with its status, as ``torchrun --standalone`` does for its own rendezvous; or,
without a command, prints the variables to export and serves until it is stopped
(Ctrl-C, SIGTERM).

Workers find everything through ``CCO_CONFIG`` (``cco.torch`` reads it, as ``cco-node``
does); ``CCO_RENDEZVOUS`` and ``CCO_PKI_DIR`` are set as well, for library code
(:class:`cco.GroupSpec` takes its default rendezvous from the first).  Nodes started on
a loopback address send 16000-byte datagrams, as loopback allows and a real link does
not; their logs are ``DIR/rendezvous.log`` and ``DIR/agg-<i>.log``.

One group setting differs from a node's defaults, for training processes: the
collective timeout is torch's default process-group timeout (30 minutes) rather than
30 s, since it bounds how long one rank may go without calling the collective the
others are in (an evaluation pass on rank 0, a checkpoint).  The liveness window is
the rendezvous's default (15 s, :data:`cco.wire.messages.DEFAULT_LIVENESS_MS`):
a process that starts torch, or trains beside other jobs on busy cores, may stall for
seconds without losing its place; ``--liveness-ms`` changes it.

Several machines (see ``docs`` in the README): run this on the machine the others
reach, with ``--listen`` on its address, issue the certificates every rank needs
(``--endpoints``), and copy to each other machine ``ca.pem`` with only the certificates
and keys of the ranks it runs; workers there set ``CCO_RENDEZVOUS`` and ``CCO_PKI_DIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from cco.config import parse_hostport
from cco.transport import create_dev_pki
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import DEFAULT_LIVENESS_MS
from cco.wire.registries import Role

LOOPBACK_DATAGRAM_SIZE = 16000
"""Loopback carries 16000-byte datagrams (the QUIC stacks' cost is per packet); a real
link takes the nodes' own default, which fits a 1500-byte MTU."""

TORCH_DEFAULT_TIMEOUT_MS = 30 * 60 * 1000
"""torch.distributed's default process-group timeout, for the group's collectives."""

HEARTBEAT_MS = 1000
"""Heartbeats every second, as any node: the liveness window, not the interval, says
how long a stalled process keeps its place."""

CONFIG_FILE = "cco.toml"


@dataclass(frozen=True, slots=True, kw_only=True)
class StandaloneSpec:
    """What to bring up."""

    directory: Path
    listen: str = "127.0.0.1:4433"
    """Where the rendezvous listens; port 0 takes a free one.  Aggregators listen on
    free ports of the same host."""
    endpoints: int = 8
    aggregators: int = 1
    max_fan_in: int = 64
    operation_timeout_ms: int = TORCH_DEFAULT_TIMEOUT_MS
    heartbeat_ms: int = HEARTBEAT_MS
    liveness_ms: int = DEFAULT_LIVENESS_MS
    node_args: tuple[str, ...] = field(default=())
    """More ``cco-node`` flags for every service (``--quic-backend aioquic``, ...)."""

    def __post_init__(self) -> None:
        _split(self.listen)  # ValueError: expected HOST:PORT
        if self.endpoints < 0 or self.aggregators < 1 or self.max_fan_in < 2:
            raise ValueError("endpoints must be >= 0, aggregators >= 1 and max_fan_in >= 2")
        if self.liveness_ms < 2 * self.heartbeat_ms:
            raise ValueError(
                f"liveness_ms {self.liveness_ms} is under two heartbeat intervals ({self.heartbeat_ms} ms)"
            )


@dataclass(frozen=True, slots=True)
class Job:
    """What workers need to reach a running standalone job."""

    rendezvous: str
    pki_dir: Path
    config: Path

    def environment(self) -> dict[str, str]:
        """The variables a worker's environment gets (``CCO_CONFIG`` is the one that counts)."""
        return {
            "CCO_CONFIG": str(self.config),
            "CCO_RENDEZVOUS": self.rendezvous,
            "CCO_PKI_DIR": str(self.pki_dir),
        }


class Standalone:
    """A PKI, a rendezvous and aggregators for one job; a context manager.

    :meth:`start` returns once every aggregator has registered; :meth:`close` stops
    the services (SIGTERM, then SIGKILL after 5 s)."""

    def __init__(self, spec: StandaloneSpec) -> None:
        self.spec = spec
        self.directory = spec.directory.resolve()
        self.pki = self.directory / "pki"
        self._processes: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []

    def start(self, timeout: float = 60.0) -> Job:
        spec = self.spec
        self.directory.mkdir(parents=True, exist_ok=True)
        host, port = _listen(spec.listen)
        aggregators = [f"agg-{i}" for i in range(spec.aggregators)]
        nodes = [("rendezvous", Role.RENDEZVOUS)] + [(a, Role.AGGREGATOR) for a in aggregators]
        create_dev_pki(self.pki, nodes + [(f"ep-{i}", Role.ENDPOINT) for i in range(spec.endpoints)])
        rendezvous = f"{_bracketed(host)}:{port}"
        common = ["--pki-dir", str(self.pki), *self._datagram_args(host), *spec.node_args]
        args = [
            "--role",
            "rendezvous",
            "--node-id",
            "rendezvous",
            "--listen",
            rendezvous,
            "--store",
            ":memory:",
        ]
        args += ["--operation-timeout-ms", str(spec.operation_timeout_ms)]
        args += ["--heartbeat-ms", str(spec.heartbeat_ms), "--liveness-ms", str(spec.liveness_ms)]
        try:
            self._spawn("rendezvous", [*args, *common])
            self._wait_for("rendezvous", "listening", timeout)
            for node_id in aggregators:
                listen = f"{_bracketed(host)}:{_free_udp_port(host)}"
                args = ["--role", "aggregator", "--node-id", node_id, "--listen", listen]
                args += ["--rendezvous", rendezvous, "--max-fan-in", str(spec.max_fan_in)]
                self._spawn(node_id, [*args, *common])
            for node_id in aggregators:
                self._wait_for(node_id, "registered", timeout)
        except BaseException:
            self.close()
            raise
        config = self.directory / CONFIG_FILE
        lines = [f'rendezvous = "{rendezvous}"', f"pki_dir = {_toml_string(str(self.pki))}"]
        lines += [f"liveness_ms = {spec.liveness_ms}"]  # the workers' QUIC idle timeout outlasts it
        lines += [f"max_datagram_size = {LOOPBACK_DATAGRAM_SIZE}"] if _is_loopback(host) else []
        config.write_text("\n".join(lines) + "\n")
        return Job(rendezvous=rendezvous, pki_dir=self.pki, config=config)

    def _datagram_args(self, host: str) -> list[str]:
        return ["--max-datagram-size", str(LOOPBACK_DATAGRAM_SIZE)] if _is_loopback(host) else []

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.directory / f"{name}.log", "wb")  # noqa: SIM115 - closed by close()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for variable in ("CCO_CONFIG", "CCO_ROLE", "CCO_NODE_ID"):  # a worker's settings are not a node's
            env.pop(variable, None)
        process = subprocess.Popen(
            [sys.executable, "-m", "cco.cli", *args], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        self._processes.append((name, process, log))

    def log(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _wait_for(self, name: str, needle: str, timeout: float) -> None:
        process = next(p for n, p, _ in self._processes if n == name)
        deadline = time.monotonic() + timeout
        while needle not in self.log(name):
            if process.poll() is not None:
                last = (self.log(name).strip().splitlines() or ["(no output)"])[-1]
                raise CcoError(ErrorCode.INTERNAL_ERROR, f"{name} exited with {process.returncode}: {last}")
            if time.monotonic() > deadline:
                raise CcoError(ErrorCode.TIMEOUT, f"{name} did not report '{needle}' within {timeout} s")
            time.sleep(0.05)

    def alive(self) -> bool:
        return all(process.poll() is None for _, process, _ in self._processes)

    def close(self) -> None:
        for _, process, _ in self._processes:
            if process.poll() is None:
                process.terminate()
        for _, process, log in self._processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()
        self._processes.clear()

    def __enter__(self) -> Standalone:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _split(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (port 0 allowed) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if port == "0" and sep and host:
        return host.strip("[]"), 0
    return parse_hostport(text)


def _listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` with port 0 replaced by a free UDP port of that host."""
    host, port = _split(text)
    return (host, port) if port else (host, _free_udp_port(host))


def _free_udp_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _toml_string(text: str) -> str:
    """A TOML literal string (no escapes), or a basic one when it holds a quote."""
    return f"'{text}'" if "'" not in text else '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cco-node standalone",
        description="Bring up what a CCO job on one machine needs (development certificates, a "
        "rendezvous, an aggregator), then run COMMAND with CCO_CONFIG set, or serve until stopped.",
        epilog="Example: cco-node standalone -- torchrun --nproc-per-node 4 train.py  "
        "(the script calls torch.distributed.init_process_group('cco') after `import cco.torch`).",
    )
    parser.add_argument(
        "--dir", type=Path, help="keep certificates, cco.toml and logs here (default: a temporary directory)"
    )
    parser.add_argument(
        "--listen",
        default="127.0.0.1:4433",
        help="HOST:PORT for the rendezvous; port 0 takes a free one (default 127.0.0.1:4433)",
    )
    parser.add_argument(
        "--endpoints", type=int, default=8, help="endpoint certificates ep-0 .. ep-<N-1> to issue (default 8)"
    )
    parser.add_argument("--aggregators", type=int, default=1, help="aggregator processes (default 1)")
    parser.add_argument(
        "--max-fan-in", type=int, default=64, help="endpoints one aggregator serves per group (default 64)"
    )
    parser.add_argument(
        "--operation-timeout-ms",
        type=int,
        default=TORCH_DEFAULT_TIMEOUT_MS,
        help="how long a collective may wait for its ranks (default: 30 minutes, torch's)",
    )
    parser.add_argument(
        "--heartbeat-ms",
        type=int,
        default=HEARTBEAT_MS,
        help="heartbeat interval (default 1000)",
    )
    parser.add_argument(
        "--liveness-ms",
        type=int,
        default=DEFAULT_LIVENESS_MS,
        help="silence after which a rank is lost: longer than a step may stall a process "
        f"(default {DEFAULT_LIVENESS_MS}, torchelastic's 3 keep-alives 5 s apart)",
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...] to run with CCO_CONFIG set"
    )
    return parser


def standalone_main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    with _directory(args.dir) as directory:
        try:
            spec = StandaloneSpec(
                directory=directory,
                listen=args.listen,
                endpoints=args.endpoints,
                aggregators=args.aggregators,
                max_fan_in=args.max_fan_in,
                operation_timeout_ms=args.operation_timeout_ms,
                heartbeat_ms=args.heartbeat_ms,
                liveness_ms=args.liveness_ms,
            )
        except ValueError as exc:
            print(f"cco-node standalone: {exc}", file=sys.stderr)
            return 2
        with _stop_on_signals(), Standalone(spec) as services:
            job = services.start()
            if command:
                return _run(command, job)
            for name, value in job.environment().items():
                print(f"export {name}={value}")
            print(f"# serving (logs in {directory}); Ctrl-C to stop", flush=True)
            while services.alive():
                time.sleep(0.5)
            print("cco-node standalone: a service exited; see its log", file=sys.stderr)
            return 1


def _run(command: list[str], job: Job) -> int:
    try:
        child = subprocess.Popen(command, env={**os.environ, **job.environment()})
    except OSError as exc:
        print(f"cco-node standalone: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    try:
        return child.wait()
    finally:
        if child.poll() is None:  # stopped ourselves (Ctrl-C, SIGTERM): stop the command first
            child.terminate()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


@contextlib.contextmanager
def _directory(given: Path | None) -> Iterator[Path]:
    if given is not None:
        yield given
        return
    path = Path(tempfile.mkdtemp(prefix="cco-job-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP end the launcher as Ctrl-C does: by an exception that unwinds
    through the ``with`` blocks, so the command and every service are stopped."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
