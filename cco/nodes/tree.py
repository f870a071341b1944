"""Aggregation-tree planning: a pure function from a group and its aggregators to a tree.

The rendezvous calls :func:`plan_tree` whenever a group's membership or the set of
aggregators changes (draft section "Tree Planning").  Planning is a pure function:
no clock, no randomness, no I/O, and the same inputs always give the same plan, so
a re-plan that would change nothing is recognised by comparing plans.

Rules, in the order the planner applies them:

* The *bound* of aggregator ``a`` is ``min(group fan-in bound, a.max_fan_in)``; no
  node ever has more children than its bound.
* An aggregator holds at most one place in one group's tree, and only aggregators
  with ``capacity >= 1`` are used.  ``capacity`` here is what is left *for this
  group*: the caller subtracts the groups an aggregator already serves, so a plan
  never over-subscribes an aggregator.
* Tier ``LOCAL``: endpoints are ordered by *location* (their sorted labels) and
  rank; each location is cut into leaves of its own, and every leaf goes to the
  aggregator sharing the most labels with that location (then the one with the
  fewest other labels, then the largest *cover* -- the smaller of its bound and
  the number of nodes still to place -- then the most spare capacity, then the
  smallest node id).  Upper levels order the nodes below by location and pack
  them into parents, each parent being the aggregator with the largest cover
  (fewest levels), then label affinity, then spare capacity.  Preferring spare
  capacity spreads groups over aggregators that are otherwise alike (several
  workers of one host, say) instead of stacking every group on the first by
  id.  A lone node left over at the end of a level is carried up to the next
  level instead of getting a parent of its own.  Levels are added until one
  node, the root, remains.
* Tier ``PACKED``: the same, but leaves may mix locations (used when ``LOCAL``
  needs more aggregators than there are).
* Tier ``COMPACT``: the fewest aggregators that can hold the group, those with the
  largest bounds (then the most spare capacity): ``k`` is the smallest count
  whose bounds ``b_1..b_k`` satisfy ``sum(b_i) - (k - 1) >= members``.
  Aggregators are linked breadth-first (each takes the next ones as children, up
  to its bound) and the free child slots are filled with endpoints, starting
  from the last (deepest) aggregator.  Here an aggregator's children may mix
  endpoints and aggregators.
* If even ``COMPACT`` does not fit, :func:`plan_tree` raises ``NO_AGGREGATOR`` and
  the group waits for aggregators: the planner never exceeds a bound or a capacity
  to make a tree fit.

Endpoints accept no connections (children dial their parent), so the ``NodeRef``
of an endpoint child carries :data:`ENDPOINT_ADDRESS`, a name in the reserved
``.invalid`` domain (RFC 6761) that nothing ever dials.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks
from cco.wire.messages import Address, NodeRef

ENDPOINT_ADDRESS = Address(host="endpoint.invalid", port=1)
"""The address in an endpoint's NodeRef: endpoints are never dialled."""

Location = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """One group member as the planner sees it."""

    node_id: str
    labels: tuple[str, ...] = ()

    @property
    def location(self) -> Location:
        return tuple(sorted(set(self.labels)))


@dataclass(frozen=True, slots=True)
class AggregatorInfo:
    """A registered aggregator; ``capacity`` is the number of groups it can still take."""

    node_id: str
    address: Address
    capacity: int
    max_fan_in: int
    labels: tuple[str, ...] = ()

    @property
    def location(self) -> Location:
        return tuple(sorted(set(self.labels)))


class PlanStrategy(Enum):
    """Which tier of the rules produced a plan (best first)."""

    LOCAL = "local"
    PACKED = "packed"
    COMPACT = "compact"


@dataclass(frozen=True, slots=True)
class AggregatorPlacement:
    """One aggregator's place in the tree: what its TreeAssignment will say.

    ``node.ranks`` is the set of ranks below it, which is also its ``expected``
    bitmap; ``depth`` is 0 for the root.
    """

    node: NodeRef
    parent: NodeRef | None
    children: tuple[NodeRef, ...]
    depth: int

    @property
    def node_id(self) -> str:
        return self.node.node_id

    @property
    def expected(self) -> bytes:
        return self.node.ranks


