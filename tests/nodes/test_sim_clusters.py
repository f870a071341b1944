"""Whole deployments in memory: a real rendezvous, three aggregators, eight endpoints.

Every test runs the machines through :mod:`cco.nodes.sim`: random delivery order
(seeded), every message re-encoded through the codec, and simulated time.  The
rendezvous plans a two-level tree (two leaves of four endpoints under a root).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cco.nodes import aggregator_states, endpoint_states
from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
from cco.nodes.calls import CollectiveRequest, OperationError
from cco.nodes.endpoint import EndpointMachine
from cco.nodes.endpoint_states import SessionState
from cco.nodes.events import Command, Input, OperationCompleted, OperationFailed, SendMessage
from cco.nodes.rendezvous import FALLBACK_LABEL, RendezvousMachine
from cco.nodes.sim import Deployment, GroupSpec, build_cluster, sim_address
from cco.wire import payload
from cco.wire.dtypes import ELEMENT_TYPES, round_to_bfloat16
from cco.wire.errors import ErrorCode
from cco.wire.messages import (
    ChunkMessage,
    Contribution,
    Error,
    GroupParams,
    Message,
    PartialAggregate,
    Result,
    encode_message,
)
from cco.wire.packing import contribution_bound
from cco.wire.registries import Collective, DType, ReduceOp, Role

GROUP = bytes.fromhex("0c" * 16)
OTHER = bytes.fromhex("d4" * 16)
WORLD = 8
PARAMS = GroupParams(chunk_elements=4, window=3, heartbeat_interval_ms=1000, operation_timeout_ms=2000)
SPEC = Path(__file__).resolve().parents[2] / "spec" / "sections" / "collectives.xml"


def deploy(seed: int = 0, *, world: int = WORLD, **kw: object) -> Deployment:
    return build_cluster(
        [GroupSpec(GROUP, world)],
        aggregators=3,
        params=PARAMS,
        max_fan_in=4,
        seed=seed,
        **kw,  # type: ignore[arg-type]
    )


def inputs(dtype: DType, n: int, seed: int, world: int = WORLD) -> dict[int, np.ndarray]:
    """Per-rank inputs whose reductions over ``world`` ranks fit every type."""
    rng = np.random.default_rng(seed)
    element = ELEMENT_TYPES[dtype]
    out = {}
    for rank in range(world):
        if element.is_float:
            scale = 8.0 if dtype is DType.FLOAT16 else 1.0
            values = ((rng.random(n) * 2 - 1) * scale).astype(element.storage)
            out[rank] = round_to_bfloat16(values) if dtype is DType.BFLOAT16 else values
        else:
            bound = min((1 << (element.bits - 1)) // (2 * world), contribution_bound(world))
            out[rank] = rng.integers(-bound, bound, n, endpoint=True).astype(element.storage)
    return out


def reduce_reference(arrays: list[np.ndarray], op: ReduceOp, dtype: DType) -> list[Fraction | int]:
    """The exact reduction, element by element, with Python integers and rationals."""
    if ELEMENT_TYPES[dtype].is_float:
        columns = [[Fraction(float(v)) for v in column] for column in zip(*arrays, strict=True)]
    else:
        columns = [[int(v) for v in column] for column in zip(*arrays, strict=True)]
    combine = {
        ReduceOp.SUM: sum,
        ReduceOp.AVG: lambda c: Fraction(sum(c), len(c)),
        ReduceOp.MIN: min,
        ReduceOp.MAX: max,
        ReduceOp.BAND: lambda c: functools.reduce(lambda a, b: a & b, c),
        ReduceOp.BOR: lambda c: functools.reduce(lambda a, b: a | b, c),
        ReduceOp.BXOR: lambda c: functools.reduce(lambda a, b: a ^ b, c),
    }[op]
    return [combine(column) for column in columns]  # type: ignore[no-untyped-call]


def assert_reduction(
    result: np.ndarray, exact: list[Fraction | int], dtype: DType, op: ReduceOp, tolerance: np.ndarray
) -> None:
    """``result`` is the reduction: exact for integers and for MIN and MAX (floats
    travel in order-preserving form); within ``tolerance`` (the documented bound of
    block-scaled fixed point) for float SUM and AVG."""
    element = ELEMENT_TYPES[dtype]
    assert result.dtype == element.storage
    if not element.is_float:
        # integers are exact; an average rounds half to even
        want = [round(v) if isinstance(v, Fraction) else v for v in exact]
        assert result.tolist() == want
        return
    want = np.array([float(v) for v in exact])
    if op in (ReduceOp.MIN, ReduceOp.MAX):
        assert result.astype(np.float64).tolist() == want.tolist()
        return
    assert (np.abs(result.astype(np.float64) - want) <= tolerance).all(), (result, want, tolerance)


def float_tolerance(
    arrays: list[np.ndarray], exact: list[Fraction | int], dtype: DType, op: ReduceOp
) -> np.ndarray:
    """The documented error bound of each element of a float SUM or AVG of ``arrays``."""
    element = ELEMENT_TYPES[dtype]
    if not element.is_float:
        return np.zeros(len(exact))
    significand = 8 if dtype is DType.BFLOAT16 else np.finfo(element.storage).nmant + 1
    divisor = len(arrays) if op is ReduceOp.AVG else 1
    want = np.array([float(v) for v in exact])
    flat = [a.reshape(-1) for a in arrays]
    return reference.block_scaled_tolerance(
        flat,
        PARAMS.chunk_elements,
        PARAMS.block_elements,
        element.bits,
        len(arrays),
        significand,
        want,
        divisor,
    )


def identical(results: dict[int, Command]) -> np.ndarray | None:
    """The one result every rank returned, bit for bit (None if all returned None)."""
    arrays = []
    for outcome in results.values():
        assert isinstance(outcome, OperationCompleted), outcome
        arrays.append(outcome.result)
    first = arrays[0]
    for other in arrays[1:]:
        assert (other is None) == (first is None)
        if first is not None and other is not None:
            assert other.dtype == first.dtype and other.shape == first.shape
            assert other.tobytes() == first.tobytes()
    return first


def run_and_check(
    d: Deployment,
    kind: Collective,
    op: ReduceOp,
    dtype: DType,
    data: dict[int, np.ndarray],
    root: int | None = None,
) -> None:
    """Run one collective on every rank and compare each result with the reference."""
    world = len(data)
    requests = {
        r: CollectiveRequest(
            kind=kind,
            op=op,
            array=None if kind is Collective.BARRIER else data[r],
            root=root,
            dtype=dtype if dtype is DType.BFLOAT16 else None,
        )
        for r in range(world)
    }
    results = d.collective(GROUP, requests)
    assert len(results) == world
    arrays = [data[r] for r in range(world)]
    if kind is Collective.BARRIER:
        assert identical(results) is None
    elif kind is Collective.BROADCAST:
        assert root is not None
        assert identical(results).tobytes() == data[root].tobytes()  # type: ignore[union-attr]
    elif kind is Collective.ALL_GATHER:
        assert identical(results).tobytes() == np.stack(arrays).tobytes()  # type: ignore[union-attr]
    elif kind is Collective.REDUCE:
        assert root is not None
        for rank, outcome in results.items():
            assert isinstance(outcome, OperationCompleted)
            if rank != root:
                assert outcome.result is None
        result = results[root]
        assert isinstance(result, OperationCompleted) and result.result is not None
        exact = reduce_reference(arrays, op, dtype)
        assert_reduction(result.result, exact, dtype, op, float_tolerance(arrays, exact, dtype, op))
    else:
        exact = reduce_reference(arrays, op, dtype)
        tolerance = float_tolerance(arrays, exact, dtype, op)
        if kind is Collective.ALL_REDUCE:
            result = identical(results)
            assert result is not None
            assert_reduction(result, exact, dtype, op, tolerance)
        else:  # REDUCE_SCATTER: rank r gets part r of the reduction
            part = len(exact) // world
            for rank, outcome in results.items():
                assert isinstance(outcome, OperationCompleted) and outcome.result is not None
                part_of = slice(rank * part, (rank + 1) * part)
                assert_reduction(outcome.result, exact[part_of], dtype, op, tolerance[part_of])


_CASES = [
    (kind, op)
    for kind in Collective
    for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX)
    if op is ReduceOp.SUM or kind in (Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER)
]


@pytest.mark.parametrize(("kind", "op"), _CASES, ids=[f"{k.name}-{o.name}" for k, o in _CASES])
@pytest.mark.parametrize("dtype", [DType.INT32, DType.FLOAT32])
def test_every_collective_through_a_two_level_tree(kind: Collective, op: ReduceOp, dtype: DType) -> None:
    seed = hash((kind, op, dtype)) % 1000
    d = deploy(seed)
    roots = {d.aggregator(a).group_parent(GROUP) for a in d.aggregators}
    assert None in roots and len(roots) == 2, "two levels: leaves under one root"
    root = 5 if kind in (Collective.REDUCE, Collective.BROADCAST) else None
    run_and_check(d, kind, op, dtype, inputs(dtype, 24, seed), root)


@pytest.mark.parametrize("seed", range(4))
def test_arrival_order_does_not_change_a_single_bit(seed: int) -> None:
    """Different delivery orders, same bits: integers add exactly in any order."""
    data = inputs(DType.FLOAT32, 40, 99)
    d = deploy(seed)
    results = d.collective(
        GROUP, {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=data[r]) for r in range(WORLD)}
    )
    first = identical(results)
    assert first is not None
    reference = deploy(1000)
    again = identical(
        reference.collective(
            GROUP, {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=data[r]) for r in range(WORLD)}
        )
    )
    assert again is not None and again.tobytes() == first.tobytes()


_REDUCTIONS = [Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER]


@st.composite
def _any_case(draw: st.DrawFn) -> tuple[Collective, ReduceOp, DType, int, int]:
    dtype = draw(st.sampled_from(list(DType)))
    kind = draw(st.sampled_from(list(Collective)))
    if kind in _REDUCTIONS:
        ops = [
            o
            for o in ReduceOp
            if not (ELEMENT_TYPES[dtype].is_float and o in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR))
        ]
        op = draw(st.sampled_from(ops))
    else:
        op = ReduceOp.SUM
    length = (
        WORLD * draw(st.integers(0, 3)) if kind is Collective.REDUCE_SCATTER else draw(st.integers(0, 13))
    )
    return kind, op, dtype, length, draw(st.integers(0, 10_000))


@given(_any_case())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_dtype_and_op_hypothesis(case: tuple[Collective, ReduceOp, DType, int, int]) -> None:
    kind, op, dtype, length, seed = case
    d = deploy(seed)
    root = seed % WORLD if kind in (Collective.REDUCE, Collective.BROADCAST) else None
    run_and_check(d, kind, op, dtype, inputs(dtype, length, seed), root)


def test_duplicated_messages_are_not_counted_twice() -> None:
    def twice(src: str, dst: str, message: Message) -> int:
        return 2 if isinstance(message, ChunkMessage) else 1

    d = deploy(3, faults=twice)
    data = {r: np.full(10, r + 1, dtype=np.int32) for r in range(WORLD)}
    results = d.collective(
        GROUP, {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=data[r]) for r in range(WORLD)}
    )
    result = identical(results)
    assert result is not None and result.tolist() == [sum(range(1, WORLD + 1))] * 10


class Tamper:
    """An aggregator that, once ``active``, flips a bit in every Result it sends."""

    def __init__(self, inner: AggregatorMachine) -> None:
        self.inner = inner
        self.active = False

    def handle(self, event: Input, now: float) -> list[Command]:
        out = self.inner.handle(event, now)
        if not self.active:
            return out
        return [self._flip(c) for c in out]

    def next_deadline(self) -> float | None:
        return self.inner.next_deadline()

    @staticmethod
    def _flip(command: Command) -> Command:
        if (
            isinstance(command, SendMessage)
            and isinstance(command.message, Result)
            and command.message.payload
        ):
            message = command.message
            payload_bytes = bytes([message.payload[0] ^ 1]) + message.payload[1:]
            return SendMessage(command.peer, dataclasses.replace(message, payload=payload_bytes))
        return command


def test_a_tampered_aggregate_fails_verification_everywhere() -> None:
    tampers: dict[str, Tamper] = {}

    def wrap(node_id: str, machine: AggregatorMachine) -> Tamper:
        tampers[node_id] = Tamper(machine)
        return tampers[node_id]

    d = deploy(5, wrap=wrap)
    (root,) = [a for a in d.aggregators if d.aggregator(a).group_parent(GROUP) is None]
    tampers[root].active = True
    data = inputs(DType.INT32, 9, 5)
    results = d.collective(
        GROUP, {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=data[r]) for r in range(WORLD)}
    )
    assert len(results) == WORLD
    for outcome in results.values():
        assert isinstance(outcome, OperationFailed)
        assert outcome.error.code is ErrorCode.VERIFICATION_FAILED
        assert GROUP.hex() in str(outcome.error)


def test_after_a_tampered_aggregate_the_group_goes_on_exactly_without_that_path() -> None:
    """Six aggregators: after the first Report takes the tampering root and one leaf
    out of the group's trees, four remain for a new tree.  Every rank fails the
    tampered all-reduce with VERIFICATION_FAILED, whether it judged the Result itself
    or learnt of the new epoch first, and the next all-reduce is exact on every rank."""
    tampers: dict[str, Tamper] = {}

    def wrap(node_id: str, machine: AggregatorMachine) -> Tamper:
        tampers[node_id] = Tamper(machine)
        return tampers[node_id]

    d = build_cluster(
        [GroupSpec(GROUP, WORLD)], aggregators=6, params=PARAMS, max_fan_in=4, seed=6, wrap=wrap
    )
    rendezvous = d.cluster.nodes[d.rendezvous].machine
    assert isinstance(rendezvous, RendezvousMachine)
    (group,) = rendezvous.status().groups
    assert group.tree is not None
    root = group.tree.root.node_id
    tampers[root].active = True
    for call in range(2):
        data = inputs(DType.INT32, 9, 40 + call)
        want = sum(data[r].astype(np.int64) for r in range(WORLD))
        results = d.collective(
            GROUP, {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=data[r]) for r in range(WORLD)}
        )
        assert len(results) == WORLD
        for outcome in results.values():
            if isinstance(outcome, OperationFailed):
                assert call == 0 and outcome.error.code is ErrorCode.VERIFICATION_FAILED, outcome.error
            else:
                assert isinstance(outcome, OperationCompleted) and outcome.result is not None
                assert np.array_equal(outcome.result.astype(np.int64), want)
        if call == 0:
            assert d.cluster.run(lambda: d.ready(GROUP), duration=30.0)
    assert all(d.endpoint(GROUP, r).epoch == 2 for r in range(WORLD))
    (group,) = rendezvous.status().groups
    assert root in group.excluded and group.tree is not None and root not in group.tree.aggregator_ids


def test_two_groups_on_shared_aggregators_are_independent() -> None:
    groups = [GroupSpec(GROUP, WORLD, name="a"), GroupSpec(OTHER, WORLD, name="b")]
    d = build_cluster(groups, aggregators=3, params=PARAMS, max_fan_in=4, seed=11)
    shared = [
        a for a in d.aggregators if d.aggregator(a).group_state(GROUP) is d.aggregator(a).group_state(OTHER)
    ]
    assert shared, "the groups share aggregators"
    data_a = {r: np.full(5, r, dtype=np.int64) for r in range(WORLD)}
    data_b = {r: np.full(7, 100 * r, dtype=np.int64) for r in range(WORLD)}
    ops_a = d.start(
        GROUP, {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=data_a[r]) for r in range(WORLD)}
    )
    ops_b = d.start(
        OTHER, {r: CollectiveRequest(kind=Collective.ALL_GATHER, array=data_b[r]) for r in range(WORLD)}
    )
    d.cluster.run(lambda: len(d.outcomes(GROUP, ops_a)) == len(d.outcomes(OTHER, ops_b)) == WORLD)
    a = identical(d.outcomes(GROUP, ops_a))
    b = identical(d.outcomes(OTHER, ops_b))
    assert a is not None and a.tolist() == [sum(range(WORLD))] * 5
    assert b is not None and b.tolist() == [[100 * r] * 7 for r in range(WORLD)]


class Forger:
    """An endpoint of one group that also pushes a chunk into another group."""

    def __init__(self, inner: EndpointMachine, target: bytes) -> None:
        self.inner = inner
        self.target = target
        self.done = False

    def handle(self, event: Input, now: float) -> list[Command]:
        return self._inject(self.inner.handle(event, now))

    def start(self, request: CollectiveRequest, now: float) -> tuple[int, list[Command]]:
        op_id, out = self.inner.start(request, now)
        return op_id, self._inject(out)

    def next_deadline(self) -> float | None:
        return self.inner.next_deadline()

    def _inject(self, out: list[Command]) -> list[Command]:
        for command in list(out):
            if self.done or not (
                isinstance(command, SendMessage) and isinstance(command.message, Contribution)
            ):
                continue
            self.done = True
            keys = payload.derive_group_keys(bytes(32), self.target)  # it has no key for the target group
            header = dataclasses.replace(payload.ChunkHeader.of(command.message), group_id=self.target)
            values = np.full(header.element_count, 10**6, dtype=np.int64)
            out.append(SendMessage(command.peer, payload.seal(keys, header, 0, values)))
        return out


def test_a_member_of_one_group_cannot_send_into_another() -> None:
    groups = [GroupSpec(GROUP, WORLD, name="a"), GroupSpec(OTHER, WORLD, name="b")]
    d = build_cluster(groups, aggregators=3, params=PARAMS, max_fan_in=4, seed=12)
    d.cluster.record = True
    forger_id = groups[0].endpoint_id(0)
    node = d.cluster.nodes[forger_id]
    assert isinstance(node.machine, EndpointMachine)
    forger = Forger(node.machine, OTHER)
    node.machine = forger
    ops_b = d.start(
        OTHER,
        {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=np.ones(4, np.int32)) for r in range(WORLD)},
    )
    op_a = d.cluster.call_with_result(
        forger_id, lambda now: forger.start(CollectiveRequest(kind=Collective.BARRIER), now)
    )
    d.cluster.run(lambda: len(d.outcomes(OTHER, ops_b)) == WORLD)
    assert forger.done
    refusals = [
        x.message.code
        for x in d.cluster.deliveries
        if x.destination == forger_id and isinstance(x.message, Error)
    ]
    assert refusals == [ErrorCode.UNAUTHORIZED]
    b = identical(d.outcomes(OTHER, ops_b))
    assert b is not None and b.tolist() == [WORLD] * 4  # the forged 10**6 went nowhere
    assert op_a == 0


def test_a_timeout_names_the_missing_rank() -> None:
    d = deploy(7)
    present = {
        r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=np.ones(6, np.int32))
        for r in range(WORLD)
        if r != 5
    }
    results = d.collective(GROUP, present, duration=30)
    assert set(results) == set(present)
    for outcome in results.values():
        assert isinstance(outcome, OperationFailed)
        error = outcome.error
        assert isinstance(error, OperationError)
        assert error.code is ErrorCode.TIMEOUT and error.missing_ranks == frozenset({5})
        assert "missing ranks {5}" in str(error) and GROUP.hex() in str(error)
    assert d.cluster.now < PARAMS.operation_timeout_ms / 1000 * 2  # the tree's Abort beat the local deadlines


def test_a_dropped_contribution_is_blamed_on_its_rank() -> None:
    def lose_rank_three(src: str, dst: str, message: Message) -> int:
        return 0 if src == "g-ep3" and isinstance(message, Contribution) and message.chunk_index == 1 else 1

    d = deploy(8, faults=lose_rank_three)
    results = d.collective(
        GROUP,
        {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=np.ones(12, np.int32)) for r in range(WORLD)},
    )
    for outcome in results.values():
        assert isinstance(outcome, OperationFailed) and isinstance(outcome.error, OperationError)
        assert outcome.error.code is ErrorCode.TIMEOUT and outcome.error.missing_ranks == frozenset({3})


class LoseFirst:
    """Drops the first copy of each message ``matches`` selects, and nothing else."""

    def __init__(self, matches: Callable[[str, str, Message], bool]) -> None:
        self.matches = matches
        self.seen: set[tuple[str, str, bytes]] = set()
        self.dropped = 0

    def __call__(self, src: str, dst: str, message: Message) -> int:
        key = (src, dst, encode_message(message))
        if not self.matches(src, dst, message) or key in self.seen:
            return 1
        self.seen.add(key)
        self.dropped += 1
        return 0


@pytest.mark.parametrize("what", ["contribution", "partial aggregate"])
def test_a_lost_chunk_is_asked_for_again_and_the_operation_completes(what: str) -> None:
    """At half the timeout an aggregator asks the children it misses to send again;
    identical copies make it whole, and what did arrive is not counted twice.  (A
    chunk lost by every child of a slot opens no slot, so nothing asks for it: that
    operation times out; QUIC streams do not lose messages, so only a faulty
    aggregator can do that.)"""
    leaf: list[str] = []

    def matches(src: str, dst: str, message: Message) -> bool:
        if what == "contribution":
            return src == "g-ep2" and isinstance(message, Contribution) and message.chunk_index == 1
        return src in leaf and isinstance(message, PartialAggregate) and message.chunk_index == 0

    lose = LoseFirst(matches)
    d = deploy(16, faults=lose)
    leaf.append(next(a for a in d.aggregators if d.aggregator(a).group_parent(GROUP) is not None))
    data = inputs(DType.INT32, 12, 16)
    run_and_check(d, Collective.ALL_REDUCE, ReduceOp.SUM, DType.INT32, data)
    assert lose.dropped == 1
    assert d.cluster.now == pytest.approx(PARAMS.operation_timeout_ms / 2000)  # recovered at half the timeout


def test_aggregator_memory_is_bounded_by_window_times_chunk() -> None:
    """4 Mi int32 elements per rank in chunks of 16 Ki: each aggregator holds at most
    ``window`` chunk aggregates, never the tensor."""
    params = GroupParams(
        chunk_elements=16384, window=4, heartbeat_interval_ms=1000, operation_timeout_ms=60_000
    )
    world = 4
    d = build_cluster(
        [GroupSpec(GROUP, world)], aggregators=3, params=params, max_fan_in=2, seed=1, reencode=False
    )
    n = 4 << 20
    rng = np.random.default_rng(0)
    data = {r: rng.integers(-(1 << 27), 1 << 27, n).astype(np.int32) for r in range(world)}
    results = d.collective(
        GROUP,
        {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=data[r]) for r in range(world)},
        duration=600,
    )
    result = identical(results)
    assert result is not None
    assert np.array_equal(result, sum(data[r].astype(np.int64) for r in range(world)).astype(np.int32))
    bound = params.window * params.chunk_elements * 8  # eight bytes is the widest element
    peaks = {a: d.aggregator(a).peak_slot_bytes for a in d.aggregators}
    print(f"\npeak slot bytes per aggregator for a {4 * n} byte tensor: {peaks} (bound {bound})")
    assert all(0 < peak <= bound for peak in peaks.values())
    assert all(d.aggregator(a).slot_bytes == 0 for a in d.aggregators)


def test_a_lost_result_is_asked_for_again_and_sent_from_the_aggregators_copy() -> None:
    """A Result that never reaches one endpoint (lost with a connection): at half its
    timeout the endpoint sends its chunk again, and its aggregator, recognising a copy
    of a completed chunk, sends that rank the Result it kept.  Nothing is counted twice."""
    dropped: list[str] = []

    def lose_one_result(src: str, dst: str, message: Message) -> int:
        if isinstance(message, Result) and dst == "g-ep3" and not dropped:
            dropped.append(src)
            return 0
        return 1

    d = deploy(31, faults=lose_one_result)
    data = inputs(DType.INT32, 6, 31)
    results = d.collective(
        GROUP, {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=data[r]) for r in range(WORLD)}
    )
    assert dropped, "a Result was lost"
    result = identical(results)
    assert result is not None and result.tolist() == np.sum([data[r] for r in range(WORLD)], axis=0).tolist()
    assert d.cluster.now >= PARAMS.operation_timeout_ms / 2000  # recovered at half the timeout


@pytest.mark.parametrize(
    "odd", [{"array": np.zeros(8, np.int32)}, {"array": np.zeros(16, np.int16)}, {"op": ReduceOp.MAX}]
)
def test_mismatched_calls_fail_on_every_rank_at_once_with_the_reason(odd: dict[str, object]) -> None:
    """Rank 0 calls with another length, dtype or op than the others: every rank fails
    with OPERATION_MISMATCH well before the timeout, the aggregator naming the child."""
    d = deploy(32)
    usual = {"kind": Collective.ALL_REDUCE, "array": np.zeros(16, np.int32)}
    requests = {r: CollectiveRequest(**{**usual, **(odd if r == 0 else {})}) for r in range(WORLD)}  # type: ignore[arg-type]
    results = d.collective(GROUP, requests)
    assert len(results) == WORLD
    for outcome in results.values():
        assert isinstance(outcome, OperationFailed) and outcome.error.code is ErrorCode.OPERATION_MISMATCH
        assert "called different operations (chunks differ in" in str(outcome.error)
        assert re.search(r"ranks \{[0-7, ]+\} \(via g-ep\d\) and ranks \{[0-7, ]+\}", str(outcome.error))
    assert d.cluster.now < PARAMS.operation_timeout_ms / 2000


def test_losing_an_endpoint_fails_in_flight_operations_then_the_rest_continue() -> None:
    d = deploy(9)
    requests = {
        r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=np.ones(40, np.int32))
        for r in range(WORLD)
        if r != 6
    }
    op_ids = d.start(GROUP, requests)
    d.cluster.kill("g-ep6")
    d.cluster.run(lambda: len(d.outcomes(GROUP, op_ids)) == len(op_ids))
    for outcome in d.outcomes(GROUP, op_ids).values():
        assert isinstance(outcome, OperationFailed) and isinstance(outcome.error, OperationError)
        assert outcome.error.code is ErrorCode.PEER_LOST and outcome.error.missing_ranks == frozenset({6})
    live = [r for r in range(WORLD) if r != 6]
    d.cluster.run(lambda: all(d.endpoint(GROUP, r).state is SessionState.READY for r in live))
    assert all(d.endpoint(GROUP, r).members == frozenset(live) for r in live)
    # strict membership: the survivors refuse to reduce over fewer ranks, naming rank 6 ...
    refused = d.collective(GROUP, {r: CollectiveRequest(kind=Collective.BARRIER) for r in live})
    for outcome in refused.values():
        assert isinstance(outcome, OperationFailed) and outcome.error.code is ErrorCode.PEER_LOST
        assert outcome.error.missing_ranks == frozenset({6}) and "ranks {6} left" in str(outcome.error)
    # ... until the application accepts the new membership
    assert all(d.endpoint(GROUP, r).accept_membership() == frozenset(live) for r in live)
    data = {r: np.full(3, 7 * r, np.int32) for r in live}
    results = d.collective(
        GROUP,
        {r: CollectiveRequest(kind=Collective.ALL_REDUCE, op=ReduceOp.AVG, array=data[r]) for r in live},
    )
    result = identical(results)
    assert result is not None and result.tolist() == [round(Fraction(7 * sum(live), len(live)))] * 3


def test_a_failure_storm_in_a_three_level_tree_still_gives_every_rank_the_exact_result() -> None:
    """64 endpoints under three levels of aggregators (fan-in 4), a tenth of the tree's
    aggregators killed while an all-reduce is in flight: the tree is re-planned (one
    epoch per loss), the operation starts again there, and every endpoint gets the
    same exact result (benchmarks/bench_failure_storm.py runs it with 1024)."""
    world = 64
    params = dataclasses.replace(PARAMS, chunk_elements=16, operation_timeout_ms=20_000)
    d = build_cluster([GroupSpec(GROUP, world)], aggregators=30, params=params, max_fan_in=4, seed=33)
    tree = [a for a in d.aggregators if d.aggregator(a).group_epoch(GROUP) is not None]
    assert len(tree) == 16 + 4 + 1, "three levels: 16 leaves, 4 middle, a root"
    data = {r: np.full(40, r - 20, np.int32) for r in range(world)}
    op_ids = d.start(
        GROUP, {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=data[r]) for r in range(world)}
    )
    for _ in range(world):
        d.cluster.step()
    for victim in tree[::10]:  # 3 of the 21
        d.cluster.kill(victim)
    d.cluster.run(lambda: len(d.outcomes(GROUP, op_ids)) == world, duration=60.0)
    result = identical(d.outcomes(GROUP, op_ids))
    assert result is not None and result.tolist() == [sum(r - 20 for r in range(world))] * 40
    assert d.endpoint(GROUP, 0).epoch > 1


def test_losing_the_only_aggregator_fails_operations_with_no_aggregator_until_one_returns() -> None:
    d = build_cluster([GroupSpec(GROUP, 4)], aggregators=1, params=PARAMS, max_fan_in=4, seed=34)
    requests = {
        r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=np.ones(40, np.int32)) for r in range(4)
    }
    op_ids = d.start(GROUP, requests)
    d.cluster.step()
    d.cluster.kill(d.aggregators[0])
    d.cluster.run(lambda: len(d.outcomes(GROUP, op_ids)) == 4)
    later = d.start(GROUP, requests)  # refused at once, not after a timeout
    for outcome in [*d.outcomes(GROUP, op_ids).values(), *d.outcomes(GROUP, later).values()]:
        assert isinstance(outcome, OperationFailed) and outcome.error.code is ErrorCode.NO_AGGREGATOR
        assert "no aggregator can serve the group" in str(outcome.error)
    assert len(d.outcomes(GROUP, later)) == 4 and d.cluster.now < PARAMS.operation_timeout_ms / 1000


def test_fallback_to_end_hosts_and_back_to_dedicated_aggregators() -> None:
    """Aggregators registered with the fallback label (run by end hosts) are planned
    only when the dedicated ones cannot hold the group: losing the only dedicated
    aggregator moves the group onto them, and it moves back as soon as a dedicated
    aggregator registers.  Every all-reduce is exact."""

    def config(node_id: str) -> AggregatorConfig:
        labels = () if node_id == "agg0" else (FALLBACK_LABEL,)
        return AggregatorConfig(address=sim_address(node_id), max_fan_in=4, labels=labels)

    d = build_cluster(
        [GroupSpec(GROUP, 4)], aggregators=3, params=PARAMS, max_fan_in=4, seed=35, aggregator_config=config
    )
    data = {r: np.full(5, r + 1, np.int32) for r in range(4)}
    requests = {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=data[r]) for r in range(4)}

    def tree() -> set[str]:
        return {a for a in d.aggregators if d.aggregator(a).group_epoch(GROUP) == d.endpoint(GROUP, 0).epoch}

    def exact() -> None:
        result = identical(d.collective(GROUP, requests))
        assert result is not None and result.tolist() == [10] * 5

    def settled() -> bool:
        return all(d.endpoint(GROUP, r).state is SessionState.READY for r in range(4))

    exact()
    assert (
        d.aggregator("agg0").group_parent(GROUP) is None and d.aggregator("agg1").group_epoch(GROUP) is None
    )
    d.cluster.kill("agg0")
    d.cluster.run(lambda: settled() and d.endpoint(GROUP, 0).epoch == 2)
    exact()  # on the end hosts' aggregators
    assert d.aggregator("agg1").group_epoch(GROUP) == 2 or d.aggregator("agg2").group_epoch(GROUP) == 2
    agg3 = AggregatorMachine(AggregatorConfig(address=sim_address("agg3"), max_fan_in=4))
    d.cluster.add("agg3", Role.AGGREGATOR, agg3, sim_address("agg3"))
    d.cluster.connect("agg3", "rendezvous")
    d.cluster.run(lambda: settled() and d.endpoint(GROUP, 0).epoch == 3)
    assert agg3.group_epoch(GROUP) == 3 and agg3.group_parent(GROUP) is None
    exact()  # back on a dedicated aggregator


def test_a_rank_that_lost_a_result_with_the_tree_gets_it_in_the_next_tree() -> None:
    """The tree dies after one rank got its Result and before the other did: the
    second rank starts the operation again in the new epoch, the new aggregator asks
    the first for its part (at half the timeout), and the first seals its kept chunk
    again under the new epoch.  Both end with the same exact result."""

    def lose_results_to_rank_1(src: str, dst: str, message: Message) -> int:
        return 0 if isinstance(message, Result) and dst == "g-ep1" and message.epoch == 1 else 1

    d = build_cluster(
        [GroupSpec(GROUP, 2)],
        aggregators=2,
        params=PARAMS,
        max_fan_in=4,
        seed=36,
        faults=lose_results_to_rank_1,
    )
    data = {r: np.arange(4, dtype=np.int32) * (r + 1) for r in range(2)}
    op_ids = d.start(
        GROUP, {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=data[r]) for r in range(2)}
    )
    d.cluster.run(lambda: 0 in d.outcomes(GROUP, op_ids))
    assert list(d.outcomes(GROUP, op_ids)) == [0], "rank 0 has its result, rank 1 not"
    (tree,) = [a for a in d.aggregators if d.aggregator(a).group_epoch(GROUP) == 1]
    d.cluster.kill(tree)
    d.cluster.run(lambda: len(d.outcomes(GROUP, op_ids)) == 2)
    result = identical(d.outcomes(GROUP, op_ids))
    assert result is not None and result.tolist() == [0, 3, 6, 9]
    assert d.endpoint(GROUP, 1).epoch == 2


def test_losing_an_aggregator_replans_the_tree() -> None:
    params = dataclasses.replace(PARAMS, heartbeat_interval_ms=100)
    d = build_cluster([GroupSpec(GROUP, WORLD)], aggregators=3, params=params, max_fan_in=5, seed=10)
    leaf = next(a for a in d.aggregators if d.aggregator(a).group_parent(GROUP) is not None)
    d.cluster.kill(leaf)
    d.cluster.run(
        lambda: all(
            d.endpoint(GROUP, r).state is SessionState.READY and d.endpoint(GROUP, r).epoch > 1
            for r in range(WORLD)
        ),
        duration=10,
    )
    data = inputs(DType.INT32, 11, 10)
    run_and_check(d, Collective.ALL_REDUCE, ReduceOp.SUM, DType.INT32, data)


def test_a_member_leaving_starts_a_new_epoch() -> None:
    d = deploy(13)
    d.cluster.call("g-ep7", lambda now: d.endpoint(GROUP, 7).leave(now))
    live = list(range(7))
    d.cluster.run(
        lambda: all(
            d.endpoint(GROUP, r).members == frozenset(live)
            and d.endpoint(GROUP, r).state is SessionState.READY
            for r in live
        )
    )
    data = {r: np.full(2, r, np.int32) for r in live}
    requests = {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=data[r]) for r in live}
    for outcome in d.collective(GROUP, requests).values():  # never silently over seven ranks
        assert isinstance(outcome, OperationFailed) and outcome.error.missing_ranks == frozenset({7})
    for r in live:
        d.endpoint(GROUP, r).accept_membership()
    result = identical(d.collective(GROUP, requests))
    assert result is not None and result.tolist() == [sum(live)] * 2


def tree_levels(d: Deployment) -> int:
    """How many levels of aggregators the group's tree has."""
    parents = {a: d.aggregator(a).group_parent(GROUP) for a in d.aggregators}
    in_tree = [a for a in d.aggregators if d.aggregator(a).group_epoch(GROUP) is not None]

    def depth(node: str) -> int:
        parent = parents[node]
        return 1 if parent is None else 1 + depth(parent)

    return max(depth(a) for a in in_tree)


