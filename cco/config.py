"""Node configuration: defaults, a TOML file, environment variables and flags.

Precedence, lowest to highest: built-in defaults, the TOML file named by
``--config`` (or ``CCO_CONFIG``), environment variables ``CCO_<OPTION>``, then
command-line flags.  Every option is declared once in :data:`OPTIONS`, which drives
the argument parser, the ``--help`` text, the environment lookup and the TOML keys,
so the four cannot disagree.
"""

from __future__ import annotations

import argparse
import difflib
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cco.wire.blockscale import DEFAULT_BLOCK_ELEMENTS
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import Struct, UInt
from cco.wire.messages import (
    DEFAULT_LIVENESS_MS,
    LOSS_INTERVALS,
    AggregatorRegister,
    GroupParams,
    JoinRequest,
)

MAX_BUSY_POLL_US = 1_000_000
"""The largest busy-poll budget a node accepts (``busy_poll_us``): a second of polling
is already far past any wait that polling shortens (:mod:`cco.services.polling`)."""


def parse_hostport(text: str) -> tuple[str, int]:
    """``host:port`` (IPv6 as ``[addr]:port``) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _hostport(text: str) -> str:
    """A ``HOST:PORT`` option: checked when the configuration is read, kept as written."""
    parse_hostport(text)
    return text


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean, got {text!r}")


def _labels(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _one_of(*choices: str) -> Callable[[str], str]:
    """A parser accepting exactly one of ``choices`` (case-insensitive)."""

    def parse(text: str) -> str:
        lowered = text.strip().lower()
        if lowered not in choices:
            raise ValueError(f"{text!r} is not one of {', '.join(choices)}")
        return lowered

    return parse


@dataclass(frozen=True, slots=True)
class Option:
    """One configuration option, known under the same name everywhere."""

    name: str  # attribute and TOML key; flag is --name-with-dashes; env is CCO_NAME
    help: str
    default: Any
    parse: Callable[[str], Any] = str
    roles: tuple[str, ...] = ("rendezvous", "aggregator", "endpoint")
    wire: tuple[type[Struct], str] | None = None
    """The message field that carries this value: its range is the option's, so a node
    never starts with a value it could not send (and would only learn so later)."""
    minimum: int | None = None
    """For a count or a duration that is not sent: the least value that means anything."""
    maximum: int | None = None
    """For such a value: the largest accepted."""
    role_defaults: Mapping[str, Any] | None = None
    """Where the default differs by role: the role's default (``default`` for the others)."""
    path: bool = False
    """A file or directory: a relative path in a TOML file is relative to that file."""

    def default_for(self, role: str) -> Any:
        if self.role_defaults is not None and role in self.role_defaults:
            return self.role_defaults[role]
        return self.default

    @property
    def bounds(self) -> tuple[int, int] | None:
        """The inclusive range of ``wire``'s field, if the option has one."""
        if self.wire is None:
            return None
        cls, name = self.wire
        kind = dict(cls.wire_fields())[name].kind
        assert isinstance(kind, UInt), f"{cls.__name__}.{name} is not an unsigned integer"
        return kind.minimum, kind.maximum

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "CCO_" + self.name.upper()


R, A, E = "rendezvous", "aggregator", "endpoint"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")

