"""The topology tree: which nodes count, and free capacity kept current incrementally."""

from __future__ import annotations

import pytest
from placement_builders import BLOCK, GPU, HOST, LEVELS, RACK, fill, gang, make_node, make_topology

from phalanx.placement import (
    FailureReason,
    FlavorTopology,
    Node,
    Taint,
    Toleration,
    TopologyError,
)


def free_by_rack(topo: FlavorTopology, gpus: int = 8) -> dict[tuple[str, ...], int]:
    return topo.free_capacity({GPU: gpus}, level=RACK)


@pytest.mark.parametrize(
    ("node", "reason"),
    [
        (make_node(0, 0, 0, ready=False), "NotReady"),
        (make_node(0, 0, 0, unschedulable=True), "unschedulable"),
        (Node("bare", {BLOCK: "b0", HOST: "bare"}, {GPU: 8}), f"missing topology label {RACK}"),
    ],
)
def test_unusable_nodes_are_excluded_with_a_reason(node: Node, reason: str) -> None:
    topo = FlavorTopology(name="gpu", levels=LEVELS)
    topo.upsert_node(node)
    assert topo.excluded_nodes() == {node.name: reason}
    result = topo.place(gang().pod_set(1).obj())
    assert result.failure is not None
    assert result.failure.reason is FailureReason.NO_NODES
    assert reason in result.failure.message


def test_flavor_node_labels_select_the_nodes() -> None:
    topo = FlavorTopology(name="tas", levels=LEVELS, node_labels={"tas-node-group": "tas"})
    topo.upsert_node(make_node(0, 0, 0, extra_labels={"tas-node-group": "tas"}))
    topo.upsert_node(make_node(0, 0, 1))
    assert list(topo.excluded_nodes()) == ["n-b0-r0-h1"]
    assert free_by_rack(topo) == {("b0", "r0"): 1}


def test_untolerated_no_schedule_taint_excludes_the_node_for_that_pod_set() -> None:
    topo = FlavorTopology(name="gpu", levels=LEVELS)
    taint = Taint("gpu-maintenance", "true", "NoSchedule")
    topo.upsert_node(make_node(0, 0, 0, taints=(taint,)))
    topo.upsert_node(make_node(0, 0, 1, taints=(Taint("soft", "x", "PreferNoSchedule"),)))
    plain = topo.place(gang().pod_set(2).obj())
    assert plain.failure is not None
    assert "1 untolerated taint" in plain.failure.message
    tolerating = gang().pod_set(2, tolerations=(Toleration("gpu-maintenance", "Exists"),)).obj()
    assert topo.place(tolerating).ok


def test_flavor_tolerations_apply_to_every_pod_set() -> None:
    topo = FlavorTopology(
        name="gpu", levels=LEVELS, tolerations=(Toleration("nvidia.com/gpu", "Exists"),)
    )
    topo.upsert_node(make_node(0, 0, 0, taints=(Taint("nvidia.com/gpu", "present"),)))
    assert topo.place(gang().pod_set(1).obj()).ok


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (Toleration("k", "Equal", "v"), Taint("k", "v"), True),
        (Toleration("k", "Equal", "w"), Taint("k", "v"), False),
        (Toleration("k", "Exists"), Taint("k", "v"), True),
        (Toleration("", "Exists"), Taint("k", "v", "NoExecute"), True),
        (Toleration("", "Equal"), Taint("k", "v"), False),
        (Toleration("k", "Exists", effect="NoExecute"), Taint("k", "v", "NoSchedule"), False),
    ],
)
def test_toleration_rule(toleration: Toleration, taint: Taint, tolerated: bool) -> None:
    assert toleration.tolerates(taint) is tolerated


def test_node_selector_of_the_pod_set_filters_nodes() -> None:
    topo = FlavorTopology(name="gpu", levels=LEVELS)
    topo.upsert_node(make_node(0, 0, 0, extra_labels={"gpu": "h100"}))
    topo.upsert_node(make_node(0, 0, 1, extra_labels={"gpu": "a100"}))
    result = topo.place(gang().pod_set(1, node_selector={"gpu": "a100"}).obj())
    assert result.placement is not None
    assert result.placement.pod_sets[0].domains[0].node == "n-b0-r0-h1"


