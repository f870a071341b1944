"""The ``main`` of each role, as started by ``cco-node --role ...``.

Each takes a resolved :class:`~cco.config.NodeConfig`, runs until it is told to
stop (SIGINT/SIGTERM) or, for an endpoint, until its workload is done, and returns
the process exit status.  An endpoint's workload is a sequence of verified
collectives on deterministic inputs (:mod:`cco.workload`), so a run is repeatable and
its results checkable by anyone who knows the seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import json
import logging
import resource
import signal
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import numpy as np

from cco.client import Communicator, GroupSpec
from cco.config import NodeConfig, parse_hostport
from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
from cco.nodes.aggregator_states import NodeState
from cco.nodes.calls import CollectiveRequest
from cco.nodes.operation import Quorum
from cco.nodes.rendezvous import GroupConfig, RendezvousConfig, RendezvousMachine
from cco.services.node import NodeService, Redialer
from cco.services.polling import event_loop_factory, give_way
from cco.services.store import (
    PersistentRendezvous,
    RendezvousStore,
    StoreError,
    default_store_path,
    stored_groups,
)
from cco.transport import TransportConfig
from cco.transport.certs import CA_CERT_FILE, node_paths
from cco.wire import kernels
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Address, GroupParams
from cco.wire.registries import Collective, DType, ReduceOp, Role
from cco.workload import NUMPY_TYPES, conformance_cases, make_input

log = logging.getLogger("cco.node")

WORKLOAD_SEED = 2026


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


REGISTRATION_REFUSED = 3
"""Exit status of an aggregator whose registration the rendezvous refused (asking
again would not help: a service manager should not restart it unchanged)."""


def _stop_event() -> asyncio.Event:
    """Set on SIGINT or SIGTERM: every role stops gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


async def _pause(stop: asyncio.Event, seconds: float) -> None:
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
        window=cfg.window,
        heartbeat_interval_ms=cfg.heartbeat_ms,
        operation_timeout_ms=cfg.operation_timeout_ms,
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
    stop = _stop_event()
    failures: list[StoreError] = []

    def store_failed(error: StoreError) -> None:
        log.error("%s; stopping", error.detail)
        failures.append(error)
        stop.set()

    store = RendezvousStore(cfg.store if cfg.store is not None else default_store_path(node_id))
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
    await service.listen(host, port)
    log.info(
        "aggregator %s listening on %s:%d (QUIC %s)", cfg.node_id, host, port, service.transport.quic_backend
    )
    stop = _stop_event()
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
    redial = Redialer(service, parse_hostport(cfg.rendezvous), cfg.rendezvous_id, f"aggregator {cfg.node_id}")
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
            await _pause(stop, 0.2)
            continue
        if not await redial.attempt(lambda seconds: _pause(stop, seconds)):
            continue
        if redial.attempts > 1:
            log.info("aggregator %s: registering again with rendezvous %s", cfg.node_id, cfg.rendezvous)
        await _pause(stop, 0.2)
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


PREDRAWN_BYTES = 4 << 20
"""A run of the ``allreduce`` workload whose inputs add up to at most this many bytes
(over all its rounds) draws every input before its first call and hashes every
result after its last: between two calls it only records the time and yields the
core (:func:`_yield_core`), as the Gloo side of the benchmarks only refills its tensor.  Drawing and hashing
between the calls of an 8-byte run cost each rank about a tenth of its CPU per round
(a new random generator per round, then a hash), taken from the other ranks still
verifying the same round on a host whose cores they share.  Inputs and results take
twice this much memory at most; larger runs draw and hash each round on a worker
thread, as before."""


def _progress(line: str) -> None:
    """Write one progress line to stdout now, in one ``write``.

    ``print`` writes the line and its newline separately, and with an unbuffered
    stdout (``python -u``, ``PYTHONUNBUFFERED``, as CI and many launchers set) each
    is a system call: two per round on the critical path of a small all-reduce."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _yield_core() -> None:
    """Let any other runnable task of this host have this core first (:func:`give_way`).

    A rank whose result arrived first would otherwise seal its next Contribution at
    once, and the aggregator would wake to take it in, on the cores that the ranks
    still verifying the same round's Results need when they share them: the round
    ends with the last of those.  In an 8-byte round on two cores, p50 was 1.57 to
    2.15 ms with the yield against 1.95 to 2.58 without, alternated (BENCHMARKS.md)."""
    give_way()


def _digest_then_draw(
    result: np.ndarray, data: np.ndarray, following: int | None, rank: int, dtype: DType
) -> str:
    """The result's digest; then, unless ``following`` is None, that round's input drawn into ``data``."""
    digest = _digest(result)
    if following is not None:
        make_input(WORKLOAD_SEED, following, rank, dtype, len(data), out=data)
    return digest


def _digest(array: np.ndarray | None) -> str:
    return "" if array is None else hashlib.sha256(np.ascontiguousarray(array).data).hexdigest()


def _predraw(rounds: int, elements: int, rank: int, dtype: DType) -> np.ndarray:
    """Every round's input, one row per round (the draws of :func:`make_input`)."""
    inputs = np.empty((rounds, elements), dtype=NUMPY_TYPES[dtype])
    for index in range(rounds):
        make_input(WORKLOAD_SEED, index, rank, dtype, elements, out=inputs[index])
    return inputs


