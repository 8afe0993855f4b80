"""``bench e2e`` pieces that need no cluster: the plan, the tracker, the result checks."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from kueue_scenarios import kueue_scenarios

from phalanx.bench.core_replay import ClassResult, ideal_ms
from phalanx.bench.objects import (
    CLEANUP_LABEL,
    cluster_queue_object,
    plan,
    workload_object,
)
from phalanx.bench.result import E2EResult, e2e_problems, store_cpu, write_counts
from phalanx.bench.tracker import Track, WorkloadTracker, percentile
from phalanx.cli.bench_scenario import load_scenario

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
      - count: 4
        creationIntervalMs: 100
        workloads:
        - className: small
          runtimeMs: 200
          priority: 50
          request: 1
      - count: 2
        creationIntervalMs: 500
        workloads:
        - className: large
          runtimeMs: 1000
          priority: 200
          request: 20
"""


@pytest.fixture
def scenario(tmp_path: Path):  # type: ignore[no-untyped-def]
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "generator.yaml").write_text(SMALL)
    return load_scenario(folder / "generator.yaml")


def test_plan_names_and_times_follow_kueues_generator(scenario):  # type: ignore[no-untyped-def]
    queues, workloads = plan(scenario)
    assert [q.name for q in queues] == [f"cq-0-{q}-cohort-{c}" for c in range(2) for q in range(3)]
    assert {q.cohort for q in queues} == {"cohort-0", "cohort-1"}
    assert len(workloads) == 6 * (4 + 2)
    first = [w for w in workloads if w.namespace == "cq-0-0-cohort-0"]
    assert [(w.name, w.at_ms) for w in first if w.class_name == "small"] == [
        ("small-0-0-0", 100),
        ("small-0-1-0", 200),
        ("small-0-2-0", 300),
        ("small-0-3-0", 400),
    ]
    assert [(w.name, w.at_ms) for w in first if w.class_name == "large"] == [
        ("large-1-0-0", 500),
        ("large-1-1-0", 1000),
    ]
    assert workloads == sorted(workloads, key=lambda w: (w.at_ms, w.namespace, w.name))
    assert first[0].request == 1000 and first[0].usage == 1000  # milli-CPU


def test_objects_carry_quota_preemption_and_the_cleanup_label(scenario):  # type: ignore[no-untyped-def]
    queues, workloads = plan(scenario)
    cq = cluster_queue_object(queues[0], flavor="rf")
    resources = cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    assert resources == {"name": "cpu", "nominalQuota": "20", "borrowingLimit": "100"}
    assert cq["spec"]["cohortName"] == "cohort-0"
    assert cq["spec"]["preemption"] == {
        "reclaimWithinCohort": "Any",
        "withinClusterQueue": "LowerPriority",
    }
    assert cq["metadata"]["labels"][CLEANUP_LABEL] == "true"
    wl = workload_object(workloads[0])
    assert wl["spec"]["queueName"] == workloads[0].namespace
    assert wl["spec"]["priority"] == 50
    container = wl["spec"]["podSets"][0]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "1"}
    assert wl["metadata"]["labels"]["kueue.x-k8s.io/performance-scheduler-running-ms"] == "200"


def test_plan_of_the_baseline_has_15000_workloads_and_the_ideal_of_bench_core() -> None:
    scenario = load_scenario(kueue_scenarios() / "baseline" / "generator.yaml")
    queues, workloads = plan(scenario)
    assert (len(queues), len(workloads)) == (30, 15_000)
    assert max(w.at_ms for w in workloads) == 60_000
    assert ideal_ms(scenario) > 60_000


def _event(name: str, *, admitted: bool = False, finished: bool = False) -> dict[str, object]:
    conditions = [
        {"type": "Admitted", "status": "True" if admitted else "False"},
        {"type": "Finished", "status": "True" if finished else "False"},
    ]
    return {"metadata": {"name": name, "namespace": "ns"}, "status": {"conditions": conditions}}


def test_tracker_finishes_runtime_after_admission_and_restarts_after_eviction(scenario):  # type: ignore[no-untyped-def]
    _, workloads = plan(scenario)
    target = workloads[0]
    target = dataclasses.replace(target, namespace="ns", name="w", runtime_ms=50)

    async def run() -> tuple[WorkloadTracker, list[tuple[str, int]]]:
        now = [0.0]
        finished: list[tuple[str, int]] = []

        async def finish(track: Track, generation: int) -> None:
            finished.append((track.planned.name, generation))

        tracker = WorkloadTracker([target], finish=finish, clock=lambda: now[0])
        tracker.created("ns/w", 1.0)
        now[0] = 3.0
        tracker.on_event("MODIFIED", _event("w", admitted=True))
        now[0] = 3.01
        tracker.on_event("MODIFIED", _event("w"))  # evicted before its runtime passed
        await asyncio.sleep(0.08)
        assert finished == []  # the first finish is stale
        now[0] = 5.0
        tracker.on_event("MODIFIED", _event("w", admitted=True))
        await asyncio.sleep(0.08)
        now[0] = 5.5
        tracker.on_event("MODIFIED", _event("w", admitted=True, finished=True))
        return tracker, finished

    tracker, finished = asyncio.run(run())
    assert finished == [("w", 3)]  # admitted (1), evicted (2), admitted again (3)
    track = tracker.tracks["ns/w"]
    assert (track.admissions, track.evictions) == (2, 1)
    assert tracker.all_finished.is_set()
    # from the last admission; the schedule's origin at 0.9 s puts the creation due at 1.0 s
    origin = 1.0 - target.at_ms / 1000
    assert tracker.times_from_creation_ms() == {target.class_name: [4000.0]}
    assert tracker.times_to_admission_ms(start=origin) == {
        target.class_name: [pytest.approx(4000.0)]
    }
    assert tracker.times_to_admission_ms(start=origin - 2) == {
        target.class_name: [pytest.approx(6000.0)]
    }
    usage = tracker.usage_pct(nominal_by_class={target.cq_class: 2000}, start=0.0, end=10.0)
    # held 1000 milli-CPU for 0.01 s + 0.5 s out of 2000 over 10 s
    assert usage[target.cq_class] == pytest.approx(100 * 1000 * 0.51 / (2000 * 10))


