"""A collective call checked and planned, before it gets its op_ids.

:func:`plan` refuses misuse with a :class:`~cco.wire.errors.CcoError` (a root outside
the group, a dtype the array does not have, an ``out`` that cannot take the result,
a quorum outside the members...) and decides how the call travels: which form (plain,
EXACT or block-scaled, :func:`cco.wire.ops.form`), at which width, which positions
this rank's input fills.  The whole-tensor work that follows
(:meth:`Prepared.compute`) reads only the caller's array and the plan, so the I/O
layer may run it on another thread (numpy releases the GIL for the large parts) while
the machine's thread serves every connection.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cco.nodes.calls import CollectiveRequest
from cco.nodes.data_operation import DataOperation, placement, propose, source_of
from cco.nodes.membership import Membership
from cco.nodes.operation import Quorum
from cco.wire import blockscale
from cco.wire.dtypes import ELEMENT_TYPES
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import MAX_TOTAL_ELEMENTS, ROOTED_KINDS, GroupParams
from cco.wire.ops import SUM_KINDS, Form, check_operation, form, sums_exactly
from cco.wire.packing import WIDTHS
from cco.wire.registries import Collective, DType, ReduceOp

NUMPY_DTYPES: dict[np.dtype[np.generic], DType] = {
    t.storage: code for code, t in ELEMENT_TYPES.items() if code is not DType.BFLOAT16
}
"""The DType of an application array by its numpy dtype (float32 arrays carry FLOAT32
unless the call names BFLOAT16)."""


@dataclass(slots=True)
class Prepared:
    """A call checked and planned by :func:`plan`, not yet started.

    :meth:`compute` does its whole-tensor work: a block-scaled operation's proposed
    scale for every block, or, for the other forms, encoding every chunk once so that
    an unencodable value fails the call before anything is sent.
    """

    request: CollectiveRequest
    operation: DataOperation
    params: GroupParams
    width: int | None  # bytes per element of a block-scaled operation; None for the other forms
    limit: int  # the block-scaled sum limit Q
    error: CcoError | None = None
    computed: bool = False

    def compute(self) -> None:
        if self.computed:
            return
        try:
            if self.width is not None:
                block_elements = self.params.block_elements
                self.operation.scaling = propose(self.operation, self.width, self.limit, block_elements)
            else:
                self.operation.check_encodes()
        except CcoError as error:
            self.error = error
        self.computed = True


def plan(request: CollectiveRequest, membership: Membership) -> Prepared:
    """Check ``request`` against ``membership`` and plan it (CcoError for misuse)."""
    dtype, op, root, array = _checked(request, membership)
    element = ELEMENT_TYPES[dtype]
    if array is not None and array.dtype != element.storage:
        raise CcoError(ErrorCode.INVALID_FIELD, f"{dtype.name} arrays are numpy {element.storage}")
    if request.out is not None:
        check_out(request.kind, request.out, array, element.storage, membership.world_size)
    check_operation(request.kind, op, dtype, 0 if array is None else array.size)
    exact = array is not None and sums_exactly(request.kind, op, dtype, array.size)
    scaled = form(request.kind, op, dtype, exact) is Form.BLOCK_SCALED
    width = _wire_width(request, dtype, op, scaled or exact, membership.params)  # checked; unused when EXACT
    rank, world_size = membership.rank, membership.world_size
    sending = request.kind is not Collective.BROADCAST or root == rank
    source = source_of(array) if sending else None
    placed = placement(request.kind, dtype, source, rank, exact)
    if source is not None:
        total = len(placed) * (world_size if request.kind is Collective.ALL_GATHER else 1)
    elif array is not None:  # a broadcast receiver that knows the shape
        total = array.size * element.patterns_per_element
    else:  # learnt from the first verified chunk
        total = -1
    timeout = request.timeout if request.timeout is not None else membership.default_timeout
    operation = DataOperation(
        op_id=-1,  # given by start()
        kind=request.kind,
        op=op,
        dtype=dtype,
        root=root,
        rank=rank,
        world_size=world_size,
        shape=array.shape if array is not None else None,
        source=source,
        placed=placed,
        deadline=0.0,  # from start()'s now
        timeout=timeout,
        watchdog=request.timeout is None,
        exact=exact,
        out=request.out,
    )
    if total >= 0:
        operation.size(total, membership.params.chunk_elements, frozenset())
    limit = blockscale.sum_limit(width, world_size) if scaled else 0
    return Prepared(request, operation, membership.params, width if scaled else None, limit)


def _checked(
    request: CollectiveRequest, membership: Membership
) -> tuple[DType, ReduceOp, int | None, np.ndarray | None]:
    """The call's dtype, op and root, and its array as numpy (None if it has none)."""
    kind = request.kind
    world = membership.world_size
    needs_root = kind in ROOTED_KINDS
    if needs_root != (request.root is not None):
        raise CcoError(ErrorCode.INVALID_FIELD, f"{kind.name} {'needs' if needs_root else 'takes no'} root")
    if request.root is not None and not 0 <= request.root < world:
        raise CcoError(ErrorCode.INVALID_FIELD, f"root {request.root} is not a rank of {world}")
    if kind in SUM_KINDS and request.op is not ReduceOp.SUM:
        raise CcoError(ErrorCode.INVALID_FIELD, f"{kind.name} takes no reduction op")
    if request.timeout is not None and request.timeout <= 0:
        raise CcoError(ErrorCode.INVALID_FIELD, f"timeout {request.timeout} is not positive")
    if request.quorum is not None:
        _check_quorum(kind, request.quorum, membership.accepted)
    if kind is Collective.BARRIER:
        barrier_array = None if request.array is None else np.asarray(request.array)
        return DType.INT8, ReduceOp.SUM, None, barrier_array  # plan() refuses any but int8
    array = request.array
    receiver = kind is Collective.BROADCAST and request.root != membership.rank
    if array is None:
        if not receiver or request.dtype is None:
            raise CcoError(ErrorCode.INVALID_FIELD, f"{kind.name} needs an array (or a dtype to receive)")
        return request.dtype, request.op, request.root, None
    array = np.asarray(array)
    dtype = request.dtype if request.dtype is not None else NUMPY_DTYPES.get(array.dtype)
    if dtype is None:
        raise CcoError(ErrorCode.UNSUPPORTED_FEATURE, f"numpy dtype {array.dtype} is not a CCO dtype")
    size = array.size * (world if kind is Collective.ALL_GATHER else 1)
    if size > MAX_TOTAL_ELEMENTS:
        raise CcoError(ErrorCode.MESSAGE_TOO_LARGE, f"{size} elements exceed {MAX_TOTAL_ELEMENTS}")
    if kind is Collective.REDUCE_SCATTER and array.size % world:
        raise CcoError(ErrorCode.INVALID_FIELD, f"{array.size} elements do not split into {world} parts")
    return dtype, request.op, request.root, array


