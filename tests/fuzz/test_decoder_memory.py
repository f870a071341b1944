"""Decoders allocate in proportion to the bytes they were given, never to what those
bytes claim, and keep nothing once they return (issue 41: bounded memory).

Measured with tracemalloc (Python's allocator, which numpy and cbor2 use as well),
on inputs that claim huge strings, arrays, maps and frames with a few bytes, on
mutations of every catalogued message, and on random bytes.
"""

from __future__ import annotations

import contextlib
import random
import tracemalloc
from collections.abc import Callable, Iterator

import pytest
import wire_targets

from cco.wire import cbor
from cco.wire.errors import CcoError
from cco.wire.framing import FrameDecoder
from cco.wire.messages import decode_message

FIXED = 160 * 1024
"""What any decode may take whatever its input: cbor2 reads long strings in 64 KiB
pieces, and the first decode of a kind fills small caches."""
PER_BYTE = 40
"""Decoded values, the copy the strict reader makes, and the encoding a round trip builds."""


def claims() -> Iterator[bytes]:
    """A few bytes each, claiming up to 2^64 - 1 bytes or items in every major type
    and argument size, bare, in an array, in a map and as a message body."""
    for major in (2, 3, 4, 5):
        for info, size in ((25, 2), (26, 4), (27, 8)):
            for claim in (0xFF, 0x7F, 0x10):
                head = bytes([major << 5 | info]) + bytes([claim]) * size
                yield head
                yield head + b"\x00" * 7
                yield b"\x81" + head
                yield b"\xa1\x01" + head
                yield b"\x82\x04" + head
                yield b"\x82\x18\x20\xb3\x0d" + head  # a Contribution whose payload claims a length


def mutations(count: int) -> Iterator[bytes]:
    rng = random.Random(41)
    seeds = wire_targets.corpus()
    for _ in range(count):
        seed = seeds[rng.randrange(len(seeds))]
        draw = wire_targets.Draw(rng.randbytes(24))
        yield wire_targets._mutate_bytes(draw, seed)


def noise(count: int) -> Iterator[bytes]:
    rng = random.Random(42)
    for _ in range(count):
        yield rng.randbytes(rng.randrange(200))


def _decode_cbor(data: bytes) -> None:
    cbor.decode(data)


def _decode_message(data: bytes) -> None:
    decode_message(data)


def _frames(data: bytes) -> None:
    decoder = FrameDecoder(1 << 20)
    for at in range(0, len(data), 7):
        decoder.feed(data[at : at + 7])


DECODERS: dict[str, Callable[[bytes], None]] = {
    "cbor.decode": _decode_cbor,
    "decode_message": _decode_message,
    "FrameDecoder.feed": _frames,
}


def peak_of(decoder: Callable[[bytes], None], data: bytes) -> int:
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    with contextlib.suppress(CcoError):
        decoder(data)
    return tracemalloc.get_traced_memory()[1] - before


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_memory_follows_the_input_not_its_claims(name: str) -> None:
    decoder = DECODERS[name]
    inputs = [*claims(), *mutations(400), *noise(400), *wire_targets.corpus()]
    tracemalloc.start()
    try:
        for data in inputs[:50]:  # warm up: first-use caches are not the input's doing
            peak_of(decoder, data)
        over = [
            (len(data), peak)
            for data in inputs
            if (peak := peak_of(decoder, data)) > FIXED + PER_BYTE * len(data)
        ]
    finally:
        tracemalloc.stop()
    assert not over, f"{len(over)} inputs took more than {FIXED} + {PER_BYTE} x their size: {over[:5]}"


@pytest.mark.parametrize("name", sorted(wire_targets.TARGETS))
def test_targets_retain_nothing(name: str) -> None:
    """After 3,000 inputs, 3,000 more leave the traced memory where it was (bounded
    caches such as the payload layer's 64 headers stay within their bound)."""
    target = wire_targets.TARGETS[name]
    rng = random.Random(name)

    def feed(count: int) -> None:
        for _ in range(count):
            target(rng.randbytes(rng.randrange(4, 64)))

    feed(3000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        feed(3000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{name} kept {grown} bytes over 3,000 inputs"
