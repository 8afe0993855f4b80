"""The scenarios shipped in bench/scenarios are the sizes the docs quote: xl (bench core),
100,000 workloads in 2,000 ClusterQueues on 16,384 nodes of topology; large-scale-11k (the
operator's profile at 1,000 ClusterQueues), 11,000 workloads."""

from __future__ import annotations

import math
from pathlib import Path

from phalanx.bench.objects import plan
from phalanx.cli.bench_scenario import load_scenario, load_topology_file

XL = Path(__file__).resolve().parents[3] / "bench" / "scenarios" / "xl" / "generator.yaml"


def test_the_xl_scenario_has_the_documented_size() -> None:
    queues, workloads = plan(load_scenario(XL))
    topology = load_topology_file(XL)
    assert topology is not None
    assert len(queues) == 2_000
    assert len(workloads) == 100_000
    assert math.prod(level.count for level in topology.levels) == 16_384
    assert len({q.cohort for q in queues}) == 20


LARGE_11K = XL.parents[1] / "large-scale-11k" / "generator.yaml"


def test_the_scaled_down_large_scale_keeps_its_1000_queues_with_11_workloads_each() -> None:
    queues, workloads = plan(load_scenario(LARGE_11K))
    assert len(queues) == 1_000
    assert len({q.cohort for q in queues}) == 10
    assert len(workloads) == 11_000
    assert load_topology_file(LARGE_11K) is None
