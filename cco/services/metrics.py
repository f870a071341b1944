"""Prometheus metrics of one node (``--metrics-listen HOST:PORT``, package prometheus-client).

What is counted, and where it comes from:

* ``cco_collectives_total{kind,op,dtype,outcome}``: operations this node saw end
  (an endpoint: its own calls, completed or failed; an aggregator: every operation
  whose chunks it all passed on, or that was aborted);
* ``cco_chunk_bytes_total{direction,way}``: payload bytes of chunk messages, ``up``
  (contributions and partial aggregates) or ``down`` (results, broadcast data),
  ``sent`` or ``received``;
* ``cco_chunk_seconds`` and ``cco_operation_seconds{kind}``: histograms, from a
  chunk's first message here to its completion here, and from an operation's first
  chunk to its end;
* ``cco_agreed_chunk_elements``: a histogram of the chunk size, in elements, each
  block-scaled operation (float SUM, AVG) an endpoint completed was cut at, as its
  ranks agreed in its scale pass;
* ``cco_retransmit_requests_total{way}``: RetransmitRequests sent or received;
* ``cco_verification_failures_total{kind}``: results an endpoint refused and parts an
  aggregator refused, by error code (VERIFICATION_FAILED, OVERFLOW,
  DUPLICATE_CONTRIBUTION, OPERATION_MISMATCH, UNKNOWN_OPERATION);
* ``cco_join_rejections_total{code}`` and ``cco_events_total{event}`` from the
  machines' reports (joins, leaves, losses, registrations, epochs, trees);
* read when scraped, at no cost in between: ``cco_groups``, ``cco_group_epoch{group}``,
  ``cco_group_members{group}``, ``cco_aggregators`` and ``cco_aggregator_load{aggregator}``
  (a rendezvous), ``cco_peers``, ``cco_quic_rtt_seconds{peer}`` and
  ``cco_quic_lost_packets{peer}`` (qh3 only) of every open connection.

Counting happens once per chunk message, never per element or byte in a Python
loop; ``benchmarks/probes/bench_observer_cost.py`` measures what it costs a chunk message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cco.nodes.endpoint import EndpointMachine
from cco.nodes.events import Command, Happening, OperationCompleted, OperationFailed, Report
from cco.services.status import rendezvous_of
from cco.wire.errors import ErrorCode
from cco.wire.messages import (
    Abort,
    BroadcastData,
    ChunkMessage,
    Contribution,
    Error,
    Message,
    PartialAggregate,
    RetransmitRequest,
    chunk_count,
)

if TYPE_CHECKING:
    from cco.services.runner import MachineRunner

VERIFICATION_CODES = frozenset(
    {
        ErrorCode.VERIFICATION_FAILED,
        ErrorCode.OVERFLOW,
        ErrorCode.DUPLICATE_CONTRIBUTION,
        ErrorCode.OPERATION_MISMATCH,
        ErrorCode.UNKNOWN_OPERATION,
    }
)
CHUNK_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
OPERATION_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
CHUNK_ELEMENT_BUCKETS = tuple(float(1 << bits) for bits in range(10, 21))
"""Powers of two: a rank proposes its group's chunk size doubled a whole number of times."""
MAX_TRACKED = 4096
"""Open operations and chunks timed at once; beyond that the oldest are no longer timed."""

ChunkKey = tuple[bytes, int, int, int]
OpKey = tuple[bytes, int, int]


@dataclass(slots=True)
class _Operation:
    labels: tuple[str, str, str]  # kind, op, dtype
    started: float
    chunks: int
    done: int = 0
    timed: list[ChunkKey] = field(default_factory=list)  # its chunks being timed