OPTIONS: tuple[Option, ...] = (
    Option("node_id", "this node's id; must equal the CN of its certificate", None),
    Option(
        "pki_dir",
        "directory with ca.pem and <node_id>.pem / <node_id>.key (as written by `cco-node certs`)",
        None,
        Path,
        path=True,
    ),
    Option("ca", "group CA certificate (PEM); default <pki_dir>/ca.pem", None, Path, path=True),
    Option("cert", "this node's certificate (PEM); default <pki_dir>/<node_id>.pem", None, Path, path=True),
    Option("key", "this node's private key (PEM); default <pki_dir>/<node_id>.key", None, Path, path=True),
    Option(
        "listen",
        "HOST:PORT (UDP) to accept QUIC connections on",
        "127.0.0.1:4433",
        _hostport,
        (R, A),
        role_defaults={A: "127.0.0.1:4434"},
    ),
    Option("advertise", "HOST:PORT children should connect to; default: --listen", None, _hostport, (A,)),
    Option(
        "metrics_listen",
        "HOST:PORT (TCP) to serve Prometheus metrics on, at /metrics (needs the prometheus-client "
        "package: pip install 'cco[metrics]'; default: no metrics)",
        None,
        _hostport,
        (R, A, E),
    ),
    Option(
        "recorder_entries",
        "operations and chunks the flight recorder keeps (dumped on SIGUSR1 to the state directory, "
        "read by `cco-node status`)",
        4096,
        int,
        (R, A, E),
        minimum=1,
        maximum=1 << 20,
    ),
    Option(
        "status_listen",
        "HOST:PORT (UDP) where this endpoint answers `cco-node status` (endpoints accept no other "
        "connections; default: none, a rendezvous and an aggregator answer on --listen)",
        None,
        _hostport,
        (E,),
    ),
    Option("rendezvous", "HOST:PORT of the rendezvous", "127.0.0.1:4433", _hostport, (A, E)),
    Option("rendezvous_id", "node id the rendezvous certificate must carry", "rendezvous", str, (A, E)),
    Option("labels", "comma-separated location labels used for tree planning", (), _labels, (A, E)),
    Option(
        "capacity",
        "groups this aggregator serves at once",
        16,
        int,
        (A,),
        wire=(AggregatorRegister, "capacity"),
    ),
    Option(
        "max_fan_in",
        "children one aggregator accepts per group",
        8,
        int,
        (A,),
        wire=(AggregatorRegister, "max_fan_in"),
    ),
    Option(
        "workers",
        "aggregator processes this node runs, to use several cores: worker k (from 0) is node "
        "<node_id>.w<k> on the --listen port + k (--advertise and --metrics-listen ports + k too), "
        "with certificate <pki_dir>/<node_id>.w<k>.pem, issued on the spot where the PKI directory "
        "holds the CA key; the other options pass to every worker unchanged",
        1,
        int,
        (A,),
        minimum=1,
        maximum=64,
    ),
    Option(
        "chunk_elements",
        "elements per chunk for new groups",
        32768,
        int,
        (R,),
        wire=(GroupParams, "chunk_elements"),
    ),
    Option(
        "scaled_chunk_elements",
        "largest chunk, in elements, that the ranks of a float SUM or AVG of a new group may agree "
        "when their paths are fast (a multiple of 256, the block size; 0: never larger than "
        "--chunk-elements)",
        131072,
        int,
        (R,),
        minimum=0,
        maximum=1 << 20,
    ),
    Option(
        "window", "chunks in flight per operation for new groups", 3, int, (R,), wire=(GroupParams, "window")
    ),
    Option(
        "heartbeat_ms",
        "heartbeat interval in milliseconds",
        1000,
        int,
        (R,),
        wire=(GroupParams, "heartbeat_interval_ms"),
    ),
    Option(
        "liveness_ms",
        "milliseconds of silence after which a member of a new group is lost, and it counts the "
        "rendezvous lost: longer than a training step may stall the process (at least two heartbeat "
        "intervals; default 15000, after torchelastic's 3 keep-alives 5 s apart, or 3 heartbeat "
        "intervals if longer); an endpoint keeps its connections' QUIC idle timeout above the window "
        "it expects",
        None,
        int,
        (R, E),
        wire=(GroupParams, "liveness_ms"),
    ),
    Option(
        "operation_timeout_ms",
        "milliseconds a collective may go without progress (a slot at an aggregator, a chunk at an endpoint)",
        30_000,
        int,
        (R,),
        wire=(GroupParams, "operation_timeout_ms"),
    ),
    Option(
        "dynamic_groups",
        "create a group on its first join (else only --group-id is served)",
        True,
        _bool,
        (R,),
    ),
    Option(
        "store",
        "SQLite file keeping groups, members, epochs, trees and aggregator registrations across a "
        "restart; ':memory:' keeps nothing (default: rendezvous-<node_id>-<port>-<CA fingerprint>"
        ".sqlite3 in $STATE_DIRECTORY, as systemd's StateDirectory= sets it, else in "
        "$XDG_STATE_HOME/cco, else in ~/.local/state/cco: one file per rendezvous identity, address "
        "and group CA, so that a restart carries on from its own state and an unrelated job never "
        "restores another's groups)",
        None,
        str,
        (R,),
        path=True,
    ),
    Option(
        "resume_grace_ms",
        "after a restart from the store, milliseconds members and aggregators have to come back "
        "before they are lost (default: the liveness window + 9 s, i.e. 24 s)",
        None,
        int,
        (R,),
        minimum=0,
    ),
    Option("group_id", "group to join (32 hex digits)", None, str, (R, E)),
    Option("world_size", "members in the group", None, int, (R, E), wire=(JoinRequest, "world_size")),
    Option("credential", "group join credential (text)", "", str, (R, E)),
    Option(
        "rank",
        "rank to request; default: assigned by the rendezvous",
        None,
        int,
        (E,),
        wire=(JoinRequest, "rank"),
    ),
    Option("rounds", "endpoint workload: all-reduce rounds to run", 3, int, (E,), minimum=0),
    Option("elements", "endpoint workload: elements per all-reduce", 1 << 16, int, (E,), minimum=0),
    Option(
        "workload",
        "endpoint workload: 'allreduce' rounds or the 'conformance' suite",
        "allreduce",
        _one_of("allreduce", "conformance"),
        (E,),
    ),
    Option(
        "dtype",
        "endpoint workload: element type of the all-reduce rounds (float32, int32, ...)",
        "float32",
        str,
        (E,),
    ),
    Option(
        "width",
        "endpoint workload: bits per float on the wire (8, 16, 32, 64); default the dtype's",
        None,
        int,
        (E,),
    ),
    Option(
        "quorum",
        "endpoint workload: run the all-reduce rounds under the quorum policy, completing with at "
        "least this many ranks (default: strict, every member)",
        None,
        int,
        (E,),
        minimum=1,
    ),
    Option(
        "quorum_wait_ms",
        "endpoint workload: with --quorum, how long aggregators wait for the late ranks",
        200,
        int,
        (E,),
        minimum=0,
    ),
    Option(
        "results",
        "endpoint workload: write results to this file (JSON for allreduce, .npz for conformance)",
        None,
        Path,
        (E,),
        path=True,
    ),
    Option("max_datagram_size", "QUIC datagram size; loopback and jumbo links allow up to ~16000", 1452, int),
    Option(
        "quic_backend",
        "QUIC implementation: 'qh3' (native packet processing, several times less CPU per "
        "packet) or 'aioquic' (pure Python); the wire is the same",
        "qh3",
        _one_of("qh3", "aioquic"),
    ),
    Option(
        "busy_poll_us",
        "microseconds the event loop keeps polling for datagrams before it sleeps, yielding its "
        "core to any other process that wants it: collectives finish sooner where waking a "
        "sleeping process is slow (virtual machines), for CPU spent polling; 0 sleeps at once",
        1000,
        int,
        minimum=0,
        maximum=MAX_BUSY_POLL_US,
        role_defaults={R: 0},
    ),
    Option("qlog_dir", "write qlog traces to this directory", None, Path, path=True),
    Option(
        "keylog_file",
        "append TLS secrets to this file (for Wireshark; anyone who reads it can decrypt the traffic)",
        None,
        Path,
        path=True,
    ),
    Option(
        "log_level",
        "logging level: debug, info, warning or error (the QUIC libraries' own per-connection "
        "messages are shown at debug only)",
        "info",
        _one_of(*LOG_LEVELS),
    ),
    Option(
        "log_format",
        "log lines as 'text' or as 'json' (one object per line, for log shippers)",
        "text",
        _one_of(*LOG_FORMATS),
    ),
)

