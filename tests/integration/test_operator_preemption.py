"""Borrowing inside a cohort, reclaim preemption when the lender needs its quota back, and
priority preemption within a ClusterQueue, asserted on Workloads, Jobs and pods."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    OperatorProcess,
    apply,
    cluster_queue,
    condition,
    delete_cluster_objects,
    flavor,
    get,
    get_list,
    gpu_job,
    is_true,
    job_pods,
    local_queue,
    node_pool,
    wait_for,
    workload_of,
)

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

POOL = "phx-pre"


@pytest.fixture(scope="module")
def pre_pool(cluster: ClusterHandle, phalanx_operator: OperatorProcess) -> Iterator[list[str]]:
    with node_pool(cluster, POOL, racks=1, hosts=6) as nodes:
        apply(cluster, flavor(POOL, pool=POOL))
        try:
            yield nodes
        finally:
            delete_cluster_objects(cluster, f"resourceflavor.kueue.x-k8s.io/{POOL}")


def _admitted(cluster: ClusterHandle, namespace: str, job: str) -> bool:
    wl = workload_of(cluster, namespace, job)
    return bool(wl and is_true(wl, "Admitted"))


def _running(cluster: ClusterHandle, namespace: str, job: str, count: int) -> bool:
    pods = [p for p in job_pods(cluster, namespace, job) if p["status"].get("phase") == "Running"]
    return len(pods) == count


def _borrowed(cluster: ClusterHandle, cq: str) -> str:
    status = get(cluster, "clusterqueues.kueue.x-k8s.io", cq).get("status") or {}
    for fl in status.get("flavorsUsage") or ():
        for res in fl["resources"]:
            if res["name"] == "nvidia.com/gpu":
                return str(res.get("borrowed", "0"))
    return "0"


def test_borrowing_in_a_cohort_then_reclaim_when_the_lender_needs_its_quota(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, pre_pool: list[str], namespace: str
) -> None:
    log = phalanx_operator.log_tail
    lender, borrower = f"{namespace}-a", f"{namespace}-b"
    apply(
        cluster,
        cluster_queue(
            lender,
            flavor_name=POOL,
            gpus=16,
            cohort=namespace,
            preemption={"reclaimWithinCohort": "Any"},
        ),
        cluster_queue(borrower, flavor_name=POOL, gpus=16, cohort=namespace),
    )
    try:
        apply(
            cluster,
            local_queue("lq-a", cluster_queue_name=lender),
            local_queue("lq-b", cluster_queue_name=borrower),
            namespace=namespace,
        )
        # The borrower runs 4 x 8 GPUs on 16 GPUs of quota: 16 borrowed from the idle lender.
        b_jobs = [f"b{i}" for i in range(4)]
        for name in b_jobs:
            apply(cluster, gpu_job(name, queue="lq-b"), namespace=namespace)
        wait_for(
            "all four borrower Jobs admitted",
            lambda: all(_admitted(cluster, namespace, j) for j in b_jobs),
            log=log,
        )
        wait_for("16 GPUs borrowed", lambda: _borrowed(cluster, borrower) == "16", log=log)
        wait_for(
            "borrower pods running",
            lambda: all(_running(cluster, namespace, j, 1) for j in b_jobs),
            log=log,
        )

        # The lender wants its 16 GPUs: two borrowing workloads must go.
        apply(cluster, gpu_job("a0", queue="lq-a", pods=2), namespace=namespace)
        wait_for(
            "the lender's Job admitted",
            lambda: _admitted(cluster, namespace, "a0"),
            timeout=60,
            log=log,
        )
        wait_for(
            "its 2 pods running", lambda: _running(cluster, namespace, "a0", 2), timeout=60, log=log
        )

        preempted: list[dict[str, Any]] = []
        for name in b_jobs:
            wl = workload_of(cluster, namespace, name)
            assert wl is not None
            if is_true(wl, "Preempted"):
                preempted.append(wl)
                assert condition(wl, "Preempted")["reason"] == "InCohortReclamation"
                assert condition(wl, "Evicted")["reason"] == "Preempted"
                assert not is_true(wl, "Admitted")
                assert get(cluster, "job", name, namespace)["spec"]["suspend"] is True
        assert len(preempted) == 2, [w["metadata"]["name"] for w in preempted]
        still = [j for j in b_jobs if _admitted(cluster, namespace, j)]
        assert len(still) == 2
        wait_for("no borrowing left", lambda: _borrowed(cluster, borrower) == "0", log=log)
        metrics = phalanx_operator.metrics()
        assert (
            f'kueue_preempted_workloads_total{{preempting_cluster_queue="{lender}",'
            f'reason="InCohortReclamation"}} 2.0'
        ) in metrics
    finally:
        delete_cluster_objects(
            cluster,
            f"clusterqueue.kueue.x-k8s.io/{lender}",
            f"clusterqueue.kueue.x-k8s.io/{borrower}",
        )


def test_higher_priority_preempts_within_a_cluster_queue(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, pre_pool: list[str], namespace: str
) -> None:
    log = phalanx_operator.log_tail
    cq = f"{namespace}-c"
    low, high = f"{namespace}-low", f"{namespace}-high"
    apply(
        cluster,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": low},
            "value": 100,
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": high},
            "value": 1000,
        },
        cluster_queue(
            cq, flavor_name=POOL, gpus=16, preemption={"withinClusterQueue": "LowerPriority"}
        ),
    )
    try:
        apply(cluster, local_queue("lq", cluster_queue_name=cq), namespace=namespace)
        for name in ("low0", "low1"):
            apply(cluster, gpu_job(name, queue="lq", priority_class=low), namespace=namespace)
        wait_for(
            "both low-priority Jobs admitted",
            lambda: _admitted(cluster, namespace, "low0") and _admitted(cluster, namespace, "low1"),
            log=log,
        )
        low_wl = workload_of(cluster, namespace, "low0")
        assert low_wl is not None and low_wl["spec"]["priority"] == 100
        assert low_wl["spec"]["priorityClassRef"]["name"] == low

        apply(cluster, gpu_job("urgent", queue="lq", priority_class=high), namespace=namespace)
        wait_for(
            "the high-priority Job admitted",
            lambda: _admitted(cluster, namespace, "urgent"),
            timeout=60,
            log=log,
        )
        wait_for(
            "its pod running",
            lambda: _running(cluster, namespace, "urgent", 1),
            timeout=60,
            log=log,
        )
        victims = [
            w
            for w in (workload_of(cluster, namespace, n) for n in ("low0", "low1"))
            if w is not None and is_true(w, "Preempted")
        ]
        assert len(victims) == 1
        assert condition(victims[0], "Preempted")["reason"] == "InClusterQueue"
        victim_job = victims[0]["metadata"]["ownerReferences"][0]["name"]
        assert get(cluster, "job", victim_job, namespace)["spec"]["suspend"] is True
        wait_for(
            "the victim's pods gone", lambda: _running(cluster, namespace, victim_job, 0), log=log
        )
        events = get_list(cluster, "events", namespace, "--field-selector", "reason=Preempted")
        assert any(e["involvedObject"]["name"] == victims[0]["metadata"]["name"] for e in events)
    finally:
        delete_cluster_objects(
            cluster,
            f"clusterqueue.kueue.x-k8s.io/{cq}",
            f"workloadpriorityclass.kueue.x-k8s.io/{low}",
            f"workloadpriorityclass.kueue.x-k8s.io/{high}",
        )
