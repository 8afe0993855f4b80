"""The nodes of a TAS scenario, built as Kueue's generator builds them (see
:mod:`phalanx.bench.tas`), as the placement oracle of ``phalanx bench core``."""

from __future__ import annotations

from phalanx.admission.topology_adapter import TopologyPlacement
from phalanx.bench.tas import FLAVOR_LABEL_VALUE, TopologySpec, plan_nodes
from phalanx.placement import FlavorTopologies, Node

__all__ = ["build_placement"]


def build_placement(spec: TopologySpec) -> TopologyPlacement:
    topologies = FlavorTopologies()
    topologies.set_flavor(
        name=spec.flavor,
        levels=[level.node_label for level in spec.levels],
        node_labels={spec.flavor_node_label: FLAVOR_LABEL_VALUE},
    )
    for node in plan_nodes(spec):
        topologies.upsert_node(
            Node(name=node.name, labels=node.labels, allocatable=node.allocatable)
        )
    return TopologyPlacement(topologies)
