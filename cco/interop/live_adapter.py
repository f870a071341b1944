"""This implementation's adapter for ``cco-interop live``: the environment contract
of ``interop/README.md`` turned into a ``cco-node`` command line.

The runner starts ``python -m cco.interop.live_adapter`` once per node with ROLE,
TESTCASE, addresses, certificate paths, SSLKEYLOGFILE, QLOGDIR and the workload in
the environment.  Servers (rendezvous, aggregator) run until SIGTERM; an endpoint
runs its workload and writes RESULTS in the runner's format (a SHA-256 per result,
over its little-endian bytes), exiting non-zero if a collective or the join failed.
Exit code 127 means "this role or test case is not supported" (never for us).

``CCO_INTEROP_FAULT=flip-result`` turns an aggregator into the runner's bad
aggregator: it flips one bit of the payload of every Result it sends down, which
every endpoint must catch (VERIFICATION_FAILED).  Nothing else uses it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from cco.nodes.events import Command, Input, SendMessage
from cco.wire.messages import Result

UNSUPPORTED = 127
ROLES = ("rendezvous", "aggregator", "endpoint")
FAULTS = ("flip-result",)


class FlippingMachine:
    """An aggregator machine that flips bit 0 of the first payload byte of every Result."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def handle(self, event: Input, now: float) -> list[Command]:
        return [self._tamper(c) for c in self.inner.handle(event, now)]

    def next_deadline(self) -> float | None:
        deadline: float | None = self.inner.next_deadline()
        return deadline

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @staticmethod
    def _tamper(command: Command) -> Command:
        if (
            isinstance(command, SendMessage)
            and isinstance(command.message, Result)
            and command.message.payload
        ):
            payload = bytes([command.message.payload[0] ^ 1]) + command.message.payload[1:]
            return dataclasses.replace(command, message=dataclasses.replace(command.message, payload=payload))
        return command


def _env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None:
        raise SystemExit(f"live_adapter: {name} is not set")
    return value


def _common(role: str) -> list[str]:
    argv = [
        "--role",
        role,
        "--node-id",
        _env("NODE_ID"),
        "--ca",
        _env("CA"),
        "--cert",
        _env("CERT"),
        "--key",
        _env("KEY"),
        "--log-level",
        os.environ.get("LOG_LEVEL", "info"),
        "--max-datagram-size",
        os.environ.get("MAX_DATAGRAM_SIZE", "1452"),
    ]
    if "QLOGDIR" in os.environ:
        argv += ["--qlog-dir", os.environ["QLOGDIR"]]
    if "SSLKEYLOGFILE" in os.environ:
        argv += ["--keylog-file", os.environ["SSLKEYLOGFILE"]]
    return argv


def _optional(pairs: dict[str, str]) -> list[str]:
    return [item for env, flag in pairs.items() if env in os.environ for item in (flag, os.environ[env])]


def node_argv(role: str) -> list[str]:
    """The ``cco-node`` arguments for ``role`` from the environment."""
    argv = _common(role)
    if role == "rendezvous":
        argv += [
            "--listen",
            _env("LISTEN"),
            "--group-id",
            _env("GROUP_ID"),
            "--world-size",
            _env("WORLD_SIZE"),
        ]
        argv += ["--credential", os.environ.get("CREDENTIAL", ""), "--dynamic-groups", "false"]
        # the case's store (a restart carries on from it), else none: nothing from an earlier case
        argv += ["--store", os.environ.get("STORE", ":memory:")]
        argv += _optional(
            {
                "HEARTBEAT_MS": "--heartbeat-ms",
                "CHUNK_ELEMENTS": "--chunk-elements",
                "OPERATION_TIMEOUT_MS": "--operation-timeout-ms",
                "WINDOW": "--window",
            }
        )
    elif role == "aggregator":
        argv += ["--listen", _env("LISTEN"), "--rendezvous", _env("RENDEZVOUS")]
        argv += ["--rendezvous-id", _env("RENDEZVOUS_ID", "rendezvous")]
        argv += _optional(
            {"ADVERTISE": "--advertise", "MAX_FAN_IN": "--max-fan-in", "CAPACITY": "--capacity"}
        )
    else:
        argv += ["--rendezvous", _env("RENDEZVOUS"), "--rendezvous-id", _env("RENDEZVOUS_ID", "rendezvous")]
        argv += ["--group-id", _env("GROUP_ID"), "--world-size", _env("WORLD_SIZE")]
        argv += ["--credential", os.environ.get("CREDENTIAL", "")]
        argv += _optional(
            {
                "RANK": "--rank",
                "DTYPE": "--dtype",
                "ELEMENTS": "--elements",
                "ROUNDS": "--rounds",
                "QUORUM": "--quorum",
                "QUORUM_WAIT_MS": "--quorum-wait-ms",
            }
        )
    return argv


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(
        np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
    ).hexdigest()


