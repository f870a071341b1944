"""A rendezvous's status as the wire and the status tool have it: a group's
aggregators excluded by Reports travel in its GroupView, oldest first, and are shown
to the operator; a group without exclusions leaves the field out."""

from __future__ import annotations

from typing import Any

from cco.nodes.rendezvous_config import DEFAULT_PARAMS
from cco.nodes.rendezvous_states import GroupState, MemberState
from cco.nodes.rendezvous_status import GroupStatus, MemberStatus, RendezvousStatus
from cco.services.status import rendezvous_groups, reply_json
from cco.status_cli import reply_text
from cco.wire import cbor
from cco.wire.messages import StatusReply, decode_message, encode_message
from cco.wire.registries import Role

GROUP = bytes.fromhex("5a" * 16)


def status(excluded: tuple[str, ...]) -> RendezvousStatus:
    members = tuple(
        MemberStatus(rank=rank, node_id=f"ep-{rank}", state=MemberState.ASSIGNED, labels=())
        for rank in range(2)
    )
    group = GroupStatus(
        group_id=GROUP,
        state=GroupState.WAITING,
        epoch=3,
        world_size=2,
        max_fan_in=16,
        params=DEFAULT_PARAMS,
        members=members,
        tree=None,
        excluded=excluded,
    )
    return RendezvousStatus(groups=(group,), aggregators=(), peers=2)


def reply(excluded: tuple[str, ...]) -> StatusReply:
    groups, aggregators = rendezvous_groups(status(excluded))
    sent = StatusReply(
        role=Role.RENDEZVOUS,
        node_id="rendezvous",
        uptime_ms=1000,
        groups=tuple(groups),
        aggregators=tuple(aggregators),
        records=(),
        omitted=0,
    )
    received = decode_message(encode_message(sent))
    assert isinstance(received, StatusReply)
    return received


def wire_group(message: StatusReply) -> dict[Any, Any]:
    """The CBOR map of the reply's first GroupView (the StatusReply's key 4)."""
    raw = cbor.decode(encode_message(message))
    assert isinstance(raw, list)
    body = raw[1]
    assert isinstance(body, dict)
    groups = body[4]
    assert isinstance(groups, list) and isinstance(groups[0], dict)
    return dict(groups[0])


def test_excluded_aggregators_travel_oldest_first_and_are_shown() -> None:
    received = reply(("agg-1", "agg-0"))
    assert received.groups[0].excluded == ("agg-1", "agg-0")
    assert wire_group(received)[7] == ["agg-1", "agg-0"]
    assert reply_json(received)["groups"][0]["excluded"] == ["agg-1", "agg-0"]
    assert "  excluded after Reports of tampering: agg-1, agg-0" in reply_text(received).splitlines()


def test_a_group_without_exclusions_leaves_the_field_out() -> None:
    received = reply(())
    assert received.groups[0].excluded is None
    assert 7 not in wire_group(received)
    assert reply_json(received)["groups"][0]["excluded"] == []
    assert "excluded" not in reply_text(received)
