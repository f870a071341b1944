"""Whether a JoinRequest may take a rank in an existing group (draft, "Joining"):
the group's credential and world size, a rank still free, and chunk messages that fit
the joining node's max_message_size.  Pure checks of the group, the peer and the
request, apart from the admission limits (:mod:`cco.nodes.rendezvous_admission`),
which count what a peer and the node hold; each raises the CcoError the
JoinReject carries."""

from __future__ import annotations

import hmac

from cco.nodes.rendezvous_records import GroupRecord, PeerRecord, chunk_elements_limit
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import JoinRequest


def check_credentials(group: GroupRecord, request: JoinRequest) -> None:
    if not hmac.compare_digest(group.credential, request.credential):
        raise CcoError(ErrorCode.BAD_CREDENTIAL, "credential does not match the group's")
    if request.world_size != group.world_size:
        raise CcoError(
            ErrorCode.WORLD_SIZE_MISMATCH,
            f"group has world_size {group.world_size}, not {request.world_size}",
        )


def check_message_size(group: GroupRecord, peer: PeerRecord) -> None:
    if chunk_elements_limit(peer.capabilities, group.world_size, group.params.block_elements) < 1:
        assert peer.capabilities is not None
        raise CcoError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"a chunk message for world_size {group.world_size} exceeds max_message_size "
            f"{peer.capabilities.max_message_size}",
        )


def check_join(group: GroupRecord, peer: PeerRecord, request: JoinRequest) -> None:
    check_credentials(group, request)
    if group.group_id in peer.groups:
        raise CcoError(ErrorCode.PROTOCOL_VIOLATION, f"{peer.node_id} is already a member")
    if len(group.members) >= group.world_size:
        raise CcoError(ErrorCode.GROUP_FULL, f"all {group.world_size} ranks are taken")
    if request.rank is not None and (request.rank in group.members or request.rank >= group.world_size):
        raise CcoError(ErrorCode.RANK_UNAVAILABLE, f"rank {request.rank} is taken")
    check_message_size(group, peer)
