"""``cco-node``: run a CCO node, create development certificates, or run the demo.

    cco-node --role rendezvous|aggregator|endpoint [options]   run one node
    cco-node certs --dir DIR NODE_ID:ROLE ...                   development CA and node certs
    cco-node demo [options]                                     a local cluster doing verified all-reduces
    cco-node standalone [options] [-- COMMAND ...]              a one-machine job's services (cco.standalone)
    cco-node status --rendezvous HOST:PORT [options]            what a live node is doing
    cco-node trace-analyze DUMP ...                             which rank a hung collective waits for

Options come from flags, CCO_* environment variables and a TOML file (--config); see
``cco-node --help``.  Every mistake ends in one line on stderr naming its cause (and
the file, address or option), with exit status 2 for bad usage or configuration and
1 for a failed run; nothing is left running.  A node's credentials are checked before
it starts, so a wrong file is named at once rather than refused by a peer later.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from cco.wire.errors import CcoError
from cco.wire.registries import ALPN, Role

if TYPE_CHECKING:
    from cco.config import NodeConfig

USAGE = """\
usage: cco-node --role rendezvous|aggregator|endpoint [options]   run one node
       cco-node certs --dir DIR [--force] NODE_ID:ROLE ...         create development certificates
       cco-node demo [options]                                     a local cluster doing verified all-reduces
       cco-node standalone [options] [-- COMMAND ...]              a one-machine job's certs and services
       cco-node status --rendezvous HOST:PORT [options]            what a live node is doing
       cco-node trace-analyze DUMP ...                             which rank a hung collective waits for
       cco-node --version

New here? Run `cco-node demo`.  `cco-node --help` and `cco-node COMMAND --help`
(certs, demo, standalone, status, trace-analyze) describe every option."""


class UsageError(Exception):
    """A command-line mistake: reported in one line with exit status 2."""


class RunFailure(Exception):
    """A run that could not go on (an address in use, ...): one line, exit status 1."""


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose mistakes end in one line (argparse prints its usage too)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def version_text() -> str:
    """What ``--version`` prints: the package, the protocol it speaks and its QUIC stacks."""
    stacks = ", ".join(f"{name} {_installed(name)}" for name in ("qh3", "aioquic"))
    return f"cco-node {_installed('cco')} (protocol {ALPN}; QUIC {stacks}; Python {sys.version.split()[0]})"


def _installed(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def node_parser() -> argparse.ArgumentParser:
    # Imported here, not at the top: cco.config loads the wire layer and with it
    # numpy, which must wait for single_threaded_numerics() (see main).
    from cco.config import add_arguments

    parser = OneLineParser(
        prog="cco-node",
        description="Run a CCO node (rendezvous, aggregator or endpoint) over QUIC. "
        "New here? `cco-node demo` runs a whole cluster on this machine.",
        epilog="Other commands: `cco-node certs --help`, `cco-node demo --help`, `cco-node status --help`, "
        "`cco-node trace-analyze --help`. "
        "Precedence: flags > CCO_* environment > --config TOML file > defaults; relative paths "
        "in the TOML file are relative to that file.  Exit status: 0 done (or stopped by "
        "SIGINT/SIGTERM), 1 a failed run, 2 bad usage or configuration (including credentials, "
        "checked at start), 3 an aggregator whose registration the rendezvous refused.",
    )
    parser.add_argument("--version", action="version", version=version_text())
    add_arguments(parser)
    return parser


def certs_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="cco-node certs",
        description="Create (or extend) a development PKI: a group CA and one certificate per node. "
        "The CA in DIR is reused if it is there.  Not for production: keys are written unencrypted.",
    )
    parser.add_argument("--dir", type=Path, required=True, help="directory for ca.pem, ca.key and node files")
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace the key and certificate of a node that already has them (by default that is "
        "refused: nodes already deployed would stop authenticating)",
    )
    parser.add_argument(
        "nodes",
        nargs="+",
        metavar="NODE_ID:ROLE",
        help="node id (lowercase letters, digits, '-' and '.') and role (rendezvous, aggregator, endpoint)",
    )
    return parser


def _certs(argv: list[str]) -> int:
    from cco.transport import create_dev_pki
    from cco.transport.certs import is_valid_node_id

    args = certs_parser().parse_args(argv)
    nodes: list[tuple[str, Role]] = []
    for item in args.nodes:
        node_id, _, role = item.partition(":")
        if not is_valid_node_id(node_id):
            raise UsageError(f"{item!r}: node ids are lowercase letters, digits, '-' and '.'")
        try:
            nodes.append((node_id, Role[role.upper()]))
        except KeyError:
            raise UsageError(f"{item!r}: role must be rendezvous, aggregator or endpoint") from None
    try:
        written = create_dev_pki(args.dir, nodes, replace=args.force)
    except FileExistsError as exc:
        raise UsageError(f"{exc}; --force replaces them (nodes using the old ones stop working)") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise RunFailure(f"{args.dir}: {exc.strerror}") from None
    for path in written:
        print(path)
    return 0


def single_threaded_numerics() -> None:
    """One BLAS thread per node process, unless the environment says otherwise.

    A node is one event loop on one thread, and its array work is too short to gain
    from BLAS threads, which then only spin against the node's own loop and its
    neighbours on the same cores (when the MAC still used float products, tagging a
    64 Ki-element chunk on two busy cores took 19.6 ms with OpenBLAS's default
    threads and 13.5 ms with one).  Must run before numpy is first imported:
    OpenBLAS sizes its thread pool when it is loaded, so this module imports
    nothing that loads numpy until :func:`main` has called this."""
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")


def checked(cfg: NodeConfig) -> NodeConfig:
    """``cfg`` with its credentials checked as a peer would check them, and the
    rendezvous's default store filled in (it depends on the group CA)."""
    import datetime

    from cryptography.hazmat.primitives import hashes

    from cco.config import NodeConfig, default_store_path
    from cco.services.roles import transport_config
    from cco.transport.certs import check_node_credentials, load_certificate

    transport = transport_config(cfg)
    now = datetime.datetime.now(datetime.UTC)
    role = Role[cfg.role.upper()]
    check_node_credentials(transport.ca_file, transport.cert_file, transport.key_file, cfg.node_id, role, now)
    if role is not Role.ENDPOINT:
        _check_listen(cfg)
    if cfg.metrics_listen is not None:
        _check_metrics_listen(cfg.metrics_listen)
    if role is Role.RENDEZVOUS and cfg.store is None:
        fingerprint = load_certificate(Path(transport.ca_file)).fingerprint(hashes.SHA256()).hex()
        store = default_store_path(cfg.node_id, cfg.listen, fingerprint, os.environ)
        return NodeConfig(role=cfg.role, values={**cfg.values, "store": str(store)})
    return cfg