def run_endpoint(argv: list[str]) -> int:
    """Run the workload, then write RESULTS in the runner's format."""
    from cco.cli import main as node_main

    workload = os.environ.get("WORKLOAD", "allreduce")
    if workload not in ("allreduce", "collectives"):
        return UNSUPPORTED
    with tempfile.TemporaryDirectory() as scratch:
        native = Path(scratch) / ("results.npz" if workload == "collectives" else "results.json")
        argv = [*argv, "--workload", "conformance" if workload == "collectives" else "allreduce"]
        status = node_main([*argv, "--results", str(native)])
        if status != 0 or not native.is_file():
            return status or 1
        results: dict[str, str] = {}
        if workload == "collectives":
            with np.load(native) as arrays:
                results = {name: _digest(arrays[name]) for name in arrays.files}
            summary: dict[str, Any] = {}
        else:
            summary = json.loads(native.read_text(encoding="utf-8"))
            results = {f"round-{r['round']}": r["sha256"] for r in summary["rounds"]}
            contributors = {
                f"round-{r['round']}": r["contributors"] for r in summary["rounds"] if "contributors" in r
            }
    out: dict[str, Any] = {
        "rank": summary.get("rank"),
        "world_size": summary.get("world_size"),
        "results": results,
    }
    if workload == "allreduce" and contributors:
        out["contributors"] = contributors
    if out["rank"] is None:  # the conformance workload does not report it: the runner needs it
        out["rank"] = int(os.environ["RANK"]) if "RANK" in os.environ else None
    Path(_env("RESULTS")).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


def run_flipping_aggregator(argv: list[str]) -> int:
    """The runner's bad aggregator: ``cco-node``'s aggregator with :class:`FlippingMachine`."""
    from cco.cli import node_parser
    from cco.config import parse_hostport, resolve
    from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
    from cco.services import roles
    from cco.services.node import NodeService
    from cco.wire.messages import Address
    from cco.wire.registries import Role

    cfg = resolve(node_parser().parse_args(argv))

    async def serve() -> int:
        host, port = parse_hostport(cfg.listen)
        adv_host, adv_port = parse_hostport(cfg.advertise or cfg.listen)
        config = AggregatorConfig(
            address=Address(host=adv_host, port=adv_port),
            capacity=cfg.capacity,
            max_fan_in=cfg.max_fan_in,
            labels=cfg.labels,
        )
        machine = FlippingMachine(AggregatorMachine(config))
        service = NodeService(machine, cfg.require("node_id"), Role.AGGREGATOR, roles.transport_config(cfg))
        await service.listen(host, port)
        await service.join_rendezvous(*parse_hostport(cfg.rendezvous), cfg.rendezvous_id)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await service.close()
        return 0

    return asyncio.run(serve())


def main() -> int:
    role = os.environ.get("ROLE", "")
    fault = os.environ.get("CCO_INTEROP_FAULT")
    if role not in ROLES or (fault is not None and fault not in FAULTS):
        return UNSUPPORTED
    argv = node_argv(role)
    if role == "endpoint":
        return run_endpoint(argv)
    if fault == "flip-result" and role == "aggregator":  # other roles run as usual
        return run_flipping_aggregator(argv)
    from cco.cli import main as node_main

    return node_main(argv)


if __name__ == "__main__":
    sys.exit(main())