class NodeMetrics:
    """The metrics of one node, in a registry of its own (several nodes may share a process)."""

    def __init__(self, runner: MachineRunner) -> None:
        """Made on the event loop that runs ``runner`` (the gauges are read there)."""
        self.registry = CollectorRegistry()
        self.runner = runner
        registry = self.registry
        self.collectives = Counter(
            "cco_collectives",
            "Collective operations this node saw end",
            ["kind", "op", "dtype", "outcome"],
            registry=registry,
        )
        self.chunk_seconds = Histogram(
            "cco_chunk_seconds",
            "From a chunk's first message at this node to its completion here",
            buckets=CHUNK_BUCKETS,
            registry=registry,
        )
        self.operation_seconds = Histogram(
            "cco_operation_seconds",
            "From an operation's first chunk at this node to its end here",
            ["kind"],
            buckets=OPERATION_BUCKETS,
            registry=registry,
        )
        self.agreed_chunk_elements = Histogram(
            "cco_agreed_chunk_elements",
            "Elements per chunk of each block-scaled operation completed here, as its ranks agreed",
            buckets=CHUNK_ELEMENT_BUCKETS,
            registry=registry,
        )
        self.retransmit_requests = Counter(
            "cco_retransmit_requests", "RetransmitRequest messages", ["way"], registry=registry
        )
        self.verification_failures = Counter(
            "cco_verification_failures",
            "Results refused by an endpoint and parts refused by an aggregator, by error code",
            ["kind"],
            registry=registry,
        )
        self.join_rejections = Counter(
            "cco_join_rejections", "JoinRequests refused by this rendezvous", ["code"], registry=registry
        )
        self.events = Counter(
            "cco_events",
            "Membership and registration events (the INFO log lines)",
            ["event"],
            registry=registry,
        )
        registry.register(_Snapshot(self, asyncio.get_running_loop()))
        self._operations: dict[OpKey, _Operation] = {}
        self._chunks: dict[ChunkKey, float] = {}
        self._op_ids: dict[int, OpKey] = {}  # an endpoint's op id -> its key
        self._endpoint = isinstance(runner.machine, EndpointMachine)
        """An endpoint's operations end with its machine's word (completed or failed), an
        aggregator's when it has passed on every chunk."""
        self.chunk_bytes = [0, 0, 0, 0]  # up sent, up received, down sent, down received
        """Plain integers, read by the scrape on the event loop: a chunk message adds to
        one without the lock a prometheus Counter takes."""

    def serve(self, host: str, port: int) -> tuple[str, int]:
        """Serve ``/metrics`` over HTTP on a thread of its own; the address it listens on."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        address = server.server_address
        return str(address[0]), int(address[1])

    def close(self) -> None:
        server = getattr(self, "_server", None)
        if server is not None:
            server.shutdown()
            server.server_close()

    # --- what the runner reports (once per message) -----------------------------------

    def received(self, message: Message, now: float) -> None:
        if isinstance(message, ChunkMessage):
            up = isinstance(message, Contribution | PartialAggregate)
            self.chunk_bytes[1 if up else 3] += len(message.payload)
            self._first_seen(message, now)
            if not up:
                self._chunk_done(message, now)
        elif isinstance(message, RetransmitRequest):
            self.retransmit_requests.labels("received").inc()
        elif isinstance(message, Abort):
            self._aborted(message)

    def sent(self, message: Message, now: float) -> None:
        if isinstance(message, ChunkMessage):
            up = isinstance(message, Contribution | PartialAggregate)
            self.chunk_bytes[0 if up else 2] += len(message.payload)
            if up or (self._endpoint and isinstance(message, BroadcastData)):
                self._first_seen(message, now)  # a broadcast's root sends its own data down
            if not isinstance(message, Contribution | BroadcastData):
                self._chunk_done(message, now)  # passed on up, or the result sent down (once per child)
        elif isinstance(message, RetransmitRequest):
            self.retransmit_requests.labels("sent").inc()
        elif isinstance(message, Error) and message.code in VERIFICATION_CODES:
            self.verification_failures.labels(message.code.name.lower()).inc()
        elif isinstance(message, Abort):
            self._aborted(message)

    def command(self, command: Command, now: float) -> None:
        if isinstance(command, OperationCompleted | OperationFailed):
            key = self._op_ids.pop(command.op_id, None)
            operation = self._operations.pop(key, None) if key is not None else None
            if isinstance(command, OperationFailed) and command.error.code in VERIFICATION_CODES:
                self.verification_failures.labels(command.error.code.name.lower()).inc()
            if isinstance(command, OperationCompleted) and command.agreement is not None:
                self.agreed_chunk_elements.observe(command.agreement.agreed)
            if operation is not None:
                self._forget_chunks(operation)
                outcome = "completed" if isinstance(command, OperationCompleted) else "failed"
                self._end(operation, outcome, now)

    def report(self, report: Report) -> None:
        self.events.labels(report.what.name.lower()).inc()
        if report.what is Happening.JOIN_REJECTED:
            self.join_rejections.labels(report.code.name).inc()

    # --- timing -------------------------------------------------------------------------

    def _first_seen(self, message: ChunkMessage, now: float) -> None:
        chunk = (message.group_id, message.epoch, message.op_id, message.chunk_index)
        if chunk in self._chunks or len(self._chunks) >= MAX_TRACKED:
            return
        self._chunks[chunk] = now
        op = chunk[:3]
        operation = self._operations.get(op)
        if operation is None:
            if len(self._operations) >= MAX_TRACKED:
                return
            labels = (message.kind.name.lower(), message.op.name.lower(), message.dtype.name.lower())
            chunks = chunk_count(message.total_elements, message.chunk_elements)
            operation = self._operations[op] = _Operation(labels, now, chunks)
            if self._endpoint:
                self._op_ids[message.op_id] = op
        operation.timed.append(chunk)

    def _chunk_done(self, message: ChunkMessage, now: float) -> None:
        started = self._chunks.pop(
            (message.group_id, message.epoch, message.op_id, message.chunk_index), None
        )
        if started is None:
            return
        self.chunk_seconds.observe(now - started)
        op = (message.group_id, message.epoch, message.op_id)
        operation = self._operations.get(op)
        if operation is None:
            return
        operation.done += 1
        if operation.done >= operation.chunks and not self._endpoint:
            del self._operations[op]  # an aggregator's operation: all its chunks passed on
            self._end(operation, "completed", now)

    def _aborted(self, message: Abort) -> None:
        op = (message.group_id, message.epoch, message.op_id)
        operation = self._operations.pop(op, None)
        if operation is not None:
            if self._op_ids.get(message.op_id) == op:
                del self._op_ids[message.op_id]
            self._forget_chunks(operation)
            self.collectives.labels(*operation.labels, "aborted").inc()

    def _forget_chunks(self, operation: _Operation) -> None:
        for chunk in operation.timed:
            self._chunks.pop(chunk, None)

    def _end(self, operation: _Operation, outcome: str, now: float) -> None:
        self.collectives.labels(*operation.labels, outcome).inc()
        self.operation_seconds.labels(operation.labels[0]).observe(now - operation.started)


@dataclass(frozen=True, slots=True)
class _Gauges:
    """What the scrape-time gauges show, read on the event loop's thread."""

    rendezvous: bool
    groups: list[tuple[str, int, int | None]]  # group id, epoch, members (a rendezvous)
    aggregators: list[tuple[str, int, int]]  # node id, trees, capacity
    links: list[tuple[str, float | None, int | None]]  # peer, smoothed RTT, lost packets
    chunk_bytes: tuple[int, ...]  # up sent, up received, down sent, down received


