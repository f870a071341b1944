"""The asyncio face of the client library: :class:`Communicator`.

One endpoint session (:class:`~cco.nodes.endpoint.EndpointMachine`) on the caller's
event loop: joining (with a fallback aggregator if asked), staying attached to the
rendezvous, starting collectives in the same order on every rank and resolving
their futures from the machine's commands, and leaving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from cco.client.arrays import (
    NonFinite,
    PartialResult,
    as_array,
    prepare_input,
    present,
    reduce_op,
    settle_nonfinite,
)
from cco.client.spec import FallbackAggregator, GroupSpec, default_rank
from cco.config import parse_hostport
from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
from cco.nodes.calls import CollectiveRequest, EndpointConfig
from cco.nodes.endpoint import EndpointMachine, Prepared
from cco.nodes.endpoint_states import LinkState, SessionState
from cco.nodes.events import Command, Joined, JoinFailed, OperationCompleted, OperationFailed
from cco.nodes.operation import Quorum
from cco.nodes.rendezvous import FALLBACK_LABEL
from cco.services.node import NodeService, Redialer
from cco.transport import TransportConfig
from cco.wire import kernels
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
        self._last_chunk_elements: int | None = None

    @classmethod
    async def join(
        cls,
        spec: GroupSpec,
        node_id: str,
        transport: TransportConfig,
        timeout: float = DEFAULT_JOIN_TIMEOUT,
        fallback: FallbackAggregator | None = None,
        *,
        preload: bool = True,
    ) -> Communicator:
        """Connect to the rendezvous, join the group and wait until the tree is ready;
        with ``fallback``, also run an aggregator for the group (see
        :class:`FallbackAggregator`).  Without ``spec.rank``, the rank is
        :func:`default_rank`'s.

        With ``preload`` (the default) the compiled loops (:mod:`cco.wire.kernels`,
        where numba is installed) are loaded first, on a worker thread, before this
        member's session exists: loaded by its first large chunk instead, numba's
        import and compilation would hold the event loop, and with it the heartbeats,
        for seconds on a busy host.  On the worker thread, other sessions on this loop
        keep being served meanwhile.  A process whose collectives all move a few
        elements, and would rather not carry numba's memory, passes False."""
        if preload:
            await asyncio.get_running_loop().run_in_executor(None, kernels.preload)
        rank = spec.rank if spec.rank is not None else default_rank(node_id, spec.world_size)
        machine = EndpointMachine(
            EndpointConfig(
                group_id=spec.group_id,
                world_size=spec.world_size,
                credential=spec.credential,
                rank=rank,
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
            if machine.no_tree is not None:
                why = f"group {spec.group_id.hex()}: not ready within {timeout} s: {machine.no_tree}"
                raise CcoError(ErrorCode.NO_AGGREGATOR, why) from None
            raise CcoError(
                ErrorCode.TIMEOUT,
                f"group {spec.group_id.hex()}: not ready within {timeout} s "
                f"(are all {spec.world_size} members and an aggregator up?)",
            ) from None
        except BaseException:
            await comm._close_services()
            raise
        return comm

    @classmethod
    async def from_pki(
        cls,
        spec: GroupSpec,
        node_id: str,
        pki_dir: str | Path,
        timeout: float = DEFAULT_JOIN_TIMEOUT,
        **transport: Any,
    ) -> Communicator:
        """:meth:`join` with the credentials ``cco-node certs`` (or ``cco-node standalone``)
        wrote for ``node_id`` in ``pki_dir``; keywords go to :class:`TransportConfig`."""
        return await cls.join(spec, node_id, TransportConfig.for_node(pki_dir, node_id, **transport), timeout)

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

    @property
    def last_chunk_elements(self) -> int | None:
        """How many wire integers each chunk of the collective that completed last held
        (None before the first).  A float SUM or AVG agrees its chunk size with the
        other ranks call by call (docs/tuning.md), so this is how a benchmark tells
        which size a call ran with; other calls use the group's ``chunk_elements``.
        With several calls in flight it is the last one to complete."""
        return self._last_chunk_elements

    # --- collectives ---------------------------------------------------------------
    #
    # Every call takes arrays as numpy arrays or tensors (shared through DLPack, never
    # copied), ``op`` as a ReduceOp or its name ("sum"), and the keywords of
    # CollectiveRequest (timeout, out, width, dtype); reductions also ``nonfinite``.

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

    def _start_call(
        self,
        kind: Collective,
        array: Any = None,
        op: ReduceOp | str = ReduceOp.SUM,
        *,
        root: int | None = None,
        nonfinite: NonFinite | None = None,
        **kw: Any,
    ) -> asyncio.Future[Any]:
        """Begin any collective: the one entry the calls below share.  ``nonfinite``
        (SUM, AVG, MIN and MAX of floats; see :data:`NonFinite`) runs the one-byte
        all-gather that tells every rank whether any input was not finite."""
        array, bad = prepare_input(kind, array, op, nonfinite)
        return self._begin(kind, array, reduce_op(op), root, nonfinite, bad, kw)

    def _begin(
        self,
        kind: Collective,
        array: np.ndarray | None,
        op: ReduceOp,
        root: int | None,
        nonfinite: NonFinite | None,
        bad: bool | None,
        kw: dict[str, Any],
    ) -> asyncio.Future[Any]:
        """Begin a collective whose input :func:`prepare_input` prepared (on any thread)."""
        if kw.get("out") is not None:
            kw["out"] = as_array(kw["out"], "out")
        request = CollectiveRequest(kind=kind, op=op, array=array, root=root, **kw)
        if nonfinite is None or bad is None:
            return self.start(request)
        data = self.start(request)
        flag = CollectiveRequest(
            kind=Collective.ALL_GATHER, array=np.array([bad], dtype=np.int8), timeout=kw.get("timeout")
        )
        return asyncio.ensure_future(settle_nonfinite(kind, data, self.start(flag), nonfinite))

    def start_all_reduce_quorum(
        self, array: Any, op: ReduceOp | str = ReduceOp.SUM, *, min_ranks: int, wait: float, **kw: Any
    ) -> asyncio.Future[PartialResult]:
        """Begin a quorum all-reduce (see :meth:`all_reduce_quorum`)."""
        request = CollectiveRequest(
            kind=Collective.ALL_REDUCE,
            op=reduce_op(op),
            array=as_array(array),
            quorum=Quorum(min_ranks, wait),
            **kw,
        )
        return self._start(request, self._partial)

    async def all_reduce_quorum(
        self, array: Any, op: ReduceOp | str = ReduceOp.SUM, *, min_ranks: int, wait: float, **kw: Any
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
        self, array: Any, op: ReduceOp | str = ReduceOp.SUM, **kw: Any
    ) -> asyncio.Future[Any]:
        return self._start_call(Collective.ALL_REDUCE, array, op, **kw)

    async def all_reduce(self, array: Any, op: ReduceOp | str = ReduceOp.SUM, **kw: Any) -> np.ndarray:
        """Every rank gets the elementwise reduction of every rank's ``array``.

        Keywords are those of :class:`CollectiveRequest`: ``timeout`` (seconds), ``out``
        (an array or tensor of the result's shape and dtype to write it to, reused call
        after call instead of a new array each time; the result returned is then a
        numpy view of it; after a failed call it holds part of the result, part of what
        it held: :class:`CollectiveRequest`), and for float SUM and AVG ``width``,
        the bits per element on the wire (8, 16, 32 or 64; default: the group's
        ``float_width``, else the dtype's own); and ``nonfinite`` (:data:`NonFinite`).
        Floats in sums of
        more than 16 elements are block-scaled fixed point: each element of the result
        is within about c x M / Q of the exact sum (M: the largest magnitude in its block
        on any rank, c: the contributors, Q = (2^(width-1) - 1) / world_size).  Sums of
        at most 16 floats are exact limbs, whatever ``width``: the exact sum rounded
        once, in one round trip instead of two.  Either way the result is bit-identical
        on every rank; MIN and MAX of floats are exact."""
        return present(await self.start_all_reduce(array, op, **kw))

    async def reduce(
        self, array: Any, root: int, op: ReduceOp | str = ReduceOp.SUM, **kw: Any
    ) -> np.ndarray | None:
        """Like all_reduce, but only ``root`` gets the result (others get None)."""
        result: np.ndarray | None = await self._start_call(Collective.REDUCE, array, op, root=root, **kw)
        return result

    async def broadcast(self, array: Any, root: int, **kw: Any) -> np.ndarray:
        """Every rank gets ``root``'s array; other ranks pass an array of the same shape and dtype."""
        return present(await self._start_call(Collective.BROADCAST, array, root=root, **kw))

    async def barrier(self, **kw: Any) -> None:
        """Returns once every rank has entered the barrier."""
        await self._start_call(Collective.BARRIER, **kw)

    async def all_gather(self, array: Any, **kw: Any) -> np.ndarray:
        """Every rank gets shape ``(world_size, *array.shape)``: row ``r`` is rank ``r``'s array."""
        return present(await self._start_call(Collective.ALL_GATHER, array, **kw))

    async def reduce_scatter(self, array: Any, op: ReduceOp | str = ReduceOp.SUM, **kw: Any) -> np.ndarray:
        """Each rank gets its equal slice (by rank) of the reduction of every rank's ``array``."""
        return present(await self._start_call(Collective.REDUCE_SCATTER, array, op, **kw))

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
            self._last_chunk_elements = command.chunk_elements
            partial = self._partial.pop(command.op_id, None)
            if partial is not None and not partial.done():
                assert command.contributors is not None
                partial.set_result(PartialResult(present(command.result), command.contributors))
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
