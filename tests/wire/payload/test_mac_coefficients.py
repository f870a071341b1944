"""A chunk's MAC coefficients, derived when it is sealed and reused to verify its aggregate.

Reuse must never change a tag: the product over split coefficients equals the one
over keystream words at every width and block size, a kept chunk verifies exactly
what a fresh derivation verifies (and refuses what it refuses), and coefficients
are only reused for the same keys, chunk id and length.  The cache is bounded.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cco.nodes import sim
from cco.nodes.calls import CollectiveRequest
from cco.nodes.events import OperationCompleted
from cco.nodes.rendezvous_config import DEFAULT_PARAMS
from cco.wire import mac
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Result
from cco.wire.modp import BLOCK, SMALL_BLOCK, InnerProduct, P, split_words
from cco.wire.payload import ChunkHeader, combine, derive_group_keys, open_verified, seal
from cco.wire.registries import Collective, DType, ReduceOp

pytestmark = pytest.mark.both_kernels

GROUP = bytes(range(16, 32))
KEYS = derive_group_keys(bytes(range(32)), GROUP)
OTHER_KEYS = derive_group_keys(bytes(range(1, 33)), GROUP)
RANKS = 3


def int32_header(n: int, chunk_index: int = 0) -> ChunkHeader:
    return ChunkHeader(
        group_id=GROUP,
        epoch=5,
        op_id=9,
        kind=Collective.ALL_REDUCE,
        op=ReduceOp.SUM,
        dtype=DType.INT32,
        total_elements=n * (chunk_index + 1),
        chunk_elements=n,
        chunk_index=chunk_index,
    )


def inputs(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(n)
    return [rng.integers(-(2**30), 2**30, size=n) for _ in range(RANKS)]


def reference_inner(keys: mac.GroupKeys, chunk_id: bytes, values: np.ndarray) -> int:
    u = mac.coefficients(keys, chunk_id, len(values))
    return sum(a * int(b) for a, b in zip(u, values, strict=True)) % P


@pytest.mark.parametrize("m", [1, SMALL_BLOCK + 1, 1000, BLOCK])
@pytest.mark.parametrize("width", [1, 2, 4, 8])
def test_split_coefficients_give_the_product_of_the_words(m: int, width: int) -> None:
    rng = np.random.default_rng(m * width)
    words = rng.integers(0, 2**64, size=m, dtype=np.uint64)
    info = np.iinfo(f"<i{width}")
    values = rng.integers(info.min, info.max, size=m, endpoint=True).astype(f"<i{width}")
    from_words, from_split = InnerProduct(width), InnerProduct(width)
    from_words.add(words, values)
    from_split.add_split(split_words(words, np.empty((2, m), dtype=np.uint64)), values)
    expected = sum((int(w) % 2**61) * int(y) for w, y in zip(words, values, strict=True)) % P
    assert from_split.result() == from_words.result() == expected


@pytest.mark.parametrize("n", [0, 1, 2, 18, SMALL_BLOCK])
@pytest.mark.parametrize("width", [1, 2, 4, 8])
def test_a_small_chunk_gives_the_reference_product_kept_or_not(n: int, width: int) -> None:
    """Up to SMALL_BLOCK integers the product takes its own path (one keystream call,
    Python integers): the same number derived, kept and reused, at every width and at
    the extremes of the width."""
    info = np.iinfo(f"<i{width}")
    rng = np.random.default_rng(n * width)
    values = rng.integers(info.min, info.max, size=n, endpoint=True).astype(f"<i{width}")
    values[: min(n, 2)] = [info.min, info.max][: min(n, 2)]
    want = reference_inner(KEYS, b"small chunk", values)
    cache = mac.CoefficientCache(2)
    assert mac.inner_product(KEYS, b"small chunk", values) == want
    assert mac.inner_product(KEYS, b"small chunk", values, keep=cache) == want
    assert mac.inner_product(KEYS, b"small chunk", values, reuse=cache) == want
    assert len(cache) == 0


def test_split_coefficients_must_match_the_block() -> None:
    product = InnerProduct(4)
    with pytest.raises(ValueError, match="two limbs per element"):
        product.add_split(np.zeros((2, 3), dtype=np.uint64), np.zeros(4, dtype=np.int32))
    with pytest.raises(ValueError, match="two limbs per element"):
        product.add_split(np.zeros((2, 4), dtype=np.int64), np.zeros(4, dtype=np.int32))


@pytest.mark.parametrize("n", [1, 18, SMALL_BLOCK, SMALL_BLOCK + 1, 5000, BLOCK + 7])
def test_sealing_keeps_and_verifying_takes_the_coefficients(n: int) -> None:
    make = int32_header(n)
    cache = mac.CoefficientCache(4)
    parts = [seal(KEYS, make, 0, inputs(n)[0], coefficients=cache)]
    parts += [seal(KEYS, make, rank, values) for rank, values in enumerate(inputs(n)) if rank]
    assert len(cache) == 1
    result = combine(parts, Result)
    everyone = frozenset(range(RANKS))

    fresh = open_verified(KEYS, result, everyone)
    reused = open_verified(KEYS, result, everyone, coefficients=cache)
    np.testing.assert_array_equal(reused, fresh)
    np.testing.assert_array_equal(fresh, sum(inputs(n)))
    assert len(cache) == 0  # verified once: nothing left behind


def test_reused_coefficients_still_refuse_a_forged_result() -> None:
    n = 5000
    make = int32_header(n)
    cache = mac.CoefficientCache(4)
    parts = [seal(KEYS, make, rank, values, coefficients=cache) for rank, values in enumerate(inputs(n))]
    result = combine(parts, Result)
    integers = np.frombuffer(result.payload, dtype=f"<i{result.width}").copy()
    integers[1234] += 1
    forged = dataclasses.replace(result, payload=integers.tobytes())
    with pytest.raises(CcoError) as raised:
        open_verified(KEYS, forged, frozenset(range(RANKS)), coefficients=cache)
    assert raised.value.code is ErrorCode.VERIFICATION_FAILED
    assert raised.value.detail.startswith("tag")


def test_coefficients_are_reused_only_for_the_same_keys_chunk_and_length() -> None:
    n = 3000
    values = inputs(n)[0]
    chunk_id = int32_header(n).chunk_id()
    cache = mac.CoefficientCache(4)
    mac.inner_product(KEYS, chunk_id, values, keep=cache)

    assert mac.inner_product(OTHER_KEYS, chunk_id, values, reuse=cache) == reference_inner(
        OTHER_KEYS, chunk_id, values
    )
    assert mac.inner_product(KEYS, b"another chunk", values, reuse=cache) == reference_inner(
        KEYS, b"another chunk", values
    )
    assert len(cache) == 1  # neither was a match, so the chunk's entry is still there
    shorter = values[:-1]
    assert mac.inner_product(KEYS, chunk_id, shorter, reuse=cache) == reference_inner(KEYS, chunk_id, shorter)
    assert len(cache) == 0  # the length did not match: the entry is dropped, not used
    assert cache.take(KEYS, chunk_id, n) is None


@pytest.mark.parametrize("ranks", [[0, 1, 2, 3], [1, 2], [2], []])
def test_kept_pads_give_the_pad_sum_of_any_contributors(ranks: list[int]) -> None:
    """The sealer's pad and the prefixed pad HMAC kept with a chunk's coefficients give
    exactly :func:`mac.pad_sum`, whether the sealer's rank is among the contributors or
    not, and leave the cache with the coefficients."""
    values = inputs(18)[0]
    chunk_id = int32_header(18).chunk_id()
    want = (reference_inner(KEYS, chunk_id, values) + mac.pad_sum(KEYS, chunk_id, ranks)) % P
    cache = mac.CoefficientCache(2)
    mac.contribution_tag(KEYS, chunk_id, 2, values, keep=cache)
    assert cache.pads(KEYS, chunk_id) is not None and cache.pads(OTHER_KEYS, chunk_id) is None
    assert mac.expected_tag(KEYS, chunk_id, ranks, values, reuse=cache) == want
    assert len(cache) == 0 and cache.pads(KEYS, chunk_id) is None


def test_pads_are_kept_only_with_coefficients() -> None:
    values = inputs(1000)[0]  # 16,000 bytes of coefficients
    cache = mac.CoefficientCache(1, max_bytes=10_000)
    mac.contribution_tag(KEYS, b"large", 0, values, keep=cache)  # coefficients too large: no pads either
    assert len(cache) == 0 and cache.pads(KEYS, b"large") is None
    small = inputs(4)[0]
    mac.contribution_tag(KEYS, b"first", 0, small, keep=cache)
    mac.contribution_tag(KEYS, b"second", 1, small, keep=cache)  # the first is dropped, pads and all
    assert cache.pads(KEYS, b"first") is None and cache.pads(KEYS, b"second") is not None
    assert mac.expected_tag(KEYS, b"first", [0, 1], small, reuse=cache) == mac.expected_tag(
        KEYS, b"first", [0, 1], small
    )


def test_the_cache_holds_the_newest_chunks() -> None:
    cache = mac.CoefficientCache(2)
    values = inputs(2 * SMALL_BLOCK)[0]
    for chunk_id in (b"first", b"second", b"third"):
        mac.inner_product(KEYS, chunk_id, values, keep=cache)
    assert len(cache) == 2
    assert cache.take(KEYS, b"first", len(values)) is None
    for chunk_id in (b"second", b"third"):
        kept = cache.take(KEYS, chunk_id, len(values))
        assert kept is not None and sum(block.shape[-1] for block in kept) == len(values)
    with pytest.raises(ValueError, match="at least one chunk"):
        mac.CoefficientCache(0)


def test_a_small_chunk_keeps_its_words_and_is_not_derived_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk of at most SMALL_BLOCK elements is kept as its keystream words (8 bytes
    each), and verifying it from the cache derives nothing: no HMAC for key_m, no AES."""
    values = inputs(SMALL_BLOCK)[0]
    cache = mac.CoefficientCache(2)
    tagged = mac.inner_product(KEYS, b"small", values, keep=cache)
    assert tagged == reference_inner(KEYS, b"small", values)
    assert len(cache) == 1 and cache.nbytes == 8 * SMALL_BLOCK

    def derived(*_: object) -> bytes:
        raise AssertionError("the kept coefficients were derived again")

    monkeypatch.setattr(mac, "coefficient_key", derived)
    assert mac.inner_product(KEYS, b"small", values, reuse=cache) == tagged
    assert len(cache) == 0


