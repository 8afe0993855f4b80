"""TopologyOracle: the operator's PlacementOracle over cached Nodes and Pods."""

from __future__ import annotations

from typing import Any

from phalanx.admission.model import ResourceFlavor, TopologyRequest
from phalanx.admission.placement_hook import PlacementDemand
from phalanx.operator.oracle import TopologyOracle

RACK = "example.com/rack"
HOST = "kubernetes.io/hostname"
GPU = "nvidia.com/gpu"


def _node(name: str, rack: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {RACK: rack, HOST: name}},
        "status": {
            "allocatable": {GPU: "4"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _oracle() -> TopologyOracle:
    oracle = TopologyOracle()
    oracle.configure(
        {"gpu": ResourceFlavor(name="gpu", topology_name="racks")}, {"racks": (RACK, HOST)}
    )
    for name, rack in (("r0-n0", "rack-0"), ("r0-n1", "rack-0"), ("r1-n0", "rack-1")):
        oracle.upsert_node(_node(name, rack))
    return oracle


def _demand(pods: int) -> list[PlacementDemand]:
    return [PlacementDemand("main", pods, {GPU: 4}, TopologyRequest.required(RACK))]


def test_place_without_is_a_what_if_that_keeps_the_victims_reservations() -> None:
    oracle = _oracle()
    assert oracle.reserve(flavor="gpu", key="ns/a", pod_sets=_demand(2)).ok  # fills rack-0
    assert oracle.reserve(flavor="gpu", key="ns/b", pod_sets=_demand(1)).ok  # fills rack-1
    assert not oracle.place(flavor="gpu", key="ns/high", pod_sets=_demand(2)).ok
    # Without b, rack-1 still has one host: no fit. Without a, rack-0 does.
    without_b = oracle.place_without(
        flavor="gpu", key="ns/high", pod_sets=_demand(2), removed=["ns/b"]
    )
    assert not without_b.ok and "rack" in without_b.reason
    assert oracle.place_without(
        flavor="gpu", key="ns/high", pod_sets=_demand(2), removed=["ns/a", "ns/unknown"]
    ).ok
    tree = oracle.flavors["gpu"]
    assert set(tree.reservations()) == {"ns/a", "ns/b"}
    assert not oracle.place(flavor="gpu", key="ns/high", pod_sets=_demand(1)).ok
