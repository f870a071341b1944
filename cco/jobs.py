"""The endpoint node's job: join the group through the client, run the workload, leave.

The workload is a sequence of verified collectives on deterministic inputs
(:mod:`cco.workload`), so a run is repeatable and its results checkable by anyone
who knows the seed: ``allreduce`` rounds, each recorded with its time and a digest
of its result, or the ``conformance`` cases, whose results are kept for a checker.
This is an application of :mod:`cco.client`, above it; :mod:`cco.launch` runs it as
the ``endpoint`` role of ``cco-node``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import numpy as np

from cco.client import Communicator, GroupSpec
from cco.config import NodeConfig, parse_hostport
from cco.nodes.calls import CollectiveRequest
from cco.nodes.operation import Quorum
from cco.services.polling import give_way
from cco.services.roles import observe, parse_group_id, peak_rss_bytes, stop_event, transport_config
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.registries import Collective, DType, ReduceOp
from cco.workload import NUMPY_TYPES, conformance_cases, make_input

log = logging.getLogger("cco.node")

WORKLOAD_SEED = 2026
"""The seed of every workload input: rank r's input of round i is
``make_input(WORKLOAD_SEED, i, r, dtype, elements)``."""


PREDRAWN_BYTES = 4 << 20
"""A run of the ``allreduce`` workload whose inputs add up to at most this many bytes
(over all its rounds) draws every input before its first call and hashes every
result after its last: between two calls it only records the time and yields the
core (:func:`_yield_core`), as the Gloo side of the benchmarks only refills its
tensor.  Drawing and hashing between the calls of a small run (a new random generator
per round, then a hash) would take CPU from the other ranks still verifying the same
round on a host whose cores they share (``benchmarks/bench_latency.py`` measures the
rounds).  Inputs and results take twice this much memory at most; larger runs draw
and hash each round on a worker thread."""


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
    ends with the last of those (``benchmarks/bench_latency.py`` measures it)."""
    give_way()


def _digest_then_draw(
    result: np.ndarray, data: np.ndarray, following: int | None, rank: int, dtype: DType
) -> tuple[str, float]:
    """The result's digest; then, unless ``following`` is None, that round's input
    drawn into ``data``.  Also the CPU seconds this took (its own thread's), which the
    record reports so that a node's CPU per byte can leave the workload's out."""
    cpu = time.thread_time()
    digest = _digest(result)
    if following is not None:
        make_input(WORKLOAD_SEED, following, rank, dtype, len(data), out=data)
    return digest, time.thread_time() - cpu


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
    stop = stop_event()
    transport = transport_config(cfg)
    # cco.launch has loaded the compiled loops if this workload's chunks run them
    comm = await Communicator.join(spec, cfg.require("node_id"), transport, preload=False)
    log.info(
        "%s joined as rank %d of %d (QUIC %s)",
        cfg.node_id,
        comm.rank,
        comm.world_size,
        transport.quic_backend,
    )
    observe(comm.service, cfg)
    if cfg.status_listen is not None:
        host, port = await comm.service.listen_status(*parse_hostport(cfg.status_listen))
        log.info("%s answers status on %s:%d", cfg.node_id, host, port)
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
    then draws the next round's input, on a worker thread: on the event loop, a large
    round's hash and draw held it (and so this node's heartbeats) for seconds on a
    loaded machine, long enough for the rendezvous to evict the rank.

    A large run (not under quorum) also meets the other ranks in a barrier, not
    timed, before each call, as the Gloo side of the benchmarks does: hashing and
    drawing 64 MiB takes a rank tens of milliseconds of CPU, more where ranks share
    cores, and without the barrier the first rank to call timed its wait for the
    last one's draw as part of the collective.  Its records give that CPU too
    (``workload_cpu_seconds``, the worker thread's), which is the workload's and not
    the datapath's.

    A strict run ends with a barrier, not timed, before its results are hashed and
    reported (see the comment there).

    Each record also has ``chunk_elements``, the chunk size the call ran with (a float
    sum's ranks agree it call by call: :attr:`Communicator.last_chunk_elements`), and
    ``started``, the call's time on ``time.monotonic()`` (on
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
        elif quorum is None:
            await comm.barrier()
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
        workload_cpu = 0.0
        if predrawn:
            results.append(result)
            digest = ""  # hashed after the last round
        else:
            following = round_index + 1 if round_index + 1 < rounds else None
            digest, workload_cpu = await asyncio.to_thread(
                _digest_then_draw, result, data, following, comm.rank, dtype
            )
        record: dict[str, Any] = {
            "round": round_index,
            "seconds": seconds,
            "started": started,
            "bytes": data.nbytes,
            "sha256": digest,
            "workload_cpu_seconds": workload_cpu,
            "chunk_elements": comm.last_chunk_elements,
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
        # verifies its last result, on the same cores, and the last round is the
        # slowest of a run.  (A quorum run does not wait for every member.)
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


__all__ = ["PREDRAWN_BYTES", "WORKLOAD_SEED", "run_endpoint"]