def test_the_cache_holds_at_most_its_bytes_and_counts_them_exactly() -> None:
    values = inputs(1000)[0]  # 16,000 bytes of coefficients a chunk
    cache = mac.CoefficientCache(10, max_bytes=40_000)
    for chunk_id in (b"a", b"b", b"b", b"c"):  # b twice: replaced, not counted twice
        mac.inner_product(KEYS, chunk_id, values, keep=cache)
    assert len(cache) == 2 and cache.nbytes == 32_000
    assert cache.take(KEYS, b"a", len(values)) is None  # the oldest went first
    assert cache.take(KEYS, b"b", len(values)) is not None and cache.nbytes == 16_000

    mac.inner_product(KEYS, b"large", inputs(3000)[0], keep=cache)  # 48,000 bytes: never kept
    assert len(cache) == 1 and cache.nbytes == 16_000
    assert cache.take(KEYS, b"c", len(values)) is not None and cache.nbytes == 0


def test_an_endpoint_verifies_every_result_with_the_coefficients_it_sealed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four ranks, three chunks each: every Result's coefficients come from the cache."""
    taken: list[bool] = []
    take = mac.CoefficientCache.take

    def counting_take(self: mac.CoefficientCache, keys: mac.GroupKeys, chunk_id: bytes, n: int) -> object:
        kept = take(self, keys, chunk_id, n)
        taken.append(kept is not None)
        return kept

    monkeypatch.setattr(mac.CoefficientCache, "take", counting_take)
    group = sim.GroupSpec(group_id=GROUP, world_size=4)
    deployment = sim.build_cluster([group], aggregators=1, params=DEFAULT_PARAMS, max_fan_in=4)
    n = 3 * DEFAULT_PARAMS.chunk_elements
    arrays = {r: np.random.default_rng(r).integers(-1000, 1000, size=n).astype(np.int32) for r in range(4)}
    requests = {
        r: CollectiveRequest(kind=Collective.ALL_REDUCE, op=ReduceOp.SUM, array=a) for r, a in arrays.items()
    }
    outcomes = deployment.collective(group.group_id, requests)
    for outcome in outcomes.values():
        assert isinstance(outcome, OperationCompleted) and outcome.result is not None
        np.testing.assert_array_equal(outcome.result, sum(arrays.values()))
    assert taken == [True] * 12
    for rank in range(4):
        joined = deployment.endpoint(group.group_id, rank)._joined
        assert joined is not None and len(joined.membership.coefficients) == 0
