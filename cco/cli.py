"""``cco-node``: run a CCO node, create development certificates, or run the demo.

    cco-node --role rendezvous|aggregator|endpoint [options]   run one node
    cco-node certs --dir DIR NODE_ID:ROLE ...                   development CA and node certs
    cco-node demo [options]                                     a local cluster doing verified all-reduces
    cco-node standalone [options] [-- COMMAND ...]              a one-machine job's services (cco.standalone)

Options come from flags, CCO_* environment variables and a TOML file (--config); see
``cco-node --help``.  Errors are printed as one line naming the problem, with exit
status 2 for bad usage or configuration and 1 for a failed run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cco.wire.errors import CcoError
from cco.wire.registries import Role

SUBCOMMANDS = ("certs", "demo", "standalone")


class UsageError(Exception):
    """A command-line mistake: reported in one line with exit status 2."""


def node_parser() -> argparse.ArgumentParser:
    # Imported here, not at the top: cco.config loads the wire layer and with it
    # numpy, which must wait for single_threaded_numerics() (see main).
    from cco.config import add_arguments

    parser = argparse.ArgumentParser(
        prog="cco-node",
        description="Run a CCO node (rendezvous, aggregator or endpoint) over QUIC.",
        epilog="Other commands: `cco-node certs --help`, `cco-node demo --help`, "
        "`cco-node standalone --help`. "
        "Precedence: flags > CCO_* environment > --config TOML file > defaults.",
    )
    add_arguments(parser)
    return parser


def certs_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cco-node certs",
        description="Create (or extend) a development PKI: a group CA and one certificate per node. "
        "Not for production: keys are written unencrypted.",
    )
    parser.add_argument("--dir", type=Path, required=True, help="directory for ca.pem, ca.key and node files")
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
        written = create_dev_pki(args.dir, nodes)
    except (ValueError, FileExistsError) as exc:
        raise UsageError(str(exc)) from exc
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] == "certs":
            return _certs(argv[1:])
        if argv and argv[0] == "demo":
            from cco.demo import demo_main

            return demo_main(argv[1:])
        if argv and argv[0] == "standalone":
            from cco.standalone import standalone_main

            return standalone_main(argv[1:])
        single_threaded_numerics()
        from cco.config import resolve
        from cco.services.roles import run_role

        return run_role(resolve(node_parser().parse_args(argv)))
    except UsageError as exc:
        print(f"cco-node: {exc}", file=sys.stderr)
        return 2
    except CcoError as exc:
        print(f"cco-node: {exc}", file=sys.stderr)
        return 2 if exc.code.name == "INVALID_FIELD" else 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
