"""The MAC construction exactly as specified: keys, chunk ids, coefficients, pads, tags.

Each piece is recomputed here from its definition with independent means (the
``cryptography`` package's HKDF, Python integers, a hand-written CBOR array) and
compared with the implementation, including the exact inner product at every
payload width, at block boundaries and at the range bound.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cco.wire import mac
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Contribution, PartialAggregate, decode_message, encode_message
from cco.wire.modp import BLOCK, SMALL_BLOCK, InnerProduct, P
from cco.wire.payload import RANGE_BOUND, ChunkHeader, derive_group_keys, seal
from cco.wire.registries import Collective, DType, ReduceOp

pytestmark = pytest.mark.both_kernels

SECRET = bytes(range(32))
GROUP = bytes(range(16, 32))
KEYS = derive_group_keys(SECRET, GROUP)


def reference_keys() -> tuple[bytes, bytes]:
    def hkdf(info: bytes) -> bytes:
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=GROUP, info=info).derive(SECRET)

    return hkdf(b"cco/1 mac k1"), hkdf(b"cco/1 mac k2")


def reference_coefficients(chunk_id: bytes, n: int) -> list[int]:
    k1, _ = reference_keys()
    key_m = hmac.new(k1, chunk_id, hashlib.sha256).digest()
    stream = Cipher(algorithms.AES(key_m), modes.CTR(bytes(16))).encryptor().update(bytes(8 * n))
    return [(int.from_bytes(stream[8 * j : 8 * j + 8], "little") % 2**61) % P for j in range(n)]


def reference_pad(chunk_id: bytes, rank: int) -> int:
    _, k2 = reference_keys()
    digest = hmac.new(k2, chunk_id + rank.to_bytes(4, "big"), hashlib.sha256).digest()
    return (int.from_bytes(digest[:8], "little") % 2**61) % P


def header(
    n: int = 5,
    *,
    root: int | None = None,
    kind: Collective = Collective.ALL_REDUCE,
    dtype: DType = DType.FLOAT32,
    width: int = 4,
) -> ChunkHeader:
    """A float32 SUM chunk (block-scaled: width 4, one block of 16 at scale -3), or of
    another kind or dtype (then without block scaling)."""
    scaled = kind is Collective.ALL_REDUCE and dtype is DType.FLOAT32
    return ChunkHeader(
        group_id=GROUP,
        epoch=2**40 + 1,
        op_id=77,
        kind=kind,
        op=ReduceOp.SUM,
        dtype=dtype,
        total_elements=n,
        chunk_elements=n,
        chunk_index=0,
        root=root,
        width=width if scaled else None,
        block_elements=16 if scaled else None,
        scales=(-3).to_bytes(2, "little", signed=True) * (-(-n // 16)) if scaled else None,
    )


def test_keys_are_hkdf_sha256_and_never_printed() -> None:
    k1, k2 = reference_keys()
    assert mac.derive_group_keys(SECRET, GROUP)._k1 == k1
    assert mac.derive_group_keys(SECRET, GROUP)._k2 == k2
    for shown in (repr(KEYS), str(KEYS)):
        assert k1.hex() not in shown and k2.hex() not in shown and "secret" in shown
    assert not hasattr(KEYS, "__dict__")


def test_chunk_id_is_the_deterministic_cbor_array_of_the_header() -> None:
    # 8b = array(11); 50 = bstr(16); 1b = uint64; 18 4d = uint8 77; 01 01 07 = kind, op, dtype;
    # scaling 83 04 10 42fdff = [width 4, block_elements 16, scales h'fdff' (-3)]; 05 05 00; f6 = null root
    expected = bytes.fromhex(
        "8b50" + GROUP.hex() + "1b0000010000000001" + "184d" + "010107" + "83041042fdff" + "050500" + "f6"
    )
    assert header().chunk_id() == expected
    # Without block scaling the seventh place is null: 01 01 03 = ALL_REDUCE SUM INT32, f6.
    unscaled = header(dtype=DType.INT32).chunk_id()
    assert unscaled == bytes.fromhex(
        "8b50" + GROUP.hex() + "1b0000010000000001" + "184d" + "010103" + "f6" + "050500" + "f6"
    )
    with_root = header(root=300, kind=Collective.REDUCE).chunk_id()
    assert with_root.endswith(bytes.fromhex("f605050019012c")) and with_root[1:] != expected[1:]


def test_width_block_elements_and_scales_are_part_of_the_chunk_id() -> None:
    base = header(20)
    ids = {
        base.chunk_id(),
        dataclasses.replace(base, width=8).chunk_id(),
        dataclasses.replace(base, block_elements=17).chunk_id(),
        dataclasses.replace(base, scales=bytes.fromhex("fdfffcff")).chunk_id(),
    }
    assert len(ids) == 4


def test_coefficients_and_pads_follow_their_definitions() -> None:
    chunk_id = header().chunk_id()
    assert mac.coefficients(KEYS, chunk_id, 40) == reference_coefficients(chunk_id, 40)
    for rank in (0, 1, 255, 65535):
        assert mac.pad(KEYS, chunk_id, rank) == reference_pad(chunk_id, rank)


def reference_inner(chunk_id: bytes, values: list[int]) -> int:
    u = reference_coefficients(chunk_id, len(values))
    return sum(a * b for a, b in zip(u, values, strict=True)) % P


WIDTH_RANGES = {
    1: (-(2**7), 2**7 - 1),
    2: (-(2**15), 2**15 - 1),
    4: (-(2**31), 2**31 - 1),
    8: (-RANGE_BOUND, RANGE_BOUND),
}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(width=st.sampled_from([1, 2, 4, 8]), data=st.data())
def test_inner_product_is_exact_at_every_width(width: int, data: st.DataObject) -> None:
    lo, hi = WIDTH_RANGES[width]
    values = data.draw(
        st.lists(st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0, -1])), max_size=64)
    )
    chunk_id = data.draw(st.binary(min_size=1, max_size=40))
    array = np.array(values, dtype=f"<i{width}")
    assert mac.inner_product(KEYS, chunk_id, array) == reference_inner(chunk_id, values)


@pytest.mark.parametrize("n", [1, SMALL_BLOCK, SMALL_BLOCK + 1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + 3])
@pytest.mark.parametrize("width", [1, 2, 4, 8])
def test_inner_product_is_exact_across_blocks_at_the_extremes(n: int, width: int) -> None:
    """Blocks on both sides of SMALL_BLOCK (Python integers below, numpy limbs above),
    and chunks of one, two and three blocks."""
    lo, hi = WIDTH_RANGES[width]
    rng = np.random.default_rng(n + width)
    values = rng.choice(np.array([lo, hi, hi - 1, lo + 1], dtype=np.int64), size=n)
    array = values.astype(f"<i{width}")
    chunk_id = b"blocks"
    u = mac.coefficients(KEYS, chunk_id, n)  # checked against the reference above
    assert (
        mac.inner_product(KEYS, chunk_id, array)
        == sum(a * int(b) for a, b in zip(u, values, strict=True)) % P
    )


@pytest.mark.parametrize("width", [1, 2, 4, 8])
@pytest.mark.parametrize("extreme", ["lo", "hi"])
@pytest.mark.parametrize("m", [SMALL_BLOCK, BLOCK])
def test_a_block_at_the_largest_coefficients_does_not_overflow(width: int, extreme: str, m: int) -> None:
    """Every limb sum at (one below) its bound: each word all ones but its last bit
    (so u = 2^61 - 2 once the top three bits are dropped), every integer at the end
    of its range; in a full block, and in the largest summed with Python integers."""
    value = WIDTH_RANGES[width][0 if extreme == "lo" else 1]
    words = np.full(m, np.uint64(2**64 - 2))
    values = np.full(m, value, dtype=f"<i{width}")
    product = InnerProduct(width)
    product.add(words, values)
    assert product.result() == ((2**61 - 2) * value * m) % P != 0


@pytest.mark.parametrize("width", [1, 2, 4, 8])
def test_the_inner_product_of_a_strided_array_is_that_of_its_copy(width: int) -> None:
    values = np.arange(-50, 50, dtype=f"<i{width}")[::3]
    assert not values.flags.c_contiguous
    assert mac.inner_product(KEYS, b"strided", values) == reference_inner(b"strided", values.tolist())


def test_a_contribution_tag_is_inner_product_plus_pad() -> None:
    make = header()
    values = np.array([3, -1, 0, 2**20, -(2**31), 1], dtype=np.int64)  # five elements, one attestation
    sealed = seal(KEYS, make, 6, values)
    chunk_id = make.chunk_id()
    assert sealed.tag == (reference_inner(chunk_id, values.tolist()) + reference_pad(chunk_id, 6)) % P
    assert sealed.width == 4 and sealed.contributors == b"\x40"
    assert sealed.scales == make.scales and sealed.block_elements == 16
    assert isinstance(sealed, Contribution)
    assert ChunkHeader.of(sealed) == make
    assert encode_message(seal(KEYS, make, 6, values)) == encode_message(sealed)  # deterministic
    again = decode_message(encode_message(seal(KEYS, make, 6, values, PartialAggregate)))
    assert isinstance(again, PartialAggregate) and again.tag == sealed.tag
    # An unscaled chunk: the same rule over its elements alone, at the smallest width.
    plain = header(dtype=DType.INT32)
    small = np.array([3, -1, 0, 100, -128], dtype=np.int64)
    sealed = seal(KEYS, plain, 6, small)
    assert sealed.width == 1 and sealed.scales is None and sealed.block_elements is None
    assert (
        sealed.tag
        == (reference_inner(plain.chunk_id(), small.tolist()) + reference_pad(plain.chunk_id(), 6)) % P
    )


@pytest.mark.parametrize("width", [1, 2, 4, 8])
def test_a_block_scaled_chunk_is_sealed_at_its_fixed_width(width: int) -> None:
    make = header(width=width)
    top = 2 ** (8 * width - 1) - 1 if width < 8 else RANGE_BOUND
    values = np.array([0, 1, -1, top, -top, 1], dtype=np.int64)
    sealed = seal(KEYS, make, 2, values)
    assert sealed.width == width and len(sealed.payload) == 6 * width
    assert np.frombuffer(sealed.payload, dtype=f"<i{width}").tolist() == values.tolist()
    chunk_id = make.chunk_id()
    assert sealed.tag == (reference_inner(chunk_id, values.tolist()) + reference_pad(chunk_id, 2)) % P
    if width < 8:  # given at the width already, the same message, not measured again
        narrow = seal(KEYS, make, 2, values.astype(f"<i{width}"))
        assert encode_message(narrow) == encode_message(sealed)
    small = seal(KEYS, make, 2, np.array([0, 0, 0, 0, 0, 1], dtype=np.int64))
    assert small.width == width  # never narrowed
    with pytest.raises(CcoError) as caught:
        seal(KEYS, make, 2, np.array([0, 0, 0, 0, top + 1, 1], dtype=np.int64))
    assert caught.value.code is ErrorCode.OVERFLOW


def test_seal_refuses_bad_input() -> None:
    make = header()
    bad_inputs = (
        np.zeros(5, dtype=np.int64),  # the elements without their attestation
        np.zeros(6, dtype=np.int16),  # neither int64 nor the chunk's width (4 bytes)
        np.zeros(6, dtype=">i4"),  # the width, but not little-endian
        np.zeros((6, 1), dtype=np.int64),
    )
    for bad in bad_inputs:
        with pytest.raises(CcoError) as caught:
            seal(KEYS, make, 0, bad)
        assert caught.value.code is ErrorCode.INVALID_FIELD
    for plain in (header(dtype=DType.INT64), header(width=8)):
        with pytest.raises(CcoError) as caught:
            seal(
                KEYS,
                plain,
                0,
                np.array([0, 0, 0, 0, RANGE_BOUND + 1, 1][: plain.integer_count], dtype=np.int64),
            )
        assert caught.value.code is ErrorCode.OVERFLOW
    with pytest.raises(CcoError) as caught:
        seal(KEYS, make, 1 << 16, np.zeros(6, dtype=np.int64))
    assert caught.value.code is ErrorCode.INVALID_FIELD
    unscaled = {"width": None, "block_elements": None, "scales": None}
    for bitwise_float in (
        dataclasses.replace(make, op=ReduceOp.BOR),
        dataclasses.replace(make, op=ReduceOp.BOR, **unscaled),
    ):
        with pytest.raises(CcoError) as caught:
            seal(KEYS, bitwise_float, 0, np.zeros(5, dtype=np.int64))
        assert caught.value.code is ErrorCode.UNSUPPORTED_FEATURE
    for mismatched in (
        dataclasses.replace(make, **unscaled),
        dataclasses.replace(header(dtype=DType.INT32), width=4),
    ):
        with pytest.raises(CcoError) as caught:
            seal(KEYS, mismatched, 0, np.zeros(mismatched.integer_count, dtype=np.int64))
        assert caught.value.code is ErrorCode.INVALID_FIELD
    broadcast_max = dataclasses.replace(header(root=0, kind=Collective.BROADCAST), op=ReduceOp.MAX)
    with pytest.raises(CcoError) as caught:
        seal(KEYS, broadcast_max, 0, np.zeros(5, dtype=np.int64))
    assert caught.value.code is ErrorCode.INVALID_FIELD