OTHER_VARIABLES = {
    "CCO_ROLE": "the role, as --role",
    "CCO_CONFIG": "the TOML file, as --config",
    "CCO_KERNELS": "'numpy' keeps the per-chunk arithmetic in numpy where numba is installed",
    "CCO_INTEROP_FAULT": "makes a `cco-interop live` adapter misbehave on purpose (tests only)",
    "CCO_STRIPES": "the cco torch backend's process groups cut over this many groups (Options.stripes)",
}
"""The ``CCO_*`` environment variables that are not options; any other one that is
not an option's is refused, so that a misspelled variable is not silently ignored."""

_BY_NAME = {option.name: option for option in OPTIONS}


def default_store_path(node_id: str, listen: str, ca_fingerprint: str, environ: Mapping[str, str]) -> Path:
    """Where a rendezvous keeps its state when ``--store`` is not given.

    The directory is the one the service manager gave it (``$STATE_DIRECTORY``, set
    by systemd's ``StateDirectory=``), else the user's state directory
    (``$XDG_STATE_HOME/cco``, else ``~/.local/state/cco``).  The file is named by
    what makes a rendezvous the same one again after a restart, its node id, its
    port and its group CA (the first 16 hex digits of the CA certificate's SHA-256),
    so that a restarted rendezvous carries on from its own state while another job
    on the same host, with the same node id but another port or another CA, never
    restores the groups of this one."""
    _, port = parse_hostport(listen)
    return state_directory(environ) / f"rendezvous-{node_id}-{port}-{ca_fingerprint[:16]}.sqlite3"