def check_out(
    kind: Collective, out: object, array: np.ndarray | None, storage: np.dtype, world_size: int
) -> None:
    """``out`` must take exactly the result of ``kind`` over ``array`` (elements of
    ``storage``), and never overlap the input."""
    if not isinstance(out, np.ndarray):
        raise CcoError(ErrorCode.INVALID_FIELD, f"out is a {type(out).__name__}, not a numpy array")
    if kind is Collective.BARRIER:
        raise CcoError(ErrorCode.INVALID_FIELD, "BARRIER has no result to write to out")
    if array is None:
        raise CcoError(ErrorCode.INVALID_FIELD, f"{kind.name} with out needs the array too (its shape)")
    if kind is Collective.ALL_GATHER:
        shape: tuple[int, ...] = (world_size, *array.shape)
    elif kind is Collective.REDUCE_SCATTER:
        shape = (array.size // world_size,)
    else:
        shape = array.shape
    if out.shape != shape or out.dtype != storage:
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"out is {out.dtype} of shape {out.shape}; the {kind.name} result is {storage} of shape {shape}",
        )
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise CcoError(ErrorCode.INVALID_FIELD, "out must be C-contiguous and writeable")
    if np.may_share_memory(out, array):
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            "out shares memory with the input array, which the operation reads until it completes",
        )


def _check_quorum(kind: Collective, quorum: Quorum, accepted: frozenset[int]) -> None:
    if kind is not Collective.ALL_REDUCE:
        raise CcoError(ErrorCode.UNSUPPORTED_FEATURE, f"the quorum policy is for ALL_REDUCE, not {kind.name}")
    members = len(accepted)
    if not 1 <= quorum.min_ranks <= members:
        raise CcoError(
            ErrorCode.INVALID_FIELD,
            f"a quorum of {quorum.min_ranks} is not between 1 and the {members} members",
        )
    if not 0 < quorum.wait <= 86_400:
        raise CcoError(ErrorCode.INVALID_FIELD, f"quorum wait {quorum.wait} s is not in (0, 86400]")


def _wire_width(
    request: CollectiveRequest, dtype: DType, op: ReduceOp, scaled: bool, params: GroupParams
) -> int:
    """Bytes per integer of a block-scaled operation (0 for the other forms)."""
    if request.width is not None:
        if not scaled:
            raise CcoError(
                ErrorCode.INVALID_FIELD,
                f"width applies to float SUM and AVG reductions, not {dtype.name} {op.name} "
                f"in {request.kind.name}",
            )
        if request.width not in tuple(8 * w for w in WIDTHS):
            raise CcoError(ErrorCode.INVALID_FIELD, f"width {request.width} is not 8, 16, 32 or 64 bits")
        return request.width // 8
    if not scaled:
        return 0
    if params.float_width is not None:
        return params.float_width
    return ELEMENT_TYPES[dtype].bits // 8
