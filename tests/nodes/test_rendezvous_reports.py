"""What the rendezvous reports for its logs: joins and refusals with the code and the
peer, registrations, leaves and losses, epochs and trees (one Report each, as data:
the machine has no logger, the service logs them)."""

from __future__ import annotations

from rendezvous_harness import CRED, GID, Harness

from cco.nodes.events import Happening, PeerConnected, PeerDisconnected, Report
from cco.wire.errors import ErrorCode
from cco.wire.messages import Leave
from cco.wire.registries import Role


def _what(reports: list[Report]) -> list[tuple[Happening, str, int | None, int | None, ErrorCode]]:
    return [(r.what, r.node_id, r.rank, r.epoch, r.code) for r in reports]


def test_a_group_forming_reports_registration_joins_and_its_tree() -> None:
    h = Harness()
    h.aggregator("agg-0", capacity=1)
    for peer in ("e0", "e1", "e2", "e3"):
        h.endpoint(peer)
    assert _what(h.reports) == [
        (Happening.REGISTERED, "agg-0", None, None, ErrorCode.NO_ERROR),
        *((Happening.JOINED, f"e{r}", r, 1, ErrorCode.NO_ERROR) for r in range(4)),
        (Happening.TREE, "", None, 1, ErrorCode.NO_ERROR),
    ]
    assert "agg-0.test:4000, capacity 1" in h.reports[0].detail
    assert h.reports[-1].group_id == GID
    assert h.reports[-1].detail.startswith("agg-0 <- [e0, e1, e2, e3]")


def test_refusals_name_the_peer_and_the_code() -> None:
    h = Harness()
    h.endpoint("e0", credential=CRED + b"x")
    h.endpoint("e1", world_size=5)
    h.feed(PeerConnected("rv2", "rv2", Role.RENDEZVOUS))
    assert _what(h.reports) == [
        (Happening.JOIN_REJECTED, "e0", None, None, ErrorCode.BAD_CREDENTIAL),
        (Happening.JOIN_REJECTED, "e1", None, None, ErrorCode.WORLD_SIZE_MISMATCH),
        (Happening.REFUSED, "rv2", None, None, ErrorCode.UNAUTHORIZED),
    ]
    assert h.reports[0].group_id == GID and "credential" in h.reports[0].detail


def test_a_leave_and_a_loss_end_epochs_with_their_reasons() -> None:
    h = Harness()
    h.aggregator("agg-0", capacity=1)
    for peer in ("e0", "e1", "e2", "e3"):
        h.endpoint(peer)
    h.reports.clear()
    h.send("e3", Leave(group_id=GID, rank=3, code=ErrorCode.NO_ERROR))
    h.feed(PeerDisconnected("e2", ErrorCode.PEER_LOST))
    assert _what(h.reports) == [
        (Happening.LEFT, "e3", 3, 1, ErrorCode.NO_ERROR),
        (Happening.EPOCH, "", None, 2, ErrorCode.NO_ERROR),
        (Happening.TREE, "", None, 2, ErrorCode.NO_ERROR),
        (Happening.LOST, "e2", 2, 2, ErrorCode.PEER_LOST),
        (Happening.EPOCH, "", None, 3, ErrorCode.PEER_LOST),
        (Happening.TREE, "", None, 3, ErrorCode.NO_ERROR),
    ]
    assert h.reports[-2].detail == "members [0, 1]"
    h.reports.clear()
    h.feed(PeerDisconnected("agg-0", ErrorCode.PEER_LOST))
    assert [(r.what, r.node_id) for r in h.reports[:2]] == [(Happening.LOST, "agg-0"), (Happening.EPOCH, "")]
    assert h.reports[-1].what is Happening.WAITING