def state_directory(environ: Mapping[str, str]) -> Path:
    """Where a node keeps what it writes for later (a rendezvous's store, flight-recorder
    dumps): ``$STATE_DIRECTORY`` (systemd's ``StateDirectory=``), else
    ``$XDG_STATE_HOME/cco``, else ``~/.local/state/cco``."""
    if environ.get("STATE_DIRECTORY"):
        return Path(environ["STATE_DIRECTORY"].split(":")[0])
    if environ.get("XDG_STATE_HOME"):
        return Path(environ["XDG_STATE_HOME"]) / "cco"
    return Path.home() / ".local" / "state" / "cco"


@dataclass(frozen=True)
class NodeConfig:
    """The resolved configuration of one node: ``values[name]`` for every option."""

    role: str
    values: Mapping[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    def require(self, name: str) -> Any:
        value = self.values.get(name)
        if value is None:
            option = _BY_NAME[name]
            raise CcoError(
                ErrorCode.INVALID_FIELD,
                f"{option.flag} (or {option.env}, or '{name}' in the config file) is required "
                f"for role {self.role}",
            )
        return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare every option as a flag; defaults are applied later, by precedence."""
    parser.add_argument("--role", choices=(R, A, E), help="which node to run (env CCO_ROLE)")
    parser.add_argument("--config", type=Path, help="TOML file with options (env CCO_CONFIG)")
    for option in OPTIONS:
        roles = "" if len(option.roles) == 3 else f" [{'/'.join(option.roles)}]"
        if option.bounds is not None:
            bounds = f" ({option.bounds[0]} to {option.bounds[1]})"
        elif option.minimum is not None and option.maximum is not None:
            bounds = f" ({option.minimum} to {option.maximum})"
        else:
            bounds = "" if option.minimum is None else f" (at least {option.minimum})"
        defaults = [] if option.default in (None, ()) else [str(option.default)]
        defaults += [f"{value} for the {role}" for role, value in (option.role_defaults or {}).items()]
        default = f" (default: {'; '.join(defaults)})" if defaults else ""
        parser.add_argument(
            option.flag,
            dest=option.name,
            default=None,
            metavar=option.name.upper(),
            help=f"{option.help}{roles}{bounds}{default}; env {option.env}",
        )


def _suggestion(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuse a ``CCO_*`` variable that no option and nothing else in CCO reads."""
    known = {option.env for option in OPTIONS} | set(OTHER_VARIABLES)
    for name in sorted(environ):
        if name.startswith("CCO_") and name not in known:
            raise CcoError(
                ErrorCode.INVALID_FIELD,
                f"environment variable {name} is not a CCO setting{_suggestion(name, known)}; "
                "`cco-node --help` lists each option's variable",
            )


def resolve(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> NodeConfig:
    """Merge defaults, TOML, environment and flags; parse and check every value.

    Relative paths in the TOML file are relative to the file's directory, so that a
    file means the same whatever directory the node is started from; relative paths
    in flags and variables are relative to the working directory, as in any command."""
    check_environment(environ)
    config_path = args.config or (Path(environ["CCO_CONFIG"]) if "CCO_CONFIG" in environ else None)
    from_file: dict[str, Any] = {}
    if config_path is not None:
        try:
            with open(config_path, "rb") as handle:
                from_file = tomllib.load(handle)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise CcoError(ErrorCode.INVALID_FIELD, f"config file {config_path}: {exc}") from exc
        unknown = sorted(set(from_file) - set(_BY_NAME) - {"role"})
        if unknown:
            raise CcoError(
                ErrorCode.INVALID_FIELD,
                f"config file {config_path}: unknown keys {unknown}"
                f"{_suggestion(unknown[0], [*_BY_NAME, 'role'])}",
            )
    role = args.role or environ.get("CCO_ROLE") or from_file.get("role")
    if role not in (R, A, E):
        given = "" if role is None else f", not {role!r}"
        raise CcoError(ErrorCode.INVALID_FIELD, f"--role must be rendezvous, aggregator or endpoint{given}")
    values: dict[str, Any] = {}
    for option in OPTIONS:
        raw: Any = getattr(args, option.name, None)
        source = option.flag
        if raw is None and option.env in environ:
            raw, source = environ[option.env], option.env
        if raw is None and option.name in from_file:
            raw, source = from_file[option.name], f"{config_path}:{option.name}"
            if not isinstance(raw, str):
                raw = ",".join(raw) if isinstance(raw, list) else str(raw)
            elif option.path and raw != ":memory:":
                assert config_path is not None
                raw = str(config_path.parent / Path(raw).expanduser())
        if raw is None:
            values[option.name] = option.default_for(role)
            continue
        try:
            value = option.parse(raw)
        except ValueError as exc:
            raise CcoError(ErrorCode.INVALID_FIELD, f"{source}: {exc}") from exc
        bounds = option.bounds
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            assert option.wire is not None
            raise CcoError(
                ErrorCode.INVALID_FIELD,
                f"{source}: {value} is outside [{bounds[0]}, {bounds[1]}], the range of "
                f"{option.wire[0].__name__}.{option.wire[1]} on the wire",
            )
        if option.minimum is not None and value < option.minimum:
            raise CcoError(ErrorCode.INVALID_FIELD, f"{source}: {value} is below {option.minimum}")
        if option.maximum is not None and value > option.maximum:
            raise CcoError(ErrorCode.INVALID_FIELD, f"{source}: {value} is above {option.maximum}")
        values[option.name] = value
    if values["liveness_ms"] is None:
        values["liveness_ms"] = max(DEFAULT_LIVENESS_MS, LOSS_INTERVALS * values["heartbeat_ms"])
    elif values["liveness_ms"] < 2 * values["heartbeat_ms"]:
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"--liveness-ms {values['liveness_ms']} is under two heartbeat intervals "
            f"(--heartbeat-ms {values['heartbeat_ms']})",
        )
    block = DEFAULT_BLOCK_ELEMENTS  # a rendezvous's groups take the default block size
    if values["scaled_chunk_elements"] % block:
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"--scaled-chunk-elements {values['scaled_chunk_elements']} is not a multiple of the "
            f"block size, {block} elements",
        )
    return NodeConfig(role=role, values=values)
