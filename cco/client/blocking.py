"""The client library for code without an event loop: :class:`BlockingCommunicator`.

A :class:`~cco.client.communicator.Communicator` on a private event-loop thread,
each call blocking until its verified result is there, and a clean stop of that
thread however the session ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from cco.client.arrays import NonFinite, PartialResult, prepare_input, present, reduce_op
from cco.client.communicator import DEFAULT_JOIN_TIMEOUT, Communicator
from cco.client.spec import GroupSpec
from cco.client.striped import StripedCommunicator, stripe_node_id
from cco.services.polling import event_loop_factory
from cco.transport import TransportConfig
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.registries import Collective, ReduceOp

T = TypeVar("T")


async def _drain() -> None:
    """Wait for every other task of this loop to end (each is bounded by close())."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:
        await asyncio.wait(others)


async def _on_loop(function: Callable[[], T]) -> T:
    """Run ``function`` on the communicator's event loop thread (the machine's only thread)."""
    return function()


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
        transport: TransportConfig | Sequence[TransportConfig],
        timeout: float = DEFAULT_JOIN_TIMEOUT,
        *,
        busy_poll_us: int = 0,
        preload: bool = True,
    ) -> None:
        """``transport``: this node's, or one per stripe (see
        :class:`~cco.client.striped.StripedCommunicator`: ``node_id``'s first, then
        ``<node_id>.s1``'s ...), to stripe every call's large arrays over as many groups.
        ``busy_poll_us``: how long the session's loop keeps polling for datagrams
        before it sleeps (:mod:`cco.services.polling`): shorter small collectives
        where waking a sleeping thread is slow, for that much CPU after each.
        ``preload``: as for :meth:`Communicator.join`."""
        self._loop = event_loop_factory(busy_poll_us)()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"cco-{node_id}", daemon=True)
        self._lock = threading.Lock()
        self._closed = False
        self._calls: set[concurrent.futures.Future[Any]] = set()  # submitted and not yet done
        self._thread.start()
        joining: Coroutine[Any, Any, Communicator | StripedCommunicator] = (
            Communicator.join(spec, node_id, transport, timeout, preload=preload)
            if isinstance(transport, TransportConfig)
            else StripedCommunicator.join(spec, node_id, transport, timeout, preload=preload)
        )
        try:
            self._comm: Communicator | StripedCommunicator = self._call(joining)
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
        stripes: int = 1,
        **transport: Any,
    ) -> BlockingCommunicator:
        """Join with the credentials ``cco-node certs`` (or ``cco-node standalone``) wrote
        for ``node_id`` in ``pki_dir`` (with ``stripes`` above 1, also for ``<node_id>.s1``
        ...); keywords go to :class:`TransportConfig`."""
        configs = [
            TransportConfig.for_node(pki_dir, stripe_node_id(node_id, k), **transport) for k in range(stripes)
        ]
        config = configs[0] if stripes == 1 else configs
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

    @property
    def last_chunk_elements(self) -> int | None:
        """See :attr:`Communicator.last_chunk_elements`."""
        return self._comm.last_chunk_elements

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
        values, bad = prepare_input(kind, array, op, nonfinite)  # on this thread
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
        return present(self.start_all_reduce(array, op, **kw).result())

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
        return present(self.start(Collective.BROADCAST, array, root=root, **kw).result())

    def barrier(self, **kw: Any) -> None:
        self.start(Collective.BARRIER, **kw).result()

    def all_gather(self, array: Any, **kw: Any) -> np.ndarray:
        return present(self.start(Collective.ALL_GATHER, array, **kw).result())

    def reduce_scatter(self, array: Any, op: ReduceOp | str = ReduceOp.SUM, **kw: Any) -> np.ndarray:
        return present(self.start(Collective.REDUCE_SCATTER, array, op, **kw).result())

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
