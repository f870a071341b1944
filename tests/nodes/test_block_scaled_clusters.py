"""Block-scaled float reductions through whole in-memory clusters (issue 7).

* Accuracy: inputs that look like gradients, in every float dtype and width: every
  element within the draft's bound of the exact sum, bit-identical on every rank,
  and the same bits whatever the arrival order and the tree's shape.
* The scale agreement is part of the security argument: an aggregator that lowers
  or raises an agreed scale, or gives children different scales, is detected by
  every endpoint (a typed error), and no endpoint returns degraded data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
import reference

from cco.nodes.aggregator import AggregatorMachine
from cco.nodes.calls import CollectiveRequest
from cco.nodes.events import Command, Input, OperationCompleted, OperationFailed, SendMessage
from cco.nodes.sim import Deployment, GroupSpec, build_cluster
from cco.wire.dtypes import ELEMENT_TYPES, round_to_bfloat16
from cco.wire.errors import ErrorCode
from cco.wire.messages import GroupParams, Result
from cco.wire.packing import extremes, minimal_width, narrow, unpack
from cco.wire.registries import Collective, DType, ReduceOp

pytestmark = pytest.mark.both_kernels

GROUP = bytes.fromhex("b5" * 16)
WORLD = 8
PARAMS = GroupParams(
    chunk_elements=64, window=4, heartbeat_interval_ms=1000, operation_timeout_ms=2000, block_elements=16
)
SHAPES = ((1, 8), (3, 4), (7, 2))
"""(aggregators, max_fan_in): one level, two levels, three levels."""
SIGNIFICAND = {DType.FLOAT16: 11, DType.BFLOAT16: 8, DType.FLOAT32: 24, DType.FLOAT64: 53}


def deploy(seed: int, shape: tuple[int, int], **kw: object) -> Deployment:
    aggregators, fan_in = shape
    return build_cluster(
        [GroupSpec(GROUP, WORLD)],
        aggregators=aggregators,
        params=PARAMS,
        max_fan_in=fan_in,
        seed=seed,
        **kw,  # type: ignore[arg-type]
    )


# --- gradient-like inputs -------------------------------------------------------------


def _normal(rng: np.random.Generator, n: int, top: float) -> np.ndarray:
    return rng.normal(0.0, min(1e-3, top), n)


def _heavy_tailed(rng: np.random.Generator, n: int, top: float) -> np.ndarray:
    values = rng.standard_t(1.5, n) * 1e-2
    outliers = rng.choice(n, 3, replace=False)
    values[outliers] = rng.choice([-1.0, 1.0], 3) * min(1e30, top)  # outliers up to 1e30
    return np.clip(values, -top, top)


def _mixed(rng: np.random.Generator, n: int, top: float) -> np.ndarray:
    return rng.choice([-1.0, 1.0], n) * np.minimum(10.0 ** rng.uniform(-8, 3, n), top)


def _zeros(rng: np.random.Generator, n: int, top: float) -> np.ndarray:
    return np.zeros(n)


def _subnormal(rng: np.random.Generator, n: int, top: float) -> np.ndarray:
    return rng.integers(-50, 50, n) * 1.0  # scaled to the dtype's subnormal spacing below


DISTRIBUTIONS: dict[str, Callable[[np.random.Generator, int, float], np.ndarray]] = {
    "normal": _normal,
    "heavy-tailed": _heavy_tailed,
    "mixed": _mixed,
    "zeros": _zeros,
    "subnormal": _subnormal,
}


def gradients(kind: str, dtype: DType, n: int, seed: int) -> dict[int, np.ndarray]:
    """Per-rank inputs of distribution ``kind`` whose sum over WORLD ranks fits ``dtype``."""
    rng = np.random.default_rng(seed)
    element = ELEMENT_TYPES[dtype]
    top = element.max_finite / (2 * WORLD)
    out = {}
    for rank in range(WORLD):
        values = DISTRIBUTIONS[kind](rng, n, top)
        if kind == "subnormal":
            values = values * reference.SMALLEST_SUBNORMAL[SIGNIFICAND[dtype]]
        array = values.astype(element.storage)
        out[rank] = round_to_bfloat16(array) if dtype is DType.BFLOAT16 else array
    return out


def exact_sum(arrays: list[np.ndarray], op: ReduceOp) -> np.ndarray:
    """The exact SUM or AVG of every element, with rationals, as the nearest binary64."""
    columns = zip(*[a.tolist() for a in arrays], strict=True)
    total = [sum((Fraction(v) for v in column), Fraction(0)) for column in columns]
    if op is ReduceOp.AVG:
        total = [t / len(arrays) for t in total]
    return np.array([float(t) for t in total])


def run(d: Deployment, data: dict[int, np.ndarray], dtype: DType, op: ReduceOp, width: int | None) -> bytes:
    """One all-reduce on every rank; the result's bytes, checked identical on every rank."""
    requests = {
        r: CollectiveRequest(kind=Collective.ALL_REDUCE, op=op, array=data[r], dtype=dtype, width=width)
        for r in range(WORLD)
    }
    results = d.collective(GROUP, requests)
    assert len(results) == WORLD
    outcomes = [results[r] for r in range(WORLD)]
    for outcome in outcomes:
        assert isinstance(outcome, OperationCompleted), outcome
        assert outcome.result is not None and outcome.result.dtype == ELEMENT_TYPES[dtype].storage
    first = outcomes[0]
    assert isinstance(first, OperationCompleted) and first.result is not None
    for outcome in outcomes[1:]:
        assert isinstance(outcome, OperationCompleted) and outcome.result is not None
        assert outcome.result.tobytes() == first.result.tobytes()
    return first.result.tobytes()


