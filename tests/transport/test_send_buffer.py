"""SendBuffer behaves as the bytearray aioquic's stream sender would use."""

from __future__ import annotations

import random

import pytest

from cco.transport.sendbuffer import SendBuffer

pytestmark = pytest.mark.quic_backends("aioquic")  # backend-independent parts: run once
"""SendBuffer replaces a buffer inside aioquic's stream sender; qh3 has no such buffer."""


def test_random_writes_slices_and_trims_match_a_bytearray() -> None:
    rng = random.Random(8)
    model = bytearray(b"seed")
    buffer = SendBuffer(bytearray(b"seed"))
    for step in range(3000):
        action = rng.random()
        if action < 0.4:
            data = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 7, 300, 5000])))
            model += data
            buffer += data if step % 3 else bytearray(data)
        elif action < 0.8 and model:
            start = rng.randrange(len(model) + 1)
            stop = rng.randrange(start, len(model) + 2)
            assert buffer[start:stop] == bytes(model[start:stop])
        elif model:
            count = rng.randrange(len(model) + 1)
            del model[:count]
            del buffer[:count]
        assert len(buffer) == len(model)
    assert buffer[0 : len(model)] == bytes(model)


def test_a_whole_chunk_is_returned_without_a_copy() -> None:
    buffer = SendBuffer()
    first, second = b"a" * 100, b"b" * 50
    buffer += first
    buffer += second
    assert buffer[0:100] is first
    del buffer[:100]
    assert buffer[0:50] is second


def test_only_contiguous_slices_and_front_trims() -> None:
    buffer = SendBuffer(b"abcdef")
    with pytest.raises(ValueError):
        buffer[0:4:2]
    with pytest.raises(ValueError):
        del buffer[1:3]
    assert buffer[4:2] == b""
