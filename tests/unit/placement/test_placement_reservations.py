"""Reserve, release, restore, speculate, and rebuilding reservations after a restart."""

from __future__ import annotations

import pytest
from placement_builders import GPU, HOST, RACK, fill, gang, make_topology, node_name

from phalanx.placement import FlavorTopology, decode_topology_assignment


def snapshot(topo: FlavorTopology) -> dict[int, dict[tuple[str, ...], int]]:
    return {g: topo.free_capacity({GPU: g}, level=HOST) for g in (1, 3, 8)}


def test_reserve_is_seen_by_the_next_placement_and_release_restores_exactly() -> None:
    topo = make_topology(blocks=1, racks=2, hosts=2)
    before = snapshot(topo)
    first = topo.reserve(gang("ns/a").required(2).obj())
    second = topo.reserve(gang("ns/b").required(2).obj())
    assert first.placement is not None and second.placement is not None
    nodes_a = {d.node for d in first.placement.pod_sets[0].domains}
    nodes_b = {d.node for d in second.placement.pod_sets[0].domains}
    assert nodes_a.isdisjoint(nodes_b)
    assert not topo.place(gang("ns/c").pod_set(1).obj()).ok
    topo.release("ns/a")
    topo.release("ns/b")
    assert snapshot(topo) == before
    assert topo.release("ns/a") is None


def test_place_never_changes_state() -> None:
    topo = make_topology()
    before = snapshot(topo)
    g = gang("ns/m").required(1, name="a", gpus=2).required(3, name="b").obj()
    assert topo.place(g).ok
    assert snapshot(topo) == before
    assert not topo.is_reserved("ns/m")


def test_reserving_a_key_twice_is_refused() -> None:
    topo = make_topology()
    topo.reserve(gang("ns/a").pod_set(1).obj())
    with pytest.raises(ValueError, match="already holds a reservation"):
        topo.reserve(gang("ns/a").pod_set(1).obj())


def test_speculate_undoes_releases_and_reservations() -> None:
    topo = make_topology(blocks=1, racks=1, hosts=2)
    topo.reserve(gang("ns/victim").pod_set(2).obj())
    before = snapshot(topo)
    with topo.speculate():
        assert not topo.place(gang("ns/new").pod_set(2).obj()).ok
        topo.release("ns/victim")
        assert topo.reserve(gang("ns/new").pod_set(2).obj()).ok
        with topo.speculate():
            topo.release("ns/new")
        assert topo.is_reserved("ns/new")
    assert topo.is_reserved("ns/victim")
    assert not topo.is_reserved("ns/new")
    assert snapshot(topo) == before


def test_release_then_restore_is_exact() -> None:
    topo = make_topology()
    fill(topo, node_name(0, 0, 0), 3)
    topo.reserve(gang("ns/x").preferred(5, gpus=3).obj())
    with_x = snapshot(topo)
    reservation = topo.release("ns/x")
    assert reservation is not None
    topo.restore(reservation)
    assert snapshot(topo) == with_x


def test_rebuild_from_an_admitted_assignment_after_restart() -> None:
    topo = make_topology(blocks=1, racks=2, hosts=4)
    placed = topo.reserve(gang("ns/w").required(3, gpus=4).obj())
    assert placed.placement is not None
    held = snapshot(topo)
    assignment = placed.placement.pod_sets[0].topology_assignment()

    fresh = make_topology(blocks=1, racks=2, hosts=4)
    _, domains = decode_topology_assignment(assignment)
    fresh.restore(fresh.reservation_from_assignments("ns/w", [({GPU: 4}, domains)]))
    assert snapshot(fresh) == held


def test_rebuild_refuses_unknown_nodes() -> None:
    topo = make_topology(blocks=1, racks=1, hosts=1)
    with pytest.raises(ValueError, match="cannot be restored"):
        topo.reservation_from_assignments("ns/w", [({GPU: 1}, [(("gone",), 1)])])


def test_failure_explains_each_level_short_and_structured() -> None:
    topo = make_topology(blocks=2, racks=2, hosts=4)
    for b in range(2):
        for r in range(2):
            for h in range(b + r + 1):
                fill(topo, node_name(b, r, h), 8)
    # free hosts per rack: b0r0 3, b0r1 2, b1r0 2, b1r1 1 -> block b0 5, cluster 8
    result = topo.place(gang("ns/big").required(4).obj())
    failure = result.failure
    assert failure is not None
    by_level = {fit.level: fit for fit in failure.levels}
    assert by_level["cluster"].largest_free == 8
    assert by_level["cloud.provider.com/topology-block"].largest_free == 5
    assert by_level["cloud.provider.com/topology-block"].largest_domain == ("b0",)
    assert by_level[RACK].largest_free == 3
    assert by_level[RACK].largest_domain == ("b0", "r0")
    assert by_level[RACK].needed == 4
    assert by_level[RACK].domains == 4
    assert failure.message == (
        'pod set "ps0" needs 4 pods (nvidia.com/gpu: 8 each) in one topology-rack;'
        " largest free: topology-rack b0/r0 fits 3, topology-block b0 fits 5, cluster fits 8"
    )


def test_failure_without_explain_is_still_one_useful_line() -> None:
    topo = make_topology(blocks=1, racks=1, hosts=1)
    result = topo.place(gang("ns/big").preferred(2).obj(), explain=False)
    assert result.failure is not None
    assert result.failure.levels == ()
    assert "needs 2 pods" in result.failure.message
    assert "fits 1" in result.failure.message