@dataclass(frozen=True, slots=True)
class TreePlan:
    """A group's tree: aggregators root first (breadth-first), endpoints by rank.

    ``locality`` counts, over all endpoints, the labels an endpoint shares with
    its leaf aggregator: the higher, the more traffic stays local.
    """

    strategy: PlanStrategy
    aggregators: tuple[AggregatorPlacement, ...]
    endpoint_parents: tuple[tuple[int, NodeRef], ...]
    locality: int

    @property
    def root(self) -> AggregatorPlacement:
        return self.aggregators[0]

    @property
    def aggregator_ids(self) -> frozenset[str]:
        return frozenset(p.node_id for p in self.aggregators)

    @property
    def depth(self) -> int:
        """Aggregator levels between an endpoint and the root, at the deepest point."""
        return 1 + max(p.depth for p in self.aggregators)

    def better_than(self, other: TreePlan) -> bool:
        """A better tier, else fewer levels, else more locality: worth a new epoch.

        A plan that differs from the current one only in which aggregators it
        picks is not better, so a re-plan does not disturb a group for nothing.
        """
        tiers = list(PlanStrategy)

        def key(plan: TreePlan) -> tuple[int, int, int]:
            return (tiers.index(plan.strategy), plan.depth, -plan.locality)

        return key(self) < key(other)

    def placement(self, node_id: str) -> AggregatorPlacement:
        for p in self.aggregators:
            if p.node_id == node_id:
                return p
        raise KeyError(node_id)

    def parent_of(self, rank: int) -> NodeRef:
        for r, ref in self.endpoint_parents:
            if r == rank:
                return ref
        raise KeyError(rank)

    def describe(self) -> str:
        """One line for the logs: each aggregator, root first, with its children, then
        the strategy."""
        levels = "; ".join(
            f"{p.node_id} <- [{', '.join(c.node_id for c in p.children)}]" for p in self.aggregators
        )
        return f"{levels} ({self.strategy.value}, depth {self.depth})"


def fan_in_bound(aggregator: AggregatorInfo, group_bound: int) -> int:
    return min(group_bound, aggregator.max_fan_in)


def plan_tree(
    members: Mapping[int, MemberInfo], aggregators: Iterable[AggregatorInfo], group_bound: int
) -> TreePlan:
    """The tree for ``members`` over ``aggregators``; raises CcoError(NO_AGGREGATOR) if none fits."""
    if group_bound < 2:
        raise ValueError(f"group fan-in bound {group_bound} is below 2")
    if not members:
        raise ValueError("a tree needs at least one member")
    pool = sorted((a for a in aggregators if a.capacity >= 1), key=lambda a: a.node_id)
    if len({a.node_id for a in pool}) != len(pool):
        raise ValueError("aggregator node ids are not unique")
    endpoints = sorted(members, key=lambda r: (members[r].location, r))
    for strategy in (PlanStrategy.LOCAL, PlanStrategy.PACKED):
        shape = _layered(endpoints, members, pool, group_bound, strategy is PlanStrategy.LOCAL)
        if shape is not None:
            return _finish(strategy, shape, members, pool)
    shape = _compact(endpoints, pool, group_bound)
    if shape is not None:
        return _finish(PlanStrategy.COMPACT, shape, members, pool)
    slots = sum(fan_in_bound(a, group_bound) - 1 for a in pool) + 1 if pool else 0
    raise CcoError(
        ErrorCode.NO_AGGREGATOR,
        f"{len(members)} members need more room than {len(pool)} available aggregators "
        f"offer ({slots} endpoint slots at fan-in bound {group_bound})",
    )


# --- construction ----------------------------------------------------------------

# A child is ("e", rank) or ("a", node_id); a shape maps an aggregator to its children.
_Child = tuple[str, int | str]
_Shape = dict[str, list[_Child]]


@dataclass(slots=True)
class _Sub:
    """A subtree that still needs a parent while a level is being built."""

    child: _Child
    location: Location
    first_rank: int


def _pick(
    pool: list[AggregatorInfo], location: Location, want: int, bound: int, cover_first: bool
) -> AggregatorInfo | None:
    """Remove and return the best aggregator for ``want`` nodes at ``location``."""
    if not pool:
        return None

    def key(a: AggregatorInfo) -> tuple[int, int, int, int, str]:
        shared = len(set(a.labels) & set(location))
        other = len(set(a.labels)) - shared
        cover = min(fan_in_bound(a, bound), want)
        if cover_first:
            return (-cover, -shared, other, -a.capacity, a.node_id)
        return (-shared, other, -cover, -a.capacity, a.node_id)

    best = min(pool, key=key)
    pool.remove(best)
    return best


