"""``cco-node --role aggregator --workers W``: what each worker is told, and the mistakes
refused before any worker starts (the processes themselves: tests/e2e/test_workers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cco.cli import main, node_parser
from cco.config import NodeConfig, resolve
from cco.transport import create_dev_pki, identity_from_certificate
from cco.transport.certs import load_certificate
from cco.wire.errors import CcoError
from cco.wire.registries import Role
from cco.workers import check_workers, worker_argv, worker_environment


def _resolve(argv: list[str], environ: dict[str, str] | None = None) -> NodeConfig:
    return resolve(node_parser().parse_args(argv), environ or {})


def _aggregator(*extra: str, environ: dict[str, str] | None = None) -> NodeConfig:
    return _resolve(["--role", "aggregator", "--node-id", "agg", "--pki-dir", "/pki", *extra], environ)


def test_a_worker_gets_its_own_id_and_ports_and_every_other_option_unchanged(tmp_path: Path) -> None:
    config = tmp_path / "agg.toml"
    config.write_text('labels = ["rack=1", "row=2"]\ncapacity = 5\n')
    cfg = _aggregator(
        "--config", str(config), "--listen", "[::1]:5000", "--advertise", "agg.example:6000",
        "--metrics-listen", "127.0.0.1:9100", "--workers", "3", "--max-fan-in", "4",
        environ={"CCO_RENDEZVOUS": "rv.example:4433", "CCO_LOG_FORMAT": "json"},
    )  # fmt: skip
    worker = _resolve(worker_argv(cfg, 2))
    assert worker.role == "aggregator"
    assert worker.values == {
        **cfg.values,
        "node_id": "agg.w2",
        "listen": "[::1]:5002",
        "advertise": "agg.example:6002",
        "metrics_listen": "127.0.0.1:9102",
        "workers": 1,
    }
    first = _resolve(worker_argv(cfg, 0))
    assert (first.node_id, first.listen, first.advertise) == ("agg.w0", "[::1]:5000", "agg.example:6000")


def test_workers_come_from_flag_environment_or_file(tmp_path: Path) -> None:
    config = tmp_path / "agg.toml"
    config.write_text("workers = 4\n")
    assert _aggregator("--config", str(config)).workers == 4
    assert _aggregator("--config", str(config), environ={"CCO_WORKERS": "3"}).workers == 3
    assert _aggregator("--workers", "2", environ={"CCO_WORKERS": "3"}).workers == 2
    assert _aggregator().workers == 1


def test_options_left_unset_stay_unset_for_the_worker() -> None:
    cfg = _aggregator("--workers", "2")
    worker = _resolve(worker_argv(cfg, 1))
    assert (worker.listen, worker.advertise, worker.metrics_listen) == ("127.0.0.1:4435", None, None)
    assert worker.values == {**cfg.values, "node_id": "agg.w1", "listen": "127.0.0.1:4435", "workers": 1}


def test_the_worker_environment_drops_what_its_flags_say() -> None:
    environ = {"CCO_WORKERS": "4", "CCO_CONFIG": "x.toml", "CCO_ROLE": "aggregator", "CCO_KERNELS": "numpy",
               "PATH": "/bin", "CCO_CAPACITY": "3"}  # fmt: skip
    assert worker_environment(environ) == {"CCO_KERNELS": "numpy", "PATH": "/bin"}


def test_a_port_past_65535_is_refused_naming_the_worker() -> None:
    with pytest.raises(CcoError, match=r"--listen 127.0.0.1:65534: worker 2 would take port 65536"):
        worker_argv(_aggregator("--listen", "127.0.0.1:65534", "--workers", "3"), 2)
    with pytest.raises(CcoError, match=r"--metrics-listen 127.0.0.1:65535: worker 1"):
        worker_argv(_aggregator("--metrics-listen", "127.0.0.1:65535", "--workers", "2"), 1)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--role", "endpoint", "--workers", "2"], "--workers 2 is for --role aggregator only"),
        (["--role", "aggregator", "--workers", "2"], "--workers 2 needs --pki-dir"),
        (["--role", "aggregator", "--pki-dir", "p", "--cert", "c.pem", "--workers", "2"],
         "give --pki-dir, not --cert/--key"),
        (["--role", "aggregator", "--workers", "0"], "--workers: 0 is below 1"),
        (["--role", "aggregator", "--workers", "65"], "--workers: 65 is above 64"),
    ],
)  # fmt: skip
def test_mistakes_are_one_line_before_any_worker_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--node-id", "agg"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_development_pki_issues_the_missing_worker_certificates(tmp_path: Path) -> None:
    create_dev_pki(tmp_path, [("agg.w1", Role.AGGREGATOR)])
    kept = (tmp_path / "agg.w1.pem").read_bytes()
    argvs = check_workers(_resolve(["--role", "aggregator", "--node-id", "agg", "--pki-dir", str(tmp_path),
                                    "--workers", "3"]))  # fmt: skip
    assert len(argvs) == 3
    assert (tmp_path / "agg.w1.pem").read_bytes() == kept, "an existing certificate is kept"
    for k in range(3):
        identity = identity_from_certificate(load_certificate(tmp_path / f"agg.w{k}.pem"))
        assert (identity.node_id, identity.role) == (f"agg.w{k}", Role.AGGREGATOR)
        assert (tmp_path / f"agg.w{k}.key").is_file()


def test_without_the_ca_key_the_error_names_the_command_that_issues_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    create_dev_pki(tmp_path, [("agg.w0", Role.AGGREGATOR)])
    (tmp_path / "ca.key").unlink()
    argv = ["--role", "aggregator", "--node-id", "agg", "--pki-dir", str(tmp_path), "--workers", "3"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "`cco-node certs --dir DIR agg.w1:aggregator agg.w2:aggregator`" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "agg.w1.pem").exists()
