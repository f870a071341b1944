"""The endpoint client library: join a group, then run verified collectives.

Two faces over one endpoint session (:class:`~cco.nodes.endpoint.EndpointMachine`):

* :class:`Communicator`, for asyncio code: ``await comm.all_reduce(x)``, or
  ``handle = comm.start_all_reduce(x)`` and ``await handle`` later;
* :class:`BlockingCommunicator`, for plain code: the same calls, run on a private
  event loop thread; ``start_*`` return a :class:`concurrent.futures.Future`.

Every result has passed verification (range, contributor bitmap and homomorphic
tag, or the hop-by-hop checks for MIN/MAX/bitwise ops) before it is returned.  Every
failure is an :class:`~cco.wire.errors.CcoError`; failures of a collective are
:class:`~cco.nodes.calls.OperationError`, which names the group, the operation and
the missing ranks when they are known.  Collectives must be called in the same order
on every rank, as with torch.distributed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from cco.config import parse_hostport
from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
from cco.nodes.calls import CollectiveRequest, EndpointConfig
from cco.nodes.endpoint import EndpointMachine, Prepared
from cco.nodes.endpoint_states import LinkState, SessionState
from cco.nodes.events import Command, Joined, JoinFailed, OperationCompleted, OperationFailed
from cco.nodes.operation import Quorum
from cco.nodes.rendezvous import FALLBACK_LABEL
from cco.services.node import NodeService, Redialer
from cco.services.polling import event_loop_factory
from cco.transport import TransportConfig
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Address
from cco.wire.registries import Collective, ReduceOp, Role

T = TypeVar("T")

log = logging.getLogger("cco.client")

DEFAULT_JOIN_TIMEOUT = 30.0
_ENDED = (SessionState.REJECTED, SessionState.LEFT, SessionState.CLOSED)
OFF_LOOP_ELEMENTS = 1 << 20
"""Arrays of this many elements or more have their whole-tensor work at start (scale
proposals, encoding checks: about 0.15 s per 64 MiB of float32 here, seconds on a
loaded machine) done on a worker thread, so that the event loop keeps serving every
connection, heartbeats included, meanwhile.  Smaller ones start at once."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupSpec:
    """Which group to join and how to reach its rendezvous."""

    group_id: bytes
    world_size: int
    credential: bytes = b""
    rank: int | None = None
    labels: tuple[str, ...] = ()
    rendezvous: str = "127.0.0.1:4433"
    rendezvous_id: str = "rendezvous"
    elastic: bool = False
    """When members leave or die: strict (False) fails every collective, naming the
    lost ranks, until :meth:`Communicator.accept_membership`; elastic (True) fails
    only those in flight and continues over the survivors."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FallbackAggregator:
    """An aggregator this endpoint runs beside it, so that its group keeps working when
    no dedicated aggregator can serve it (draft section "Fallback to End Hosts").

    It registers with the rendezvous under the fallback label: the rendezvous places
    it in a tree only when the dedicated aggregators cannot hold the group, and moves
    the group back to dedicated ones as soon as they can.  It has its own identity
    (``node_id`` and ``transport``: a certificate with the aggregator role) and
    listens on ``host`` and ``port`` (0: any free port), an address the group's
    other endpoints must be able to reach.
    """

    node_id: str
    transport: TransportConfig
    host: str = "127.0.0.1"
    port: int = 0
    max_fan_in: int = 64


@dataclass(frozen=True, slots=True)
class PartialResult:
    """What a quorum all-reduce returns: the verified reduction of ``contributors``'
    arrays (AVG divides by their number).  The ranks missing from it came too late,
    or never; a rank that was late gets the same result without having contributed."""

    array: np.ndarray
    contributors: frozenset[int]


class Communicator:
    """One membership of one group, for asyncio code.  Create with :meth:`join`."""

    def __init__(self, service: NodeService, machine: EndpointMachine, spec: GroupSpec) -> None:
        self._service = service
        self._machine = machine
        self.spec = spec
        self._joined: asyncio.Future[Joined] = asyncio.get_running_loop().create_future()
        self._joined.add_done_callback(_retrieve)
        self._pending: dict[int, asyncio.Future[np.ndarray | None]] = {}
        self._partial: dict[int, asyncio.Future[PartialResult]] = {}
        self._closing = False  # close() has begun (it runs once)
        self._closed = False  # close() is past its barrier: no new collectives
        self._fallback: NodeService | None = None  # the aggregator this endpoint runs, if any
        self._redial: asyncio.Task[None] | None = None  # dials a lost rendezvous again
        self._starting: asyncio.Task[None] | None = None  # the last start still preparing off the loop

    @classmethod
    async def join(
        cls,
        spec: GroupSpec,
        node_id: str,
        transport: TransportConfig,
        timeout: float = DEFAULT_JOIN_TIMEOUT,
        fallback: FallbackAggregator | None = None,
    ) -> Communicator:
        """Connect to the rendezvous, join the group and wait until the tree is ready;
        with ``fallback``, also run an aggregator for the group (see
        :class:`FallbackAggregator`)."""
        machine = EndpointMachine(
            EndpointConfig(
                group_id=spec.group_id,
                world_size=spec.world_size,
                credential=spec.credential,
                rank=spec.rank,
                labels=spec.labels,
                elastic=spec.elastic,
            )
        )
        service = NodeService(machine, node_id, Role.ENDPOINT, transport)
        comm = cls(service, machine, spec)
        service.runner.on_command = comm._on_command
        host, port = parse_hostport(spec.rendezvous)
        try:
            if fallback is not None:
                comm._fallback = await _start_fallback(fallback, spec)
            await service.join_rendezvous(host, port, spec.rendezvous_id)
            await asyncio.wait_for(asyncio.shield(comm._joined), timeout)
            comm._redial = asyncio.ensure_future(comm._stay_attached())
        except TimeoutError:
            await comm._close_services()
            raise CcoError(
                ErrorCode.TIMEOUT,
                f"group {spec.group_id.hex()}: not ready within {timeout} s "
                f"(are all {spec.world_size} members and an aggregator up?)",
            ) from None
        except BaseException:
            await comm._close_services()
            raise
        return comm

    async def _stay_attached(self) -> None:
        """Dial the rendezvous again whenever the session is detached from it (a restart,
        a network failure), 1 s, 2 s, 4 s ... up to 30 s apart, until the session ends;
        the session resumes its membership on the new connection (or closes, after
        ``EndpointConfig.rendezvous_grace``)."""
        redial = Redialer(
            self._service, parse_hostport(self.spec.rendezvous), self.spec.rendezvous_id, "endpoint"
        )
        while self._machine.state not in _ENDED:
            if self._machine.link is LinkState.DETACHED and await redial.attempt(asyncio.sleep):
                log.info("rendezvous %s reached again: resuming the membership", self.spec.rendezvous)
            await asyncio.sleep(0.2)

    async def _close_services(self) -> None:
        if self._redial is not None:
            self._redial.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._redial
        await self._service.close()
        if self._fallback is not None:
            await self._fallback.close()

    # --- identity ------------------------------------------------------------------

    @property
    def service(self) -> NodeService:
        """The node service under this communicator: operators' tools read its flight
        recorder and answer status through it (:mod:`cco.services.status`)."""
        return self._service

    @property
    def rank(self) -> int:
        rank = self._machine.rank
        assert rank is not None, "rank is known once join() returned"
        return rank

    @property
    def world_size(self) -> int:
        """How many members the group has now (the rendezvous's word, epoch by epoch)."""
        return len(self._machine.members)

    @property
    def members(self) -> frozenset[int]:
        """The ranks of the group's members now; ranks keep their numbers when others leave."""
        return self._machine.members

    def accept_membership(self) -> frozenset[int]:
        """Run later collectives over the current members (after a PEER_LOST naming the
        ranks that left); returns them.  Every surviving rank must call it at the same
        point of its sequence of collectives."""
        return self._machine.accept_membership()

    @property
    def epoch(self) -> int:
        return self._machine.epoch

    # --- collectives ---------------------------------------------------------------

    def start(self, request: CollectiveRequest) -> asyncio.Future[np.ndarray | None]:
        """Begin one collective; the future resolves to its verified result.

        The input array is read chunk by chunk while the operation runs, not copied:
        do not modify it until the future is done (as with torch.distributed's
        asynchronous operations).
        """
        return self._start(request, self._pending)

    def _start(self, request: CollectiveRequest, pending: dict[int, asyncio.Future[T]]) -> asyncio.Future[T]:
        """Start ``request``; its future, resolved from ``pending`` by _on_command.

        A large array is prepared on a worker thread first (see OFF_LOOP_ELEMENTS);
        calls still start on the machine in the order they were made, so every rank's
        op_ids stay aligned.  Misuse raises here, at the call, either way.
        """
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if self._closed:
            future.set_exception(CcoError(ErrorCode.ABORTED, "communicator closed"))
            return future
        large = request.array is not None and np.asarray(request.array).size >= OFF_LOOP_ELEMENTS
        if self._starting is None and not large:
            now = self._service.runner.clock()
            op_id, commands = self._machine.start(request, now)  # raises CcoError on misuse
            pending[op_id] = future
            self._service.runner.execute_all(commands)
            return future
        prepared = self._machine.prepare(request)  # raises CcoError on misuse
        task = asyncio.ensure_future(self._start_later(prepared, pending, future, self._starting, large))
        self._starting = task
        task.add_done_callback(self._started)
        return future

    async def _start_later(
        self,
        prepared: Prepared,
        pending: dict[int, asyncio.Future[T]],
        future: asyncio.Future[T],
        previous: asyncio.Task[None] | None,
        off_loop: bool,
    ) -> None:
        if off_loop:
            await asyncio.get_running_loop().run_in_executor(None, prepared.compute)
        if previous is not None:
            await asyncio.wait([previous])
        if self._closed:
            if not future.done():
                future.set_exception(CcoError(ErrorCode.ABORTED, "communicator closed"))
            return
        try:
            op_id, commands = self._machine.start(prepared.request, self._service.runner.clock(), prepared)
        except CcoError as error:
            if not future.done():
                future.set_exception(error)
            return
        pending[op_id] = future
        self._service.runner.execute_all(commands)

    def _started(self, task: asyncio.Task[None]) -> None:
        if self._starting is task:
            self._starting = None

    def start_all_reduce_quorum(
        self, array: np.ndarray, op: ReduceOp = ReduceOp.SUM, *, min_ranks: int, wait: float, **kw: Any
    ) -> asyncio.Future[PartialResult]:
        """Begin a quorum all-reduce (see :meth:`all_reduce_quorum`)."""
        request = CollectiveRequest(
            kind=Collective.ALL_REDUCE, op=op, array=array, quorum=Quorum(min_ranks, wait), **kw
        )
        return self._start(request, self._partial)

    async def all_reduce_quorum(
        self, array: np.ndarray, op: ReduceOp = ReduceOp.SUM, *, min_ranks: int, wait: float, **kw: Any
    ) -> PartialResult:
        """An all-reduce under the quorum policy: the verified reduction over the ranks
        that contributed within ``wait`` seconds (counted at each aggregator from the
        first rank it hears from), at least ``min_ranks`` of the accepted members,
        with the contributors it is over.  Stragglers get the same result without
        having contributed.  With fewer than ``min_ranks`` in time it waits for more
        until the operation's timeout, then fails naming the missing ranks, as
        :meth:`all_reduce` (the strict policy) does.  Every rank must pass the same
        ``min_ranks`` and ``wait``; keywords as for :meth:`all_reduce`."""
        return await self.start_all_reduce_quorum(array, op, min_ranks=min_ranks, wait=wait, **kw)

    def start_all_reduce(
        self, array: np.ndarray, op: ReduceOp = ReduceOp.SUM, **kw: Any
    ) -> asyncio.Future[Any]:
        return self.start(CollectiveRequest(kind=Collective.ALL_REDUCE, op=op, array=array, **kw))

    async def all_reduce(self, array: np.ndarray, op: ReduceOp = ReduceOp.SUM, **kw: Any) -> np.ndarray:
        """Every rank gets the elementwise reduction of every rank's ``array``.

        Keywords are those of :class:`CollectiveRequest`: ``timeout`` (seconds), ``out``
        (an array of the result's shape and dtype to write it to, reused call after
        call instead of a new array each time), and for float SUM and AVG ``width``,
        the bits per element on the wire (8, 16, 32 or 64; default: the group's
        ``float_width``, else the dtype's own).  Floats in sums of
        more than 16 elements are block-scaled fixed point: each element of the result
        is within about c x M / Q of the exact sum (M: the largest magnitude in its block
        on any rank, c: the contributors, Q = (2^(width-1) - 1) / world_size).  Sums of
        at most 16 floats are exact limbs, whatever ``width``: the exact sum rounded
        once, in one round trip instead of two.  Either way the result is bit-identical
        on every rank; MIN and MAX of floats are exact."""
        return _present(await self.start_all_reduce(array, op, **kw))

    async def reduce(
        self, array: np.ndarray, root: int, op: ReduceOp = ReduceOp.SUM, **kw: Any
    ) -> np.ndarray | None:
        """Like all_reduce, but only ``root`` gets the result (others get None)."""
        return await self.start(
            CollectiveRequest(kind=Collective.REDUCE, op=op, array=array, root=root, **kw)
        )

    async def broadcast(self, array: np.ndarray, root: int, **kw: Any) -> np.ndarray:
        """Every rank gets ``root``'s array; other ranks pass an array of the same shape and dtype."""
        return _present(
            await self.start(CollectiveRequest(kind=Collective.BROADCAST, array=array, root=root, **kw))
        )

    async def barrier(self, **kw: Any) -> None:
        """Returns once every rank has entered the barrier."""
        await self.start(CollectiveRequest(kind=Collective.BARRIER, **kw))

    async def all_gather(self, array: np.ndarray, **kw: Any) -> np.ndarray:
        """Every rank gets shape ``(world_size, *array.shape)``: row ``r`` is rank ``r``'s array."""
        return _present(await self.start(CollectiveRequest(kind=Collective.ALL_GATHER, array=array, **kw)))

    async def reduce_scatter(self, array: np.ndarray, op: ReduceOp = ReduceOp.SUM, **kw: Any) -> np.ndarray:
        """Each rank gets its equal slice (by rank) of the reduction of every rank's ``array``."""
        request = CollectiveRequest(kind=Collective.REDUCE_SCATTER, op=op, array=array, **kw)
        return _present(await self.start(request))

    # --- lifetime ------------------------------------------------------------------

    async def close(self, *, linger: bool = True, timeout: float | None = None) -> None:
        """Leave the group and close every connection.

        With ``linger`` (the default) closing is collective: the rank first waits at a
        barrier until every rank has called close().  A Leave starts a new epoch,
        which ends every operation still in flight in the group, so without the
        barrier a fast rank leaving could fail a slower rank's last collective
        whose results were still on their way.  If the barrier fails (a rank was
        lost, or ``timeout`` seconds passed) the rank leaves anyway.  Operations of
        this rank still pending when close() is called fail with ABORTED.
        """
        if self._closing:
            return
        self._closing = True
        if linger:
            with contextlib.suppress(CcoError):
                await self.barrier(timeout=timeout)
        self._closed = True  # from here on, new collectives fail with ABORTED
        self._service.runner.execute_all(self._machine.leave(self._service.runner.clock()))
        await asyncio.sleep(0)  # let the Leave reach the transport queue
        await self._close_services()
        self._fail_all(CcoError(ErrorCode.ABORTED, "communicator closed"))

    async def __aenter__(self) -> Communicator:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """Close; collectively (at a barrier) only when the block ended normally: after an
        exception, KeyboardInterrupt or cancellation the rank leaves at once, and the
        other ranks' collectives fail naming it instead of waiting for it."""
        await self.close(linger=exc_type is None)

    def _on_command(self, command: Command) -> None:
        if isinstance(command, Joined):
            if not self._joined.done():
                self._joined.set_result(command)
        elif isinstance(command, JoinFailed):
            if not self._joined.done():
                self._joined.set_exception(
                    CcoError(command.code, f"group {command.group_id.hex()}: {command.detail}")
                )
        elif isinstance(command, OperationCompleted):
            partial = self._partial.pop(command.op_id, None)
            if partial is not None and not partial.done():
                assert command.contributors is not None
                partial.set_result(PartialResult(_present(command.result), command.contributors))
            future = self._pending.pop(command.op_id, None)
            if future is not None and not future.done():
                future.set_result(command.result)
        elif isinstance(command, OperationFailed):
            futures: list[asyncio.Future[Any] | None] = [
                self._pending.pop(command.op_id, None),
                self._partial.pop(command.op_id, None),
            ]
            for failed in futures:
                if failed is not None and not failed.done():
                    failed.set_exception(command.error)

    def _fail_all(self, error: CcoError) -> None:
        futures: list[asyncio.Future[Any]] = [*self._pending.values(), *self._partial.values()]
        for future in futures:
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        self._partial.clear()


async def _on_loop(function: Callable[[], T]) -> T:
    """Run ``function`` on the communicator's event loop thread (the machine's only thread)."""
    return function()


async def _start_fallback(fallback: FallbackAggregator, spec: GroupSpec) -> NodeService:
    """Listen (learning the port if it was 0), then register with the rendezvous."""
    host, port = fallback.host, fallback.port

    def machine(port: int) -> AggregatorMachine:
        config = AggregatorConfig(
            address=Address(host=host, port=port),
            capacity=1,
            max_fan_in=fallback.max_fan_in,
            labels=(FALLBACK_LABEL,),
        )
        return AggregatorMachine(config)

    service = NodeService(machine(port or 1), fallback.node_id, Role.AGGREGATOR, fallback.transport)
    try:
        _, bound = await service.listen(host, port)
        service.runner.machine = machine(bound)  # its address is now known, before registering
        rv_host, rv_port = parse_hostport(spec.rendezvous)
        await service.join_rendezvous(rv_host, rv_port, spec.rendezvous_id)
    except BaseException:
        await service.close()
        raise
    return service


def _retrieve(future: asyncio.Future[Joined]) -> None:
    """Mark a join failure seen even when join() already gave up waiting."""
    if not future.cancelled():
        future.exception()


def _present(result: np.ndarray | None) -> np.ndarray:
    if result is None:
        raise CcoError(ErrorCode.INTERNAL_ERROR, "collective completed without a result")
    return result


class BlockingCommunicator:
    """The :class:`Communicator` API for code without an event loop.

    The session runs on a private event-loop thread; each call blocks until the
    collective's verified result is there (or its typed error is raised), and
    ``start_*`` variants return a :class:`concurrent.futures.Future` instead.
    """

    def __init__(
        self,
        spec: GroupSpec,
        node_id: str,
        transport: TransportConfig,
        timeout: float = DEFAULT_JOIN_TIMEOUT,
        *,
        busy_poll_us: int = 0,
    ) -> None:
        """``busy_poll_us``: how long the session's loop keeps polling for datagrams
        before it sleeps (:mod:`cco.services.polling`): shorter small collectives
        where waking a sleeping thread is slow, for that much CPU after each."""
        self._loop = event_loop_factory(busy_poll_us)()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"cco-{node_id}", daemon=True)
        self._thread.start()
        try:
            self._comm: Communicator = self._call(Communicator.join(spec, node_id, transport, timeout))
        except BaseException:
            self._stop()
            raise

    @classmethod
    def from_pki(
        cls, spec: GroupSpec, node_id: str, pki_dir: Path, *, busy_poll_us: int = 0, **transport: Any
    ) -> BlockingCommunicator:
        """Join with the credentials ``cco-node certs`` wrote for ``node_id`` in ``pki_dir``."""
        config = TransportConfig.for_node(pki_dir, node_id, **transport)
        return cls(spec, node_id, config, busy_poll_us=busy_poll_us)

    @property
    def rank(self) -> int:
        return self._comm.rank

    @property
    def world_size(self) -> int:
        return self._comm.world_size

    @property
    def members(self) -> frozenset[int]:
        return self._comm.members

    def accept_membership(self) -> frozenset[int]:
        """See :meth:`Communicator.accept_membership`."""
        return self._call(_on_loop(self._comm.accept_membership))

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def start_all_reduce(
        self, array: np.ndarray, op: ReduceOp = ReduceOp.SUM, **kw: Any
    ) -> concurrent.futures.Future[np.ndarray]:
        return self._submit(self._comm.all_reduce(array, op, **kw))

    def all_reduce(self, array: np.ndarray, op: ReduceOp = ReduceOp.SUM, **kw: Any) -> np.ndarray:
        return self._call(self._comm.all_reduce(array, op, **kw))

    def all_reduce_quorum(
        self, array: np.ndarray, op: ReduceOp = ReduceOp.SUM, *, min_ranks: int, wait: float, **kw: Any
    ) -> PartialResult:
        """See :meth:`Communicator.all_reduce_quorum`."""
        return self._call(self._comm.all_reduce_quorum(array, op, min_ranks=min_ranks, wait=wait, **kw))

    def reduce(
        self, array: np.ndarray, root: int, op: ReduceOp = ReduceOp.SUM, **kw: Any
    ) -> np.ndarray | None:
        return self._call(self._comm.reduce(array, root, op, **kw))

    def broadcast(self, array: np.ndarray, root: int, **kw: Any) -> np.ndarray:
        return self._call(self._comm.broadcast(array, root, **kw))

    def barrier(self, **kw: Any) -> None:
        self._call(self._comm.barrier(**kw))

    def all_gather(self, array: np.ndarray, **kw: Any) -> np.ndarray:
        return self._call(self._comm.all_gather(array, **kw))

    def reduce_scatter(self, array: np.ndarray, op: ReduceOp = ReduceOp.SUM, **kw: Any) -> np.ndarray:
        return self._call(self._comm.reduce_scatter(array, op, **kw))

    def close(self) -> None:
        try:
            self._call(self._comm.close())
        finally:
            self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> BlockingCommunicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