CASES = [
    (kind, dtype, None)
    for kind in DISTRIBUTIONS
    for dtype in (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64)
] + [(kind, DType.FLOAT32, width) for kind in ("normal", "heavy-tailed", "mixed") for width in (8, 16, 64)]


@pytest.mark.parametrize(("kind", "dtype", "width"), CASES)
def test_gradient_like_sums_are_within_the_bound_and_bit_identical_across_trees(
    kind: str, dtype: DType, width: int | None
) -> None:
    n = 150  # three chunks of up to 64, blocks of 16 (the last one short)
    seed = hash((kind, dtype, width)) % 10_000
    data = gradients(kind, dtype, n, seed)
    arrays = [data[r] for r in range(WORLD)]
    element = ELEMENT_TYPES[dtype]
    bits = width or element.bits
    for op in (ReduceOp.SUM, ReduceOp.AVG):
        outcomes = {run(deploy(seed + i, shape), data, dtype, op, width) for i, shape in enumerate(SHAPES)}
        assert len(outcomes) == 1, "the same bits whatever the arrival order and the tree's shape"
        result = np.frombuffer(outcomes.pop(), dtype=element.storage).astype(np.float64)
        want = exact_sum(arrays, op)
        divisor = WORLD if op is ReduceOp.AVG else 1
        tolerance = reference.block_scaled_tolerance(
            arrays,
            PARAMS.chunk_elements,
            PARAMS.block_elements,
            bits,
            WORLD,
            SIGNIFICAND[dtype],
            want,
            divisor,
        )
        error = np.abs(result - want)
        assert (error <= tolerance).all(), (op, int(np.argmax(error > tolerance)), error.max())
        if kind == "zeros":
            assert not result.any()


