"""A connection's streams as received (cco.transport.streams.InboundStreams), without a
socket: frames split anywhere come out whole, and the bytes held in part are counted
per connection and per node, given back on a frame's end and on release, and bounded
in size and in time (the bounds that tests/transport/test_hostile_limits.py checks over
QUIC)."""

from __future__ import annotations

import pytest

from cco.transport.streams import CONTROL_STREAM_ID, InboundStreams, UnfinishedFrames
from cco.wire.errors import CcoError, DecodeError, ErrorCode
from cco.wire.framing import encode_frame

DATA_STREAM = 2  # the client's first unidirectional stream, as the server sees it


class Clock:
    """The time the test says it is."""

    def __init__(self) -> None:
        self.now = 1.0

    def __call__(self) -> float:
        return self.now


def streams(
    node: UnfinishedFrames | None = None, per_connection: int = 4096, clock: Clock | None = None
) -> InboundStreams:
    return InboundStreams(
        is_client=False,
        max_message_size=2048,
        per_connection=per_connection,
        node=node or UnfinishedFrames(1 << 20),
        frame_timeout=30.0,
        clock=clock or Clock(),
    )


def test_frames_split_anywhere_come_out_whole_and_nothing_stays_counted() -> None:
    node = UnfinishedFrames(1 << 20)
    inbound = streams(node)
    frames = [encode_frame(bytes([i]) * (100 + i)) for i in range(3)]
    wire = b"".join(frames)
    stream = inbound.stream(DATA_STREAM)
    out: list[bytes] = []
    for start in range(0, len(wire), 37):
        out += [b"".join(frame) for frame in inbound.feed(stream, [wire[start : start + 37]])]
        assert inbound.unfinished == stream.decoder.buffered == node.bytes
    assert [encode_frame(body) for body in out] == frames
    assert inbound.unfinished == node.bytes == 0


def test_the_control_stream_and_a_data_stream_are_told_apart_and_others_refused() -> None:
    inbound = streams()
    assert inbound.stream(CONTROL_STREAM_ID).is_control
    assert not inbound.stream(DATA_STREAM).is_control
    assert inbound.stream(DATA_STREAM) is inbound.streams[DATA_STREAM]
    with pytest.raises(CcoError) as refused:
        inbound.stream(4)  # a bidirectional stream other than the control stream
    assert refused.value.code is ErrorCode.PROTOCOL_VIOLATION


def test_a_connection_holding_more_than_its_bound_in_part_is_refused() -> None:
    node = UnfinishedFrames(1 << 20)
    inbound = streams(node, per_connection=2048)
    prefixes = [encode_frame(b"x" * 2000)[:1500] for _ in range(2)]
    inbound.feed(inbound.stream(DATA_STREAM), [prefixes[0]])
    with pytest.raises(CcoError) as refused:
        inbound.feed(inbound.stream(DATA_STREAM + 4), [prefixes[1]])
    assert refused.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert "unfinished_bytes_per_connection (2048)" in refused.value.detail
    inbound.release()
    assert node.bytes == inbound.unfinished == 0 and not inbound.streams


def test_the_bound_per_connection_never_refuses_one_whole_frame() -> None:
    inbound = streams(per_connection=100)  # under max_message_size: raised to it
    body = b"y" * 2000
    stream = inbound.stream(DATA_STREAM)
    assert inbound.feed(stream, [encode_frame(body)[:-1]]) == []
    assert [b"".join(frame) for frame in inbound.feed(stream, [encode_frame(body)[-1:]])] == [body]


def test_the_node_bound_counts_every_connection_together() -> None:
    node = UnfinishedFrames(3000)
    first, second = streams(node), streams(node)
    part = encode_frame(b"z" * 2000)[:1600]
    first.feed(first.stream(DATA_STREAM), [part])
    with pytest.raises(CcoError) as refused:
        second.feed(second.stream(DATA_STREAM), [part])
    assert refused.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert "unfinished_bytes (3000)" in refused.value.detail
    second.release()
    assert node.bytes == first.unfinished == first.streams[DATA_STREAM].decoder.buffered > 1500


def test_a_frame_without_progress_times_out_and_progress_moves_the_deadline() -> None:
    clock = Clock()
    inbound = streams(clock=clock)
    assert inbound.next_check() is None
    frame = encode_frame(b"w" * 1000)
    stream = inbound.stream(DATA_STREAM)
    clock.now = 5.0
    inbound.feed(stream, [frame[:10]])
    clock.now = 6.0
    assert inbound.next_check() == 35.0
    clock.now = 20.0
    inbound.feed(stream, [frame[10:20]])
    clock.now = 34.0
    assert inbound.next_check() == 50.0
    clock.now = 50.0
    with pytest.raises(CcoError) as stalled:
        inbound.next_check()
    assert stalled.value.code is ErrorCode.TIMEOUT and f"stream {DATA_STREAM} stalled" in stalled.value.detail


def test_bad_framing_is_a_decode_error_and_counts_nothing() -> None:
    node = UnfinishedFrames(1 << 20)
    inbound = streams(node)
    with pytest.raises(DecodeError):
        inbound.feed(inbound.stream(DATA_STREAM), [encode_frame(b"v" * 3000)])  # over 2048
    assert node.bytes == inbound.unfinished == 0


def test_a_finished_stream_is_forgotten() -> None:
    inbound = streams()
    inbound.stream(DATA_STREAM)
    inbound.end(DATA_STREAM)
    assert DATA_STREAM not in inbound.streams
