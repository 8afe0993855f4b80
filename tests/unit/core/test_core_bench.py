"""``phalanx bench core``: a scaled-down Kueue scenario through the replay engine, the
scenario/rangespec loaders and the command's output. Invariants, not timing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kueue_scenarios import kueue_scenarios

from phalanx.bench.core_replay import replay
from phalanx.cli.bench_scenario import ScenarioError, load_rangespec, load_scenario
from phalanx.cli.main import main

SMALL = """
cohorts:
  - className: cohort
    count: 2
    queuesSets:
    - className: cq
      count: 3
      nominalQuota: 20
      borrowingLimit: 100
      reclaimWithinCohort: Any
      withinClusterQueue: LowerPriority
      workloadsSets:
      - count: 30
        creationIntervalMs: 100
        workloads:
        - className: small
          runtimeMs: 200
          priority: 50
          request: 1
      - count: 10
        creationIntervalMs: 500
        workloads:
        - className: medium
          runtimeMs: 500
          priority: 100
          request: 5
      - count: 5
        creationIntervalMs: 1200
        workloads:
        - className: large
          runtimeMs: 1000
          priority: 200
          request: 20
"""

RANGES = """
cmd:
  maxWallMs: 1_000_000
clusterQueueClassesMinUsage:
  cq: 10
wlClassesMaxAvgTimeToAdmissionMs:
  large: 100_000
  medium: 100_000
  small: 100_000
"""


@pytest.fixture
def small(tmp_path: Path) -> Path:
    (tmp_path / "small").mkdir()
    config = tmp_path / "small" / "generator.yaml"
    config.write_text(SMALL)
    (tmp_path / "small" / "rangespec.yaml").write_text(RANGES)
    return config


@pytest.mark.parametrize("eviction_ms", [0, 25])
def test_scaled_down_replay_keeps_every_invariant(small: Path, eviction_ms: int) -> None:
    scenario = load_scenario(small)
    result = replay(scenario, check_every_cycle=True, eviction_ms=eviction_ms)
    assert result.invariant_violations == ()
    assert result.workloads == 2 * 3 * (30 + 10 + 5)
    # Every workload ran to completion: one admission each, plus one per eviction.
    assert result.admissions == result.workloads + result.evictions
    assert {n: c.count for n, c in result.classes.items()} == {
        "small": 180,
        "medium": 60,
        "large": 30,
    }
    assert sum(c.evictions for c in result.classes.values()) == result.evictions
    assert result.ideal_ms <= result.virtual_wall_ms
    assert 0 < result.cq_classes["cq"] <= 100


def test_ideal_is_the_larger_of_last_arrival_and_cohort_work(small: Path) -> None:
    result = replay(load_scenario(small))
    # Per cohort: 3 queues x (30x1x200 + 10x5x500 + 5x20x1000) cpu-ms over 60 cpus.
    work = 3 * (30 * 1 * 200 + 10 * 5 * 500 + 5 * 20 * 1000) * 1000
    # The last arrivals of each set, plus their runtime: the large ones end last.
    last = max(30 * 100 + 200, 10 * 500 + 500, 5 * 1200 + 1000)
    assert result.ideal_ms == max(work // (60 * 1000), last) == 7000


def test_replay_is_deterministic(small: Path) -> None:
    scenario = load_scenario(small)
    first, second = replay(scenario), replay(scenario)
    assert first.to_json() == second.to_json()


def test_kueue_scenarios_load() -> None:
    scenario = load_scenario(kueue_scenarios() / "baseline" / "generator.yaml")
    queue_set = scenario.cohorts[0].queue_sets[0]
    assert scenario.cohorts[0].count == 5 and queue_set.count == 6
    assert queue_set.nominal == 20_000 and queue_set.borrowing_limit == 100_000
    assert [w.workloads[0].class_name for w in queue_set.workload_sets] == [
        "small",
        "medium",
        "large",
    ]
    ranges = load_rangespec(kueue_scenarios() / "baseline" / "rangespec.yaml")
    assert ranges.max_avg_time_to_admission_ms["large"] == 23_000
    tas = load_scenario(kueue_scenarios() / "tas" / "generator.yaml")
    assert tas.flavor.topology_name == "default-topology"
    assert tas.cohorts[0].queue_sets[0].workload_sets[0].workloads[0].topology is not None


def test_bad_scenario_names_the_field(tmp_path: Path) -> None:
    config = tmp_path / "generator.yaml"
    config.write_text(SMALL.replace("runtimeMs: 200", "runtimeMs: soon"))
    with pytest.raises(ScenarioError, match=r"workloads\[0\]\.runtimeMs"):
        load_scenario(config)


def test_command_json_output_and_checks(small: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "core", "--config", str(small), "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) >= {
        "scenario",
        "workloads",
        "admissions",
        "evictions",
        "virtual_wall_ms",
        "ideal_ms",
        "classes",
        "cq_classes",
        "core_cpu_s",
        "us_per_decision",
    }
    assert payload["classes"]["large"]["count"] == 30
    assert "avg_usage_pct" in payload["cq_classes"]["cq"]
    assert payload["checks"]["pass"] is (code == 0)


def test_command_human_output_fails_a_tight_rangespec(
    small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (small.parent / "rangespec.yaml").write_text(
        RANGES.replace("small: 100_000", "small: 0").replace("medium: 100_000", "medium: 0")
    )
    code = main(["bench", "core", "--config", str(small)])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL" in out and "class small" in out


SMALL_TAS = """
topology:
  name: "default-topology"
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
  topologyName: "default-topology"
cohorts:
  - className: cohort
    count: 1
    queuesSets:
    - className: cq
      count: 2
      nominalQuota: "20"
      borrowingLimit: "100"
      reclaimWithinCohort: Any
      withinClusterQueue: LowerPriority
      workloadsSets:
      - count: 20
        creationIntervalMs: 100
        workloads:
        - className: small-required-rack
          runtimeMs: 200
          priority: 50
          request: "500m"
          podCount: 2
          tasConstraint: "required"
          tasLevel: "cloud.provider.com/topology-rack"
      - count: 5
        creationIntervalMs: 500
        workloads:
        - className: large-balanced-rack
          runtimeMs: 1000
          priority: 200
          request: "2500m"
          podCount: 8
          tasConstraint: "balanced"
          tasLevel: "cloud.provider.com/topology-rack"
          sliceSize: 4
"""


def test_tas_scenario_places_every_gang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "generator.yaml"
    config.write_text(SMALL_TAS)
    assert main(["bench", "core", "--config", str(config), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["classes"]["small-required-rack"]["count"] == 40
    assert payload["classes"]["large-balanced-rack"]["count"] == 10
    assert payload["admissions"] == 50 + payload["evictions"]


def test_cpu_budget_is_enforced(small: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "core", "--config", str(small), "--cpu-budget-s", "0"]) == 1
    assert "budget 0.0 s" in capsys.readouterr().out
    assert main(["bench", "core", "--config", str(small), "--cpu-budget-s", "60"]) == 0
