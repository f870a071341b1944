"""A member's Report of tampering at the rendezvous: whether it stands, and which
aggregators it takes out of its group's trees (draft section "Reports of Tampering").

A Report stands only if it comes from a connection that holds a rank of the group,
names the group's current epoch, which has a tree, and names as parent the
aggregator that tree gives that rank; anything else is refused with the code of the
first check that fails, and excludes nothing.  The endpoint cannot tell which hop
changed the data, so a Report that stands excludes the whole path from the rank's
leaf aggregator to the root.  Exclusions are the group's own, oldest first and at
most ``exclusions_per_group`` of them: a member can take aggregators out of its own
group's trees (as it could stall them by failing every operation), never out of
another group's.
"""

from __future__ import annotations

from cco.nodes.events import PeerId
from cco.nodes.rendezvous_records import GroupRecord
from cco.nodes.rendezvous_states import GroupState
from cco.nodes.tree import TreePlan
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.messages import Report


def reporting_rank(group: GroupRecord | None, peer: PeerId, report: Report) -> int:
    """The rank that sent ``report`` if it stands; else the CcoError to answer it with."""
    if group is None:
        raise CcoError(ErrorCode.UNKNOWN_GROUP, "no such group")
    ranks = [rank for rank, member in group.members.items() if member.peer == peer]
    if not ranks:
        raise CcoError(ErrorCode.NOT_A_MEMBER, f"not a member of group {group.group_id.hex()}")
    if report.epoch != group.epoch:
        raise CcoError(
            ErrorCode.STALE_EPOCH,
            f"epoch {report.epoch} is not the group's current epoch {group.epoch} "
            f"(it changed with {group.change_code.name})",
        )
    if group.state is not GroupState.ACTIVE or group.plan is None:
        raise CcoError(ErrorCode.STALE_EPOCH, f"epoch {report.epoch} has no tree")
    (rank,) = ranks
    leaf = group.plan.parent_of(rank).node_id
    if report.parent != leaf:
        raise CcoError(
            ErrorCode.UNAUTHORIZED,
            f"rank {rank} may report only its own parent, {leaf} in epoch {group.epoch}, not {report.parent}",
        )
    return rank


def path_to_root(plan: TreePlan, rank: int) -> list[str]:
    """The aggregators between ``rank`` and the root of ``plan``, leaf first."""
    path = [plan.parent_of(rank).node_id]
    while (parent := plan.placement(path[-1]).parent) is not None:
        path.append(parent.node_id)
    return path


def exclude(group: GroupRecord, node_ids: list[str], limit: int) -> list[str]:
    """Exclude ``node_ids`` from ``group``'s trees, keeping its ``limit`` newest
    exclusions; returns those that are new."""
    new = [node_id for node_id in node_ids if node_id not in group.excluded]
    group.excluded.extend(new)
    del group.excluded[: max(0, len(group.excluded) - limit)]
    return new
