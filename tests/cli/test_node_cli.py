"""``cco-node``: configuration precedence, help, certificates and usage errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cco.cli import main, node_parser
from cco.config import OPTIONS, NodeConfig, Option, resolve
from cco.transport import identity_from_certificate
from cco.transport.certs import load_certificate
from cco.wire.errors import CcoError
from cco.wire.registries import Role


def _resolve(argv: list[str], environ: dict[str, str] | None = None) -> NodeConfig:
    return resolve(node_parser().parse_args(argv), environ or {})


def test_precedence_is_flags_then_environment_then_file_then_default(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(
        'role = "aggregator"\ncapacity = 3\nmax_fan_in = 5\nwindow = 9\nlabels = ["rack1", "row2"]\n'
    )
    resolved = _resolve(
        ["--config", str(config), "--capacity", "7"],
        {"CCO_CAPACITY": "6", "CCO_MAX_FAN_IN": "4"},
    )
    assert resolved.role == "aggregator"  # type: ignore[attr-defined]
    assert resolved.capacity == 7  # type: ignore[attr-defined]  # flag beats env and file
    assert resolved.max_fan_in == 4  # type: ignore[attr-defined]  # env beats file
    assert resolved.window == 9  # type: ignore[attr-defined]  # file beats default
    assert resolved.labels == ("rack1", "row2")  # type: ignore[attr-defined]
    assert resolved.heartbeat_ms == 1000  # type: ignore[attr-defined]  # default


def test_config_errors_name_their_source(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('role = "endpoint"\nmystery = 1\n')
    with pytest.raises(CcoError, match="unknown keys"):
        _resolve(["--config", str(bad)])
    with pytest.raises(CcoError, match="CCO_WINDOW"):
        _resolve(["--role", "rendezvous"], {"CCO_WINDOW": "many"})
    with pytest.raises(CcoError, match="--role"):
        _resolve([])


BOUNDED = [option for option in OPTIONS if option.wire is not None]


@pytest.mark.parametrize("option", BOUNDED, ids=[option.name for option in BOUNDED])
def test_a_value_the_wire_cannot_carry_is_refused_naming_its_source(option: Option, tmp_path: Path) -> None:
    """Each bounded option takes exactly its message field's range: both ends are
    accepted, one beyond either end is refused, from a flag, the environment or the
    config file alike."""
    cls, field = option.wire  # type: ignore[misc]
    kind = dict(cls.wire_fields())[field].kind
    low, high = option.bounds  # type: ignore[misc]
    assert (low, high) == (kind.minimum, kind.maximum)
    role = option.roles[0]
    for value in (low, high):
        shortest = ["--heartbeat-ms", "10"] if option.name == "liveness_ms" else []  # two intervals at least
        assert getattr(_resolve(["--role", role, *shortest, option.flag, str(value)]), option.name) == value
    config = tmp_path / "node.toml"
    config.write_text(f'role = "{role}"\n{option.name} = {high + 1}\n')
    for argv, environ, source in (
        (["--role", role, option.flag, str(low - 1)], {}, option.flag),
        (["--role", role], {option.env: str(high + 1)}, option.env),
        (["--config", str(config)], {}, f"{config}:{option.name}"),
    ):
        with pytest.raises(CcoError) as info:
            _resolve(argv, environ)
        assert info.value.detail.startswith(f"{source}: ")
        assert f"outside [{low}, {high}]" in info.value.detail
        assert f"{cls.__name__}.{field}" in info.value.detail


def test_the_liveness_window_defaults_to_fifteen_seconds_and_is_at_least_two_intervals(
    tmp_path: Path,
) -> None:
    assert _resolve(["--role", "rendezvous"]).liveness_ms == 15_000
    assert _resolve(["--role", "rendezvous", "--heartbeat-ms", "10000"]).liveness_ms == 30_000  # 3 intervals
    assert _resolve(["--role", "endpoint"], {"CCO_LIVENESS_MS": "60000"}).liveness_ms == 60_000
    config = tmp_path / "rv.toml"
    config.write_text('role = "rendezvous"\nheartbeat_ms = 500\nliveness_ms = 900\n')
    with pytest.raises(CcoError) as info:
        _resolve(["--config", str(config)])
    assert info.value.detail == "--liveness-ms 900 is under two heartbeat intervals (--heartbeat-ms 500)"


def test_the_scaled_chunk_bound_is_whole_blocks_and_zero_turns_it_off() -> None:
    assert _resolve(["--role", "rendezvous"]).scaled_chunk_elements == 131072
    assert _resolve(["--role", "rendezvous", "--scaled-chunk-elements", "0"]).scaled_chunk_elements == 0
    with pytest.raises(CcoError) as info:
        _resolve(["--role", "rendezvous"], {"CCO_SCALED_CHUNK_ELEMENTS": "1000"})
    assert (
        info.value.detail == "--scaled-chunk-elements 1000 is not a multiple of the block size, 256 elements"
    )


FLOORED = [option for option in OPTIONS if option.minimum is not None]


@pytest.mark.parametrize("option", FLOORED, ids=[option.name for option in FLOORED])
def test_a_count_below_its_least_meaningful_value_is_refused(option: Option) -> None:
    """Counts and durations that are not sent (workload rounds and elements, quorum,
    grace periods) are refused below their minimum when read, not after joining (a
    negative --elements used to end an endpoint in a numpy traceback)."""
    assert option.minimum is not None
    role = option.roles[0]
    resolved = _resolve(["--role", role, option.flag, str(option.minimum)])
    assert getattr(resolved, option.name) == option.minimum
    with pytest.raises(CcoError) as info:
        _resolve(["--role", role], {option.env: str(option.minimum - 1)})
    assert info.value.detail == f"{option.env}: {option.minimum - 1} is below {option.minimum}"
    entry = _help_entry(option)
    if option.maximum is None:
        assert f"(at least {option.minimum})" in entry
    else:
        assert f"({option.minimum} to {option.maximum})" in entry


def _help_entry(option: Option) -> str:
    text = " ".join(node_parser().format_help().split())
    start = text.index(f"{option.flag} {option.name.upper()} ")
    return text[start : text.index(f"env {option.env}", start)]


CAPPED = [option for option in OPTIONS if option.maximum is not None]


@pytest.mark.parametrize("option", CAPPED, ids=[option.name for option in CAPPED])
def test_a_value_above_its_largest_accepted_is_refused(option: Option, tmp_path: Path) -> None:
    assert option.maximum is not None
    role = option.roles[0]
    resolved = _resolve(["--role", role, option.flag, str(option.maximum)])
    assert getattr(resolved, option.name) == option.maximum
    config = tmp_path / "node.toml"
    config.write_text(f'role = "{role}"\n{option.name} = {option.maximum + 1}\n')
    for argv, environ, source in (
        (["--role", role, option.flag, str(option.maximum + 1)], {}, option.flag),
        (["--role", role], {option.env: str(option.maximum + 1)}, option.env),
        (["--config", str(config)], {}, f"{config}:{option.name}"),
    ):
        with pytest.raises(CcoError) as info:
            _resolve(argv, environ)
        assert info.value.detail == f"{source}: {option.maximum + 1} is above {option.maximum}"


@pytest.mark.parametrize("name", ["listen", "advertise", "rendezvous"])
def test_addresses_are_checked_when_the_configuration_is_read(name: str) -> None:
    flag = "--" + name
    assert getattr(_resolve(["--role", "aggregator", flag, "[::1]:4433"]), name) == "[::1]:4433"
    for bad in ("nonsense", "host:0", "host:65536", ":4433"):
        with pytest.raises(CcoError) as info:
            _resolve(["--role", "aggregator", flag, bad])
        assert info.value.detail.startswith(f"{flag}: expected HOST:PORT")


def test_help_documents_every_option() -> None:
    text = node_parser().format_help()
    for option in OPTIONS:
        assert option.flag in text and option.env in text


def test_certs_command_writes_a_pki(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", "--dir", str(tmp_path), "agg-1:aggregator", "ep-0:endpoint"]) == 0
    identity = identity_from_certificate(load_certificate(tmp_path / "agg-1.pem"))
    assert (identity.node_id, identity.role) == ("agg-1", Role.AGGREGATOR)
    assert "ep-0.key" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["certs", "--dir", "{tmp}", "agg-1:janitor"],
        ["certs", "--dir", "{tmp}", "Bad_Name:endpoint"],
        ["--role", "endpoint", "--node-id", "ep-0"],  # no credentials, no group
        ["--role", "aggregator", "--node-id", "agg-1", "--pki-dir", "{pki}", "--quic-backend", "quiche"],
        ["--role", "aggregator", "--node-id", "agg-1", "--pki-dir", "{pki}", "--max-datagram-size", "70000"],
        # an aggregator with a malformed address or a fan-in it could never register
        # (it used to die with a traceback, or retry forever as "rendezvous unreachable")
        ["--role", "aggregator", "--node-id", "agg-1", "--pki-dir", "{pki}", "--listen", "nonsense"],
        ["--role", "aggregator", "--node-id", "agg-1", "--pki-dir", "{pki}", "--max-fan-in", "1"],
    ],
)
def test_usage_errors_are_one_line_with_status_2(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["certs", "--dir", str(tmp_path / "pki"), "agg-1:aggregator"])
    capsys.readouterr()
    assert main([arg.format(tmp=tmp_path, pki=tmp_path / "pki") for arg in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cco-node: ") and "\n" not in err


def test_entry_point_help_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cco.cli", "demo", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "--endpoints" in result.stdout


def test_importing_the_entry_point_leaves_numpy_unloaded() -> None:
    """``cco-node`` sets one BLAS thread in ``main``; that only works while nothing
    the entry module imports has loaded numpy (and OpenBLAS sized its pool)."""
    code = "import sys, cco.cli; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in Linux's /proc")
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="on one core OpenBLAS starts no threads anyway")
def test_a_node_process_runs_numpy_with_one_blas_thread() -> None:
    code = (
        "import os, cco.cli\n"
        "cco.cli.single_threaded_numerics()\n"  # as main() does before loading a role
        "import numpy\n"
        "print(len(os.listdir('/proc/self/task')))\n"
    )
    environ = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    command = [sys.executable, "-c", code]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=environ)
    assert out.stdout.strip() == "1"


def test_the_datapath_roles_busy_poll_by_default_and_the_rendezvous_does_not() -> None:
    """Aggregators and endpoints exist to move datagrams; the rendezvous answers
    heartbeats, where polling after each would only spend CPU (``--busy-poll-us``)."""
    assert _resolve(["--role", "aggregator"]).busy_poll_us == 1000
    assert _resolve(["--role", "endpoint"]).busy_poll_us == 1000
    assert _resolve(["--role", "rendezvous"]).busy_poll_us == 0
    assert _resolve(["--role", "rendezvous", "--busy-poll-us", "50"]).busy_poll_us == 50
    assert _resolve(["--role", "endpoint"], {"CCO_BUSY_POLL_US": "0"}).busy_poll_us == 0
    assert "(default: 1000; 0 for the rendezvous)" in _help_entry(
        next(option for option in OPTIONS if option.name == "busy_poll_us")
    )


def test_relative_paths_in_a_config_file_are_relative_to_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TOML file's relative ``pki_dir`` used to resolve against the working directory."""
    (tmp_path / "etc").mkdir()
    config = tmp_path / "etc" / "node.toml"
    config.write_text(
        'role = "rendezvous"\npki_dir = "pki"\nstore = "state/rv.sqlite3"\nkey = "/abs/rv.key"\n'
    )
    monkeypatch.chdir(tmp_path)
    resolved = _resolve(["--config", "etc/node.toml"])
    assert resolved.pki_dir == Path("etc/pki")  # beside the file, from wherever the node starts
    assert resolved.store == "etc/state/rv.sqlite3"
    assert resolved.key == Path("/abs/rv.key")
    assert _resolve(["--config", "etc/node.toml", "--pki-dir", "pki"]).pki_dir == Path("pki")  # flags: cwd
    config.write_text('role = "rendezvous"\nstore = ":memory:"\n')
    assert _resolve(["--config", "etc/node.toml"]).store == ":memory:"