def _check_listen(cfg: NodeConfig) -> None:
    """Bind ``--listen`` for a moment: an address in use or not of this host is named
    now, in one line, rather than after the node has started (the node binds it again,
    and a process that took it in between is reported the same way)."""
    from cco.config import parse_hostport

    host, port = parse_hostport(cfg.listen)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        with socket.socket(infos[0][0], socket.SOCK_DGRAM) as probe:
            probe.bind(infos[0][4])
    except OSError as exc:
        raise RunFailure(_os_failure(exc, cfg)) from None


def _check_metrics_listen(address: str) -> None:
    """The metrics need prometheus-client and a TCP address this host can listen on."""
    from cco.config import parse_hostport

    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise UsageError(
            "--metrics-listen needs the prometheus-client package: pip install 'cco[metrics]'"
        ) from None
    host, port = parse_hostport(address)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(infos[0][4])
    except OSError as exc:
        reason = (
            "the address is already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        )
        raise RunFailure(
            f"cannot serve metrics on {address} (TCP): {reason.lower()}; choose another with --metrics-listen"
        ) from None


def _run_node(argv: list[str]) -> int:
    single_threaded_numerics()
    from cco.config import resolve
    from cco.logs import configure_logging

    cfg = resolve(node_parser().parse_args(argv))
    configure_logging(cfg.log_level, cfg.log_format)
    if cfg.workers > 1:
        return _run_workers(cfg)
    cfg = checked(cfg)
    from cco.launch import run_role

    try:
        return run_role(cfg)
    except OSError as exc:
        raise RunFailure(_os_failure(exc, cfg)) from None


def _run_workers(cfg: NodeConfig) -> int:
    """``--workers W``: check every worker as a node is checked (credentials, a free
    ``--listen``), then start and supervise them (:mod:`cco.workers`)."""
    from cco.config import resolve
    from cco.workers import check_workers, supervise, worker_environment

    environ = worker_environment(os.environ)
    argvs = check_workers(cfg)
    for argv in argvs:
        checked(resolve(node_parser().parse_args(argv), environ))
    try:
        return supervise(argvs, environ)
    except OSError as exc:
        raise RunFailure(_os_failure(exc, cfg)) from None


def _os_failure(exc: OSError, cfg: NodeConfig) -> str:
    """One line for an operating-system error that stopped a node."""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {cfg.listen} (UDP): the address is already in use by another "
            "process; choose another with --listen"
        )
    if exc.errno in (errno.EADDRNOTAVAIL, errno.EACCES) or isinstance(exc, socket.gaierror):
        return f"cannot listen on {cfg.listen} (UDP): {reason.lower()}"
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{cfg.role} {cfg.node_id}: {reason}{where}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if not argv:
            print(USAGE, file=sys.stderr)
            return 2
        if argv[0] == "certs":
            return _certs(argv[1:])
        if argv[0] == "demo":
            from cco.demo import demo_main

            return demo_main(argv[1:])
        if argv[0] == "standalone":
            from cco.standalone import standalone_main

            return standalone_main(argv[1:])
        if argv[0] == "status":
            from cco.status_cli import status_main

            return status_main(argv[1:], OneLineParser)
        if argv[0] == "trace-analyze":
            from cco.trace import trace_main

            return trace_main(argv[1:], OneLineParser)
        return _run_node(argv)
    except UsageError as exc:
        print(f"cco-node: {exc}", file=sys.stderr)
        return 2
    except RunFailure as exc:
        print(f"cco-node: {exc}", file=sys.stderr)
        return 1
    except CcoError as exc:
        usage = exc.code.name == "INVALID_FIELD"  # the code adds nothing to a configuration mistake
        print(f"cco-node: {exc.detail if usage else exc}", file=sys.stderr)
        return 2 if usage else 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