def test_pods_and_nodes_update_capacity_incrementally() -> None:
    topo = make_topology(blocks=1, racks=2, hosts=2)
    assert free_by_rack(topo, 4) == {("b0", "r0"): 4, ("b0", "r1"): 4}
    topo.free_capacity({GPU: 8})  # warm the 8-GPU shape cache too
    topo.add_pod(uid="p1", node="n-b0-r0-h0", requests={GPU: 3})
    assert free_by_rack(topo, 4) == {("b0", "r0"): 3, ("b0", "r1"): 4}
    assert free_by_rack(topo, 8) == {("b0", "r0"): 1, ("b0", "r1"): 2}
    topo.add_pod(uid="p1", node="n-b0-r0-h0", requests={GPU: 5})  # re-add replaces
    assert free_by_rack(topo, 4) == {("b0", "r0"): 2, ("b0", "r1"): 4}
    topo.remove_pod("p1")
    topo.remove_pod("p1")  # idempotent
    assert free_by_rack(topo, 4) == {("b0", "r0"): 4, ("b0", "r1"): 4}
    topo.upsert_node(make_node(0, 0, 0, ready=False))
    assert free_by_rack(topo, 8) == {("b0", "r0"): 1, ("b0", "r1"): 2}
    topo.upsert_node(make_node(0, 0, 0))
    topo.remove_node("n-b0-r1-h0")
    topo.remove_node("n-b0-r1-h1")
    assert free_by_rack(topo, 8) == {("b0", "r0"): 2}


def test_pod_seen_before_its_node_counts_once_the_node_arrives() -> None:
    topo = FlavorTopology(name="gpu", levels=LEVELS)
    topo.add_pod(uid="early", node="n-b0-r0-h0", requests={GPU: 8})
    topo.upsert_node(make_node(0, 0, 0))
    assert free_by_rack(topo) == {("b0", "r0"): 0}


def test_node_relabelled_into_another_rack_moves_its_usage() -> None:
    topo = make_topology(blocks=1, racks=2, hosts=1)
    fill(topo, "n-b0-r0-h0", 8)
    moved = make_node(0, 0, 0)
    topo.upsert_node(Node(moved.name, {**moved.labels, RACK: "r1"}, moved.allocatable))
    assert free_by_rack(topo) == {("b0", "r1"): 1}


def test_node_allocatable_pods_limit_counts() -> None:
    topo = FlavorTopology(name="gpu", levels=LEVELS)
    node = make_node(0, 0, 0)
    topo.upsert_node(Node(node.name, node.labels, {"cpu": 96_000, "pods": 3}))
    assert topo.free_capacity({"cpu": 1000}) == {("b0",): 3}


def test_pods_of_placed_gangs_are_counted_by_the_reservation_only() -> None:
    topo = make_topology(blocks=1, racks=1, hosts=2)
    result = topo.reserve(gang("ns/g").pod_set(1).obj())
    assert result.placement is not None
    node = result.placement.pod_sets[0].domains[0].node
    topo.add_pod(uid="g-0", node=node, requests={GPU: 8}, gang="ns/g")
    assert free_by_rack(topo) == {("b0", "r0"): 1}
    topo.release("ns/g")
    assert free_by_rack(topo) == {("b0", "r0"): 2}


@pytest.mark.parametrize(
    ("levels", "field"),
    [
        ((), "spec.levels"),
        ((RACK, RACK), "spec.levels[1].nodeLabel"),
        ((HOST, RACK), "spec.levels[0].nodeLabel"),
        ((BLOCK, ""), "spec.levels[1].nodeLabel"),
    ],
)
def test_bad_topology_levels_name_the_field(levels: tuple[str, ...], field: str) -> None:
    with pytest.raises(TopologyError, match=field.replace("[", r"\[").replace("]", r"\]")):
        FlavorTopology(name="x", levels=levels)


def test_levels_without_hostname_plan_pods_on_nodes_of_the_lowest_domain() -> None:
    topo = FlavorTopology(name="gpu", levels=(BLOCK, RACK))
    for h in range(3):
        topo.upsert_node(make_node(0, 0, h))
    result = topo.reserve(gang().required(3).obj())
    assert result.placement is not None
    ps = result.placement.pod_sets[0]
    assert ps.assignment_levels() == (BLOCK, RACK)
    assert ps.domain_counts() == ((("b0", "r0"), 3),)


def test_free_capacity_names_the_levels_for_an_unknown_level() -> None:
    topo = make_topology(blocks=1, racks=1, hosts=1)
    with pytest.raises(ValueError, match="not a level of flavor gpu"):
        topo.free_capacity({GPU: 1}, level="example.com/zone")
