"""The ``main`` of the rendezvous and aggregator roles, and what every role's process
shares: its credentials, the stop signal, its peak memory and a settled heap.

Each main takes a resolved :class:`~cco.config.NodeConfig`, runs until it is told to
stop (SIGINT/SIGTERM) and returns the process exit status.  The endpoint's main is an
application of the client (:mod:`cco.jobs`); :mod:`cco.launch` picks the role.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import resource
import signal
import time
from pathlib import Path

from cco.config import NodeConfig, parse_hostport, state_directory
from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
from cco.nodes.aggregator_states import NodeState
from cco.nodes.rendezvous import GroupConfig, RendezvousConfig, RendezvousMachine
from cco.services.dump import dump_on_signal
from cco.services.node import NodeService, Redialer
from cco.services.store import (
    PersistentRendezvous,
    RendezvousStore,
    StoreError,
    stored_groups,
)
from cco.transport import TransportConfig
from cco.transport.certs import CA_CERT_FILE, node_paths
from cco.transport.config import idle_timeout_above
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Address, GroupParams
from cco.wire.registries import Role

log = logging.getLogger("cco.node")


def transport_config(cfg: NodeConfig) -> TransportConfig:
    """Credentials from explicit paths, else from ``pki_dir`` by node id."""
    node_id = cfg.require("node_id")
    ca, cert, key = cfg.ca, cfg.cert, cfg.key
    if cfg.pki_dir is not None:
        default_cert, default_key = node_paths(cfg.pki_dir, node_id)
        ca = ca or cfg.pki_dir / CA_CERT_FILE
        cert, key = cert or default_cert, key or default_key
    if ca is None or cert is None or key is None:
        raise CcoError(ErrorCode.INVALID_FIELD, "give --pki-dir, or all of --ca, --cert and --key")
    for path in (ca, cert, key):
        if not Path(path).is_file():
            raise CcoError(
                ErrorCode.INVALID_FIELD, f"{path}: no such file (create one with `cco-node certs`)"
            )
    try:
        return TransportConfig(
            ca_file=ca,
            cert_file=cert,
            key_file=key,
            max_datagram_size=cfg.max_datagram_size,
            quic_backend=cfg.quic_backend,
            qlog_dir=cfg.qlog_dir,
            keylog_file=cfg.keylog_file,
            idle_timeout=idle_timeout_above(cfg.liveness_ms),
        )
    except ValueError as exc:  # a value out of range; the text names the option
        raise CcoError(ErrorCode.INVALID_FIELD, str(exc)) from None


def parse_group_id(text: str) -> bytes:
    try:
        group_id = bytes.fromhex(text)
    except ValueError:
        group_id = b""
    if len(group_id) != 16:
        raise CcoError(ErrorCode.INVALID_FIELD, f"group id must be 32 hex digits, got {text!r}")
    return group_id


def observe(service: NodeService, cfg: NodeConfig) -> None:
    """Size the node's flight recorder and dump it on SIGUSR1 (:mod:`cco.services.dump`);
    serve its metrics if ``--metrics-listen`` asks for them (:mod:`cco.services.metrics`)."""
    service.runner.recorder.resize(cfg.recorder_entries)
    dump_on_signal(service, state_directory(os.environ))
    if cfg.metrics_listen is not None:
        from cco.services.metrics import NodeMetrics  # prometheus-client: only when asked for

        metrics = NodeMetrics(service.runner)
        host, port = metrics.serve(*parse_hostport(cfg.metrics_listen))
        service.runner.metrics = metrics
        log.info("%s serves metrics on http://%s:%d/metrics", cfg.node_id, host, port)


REGISTRATION_REFUSED = 3
"""Exit status of an aggregator whose registration the rendezvous refused, or whose
first connection to it was refused for authorization (asking again would not help:
a service manager should not restart it unchanged)."""


def stop_event() -> asyncio.Event:
    """Set on SIGINT or SIGTERM: every role stops gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