def test_a_finite_input_of_any_magnitude_never_overflows_on_the_wire() -> None:
    """Blocks near float64's largest finite value, of subnormals and of ordinary values,
    side by side in one tensor: each block has its own scale, so each sums as
    accurately as the format allows (the subnormals exactly)."""
    huge = np.full(16, 1e300) * np.arange(1, 17)
    tiny = np.arange(-8, 8) * 5e-324
    ordinary = np.linspace(-1, 1, 16)
    data = {r: np.concatenate([huge, tiny, ordinary]) * (r + 1) for r in range(WORLD)}
    result = np.frombuffer(run(deploy(3, SHAPES[1]), data, DType.FLOAT64, ReduceOp.SUM, None), np.float64)
    want = exact_sum([data[r] for r in range(WORLD)], ReduceOp.SUM)
    np.testing.assert_allclose(result[:16], want[:16], rtol=2**-50, atol=0)
    assert result[16:32].tolist() == want[16:32].tolist()
    np.testing.assert_allclose(result[32:], want[32:], rtol=0, atol=2**-50)


# --- an aggregator that lies about scales ---------------------------------------------


class ScaleTamper:
    """An aggregator that rewrites the agreed scales it sends down (the scale pass's
    Result: an INT16 MIN all-reduce): ``delta`` is added to every scale, for every
    child or (``split``) for one child only.  It acts if ``liar(node_id)`` says so
    once the tree is known."""

    def __init__(
        self, inner: AggregatorMachine, delta: int, split: bool, liar: Callable[[str], bool]
    ) -> None:
        self.inner = inner
        self.delta = delta
        self.split = split
        self.liar = liar
        self.acted = False

    def handle(self, event: Input, now: float) -> list[Command]:
        out = self.inner.handle(event, now)
        changed: list[Command] = []
        for command in out:
            message = command.message if isinstance(command, SendMessage) else None
            if (
                isinstance(message, Result)
                and message.dtype is DType.INT16
                and message.op is ReduceOp.MIN
                and (self.split is False or not self.acted)
                and self.liar(self.inner.node_id or "")
            ):
                scales = unpack(message.payload, message.width).astype(np.int64) + self.delta
                width = minimal_width(*extremes(scales))
                message = dataclasses.replace(message, width=width, payload=narrow(scales, width).tobytes())
                command = SendMessage(command.peer, message)  # type: ignore[union-attr]
                self.acted = True
            changed.append(command)
        return changed

    def next_deadline(self) -> float | None:
        return self.inner.next_deadline()


@pytest.mark.parametrize(
    ("delta", "split"), [(-1, False), (+1, False), (-1, True)], ids=["inflate", "deflate", "split"]
)
@pytest.mark.parametrize("level", ["root", "leaf"])
def test_an_aggregator_that_changes_scales_is_detected_by_every_endpoint(
    delta: int, split: bool, level: str
) -> None:
    """Inflating an exponent (a lower scale: nobody attests it), deflating one (a
    higher scale: above some rank's proposal), or telling children different scales
    (their chunks no longer match): every endpoint fails with a typed error."""
    tampers: dict[str, ScaleTamper] = {}
    liars: list[str] = []

    def liar(node_id: str) -> bool:
        is_root = tampers[node_id].inner.group_parent(GROUP) is None
        if (level == "root") == is_root and not liars:
            liars.append(node_id)  # the first aggregator of the chosen level to send scales
        return liars == [node_id]

    def wrap(node_id: str, machine: AggregatorMachine) -> ScaleTamper:
        tampers[node_id] = ScaleTamper(machine, delta, split, liar)
        return tampers[node_id]

    d = deploy(21, SHAPES[1], wrap=wrap)  # a root above two leaves of four ranks
    data = gradients("mixed", DType.FLOAT32, 100, 21)
    requests = {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=data[r]) for r in range(WORLD)}
    results = d.collective(GROUP, requests)
    assert len(results) == WORLD and [t for t in tampers.values() if t.acted] == [tampers[liars[0]]]
    codes = {ErrorCode.VERIFICATION_FAILED, ErrorCode.OPERATION_MISMATCH}
    for outcome in results.values():
        assert isinstance(outcome, OperationFailed), "no endpoint returns data computed at altered scales"
        assert outcome.error.code in codes, outcome.error
