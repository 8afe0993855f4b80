"""Each decision's status builder recognises a Workload that already shows the decision
(what a read-back after a lost answer finds) and writes nothing then."""

from __future__ import annotations

from typing import Any

from phalanx.admission.decisions import Admit
from phalanx.admission.model import Admission, PodSetAssignment
from phalanx.operator.decision_status import (
    Eviction,
    admission_status,
    evicted_at_once_status,
    evicted_status,
    eviction_done_status,
)

ADMIT = Admit(
    "ns/w",
    Admission(
        "cq",
        (PodSetAssignment(name="main", count=1, flavors={"cpu": "f"}, resource_usage={"cpu": 1}),),
    ),
    1_000,
)
EVICTION = Eviction(reason="Preempted", message="for ns/high", cluster_queue="cq")


def fresh() -> dict[str, Any]:
    return {"metadata": {"name": "w", "namespace": "ns"}, "status": {}}


def landed(status: dict[str, Any] | None, on: dict[str, Any]) -> dict[str, Any]:
    """The Workload after ``status`` was applied to ``on`` (None-valued fields removed)."""
    assert status is not None
    merged = dict(on.get("status") or {})
    for field, value in status.items():
        if value is None:
            merged.pop(field, None)
        else:
            merged[field] = value
    return {**on, "status": merged}


def test_each_decision_is_written_once_and_then_recognised() -> None:
    build = admission_status(ADMIT)
    admitted = landed(build(fresh()), fresh())
    assert admitted["status"]["admission"]["clusterQueue"] == "cq"
    assert build(admitted) is None

    evict = evicted_status(EVICTION, now_ms=2_000)
    evicting = landed(evict(admitted), admitted)
    assert evicting["status"]["admission"] == admitted["status"]["admission"], (
        "an evicting Workload keeps reserving until its pods are gone"
    )
    assert evict(evicting) is None

    done = eviction_done_status(EVICTION, now_ms=3_000, requeue=(1, 63_000))
    requeued = landed(done(evicting), evicting)
    assert "admission" not in requeued["status"]
    assert requeued["status"]["requeueState"]["count"] == 1
    assert done(requeued) is None


def test_an_eviction_counts_in_scheduling_stats_and_adds_the_admitted_time() -> None:
    """Kueue's status.schedulingStats.evictions and accumulatedPastExecutionTimeSeconds."""
    admitted = landed(admission_status(ADMIT)(fresh()), fresh())
    for c in admitted["status"]["conditions"]:
        c["lastTransitionTime"] = "2026-01-01T00:00:00Z"
    admitted["status"]["accumulatedPastExecutionTimeSeconds"] = 30
    start = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    evicting = landed(evicted_status(EVICTION, now_ms=start + 5_000)(admitted), admitted)
    assert evicting["status"]["schedulingStats"] == {
        "evictions": [{"reason": "Preempted", "underlyingCause": "", "count": 1}]
    }
    done = landed(
        eviction_done_status(EVICTION, now_ms=start + 90_000, requeue=None)(evicting), evicting
    )
    assert done["status"]["accumulatedPastExecutionTimeSeconds"] == 120
    readmitted = landed(admission_status(ADMIT)(done), done)
    again = evicted_status(EVICTION, now_ms=start + 200_000)(readmitted)
    assert again is not None
    assert again["schedulingStats"]["evictions"][0]["count"] == 2


def test_over_a_preemptible_budget_the_quota_reserved_message_says_so_and_is_read_back() -> None:
    """The budget's message ends QuotaReserved's (``kubectl describe`` shows it), and it is
    what a restarted scheduler reads to keep the workload preemptible."""
    from dataclasses import replace

    from phalanx.operator.bridge import _over_budget

    note = (
        "admitted preemptible while it runs: LocalQueue ns/a used 2.0 of its 2.0"
        " nvidia.com/gpu-hours for the window 2026-12-04T00:00Z..2026-12-05T00:00Z"
    )
    admitted = landed(admission_status(replace(ADMIT, over_budget=note))(fresh()), fresh())
    conditions = admitted["status"]["conditions"]
    reserved = next(c for c in conditions if c["type"] == "QuotaReserved")
    assert reserved["message"] == f"Quota reserved in ClusterQueue cq; {note}"
    assert _over_budget(conditions) == note
    plain = landed(admission_status(ADMIT)(fresh()), fresh())["status"]["conditions"]
    assert _over_budget(plain) == ""


def test_a_workload_nothing_owns_is_evicted_and_requeued_in_one_write() -> None:
    """The one write carries what the two writes of a Job's Workload carry together."""
    preempted = Eviction(
        reason="Preempted",
        message="for ns/high",
        cluster_queue="cq",
        preemption_reason="InClusterQueue",
    )
    admitted = landed(admission_status(ADMIT)(fresh()), fresh())
    two = landed(
        eviction_done_status(preempted, now_ms=3_000, requeue=(1, 63_000))(
            landed(evicted_status(preempted, now_ms=3_000)(admitted), admitted)
        ),
        landed(evicted_status(preempted, now_ms=3_000)(admitted), admitted),
    )
    build = evicted_at_once_status(preempted, now_ms=3_000, requeue=(1, 63_000))
    one = landed(build(admitted), admitted)
    assert one["status"] == two["status"]
    assert "admission" not in one["status"]
    conditions = {c["type"]: c for c in one["status"]["conditions"]}
    assert conditions["Evicted"]["status"] == "True"
    assert conditions["Preempted"]["status"] == "True"
    assert conditions["QuotaReserved"]["status"] == "False"
    assert one["status"]["schedulingStats"]["evictions"][0]["count"] == 1
    assert build(one) is None, "read back after a lost answer: nothing more to write"


def test_a_workload_finished_meanwhile_is_neither_evicted_nor_stripped_of_its_admission() -> None:
    admitted = landed(admission_status(ADMIT)(fresh()), fresh())
    finished = {
        **admitted,
        "status": {
            **admitted["status"],
            "conditions": [
                *admitted["status"]["conditions"],
                {"type": "Finished", "status": "True", "reason": "Succeeded", "message": ""},
            ],
        },
    }
    assert evicted_status(EVICTION, now_ms=2_000)(finished) is None
    assert eviction_done_status(EVICTION, now_ms=2_000, requeue=None)(finished) is None
    assert evicted_at_once_status(EVICTION, now_ms=2_000, requeue=None)(finished) is None
