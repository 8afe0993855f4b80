"""Several TAS flavors fed by one stream of node and pod events."""

from __future__ import annotations

import pytest
from placement_builders import GPU, LEVELS, RACK, gang, make_node

from phalanx.placement import FlavorTopologies, TopologyError


def test_events_fan_out_and_redefinition_keeps_state() -> None:
    reg = FlavorTopologies()
    reg.set_flavor(name="a", levels=LEVELS)
    for h in range(2):
        reg.upsert_node(make_node(0, 0, h, extra_labels={"pool": "x"}))
    reg.add_pod(uid="p", node="n-b0-r0-h0", requests={GPU: 8})
    reg.set_flavor(name="b", levels=LEVELS[1:], node_labels={"pool": "x"})
    assert reg.flavors() == ("a", "b")
    assert reg.reserve(flavor="a", gang=gang("ns/g").pod_set(1).obj()).ok
    # b sees the pod but not a's reservation: flavors are separate capacity views.
    assert reg.place(flavor="b", gang=gang("ns/h").pod_set(1).obj()).ok
    topo_a = reg.set_flavor(name="a", levels=(RACK, *LEVELS[2:]))  # redefine: state kept
    assert topo_a.is_reserved("ns/g")
    assert not reg.place(flavor="a", gang=gang("ns/i").pod_set(1).obj()).ok
    reg.release(flavor="a", key="ns/g")
    assert reg.place(flavor="a", gang=gang("ns/i").pod_set(1).obj()).ok
    reg.remove_node("n-b0-r0-h1")
    assert not reg.place(flavor="a", gang=gang("ns/i").pod_set(1).obj()).ok
    reg.remove_pod("p")
    assert reg.place(flavor="a", gang=gang("ns/i").pod_set(1).obj()).ok


def test_unknown_flavor_and_bad_levels() -> None:
    reg = FlavorTopologies()
    assert not reg.has_topology("x")
    with pytest.raises(KeyError, match="no Topology"):
        reg.place(flavor="x", gang=gang().pod_set(1).obj())
    reg.release(flavor="x", key="k")  # no-op
    with pytest.raises(TopologyError):
        reg.set_flavor(name="x", levels=())
    assert not reg.has_topology("x")
