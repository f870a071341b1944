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
import os
import re
import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from cco.config import parse_hostport
from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
from cco.nodes.calls import CollectiveRequest, EndpointConfig
from cco.nodes.endpoint import EndpointMachine, Prepared
from cco.nodes.endpoint_states import LinkState, SessionState
from cco.nodes.events import Command, Joined, JoinFailed, OperationCompleted, OperationFailed
from cco.nodes.operation import Quorum
from cco.nodes.rendezvous import FALLBACK_LABEL
from cco.nodes.replies import ranks_text
from cco.services.node import NodeService, Redialer
from cco.services.polling import event_loop_factory
from cco.transport import TransportConfig
from cco.transport.certs import is_valid_node_id
from cco.wire import kernels
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Address
from cco.wire.registries import GROUP_ID_SIZE, MAX_WORLD_SIZE, Collective, ReduceOp, Role

T = TypeVar("T")

log = logging.getLogger("cco.client")

DEFAULT_JOIN_TIMEOUT = 30.0
_ENDED = (SessionState.REJECTED, SessionState.LEFT, SessionState.CLOSED)
OFF_LOOP_ELEMENTS = 1 << 20
"""Arrays of this many elements or more have their whole-tensor work at start (scale
proposals, encoding checks: about 0.15 s per 64 MiB of float32 here, seconds on a
loaded machine) done on a worker thread, so that the event loop keeps serving every
connection, heartbeats included, meanwhile.  Smaller ones start at once."""


DEFAULT_RENDEZVOUS = "127.0.0.1:4433"
RENDEZVOUS_ENV = "CCO_RENDEZVOUS"
"""The variable ``cco-node`` itself reads for ``--rendezvous`` (and ``cco-node standalone``
sets for the command it runs): also :class:`GroupSpec`'s default."""


def _default_rendezvous() -> str:
    return os.environ.get(RENDEZVOUS_ENV, DEFAULT_RENDEZVOUS)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupSpec:
    """Which group to join and how to reach its rendezvous; checked when it is made
    (``ValueError`` naming the field), so a mistake shows at the line that made it."""

    group_id: bytes
    """16 bytes, the same on every rank."""
    world_size: int
    credential: bytes = b""
    rank: int | None = None
    """This member's rank.  None: the number that ends the node id (``ep-3`` is rank 3),
    else the ``RANK`` environment variable (torchrun's), when below ``world_size``;
    else the rendezvous gives one (see :func:`default_rank`)."""
    labels: tuple[str, ...] = ()
    rendezvous: str = field(default_factory=_default_rendezvous)
    """``HOST:PORT``; default: ``CCO_RENDEZVOUS``, else 127.0.0.1:4433."""
    rendezvous_id: str = "rendezvous"
    elastic: bool = False
    """When members leave or die: strict (False) fails every collective, naming the
    lost ranks, until :meth:`Communicator.accept_membership`; elastic (True) fails
    only those in flight and continues over the survivors."""

    def __post_init__(self) -> None:
        if not isinstance(self.group_id, bytes) or len(self.group_id) != GROUP_ID_SIZE:
            raise ValueError(f"group_id must be {GROUP_ID_SIZE} bytes, got {self.group_id!r}")
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int):
            raise ValueError(f"world_size must be an int, got {self.world_size!r}")
        if not 1 <= self.world_size <= MAX_WORLD_SIZE:
            raise ValueError(f"world_size {self.world_size} is outside [1, {MAX_WORLD_SIZE}]")
        if self.rank is not None and not (isinstance(self.rank, int) and 0 <= self.rank < self.world_size):
            raise ValueError(f"rank {self.rank!r} is not in [0, {self.world_size})")
        if not isinstance(self.credential, bytes):
            raise ValueError(f"credential must be bytes (b'...' or text.encode()), got {self.credential!r}")
        if isinstance(self.labels, str) or not all(isinstance(label, str) for label in self.labels):
            raise ValueError(f"labels must be a tuple of strings, got {self.labels!r}")
        parse_hostport(self.rendezvous)  # ValueError: expected HOST:PORT
        if not is_valid_node_id(self.rendezvous_id):
            raise ValueError(f"rendezvous_id {self.rendezvous_id!r} is not a node id")


_NUMBERED = re.compile(r".*-([0-9]+)")


def default_rank(node_id: str, world_size: int, environ: Mapping[str, str] = os.environ) -> int | None:
    """The rank a member takes when its :class:`GroupSpec` names none: the number ending
    ``node_id`` after a dash (``ep-3``: 3), else ``RANK`` from the environment, if it is
    below ``world_size``; else None (the rendezvous gives one)."""
    numbered = _NUMBERED.fullmatch(node_id)
    for text in (numbered.group(1) if numbered else None, environ.get("RANK")):
        if text is not None and text.isdigit() and int(text) < world_size:
            return int(text)
    return None


