"""The nodes of a TAS scenario, built as Kueue's generator builds them
(test/performance/scheduler/runner/generator/topology_generator.go): for each block, rack
and node, a node labelled with every level, the flavor's node label, and the last level's
capacity."""

from __future__ import annotations

import itertools

from phalanx.admission.topology_adapter import TopologyPlacement
from phalanx.cli.bench_scenario import TopologySpec
from phalanx.placement import HOSTNAME_LABEL, FlavorTopologies, Node

__all__ = ["build_placement"]

# Kueue's generator labels the TAS nodes and flavor with this value.
_FLAVOR_LABEL_VALUE = "tas"
_PODS_PER_NODE = 110


def build_placement(spec: TopologySpec) -> TopologyPlacement:
    topologies = FlavorTopologies()
    topologies.set_flavor(
        name=spec.flavor,
        levels=[level.node_label for level in spec.levels],
        node_labels={spec.flavor_node_label: _FLAVOR_LABEL_VALUE},
    )
    capacity = dict(spec.levels[-1].capacity)
    capacity.setdefault("pods", _PODS_PER_NODE)
    for path in itertools.product(*(range(level.count) for level in spec.levels)):
        name = "node-" + "-".join(
            f"{level.name[0]}{index}" for level, index in zip(spec.levels, path, strict=True)
        )
        labels = {
            level.node_label: f"{level.name}-{index}"
            for level, index in zip(spec.levels, path, strict=True)
        }
        labels[HOSTNAME_LABEL] = name
        labels[spec.flavor_node_label] = _FLAVOR_LABEL_VALUE
        topologies.upsert_node(Node(name=name, labels=labels, allocatable=capacity))
    return TopologyPlacement(topologies)
