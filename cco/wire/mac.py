"""The linearly homomorphic MAC over F_p that authenticates aggregatable chunks.

Construction (draft section "Homomorphic Authentication"), for chunk id m and a
chunk of n integers:

* keys: k1 = HKDF-SHA256(group_secret, salt=group_id, info="cco/1 mac k1"), k2
  likewise with info "cco/1 mac k2" (RFC 5869, 32 bytes each);
* coefficients: key_m = HMAC-SHA256(k1, m); the AES-256-CTR keystream under key_m
  from an all-zero counter block, cut into little-endian 64-bit words w_j, gives
  u_j = (w_j mod 2^61) mod p;
* pads: F(k2, m, r) = (first 8 bytes of HMAC-SHA256(k2, m || uint32_be(r)) read
  little-endian, mod 2^61) mod p;
* contributor r tags its integers x with t = <u, x> + F(k2, m, r) mod p, and an
  aggregate y of the contributors S is genuine iff its tag T equals
  <u, y> + sum over r in S of F(k2, m, r) mod p.

Tags add: whoever adds the integers exactly and the tags mod p keeps the relation,
without any key.  Only endpoints ever hold :class:`GroupKeys`.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections import OrderedDict
from collections.abc import Iterable

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from cco.wire import kernels
from cco.wire.modp import BLOCK, SMALL_BLOCK, WORD_MASK, InnerProduct, P, mask_words, prepare, small_sum

KEY_SIZE = 32
INFO_K1 = b"cco/1 mac k1"
INFO_K2 = b"cco/1 mac k2"
_CTR_FROM_ZERO = modes.CTR(bytes(16))
_ZEROS = bytes(8 * BLOCK)
DEFAULT_CACHE_BYTES = 16 << 20
"""What a :class:`CoefficientCache` holds at most unless told otherwise: the
coefficients of one chunk of the largest size (2^20 elements) split into limbs, or of
two kept as words for the compiled loop.  The default window's four chunks of the
131072 elements recommended for fast links take half of it (a quarter as words)."""


class _Hmac:
    """HMAC-SHA256 (RFC 2104) under one key, with the inner and outer SHA-256 states
    of the key computed once.  One HMAC then costs two state copies and two short
    hashes, a third of ``hmac.digest``: it matters when a verifier computes one pad
    per contributor for every chunk."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, inner: hashlib._Hash, outer: hashlib._Hash) -> None:
        self._inner = inner
        self._outer = outer

    @classmethod
    def keyed(cls, key: bytes) -> _Hmac:
        block = key.ljust(64, b"\x00")  # keys of at most 64 bytes are zero-padded
        return cls(
            hashlib.sha256(bytes(b ^ 0x36 for b in block)), hashlib.sha256(bytes(b ^ 0x5C for b in block))
        )

    def prefixed(self, prefix: bytes) -> _Hmac:
        """The same HMAC with ``prefix`` already absorbed into every message."""
        inner = self._inner.copy()
        inner.update(prefix)
        return _Hmac(inner, self._outer)

    def digest(self, message: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


class GroupKeys:
    """The two MAC keys of a group; opaque, and never printed."""

    __slots__ = ("_k1", "_k2", "_mac1", "_mac2")

    def __init__(self, k1: bytes, k2: bytes) -> None:
        if len(k1) != KEY_SIZE or len(k2) != KEY_SIZE:
            raise ValueError("MAC keys are 32 bytes each")
        self._k1 = bytes(k1)
        self._k2 = bytes(k2)
        self._mac1 = _Hmac.keyed(self._k1)
        self._mac2 = _Hmac.keyed(self._k2)

    def __repr__(self) -> str:
        return "GroupKeys(<secret>)"


def hkdf_extract(salt: bytes, ikm: bytes) -> bytes:
    """RFC 5869 HKDF-Extract with SHA-256: the pseudorandom key PRK."""
    return hmac.digest(salt, ikm, "sha256")


def hkdf_expand_32(prk: bytes, info: bytes) -> bytes:
    """RFC 5869 HKDF-Expand with SHA-256 for L = 32: one block, T(1) = HMAC(PRK, info || 0x01)."""
    return hmac.digest(prk, info + b"\x01", "sha256")


def derive_group_keys(group_secret: bytes, group_id: bytes) -> GroupKeys:
    """k1 and k2 from the group secret a member received in JoinAccept."""
    prk = hkdf_extract(group_id, group_secret)
    return GroupKeys(hkdf_expand_32(prk, INFO_K1), hkdf_expand_32(prk, INFO_K2))


def coefficient_key(keys: GroupKeys, chunk_id: bytes) -> bytes:
    """key_m = HMAC-SHA256(k1, m): the AES-256 key of the chunk's coefficient stream."""
    return keys._mac1.digest(chunk_id)


def keystream(key_m: bytes, elements: int) -> bytes:
    """The first 8 * elements bytes of AES-256-CTR under key_m from counter block zero."""
    encryptor = Cipher(algorithms.AES(key_m), _CTR_FROM_ZERO).encryptor()
    return encryptor.update(bytes(8 * elements)) + encryptor.finalize()


def coefficients(keys: GroupKeys, chunk_id: bytes, elements: int) -> list[int]:
    """u_1..u_n as Python integers in [0, p) (for vectors and tests; the hot path streams)."""
    stream = keystream(coefficient_key(keys, chunk_id), elements)
    return [(int.from_bytes(stream[8 * j : 8 * j + 8], "little") & WORD_MASK) % P for j in range(elements)]


def _pad(mac: _Hmac, rank: int) -> int:
    digest = mac.digest(rank.to_bytes(4, "big"))
    return (int.from_bytes(digest[:8], "little") & WORD_MASK) % P


def pad(keys: GroupKeys, chunk_id: bytes, rank: int) -> int:
    """F(k2, m, r), the one-time pad of contributor ``rank`` for chunk ``m``."""
    return _pad(keys._mac2.prefixed(chunk_id), rank)


def pad_sum(keys: GroupKeys, chunk_id: bytes, ranks: Iterable[int]) -> int:
    """sum over r of F(k2, m, r) mod p."""
    mac = keys._mac2.prefixed(chunk_id)
    return sum(_pad(mac, r) for r in ranks) % P


class _Pads:
    """The pads of one chunk m as its sealer knows them: the pad HMAC with m absorbed,
    and the sealer's own pad.  An endpoint computes its own pad when it seals a chunk
    and every contributor's pad when it verifies the chunk's aggregate; kept with the
    chunk's coefficients (:meth:`CoefficientCache.keep_pads`), they spare the
    verification one HMAC and the absorbing of m."""

    __slots__ = ("_mac", "own", "rank")

    def __init__(self, keys: GroupKeys, chunk_id: bytes, rank: int) -> None:
        self._mac = keys._mac2.prefixed(chunk_id)
        self.rank = rank
        self.own = _pad(self._mac, rank)  # F(k2, m, rank)

    def total(self, ranks: Iterable[int]) -> int:
        """sum over r in ``ranks`` of F(k2, m, r) mod p."""
        mac, rank, own = self._mac, self.rank, self.own
        return sum(own if r == rank else _pad(mac, r) for r in ranks) % P


class _Stream(threading.local):
    """Per-thread keystream buffer (``update_into`` needs room for one extra AES block)."""

    def __init__(self) -> None:
        self.buffer = bytearray(8 * BLOCK + 16)


_stream = _Stream()


class CoefficientCache:
    """The coefficients of the chunks an endpoint sealed last, kept for verifying
    their aggregates.

    A chunk's Result has the chunk id of the Contribution sealed for it, so it has the
    same coefficients u.  Deriving them (the AES keystream, then splitting each word
    into the two limbs the inner product multiplies) is about half of an inner
    product's time: 131 of 276 us for 32 Ki int32 elements on the reference machine.
    Sealing keeps the coefficients here, as :func:`~cco.wire.modp.prepare` gives them
    (split into limbs, or the words themselves for the compiled loop), and verifying
    takes them back, so each chunk derives them once.

    Entries are keyed by the group keys as well as the chunk id, so coefficients
    never outlive the keys that made them.  At most ``chunks`` chunks and
    ``max_bytes`` bytes (16 per element split, 8 as words) are kept; keeping more
    drops the oldest, and a chunk larger than ``max_bytes`` is not kept.  A chunk not found is derived
    again, so the bounds cost time, never a wrong tag.

    A kept chunk also keeps the sealer's pad and the pad HMAC with the chunk id absorbed
    (:class:`_Pads`): verifying then computes the other contributors' pads only.
    """

    __slots__ = ("_bytes", "_chunks", "_kept", "_max_bytes", "_pads")

    def __init__(self, chunks: int, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if chunks < 1:
            raise ValueError("a coefficient cache holds at least one chunk")
        self._chunks = chunks
        self._max_bytes = max_bytes
        self._bytes = 0
        self._kept: OrderedDict[tuple[GroupKeys, bytes], list[np.ndarray]] = OrderedDict()
        self._pads: dict[tuple[GroupKeys, bytes], _Pads] = {}  # of kept chunks only

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def nbytes(self) -> int:
        """Bytes of coefficients held."""
        return self._bytes

    def keep(self, keys: GroupKeys, chunk_id: bytes, blocks: list[np.ndarray]) -> None:
        size = sum(block.nbytes for block in blocks)
        if size > self._max_bytes:
            return
        self._forget((keys, chunk_id))
        self._kept[(keys, chunk_id)] = blocks
        self._bytes += size
        while len(self._kept) > self._chunks or self._bytes > self._max_bytes:
            self._forget(next(iter(self._kept)))

    def keep_pads(self, keys: GroupKeys, chunk_id: bytes, pads: _Pads) -> None:
        """Keep the chunk's pads with its coefficients (not at all if those are not kept)."""
        if (keys, chunk_id) in self._kept:
            self._pads[(keys, chunk_id)] = pads

    def pads(self, keys: GroupKeys, chunk_id: bytes) -> _Pads | None:
        """The chunk's pads kept with its coefficients, left in the cache (:meth:`take`
        removes both)."""
        return self._pads.get((keys, chunk_id))

    def take(self, keys: GroupKeys, chunk_id: bytes, elements: int) -> list[np.ndarray] | None:
        """The chunk's prepared coefficients, removed from the cache, if it holds them for
        exactly ``elements`` elements."""
        blocks = self._forget((keys, chunk_id))
        if blocks is None or sum(block.shape[-1] for block in blocks) != elements:
            return None
        return blocks

    def _forget(self, key: tuple[GroupKeys, bytes]) -> list[np.ndarray] | None:
        blocks = self._kept.pop(key, None)
        if blocks is not None:
            self._pads.pop(key, None)
            self._bytes -= sum(block.nbytes for block in blocks)
        return blocks


def inner_product(
    keys: GroupKeys,
    chunk_id: bytes,
    values: np.ndarray,
    *,
    keep: CoefficientCache | None = None,
    reuse: CoefficientCache | None = None,
) -> int:
    """<u, y> mod p for the chunk's integers ``values`` (signed, 1, 2, 4 or 8 bytes each).

    The keystream is produced and consumed one block at a time, so memory does not
    grow with the chunk, unless ``keep`` is given: then the chunk keeps its prepared
    coefficients there (:func:`~cco.wire.modp.prepare`).  ``reuse`` is a cache to take
    them from instead of deriving them.

    Small chunks are kept too: for them deriving (key_m's HMAC, then setting up an AES
    context) is most of the cost, and in an 8-byte all-reduce on loopback keeping
    them saved each endpoint 3 to 4% of its CPU per round.
    """
    n = len(values)
    if n <= SMALL_BLOCK:
        return _small_inner_product(keys, chunk_id, values, keep, reuse)
    product = InnerProduct(values.dtype.itemsize)
    kept = reuse.take(keys, chunk_id, n) if reuse is not None else None
    if kept is not None:
        for start, u in zip(range(0, n, BLOCK), kept, strict=True):
            product.add_prepared(u, values[start : start + BLOCK])
        return product.result()
    blocks: list[np.ndarray] = []
    encryptor = Cipher(algorithms.AES(coefficient_key(keys, chunk_id)), _CTR_FROM_ZERO).encryptor()
    # kept as words (for the compiled loop), the keystream is written where it is
    # kept, not into the shared buffer and then copied (:func:`prepare`)
    as_words = keep is not None and kernels.compiled_sums(values.dtype.itemsize) is not None
    buffer: bytearray | memoryview = _stream.buffer
    for start in range(0, n, BLOCK):
        block = values[start : start + BLOCK]
        m = len(block)
        if as_words:  # update_into wants room for one AES block more
            buffer = np.empty(m + 2, dtype="<u8").data.cast("B")
        encryptor.update_into(memoryview(_ZEROS)[: 8 * m], buffer)
        words = np.frombuffer(buffer, dtype="<u8", count=m)
        if keep is None:
            product.add(words, block)
        elif as_words:
            blocks.append(words)
            product.add(words, block)
        else:
            blocks.append(prepare(words, values.dtype.itemsize))
            product.add_prepared(blocks[-1], block)
    if keep is not None:
        keep.keep(keys, chunk_id, blocks)
    return product.result()


def _small_inner_product(
    keys: GroupKeys,
    chunk_id: bytes,
    values: np.ndarray,
    keep: CoefficientCache | None,
    reuse: CoefficientCache | None,
) -> int:
    """:func:`inner_product` of a chunk of at most ``SMALL_BLOCK`` integers: one block,
    summed with Python integers.  The keystream is taken in one ``update`` and the
    coefficients kept already masked (a word mod 2^61, as :meth:`InnerProduct.add`
    takes them), so sealing and verifying an 8-byte all-reduce's chunk each make a
    handful of calls where the block loop, :func:`prepare` and ``InnerProduct.add``
    made some thirty."""
    n = len(values)
    kept = reuse.take(keys, chunk_id, n) if reuse is not None else None
    if kept is not None:
        (words,) = kept
    else:
        encryptor = Cipher(algorithms.AES(coefficient_key(keys, chunk_id)), _CTR_FROM_ZERO).encryptor()
        words = mask_words(np.frombuffer(encryptor.update(_ZEROS[: 8 * n]), dtype="<u8"))
        if keep is not None:
            keep.keep(keys, chunk_id, [words])
    return small_sum(words, values) % P


def contribution_tag(
    keys: GroupKeys, chunk_id: bytes, rank: int, values: np.ndarray, keep: CoefficientCache | None = None
) -> int:
    """t_r = <u, x_r> + F(k2, m, r) mod p; the chunk's coefficients and pad kept in ``keep``."""
    product = inner_product(keys, chunk_id, values, keep=keep)
    if keep is None:
        return (product + pad(keys, chunk_id, rank)) % P
    pads = _Pads(keys, chunk_id, rank)
    keep.keep_pads(keys, chunk_id, pads)
    return (product + pads.own) % P


def expected_tag(
    keys: GroupKeys,
    chunk_id: bytes,
    ranks: Iterable[int],
    values: np.ndarray,
    reuse: CoefficientCache | None = None,
) -> int:
    """The only tag an honest aggregate of ``ranks`` with integers ``values`` can carry
    (the coefficients and pads taken from ``reuse`` when it holds them)."""
    pads = reuse.pads(keys, chunk_id) if reuse is not None else None
    product = inner_product(keys, chunk_id, values, reuse=reuse)
    if pads is None:
        return (product + pad_sum(keys, chunk_id, ranks)) % P
    return (product + pads.total(ranks)) % P
