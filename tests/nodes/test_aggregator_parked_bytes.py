"""Parked chunks (data ahead of its group's TreeAssignment) are bounded in bytes, per
peer and for the whole aggregator (issue 41): a chunk past either bound is refused
at once with RESOURCE_EXHAUSTED naming the bound, and what was parked is freed as
it is placed, expires or its peer goes."""

from __future__ import annotations

from aggregator_rig import ADDRESS, OTHER, Rig, assignment, chunk, errors, sent

from cco.nodes.aggregator import AggregatorConfig, AggregatorMachine
from cco.nodes.aggregator_pending import payload_size
from cco.nodes.events import Command, PeerDisconnected
from cco.wire.errors import ErrorCode
from cco.wire.messages import Error

SIZE = payload_size(chunk(0))


def rig(per_peer_chunks: int, node_chunks: int) -> Rig:
    config = AggregatorConfig(
        address=ADDRESS,
        pending_timeout=2.0,
        parked_bytes_per_peer=per_peer_chunks * SIZE,
        parked_bytes=node_chunks * SIZE,
    )
    r = Rig(AggregatorMachine(config))
    r.register()
    r.connect("ep0", "ep1", "ep2")
    return r


def refusal(commands: list[Command], peer: str) -> str:
    (error,) = sent(commands, peer, Error)
    assert error.code is ErrorCode.RESOURCE_EXHAUSTED
    return error.detail


def test_a_peer_parks_at_most_parked_bytes_per_peer() -> None:
    r = rig(per_peer_chunks=2, node_chunks=10)
    assert r.send("ep0", chunk(0, op_id=0)) == []
    assert r.send("ep0", chunk(0, op_id=1)) == []
    assert "parked_bytes_per_peer" in refusal(r.send("ep0", chunk(0, op_id=2)), "ep0")
    assert r.machine.pending_bytes == 2 * SIZE, "a refused chunk is not kept"
    assert r.send("ep1", chunk(1, op_id=0)) == [], "another peer's bound is its own"


def test_all_peers_together_park_at_most_parked_bytes() -> None:
    r = rig(per_peer_chunks=2, node_chunks=3)
    r.send("ep0", chunk(0, op_id=0))
    r.send("ep0", chunk(0, op_id=1))
    assert r.send("ep1", chunk(1, op_id=0)) == []
    assert "limit parked_bytes (" in refusal(r.send("ep1", chunk(1, op_id=1)), "ep1")
    assert errors(r.send("ep2", chunk(2, op_id=0))) == [ErrorCode.RESOURCE_EXHAUSTED]


def test_parked_bytes_come_back_when_placed_expired_or_their_peer_goes() -> None:
    r = rig(per_peer_chunks=2, node_chunks=3)
    r.send("ep0", chunk(0, op_id=0))
    r.send("ep1", chunk(1, group=OTHER, op_id=0))
    r.send("ep2", chunk(2, group=OTHER, op_id=1))
    r.rendezvous(assignment({"ep0": [0], "ep1": [1]}))  # ep0's chunk is placed
    assert r.machine.pending_bytes == 2 * SIZE
    r.feed(PeerDisconnected(peer="ep2", code=ErrorCode.PEER_LOST, detail="gone"))
    assert r.machine.pending_bytes == SIZE, "what a peer parked goes with it"
    r.timer(2.5)  # what is left expires
    assert r.machine.pending_bytes == 0
    r.connect("ep2")
    for peer in ("ep0", "ep1", "ep2"):  # and every bound is free again
        assert r.send(peer, chunk(int(peer[-1]), group=OTHER, op_id=5)) == []
