"""Property tests: invariants that must hold for any topology and any stream of gangs."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from placement_builders import GPU, LEVELS, make_node

from phalanx.placement import (
    FlavorTopology,
    GangRequest,
    Node,
    PlacementResult,
    PodSetRequest,
    TopologyRequest,
)
from phalanx.placement.capacity import normalize_requests


@dataclass(frozen=True)
class Cluster:
    nodes: tuple[Node, ...]
    fillers: tuple[tuple[str, int, int], ...]  # (node, gpus, cpu)


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    blocks = draw(st.integers(1, 3))
    racks = draw(st.integers(1, 3))
    hosts = draw(st.integers(1, 4))
    nodes = []
    for b in range(blocks):
        for r in range(racks):
            for h in range(hosts):
                gpus = draw(st.sampled_from([0, 2, 4, 8]))
                cpu = draw(st.sampled_from([8000, 32000]))
                nodes.append(make_node(b, r, h, gpus=gpus, cpu=cpu))
    fillers = draw(
        st.lists(
            st.tuples(
                st.sampled_from([n.name for n in nodes]),
                st.integers(0, 4),
                st.sampled_from([0, 1000, 4000]),
            ),
            max_size=6,
        )
    )
    return Cluster(tuple(nodes), tuple(fillers))


topology_requests = st.one_of(
    st.builds(TopologyRequest.required, st.sampled_from(LEVELS)),
    st.builds(TopologyRequest.preferred, st.sampled_from(LEVELS)),
    st.just(TopologyRequest.unconstrained()),
    st.builds(
        lambda level: TopologyRequest.unconstrained(slice_level=level, slice_size=2),
        st.sampled_from(LEVELS),
    ),
)


@st.composite
def gangs(draw: st.DrawFn, key: str) -> GangRequest:
    pod_sets = []
    for i in range(draw(st.integers(1, 3))):
        count = draw(st.integers(0, 6))
        request = draw(topology_requests)
        if request.slice_size and count % request.slice_size:
            count += 1
        requests = {
            GPU: draw(st.sampled_from([0, 1, 2, 8])),
            "cpu": draw(st.sampled_from([0, 500, 2000])),
        }
        pod_sets.append(PodSetRequest(f"ps{i}", count, requests, request))
    return GangRequest(key, tuple(pod_sets))


# ("reserve", gang) or ("release", index into the live gangs)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.integers(0, 10_000)),
        st.tuples(st.just("release"), st.integers(0, 10_000)),
    ),
    min_size=1,
    max_size=12,
)


def build(cluster: Cluster) -> FlavorTopology:
    topo = FlavorTopology(name="prop", levels=LEVELS)
    for node in cluster.nodes:
        topo.upsert_node(node)
    for i, (node, gpus, cpu) in enumerate(cluster.fillers):
        topo.add_pod(uid=f"f{i}", node=node, requests={GPU: gpus, "cpu": cpu})
    return topo


SHAPES = ({GPU: 1}, {GPU: 8}, {"cpu": 500}, {GPU: 2, "cpu": 2000})


def free(topo: FlavorTopology) -> dict[int, dict[tuple[str, ...], int]]:
    return {i: topo.free_capacity(s, level=LEVELS[-1]) for i, s in enumerate(SHAPES)}


def check_placement(gang: GangRequest, result: PlacementResult) -> None:
    if result.placement is None:
        return
    for request, placed in zip(gang.pod_sets, result.placement.pod_sets, strict=True):
        assert sum(d.count for d in placed.domains) == request.count
        assert all(d.count > 0 for d in placed.domains)
        topo_req = request.topology
        if topo_req.level is not None and topo_req.mode.value == "Required":
            depth = LEVELS.index(topo_req.level) + 1
            assert len({d.values[:depth] for d in placed.domains}) <= 1
        if topo_req.slice_level is not None and topo_req.slice_size:
            depth = LEVELS.index(topo_req.slice_level) + 1
            pods = [d.values[:depth] for d in placed.domains for _ in range(d.count)]
            size = topo_req.slice_size
            for start in range(0, len(pods), size):
                assert len(set(pods[start : start + size])) == 1
        assert len(placed.pod_node_selectors()) == request.count


def assert_not_oversubscribed(topo: FlavorTopology, cluster: Cluster) -> None:
    used: dict[str, dict[str, int]] = {}
    for node, gpus, cpu in cluster.fillers:
        for name, amount in normalize_requests({GPU: gpus, "cpu": cpu}):
            used.setdefault(node, {})[name] = used.get(node, {}).get(name, 0) + amount
    for reservation in topo.reservations().values():
        for usage in reservation.usage:
            for name, amount in normalize_requests(usage.requests):
                per_node = used.setdefault(usage.node, {})
                per_node[name] = per_node.get(name, 0) + amount * usage.pods
    by_name = {n.name: n for n in cluster.nodes}
    for node, resources in used.items():
        for name, amount in resources.items():
            if name == "pods":
                assert amount <= by_name[node].allocatable["pods"]
                continue
            # Fillers may overcommit on their own; reservations must never add to that.
            filler = sum(g if name == GPU else c for n, g, c in cluster.fillers if n == node)
            assert amount <= max(by_name[node].allocatable.get(name, 0), filler)


def run(cluster: Cluster, ops: list[tuple[str, int]], data: st.DataObject) -> list[object]:
    topo = build(cluster)
    initial = free(topo)
    live: list[str] = []
    trace: list[object] = []
    for step, (op, pick) in enumerate(ops):
        if op == "release" and live:
            key = live.pop(pick % len(live))
            trace.append(topo.release(key))
        else:
            gang = data.draw(gangs(f"g{step}"))
            result = topo.reserve(gang)
            check_placement(gang, result)
            trace.append(result)
            if result.ok:
                live.append(gang.key)
        assert_not_oversubscribed(topo, cluster)
        # The incremental caches agree with a topology rebuilt from scratch.
        rebuilt = build(cluster)
        for reservation in topo.reservations().values():
            rebuilt.restore(reservation)
        assert free(rebuilt) == free(topo)
        for i, shape in enumerate(SHAPES):
            probe = GangRequest(f"probe{i}", (PodSetRequest("p", 1, shape),))
            assert rebuilt.place(probe) == topo.place(probe)
    for key in list(live):
        topo.release(key)
    assert free(topo) == initial
    return trace


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters(), ops=operations, data=st.data())
def test_invariants_hold_for_any_stream(
    cluster: Cluster, ops: list[tuple[str, int]], data: st.DataObject
) -> None:
    run(cluster, ops, data)


@settings(max_examples=60, deadline=None)
@given(cluster=clusters(), gangs_=st.lists(gangs("g"), min_size=1, max_size=5))
def test_deterministic(cluster: Cluster, gangs_: list[GangRequest]) -> None:
    a, b = build(cluster), build(cluster)
    for i, gang in enumerate(gangs_):
        keyed = GangRequest(f"g{i}", gang.pod_sets)
        assert a.reserve(keyed) == b.reserve(keyed)


@settings(max_examples=80, deadline=None)
@given(cluster=clusters(), gang=gangs("g"))
def test_a_required_placement_never_spans_two_domains_and_what_if_is_pure(
    cluster: Cluster, gang: GangRequest
) -> None:
    topo = build(cluster)
    before = free(topo)
    result = topo.place(gang)
    check_placement(gang, result)
    assert free(topo) == before