@pytest.mark.parametrize(
    ("levels", "seed"), [(2, seed) for seed in range(32)] + [(3, seed) for seed in range(8)]
)
def test_a_rank_leaving_right_after_its_last_collective_fails_no_other_rank(levels: int, seed: int) -> None:
    """A rank leaves on purpose (Leave, NO_ERROR) as soon as it has its result: every
    other rank still gets the exact result of that collective, in a tree of leaf and
    spine aggregators, whatever the order of arrival.  The leaver's result means the
    root had every contribution and sent every Result down; the EpochChange may reach
    an aggregator before the Results do, and the new tree may move a rank or an
    aggregator to another parent: the older tree's parent connections stay open and
    carry those Results down (some arrival orders of these seeds lost them before)."""
    world, aggregators = (8, 3) if levels == 2 else (20, 8)
    d = build_cluster(
        [GroupSpec(GROUP, world)], aggregators=aggregators, params=PARAMS, max_fan_in=4, seed=seed
    )
    assert tree_levels(d) == levels
    data = {r: np.full(12, r + 1, np.int32) for r in range(world)}  # three chunks, all in the window
    op_ids = d.start(
        GROUP, {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=data[r]) for r in range(world)}
    )
    leaver = seed % world
    leaver_node = d.cluster.nodes[d.groups[GROUP].endpoint_id(leaver)]
    assert d.cluster.run(lambda: leaver_node.finished(op_ids[leaver]))
    assert op_ids[leaver] in leaver_node.completed
    d.cluster.call(leaver_node.node_id, lambda now: d.endpoint(GROUP, leaver).leave(now))
    others = {r: op_ids[r] for r in range(world) if r != leaver}
    d.cluster.run(lambda: len(d.outcomes(GROUP, others)) == len(others))
    result = identical(d.outcomes(GROUP, others))
    assert result is not None and result.tolist() == [sum(range(1, world + 1))] * 12


