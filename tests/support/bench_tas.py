"""A tiny TAS scenario in Kueue's generator format, for the bench e2e tests (unit and
integration): 1 block x 2 racks x 4 nodes of 4 CPU, one cohort of two ClusterQueues whose
quota (24 CPU) is more than a rack (16 CPU), so required placements need both racks."""

from __future__ import annotations

from pathlib import Path

TINY_TAS = """
topology:
  name: tiny-topology
  levels:
    - name: block
      count: 1
      nodeLabel: cloud.provider.com/topology-block
    - name: rack
      count: 2
      nodeLabel: cloud.provider.com/topology-rack
    - name: node
      count: 4
      nodeLabel: kubernetes.io/hostname
      capacity:
        cpu: "4"
        memory: 16Gi
resourceFlavor:
  name: tiny-tas-flavor
  nodeLabel: tas-node-group
  topologyName: tiny-topology
cohorts:
  - className: cohort
    count: 1
    queuesSets:
    - className: cq
      count: 2
      nominalQuota: "12"
      borrowingLimit: "12"
      reclaimWithinCohort: Any
      withinClusterQueue: LowerPriority
      workloadsSets:
      - count: 8
        creationIntervalMs: 150
        workloads:
        - className: required-rack
          runtimeMs: 400
          priority: 50
          request: "2"
          podCount: 4
          tasConstraint: required
          tasLevel: cloud.provider.com/topology-rack
      - count: 8
        creationIntervalMs: 150
        workloads:
        - className: preferred-rack
          runtimeMs: 300
          priority: 50
          request: "1"
          podCount: 3
          tasConstraint: preferred
          tasLevel: cloud.provider.com/topology-rack
      - count: 8
        creationIntervalMs: 150
        workloads:
        - className: balanced-rack
          runtimeMs: 300
          priority: 100
          request: "1"
          podCount: 4
          tasConstraint: balanced
          tasLevel: cloud.provider.com/topology-rack
          sliceSize: 2
"""

RACK_LABEL = "cloud.provider.com/topology-rack"


def write_tiny_tas(folder: Path) -> Path:
    """``folder/tiny-tas/generator.yaml``; the scenario is named after its folder."""
    path = folder / "tiny-tas" / "generator.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TINY_TAS)
    return path
