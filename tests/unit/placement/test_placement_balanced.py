"""Balanced placement (Kueue's TASBalancedPlacement): Kueue's own cases, then properties.

The table mirrors the balanced cases of Kueue's ``pkg/cache/scheduler/tas_cache_test.go``
(same trees, same capacities, same requests, same expected pods per host) and of
``tas_balanced_placement_test.go`` (choosing the domain set, spreading the slices). Kueue's
cases with a leader pod set (``podSetGroupName``) are left out: Phalanx has no leader/worker
groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import combinations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from placement_builders import BLOCK, GPU, HOST, RACK, gang

from phalanx.admission.placement_hook import PlacementDemand
from phalanx.admission.topology_adapter import TopologyPlacement
from phalanx.placement import (
    FlavorTopologies,
    FlavorTopology,
    GangRequest,
    Node,
    PodSetPlacement,
    PodSetRequest,
    TopologyRequest,
)
from phalanx.placement.balanced import Room, choose_domains, spread

SUBBLOCK = "cloud.provider.com/topology-subblock"
THREE = (BLOCK, RACK, HOST)
FOUR = (BLOCK, SUBBLOCK, RACK, HOST)

Hosts = tuple[tuple[tuple[str, ...], int], ...]  # (label values top-down, GPUs free)


def tree(levels: tuple[str, ...], hosts: Hosts) -> FlavorTopology:
    topo = FlavorTopology(name="tas", levels=levels)
    for values, gpus in hosts:
        name = values[-1] if levels[-1] == HOST else "-".join(values)
        labels = dict(zip(levels, values, strict=True))
        topo.upsert_node(Node(name, labels, {GPU: gpus, "pods": 110}))
    return topo


def one_gpu_pods(count: int, request: TopologyRequest) -> GangRequest:
    return GangRequest("ns/job", (PodSetRequest("main", count, {GPU: 1}, request),))


def per_domain(ps: PodSetPlacement) -> dict[str, int]:
    """Pods per assigned domain, named by its lowest value (Kueue's one-level assignment)."""
    out: dict[str, int] = {}
    for values, count in ps.domain_counts():
        out[values[-1]] = out.get(values[-1], 0) + count
    return out


def assigned(assignments: Mapping[str, object]) -> PodSetPlacement:
    placement = assignments["main"]
    assert isinstance(placement, PodSetPlacement)
    return placement


def preferred(
    level: str, *, slice_level: str | None = None, size: int | None = None
) -> TopologyRequest:
    return TopologyRequest.preferred(level, slice_level=slice_level, slice_size=size)


@dataclass(frozen=True)
class Case:
    levels: tuple[str, ...]
    hosts: Hosts
    request: TopologyRequest
    count: int
    want: dict[str, int]


def b1(*path: str) -> tuple[str, ...]:
    return ("b1", *path)


KUEUE_CASES = {
    #   b1 -> r1 -> x1:15, b1 -> r2 -> x2:15; 25 pods: best fit 15 + 10, balanced 13 + 12
    "basic": Case(
        THREE, ((b1("r1", "x1"), 15), (b1("r2", "x2"), 15)), preferred(RACK), 25,
        {"x1": 13, "x2": 12},
    ),
    "select optimal set of domains": Case(
        THREE,
        ((b1("r1", "x1"), 15), (b1("r1", "x2"), 13), (b1("r1", "x3"), 10)),
        preferred(RACK), 23, {"x1": 12, "x2": 11},
    ),
    "select optimal set of domains; with slices": Case(
        THREE,
        ((b1("r1", "x1"), 20), (b1("r1", "x2"), 15), (b1("r1", "x3"), 10)),
        preferred(RACK, slice_level=HOST, size=5), 25, {"x2": 15, "x3": 10},
    ),
    "select correct block": Case(
        THREE,
        (
            (b1("r1", "x1"), 20), (b1("r1", "x2"), 10),
            (("b2", "r2", "x3"), 15), (("b2", "r2", "x4"), 15),
        ),
        preferred(RACK), 22, {"x3": 11, "x4": 11},
    ),
    "cannot choose domains from different blocks": Case(
        THREE,
        (
            (b1("r1", "x1"), 14), (b1("r1", "x2"), 11),
            (("b2", "r2", "x3"), 15), (("b2", "r2", "x4"), 10),
        ),
        preferred(RACK), 25, {"x1": 14, "x2": 11},
    ),
    "prefer the single rack; with slices": Case(
        THREE,
        (
            (b1("r1", "x1"), 15), (b1("r2", "x2"), 15),
            (b1("r3", "x3"), 15), (b1("r3", "x4"), 15),
        ),
        preferred(RACK, slice_level=HOST, size=5), 25, {"x3": 15, "x4": 10},
    ),
    "four levels; slice two levels below the balanced level": Case(
        FOUR,
        (
            (b1("sb1", "r1", "x1"), 18), (b1("sb1", "r2", "x2"), 8),
            (b1("sb2", "r3", "x3"), 15), (b1("sb2", "r4", "x4"), 9), (b1("sb2", "r4", "x5"), 7),
        ),
        preferred(SUBBLOCK, slice_level=HOST, size=2), 20, {"x3": 10, "x4": 8, "x5": 2},
    ),
    "three levels; balance on the slice level": Case(
        THREE,
        (
            (b1("r1", "x1"), 15), (b1("r1", "x2"), 13), (b1("r1", "x3"), 10),
            (b1("r2", "x4"), 20), (b1("r2", "x5"), 8),
        ),
        preferred(HOST, slice_level=HOST, size=2), 22, {"x2": 12, "x3": 10},
    ),
    "three levels; balance on the lowest level": Case(
        THREE,
        (
            (b1("r1", "x1"), 20), (b1("r1", "x2"), 8),
            (b1("r2", "x3"), 15), (b1("r2", "x4"), 13), (b1("r2", "x5"), 10),
        ),
        preferred(HOST), 22, {"x3": 11, "x4": 11},
    ),
    "evenly filled rack first (entropy); second rack wins": Case(
        THREE,
        (
            (b1("r1", "x1"), 10), (b1("r1", "x2"), 5),
            (b1("r2", "x3"), 5), (b1("r2", "x4"), 5), (b1("r2", "x5"), 5),
        ),
        preferred(RACK), 15, {"x3": 5, "x4": 5, "x5": 5},
    ),
    "evenly filled rack first (entropy); first rack wins": Case(
        THREE,
        (
            (b1("r1", "x1"), 8), (b1("r1", "x2"), 8), (b1("r1", "x3"), 8),
            (b1("r2", "x4"), 16), (b1("r2", "x5"), 8),
        ),
        preferred(RACK), 24, {"x1": 8, "x2": 8, "x3": 8},
    ),
    "two levels; balance on the highest level": Case(
        (RACK, HOST),
        (
            (("r1", "x1"), 21), (("r1", "x2"), 9),
            (("r2", "x3"), 11), (("r2", "x4"), 10), (("r2", "x5"), 10),
        ),
        preferred(RACK), 23, {"x1": 12, "x3": 11},
    ),
    "select the block after pruning": Case(
        THREE,
        (
            (b1("r1", "x1"), 5), (b1("r1", "x2"), 5), (b1("r2", "x3"), 5), (b1("r2", "x4"), 5),
            (("b2", "r3", "x5"), 10), (("b2", "r3", "x6"), 4), (("b2", "r3", "x7"), 4),
            (("b2", "r3", "x8"), 4), (("b2", "r4", "x9"), 5), (("b2", "r5", "x10"), 5),
        ),
        preferred(RACK), 20, {"x1": 5, "x2": 5, "x3": 5, "x4": 5},
    ),
    # No hostname level: the racks are the lowest domains and the assignment names them.
    "four levels; balance on racks; slice on the lowest level": Case(
        (BLOCK, SUBBLOCK, RACK),
        (
            (b1("sb1", "r1"), 18), (b1("sb1", "r2"), 8),
            (b1("sb2", "r3"), 15), (b1("sb2", "r4"), 15),
        ),
        preferred(SUBBLOCK, slice_level=RACK, size=2), 20, {"r3": 10, "r4": 10},
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", KUEUE_CASES.values(), ids=KUEUE_CASES.keys())
def test_kueue_balanced_cases(case: Case) -> None:
    topo = tree(case.levels, case.hosts)
    result = topo.place(one_gpu_pods(case.count, case.request), balanced=True)
    assert result.placement is not None, result.failure
    assert per_domain(result.placement.pod_sets[0]) == case.want


def test_slice_one_level_below_balanced_level_racks_as_kueue() -> None:
    """Kueue's "slice one level below balanced level": racks r3 and r4 get 10 pods each, as
    Kueue's. Inside r4 (hosts of 9 and 7) Kueue writes x4:3, x5:7 and Phalanx x4:9, x5:1:
    below the slice level Phalanx fills the roomiest host first in every mode, Kueue the
    smallest (its slice counts are zero there), a difference of the descent, not of balance."""
    topo = tree(
        FOUR,
        (
            (b1("sb1", "r1", "x1"), 18), (b1("sb1", "r2", "x2"), 8),
            (b1("sb2", "r3", "x3"), 15), (b1("sb2", "r4", "x4"), 9), (b1("sb2", "r4", "x5"), 7),
        ),
    )  # fmt: skip
    request = preferred(SUBBLOCK, slice_level=RACK, size=2)
    result = topo.place(one_gpu_pods(20, request), balanced=True)
    assert result.placement is not None
    racks: dict[str, int] = {}
    for d in result.placement.pod_sets[0].domains:
        racks[d.values[2]] = racks.get(d.values[2], 0) + d.count
    assert racks == {"r3": 10, "r4": 10}


def test_best_fit_without_the_gate() -> None:
    """Off (Kueue's default), the same request packs: 15 + 10."""
    topo = tree(THREE, ((b1("r1", "x1"), 15), (b1("r2", "x2"), 15)))
    result = topo.place(one_gpu_pods(25, preferred(RACK)))
    assert result.placement is not None
    assert sorted(per_domain(result.placement.pod_sets[0]).values()) == [10, 15]


def test_required_and_unconstrained_are_never_balanced() -> None:
    """Kueue balances only ``preferred`` pod sets."""
    topo = tree(THREE, ((b1("r1", "x1"), 15), (b1("r1", "x2"), 15)))
    for request in (
        TopologyRequest.required(RACK),
        TopologyRequest.unconstrained(),
        TopologyRequest.unconstrained(slice_level=RACK, slice_size=5),
    ):
        result = topo.place(one_gpu_pods(25, request), balanced=True)
        assert result.placement is not None
        assert sorted(per_domain(result.placement.pod_sets[0]).values()) == [10, 15]


def test_preferred_at_a_slice_level_above_the_lowest_falls_back_as_kueue() -> None:
    """Kueue prunes one level below a slice level, where it counts no slices: best fit."""
    topo = tree(THREE, ((b1("r1", "x1"), 15), (b1("r2", "x2"), 15)))
    result = topo.place(
        one_gpu_pods(20, preferred(BLOCK, slice_level=BLOCK, size=5)), balanced=True
    )
    assert result.placement is not None
    assert sorted(per_domain(result.placement.pod_sets[0]).values()) == [5, 15]


def test_no_single_block_holds_it_falls_back_to_best_fit() -> None:
    topo = tree(THREE, ((b1("r1", "x1"), 10), (("b2", "r2", "x2"), 10)))
    result = topo.place(one_gpu_pods(16, preferred(RACK)), balanced=True)
    assert result.placement is not None
    assert sorted(per_domain(result.placement.pod_sets[0]).values()) == [6, 10]


def test_eight_pods_spread_through_the_admission_adapter() -> None:
    """Eight pods preferring a rack whose hosts hold five each: best fit packs 5 + 3,
    balanced (the gate on, through the adapter admission uses) places 4 + 4 and reserves it."""
    topologies = FlavorTopologies()
    topologies.set_flavor(name="tas", levels=THREE)
    for host in range(4):
        labels = {BLOCK: "b1", RACK: "r1", HOST: f"x{host}"}
        topologies.upsert_node(Node(f"x{host}", labels, {GPU: 5, "pods": 110}))
    demand = PlacementDemand(
        name="main", count=8, requests={GPU: 1}, topology=TopologyRequest.preferred(RACK)
    )
    packed = TopologyPlacement(topologies).place(flavor="tas", key="ns/a", pod_sets=[demand])
    assert packed.ok
    assert sorted(per_domain(assigned(packed.assignments)).values()) == [3, 5]
    adapter = TopologyPlacement(topologies, balanced_placement=True)
    answer = adapter.reserve(flavor="tas", key="ns/a", pod_sets=[demand])
    assert answer.ok
    assert sorted(per_domain(assigned(answer.assignments)).values()) == [4, 4]
    topo = topologies.get("tas")
    assert topo is not None and topo.is_reserved("ns/a")
    assert sum(topo.free_capacity({GPU: 1}, level=HOST).values()) == 12


# -- Kueue's tas_balanced_placement_test.go: the domain set, then the spread -----------------

D = {
    "d1": Room(("d1",), 18, 18),
    "d2": Room(("d2",), 18, 18),
    "d3": Room(("d3",), 18, 18),
    "d4": Room(("d4",), 10, 10),
    "d5": Room(("d5",), 2, 2),
}


@pytest.mark.parametrize(
    ("names", "need", "threshold", "want"),
    [
        (("d1", "d2", "d3"), 20, 10, {"d1": 10, "d2": 10}),
        (("d1", "d2", "d3"), 40, 13, {"d1": 14, "d2": 13, "d3": 13}),
        (("d1", "d2", "d3", "d4", "d5"), 2, 2, {"d5": 2}),
        (("d1", "d2", "d3", "d4", "d5"), 25, 10, {"d1": 15, "d4": 10}),
    ],
    ids=["two domains", "three domains", "smallest that fits", "correct domains"],
)
def test_spread(names: tuple[str, ...], need: int, threshold: int, want: dict[str, int]) -> None:
    shares = spread([D[n] for n in names], need, 1, threshold)
    assert shares is not None
    assert {path[0]: n for path, n in shares} == want


@pytest.mark.parametrize(
    ("need", "want"), [(22, None), (5, ["d2"]), (9, ["d1"]), (12, ["d1", "d3"])]
)
def test_choose_domains(need: int, want: list[str] | None) -> None:
    rooms = [Room((n,), s, s) for n, s in (("d1", 9), ("d2", 6), ("d3", 4), ("d4", 2))]
    chosen = choose_domains(rooms, need, 1)
    assert (None if chosen is None else sorted(r.path[0] for r in chosen)) == want


def test_equal_domains_tie_break_on_labels() -> None:
    rooms = [
        Room(("block-b", "host-a"), 3, 3),
        Room(("block-b", "host-m"), 3, 3),
        Room(("block-a", "host-z"), 3, 3),
        Room(("block-a", "host-zz"), 3, 3),
    ]
    chosen = choose_domains(rooms, 1, 1)
    assert chosen is not None and [r.path for r in chosen] == [("block-a", "host-z")]
    shares = spread([rooms[0], rooms[2]], 1, 1, 1)
    assert shares == [(("block-a", "host-z"), 1)]


# -- properties ------------------------------------------------------------------------------


@st.composite
def one_block(draw: st.DrawFn) -> tuple[FlavorTopology, dict[str, int], int]:
    racks = draw(st.integers(1, 3))
    hosts: list[tuple[tuple[str, ...], int]] = []
    for r in range(racks):
        for h in range(draw(st.integers(1, 4))):
            hosts.append((("b1", f"r{r}", f"x{r}-{h}"), draw(st.integers(0, 9))))
    total = sum(g for _, g in hosts)
    count = draw(st.integers(1, max(1, total)))
    return tree(THREE, tuple(hosts)), {v[-1]: g for v, g in hosts}, count


def best_min_on_fewest_hosts(capacity: dict[str, int], count: int) -> int:
    """Brute force: the largest minimum over placements on the fewest hosts that hold it."""
    rooms = [c for c in capacity.values() if c > 0]
    for used in range(1, len(rooms) + 1):
        fits = [s for s in combinations(rooms, used) if sum(s) >= count]
        if fits:
            return max(min(count // used, min(s)) for s in fits)
    raise AssertionError("does not fit")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(one_block())
def test_balanced_respects_capacity_and_kueue_bound(
    drawn: tuple[FlavorTopology, dict[str, int], int],
) -> None:
    """Preferring a rack inside one block: never over a host's room; and either the pods are
    spread so that the emptiest used host gets at least the best minimum any placement on
    the fewest hosts allows (what Kueue states), or it is exactly best fit (Kueue's fallback
    when its chosen racks cannot take the threshold on every host)."""
    topo, capacity, count = drawn
    if count > sum(capacity.values()):
        return
    request = one_gpu_pods(count, preferred(RACK))
    result = topo.place(request, balanced=True)
    assert result.placement is not None
    pods = per_domain(result.placement.pod_sets[0])
    assert sum(pods.values()) == count
    assert all(0 < n <= capacity[host] for host, n in pods.items())
    best_fit = topo.place(request)
    assert best_fit.placement is not None
    if pods != per_domain(best_fit.placement.pod_sets[0]):
        assert min(pods.values()) >= best_min_on_fewest_hosts(capacity, count)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_balanced_slices_stay_whole_and_fit(data: st.DataObject) -> None:
    """Any tree, any preferred level and slice: capacity holds and no slice is split."""
    hosts: list[tuple[tuple[str, ...], int]] = []
    for b in range(data.draw(st.integers(1, 2))):
        for r in range(data.draw(st.integers(1, 3))):
            for h in range(data.draw(st.integers(1, 3))):
                hosts.append(((f"b{b}", f"r{r}", f"x{b}{r}{h}"), data.draw(st.integers(0, 8))))
    topo = tree(THREE, tuple(hosts))
    level = data.draw(st.sampled_from(THREE))
    slice_level = data.draw(st.sampled_from(THREE[THREE.index(level) :]))
    size = data.draw(st.integers(1, 3))
    count = size * data.draw(st.integers(1, 8))
    request = preferred(level, slice_level=slice_level, size=size)
    result = topo.place(one_gpu_pods(count, request), balanced=True)
    if result.placement is None:
        return
    ps = result.placement.pod_sets[0]
    capacity = {v[-1]: g for v, g in hosts}
    assert sum(d.count for d in ps.domains) == count
    assert all(d.count <= capacity[d.node] for d in ps.domains)
    depth = THREE.index(slice_level) + 1
    per_slice_domain: dict[tuple[str, ...], int] = {}
    for d in ps.domains:
        per_slice_domain[d.values[:depth]] = per_slice_domain.get(d.values[:depth], 0) + d.count
    assert all(n % size == 0 for n in per_slice_domain.values())


def test_gang_builder_preferred_is_unchanged_when_off() -> None:
    """The 8-GPU gangs of the placement bench place as before with the gate off."""
    topo = tree(THREE, tuple((("b0", f"r{r}", f"h{r}{h}"), 8) for r in range(2) for h in range(4)))
    a = topo.place(gang().preferred(6).obj())
    b = topo.place(gang().preferred(6).obj(), balanced=False)
    assert a == b