def test_percentile_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) == 0.0


METRICS_BEFORE = """# TYPE phalanx_api_writes counter
phalanx_api_writes_total{kind="Workload",verb="admit",result="success"} 10.0
phalanx_api_writes_total{kind="Event",verb="create",result="success"} 4.0
# TYPE phalanx_scheduling_cycle_duration_seconds histogram
phalanx_scheduling_cycle_duration_seconds_count 3.0
phalanx_scheduling_cycle_duration_seconds_sum 0.1
"""
METRICS_AFTER = """# TYPE phalanx_api_writes counter
phalanx_api_writes_total{kind="Workload",verb="admit",result="success"} 110.0
phalanx_api_writes_total{kind="Workload",verb="admit",result="error"} 2.0
phalanx_api_writes_total{kind="Event",verb="create",result="success"} 54.0
# TYPE phalanx_scheduling_cycle_duration_seconds histogram
phalanx_scheduling_cycle_duration_seconds_count 43.0
phalanx_scheduling_cycle_duration_seconds_sum 1.1
"""


def test_write_counts_are_deltas_per_kind_and_verb() -> None:
    total, by_verb, cycles = write_counts(METRICS_BEFORE, METRICS_AFTER)
    assert total == 152
    assert by_verb == {"Workload/admit": 102, "Event/create": 50}
    assert cycles == 40
    assert write_counts(None, METRICS_AFTER) == (None, {}, None)


def _result(**overrides: object) -> E2EResult:
    fields: dict[str, object] = {
        "scenario": "x",
        "workloads": 10,
        "finished": 10,
        "admissions": 10,
        "evictions": 0,
        "real_wall_ms": 1900,
        "ideal_ms": 1000,
        "classes": {"small": ClassResult(10, 5, 0)},
        "cq_classes": {"cq": 60.0},
        "p50_time_to_admission_ms": 5,
        "p99_time_to_admission_ms": 9,
        "avg_admission_from_create_ms": {"small": 3},
        "p50_admission_from_create_ms": 3,
        "p99_admission_from_create_ms": 6,
        "api_writes": 30,
        "api_writes_per_admission": 2.0,
        "api_writes_by_verb": {},
        "operator_cpu_s": 1.0,
        "store_cpu_s": 0.25,
        "cycles": 5,
        "bench_cpu_s": 0.1,
        "control_plane_cpu_s": {},
        "creation_lag_p50_ms": 1,
        "creation_lag_p99_ms": 1,
        "creation_lag_max_ms": 2,
        "operator_rss_peak_mib": 120.5,
        "operator_rss_end_mib": 100.25,
        "operator_rss_samples": 4,
        "operator_rss_max_gap_s": 0.5,
        "create_errors": 0,
        "finish_writes": 10,
        "invariant_problems": (),
        "setup_s": 1.0,
        "operator_log": None,
    }
    fields.update(overrides)
    return E2EResult(**fields)  # type: ignore[arg-type]


def test_e2e_problems_hold_phalanx_to_its_own_targets() -> None:
    assert e2e_problems(_result()) == []
    problems = e2e_problems(
        _result(
            real_wall_ms=2001,
            api_writes_per_admission=2.2,
            finished=9,
            invariant_problems=("overshoot a: b",),
        )
    )
    assert problems[0] == "overshoot a: b"
    assert any("9/10 workloads finished" in p for p in problems)
    assert any("2.0 x ideal" in p for p in problems)
    assert any("2.20 API writes per admission > 2.0" in p for p in problems)
    bench = _result().as_bench_result()
    assert bench.virtual_wall_ms == 1900 and bench.core_cpu_s == 1.0
    assert _result().to_json()["wall_over_ideal"] == 1.9


def test_store_cpu_is_the_delta_of_its_counter_and_none_without_a_store() -> None:
    before = "# TYPE phalanx_store_cpu_seconds counter\nphalanx_store_cpu_seconds_total 1.5\n"
    after = "# TYPE phalanx_store_cpu_seconds counter\nphalanx_store_cpu_seconds_total 4.0\n"
    assert store_cpu(before, after) == 2.5
    assert store_cpu(METRICS_BEFORE, METRICS_AFTER) is None  # an operator without a store
    assert store_cpu(None, after) is None
    assert _result(store_cpu_s=0.25).to_json()["store_cpu_share"] == 0.25


def test_the_runs_operator_keeps_its_history_in_the_runs_folder_unless_told(
    tmp_path: Path,
) -> None:
    from phalanx.bench.e2e import operator_store

    assert operator_store(tmp_path, {}) == f"sqlite:///{tmp_path / 'store.db'}"
    assert operator_store(tmp_path, {"PHALANX_STORE": "off"}) == "off"
    pg = "postgresql://u@127.0.0.1:5432/h"
    assert operator_store(tmp_path, {"PHALANX_STORE": pg}) == pg
