"""The invariant checker, fed with hand-made watch events."""

from __future__ import annotations

from typing import Any

from phalanx.operator.faults_invariants import InvariantChecker, admission_usage


def cq(
    name: str,
    *,
    gpus: int,
    cohort: str | None = None,
    borrowing: int | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    res: dict[str, Any] = {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}
    if borrowing is not None:
        res["borrowingLimit"] = str(borrowing)
    spec: dict[str, Any] = {
        "resourceGroups": [
            {
                "coveredResources": ["nvidia.com/gpu"],
                "flavors": [{"name": "h100", "resources": [res]}],
            }
        ]
    }
    if cohort:
        spec["cohortName"] = cohort
    return {"metadata": {"name": name}, "spec": spec, "status": status or {}}


def wl(
    name: str,
    *,
    uid: str | None = None,
    cq_name: str | None = None,
    gpus: int = 1,
    reserved: bool = False,
    finished: bool = False,
    evicted: bool = False,
    job: str | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}"}
    if job:
        metadata["ownerReferences"] = [{"kind": "Job", "name": job, "uid": f"job-{job}"}]
    conditions = []
    status: dict[str, Any] = {"conditions": conditions}
    if cq_name is not None:
        status["admission"] = {
            "clusterQueue": cq_name,
            "podSetAssignments": [
                {
                    "name": "main",
                    "flavors": {"nvidia.com/gpu": "h100"},
                    "resourceUsage": {"nvidia.com/gpu": str(gpus)},
                    "count": 1,
                }
            ],
        }
    conditions.append({"type": "QuotaReserved", "status": "True" if reserved else "False"})
    if finished:
        conditions.append({"type": "Finished", "status": "True"})
    if evicted:
        conditions.append({"type": "Evicted", "status": "True"})
    return {"metadata": metadata, "status": status}


def checker_with(*queues: dict[str, Any]) -> InvariantChecker:
    checker = InvariantChecker(clock=lambda: 0.0)
    for q in queues:
        checker.on_cluster_queue("ADDED", q)
    return checker


def kinds(checker: InvariantChecker) -> list[str]:
    return [v.kind for v in checker.snapshot()]


def test_admission_usage_sums_pod_sets_per_flavor_and_resource():
    admission = {
        "clusterQueue": "a",
        "podSetAssignments": [
            {
                "flavors": {"cpu": "x", "nvidia.com/gpu": "h100"},
                "resourceUsage": {"cpu": "1500m", "nvidia.com/gpu": "8"},
            },
            {
                "flavors": {"cpu": "x", "nvidia.com/gpu": "h100"},
                "resourceUsage": {"cpu": "2", "nvidia.com/gpu": "16"},
            },
        ],
    }
    assert admission_usage(admission) == {("x", "cpu"): 3500, ("h100", "nvidia.com/gpu"): 24}


def test_admit_then_finish_is_clean_and_leaves_nothing():
    c = checker_with(cq("a", gpus=4))
    c.on_workload("ADDED", wl("w"))
    c.on_workload("MODIFIED", wl("w", cq_name="a", gpus=4, reserved=True))
    assert c.reserved["a"] == {("h100", "nvidia.com/gpu"): 4}
    c.on_workload("MODIFIED", wl("w", cq_name="a", gpus=4, reserved=True, finished=True))
    assert kinds(c) == []
    assert c.final_problems() == []
    assert c.history_by_key()["ns/w"].admissions == 1


def test_admission_changed_while_reserved_is_a_double_admission():
    c = checker_with(cq("a", gpus=8), cq("b", gpus=8))
    c.on_workload("MODIFIED", wl("w", cq_name="a", reserved=True))
    c.on_workload("MODIFIED", wl("w", cq_name="b", reserved=True))
    assert kinds(c) == ["double_admission"]
    assert c.reserved["a"][("h100", "nvidia.com/gpu")] == 0
    assert c.reserved["b"][("h100", "nvidia.com/gpu")] == 1


def test_readmission_after_an_eviction_is_counted_not_flagged():
    c = checker_with(cq("a", gpus=8))
    c.on_workload("MODIFIED", wl("w", cq_name="a", reserved=True))
    c.on_workload("MODIFIED", wl("w", cq_name="a", reserved=True, evicted=True))
    c.on_workload("MODIFIED", wl("w", reserved=False, evicted=True))
    c.on_workload("MODIFIED", wl("w", cq_name="a", reserved=True))
    h = c.history_by_key()["ns/w"]
    assert (h.admissions, h.evictions) == (2, 1)
    assert kinds(c) == []


def test_the_same_admission_seen_twice_is_one_admission():
    c = checker_with(cq("a", gpus=8))
    c.on_workload("MODIFIED", wl("w", cq_name="a", reserved=True))
    c.on_workload("MODIFIED", wl("w", cq_name="a", reserved=True))  # e.g. a relist
    assert c.history_by_key()["ns/w"].admissions == 1
    assert c.reserved["a"][("h100", "nvidia.com/gpu")] == 1


def test_queue_overshoot_without_cohort_is_above_nominal():
    c = checker_with(cq("a", gpus=2))
    c.on_workload("MODIFIED", wl("w1", cq_name="a", reserved=True))
    c.on_workload("MODIFIED", wl("w2", cq_name="a", reserved=True))
    assert kinds(c) == []
    c.on_workload("MODIFIED", wl("w3", cq_name="a", reserved=True))
    assert kinds(c) == ["overshoot"]
    assert "reserved 3 > 2" in c.snapshot()[0].detail


def test_borrowing_within_limit_is_fine_beyond_it_is_an_overshoot():
    c = checker_with(cq("a", gpus=2, cohort="co", borrowing=1), cq("b", gpus=4, cohort="co"))
    c.on_workload("MODIFIED", wl("w1", cq_name="a", gpus=3, reserved=True))
    assert kinds(c) == []
    c.on_workload("MODIFIED", wl("w2", cq_name="a", gpus=1, reserved=True))
    assert kinds(c) == ["overshoot"]
    assert "nominal + borrowingLimit" in c.snapshot()[0].detail


def test_cohort_total_above_the_sum_of_nominal_quotas_is_an_overshoot():
    c = checker_with(cq("a", gpus=2, cohort="co"), cq("b", gpus=2, cohort="co"))
    c.on_workload("MODIFIED", wl("w1", cq_name="a", gpus=3, reserved=True))
    assert kinds(c) == []
    c.on_workload("MODIFIED", wl("w2", cq_name="b", gpus=2, reserved=True))
    assert kinds(c) == ["overshoot"]
    assert "cohort co" in c.snapshot()[0].detail


def test_cohort_object_quota_adds_to_the_pool():
    c = checker_with(cq("a", gpus=2, cohort="co"))
    c.on_cohort(
        "ADDED",
        {
            "metadata": {"name": "co"},
            "spec": {
                "resourceGroups": [
                    {
                        "flavors": [
                            {
                                "name": "h100",
                                "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "2"}],
                            }
                        ]
                    }
                ]
            },
        },
    )
    c.on_workload("MODIFIED", wl("w1", cq_name="a", gpus=4, reserved=True))
    assert kinds(c) == []


def test_lowering_quota_under_running_usage_is_not_an_overshoot():
    c = checker_with(cq("a", gpus=4))
    c.on_workload("MODIFIED", wl("w1", cq_name="a", gpus=4, reserved=True))
    c.on_cluster_queue("MODIFIED", cq("a", gpus=1))
    assert kinds(c) == []


def test_status_reporting_more_than_allowed_is_flagged():
    status = {
        "flavorsReservation": [
            {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "5"}]}
        ]
    }
    c = checker_with(cq("a", gpus=4, status=status))
    assert kinds(c) == ["status_overshoot"]


