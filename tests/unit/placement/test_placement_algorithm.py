"""Placement choices: levels, best fit, fewest children, slices, multi-pod-set gangs."""

from __future__ import annotations

import pytest
from placement_builders import (
    BLOCK,
    GPU,
    HOST,
    RACK,
    fill,
    gang,
    make_topology,
    node_name,
)

from phalanx.placement import (
    FailureReason,
    FlavorTopology,
    GangRequest,
    PodSetPlacement,
    PodSetRequest,
    TopologyRequest,
)


def racks_of(ps: PodSetPlacement) -> set[tuple[str, ...]]:
    return {d.values[:2] for d in ps.domains}


def nodes_of(ps: PodSetPlacement) -> list[tuple[str, int]]:
    return [(d.node, d.count) for d in ps.domains]


def test_required_rack_lands_in_one_rack() -> None:
    topo = make_topology()
    result = topo.reserve(gang().required(3).obj())
    assert result.placement is not None
    ps = result.placement.pod_sets[0]
    assert len(racks_of(ps)) == 1
    assert ps.fit_level == RACK
    assert sum(d.count for d in ps.domains) == 3


def test_required_rack_fails_when_only_split_racks_have_room() -> None:
    topo = make_topology()  # 4 racks x 4 hosts
    for b in range(2):
        for r in range(2):
            fill(topo, node_name(b, r, 0), 8)  # each rack keeps 3 free hosts
    result = topo.place(gang().required(4).obj())
    assert not result.ok and result.failure is not None
    assert result.failure.reason is FailureReason.REQUIRED_LEVEL
    # The same gang preferring a rack goes into one block instead.
    preferred = topo.place(gang().preferred(4).obj())
    assert preferred.placement is not None
    ps = preferred.placement.pod_sets[0]
    assert ps.fit_level == BLOCK
    assert len(racks_of(ps)) == 2


def test_preferred_falls_back_one_level_at_a_time_then_whole_flavor() -> None:
    topo = make_topology(blocks=2, racks=2, hosts=2)
    cases = [(2, RACK), (4, BLOCK), (6, None), (8, None)]
    for count, level in cases:
        result = topo.place(gang().preferred(count).obj())
        assert result.placement is not None, count
        assert result.placement.pod_sets[0].fit_level == level, count
    assert not topo.place(gang().preferred(9).obj()).ok


def test_preferred_block_when_rack_is_too_small_prefers_lower_levels_inside() -> None:
    # Preferring a block still descends with the fewest racks: 3 pods fit one rack.
    topo = make_topology(blocks=1, racks=2, hosts=4)
    result = topo.place(gang().preferred(3, BLOCK).obj())
    assert result.placement is not None
    assert len(racks_of(result.placement.pod_sets[0])) == 1


@pytest.mark.parametrize(
    ("used_per_rack", "count", "expected_rack"),
    [
        # free hosts per rack = 4 - used; best fit = least room left that still fits.
        ({(0, 0): 0, (0, 1): 2, (1, 0): 1, (1, 1): 3}, 2, ("b0", "r1")),
        ({(0, 0): 0, (0, 1): 2, (1, 0): 1, (1, 1): 3}, 3, ("b1", "r0")),
        ({(0, 0): 0, (0, 1): 2, (1, 0): 1, (1, 1): 3}, 1, ("b1", "r1")),
        ({(0, 0): 0, (0, 1): 0, (1, 0): 0, (1, 1): 0}, 4, ("b0", "r0")),
    ],
)
def test_best_fit_picks_the_rack_with_least_room_left(
    used_per_rack: dict[tuple[int, int], int], count: int, expected_rack: tuple[str, str]
) -> None:
    topo = make_topology()
    for (b, r), used in used_per_rack.items():
        for h in range(used):
            fill(topo, node_name(b, r, h), 8)
    result = topo.place(gang().required(count).obj())
    assert result.placement is not None
    assert racks_of(result.placement.pod_sets[0]) == {expected_rack}


def test_descent_uses_fewest_hosts_and_best_fit_for_the_remainder() -> None:
    topo = make_topology(blocks=1, racks=1, hosts=4)
    fill(topo, node_name(0, 0, 0), 2)  # h0: 6 GPUs free -> 6 one-GPU pods
    fill(topo, node_name(0, 0, 1), 6)  # h1: 2 free
    fill(topo, node_name(0, 0, 2), 5)  # h2: 3 free
    # h3: 8 free. 10 pods: largest first (h3: 8), remainder 2 best fit -> h1 (exactly 2).
    result = topo.place(gang().preferred(10, gpus=1).obj())
    assert result.placement is not None
    assert nodes_of(result.placement.pod_sets[0]) == [
        (node_name(0, 0, 3), 8),
        (node_name(0, 0, 1), 2),
    ]


def test_descent_uses_fewest_racks_inside_a_block() -> None:
    topo = make_topology(blocks=1, racks=3, hosts=4)
    fill(topo, node_name(0, 0, 0), 8)  # r0: 3 free hosts
    for h in range(3):
        fill(topo, node_name(0, 1, h), 8)  # r1: 1 free host
    # r2: 4 free. 5 pods: r2 (4) + remainder 1 best fit in r1 (exactly 1), not r0.
    result = topo.place(gang().preferred(5).obj())
    assert result.placement is not None
    counts: dict[tuple[str, ...], int] = {}
    for d in result.placement.pod_sets[0].domains:
        counts[d.values[:2]] = counts.get(d.values[:2], 0) + d.count
    assert counts == {("b0", "r2"): 4, ("b0", "r1"): 1}