async def run_endpoint(cfg: NodeConfig) -> int:
    spec = GroupSpec(
        group_id=parse_group_id(cfg.require("group_id")),
        world_size=cfg.require("world_size"),
        credential=cfg.credential.encode(),
        rank=cfg.rank,
        labels=cfg.labels,
        rendezvous=cfg.rendezvous,
        rendezvous_id=cfg.rendezvous_id,
    )
    stop = _stop_event()
    transport = transport_config(cfg)
    comm = await Communicator.join(spec, cfg.require("node_id"), transport)
    log.info(
        "%s joined as rank %d of %d (QUIC %s)",
        cfg.node_id,
        comm.rank,
        comm.world_size,
        transport.quic_backend,
    )
    try:
        if await _unless_stopped(_workload(comm, cfg), stop, cfg.node_id):
            # leave at once (no closing barrier) so that the other ranks' collectives
            # fail naming this rank instead of waiting for it
            await comm.close(linger=False)
    finally:
        await comm.close()
    return 0


async def _unless_stopped(workload: Coroutine[Any, Any, None], stop: asyncio.Event, node_id: str) -> bool:
    """Run ``workload`` until it ends or ``stop`` is set (SIGINT or SIGTERM); True if stopped.

    The signal wins over a workload that ended in the same turn of the loop, even with
    an error: when a whole job is stopped, the first rank to leave fails the collective
    the others had in flight, and that news can be read together with their own
    signal.  A workload that fails before the signal raises as usual."""
    task = asyncio.ensure_future(workload)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopping], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not stop.is_set():
        await task
        return False
    log.info("%s: stopping on a signal; leaving the group", node_id)
    if not task.done():
        task.cancel()
        await asyncio.wait([task])
    if not task.cancelled() and task.exception() is not None:
        log.info("%s: the collective in flight ended as it stopped: %s", node_id, task.exception())
    return True


async def _workload(comm: Communicator, cfg: NodeConfig) -> None:
    if cfg.workload == "conformance":
        summary = await _conformance(comm, cfg.elements)
        arrays = summary.pop("arrays")
        if cfg.results is not None:
            np.savez(cfg.results, **arrays)
    elif cfg.workload == "allreduce":
        dtype = _workload_dtype(cfg.dtype)
        quorum = None if cfg.quorum is None else Quorum(cfg.quorum, cfg.quorum_wait_ms / 1000)
        summary = await _allreduce_rounds(comm, cfg.rounds, cfg.elements, dtype, cfg.width, quorum)
        if cfg.results is not None:
            Path(cfg.results).write_text(json.dumps(summary, indent=2) + "\n")
    else:
        raise CcoError(ErrorCode.INVALID_FIELD, f"unknown workload {cfg.workload!r}")


def _workload_dtype(name: str) -> DType:
    dtype = DType.__members__.get(name.upper())
    if dtype is None or dtype not in NUMPY_TYPES:
        choices = ", ".join(d.name.lower() for d in NUMPY_TYPES)
        raise CcoError(ErrorCode.INVALID_FIELD, f"workload dtype {name!r} is not one of {choices}")
    return dtype