def test_two_workloads_for_one_job_are_flagged():
    c = checker_with(cq("a", gpus=4))
    c.on_workload("ADDED", wl("job-x-1", job="x"))
    c.on_workload("ADDED", wl("job-x-2", job="x"))
    assert kinds(c) == ["duplicate_workload"]


def test_leaks_in_workloads_and_in_queue_status_are_reported_at_the_end():
    status = {
        "flavorsUsage": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "1"}]}],
        "reservingWorkloads": 1,
    }
    c = checker_with(cq("a", gpus=4, status=status))
    c.on_workload("MODIFIED", wl("w1", cq_name="a", reserved=True))
    problems = c.final_problems()
    assert any("still reserved" in p for p in problems)
    assert any("reserved usage left" in p for p in problems)
    assert any("status.flavorsUsage" in p for p in problems)
    assert any("status.reservingWorkloads" in p for p in problems)


def test_deleting_a_reserved_workload_releases_its_usage():
    c = checker_with(cq("a", gpus=4))
    c.on_workload("MODIFIED", wl("w1", cq_name="a", gpus=4, reserved=True))
    c.on_workload("DELETED", wl("w1", cq_name="a", gpus=4, reserved=True))
    assert c.reserved["a"][("h100", "nvidia.com/gpu")] == 0
    c.on_workload("MODIFIED", wl("w2", cq_name="a", gpus=4, reserved=True))
    assert kinds(c) == []


def test_a_workload_first_seen_finished_with_an_admission_counts_as_admitted_once():
    # The watch was cut (API-server restart) while it was reserved; a relist shows the end.
    c = checker_with(cq("a", gpus=8))
    c.on_workload("ADDED", wl("gap", cq_name="a", reserved=True, finished=True))
    h = c.history_by_key()["ns/gap"]
    assert (h.admissions, h.inferred, h.finished) == (1, True, True)
    assert c.final_problems() == []
    # A Workload that finished without ever holding an admission is not counted.
    c.on_workload("ADDED", wl("never", finished=True))
    assert c.history_by_key()["ns/never"].admissions == 0
