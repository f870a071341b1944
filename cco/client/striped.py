"""One job's collectives striped over several groups: :class:`StripedCommunicator`.

An aggregator is one Python process, and every chunk of a group's operation goes
through the one aggregator its tree names: a group's bandwidth through the
aggregation layer is one core's.  A job that cuts each large call into S contiguous
runs, each reduced in a group of its own (a *stripe*), gets S aggregators' cores
(``cco-node --role aggregator --workers W`` places each new group on its least used
worker), with no change to the wire: each element is still reduced in exactly one
group, so results stay exact and bit-identical on every rank, as a parameter server
shards its keys over several servers.

Stripe 0 is the caller's :class:`GroupSpec` as it is, so one stripe is exactly a
:class:`Communicator`; stripe k >= 1 joins the group :func:`stripe_group_id` derives
(every rank derives the same) under the node id :func:`stripe_node_id` names, with a
certificate of its own (a session is one node id).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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
from cco.client.communicator import DEFAULT_JOIN_TIMEOUT, Communicator
from cco.client.spec import GroupSpec, default_rank
from cco.nodes.calls import CollectiveRequest
from cco.nodes.planning import check_out
from cco.transport import TransportConfig
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.registries import GROUP_ID_SIZE, Collective, ReduceOp

MIN_STRIPE_ELEMENTS = 1 << 16
"""A call is striped only when every stripe gets at least this many elements (for
all-gather and reduce-scatter, of each rank's segment); smaller calls go whole to
stripe 0.  A small call's time is per-message latency (a round trip through the tree
and the work per message), not bandwidth: cutting it would only multiply its
messages, while one aggregator's core moves it as fast as several."""

CUT_ALIGNMENT = 1 << 16
"""Stripes are cut at multiples of this many elements (of each rank's segment for
all-gather and reduce-scatter).  A float sum is block-scaled per chunk of the
group's ``chunk_elements``, blocks counted from each chunk's start: when the chunk
size divides this (the default, 32768, does), every element lies in the same block
as unstriped, and the result is the unstriped one bit for bit.  Whatever the chunk
size, every rank cuts alike, so results stay bit-identical on every rank."""

_GROUP_LABEL = b"cco stripe group v1"
_PARTS = frozenset(
    {
        Collective.ALL_REDUCE,
        Collective.REDUCE,
        Collective.BROADCAST,
        Collective.ALL_GATHER,
        Collective.REDUCE_SCATTER,
    }
)


def stripe_group_id(group_id: bytes, stripe: int) -> bytes:
    """The group id of stripe ``stripe`` of the job whose stripe 0 is ``group_id``: the
    first 16 bytes of SHA-256 over a fixed label, the base id and the stripe index
    (stripe 0 is the base id itself)."""
    if stripe == 0:
        return group_id
    digest = hashlib.sha256(_GROUP_LABEL + group_id + stripe.to_bytes(4, "big")).digest()
    return digest[:GROUP_ID_SIZE]


def stripe_node_id(node_id: str, stripe: int) -> str:
    """The node id of this rank's session in stripe ``stripe``: ``node_id`` for stripe 0,
    else ``<node_id>.s<stripe>`` (a certificate of its own)."""
    return node_id if stripe == 0 else f"{node_id}.s{stripe}"


def stripe_spec(spec: GroupSpec, stripe: int) -> GroupSpec:
    """Stripe ``stripe``'s group: ``spec`` with the derived group id, all else alike."""
    return spec if stripe == 0 else dataclasses.replace(spec, group_id=stripe_group_id(spec.group_id, stripe))


