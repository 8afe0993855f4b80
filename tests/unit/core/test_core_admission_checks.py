"""Admission checks in the core: a ClusterQueue naming a missing or inactive AdmissionCheck
admits nothing (Kueue's AdmissionCheckNotFound / AdmissionCheckInactive), and a workload
evicted by a check in Retry waits until the check's retry time before it is tried again."""

from __future__ import annotations

import pytest
from core_builders import Cluster, MakeClusterQueue, MakeFlavorQuotas, MakeWorkload, admitted_names

from phalanx.admission.decisions import PendingReason
from phalanx.admission.records import Phase


def checked_queue(*checks: str) -> MakeClusterQueue:
    return (
        MakeClusterQueue("cq")
        .resource_group(MakeFlavorQuotas("default").resource("cpu", "4"))
        .admission_checks(*checks)
    )


def job(name: str, cpu: str = "1", created: int = 0) -> MakeWorkload:
    return MakeWorkload(name).queue("cq").request("cpu", cpu).created(created)


@pytest.mark.parametrize(
    ("checks", "reason"),
    [
        ({}, "AdmissionCheckNotFound: references missing AdmissionCheck(s): prov"),
        ({"prov": False}, "AdmissionCheckInactive: references inactive AdmissionCheck(s): prov"),
        ({"prov": True}, "Ready"),
    ],
)
def test_queue_is_active_only_when_its_checks_exist_and_are_active(
    checks: dict[str, bool], reason: str
) -> None:
    cluster = Cluster(queues=[checked_queue("prov").obj()])
    for name, active in checks.items():
        cluster.scheduler.apply_admission_check(name, active=active)
    status = cluster.scheduler.cluster_queue_status("cq")
    assert status is not None and status.reason == reason
    result = cluster.submit(job("w")).cycle()
    if reason == "Ready":
        assert admitted_names(result) == ["w"]
    else:
        assert admitted_names(result) == []
        explanation = cluster.scheduler.explain("default/w")
        assert explanation is not None
        assert explanation.reason == PendingReason.CLUSTER_QUEUE_INACTIVE
        assert reason.split(": ", 1)[1] in explanation.message


def test_a_check_becoming_active_wakes_the_queue_and_deleting_it_stops_admission() -> None:
    cluster = Cluster(queues=[checked_queue("prov").obj()])
    cluster.scheduler.apply_admission_check("prov", active=False)
    assert admitted_names(cluster.submit(job("a")).cycle()) == []
    cluster.scheduler.apply_admission_check("prov", active=True)
    assert admitted_names(cluster.cycle()) == ["a"]
    cluster.scheduler.delete_admission_check("prov")
    assert admitted_names(cluster.submit(job("b", created=1)).cycle()) == []


def test_a_queue_without_checks_ignores_admission_check_objects() -> None:
    cluster = Cluster(queues=[checked_queue().obj()])
    cluster.scheduler.apply_admission_check("prov", active=False)
    assert admitted_names(cluster.submit(job("w")).cycle()) == ["w"]


def test_retry_eviction_waits_until_the_checks_retry_time() -> None:
    cluster = Cluster(queues=[checked_queue("prov").obj()])
    cluster.scheduler.apply_admission_check("prov", active=True)
    cluster.admit_all(job("w"))
    assert cluster.usage("cq") == 1000  # quota reserved while the check is pending
    evicted_at = cluster.now
    cluster.scheduler.workload_evicted("default/w", now=evicted_at, requeue_at=evicted_at + 60_000)
    entry = cluster.scheduler.entries["default/w"]
    assert entry.phase == Phase.PENDING and entry.requeue_count == 0
    assert cluster.usage("cq") == 0
    explanation = cluster.scheduler.explain("default/w")
    assert explanation is not None and explanation.reason == PendingReason.BACKOFF
    assert cluster.cycle(59_999).admitted == ()
    assert admitted_names(cluster.cycle(1)) == ["w"]