async def _allreduce_rounds(
    comm: Communicator, rounds: int, elements: int, dtype: DType, width: int | None, quorum: Quorum | None
) -> dict[str, Any]:
    """Verified all-reduce rounds (float32 by default); one progress line per round on stdout.
    Under ``quorum`` each round's record also names the ranks it was over.

    A small run (:data:`PREDRAWN_BYTES`) draws its inputs before the first call and
    hashes its results after the last, so that between calls it only yields the
    core (:func:`_yield_core`).  A larger one reuses one input and one result array,
    as a training loop reuses its buffers, and between two calls hashes the result,
    then draws the next round's input, on a worker thread: for 64 MiB they took 0.13 s
    and 0.23 s of CPU, which on a loaded machine held the event loop (and so this
    node's heartbeats) for seconds, long enough for the rendezvous to evict the rank.

    A strict run ends with a barrier, not timed, before its results are hashed and
    reported (see the comment there).

    Each record also has ``started``, the call's time on ``time.monotonic()`` (on
    Linux the system-wide CLOCK_MONOTONIC), so that the ranks' records of one host can
    be lined up: when the last rank called, and when the last one had its result.
    """
    records = []
    predrawn = rounds * elements * np.dtype(NUMPY_TYPES[dtype]).itemsize <= PREDRAWN_BYTES
    if predrawn:
        # on a worker thread: 100,000 small rounds take seconds to draw, and the event
        # loop must keep serving heartbeats meanwhile
        inputs = await asyncio.to_thread(_predraw, rounds, elements, comm.rank, dtype)
        outputs = np.empty_like(inputs)
        results: list[np.ndarray] = []
    else:
        data = await asyncio.to_thread(make_input, WORKLOAD_SEED, 0, comm.rank, dtype, elements)
        out = np.empty_like(data)
    for round_index in range(rounds):
        if predrawn:
            data, out = inputs[round_index], outputs[round_index]
            _yield_core()
        started, start = time.monotonic(), time.perf_counter()
        contributors: list[int] | None = None
        if quorum is None:
            result = await comm.all_reduce(data, ReduceOp.SUM, width=width, out=out)
        else:
            partial = await comm.all_reduce_quorum(
                data, ReduceOp.SUM, min_ranks=quorum.min_ranks, wait=quorum.wait, width=width, out=out
            )
            result, contributors = partial.array, sorted(partial.contributors)
        seconds = time.perf_counter() - start
        if predrawn:
            results.append(result)
            digest = ""  # hashed after the last round
        else:
            following = round_index + 1 if round_index + 1 < rounds else None
            digest = await asyncio.to_thread(_digest_then_draw, result, data, following, comm.rank, dtype)
        record: dict[str, Any] = {
            "round": round_index,
            "seconds": seconds,
            "started": started,
            "bytes": data.nbytes,
            "sha256": digest,
        }
        if contributors is not None:
            record["contributors"] = contributors
        records.append(record)
        _progress(
            f"rank {comm.rank}: round {round_index + 1}/{rounds} verified, "
            f"{data.nbytes / 1e6:.1f} MB in {seconds * 1e3:.0f} ms "
            f"({data.nbytes / seconds / 1e6:.1f} MB/s)"
        )
    if quorum is None and rounds:
        # Every rank has its last result before any rank hashes, reports and leaves:
        # otherwise the first ranks done spend CPU on it while a slower one still
        # verifies its last result, on the same cores.  Without this, the last of 200
        # 8-byte rounds was the slowest, or among the four slowest, in each of nine
        # runs, and set their p99.  (A quorum run does not wait for every member.)
        await comm.barrier()
    if predrawn:
        digests = await asyncio.to_thread(lambda: [_digest(result) for result in results])
        for record, digest in zip(records, digests, strict=True):
            record["sha256"] = digest
    return {
        "rank": comm.rank,
        "world_size": comm.world_size,
        "rounds": records,
        "peak_rss_bytes": peak_rss_bytes(),
    }


async def _conformance(comm: Communicator, elements: int) -> dict[str, Any]:
    """Every collective of :func:`conformance_cases`, results kept for the checker."""
    arrays: dict[str, np.ndarray] = {}
    length = elements - elements % comm.world_size  # reduce_scatter needs equal slices
    for index, case in enumerate(conformance_cases(comm.world_size)):
        data = make_input(WORKLOAD_SEED, index, comm.rank, case.dtype, length)
        array = None if case.kind is Collective.BARRIER else data
        request = CollectiveRequest(kind=case.kind, op=case.op, array=array, root=case.root)
        result = await comm.start(request)
        if result is not None:
            arrays[case.name] = result
        _progress(f"rank {comm.rank}: {case.name} verified")
    return {"arrays": arrays}


ROLE_MAINS = {"rendezvous": run_rendezvous, "aggregator": run_aggregator, "endpoint": run_endpoint}


def run_role(cfg: NodeConfig) -> int:
    """Run ``cfg``'s role to its end; the caller has set up logging (``cco.cli``)."""
    if cfg.role == "endpoint" and cfg.elements > kernels.SMALL:
        # The workload's chunks will run the compiled loops: load them with the rest
        # of start-up, before settle_heap() (see kernels.preload).
        kernels.preload()
    settle_heap()
    if cfg.busy_poll_us:
        log.info("event loop polls %d us before it sleeps", cfg.busy_poll_us)
    with asyncio.Runner(loop_factory=event_loop_factory(cfg.busy_poll_us)) as runner:
        return runner.run(ROLE_MAINS[cfg.role](cfg))


def settle_heap() -> None:
    """Collect, then exempt every object alive now (the modules and what importing
    them built) from later garbage collections.

    Otherwise the process's first full collection walks all of them: 17 to 25 ms,
    once per process, some hundred operations after start.  With five nodes on a
    machine that is five stalls of about 20 ms in the first 200 8-byte all-reduces
    (p99 18.5 to 23.1 against 6.4 to 8.8 ms with the objects exempted, fresh
    clusters on loopback).  Objects made later are collected as usual."""
    gc.collect()
    gc.freeze()