def reduce_op(op: ReduceOp | str) -> ReduceOp:
    """``op`` as a :class:`ReduceOp`: the enum itself, or its name in any case (``"sum"``)."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str) and op.upper() in ReduceOp.__members__:
        return ReduceOp[op.upper()]
    names = ", ".join(name.lower() for name in ReduceOp.__members__)
    raise CcoError(ErrorCode.INVALID_FIELD, f"op {op!r} is not one of {names}")


NonFinite = Literal["propagate", "report"]
"""What a float reduction does with inf and NaN inputs (the ``nonfinite`` keyword):

* ``"propagate"``: on every rank, the whole result is NaN when any rank's input held a
  value the reduction cannot carry (inf or NaN for SUM and AVG, NaN for MIN and MAX),
  as a loss-scaling step under mixed precision expects: every rank sees it and skips
  the step, and the reduction itself still completes;
* ``"report"``: every rank raises :class:`NonFiniteError` naming the ranks that had one.

Either way each rank learns it from a one-byte all-gather run beside the reduction
(a second collective, started with it).  Without ``nonfinite`` (the default) such a
value fails the call at once, on its own rank only."""

NONFINITE_MODES: tuple[str, ...] = ("propagate", "report")


class NonFiniteError(CcoError):
    """Some ranks' inputs to a reduction held inf or NaN (``nonfinite="report"``)."""

    def __init__(self, kind: Collective, ranks: frozenset[int]) -> None:
        super().__init__(
            ErrorCode.OVERFLOW, f"{kind.name}: inputs of ranks {ranks_text(ranks)} are not finite"
        )
        self.ranks = ranks


def _guarded(array: np.ndarray, op: ReduceOp) -> tuple[np.ndarray, bool | None]:
    """A reduction's input made safe to send, and whether it held values the reduction
    cannot carry: zeros in their place (a copy, made only then).  None: the dtype and
    op carry every value, nothing to guard."""
    if array.dtype.kind != "f" or op not in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MIN, ReduceOp.MAX):
        return array, None
    carried = ~np.isnan(array) if op in (ReduceOp.MIN, ReduceOp.MAX) else np.isfinite(array)
    if carried.all():
        return array, False
    return np.where(carried, array, np.zeros((), dtype=array.dtype)), True


def _check_nonfinite(mode: str | None) -> None:
    if mode is not None and mode not in NONFINITE_MODES:
        raise CcoError(
            ErrorCode.INVALID_FIELD, f"nonfinite {mode!r} is not one of {', '.join(NONFINITE_MODES)}"
        )


def as_array(value: Any, name: str = "array") -> np.ndarray:
    """``value`` as a numpy array sharing its memory: a numpy array as it is, a tensor
    through DLPack (a torch CPU tensor, for one: never copied), anything else through
    ``np.asarray``.  INVALID_FIELD for what cannot be read so."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except (RuntimeError, BufferError, TypeError, ValueError) as exc:
            hint = ""
            if "bfloat16" in str(getattr(value, "dtype", "")):
                hint = " (bfloat16: use cco.torch, or float32 values with dtype=DType.BFLOAT16)"
            raise CcoError(
                ErrorCode.INVALID_FIELD, f"{name} cannot be shared with numpy: {exc}{hint}"
            ) from None
    if name == "out":
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"out is a {type(value).__name__}: give a numpy array or a tensor (DLPack) to write into",
        )
    return np.asarray(value)


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
        array, bad = _input(kind, array, op, nonfinite)
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
        """Begin a collective whose input :func:`_input` prepared (on any thread)."""
        if kw.get("out") is not None:
            kw["out"] = as_array(kw["out"], "out")
        request = CollectiveRequest(kind=kind, op=op, array=array, root=root, **kw)
        if nonfinite is None or bad is None:
            return self.start(request)
        data = self.start(request)
        flag = CollectiveRequest(
            kind=Collective.ALL_GATHER, array=np.array([bad], dtype=np.int8), timeout=kw.get("timeout")
        )
        return asyncio.ensure_future(_settle(kind, data, self.start(flag), nonfinite))

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
        numpy view of it), and for float SUM and AVG ``width``,
        the bits per element on the wire (8, 16, 32 or 64; default: the group's
        ``float_width``, else the dtype's own); and ``nonfinite`` (:data:`NonFinite`).
        Floats in sums of
        more than 16 elements are block-scaled fixed point: each element of the result
        is within about c x M / Q of the exact sum (M: the largest magnitude in its block
        on any rank, c: the contributors, Q = (2^(width-1) - 1) / world_size).  Sums of
        at most 16 floats are exact limbs, whatever ``width``: the exact sum rounded
        once, in one round trip instead of two.  Either way the result is bit-identical
        on every rank; MIN and MAX of floats are exact."""
        return _present(await self.start_all_reduce(array, op, **kw))

    async def reduce(
        self, array: Any, root: int, op: ReduceOp | str = ReduceOp.SUM, **kw: Any
    ) -> np.ndarray | None:
        """Like all_reduce, but only ``root`` gets the result (others get None)."""
        result: np.ndarray | None = await self._start_call(Collective.REDUCE, array, op, root=root, **kw)
        return result

    async def broadcast(self, array: Any, root: int, **kw: Any) -> np.ndarray:
        """Every rank gets ``root``'s array; other ranks pass an array of the same shape and dtype."""
        return _present(await self._start_call(Collective.BROADCAST, array, root=root, **kw))

    async def barrier(self, **kw: Any) -> None:
        """Returns once every rank has entered the barrier."""
        await self._start_call(Collective.BARRIER, **kw)

    async def all_gather(self, array: Any, **kw: Any) -> np.ndarray:
        """Every rank gets shape ``(world_size, *array.shape)``: row ``r`` is rank ``r``'s array."""
        return _present(await self._start_call(Collective.ALL_GATHER, array, **kw))

    async def reduce_scatter(self, array: Any, op: ReduceOp | str = ReduceOp.SUM, **kw: Any) -> np.ndarray:
        """Each rank gets its equal slice (by rank) of the reduction of every rank's ``array``."""
        return _present(await self._start_call(Collective.REDUCE_SCATTER, array, op, **kw))

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


