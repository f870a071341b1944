"""Tree planning (cco.nodes.tree): shape rules, bounds, capacity, determinism.

Draft section "Tree Planning" states the rules these tests check.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cco.nodes.tree import (
    ENDPOINT_ADDRESS,
    AggregatorInfo,
    MemberInfo,
    PlanStrategy,
    TreePlan,
    fan_in_bound,
    plan_tree,
)
from cco.wire.errors import CcoError, ErrorCode
from cco.wire.fields import bitmap_from_ranks, ranks_from_bitmap
from cco.wire.messages import Address


def agg(name: str, *labels: str, capacity: int = 1, fan_in: int = 64, port: int = 4000) -> AggregatorInfo:
    return AggregatorInfo(
        node_id=name, address=Address(host=f"{name}.test", port=port), capacity=capacity,
        max_fan_in=fan_in, labels=labels,
    )  # fmt: skip


def racks(count: int, per_rack: int) -> dict[int, MemberInfo]:
    return {r: MemberInfo(f"ep-{r}", (f"rack={r // per_rack}",)) for r in range(count * per_rack)}


def check_plan(
    plan: TreePlan, members: dict[int, MemberInfo], aggregators: list[AggregatorInfo], bound: int
) -> None:
    """Every structural promise of a plan, independent of how it was built."""
    info = {a.node_id: a for a in aggregators}
    ids = [p.node_id for p in plan.aggregators]
    assert len(ids) == len(set(ids)), "an aggregator holds one place per group"
    assert all(info[i].capacity >= 1 for i in ids), "only aggregators with spare capacity"
    assert plan.root.parent is None and plan.root.depth == 0
    assert sum(p.parent is None for p in plan.aggregators) == 1, "exactly one root"
    placements = {p.node_id: p for p in plan.aggregators}
    leaves_of: dict[int, list[str]] = {}
    for p in plan.aggregators:
        assert p.node.address == info[p.node_id].address
        assert 1 <= len(p.children) <= fan_in_bound(info[p.node_id], bound), "fan-in bound"
        union: set[int] = set()
        for child in p.children:
            ranks = ranks_from_bitmap(child.ranks)
            assert not union & ranks, "children's rank sets are disjoint"
            union |= ranks
            if child.node_id in placements:
                assert placements[child.node_id].parent == p.node
                assert placements[child.node_id].depth == p.depth + 1
                assert child == placements[child.node_id].node
            else:
                (rank,) = ranks
                assert members[rank].node_id == child.node_id
                assert child.address == ENDPOINT_ADDRESS
                leaves_of.setdefault(rank, []).append(p.node_id)
        assert union == ranks_from_bitmap(p.expected), "expected is the union of the children"
        if p.parent is not None:
            assert p.parent == placements[p.parent.node_id].node
    assert ranks_from_bitmap(plan.root.expected) == set(members)
    assert all(len(leaves) == 1 for leaves in leaves_of.values())
    assert set(leaves_of) == set(members), "every member sits in exactly one leaf"
    assert [r for r, _ in plan.endpoint_parents] == sorted(members)
    for rank, parent in plan.endpoint_parents:
        assert parent == placements[leaves_of[rank][0]].node


def endpoint_slots(aggregators: list[AggregatorInfo], bound: int) -> int:
    """How many endpoints all usable aggregators together can hold in one tree."""
    usable = [a for a in aggregators if a.capacity >= 1]
    return sum(fan_in_bound(a, bound) - 1 for a in usable) + 1 if usable else 0


def test_racks_get_local_leaves_under_a_spine() -> None:
    members = racks(4, 4)
    aggregators = [agg(f"tor-{i}", f"rack={i}") for i in range(4)] + [agg("spine")]
    plan = plan_tree(members, aggregators, group_bound=4)
    check_plan(plan, members, aggregators, 4)
    assert plan.strategy is PlanStrategy.LOCAL
    assert plan.root.node_id == "spine" and plan.depth == 2
    for i in range(4):
        leaf = plan.placement(f"tor-{i}")
        assert ranks_from_bitmap(leaf.expected) == set(range(4 * i, 4 * i + 4))
        assert leaf.parent is not None and leaf.parent.node_id == "spine"
    assert plan.parent_of(5).node_id == "tor-1"


def test_better_than_prefers_tier_then_depth_then_locality() -> None:
    two_racks = racks(2, 2)
    local = plan_tree(two_racks, [agg("tor-0", "rack=0"), agg("tor-1", "rack=1"), agg("spine")], 2)
    packed = plan_tree(two_racks, [agg("big")], 4)
    assert (local.strategy, local.depth, local.locality) == (PlanStrategy.LOCAL, 2, 4)
    assert (packed.strategy, packed.depth) == (PlanStrategy.PACKED, 1)
    assert local.better_than(packed) and not packed.better_than(local)
    one_rack = {r: MemberInfo(f"ep-{r}", ("rack=0",)) for r in range(4)}
    deep = plan_tree(one_rack, [agg("a", fan_in=2), agg("b", fan_in=2), agg("c", fan_in=2)], 4)
    shallow = plan_tree(one_rack, [agg("big", fan_in=4)], 4)
    labelled = plan_tree(one_rack, [agg("tor", "rack=0", fan_in=4)], 4)
    compact = plan_tree(one_rack, [agg("a", fan_in=2), agg("b", fan_in=3)], 4)
    assert (deep.depth, shallow.depth, labelled.locality) == (2, 1, 4)
    assert compact.strategy is PlanStrategy.COMPACT
    assert deep.better_than(compact) and shallow.better_than(deep) and labelled.better_than(shallow)
    assert not shallow.better_than(shallow) and not shallow.better_than(labelled)


def test_labels_not_names_choose_the_leaf() -> None:
    """An unlabelled aggregator is preferred over one labelled for another location."""
    members = {0: MemberInfo("a", ("rack=x",)), 1: MemberInfo("b", ("rack=y",))}
    aggregators = [agg("agg-0", "rack=y"), agg("agg-1", "rack=x"), agg("agg-2")]
    plan = plan_tree(members, aggregators, group_bound=4)
    assert plan.parent_of(0).node_id == "agg-1"
    assert plan.parent_of(1).node_id == "agg-0"
    assert plan.root.node_id == "agg-2"


def test_spare_capacity_breaks_ties_between_otherwise_equal_aggregators() -> None:
    """Alike aggregators (workers of one host): the one with the most room left, then the id."""
    members = {r: MemberInfo(f"ep-{r}") for r in range(2)}
    assert plan_tree(members, [agg("w0", capacity=3), agg("w1", capacity=4)], 4).root.node_id == "w1"
    assert plan_tree(members, [agg("w0", capacity=4), agg("w1", capacity=4)], 4).root.node_id == "w0"
    # labels and cover still come first: capacity only decides among equals
    labelled = [agg("w0", "rack=0", capacity=1), agg("w1", capacity=9)]
    located = {r: MemberInfo(f"ep-{r}", ("rack=0",)) for r in range(2)}
    assert plan_tree(located, labelled, 4).root.node_id == "w0"
    narrow = [agg("w0", capacity=1, fan_in=2), agg("w1", capacity=9, fan_in=2), agg("w2", capacity=1)]
    assert plan_tree({r: MemberInfo(f"ep-{r}") for r in range(3)}, narrow, 4).root.node_id == "w2"


def test_compact_prefers_spare_capacity_among_equal_bounds() -> None:
    """Four aggregators of bound 3 hold 9 endpoints; the tenth needs one of the two of bound 2."""
    members = {r: MemberInfo(f"ep-{r}") for r in range(10)}
    wide = [agg(f"w{i}", capacity=2, fan_in=3) for i in range(4)]
    aggregators = [*wide, agg("x0", capacity=1, fan_in=2), agg("x1", capacity=2, fan_in=2)]
    plan = plan_tree(members, aggregators, 3)
    check_plan(plan, members, aggregators, 3)
    assert plan.strategy is PlanStrategy.COMPACT
    assert plan.aggregator_ids == {"w0", "w1", "w2", "w3", "x1"}


def test_a_plan_on_other_aggregators_is_not_better() -> None:
    """Spreading never moves a group: picking another aggregator alone is no reason for an epoch."""
    members = {r: MemberInfo(f"ep-{r}") for r in range(2)}
    on_w0 = plan_tree(members, [agg("w0", capacity=1), agg("w1", capacity=1)], 4)
    on_w1 = plan_tree(members, [agg("w0", capacity=1), agg("w1", capacity=2)], 4)
    assert (on_w0.root.node_id, on_w1.root.node_id) == ("w0", "w1")
    assert not on_w0.better_than(on_w1) and not on_w1.better_than(on_w0)


def test_several_levels_when_the_bound_is_small() -> None:
    members = {r: MemberInfo(f"ep-{r}") for r in range(64)}
    aggregators = [agg(f"agg-{i:02d}") for i in range(30)]
    plan = plan_tree(members, aggregators, group_bound=4)
    check_plan(plan, members, aggregators, 4)
    assert plan.depth == 3
    assert len(plan.aggregators) == 16 + 4 + 1


def test_a_lone_node_is_carried_up_not_given_its_own_parent() -> None:
    members = {r: MemberInfo(f"ep-{r}") for r in range(10)}
    aggregators = [agg(f"agg-{i}") for i in range(10)]
    plan = plan_tree(members, aggregators, group_bound=2)
    check_plan(plan, members, aggregators, 2)
    # 5 leaves; 2 parents take 4 of them, the fifth joins the level above.
    assert all(len(p.children) == 2 for p in plan.aggregators)
    assert len(plan.aggregators) == 9


def test_aggregator_max_fan_in_is_respected_below_the_group_bound() -> None:
    members = {r: MemberInfo(f"ep-{r}") for r in range(6)}
    aggregators = [agg("small", fan_in=2), agg("big", fan_in=8)]
    plan = plan_tree(members, aggregators, group_bound=16)
    check_plan(plan, members, aggregators, 16)
    assert plan.root.node_id == "big" and len(plan.root.children) == 6


def test_packed_tier_mixes_locations_when_local_leaves_do_not_fit() -> None:
    members = racks(4, 4)
    aggregators = [agg(f"tor-{i}", f"rack={i}") for i in range(3)]
    plan = plan_tree(members, aggregators, group_bound=8)
    check_plan(plan, members, aggregators, 8)
    assert plan.strategy is PlanStrategy.PACKED


def test_compact_tier_mixes_endpoints_and_aggregators() -> None:
    members = {r: MemberInfo(f"ep-{r}") for r in range(6)}
    aggregators = [agg("agg-a"), agg("agg-b")]
    plan = plan_tree(members, aggregators, group_bound=4)
    check_plan(plan, members, aggregators, 4)
    assert plan.strategy is PlanStrategy.COMPACT
    assert plan.root.node_id == "agg-a"
    assert [c.node_id for c in plan.root.children] == ["agg-b", "ep-4", "ep-5"]
    assert ranks_from_bitmap(plan.placement("agg-b").expected) == {0, 1, 2, 3}


def test_compact_picks_the_largest_bounds() -> None:
    """Layered needs five aggregators here; three with bound 4 hold 4 + 3 + 3 = 10 endpoints."""
    members = {r: MemberInfo(f"ep-{r}") for r in range(9)}
    aggregators = [agg("a", fan_in=4), agg("b", fan_in=4), agg("c", fan_in=4), agg("d", fan_in=2)]
    plan = plan_tree(members, aggregators, group_bound=8)
    check_plan(plan, members, aggregators, 8)
    assert plan.strategy is PlanStrategy.COMPACT
    assert plan.aggregator_ids == {"a", "b", "c"}


def test_no_room_means_no_aggregator_error_never_over_subscription() -> None:
    members = {r: MemberInfo(f"ep-{r}") for r in range(8)}
    aggregators = [agg("a", fan_in=4), agg("b", fan_in=4), agg("full", capacity=0, fan_in=64)]
    with pytest.raises(CcoError) as info:
        plan_tree(members, aggregators, group_bound=4)
    assert info.value.code is ErrorCode.NO_AGGREGATOR
    with pytest.raises(CcoError):
        plan_tree(members, [], group_bound=4)


def test_zero_capacity_aggregators_are_never_used() -> None:
    members = {r: MemberInfo(f"ep-{r}") for r in range(3)}
    aggregators = [agg("a", capacity=0), agg("b", capacity=2)]
    plan = plan_tree(members, aggregators, group_bound=4)
    assert plan.aggregator_ids == {"b"}


def test_single_member_single_aggregator() -> None:
    members = {0: MemberInfo("solo")}
    plan = plan_tree(members, [agg("a")], group_bound=2)
    assert plan.root.children[0].ranks == bitmap_from_ranks([0])
    assert plan.depth == 1


def test_invalid_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        plan_tree({0: MemberInfo("x")}, [agg("a")], group_bound=1)
    with pytest.raises(ValueError):
        plan_tree({}, [agg("a")], group_bound=4)
    with pytest.raises(ValueError):
        plan_tree({0: MemberInfo("x")}, [agg("a"), agg("a")], group_bound=4)


@st.composite
def planning_inputs(draw: st.DrawFn) -> tuple[dict[int, MemberInfo], list[AggregatorInfo], int]:
    label = st.sampled_from(["rack=0", "rack=1", "rack=2", "pod=a"])
    count = draw(st.integers(1, 60))
    ranks = draw(st.lists(st.integers(0, 200), min_size=count, max_size=count, unique=True))
    members = {r: MemberInfo(f"ep-{r}", tuple(draw(st.lists(label, max_size=2)))) for r in ranks}
    aggregators = [
        agg(
            f"agg-{i}",
            *draw(st.lists(label, max_size=2)),
            capacity=draw(st.integers(0, 3)),
            fan_in=draw(st.integers(2, 10)),
            port=4000 + i,
        )
        for i in range(draw(st.integers(0, 25)))
    ]
    return members, aggregators, draw(st.integers(2, 12))


@settings(max_examples=200, deadline=None)
@given(planning_inputs(), st.randoms(use_true_random=False))
def test_any_input_gives_a_valid_deterministic_plan_or_waits(
    inputs: tuple[dict[int, MemberInfo], list[AggregatorInfo], int], rnd: random.Random
) -> None:
    members, aggregators, bound = inputs
    try:
        plan = plan_tree(members, aggregators, bound)
    except CcoError as exc:
        assert exc.code is ErrorCode.NO_AGGREGATOR
        assert endpoint_slots(aggregators, bound) < len(members), "waits only when nothing can fit"
        return
    check_plan(plan, members, aggregators, bound)
    shuffled_members = dict(rnd.sample(sorted(members.items()), len(members)))
    shuffled_aggregators = rnd.sample(aggregators, len(aggregators))
    assert plan_tree(shuffled_members, shuffled_aggregators, bound) == plan, "deterministic"
