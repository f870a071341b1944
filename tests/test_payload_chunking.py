"""Chunking: tensors of any size as independently tagged chunks, reassembled in any order."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cco.wire.chunking import Reassembler, wire_chunks
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Result, chunk_count
from cco.wire.payload import (
    ChunkHeader,
    combine,
    decode_values,
    default_scale,
    derive_group_keys,
    encode_values,
    open_verified,
    seal,
    wire_length,
)
from cco.wire.registries import Collective, DType, ReduceOp

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEYS = derive_group_keys(b"\x05" * 32, b"\x06" * 16)
NUMPY = {
    DType.INT8: np.int8,
    DType.INT16: np.int16,
    DType.INT32: np.int32,
    DType.INT64: np.int64,
    DType.FLOAT16: np.float16,
    DType.BFLOAT16: np.float32,
    DType.FLOAT32: np.float32,
    DType.FLOAT64: np.float64,
}


def tensor(dtype: DType, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if np.issubdtype(NUMPY[dtype], np.integer):
        return rng.integers(-20, 20, size=shape).astype(NUMPY[dtype])  # sums of 6 still fit int8
    return rng.uniform(-4, 4, size=shape).astype(NUMPY[dtype])


@SETTINGS
@given(
    dtype=st.sampled_from(list(DType)),
    kind=st.sampled_from([Collective.ALL_REDUCE, Collective.BROADCAST]),
    shape=st.lists(st.integers(0, 6), min_size=0, max_size=3).map(tuple),
    chunk=st.integers(1, 50),
    seed=st.integers(0, 2**32 - 1),
)
def test_lazy_chunks_concatenate_to_the_whole_encoding(
    dtype: DType, kind: Collective, shape: tuple[int, ...], chunk: int, seed: int
) -> None:
    x = tensor(dtype, shape, np.random.default_rng(seed))
    scale = default_scale(dtype, 4) if kind is Collective.ALL_REDUCE else 0
    chunks = list(wire_chunks(x, dtype, kind, scale, 4, chunk))
    whole = encode_values(x, dtype, kind, scale, 4)
    assert len(chunks) == chunk_count(len(whole), chunk)
    assert all(len(c) <= chunk for c in chunks)
    assert np.concatenate(chunks).tolist() == whole.tolist()


@SETTINGS
@given(
    dtype=st.sampled_from(list(DType)),
    kind=st.sampled_from([Collective.ALL_REDUCE, Collective.BROADCAST, Collective.ALL_GATHER]),
    shape=st.lists(st.integers(1, 7), min_size=1, max_size=3).map(tuple),
    chunk=st.integers(1, 40),
    world=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
    order=st.randoms(use_true_random=False),
)
def test_end_to_end_chunked_operation(
    dtype: DType,
    kind: Collective,
    shape: tuple[int, ...],
    chunk: int,
    world: int,
    seed: int,
    order: random.Random,
) -> None:
    """Seal every chunk of every rank, combine, verify, and reassemble in a random order."""
    rng = np.random.default_rng(seed)
    root = world - 1
    if kind is Collective.BROADCAST:
        inputs = {root: tensor(dtype, shape, rng)}
    elif kind is Collective.ALL_GATHER:
        piece = tensor(dtype, shape, rng)
        inputs = {r: piece if r == 0 else np.zeros_like(piece) for r in range(world)}
    else:
        inputs = {r: tensor(dtype, shape, rng) for r in range(world)}
    scale = default_scale(dtype, world) if kind is Collective.ALL_REDUCE else 0
    streams = {r: wire_chunks(x, dtype, kind, scale, world, chunk) for r, x in inputs.items()}
    total = wire_length(dtype, kind, int(np.prod(shape)))
    receiver = Reassembler(dtype, kind, ReduceOp.SUM, scale, shape, chunk)
    assert receiver.total_elements == total
    results = []
    for index in range(chunk_count(total, chunk)):
        make = ChunkHeader(
            group_id=b"\x06" * 16,
            epoch=2,
            op_id=4,
            kind=kind,
            op=ReduceOp.SUM,
            dtype=dtype,
            scale=scale,
            total_elements=total,
            chunk_elements=chunk,
            chunk_index=index,
            root=root if kind is Collective.BROADCAST else None,
        )
        parts = [seal(KEYS, make, r, next(stream)) for r, stream in streams.items()]
        results.append(combine(parts, Result))
    order.shuffle(results)
    for message in results:
        values = open_verified(KEYS, message, frozenset(inputs))
        receiver.add(message.chunk_index, values, len(inputs))
    out = receiver.result()
    assert out.shape == shape
    whole = np.sum([encode_values(x, dtype, kind, scale, world) for x in inputs.values()], axis=0)
    expected = decode_values(whole, dtype, kind, ReduceOp.SUM, scale, len(inputs)).reshape(shape)
    assert out.tobytes() == expected.tobytes()


def test_reassembler_ignores_a_repeat_and_refuses_a_different_duplicate() -> None:
    receiver = Reassembler(DType.FLOAT64, Collective.BROADCAST, ReduceOp.SUM, 0, (3,), 3)
    assert receiver.total_elements == 6  # two halves per float64
    x = np.array([1.5, -2.0, np.nan])
    wire = encode_values(x, DType.FLOAT64, Collective.BROADCAST, 0, 1)
    receiver.add(1, wire[3:], 1)  # a chunk boundary that splits an element into its halves
    assert receiver.missing() == [0]
    with pytest.raises(CcoError) as caught:
        receiver.result()
    assert caught.value.code is ErrorCode.PROTOCOL_VIOLATION
    receiver.add(0, wire[:3], 1)
    receiver.add(0, wire[:3], 1)
    assert receiver.complete
    assert receiver.result().tobytes() == x.tobytes()
    with pytest.raises(CcoError) as caught:
        receiver.add(1, wire[:3], 1)
    assert caught.value.code is ErrorCode.DUPLICATE_CONTRIBUTION


def test_reassembler_refuses_wrong_index_or_length() -> None:
    receiver = Reassembler(DType.INT32, Collective.ALL_REDUCE, ReduceOp.SUM, 0, (10,), 4)
    for index, values in ((3, np.zeros(2, dtype=np.int64)), (2, np.zeros(3, dtype=np.int64))):
        with pytest.raises(CcoError) as caught:
            receiver.add(index, values, 1)
        assert caught.value.code is ErrorCode.INVALID_FIELD
    receiver.add(2, np.zeros(2, dtype=np.int64), 1)


def test_chunks_are_encoded_lazily() -> None:
    """Memory depends on the chunk size: a chunk is only encoded when asked for."""
    x = np.array([1.0, 2.0, np.inf, 4.0], dtype=np.float32)
    stream = wire_chunks(x, DType.FLOAT32, Collective.ALL_REDUCE, 4, 2, 2)
    assert next(stream).tolist() == [16, 32]  # the infinity in chunk 1 is not looked at yet
    with pytest.raises(CcoError) as caught:
        next(stream)
    assert caught.value.code is ErrorCode.OVERFLOW


def test_an_empty_tensor_is_one_empty_chunk() -> None:
    x = np.zeros(0, dtype=np.int32)
    (only,) = list(wire_chunks(x, DType.INT32, Collective.ALL_REDUCE, 0, 3, 8))
    assert len(only) == 0
    make = ChunkHeader(
        group_id=b"\x06" * 16,
        epoch=2,
        op_id=5,
        kind=Collective.BARRIER,
        op=ReduceOp.SUM,
        dtype=DType.INT8,
        scale=0,
        total_elements=0,
        chunk_elements=1,
        chunk_index=0,
    )
    parts = [seal(KEYS, make, r, only.astype(np.int64)) for r in range(3)]
    result = combine(parts, Result)
    assert result.width == 1 and result.payload == b"" and result.tag is not None
    assert open_verified(KEYS, result, frozenset(range(3))).tolist() == []
