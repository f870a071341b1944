"""The "cco" torch.distributed backend: a Python ProcessGroup over one CCO session.

Each process group is one CCO group membership (a :class:`~cco.client.BlockingCommunicator`
on its own event-loop thread), or one per stripe with ``Options.stripes`` above 1, its
large calls cut over them (:mod:`cco.client.striped`).  Every collective starts at once and returns a
:class:`Work` whose future completes, on a completion thread of the group, once the
verified result is in the caller's output tensors; ``async_op=False`` is torch
waiting on it.  Collectives run in the order they were called, as the ranks must
call them.

What DDP and FSDP2 call is here: ``broadcast``, ``allgather`` and its tensor forms
(``_allgather_base``, ``all_gather_single``, the ``*_coalesced`` lists), ``allreduce``
and ``allreduce_coalesced``, ``reduce``, ``reduce_scatter`` and its tensor forms, and
``barrier``.  The collectives CCO does not define (all-to-all, send and receive,
gather, scatter) fail at the call, naming themselves.

Floats in SUM and AVG go at the group's width (:class:`~cco.torch.options.Options`),
exact and bit-identical on every rank, within the bound of :mod:`cco.wire.blockscale`.
Inf and NaN follow ``Options.nonfinite``.

A collective that fails raises from ``wait()`` (and its future).  An in-place
reduction (``allreduce``, ``reduce`` at the root, the DDP hook) then leaves each
tensor holding its input, as before the call, so that calling again reduces the
same values; the output tensors of the other collectives (``broadcast`` at a
receiver, the gathers, ``reduce_scatter``) hold unspecified values, some parts of
the result and some of what they held, while their inputs are only read.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Work as TorchWork

from cco.client import BlockingCommunicator, NonFinite
from cco.torch import tensors
from cco.torch.tensors import Reduction
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.registries import Collective, ReduceOp

BACKEND_NAME = "cco"

CLOSE_TIMEOUT = 60.0
"""Seconds a rank leaving with shutdown() waits at the close barrier for the others
(their last collectives complete first); then it leaves anyway."""


class Work(TorchWork):
    """One collective call: :meth:`wait` returns once its results are in the output
    tensors (raising its error, if it failed); :meth:`get_future` holds those tensors."""

    def __init__(self, future: torch.futures.Future[Any]) -> None:
        super().__init__()
        self._future = future

    def wait(self, timeout: timedelta | None = None) -> bool:
        if timeout is not None and timeout > timedelta(0) and not self._future.done():
            done = threading.Event()
            self._future.add_done_callback(lambda _: done.set())
            if not done.wait(timeout.total_seconds()):
                raise CcoError(ErrorCode.TIMEOUT, f"collective not complete within {timeout}")
        self._future.wait()  # raises the collective's error
        return True

    def get_future(self) -> torch.futures.Future[Any]:
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:
            return False
        return True


class ProcessGroupCCO(dist.ProcessGroup):
    """torch.distributed's view of one CCO group; made by ``init_process_group("cco")``
    and ``new_group(backend="cco")`` (see :mod:`cco.torch`)."""

    def __init__(
        self,
        rank: int,
        size: int,
        comm: BlockingCommunicator,
        *,
        width: int | None = None,
        nonfinite: NonFinite | None = "propagate",
    ) -> None:
        # (store, rank, size) makes no Python subclass in torch 2.13 ("not an alias instance")
        super().__init__(rank, size)  # type: ignore[call-arg]
        self._comm = comm
        self.width = width
        self.nonfinite = nonfinite
        self._completions = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cco-complete")
        self._group_name = ""
        self._group_desc = ""

    # --- identity ------------------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    @property
    def communicator(self) -> BlockingCommunicator:
        return self._comm

    # --- how every call completes --------------------------------------------------

    def _work(
        self,
        parts: Sequence[concurrent.futures.Future[Any]],
        value: Any,
        finish: Callable[[], None] = lambda: None,
        undo: Callable[[], None] = lambda: None,
    ) -> Work:
        return Work(self._future(parts, value, finish, undo))

    def _future(
        self,
        parts: Sequence[concurrent.futures.Future[Any]],
        value: Any,
        finish: Callable[[], None] = lambda: None,
        undo: Callable[[], None] = lambda: None,
    ) -> torch.futures.Future[Any]:
        """A future that completes when every part has: ``finish`` (copies into outputs)
        runs on the group's completion thread (never on the session's event loop),
        then the future holds ``value``; or, once no part writes any more, ``undo``
        (puts in-place tensors' inputs back) and the first failure."""
        future: torch.futures.Future[Any] = torch.futures.Future()
        remaining = [len(parts)]
        lock = threading.Lock()

        def complete() -> None:
            try:
                for part in parts:
                    part.result()
                finish()
            except BaseException as error:
                undo()
                future.set_exception(error)
            else:
                future.set_result(value)

        def one_done(_: concurrent.futures.Future[Any]) -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                self._completions.submit(complete)

        if not parts:
            self._completions.submit(complete)
        for part in parts:
            part.add_done_callback(one_done)
        return future

    def _reduce(
        self,
        kind: Collective,
        plan: Reduction,
        op: ReduceOp,
        root: int | None = None,
        timeout: float | None = None,
        *,
        width: int | None = None,
        nonfinite: NonFinite | Literal["group"] | None = "group",
    ) -> concurrent.futures.Future[Any]:
        """Start a reduction at ``width`` (default: the group's) with ``nonfinite``
        (default: the group's)."""
        kw: dict[str, Any] = {"out": plan.out, "dtype": plan.dtype, "timeout": timeout}
        width = width if width is not None else self.width
        if width is not None and op in (ReduceOp.SUM, ReduceOp.AVG) and plan.source.dtype.kind == "f":
            kw["width"] = width
        mode = self.nonfinite if nonfinite == "group" else nonfinite
        return self._comm.start(kind, plan.source, op, root=root, nonfinite=mode, **kw)

    # --- all-reduce ----------------------------------------------------------------

    def _allreduce_tensor(
        self, tensor: torch.Tensor, op: ReduceOp, timeout: float | None
    ) -> tuple[concurrent.futures.Future[Any], Reduction]:
        source, dtype = tensors.reduction_input(tensor, op, "allreduce", copy=True)
        plan = tensors.into(tensor, source, dtype, tuple(source.shape), in_place=True)
        return self._reduce(Collective.ALL_REDUCE, plan, op, timeout=timeout), plan

    def allreduce_future(
        self, tensor: torch.Tensor, op: ReduceOp, *, width: int, nonfinite: NonFinite | None
    ) -> torch.futures.Future[torch.Tensor]:
        """All-reduce ``tensor`` in place at ``width`` bits per element, whatever the
        group's width: the future holds ``tensor`` once the result is in it (the DDP
        hook's entry, :mod:`cco.torch.hooks`)."""
        source, dtype = tensors.reduction_input(tensor, op, "allreduce", copy=True)
        plan = tensors.into(tensor, source, dtype, tuple(source.shape), in_place=True)
        part = self._reduce(Collective.ALL_REDUCE, plan, op, width=width, nonfinite=nonfinite)
        return self._future([part], tensor, plan.finish, plan.restore)

    def allreduce(self, tensors_: list[torch.Tensor], opts: Any = None) -> Work:  # type: ignore[override]  # the form torch's C++ calls
        op, timeout = _op(opts), _timeout(opts)
        started = [self._allreduce_tensor(t, op, timeout) for t in _one_or_more(tensors_, "allreduce")]
        plans = [plan for _, plan in started]
        return self._work(
            [part for part, _ in started],
            tensors_,
            _in_turn([plan.finish for plan in plans]),
            _in_turn([plan.restore for plan in plans]),
        )

    def allreduce_coalesced(self, tensors_: list[torch.Tensor], opts: Any = None) -> Work:
        return self.allreduce(tensors_, opts)

    # --- reduce ----------------------------------------------------------------------

    def reduce(self, tensors_: list[torch.Tensor], opts: Any) -> Work:  # type: ignore[override]  # the form torch's C++ calls
        (tensor,) = _exactly_one(tensors_, "reduce")
        op, root = _op(opts), int(opts.rootRank)
        mine = root == self.rank()
        source, dtype = tensors.reduction_input(tensor, op, "reduce", copy=mine)
        plan = (
            tensors.into(tensor, source, dtype, tuple(source.shape), in_place=True)
            if mine
            else Reduction(source, dtype, None, None)
        )
        part = self._reduce(Collective.REDUCE, plan, op, root, _timeout(opts))
        return self._work([part], tensors_, plan.finish, plan.restore)

    # --- broadcast -------------------------------------------------------------------

    def broadcast(self, tensors_: list[torch.Tensor], opts: Any) -> Work:  # type: ignore[override]  # the form torch's C++ calls
        (tensor,) = _exactly_one(tensors_, "broadcast")
        tensors.check(tensor, "broadcast")
        root = int(opts.rootRank)
        array = tensors.moved(tensor)
        if root == self.rank():
            part = self._comm.start(Collective.BROADCAST, array, root=root, timeout=_timeout(opts))
        else:  # the input only says the shape: a zero-strided array of it, no memory
            shape_only = np.broadcast_to(np.zeros((), dtype=array.dtype), array.shape)
            part = self._comm.start(
                Collective.BROADCAST, shape_only, root=root, out=array, timeout=_timeout(opts)
            )
        return self._work([part], tensors_)

    # --- all-gather ------------------------------------------------------------------

    def _gather_into(
        self, output: torch.Tensor, input_: torch.Tensor, what: str, timeout: float | None
    ) -> concurrent.futures.Future[Any]:
        """All-gather ``input_`` into the contiguous ``output`` (world x input)."""
        tensors.check(output, what)
        tensors.check(input_, what)
        world = self.size()
        if output.numel() != world * input_.numel() or output.dtype != input_.dtype:
            raise CcoError(
                ErrorCode.INVALID_FIELD,
                f"{what}: output is {output.dtype} of {output.numel()} elements; "
                f"{world} x the input ({input_.dtype}, {input_.numel()}) expected",
            )
        array = tensors.moved(input_)
        if tensors.shares_memory(input_, output):  # FSDP2 gathers from inside the output
            array = array.copy()
        out = tensors.moved(output).reshape((world, *array.shape))
        return self._comm.start(Collective.ALL_GATHER, array, out=out, timeout=timeout)

    def _allgather_base(self, output: torch.Tensor, input_: torch.Tensor, opts: Any = None) -> Work:
        return self._work(
            [self._gather_into(output, input_, "all_gather_into_tensor", _timeout(opts))], [output]
        )

    def all_gather_single(self, output: torch.Tensor, input_: torch.Tensor, opts: Any = None) -> Work:
        return self._allgather_base(output, input_, opts)

    def allgather_into_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        timeout = _timeout(opts)
        parts = [
            self._gather_into(o, i, "all_gather_into_tensor", timeout)
            for o, i in zip(outputs, inputs, strict=True)
        ]
        return self._work(parts, outputs)

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def allgather(  # type: ignore[override]  # the form torch's C++ calls
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        parts, finishes = [], []
        for outputs, input_ in zip(output_lists, _one_or_more(inputs, "allgather"), strict=True):
            part, finish = self._gather_list(outputs, input_, _timeout(opts))
            parts.append(part)
            finishes.append(finish)
        return self._work(parts, output_lists, _in_turn(finishes))

    def allgather_coalesced(
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        return self.allgather(output_lists, inputs, opts)

    def _gather_list(
        self, outputs: list[torch.Tensor], input_: torch.Tensor, timeout: float | None
    ) -> tuple[concurrent.futures.Future[Any], Callable[[], None]]:
        """All-gather into a list of tensors: through one (world x input) array, then
        one copy per output (the list is not one block of memory)."""
        tensors.check(input_, "allgather")
        if len(outputs) != self.size() or any(
            o.shape != input_.shape or o.dtype != input_.dtype for o in outputs
        ):
            raise CcoError(
                ErrorCode.INVALID_FIELD,
                f"allgather: {self.size()} outputs shaped like the input "
                f"({input_.dtype}, {tuple(input_.shape)}) expected",
            )
        array = tensors.moved(input_)
        rows = np.empty((self.size(), *array.shape), dtype=array.dtype)
        part = self._comm.start(Collective.ALL_GATHER, array, out=rows, timeout=timeout)

        def finish() -> None:
            for output, row in zip(outputs, rows, strict=True):
                tensors.moved(output)[...] = row

        return part, finish

    # --- reduce-scatter --------------------------------------------------------------

    def _scatter_into(
        self,
        output: torch.Tensor,
        input_: torch.Tensor,
        op: ReduceOp,
        what: str,
        timeout: float | None,
        *,
        copy: bool,
    ) -> tuple[concurrent.futures.Future[Any], Reduction]:
        tensors.check(output, what)
        world = self.size()
        if input_.numel() != world * output.numel() or output.dtype != input_.dtype:
            raise CcoError(
                ErrorCode.INVALID_FIELD,
                f"{what}: input is {input_.dtype} of {input_.numel()} elements; "
                f"{world} x the output ({output.dtype}, {output.numel()}) expected",
            )
        source, dtype = tensors.reduction_input(
            input_, op, what, copy=copy or tensors.shares_memory(input_, output)
        )
        plan = tensors.into(output, source.reshape(-1), dtype, (output.numel(),))
        return self._reduce(Collective.REDUCE_SCATTER, plan, op, timeout=timeout), plan

    def _reduce_scatter_base(self, output: torch.Tensor, input_: torch.Tensor, opts: Any = None) -> Work:
        part, plan = self._scatter_into(
            output, input_, _op(opts), "reduce_scatter_tensor", _timeout(opts), copy=False
        )
        return self._work([part], [output], plan.finish)

    def reduce_scatter_single(self, output: torch.Tensor, input_: torch.Tensor, opts: Any = None) -> Work:
        return self._reduce_scatter_base(output, input_, opts)

    def reduce_scatter_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        op, timeout = _op(opts), _timeout(opts)
        started = [
            self._scatter_into(o, i, op, "reduce_scatter_tensor", timeout, copy=False)
            for o, i in zip(outputs, inputs, strict=True)
        ]
        return self._work(
            [part for part, _ in started], outputs, _in_turn([plan.finish for _, plan in started])
        )

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter(  # type: ignore[override]  # the form torch's C++ calls
        self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None
    ) -> Work:
        op, timeout = _op(opts), _timeout(opts)
        started = []
        for output, inputs in zip(_one_or_more(outputs, "reduce_scatter"), input_lists, strict=True):
            if len(inputs) != self.size():
                raise CcoError(
                    ErrorCode.INVALID_FIELD,
                    f"reduce_scatter: {self.size()} inputs expected, got {len(inputs)}",
                )
            for input_ in inputs:
                tensors.check(input_, "reduce_scatter")
            whole = torch.cat([i.detach().reshape(-1) for i in inputs])  # the list as one block: the one copy
            started.append(self._scatter_into(output, whole, op, "reduce_scatter", timeout, copy=False))
        return self._work(
            [part for part, _ in started], outputs, _in_turn([plan.finish for _, plan in started])
        )

    # --- barrier ---------------------------------------------------------------------

    def barrier(self, opts: Any = None) -> Work:
        return self._work([self._comm.start(Collective.BARRIER, timeout=_timeout(opts))], None)

    # --- what CCO does not define ----------------------------------------------------

    def alltoall(self, *args: Any) -> Work:
        raise _unsupported("all_to_all")

    def alltoall_base(self, *args: Any) -> Work:
        raise _unsupported("all_to_all_single")

    def all_to_all_single(self, *args: Any) -> Work:
        raise _unsupported("all_to_all_single")

    def send(self, *args: Any) -> Work:
        raise _unsupported("send")

    def recv(self, *args: Any) -> Work:
        raise _unsupported("recv")

    def recv_anysource(self, *args: Any) -> Work:
        raise _unsupported("recv")

    def gather(self, *args: Any) -> Work:
        raise _unsupported("gather")

    def scatter(self, *args: Any) -> Work:
        raise _unsupported("scatter")

    def monitored_barrier(self, *args: Any) -> None:
        raise _unsupported("monitored_barrier")

    # --- lifetime --------------------------------------------------------------------

    def shutdown(self) -> None:
        """Leave the group collectively (``destroy_process_group``): every rank's last
        collectives complete before anyone leaves."""
        self._close(linger=True)

    def abort(self) -> None:
        """Leave at once; the other ranks' collectives fail naming this one."""
        self._close(linger=False)

    def _close(self, *, linger: bool) -> None:
        with contextlib.suppress(CcoError):
            self._comm.close(linger=linger, timeout=CLOSE_TIMEOUT)
        self._completions.shutdown(wait=True)


def _unsupported(name: str) -> CcoError:
    return CcoError(
        ErrorCode.UNSUPPORTED_FEATURE,
        f"{name} is not a CCO collective (CCO has all_reduce, reduce, broadcast, all_gather, "
        "reduce_scatter and barrier); run it on a Gloo group: dist.new_group(backend='gloo')",
    )


def _op(opts: Any) -> ReduceOp:
    return tensors.reduce_op(opts.reduceOp) if opts is not None else ReduceOp.SUM


def _timeout(opts: Any) -> float | None:
    """An explicit per-call timeout in seconds; None (torch's "unset") for the watchdog."""
    timeout = getattr(opts, "timeout", None)
    return timeout.total_seconds() if isinstance(timeout, timedelta) and timeout > timedelta(0) else None


def _one_or_more(items: list[Any], what: str) -> list[Any]:
    if not items:
        raise CcoError(ErrorCode.INVALID_FIELD, f"{what}: no tensors")
    return items


def _exactly_one(items: list[Any], what: str) -> list[Any]:
    if len(items) != 1:
        raise CcoError(ErrorCode.INVALID_FIELD, f"{what}: one tensor per call, got {len(items)}")
    return items


def _in_turn(steps: Sequence[Callable[[], None]]) -> Callable[[], None]:
    def run() -> None:
        for step in steps:
            step()

    return run
