"""Chunking: tensors of any size as independently tagged chunks, reassembled in any order.

Block-scaled chunks count their blocks from each chunk's first element; the tensor's
list of scales gives chunk i the blocks from i * ceil(chunk_elements / block_elements).
"""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cco.wire.blockscale import attestations, block_count, dequantize, propose, quantize, sum_limit
from cco.wire.chunking import Reassembler, wire_chunks
from cco.wire.dtypes import element_type
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Result, chunk_count, chunk_length
from cco.wire.ops import Form, form
from cco.wire.payload import (
    ChunkHeader,
    combine,
    decode_values,
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
    x = rng.uniform(-4, 4, size=shape).astype(NUMPY[dtype])
    if dtype is DType.BFLOAT16:  # bfloat16 values: float32 with the low 16 bits clear
        x = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    return x


@SETTINGS
@given(
    dtype=st.sampled_from(list(DType)),
    kind=st.sampled_from([Collective.ALL_REDUCE, Collective.BROADCAST]),
    op=st.sampled_from([ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX]),
    shape=st.lists(st.integers(0, 6), min_size=0, max_size=3).map(tuple),
    chunk=st.integers(1, 50),
    seed=st.integers(0, 2**32 - 1),
)
def test_lazy_chunks_concatenate_to_the_whole_encoding(
    dtype: DType, kind: Collective, op: ReduceOp, shape: tuple[int, ...], chunk: int, seed: int
) -> None:
    x = tensor(dtype, shape, np.random.default_rng(seed))
    if kind is Collective.BROADCAST:
        op = ReduceOp.SUM
    if form(kind, op, dtype) is Form.BLOCK_SCALED:  # needs agreed scales: not this codec's job
        with pytest.raises(CcoError) as caught:
            next(wire_chunks(x, dtype, kind, op, 4, chunk))
        assert caught.value.code is ErrorCode.INTERNAL_ERROR
        return
    chunks = list(wire_chunks(x, dtype, kind, op, 4, chunk))
    whole = encode_values(x, dtype, kind, op, 4)
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
    """Seal every chunk of every rank, combine, verify, and reassemble in a random order
    (integers summed, floats under MAX as ordered keys, bit patterns moved)."""
    rng = np.random.default_rng(seed)
    root = world - 1
    op = ReduceOp.MAX if kind is Collective.ALL_REDUCE and element_type(dtype).is_float else ReduceOp.SUM
    if kind is Collective.BROADCAST:
        inputs = {root: tensor(dtype, shape, rng)}
    elif kind is Collective.ALL_GATHER:
        piece = tensor(dtype, shape, rng)
        inputs = {r: piece if r == 0 else np.zeros_like(piece) for r in range(world)}
    else:
        inputs = {r: tensor(dtype, shape, rng) for r in range(world)}
    streams = {r: wire_chunks(x, dtype, kind, op, world, chunk) for r, x in inputs.items()}
    total = wire_length(dtype, kind, int(np.prod(shape)))
    receiver = Reassembler(dtype, kind, op, shape, chunk)
    assert receiver.total_elements == total
    results = []
    for index in range(chunk_count(total, chunk)):
        make = ChunkHeader(
            group_id=b"\x06" * 16,
            epoch=2,
            op_id=4,
            kind=kind,
            op=op,
            dtype=dtype,
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
    if op is ReduceOp.MAX:  # exact: the largest input, element by element
        expected = np.max(np.stack(list(inputs.values())), axis=0)
    else:
        whole = np.sum([encode_values(x, dtype, kind, op, world) for x in inputs.values()], axis=0)
        expected = decode_values(whole, dtype, kind, op, len(inputs)).reshape(shape)
    assert out.tobytes() == expected.tobytes()


@SETTINGS
@given(
    dtype=st.sampled_from([DType.FLOAT16, DType.FLOAT32, DType.FLOAT64]),
    op=st.sampled_from([ReduceOp.SUM, ReduceOp.AVG]),
    width=st.sampled_from([1, 2, 4, 8]),
    n=st.integers(1, 120),
    chunk=st.integers(1, 50),
    block=st.sampled_from([16, 20, 64]),
    world=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
    order=st.randoms(use_true_random=False),
)
def test_end_to_end_block_scaled_chunked_operation(
    dtype: DType,
    op: ReduceOp,
    width: int,
    n: int,
    chunk: int,
    block: int,
    world: int,
    seed: int,
    order: random.Random,
) -> None:
    """The tensor's proposals chunk by chunk, one list of agreed scales, every chunk
    sealed with its slice of them and its attestations, verified in any order and
    decoded within the documented bound."""
    rng = np.random.default_rng(seed)
    element = element_type(dtype)
    inputs = [tensor(dtype, (n,), rng) for _ in range(world)]
    limit = sum_limit(width, world)
    per_chunk = block_count(chunk, block)  # chunk i's blocks start at i * per_chunk
    chunks = chunk_count(n, chunk)

    def blocks_of(index: int) -> slice:
        first = index * per_chunk
        return slice(first, first + block_count(chunk_length(n, chunk, index), block))

    proposals = []
    for x in inputs:
        mine = [propose(x[i * chunk : (i + 1) * chunk], element, block, limit) for i in range(chunks)]
        assert [len(p) for p in mine] == [blocks_of(i).stop - blocks_of(i).start for i in range(chunks)]
        proposals.append(np.concatenate(mine))
    agreed = np.min(np.stack(proposals), axis=0)

    results = []
    for index in range(chunks):
        scales = agreed[blocks_of(index)]
        make = ChunkHeader(
            group_id=b"\x06" * 16,
            epoch=2,
            op_id=7,
            kind=Collective.ALL_REDUCE,
            op=op,
            dtype=dtype,
            total_elements=n,
            chunk_elements=chunk,
            chunk_index=index,
            width=width,
            block_elements=block,
            scales=scales.astype("<i2").tobytes(),
        )
        parts = []
        for rank, x in enumerate(inputs):
            start = index * chunk
            data = quantize(x[start : start + chunk], element, scales, block, limit, first=start)
            parts.append(
                seal(
                    KEYS,
                    make,
                    rank,
                    np.concatenate([data, attestations(proposals[rank][blocks_of(index)], scales)]),
                )
            )
        results.append(combine(parts, Result))
    order.shuffle(results)
    out = np.zeros(n, dtype=element.storage)
    divisor = world if op is ReduceOp.AVG else 1
    for message in results:
        values = open_verified(KEYS, message, frozenset(range(world)))
        index = message.chunk_index
        out[index * chunk : index * chunk + len(values)] = dequantize(
            values, agreed[blocks_of(index)], block, divisor, element
        )
    for j in range(n):
        index, offset = divmod(j, chunk)
        b = offset // block  # blocks restart at every chunk
        s = int(agreed[blocks_of(index)][b])
        lo = index * chunk + b * block
        hi = min(lo + block, index * chunk + chunk_length(n, chunk, index))
        largest = max(abs(Fraction(float(v))) for x in inputs for v in x[lo:hi])
        if largest:  # the agreed scale is the largest that fits the block's largest |x|
            assert round(largest * Fraction(2) ** s) <= limit < round(largest * Fraction(2) ** (s + 1))
        exact = sum((Fraction(float(x[j])) for x in inputs), Fraction(0)) / divisor
        step = world * Fraction(2) ** -(s + 1) / divisor if largest else Fraction(0)
        # the final rounding (generously one ulp), and binary64's own for 8-byte integers or AVG
        rounding = Fraction(float(np.spacing(np.abs(out[j]))))
        if width == 8 or divisor != 1:
            rounding += abs(Fraction(float(out[j]))) / 2**52
        assert abs(Fraction(float(out[j])) - exact) <= step + rounding


def test_reassembler_ignores_a_repeat_and_refuses_a_different_duplicate() -> None:
    receiver = Reassembler(DType.FLOAT64, Collective.BROADCAST, ReduceOp.SUM, (3,), 3)
    assert receiver.total_elements == 6  # two halves per float64
    x = np.array([1.5, -2.0, np.nan])
    wire = encode_values(x, DType.FLOAT64, Collective.BROADCAST, ReduceOp.SUM, 1)
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
    receiver = Reassembler(DType.INT32, Collective.ALL_REDUCE, ReduceOp.SUM, (10,), 4)
    for index, values in ((3, np.zeros(2, dtype=np.int64)), (2, np.zeros(3, dtype=np.int64))):
        with pytest.raises(CcoError) as caught:
            receiver.add(index, values, 1)
        assert caught.value.code is ErrorCode.INVALID_FIELD
    receiver.add(2, np.zeros(2, dtype=np.int64), 1)


def test_chunks_are_encoded_lazily() -> None:
    """Memory depends on the chunk size: a chunk is only encoded when asked for."""
    x = np.array([1.0, -2.0, np.nan, 4.0], dtype=np.float32)
    stream = wire_chunks(x, DType.FLOAT32, Collective.ALL_REDUCE, ReduceOp.MAX, 2, 2)
    # Keys of 1.0 (pattern 0x3f800000) and -2.0 (the negative pattern 0xc0000000 with its
    # 31 magnitude bits flipped); the NaN in chunk 1 is not looked at yet.
    assert next(stream).tolist() == [0x3F800000, (0xC0000000 - 2**32) ^ 0x7FFFFFFF]
    with pytest.raises(CcoError) as caught:
        next(stream)
    assert caught.value.code is ErrorCode.OVERFLOW and "element 2" in caught.value.detail
    big = np.array([1, 2, 1 << 59, 4], dtype=np.int64)
    stream = wire_chunks(big, DType.INT64, Collective.ALL_REDUCE, ReduceOp.SUM, 2, 2)
    assert next(stream).tolist() == [1, 2]
    with pytest.raises(CcoError) as caught:
        next(stream)
    assert caught.value.code is ErrorCode.OVERFLOW and "element 2" in caught.value.detail


def test_an_empty_tensor_is_one_empty_chunk() -> None:
    x = np.zeros(0, dtype=np.int32)
    (only,) = list(wire_chunks(x, DType.INT32, Collective.ALL_REDUCE, ReduceOp.SUM, 3, 8))
    assert len(only) == 0
    make = ChunkHeader(
        group_id=b"\x06" * 16,
        epoch=2,
        op_id=5,
        kind=Collective.BARRIER,
        op=ReduceOp.SUM,
        dtype=DType.INT8,
        total_elements=0,
        chunk_elements=1,
        chunk_index=0,
    )
    parts = [seal(KEYS, make, r, only.astype(np.int64)) for r in range(3)]
    result = combine(parts, Result)
    assert result.width == 1 and result.payload == b"" and result.tag is not None
    assert open_verified(KEYS, result, frozenset(range(3))).tolist() == []
