"""``phalanx bench state``: the operator's memory with a scenario's objects in its state."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from phalanx.bench.state_rss import measure_state
from phalanx.cli.bench_scenario import load_scenario, load_topology_file

GENERATOR = """
topology:
  name: "t"
  levels:
    - name: block
      count: 1
      nodeLabel: "cloud.provider.com/topology-block"
    - name: rack
      count: 2
      nodeLabel: "cloud.provider.com/topology-rack"
    - name: node
      count: 4
      nodeLabel: "kubernetes.io/hostname"
      capacity:
        cpu: "8"
resourceFlavor:
  name: "tas-flavor"
  nodeLabel: "tas-node-group"
  topologyName: "t"
cohorts:
  - className: cohort
    count: 1
    queuesSets:
    - className: cq
      count: 3
      nominalQuota: "4"
      borrowingLimit: "0"
      reclaimWithinCohort: Never
      withinClusterQueue: Never
      workloadsSets:
      - count: 40
        creationIntervalMs: 10
        workloads:
        - className: small
          runtimeMs: 100
          priority: 50
          request: "1"
          podCount: 2
          tasConstraint: "required"
          tasLevel: "cloud.provider.com/topology-rack"
"""


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "generator.yaml"
    path.write_text(GENERATOR)
    return path


def test_the_state_holds_every_object_and_the_core_places_what_quota_allows(
    tmp_path: Path,
) -> None:
    path = _config(tmp_path)
    figures = measure_state(load_scenario(path), load_topology_file(path))
    assert (figures.workloads, figures.cluster_queues, figures.nodes) == (120, 3, 8)
    # flavor, topology, 8 nodes, per queue a namespace, a ClusterQueue and a LocalQueue
    assert figures.objects == 1 + 1 + 8 + 3 * 3 + 120
    # 4 CPUs of nominal quota per ClusterQueue, 2 per workload, no borrowing: 2 each
    assert figures.admitted_in_cycle == 6
    assert figures.rss_after_mib >= figures.rss_before_mib > 0


def test_the_command_fails_above_max_mib_and_refuses_a_bad_limit(tmp_path: Path) -> None:
    path = _config(tmp_path)
    run = [sys.executable, "-m", "phalanx.cli.main", "bench", "state", "--config", str(path)]
    over = subprocess.run([*run, "--max-mib", "1"], capture_output=True, text=True, check=False)
    assert over.returncode == 1 and "> --max-mib 1" in over.stderr
    bad = subprocess.run([*run, "--max-mib", "0"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "--max-mib" in bad.stderr
    missing = subprocess.run(
        [*run[:-1], str(tmp_path / "nope.yaml")], capture_output=True, text=True, check=False
    )
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr
