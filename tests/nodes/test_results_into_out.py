"""Results written to the caller's array (``CollectiveRequest.out``), through whole
in-memory clusters: the same bits as a new array, in ``out`` itself, for every
collective and form; misuse refused at the call with a typed error."""

from __future__ import annotations

import numpy as np
import pytest

from cco.nodes.calls import CollectiveRequest
from cco.nodes.events import Command, OperationCompleted
from cco.nodes.sim import Deployment, GroupSpec, build_cluster
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import GroupParams
from cco.wire.registries import Collective, DType, ReduceOp
from cco.workload import NUMPY_TYPES, make_input

GROUP = bytes.fromhex("0e" * 16)
WORLD = 4
PARAMS = GroupParams(
    chunk_elements=64, window=3, heartbeat_interval_ms=1000, operation_timeout_ms=2000, block_elements=16
)


def deploy() -> Deployment:
    return build_cluster([GroupSpec(GROUP, WORLD)], aggregators=1, params=PARAMS, max_fan_in=WORLD)


def inputs(dtype: type[np.generic], elements: int) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(7)
    if np.issubdtype(dtype, np.integer):
        return {r: rng.integers(-100, 100, elements).astype(dtype) for r in range(WORLD)}
    return {r: (rng.random(elements) * 2 - 1).astype(dtype) for r in range(WORLD)}


def results(outcomes: dict[int, Command]) -> dict[int, np.ndarray | None]:
    assert all(isinstance(o, OperationCompleted) for o in outcomes.values()), outcomes
    return {rank: o.result for rank, o in outcomes.items() if isinstance(o, OperationCompleted)}


def result_shape(kind: Collective, array: np.ndarray) -> tuple[int, ...]:
    if kind is Collective.ALL_GATHER:
        return (WORLD, *array.shape)
    if kind is Collective.REDUCE_SCATTER:
        return (array.size // WORLD,)
    return array.shape


CASES = [
    (Collective.ALL_REDUCE, ReduceOp.SUM, np.float32, 300),  # block-scaled, several chunks
    (Collective.ALL_REDUCE, ReduceOp.AVG, np.float64, 12),  # exact limbs: decoded, then copied
    (Collective.ALL_REDUCE, ReduceOp.MAX, np.float32, 200),
    (Collective.ALL_REDUCE, ReduceOp.SUM, np.int32, 200),
    (Collective.ALL_REDUCE, ReduceOp.SUM, np.int64, 100),  # two wire integers per element
    (Collective.BROADCAST, ReduceOp.SUM, np.float32, 150),
    (Collective.ALL_GATHER, ReduceOp.SUM, np.int16, 100),
    (Collective.REDUCE_SCATTER, ReduceOp.SUM, np.float32, 400),  # a part: copied at the end
]


@pytest.mark.parametrize(("kind", "op", "dtype", "elements"), CASES)
def test_the_result_lands_in_out_with_the_same_bits(
    kind: Collective, op: ReduceOp, dtype: type[np.generic], elements: int
) -> None:
    arrays = {
        rank: a.reshape(-1, 4) if elements % 4 == 0 else a for rank, a in inputs(dtype, elements).items()
    }
    root = WORLD - 1 if kind is Collective.BROADCAST else None
    dep = deploy()
    plain = results(
        dep.collective(
            GROUP, {r: CollectiveRequest(kind=kind, op=op, array=arrays[r], root=root) for r in range(WORLD)}
        )
    )
    outs = {r: np.full(result_shape(kind, arrays[r]), 99, dtype=dtype) for r in range(WORLD)}
    into = results(
        dep.collective(
            GROUP,
            {
                r: CollectiveRequest(kind=kind, op=op, array=arrays[r], root=root, out=outs[r])
                for r in range(WORLD)
            },
        )
    )
    for rank in range(WORLD):
        assert into[rank] is outs[rank]
        expected = plain[rank]
        assert expected is not None
        assert outs[rank].shape == expected.shape and outs[rank].tobytes() == expected.tobytes()


def test_bfloat16_in_float32_arrays_lands_in_a_float32_out() -> None:
    dep = deploy()
    arrays = inputs(np.float32, 200)
    outs = {r: np.empty(200, dtype=np.float32) for r in range(WORLD)}

    def request(rank: int, out: np.ndarray | None) -> CollectiveRequest:
        return CollectiveRequest(
            kind=Collective.ALL_REDUCE, array=arrays[rank], dtype=DType.BFLOAT16, out=out
        )

    plain = results(dep.collective(GROUP, {r: request(r, None) for r in range(WORLD)}))
    into = results(dep.collective(GROUP, {r: request(r, outs[r]) for r in range(WORLD)}))
    for rank in range(WORLD):
        assert into[rank] is outs[rank] and outs[rank].tobytes() == plain[rank].tobytes()  # type: ignore[union-attr]


def test_verified_chunks_decode_straight_into_out() -> None:
    """No copy at the end: out holds the first chunk while later ones are in flight."""
    dep = deploy()
    arrays = inputs(np.float32, 300)  # five chunks of 64
    outs = {r: np.full(300, np.nan, dtype=np.float32) for r in range(WORLD)}
    requests = {
        r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=arrays[r], out=outs[r]) for r in range(WORLD)
    }
    op_ids = dep.start(GROUP, requests)
    assert dep.cluster.run(lambda: not np.isnan(outs[0][:64]).any())
    assert np.isnan(outs[0][-36:]).all() and not dep.outcomes(GROUP, op_ids)
    dep.cluster.run(lambda: len(dep.outcomes(GROUP, op_ids)) == WORLD)
    assert all(o.result is outs[r] for r, o in results_of(dep, op_ids).items())


def results_of(dep: Deployment, op_ids: dict[int, int]) -> dict[int, OperationCompleted]:
    outcomes = dep.outcomes(GROUP, op_ids)
    assert all(isinstance(o, OperationCompleted) for o in outcomes.values()), outcomes
    return {rank: o for rank, o in outcomes.items() if isinstance(o, OperationCompleted)}


def test_one_out_serves_call_after_call() -> None:
    dep = deploy()
    outs = {r: np.empty(256, dtype=np.float32) for r in range(WORLD)}
    for call in range(3):
        arrays = {r: make_input(11, call, r, DType.FLOAT32, 256) for r in range(WORLD)}
        plain = results(
            dep.collective(
                GROUP,
                {r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=arrays[r]) for r in range(WORLD)},
            )
        )
        into = results(
            dep.collective(
                GROUP,
                {
                    r: CollectiveRequest(kind=Collective.ALL_REDUCE, array=arrays[r], out=outs[r])
                    for r in range(WORLD)
                },
            )
        )
        for rank in range(WORLD):
            assert into[rank] is outs[rank] and outs[rank].tobytes() == plain[rank].tobytes()  # type: ignore[union-attr]


def test_a_rank_without_a_result_leaves_out_untouched() -> None:
    dep = deploy()
    arrays = inputs(np.int32, 100)
    outs = {r: np.full(100, -7, dtype=np.int32) for r in range(WORLD)}
    got = results(
        dep.collective(
            GROUP,
            {
                r: CollectiveRequest(kind=Collective.REDUCE, array=arrays[r], root=1, out=outs[r])
                for r in range(WORLD)
            },
        )
    )
    expected = np.sum([a.astype(np.int64) for a in arrays.values()], axis=0)
    assert got[1] is outs[1] and outs[1].tolist() == expected.tolist()
    for rank in (0, 2, 3):
        assert got[rank] is None and (outs[rank] == -7).all()


def _refusals() -> list[tuple[str, CollectiveRequest]]:
    array = np.zeros(100, dtype=np.float32)
    wide = np.zeros(200, dtype=np.float32)
    readonly = np.zeros(100, dtype=np.float32)
    readonly.flags.writeable = False
    return [
        (
            "shape (99,)",
            CollectiveRequest(kind=Collective.ALL_REDUCE, array=array, out=np.zeros(99, dtype=np.float32)),
        ),
        (
            "out is float64",
            CollectiveRequest(kind=Collective.ALL_REDUCE, array=array, out=np.zeros(100, dtype=np.float64)),
        ),
        ("C-contiguous", CollectiveRequest(kind=Collective.ALL_REDUCE, array=array, out=wide[::2])),
        ("writeable", CollectiveRequest(kind=Collective.ALL_REDUCE, array=array, out=readonly)),
        ("shares memory", CollectiveRequest(kind=Collective.ALL_REDUCE, array=array, out=array)),
        ("shares memory", CollectiveRequest(kind=Collective.ALL_REDUCE, array=wide[:100], out=wide[50:150])),
        ("numpy array", CollectiveRequest(kind=Collective.ALL_REDUCE, array=array, out=[0.0] * 100)),  # type: ignore[arg-type]
        ("BARRIER", CollectiveRequest(kind=Collective.BARRIER, out=np.zeros(1, dtype=np.int8))),
        (
            "needs the array",
            CollectiveRequest(kind=Collective.BROADCAST, root=0, dtype=DType.FLOAT32, out=array),
        ),
        (
            "shape",
            CollectiveRequest(kind=Collective.ALL_GATHER, array=array, out=np.zeros(100, dtype=np.float32)),
        ),
    ]


@pytest.mark.parametrize(("why", "request_"), _refusals())
def test_an_out_that_cannot_take_the_result_is_refused_at_the_call(
    why: str, request_: CollectiveRequest
) -> None:
    dep = deploy()
    endpoint = dep.endpoint(GROUP, 1)
    before = endpoint.outstanding
    with pytest.raises(CcoError) as refused:
        endpoint.start(request_, dep.cluster.now)
    assert refused.value.code is ErrorCode.INVALID_FIELD and why in refused.value.detail
    assert endpoint.outstanding == before


@pytest.mark.parametrize(
    "dtype", [DType.INT8, DType.INT16, DType.INT32, DType.INT64, DType.FLOAT16, DType.FLOAT32, DType.FLOAT64]
)
def test_make_input_into_out_draws_the_same_values(dtype: DType) -> None:
    fresh = make_input(3, 5, 2, dtype, 1000)
    out = np.full(1000, 1, dtype=NUMPY_TYPES[dtype])
    assert make_input(3, 5, 2, dtype, 1000, out=out) is out
    assert out.tobytes() == fresh.tobytes()