def cuts(elements: int, stripes: int) -> list[tuple[int, int]] | None:
    """Where a call of ``elements`` (per rank segment for all-gather and reduce-scatter)
    is cut: S contiguous ``(start, stop)`` runs of near-equal length, cut at multiples
    of :data:`CUT_ALIGNMENT`; None when it goes whole to stripe 0 (one stripe, or
    fewer than S x :data:`MIN_STRIPE_ELEMENTS` elements).  A function of its
    arguments alone, so that every rank cuts alike."""
    if stripes < 2 or elements < stripes * MIN_STRIPE_ELEMENTS:
        return None
    units = -(-elements // CUT_ALIGNMENT)
    each, longer = divmod(units, stripes)
    runs = []
    start = 0
    for k in range(stripes):
        stop = min(elements, start + (each + (k < longer)) * CUT_ALIGNMENT)
        runs.append((start, stop))
        start = stop
    return runs


class StripedCommunicator:
    """The collectives of one job over S groups on one event loop: each large call is
    cut into S contiguous runs, one per stripe, all started at once.  Create with
    :meth:`join`.

    Every rank cuts a call alike from what it passes (shape, dtype, root), never from
    timing: see :func:`cuts`.  A call completes when every stripe's part has; if a part
    fails, the call fails with the typed error of the lowest stripe that failed, and
    its output (``out``, or the result array) holds the completed parts' results
    and unspecified values elsewhere.

    Refused with more than one stripe (UNSUPPORTED_FEATURE): quorum all-reduces and
    ``elastic`` groups, and accepting a new membership.  Each decides membership per
    group, and different stripes could decide differently, so that one element's sum
    would be over other ranks than its neighbour's.
    """

    def __init__(self, stripes: Sequence[Communicator]) -> None:
        if not stripes:
            raise ValueError("a striped communicator needs at least one stripe")
        self._stripes = tuple(stripes)
        self.spec = stripes[0].spec

    @classmethod
    async def join(
        cls,
        spec: GroupSpec,
        node_id: str,
        transports: Sequence[TransportConfig],
        timeout: float = DEFAULT_JOIN_TIMEOUT,
        *,
        preload: bool = True,
    ) -> StripedCommunicator:
        """Join ``len(transports)`` stripes at once: stripe k as :func:`stripe_node_id`
        with ``transports[k]`` (its certificate) in the group :func:`stripe_spec` gives.
        If any join fails, the others are closed and its error is raised (the lowest
        stripe's first).  ``timeout`` and ``preload`` as for :meth:`Communicator.join`;
        ``spec.elastic`` is refused with more than one stripe."""
        count = len(transports)
        if count < 1:
            raise CcoError(ErrorCode.INVALID_FIELD, "a striped communicator needs at least one transport")
        if count > 1 and spec.elastic:
            raise CcoError(
                ErrorCode.UNSUPPORTED_FEATURE,
                "elastic groups cannot be striped: each stripe's group would decide its own survivors",
            )
        rank = spec.rank if spec.rank is not None else default_rank(node_id, spec.world_size)
        base = spec if rank is None else dataclasses.replace(spec, rank=rank)
        if count > 1 and base.rank is None:
            raise CcoError(
                ErrorCode.INVALID_FIELD,
                f"striping needs a known rank (GroupSpec.rank, a node id ending -N, or RANK) for {node_id}",
            )
        joins = [
            asyncio.ensure_future(
                Communicator.join(
                    stripe_spec(base, k), stripe_node_id(node_id, k), transport, timeout, preload=preload
                )
            )
            for k, transport in enumerate(transports)
        ]
        try:
            await asyncio.wait(joins)
        except BaseException:  # cancelled: no stripe may stay joined
            _abandon(joins)
            raise
        errors = [join.exception() for join in joins]
        failed = next((error for error in errors if error is not None), None)
        if failed is not None:
            joined = [join.result() for join, error in zip(joins, errors, strict=True) if error is None]
            await asyncio.gather(*(comm.close(linger=False) for comm in joined), return_exceptions=True)
            raise failed
        return cls([join.result() for join in joins])

    @classmethod
    async def from_pki(
        cls,
        spec: GroupSpec,
        node_id: str,
        pki_dir: str | Path,
        stripes: int,
        timeout: float = DEFAULT_JOIN_TIMEOUT,
        **transport: Any,
    ) -> StripedCommunicator:
        """:meth:`join` with ``stripes`` stripes, each with the credentials ``cco-node
        certs`` wrote for its node id (``ep-0``, ``ep-0.s1`` ...) in ``pki_dir``;
        keywords go to :class:`TransportConfig`."""
        configs = [
            TransportConfig.for_node(pki_dir, stripe_node_id(node_id, k), **transport) for k in range(stripes)
        ]
        return await cls.join(spec, node_id, configs, timeout)

    # --- identity ------------------------------------------------------------------

    @property
    def stripes(self) -> tuple[Communicator, ...]:
        """The stripes' communicators, stripe 0 first (each one group membership)."""
        return self._stripes

    @property
    def rank(self) -> int:
        return self._stripes[0].rank

    @property
    def members(self) -> frozenset[int]:
        """The ranks that are members of every stripe's group now."""
        return frozenset.intersection(*(comm.members for comm in self._stripes))

    @property
    def world_size(self) -> int:
        """How many ranks are members of every stripe's group now."""
        return len(self.members)

    @property
    def epoch(self) -> int:
        """Stripe 0's epoch (each stripe's group counts its own: see :attr:`stripes`)."""
        return self._stripes[0].epoch

    @property
    def last_chunk_elements(self) -> int | None:
        """Stripe 0's :attr:`Communicator.last_chunk_elements` (each stripe's group
        agrees its own: :attr:`stripes` has the others)."""
        return self._stripes[0].last_chunk_elements

    def accept_membership(self) -> frozenset[int]:
        """See :meth:`Communicator.accept_membership`; refused with more than one stripe
        (the stripes' groups learn of a loss each in its own time)."""
        self._one_stripe("accepting a new membership")
        return self._stripes[0].accept_membership()

    def _one_stripe(self, what: str) -> None:
        if len(self._stripes) > 1:
            raise CcoError(
                ErrorCode.UNSUPPORTED_FEATURE,
                f"{what} is refused over {len(self._stripes)} stripes: each stripe's group "
                "decides membership on its own, and they could decide differently",
            )

    # --- collectives ---------------------------------------------------------------

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
        """Begin a collective whose input :func:`prepare_input` prepared: whole on stripe
        0, or cut over every stripe (see :func:`cuts`), the parts started at once, in
        the same order on every rank."""
        count = len(self._stripes)
        if count > 1 and kind is Collective.BROADCAST and array is None:
            raise CcoError(
                ErrorCode.INVALID_FIELD,
                "over stripes a broadcast receiver passes an array of the root's shape and dtype: "
                "every rank must cut the call alike",
            )
        runs = None
        if kind in _PARTS and array is not None:
            segment = array.size // self.spec.world_size if kind is Collective.REDUCE_SCATTER else array.size
            if kind is not Collective.REDUCE_SCATTER or array.size % self.spec.world_size == 0:
                runs = cuts(segment, count)
        if runs is None:
            return self._stripes[0]._begin(kind, array, op, root, nonfinite, bad, kw)
        assert array is not None
        data = self._striped(kind, array, op, root, kw, runs)
        if nonfinite is None or bad is None:
            return data
        flag = CollectiveRequest(
            kind=Collective.ALL_GATHER, array=np.array([bad], dtype=np.int8), timeout=kw.get("timeout")
        )
        return asyncio.ensure_future(settle_nonfinite(kind, data, self._stripes[0].start(flag), nonfinite))

    def _striped(
        self,
        kind: Collective,
        array: np.ndarray,
        op: ReduceOp,
        root: int | None,
        kw: dict[str, Any],
        runs: list[tuple[int, int]],
    ) -> asyncio.Future[Any]:
        """Start every stripe's part of one call; the future of the whole result."""
        world = self.spec.world_size
        options = {key: value for key, value in kw.items() if key != "out"}
        out = _whole_out(kind, array, kw.get("out"), world)
        receiver = kind is Collective.BROADCAST and root != self.rank
        gets_result = kind is not Collective.REDUCE or root == self.rank
        if out is None and gets_result:
            shape = (world, *array.shape) if kind is Collective.ALL_GATHER else array.shape
            if kind is Collective.REDUCE_SCATTER:
                shape = (array.size // world,)
            out = np.empty(shape, dtype=array.dtype)
        flat = array if receiver else np.ascontiguousarray(array).reshape(-1)  # a view, unless strided
        inputs: list[np.ndarray] = []
        outs: list[np.ndarray | None] = []
        for start, stop in runs:
            if receiver:  # only the shape counts: a zero-strided array of it, no memory
                inputs.append(np.broadcast_to(np.zeros((), dtype=array.dtype), (stop - start,)))
            elif kind is Collective.REDUCE_SCATTER:  # this run of every rank's segment
                inputs.append(flat.reshape(world, -1)[:, start:stop])
            else:
                inputs.append(flat[start:stop])
            # an all-gather part's rows are not contiguous in the whole: copied in at the end
            target = None if out is None or kind is Collective.ALL_GATHER else out.reshape(-1)[start:stop]
            outs.append(target)
        parts: list[asyncio.Future[Any]] = []
        try:
            for comm, values, target in zip(self._stripes, inputs, outs, strict=True):
                request = CollectiveRequest(kind=kind, op=op, array=values, root=root, out=target, **options)
                parts.append(comm.start(request))
        except BaseException:
            for part in parts:  # already started on every rank alike: let them end unseen
                part.add_done_callback(_retrieve)
            raise

        def finish() -> np.ndarray | None:
            if kind is Collective.ALL_GATHER:
                assert out is not None
                rows = out.reshape(world, -1)
                for (start, stop), part in zip(runs, parts, strict=True):
                    rows[:, start:stop] = present(part.result()).reshape(world, -1)
            return out if gets_result else None

        return asyncio.ensure_future(_all_parts(parts, finish))

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
        array, bad = prepare_input(kind, array, op, nonfinite)
        return self._begin(kind, array, reduce_op(op), root, nonfinite, bad, kw)

    def start_all_reduce(
        self, array: Any, op: ReduceOp | str = ReduceOp.SUM, **kw: Any
    ) -> asyncio.Future[Any]:
        """Begin an all-reduce (see :meth:`all_reduce`); its future."""
        return self._start_call(Collective.ALL_REDUCE, array, op, **kw)

    async def all_reduce(self, array: Any, op: ReduceOp | str = ReduceOp.SUM, **kw: Any) -> np.ndarray:
        """See :meth:`Communicator.all_reduce`; a large array is cut over the stripes."""
        return present(await self.start_all_reduce(array, op, **kw))

    async def reduce(
        self, array: Any, root: int, op: ReduceOp | str = ReduceOp.SUM, **kw: Any
    ) -> np.ndarray | None:
        """See :meth:`Communicator.reduce`."""
        result: np.ndarray | None = await self._start_call(Collective.REDUCE, array, op, root=root, **kw)
        return result

    async def broadcast(self, array: Any, root: int, **kw: Any) -> np.ndarray:
        """See :meth:`Communicator.broadcast`.  Over stripes every receiver passes an
        array of the root's shape and dtype (INVALID_FIELD without one): the root cuts
        the call by its shape, and so must every receiver."""
        return present(await self._start_call(Collective.BROADCAST, array, root=root, **kw))

    async def barrier(self, **kw: Any) -> None:
        """See :meth:`Communicator.barrier` (on stripe 0)."""
        await self._start_call(Collective.BARRIER, **kw)

    async def all_gather(self, array: Any, **kw: Any) -> np.ndarray:
        """See :meth:`Communicator.all_gather`: each rank's array is cut over the stripes
        and the parts put back in rank order."""
        return present(await self._start_call(Collective.ALL_GATHER, array, **kw))

    async def reduce_scatter(self, array: Any, op: ReduceOp | str = ReduceOp.SUM, **kw: Any) -> np.ndarray:
        """See :meth:`Communicator.reduce_scatter`: each rank's segment is cut over the
        stripes, so each stripe gives every rank its run of its own part."""
        return present(await self._start_call(Collective.REDUCE_SCATTER, array, op, **kw))

    def start_all_reduce_quorum(
        self, array: Any, op: ReduceOp | str = ReduceOp.SUM, *, min_ranks: int, wait: float, **kw: Any
    ) -> asyncio.Future[PartialResult]:
        """See :meth:`Communicator.start_all_reduce_quorum`; refused with more than one
        stripe (each stripe's quorum could hold other ranks)."""
        self._one_stripe("a quorum all-reduce")
        return self._stripes[0].start_all_reduce_quorum(array, op, min_ranks=min_ranks, wait=wait, **kw)

    async def all_reduce_quorum(
        self, array: Any, op: ReduceOp | str = ReduceOp.SUM, *, min_ranks: int, wait: float, **kw: Any
    ) -> PartialResult:
        """See :meth:`start_all_reduce_quorum`."""
        return await self.start_all_reduce_quorum(array, op, min_ranks=min_ranks, wait=wait, **kw)

    # --- lifetime ------------------------------------------------------------------

    async def close(self, *, linger: bool = True, timeout: float | None = None) -> None:
        """Close every stripe at once (see :meth:`Communicator.close`)."""
        await asyncio.gather(*(comm.close(linger=linger, timeout=timeout) for comm in self._stripes))

    async def __aenter__(self) -> StripedCommunicator:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """As :meth:`Communicator.__aexit__`, for every stripe."""
        await self.close(linger=exc_type is None)


def _whole_out(kind: Collective, array: np.ndarray, out: Any, world: int) -> np.ndarray | None:
    """The caller's ``out`` for the whole call, checked as unstriped calls check it
    (the parts see only views of it)."""
    if out is None:
        return None
    whole: np.ndarray = as_array(out, "out")
    check_out(kind, whole, array, array.dtype, world)
    return whole


async def _all_parts(
    parts: list[asyncio.Future[Any]], finish: Callable[[], np.ndarray | None]
) -> np.ndarray | None:
    """Wait for every part (none still writes to the output after this returns); then
    the lowest stripe's failure, else ``finish()``."""
    await asyncio.wait(parts)
    errors = [  # every one retrieved
        CcoError(ErrorCode.ABORTED, "part cancelled") if part.cancelled() else part.exception()
        for part in parts
    ]
    failed = next((error for error in errors if error is not None), None)
    if failed is not None:
        raise failed
    return finish()


def _abandon(joins: Sequence[asyncio.Future[Communicator]]) -> None:
    """Stop joining: joins still under way are cancelled (Communicator.join closes its
    session then), and stripes already joined leave at once."""
    for join in joins:
        if not join.done():
            join.cancel()
        elif not join.cancelled() and join.exception() is None:
            leaving = asyncio.ensure_future(join.result().close(linger=False))
            leaving.add_done_callback(_retrieve)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        with contextlib.suppress(BaseException):
            future.exception()