def test_an_aggregator_does_not_default_onto_the_rendezvous_port() -> None:
    rendezvous = _resolve(["--role", "rendezvous"]).listen
    assert _resolve(["--role", "aggregator"]).listen != rendezvous
    assert _resolve(["--role", "aggregator"]).rendezvous == rendezvous


def test_every_cco_variable_is_an_option_or_listed() -> None:
    """What the rest of CCO reads from ``CCO_*`` is known to the check that refuses
    unknown variables (else setting it would stop every node)."""
    from cco.config import OTHER_VARIABLES, check_environment
    from cco.torch.options import STRIPES_ENV
    from cco.transport.config import QUIC_BACKEND_ENV
    from cco.wire.kernels import KERNELS_ENV

    known = {KERNELS_ENV: "numpy", QUIC_BACKEND_ENV: "qh3", STRIPES_ENV: "2"}
    check_environment({**known, **dict.fromkeys(OTHER_VARIABLES, "x")})
    with pytest.raises(CcoError, match=r"CCO_NODEID is not a CCO setting \(did you mean CCO_NODE_ID\?\)"):
        check_environment({"CCO_NODEID": "x"})


def test_the_quic_libraries_chatter_is_shown_at_debug_only() -> None:
    """aioquic and qh3 log every normal peer close as a WARNING on ``quic``."""
    import io
    import json
    import logging

    from cco.logs import configure_logging

    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger("quic").level)
    try:
        stream = io.StringIO()
        configure_logging("info", "json", stream)
        logging.getLogger("quic").warning("Native peer close: %r", ("peer_closed", True, 0))
        logging.getLogger("cco.node").info("joined %s", "ep-0")
        entries = [json.loads(line) for line in stream.getvalue().splitlines()]
        shown = [(e["logger"], e["level"], e["message"]) for e in entries]
        assert shown == [("cco.node", "info", "joined ep-0")]
        configure_logging("debug", "text", stream)
        assert logging.getLogger("quic").isEnabledFor(logging.DEBUG)
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
        logging.getLogger("quic").setLevel(saved[2])
