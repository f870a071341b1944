"""``cco-node --role aggregator --workers W``: one node's aggregation over W processes.

An aggregator is one event loop on one thread, so it uses one core.  With W > 1,
``cco-node`` starts W ordinary aggregators instead (``python -m cco`` with options
derived from its own) and supervises them; the rendezvous sees W aggregators and
spreads groups over them like over any others (:mod:`cco.nodes.tree` prefers the
one with the most spare capacity), or spans one group's tree over several when it
has more members than one aggregator's fan-in.  Worker ``k`` (from 0) is node
``<node_id>.w<k>`` on the ``--listen`` port + k; ``--advertise`` and
``--metrics-listen``, when given, move by k too.

The supervisor passes SIGTERM and SIGINT to every worker, waits for them (then
SIGKILL) and exits 0; it passes SIGUSR1 on too, so that one signal dumps every
worker's flight recorder.  A worker that ends by itself ends the node: the supervisor
stops the others and exits non-zero, so that a service manager restarts the whole
node while the rendezvous moves its groups, as for any aggregator lost.  On Linux a
worker also gets SIGTERM if the supervisor itself dies (even by SIGKILL), so no
path leaves a worker running.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType
from typing import Any

from cco.config import OPTIONS, NodeConfig, parse_hostport
from cco.services.dump import DUMP_SIGNAL
from cco.transport import create_dev_pki
from cco.transport.certs import CA_KEY_FILE, node_paths
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.registries import Role

log = logging.getLogger("cco.node")

STOP_GRACE_S = 20.0
"""How long stopped workers have to end before SIGKILL: one dialling a lost rendezvous
finishes that attempt first (``NodeService.connect_timeout``, 10 s by default)."""

POLL_S = 0.2
"""How often the supervisor looks for a worker that ended."""

_SHIFTED = ("listen", "advertise", "metrics_listen")
"""The addresses each worker takes with its port moved by its index."""


def worker_node_id(node_id: str, index: int) -> str:
    return f"{node_id}.w{index}"


def _shift(text: str, index: int, flag: str) -> str:
    host, port = parse_hostport(text)
    if port + index > 65535:
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"{flag} {text}: worker {index} would take port {port + index}, above 65535; "
            f"choose a lower port or fewer --workers",
        )
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port + index}"


def _text(value: Any) -> str:
    """An option's value as a flag takes it (the inverse of the option's parser)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def worker_argv(cfg: NodeConfig, index: int) -> list[str]:
    """The ``cco-node`` arguments of worker ``index``: the node's own options, every one
    given as a flag (the worker reads no file and no ``CCO_*`` variable, see
    :func:`worker_environment`), with its node id and ports derived from the node's."""
    values = dict(cfg.values)
    values["node_id"] = worker_node_id(cfg.require("node_id"), index)
    for name in _SHIFTED:
        if values[name] is not None:
            values[name] = _shift(values[name], index, "--" + name.replace("_", "-"))
    values["workers"] = 1
    argv = ["--role", cfg.role]
    for option in OPTIONS:
        value = values[option.name]
        given = value is not None and value != option.default_for(cfg.role)
        if given or option.name in ("node_id", "workers"):
            argv += [option.flag, _text(value)]
    return argv


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables that set options (and without ``CCO_CONFIG`` and
    ``CCO_ROLE``): a worker's flags say everything, so ``CCO_WORKERS`` cannot make a
    worker a supervisor in turn.  Variables that are not options (``CCO_KERNELS``)
    pass."""
    drop = {option.env for option in OPTIONS} | {"CCO_CONFIG", "CCO_ROLE"}
    return {name: value for name, value in environ.items() if name not in drop}


def check_workers(cfg: NodeConfig) -> list[list[str]]:
    """Every worker's arguments, once what they need is there: a one-line error (before
    any worker starts) for what cannot work, and the certificates of a development PKI
    issued on the spot."""
    if cfg.role != "aggregator":
        raise CcoError(ErrorCode.INVALID_FIELD, f"--workers {cfg.workers} is for --role aggregator only")
    if cfg.cert is not None or cfg.key is not None:
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"--workers {cfg.workers} needs one certificate per worker: give --pki-dir, not --cert/--key "
            "(worker k uses <pki_dir>/<node_id>.w<k>.pem and .key)",
        )
    pki_dir = cfg.pki_dir
    if pki_dir is None:
        raise CcoError(ErrorCode.INVALID_FIELD, f"--workers {cfg.workers} needs --pki-dir")
    argvs = [worker_argv(cfg, k) for k in range(cfg.workers)]
    ids = [worker_node_id(cfg.require("node_id"), k) for k in range(cfg.workers)]
    try:
        missing = [node_id for node_id in ids if not node_paths(pki_dir, node_id)[0].exists()]
    except ValueError as exc:  # an id too long once the worker's suffix is added
        raise CcoError(ErrorCode.INVALID_FIELD, f"--workers {cfg.workers}: {exc}") from None
    if missing and not (pki_dir / CA_KEY_FILE).exists():
        names = " ".join(f"{node_id}:aggregator" for node_id in missing)
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"no certificate for worker {missing[0]} in {pki_dir}: issue them with "
            f"`cco-node certs --dir DIR {names}` where the CA key is, and copy them here",
        )
    if missing:
        try:
            create_dev_pki(pki_dir, [(node_id, Role.AGGREGATOR) for node_id in missing])
        except OSError as exc:  # ca.key without ca.pem, a directory not writable, ...
            raise CcoError(
                ErrorCode.INVALID_FIELD, f"cannot issue worker certificates in {pki_dir}: {exc}"
            ) from None
        log.info("issued certificates for %s in %s", ", ".join(missing), pki_dir)
    return argvs


def supervise(argvs: Sequence[list[str]], environ: Mapping[str, str]) -> int:
    """Run one worker per entry of ``argvs`` until SIGTERM or SIGINT (exit 0) or until
    one ends by itself (exit non-zero); stop every worker either way.  SIGUSR1 (a
    flight-recorder dump, :mod:`cco.services.dump`) is passed to every worker."""
    stop: list[int] = []
    dumps: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        (dumps if signum == DUMP_SIGNAL else stop).append(signum)

    workers: list[tuple[str, subprocess.Popen[bytes]]] = []
    die_with_us = _parent_death_signal(os.getpid())
    with _handling(on_signal):
        try:
            for argv in argvs:
                node_id = argv[argv.index("--node-id") + 1]
                command = [sys.executable, "-m", "cco", *argv]
                process = subprocess.Popen(command, env=dict(environ), preexec_fn=die_with_us)
                workers.append((node_id, process))
                log.info("worker %s started (pid %d)", node_id, process.pid)
            while not stop:
                while dumps:
                    _signal_running(workers, signal.Signals(dumps.pop()))
                for node_id, process in workers:
                    if process.poll() is not None:
                        log.error("worker %s %s; stopping the others", node_id, _ending(process.returncode))
                        return process.returncode if process.returncode > 0 else 1
                time.sleep(POLL_S)
            log.info("stopping %d workers (%s)", len(workers), signal.Signals(stop[0]).name)
            return 0
        finally:
            _stop(workers, signal.Signals(stop[0]) if stop else signal.SIGTERM)


def _ending(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


def _signal_running(workers: Sequence[tuple[str, subprocess.Popen[bytes]]], sig: signal.Signals) -> None:
    for _, process in workers:
        if process.poll() is None:
            process.send_signal(sig)


def _stop(workers: Sequence[tuple[str, subprocess.Popen[bytes]]], sig: signal.Signals) -> None:
    """Send ``sig`` to every worker still running, wait for them all, SIGKILL the late."""
    _signal_running(workers, sig)
    deadline = time.monotonic() + STOP_GRACE_S
    for node_id, process in workers:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("worker %s did not stop within %.0f s; killing it", node_id, STOP_GRACE_S)
            process.kill()
            process.wait()


@contextlib.contextmanager
def _handling(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT, DUMP_SIGNAL)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


_PR_SET_PDEATHSIG = 1


def _parent_death_signal(supervisor: int) -> Callable[[], None] | None:
    """What a forked worker runs before exec so that it gets SIGTERM when the supervisor
    dies, however (Linux's PR_SET_PDEATHSIG; elsewhere nothing).  A worker whose
    supervisor died before the request took effect sees another parent, and exits."""
    if sys.platform != "linux":
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def request() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != supervisor:
            os._exit(1)

    return request


__all__ = [
    "STOP_GRACE_S",
    "check_workers",
    "supervise",
    "worker_argv",
    "worker_environment",
    "worker_node_id",
]