async def pause(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def run_rendezvous(cfg: NodeConfig) -> int:
    """Serve groups until SIGINT or SIGTERM (exit 0), carrying on from the store.

    Every change to a group or registration is saved in the store before it is
    announced; a store that cannot be written stops the rendezvous with status 1
    (its peers come back to the next one, which starts from the last saved state)."""
    node_id = cfg.require("node_id")
    host, port = parse_hostport(cfg.listen)  # checked when the configuration was read
    params = GroupParams(
        chunk_elements=cfg.chunk_elements,
        scaled_chunk_elements=cfg.scaled_chunk_elements or None,
        window=cfg.window,
        heartbeat_interval_ms=cfg.heartbeat_ms,
        operation_timeout_ms=cfg.operation_timeout_ms,
        liveness_ms=cfg.liveness_ms,
    )
    groups: dict[bytes, GroupConfig] = {}
    if cfg.group_id is not None:
        groups[parse_group_id(cfg.group_id)] = GroupConfig(
            world_size=cfg.require("world_size"), credential=cfg.credential.encode()
        )
    config = RendezvousConfig(
        groups=groups,
        create_groups_on_join=cfg.dynamic_groups,
        params=params,
        resume_grace_ms=cfg.resume_grace_ms,
    )
    transport = transport_config(cfg)
    stop = stop_event()
    failures: list[StoreError] = []

    def store_failed(error: StoreError) -> None:
        log.error("%s; stopping", error.detail)
        failures.append(error)
        stop.set()

    store = RendezvousStore(cfg.require("store"))  # the default is filled in by cco.cli.checked
    try:
        machine = PersistentRendezvous.open(
            store, lambda state: RendezvousMachine.restored(state, time.monotonic(), config), store_failed
        )
        restored = machine.machine.status()
        if restored.grace_ends is not None:
            log.info(
                "rendezvous %s restored %d groups and %d aggregator registrations from %s; "
                "they have %g s to come back",
                node_id,
                len(restored.groups),
                len(restored.aggregators),
                store.path,
                config.resume_grace,
            )
            for line in stored_groups(machine.machine.durable_state()):
                log.info("restored %s", line)
        service = NodeService(machine, node_id, Role.RENDEZVOUS, transport)
        observe(service, cfg)
        address = await service.listen(host, port)
        service.runner.execute_all([])  # arms the end of the grace period, should nobody come back
        log.info(
            "rendezvous %s listening on %s:%d (QUIC %s, store %s)",
            node_id,
            *address[:2],
            transport.quic_backend,
            store.path,
        )
        try:
            await stop.wait()
        finally:
            await service.close()
    finally:
        store.close()
    return 1 if failures else 0


async def run_aggregator(cfg: NodeConfig) -> int:
    host, port = parse_hostport(cfg.listen)  # both checked when the configuration was read
    adv_host, adv_port = parse_hostport(cfg.advertise or cfg.listen)
    machine = AggregatorMachine(
        AggregatorConfig(
            address=Address(host=adv_host, port=adv_port),
            capacity=cfg.capacity,
            max_fan_in=cfg.max_fan_in,
            labels=cfg.labels,
        )
    )
    service = NodeService(machine, cfg.require("node_id"), Role.AGGREGATOR, transport_config(cfg))
    observe(service, cfg)
    await service.listen(host, port)
    log.info(
        "aggregator %s listening on %s:%d (QUIC %s)", cfg.node_id, host, port, service.transport.quic_backend
    )
    stop = stop_event()
    try:
        return await _stay_registered(service, machine, cfg, stop)
    finally:
        log.info(
            "aggregator %s peak slot memory %d bytes, peak RSS %d bytes",
            cfg.node_id,
            machine.peak_slot_bytes,
            peak_rss_bytes(),
        )
        await service.close()


async def _stay_registered(
    service: NodeService, machine: AggregatorMachine, cfg: NodeConfig, stop: asyncio.Event
) -> int:
    """Register with the rendezvous, and again whenever it is lost (a restart, a
    network failure), waiting 1 s, 2 s, 4 s ... up to 30 s between attempts, until
    SIGINT or SIGTERM (exit 0) or a refused registration (exit REGISTRATION_REFUSED)."""
    who = f"aggregator {cfg.node_id}"
    redial = Redialer(
        service, parse_hostport(cfg.rendezvous), cfg.rendezvous_id, who, first_refusal_is_final=True
    )
    reported = NodeState.DETACHED
    while not stop.is_set():
        if machine.refusal is not None:
            log.error("aggregator %s: %s; exiting", cfg.node_id, machine.refusal.detail)
            return REGISTRATION_REFUSED
        if machine.state is not reported:
            if machine.state is NodeState.REGISTERED:
                log.info("aggregator %s registered with rendezvous %s", cfg.node_id, cfg.rendezvous)
            elif machine.state is NodeState.DETACHED:
                log.warning("aggregator %s lost rendezvous %s", cfg.node_id, cfg.rendezvous)
            reported = machine.state
        if machine.state is not NodeState.DETACHED:
            await pause(stop, 0.2)
            continue
        try:
            connected = await redial.attempt(lambda seconds: pause(stop, seconds))
        except CcoError as exc:  # refused for authorization at the first attempt: asking again would not help
            log.error("%s; exiting", exc.detail)
            return REGISTRATION_REFUSED
        if not connected:
            continue
        if redial.attempts > 1:
            log.info("aggregator %s: registering again with rendezvous %s", cfg.node_id, cfg.rendezvous)
        await pause(stop, 0.2)
    return 0


def peak_rss_bytes() -> int:
    """This process's peak resident set size.

    ``VmHWM`` from /proc where there is one: ``ru_maxrss`` survives exec on Linux, so
    a node started by a large parent would report the parent's peak.  Elsewhere
    ``ru_maxrss`` (KiB on Linux, bytes on macOS; only Linux is claimed here)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def settle_heap() -> None:
    """Collect, then exempt every object alive now (the modules and what importing
    them built) from later garbage collections.

    Otherwise the process's first full collection walks all of them, once per
    process, some hundred operations after start: a stall of tens of milliseconds
    in the middle of a run of small collectives, which the latency benchmark
    (``benchmarks/bench_latency.py``) sees in its p99.  Objects made later are
    collected as usual."""
    gc.collect()
    gc.freeze()