def test_non_blocking_operations_complete_in_call_order() -> None:
    d = deploy(14)
    data = inputs(DType.FLOAT32, 40, 14)  # above exact.MAX_ELEMENTS: block-scaled
    first = d.start(
        GROUP, {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=data[r]) for r in range(WORLD)}
    )
    second = d.start(
        GROUP, {r: CollectiveRequest(kind=Collective.BROADCAST, array=data[r], root=2) for r in range(WORLD)}
    )
    third = d.start(
        GROUP, {r: CollectiveRequest(kind=Collective.ALL_GATHER, array=data[r]) for r in range(WORLD)}
    )
    # a block-scaled SUM is two wire operations (its scale pass first): the caller sees the second op_id
    assert set(first.values()) == {1} and set(second.values()) == {2} and set(third.values()) == {3}
    d.cluster.run(lambda: all(len(d.outcomes(GROUP, ops)) == WORLD for ops in (first, second, third)))
    reduced = identical(d.outcomes(GROUP, first))
    assert reduced is not None
    arrays = [data[r] for r in range(WORLD)]
    exact = reduce_reference(arrays, ReduceOp.SUM, DType.FLOAT32)
    tolerance = float_tolerance(arrays, exact, DType.FLOAT32, ReduceOp.SUM)
    assert_reduction(reduced, exact, DType.FLOAT32, ReduceOp.SUM, tolerance)
    assert identical(d.outcomes(GROUP, second)).tobytes() == data[2].tobytes()  # type: ignore[union-attr]
    assert (
        identical(d.outcomes(GROUP, third)).tobytes() == np.stack([data[r] for r in range(WORLD)]).tobytes()
    )  # type: ignore[union-attr]