async def _drain() -> None:
    """Wait for every other task of this loop to end (each is bounded by close())."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:
        await asyncio.wait(others)


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


_REDUCTIONS = frozenset({Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER})


def _input(
    kind: Collective, array: Any, op: ReduceOp | str, nonfinite: NonFinite | None
) -> tuple[np.ndarray | None, bool | None]:
    """A call's input as an array, made safe to send when ``nonfinite`` asks for it,
    and whether it had values that could not be sent (None: no guard runs): the
    whole-array work of a call, which may run on the caller's own thread (see
    BlockingCommunicator)."""
    _check_nonfinite(nonfinite)
    if array is None:
        return None, None
    values = as_array(array)
    if nonfinite is None or kind not in _REDUCTIONS:
        return values, None
    return _guarded(values, reduce_op(op))


async def _settle(
    kind: Collective,
    data: asyncio.Future[np.ndarray | None],
    flags: asyncio.Future[np.ndarray | None],
    mode: NonFinite,
) -> np.ndarray | None:
    """A guarded reduction's result, once it and its all-gather of flags are in."""
    await asyncio.wait([data, flags])
    if not flags.cancelled():
        flags.exception()  # retrieved, so a failure of both is not reported as unseen
    result = data.result()  # its failure first: the flags say nothing then
    gathered = flags.result()
    assert gathered is not None
    bad = frozenset(int(rank) for rank in np.flatnonzero(gathered.reshape(-1)))
    if bad and mode == "report":
        raise NonFiniteError(kind, bad)
    if bad and result is not None:
        result[...] = np.nan
    return result


