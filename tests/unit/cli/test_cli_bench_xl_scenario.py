"""The large scenario shipped for bench core (bench/scenarios/xl) is the size the docs quote:
100,000 workloads in 2,000 ClusterQueues on 16,384 nodes of topology."""

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