def _layered(
    endpoints: Sequence[int],
    members: Mapping[int, MemberInfo],
    aggregators: Sequence[AggregatorInfo],
    bound: int,
    keep_locations: bool,
) -> _Shape | None:
    pool = list(aggregators)
    shape: _Shape = {}
    level: list[_Sub] = []
    runs: list[list[int]] = [[]]
    for rank in endpoints:
        if keep_locations and runs[-1] and members[runs[-1][0]].location != members[rank].location:
            runs.append([])
        runs[-1].append(rank)
    for run in runs:
        while run:
            agg = _pick(pool, members[run[0]].location, len(run), bound, cover_first=False)
            if agg is None:
                return None
            leaf, run = run[: fan_in_bound(agg, bound)], run[fan_in_bound(agg, bound) :]
            shape[agg.node_id] = [("e", r) for r in leaf]
            level.append(_Sub(("a", agg.node_id), agg.location, min(leaf)))
    while len(level) > 1:
        level.sort(key=lambda s: (s.location, s.first_rank))
        above: list[_Sub] = []
        while level:
            if len(level) == 1 and above:
                above.append(level.pop())
                break
            agg = _pick(pool, level[0].location, len(level), bound, cover_first=True)
            if agg is None:
                return None
            group, level = level[: fan_in_bound(agg, bound)], level[fan_in_bound(agg, bound) :]
            shape[agg.node_id] = [s.child for s in group]
            above.append(_Sub(("a", agg.node_id), agg.location, min(s.first_rank for s in group)))
        level = above
    return shape


def _compact(endpoints: Sequence[int], aggregators: Sequence[AggregatorInfo], bound: int) -> _Shape | None:
    ordered = sorted(aggregators, key=lambda a: (-fan_in_bound(a, bound), -a.capacity, a.node_id))
    bounds = [fan_in_bound(a, bound) for a in ordered]
    if not ordered:
        return None
    k, slots = 1, bounds[0]
    while slots < len(endpoints):
        if k == len(ordered):
            return None
        slots += bounds[k] - 1
        k += 1
    chosen, bounds = ordered[:k], bounds[:k]
    shape: _Shape = {a.node_id: [] for a in chosen}
    next_index = 1
    for i, agg in enumerate(chosen):
        count = min(bounds[i], k - next_index)
        shape[agg.node_id] = [("a", chosen[j].node_id) for j in range(next_index, next_index + count)]
        next_index += count
    remaining = list(endpoints)
    for i in reversed(range(k)):
        room = bounds[i] - len(shape[chosen[i].node_id])
        placed, remaining = remaining[:room], remaining[room:]
        shape[chosen[i].node_id].extend(("e", r) for r in placed)
    return shape


def _finish(
    strategy: PlanStrategy, shape: _Shape, members: Mapping[int, MemberInfo], pool: Sequence[AggregatorInfo]
) -> TreePlan:
    """Turn a shape into NodeRefs: subtree rank sets, parents, breadth-first order."""
    info = {a.node_id: a for a in pool}
    parent_of: dict[str, str] = {}
    for node_id, children in shape.items():
        for kind, ident in children:
            if kind == "a":
                parent_of[str(ident)] = node_id
    (root,) = [n for n in shape if n not in parent_of]
    order = [root]
    for node_id in order:
        order.extend(str(i) for k, i in shape[node_id] if k == "a")
    ranks: dict[str, frozenset[int]] = {}
    for node_id in reversed(order):
        below: set[int] = set()
        for kind, ident in shape[node_id]:
            below |= {int(ident)} if kind == "e" else ranks[str(ident)]
        ranks[node_id] = frozenset(below)
    refs = {n: NodeRef(node_id=n, address=info[n].address, ranks=bitmap_from_ranks(ranks[n])) for n in order}

    def child_ref(child: _Child) -> NodeRef:
        kind, ident = child
        if kind == "a":
            return refs[str(ident)]
        rank = int(ident)
        return NodeRef(
            node_id=members[rank].node_id, address=ENDPOINT_ADDRESS, ranks=bitmap_from_ranks([rank])
        )

    depth = {root: 0}
    placements = []
    for n in order:
        parent = parent_of.get(n)
        if parent is not None:
            depth[n] = depth[parent] + 1
        placements.append(
            AggregatorPlacement(
                node=refs[n],
                parent=refs[parent] if parent is not None else None,
                children=tuple(child_ref(c) for c in shape[n]),
                depth=depth[n],
            )
        )
    endpoint_parents = sorted(
        (int(i), refs[n]) for n, children in shape.items() for k, i in children if k == "e"
    )
    locality = sum(len(set(members[r].labels) & set(info[ref.node_id].labels)) for r, ref in endpoint_parents)
    return TreePlan(
        strategy=strategy,
        aggregators=tuple(placements),
        endpoint_parents=tuple(endpoint_parents),
        locality=locality,
    )


__all__ = [
    "ENDPOINT_ADDRESS",
    "AggregatorInfo",
    "AggregatorPlacement",
    "MemberInfo",
    "PlanStrategy",
    "TreePlan",
    "fan_in_bound",
    "plan_tree",
]