def test_broadcast_receivers_may_start_after_the_root_finished() -> None:
    d = deploy(15)
    data = np.arange(30, dtype=np.float64) * np.pi
    root_op = d.start(GROUP, {4: CollectiveRequest(kind=Collective.BROADCAST, array=data, root=4)})
    d.cluster.run(lambda: len(d.outcomes(GROUP, root_op)) == 1)
    late = {
        r: CollectiveRequest(kind=Collective.BROADCAST, array=np.zeros(30), root=4)
        for r in range(WORLD)
        if r != 4
    }
    results = d.collective(GROUP, late)
    assert identical(results).tobytes() == data.tobytes()  # type: ignore[union-attr]


# --- the draft shows the diagrams the code runs ---------------------------------------------

FIGURES = {
    "aggregator": "fig-agg-node",
    "aggregator group": "fig-agg-group",
    "aggregator slot": "fig-agg-slot",
    "endpoint session": "fig-ep-session",
    "endpoint rendezvous link": "fig-ep-link",
    "endpoint operation": "fig-ep-operation",
}
"""Each transition table of the data path, and the figure of the draft that shows it."""


def render(xml: str) -> str:
    """``xml`` with every figure of :data:`FIGURES` holding its table's current diagram."""
    tables = {table.name: table for table in (*aggregator_states.TABLES, *endpoint_states.TABLES)}
    assert set(tables) == set(FIGURES), "every table has a figure"
    for name, anchor in FIGURES.items():
        pattern = re.compile(
            rf'(<figure anchor="{anchor}">.*?<artwork[^>]*><!\[CDATA\[\n)(.*?)(\n\]\]></artwork>)', re.S
        )
        xml, count = pattern.subn(lambda m, t=tables[name]: m.group(1) + t.to_ascii() + m.group(3), xml)
        assert count == 1, f"figure {anchor} is missing from {SPEC.name}"
    return xml


def test_collectives_section_shows_the_generated_state_diagrams() -> None:
    text = SPEC.read_text()
    assert render(text) == text, (
        f"regenerate the figures: python {Path(__file__).relative_to(SPEC.parents[2])}"
    )


if __name__ == "__main__":  # rewrites the figures from the tables
    SPEC.write_text(render(SPEC.read_text()))