def test_unconstrained_packs_small_pods_onto_the_fullest_host() -> None:
    topo = make_topology(blocks=1, racks=2, hosts=2)
    fill(topo, node_name(0, 1, 1), 6)  # 2 GPUs free: the tightest fit for a 2-GPU pod
    result = topo.place(gang().pod_set(1, gpus=2).obj())
    assert result.placement is not None
    assert nodes_of(result.placement.pod_sets[0]) == [(node_name(0, 1, 1), 1)]


def test_unknown_level_is_an_invalid_request_naming_the_levels() -> None:
    topo = make_topology()
    result = topo.place(gang().required(1, "example.com/zone").obj())
    assert result.failure is not None
    assert result.failure.reason is FailureReason.INVALID_REQUEST
    assert "example.com/zone" in result.failure.message
    assert RACK in result.failure.message


@pytest.mark.parametrize(
    ("request_", "count"),
    [
        (TopologyRequest.required(RACK, slice_level=BLOCK, slice_size=2), 4),  # slice above
        (TopologyRequest.required(BLOCK, slice_level=RACK, slice_size=3), 4),  # not a divisor
        (TopologyRequest.required(BLOCK, slice_level=RACK), 4),  # size missing
        (TopologyRequest.unconstrained(slice_level="x/y", slice_size=1), 1),  # unknown level
    ],
)
def test_invalid_slice_requests(request_: TopologyRequest, count: int) -> None:
    topo = make_topology()
    g = GangRequest("ns/x", (PodSetRequest("main", count, {GPU: 8}, request_),))
    result = topo.place(g)
    assert result.failure is not None
    assert result.failure.reason is FailureReason.INVALID_REQUEST


def test_slices_keep_each_slice_inside_one_rack() -> None:
    topo = make_topology(blocks=1, racks=3, hosts=4)
    # Racks with 3, 3 and 2 free hosts: 6 pods in slices of 2 per rack must use
    # whole pairs (3 free hosts hold only one pair), so two racks can't hold 6.
    fill(topo, node_name(0, 0, 0), 8)
    fill(topo, node_name(0, 1, 0), 8)
    fill(topo, node_name(0, 2, 0), 8)
    fill(topo, node_name(0, 2, 1), 8)
    req = TopologyRequest.required(BLOCK, slice_level=RACK, slice_size=2)
    g = GangRequest("ns/s", (PodSetRequest("main", 6, {GPU: 8}, req),))
    result = topo.place(g)
    assert result.placement is not None
    domains = result.placement.pod_sets[0].domains
    pods = [d.values[:2] for d in domains for _ in range(d.count)]
    for i in range(0, 6, 2):
        assert pods[i] == pods[i + 1]
    assert len(set(pods)) == 3
    # 8 pods cannot: only 3 whole pairs exist (pods-wise 8 would fit).
    g8 = GangRequest("ns/s8", (PodSetRequest("main", 8, {GPU: 8}, req),))
    assert not topo.place(g8).ok


def test_balanced_style_unconstrained_with_rack_slices() -> None:
    topo = make_topology(blocks=1, racks=2, hosts=2)
    req = TopologyRequest.unconstrained(slice_level=RACK, slice_size=2)
    g = GangRequest("ns/b", (PodSetRequest("main", 4, {GPU: 8}, req),))
    result = topo.place(g)
    assert result.placement is not None
    assert result.placement.pod_sets[0].fit_level == BLOCK


def test_multi_pod_set_gang_is_all_or_nothing() -> None:
    topo = make_topology(blocks=1, racks=2, hosts=2)
    before = topo.free_capacity({GPU: 1}, level=HOST)
    # Leader fits, workers (5 x 8 GPUs on 4 hosts minus the leader) do not.
    g = gang("ns/lw").required(1, name="leader", gpus=1).required(4, BLOCK, name="workers").obj()
    result = topo.reserve(g)
    assert not result.ok and result.failure is not None
    assert result.failure.pod_set == "workers"
    assert not topo.is_reserved("ns/lw")
    assert topo.free_capacity({GPU: 1}, level=HOST) == before


def test_multi_pod_set_gang_sees_its_own_earlier_pod_sets() -> None:
    topo = make_topology(blocks=1, racks=2, hosts=2)
    g = gang("ns/two").required(2, name="a").required(2, name="b").obj()
    result = topo.reserve(g)
    assert result.placement is not None
    a, b = result.placement.pod_sets
    assert racks_of(a) != racks_of(b)  # 2 hosts per rack: b cannot share a's rack
    assert {d.node for d in a.domains}.isdisjoint({d.node for d in b.domains})


def test_later_pod_sets_prefer_the_domain_the_gang_already_uses() -> None:
    topo = make_topology(blocks=1, racks=2, hosts=2)
    fill(topo, node_name(0, 1, 0), 8)  # r1 has 1 free host: best fit for a lone pod
    g = gang("ns/aff").required(1, name="leader", gpus=4).required(1, name="worker", gpus=4).obj()
    result = topo.place(g)
    assert result.placement is not None
    leader, worker = result.placement.pod_sets
    assert racks_of(leader) == racks_of(worker)


def test_zero_count_pod_set_places_nothing() -> None:
    topo = make_topology()
    result = topo.place(gang().required(0).obj())
    assert result.placement is not None
    assert result.placement.pod_sets[0].domains == ()


def test_placement_is_deterministic_across_insertion_orders() -> None:
    a = make_topology()
    b = FlavorTopology(name="gpu", levels=a.levels)
    from placement_builders import make_node

    for bl in reversed(range(2)):
        for r in reversed(range(2)):
            for h in reversed(range(4)):
                b.upsert_node(make_node(bl, r, h))
    g = gang().preferred(6, gpus=4).obj()
    ra, rb = a.place(g), b.place(g)
    assert ra.placement == rb.placement