class BlockingCommunicator:
    """The :class:`Communicator` API for code without an event loop.

    The session runs on a private event-loop thread; each call blocks until the
    collective's verified result is there (or its typed error is raised), and
    ``start_*`` variants return a :class:`concurrent.futures.Future` instead.  The
    whole-array work of a call (reading a tensor, checking for values ``nonfinite``
    guards against) runs on the calling thread, not on the session's.

    After :meth:`close` every call raises ABORTED at once.  As a context manager it
    closes collectively when its block ends normally, and leaves at once when the
    block raised (as :class:`Communicator`'s ``async with`` does), so that the other
    ranks fail naming this one instead of waiting for it.
    """

    def __init__(
        self,
        spec: GroupSpec,
        node_id: str,
        transport: TransportConfig,
        timeout: float = DEFAULT_JOIN_TIMEOUT,
        *,
        busy_poll_us: int = 0,
        preload: bool = True,
    ) -> None:
        """``busy_poll_us``: how long the session's loop keeps polling for datagrams
        before it sleeps (:mod:`cco.services.polling`): shorter small collectives
        where waking a sleeping thread is slow, for that much CPU after each.
        ``preload``: as for :meth:`Communicator.join`."""
        self._loop = event_loop_factory(busy_poll_us)()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"cco-{node_id}", daemon=True)
        self._lock = threading.Lock()
        self._closed = False
        self._calls: set[concurrent.futures.Future[Any]] = set()  # submitted and not yet done
        self._thread.start()
        try:
            self._comm: Communicator = self._call(
                Communicator.join(spec, node_id, transport, timeout, preload=preload)
            )
        except BaseException:
            self._closed = True
            self._stop()
            raise

    @classmethod
    def from_pki(
        cls,
        spec: GroupSpec,
        node_id: str,
        pki_dir: str | Path,
        timeout: float = DEFAULT_JOIN_TIMEOUT,
        *,
        busy_poll_us: int = 0,
        **transport: Any,
    ) -> BlockingCommunicator:
        """Join with the credentials ``cco-node certs`` (or ``cco-node standalone``) wrote
        for ``node_id`` in ``pki_dir``; keywords go to :class:`TransportConfig`."""
        config = TransportConfig.for_node(pki_dir, node_id, **transport)
        return cls(spec, node_id, config, timeout, busy_poll_us=busy_poll_us)

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

    def _submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        with self._lock:
            if self._closed:
                coroutine.close()
                raise CcoError(ErrorCode.ABORTED, "communicator closed")
            future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
            self._calls.add(future)
        future.add_done_callback(self._calls.discard)
        return future

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self._submit(coroutine).result()

    def start(
        self,
        kind: Collective,
        array: Any = None,
        op: ReduceOp | str = ReduceOp.SUM,
        *,
        root: int | None = None,
        nonfinite: NonFinite | None = None,
        **kw: Any,
    ) -> concurrent.futures.Future[Any]:
        """Begin any collective, with the keywords of the named calls (``root`` for
        REDUCE and BROADCAST; ``nonfinite`` for reductions); its future."""
        values, bad = _input(kind, array, op, nonfinite)  # on this thread
        ops = reduce_op(op)
        comm = self._comm

        async def run() -> Any:
            return await comm._begin(kind, values, ops, root, nonfinite, bad, kw)

        return self._submit(run())

    def start_all_reduce(
        self, array: Any, op: ReduceOp | str = ReduceOp.SUM, **kw: Any
    ) -> concurrent.futures.Future[Any]:
        return self.start(Collective.ALL_REDUCE, array, op, **kw)

    def all_reduce(self, array: Any, op: ReduceOp | str = ReduceOp.SUM, **kw: Any) -> np.ndarray:
        """See :meth:`Communicator.all_reduce`."""
        return _present(self.start_all_reduce(array, op, **kw).result())

    def all_reduce_quorum(
        self, array: Any, op: ReduceOp | str = ReduceOp.SUM, *, min_ranks: int, wait: float, **kw: Any
    ) -> PartialResult:
        """See :meth:`Communicator.all_reduce_quorum`."""
        return self._call(self._comm.all_reduce_quorum(array, op, min_ranks=min_ranks, wait=wait, **kw))

    def reduce(
        self, array: Any, root: int, op: ReduceOp | str = ReduceOp.SUM, **kw: Any
    ) -> np.ndarray | None:
        result: np.ndarray | None = self.start(Collective.REDUCE, array, op, root=root, **kw).result()
        return result

    def broadcast(self, array: Any, root: int, **kw: Any) -> np.ndarray:
        return _present(self.start(Collective.BROADCAST, array, root=root, **kw).result())

    def barrier(self, **kw: Any) -> None:
        self.start(Collective.BARRIER, **kw).result()

    def all_gather(self, array: Any, **kw: Any) -> np.ndarray:
        return _present(self.start(Collective.ALL_GATHER, array, **kw).result())

    def reduce_scatter(self, array: Any, op: ReduceOp | str = ReduceOp.SUM, **kw: Any) -> np.ndarray:
        return _present(self.start(Collective.REDUCE_SCATTER, array, op, **kw).result())

    def close(self, *, linger: bool = True, timeout: float | None = None) -> None:
        """Leave the group (see :meth:`Communicator.close`); once closed, every call
        raises ABORTED, and closing again does nothing."""
        with self._lock:
            if self._closed:
                return
            closing = asyncio.run_coroutine_threadsafe(
                self._comm.close(linger=linger, timeout=timeout), self._loop
            )
            self._closed = True  # later calls raise; those already submitted finish or fail ABORTED
        try:
            closing.result()
        finally:
            self._stop()

    def _stop(self) -> None:
        """Let the calls still running on the loop end (close() failed them), stop the
        loop, and fail any call it could not finish, so that no caller waits forever."""
        if self._thread.is_alive():
            with contextlib.suppress(concurrent.futures.TimeoutError):
                asyncio.run_coroutine_threadsafe(_drain(), self._loop).result(timeout=5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        for call in list(self._calls):
            if not call.done():
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    call.set_exception(CcoError(ErrorCode.ABORTED, "communicator closed"))
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> BlockingCommunicator:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(linger=exc_type is None)