_BYTE_LABELS = (("up", "sent"), ("up", "received"), ("down", "sent"), ("down", "received"))

SCRAPE_WAIT = 5.0
"""Seconds a scrape waits for the event loop to read the gauges."""


class _Snapshot(Collector):
    """Gauges read when scraped: groups, epochs, members, aggregators, connections.

    The HTTP server runs on a thread of its own; the state it reports belongs to the
    event loop's thread, so it is read there (one short call per scrape)."""

    def __init__(self, metrics: NodeMetrics, loop: asyncio.AbstractEventLoop) -> None:
        self._metrics = metrics
        self._loop = loop

    async def _read(self) -> _Gauges:
        runner = self._metrics.runner
        rendezvous = rendezvous_of(runner.machine)
        groups: list[tuple[str, int, int | None]]
        if rendezvous is not None:
            status = rendezvous.status()
            groups = [(g.group_id.hex(), g.epoch, len(g.members)) for g in status.groups]
            aggregators = [(a.node_id, len(a.groups), a.capacity) for a in status.aggregators]
        else:
            groups = [(g.hex(), place.epoch, None) for g, place in runner.recorder.groups.items()]
            aggregators = []
        links = []
        for link in runner.links():
            stats = link.path_stats()
            links.append((link.node_id, stats.smoothed_rtt, stats.lost_packets))
        chunk_bytes = tuple(self._metrics.chunk_bytes)
        return _Gauges(rendezvous is not None, groups, aggregators, links, chunk_bytes)

    def collect(self) -> Iterator[Any]:
        try:
            gauges = asyncio.run_coroutine_threadsafe(self._read(), self._loop).result(SCRAPE_WAIT)
        except (TimeoutError, RuntimeError):
            return  # the loop is stopping, or too busy to answer: counters only this time
        count = GaugeMetricFamily("cco_groups", "Groups this node serves or belongs to")
        count.add_metric([], len(gauges.groups))
        epoch = GaugeMetricFamily("cco_group_epoch", "A group's current epoch at this node", labels=["group"])
        members = GaugeMetricFamily("cco_group_members", "A group's members (a rendezvous)", labels=["group"])
        for group, current, size in gauges.groups:
            epoch.add_metric([group], current)
            if size is not None:
                members.add_metric([group], size)
        yield from (count, epoch, members)
        if gauges.rendezvous:
            aggregators = GaugeMetricFamily("cco_aggregators", "Aggregators registered with this rendezvous")
            aggregators.add_metric([], len(gauges.aggregators))
            load = GaugeMetricFamily(
                "cco_aggregator_load",
                "Trees an aggregator is in, and its capacity",
                labels=["aggregator", "of"],
            )
            for node, trees, capacity in gauges.aggregators:
                load.add_metric([node, "trees"], trees)
                load.add_metric([node, "capacity"], capacity)
            yield from (aggregators, load)
        peers = GaugeMetricFamily("cco_peers", "Open connections of this node")
        peers.add_metric([], len(gauges.links))
        rtt = GaugeMetricFamily(
            "cco_quic_rtt_seconds", "Smoothed round trip of a connection", labels=["peer"]
        )
        lost = GaugeMetricFamily(
            "cco_quic_lost_packets", "Packets a connection declared lost (qh3 only)", labels=["peer"]
        )
        for peer, smoothed, lost_packets in gauges.links:
            if smoothed is not None:
                rtt.add_metric([peer], smoothed)
            if lost_packets is not None:
                lost.add_metric([peer], lost_packets)
        yield from (peers, rtt, lost)
        sent = CounterMetricFamily(
            "cco_chunk_bytes", "Payload bytes of chunk messages", labels=["direction", "way"]
        )
        for (direction, way), total in zip(_BYTE_LABELS, gauges.chunk_bytes, strict=True):
            sent.add_metric([direction, way], total)
        yield sent


__all__ = ["VERIFICATION_CODES", "NodeMetrics"]
