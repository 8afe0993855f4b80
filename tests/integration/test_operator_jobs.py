"""Jobs end to end: suspension at creation, Workload, admission, running on the flavor's
nodes, completion and quota release; unlabelled Jobs untouched; missing and deleted
LocalQueues leave Jobs suspended with a clear condition."""

from __future__ import annotations

import json
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
    gpu_job,
    gpu_usage,
    is_true,
    job_pods,
    local_queue,
    node_pool,
    wait_for,
    workload_of,
)

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

POOL = "phx-jobs"
CQ = "phx-jobs-cq"


@pytest.fixture(scope="module")
def jobs_pool(cluster: ClusterHandle, phalanx_operator: OperatorProcess) -> Iterator[list[str]]:
    with node_pool(cluster, POOL, racks=1, hosts=4) as nodes:
        apply(cluster, flavor(POOL, pool=POOL), cluster_queue(CQ, flavor_name=POOL, gpus=32))
        try:
            yield nodes
        finally:
            delete_cluster_objects(
                cluster,
                f"clusterqueue.kueue.x-k8s.io/{CQ}",
                f"resourceflavor.kueue.x-k8s.io/{POOL}",
            )


def test_labelled_job_is_suspended_admitted_run_and_frees_its_quota(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, jobs_pool: list[str], namespace: str
) -> None:
    log = phalanx_operator.log_tail
    apply(cluster, local_queue("lq", cluster_queue_name=CQ), namespace=namespace)
    # Created with suspend: false; the object the API server stores (the create response,
    # before the operator can admit and start it) must already be suspended by the webhook.
    job = gpu_job("train", queue="lq", pods=2, run_seconds="4", suspend=False)
    created = json.loads(
        cluster.kubectl_ok(
            "create", "-n", namespace, "-o", "json", "-f", "-", input=json.dumps(job)
        )
    )
    assert created["spec"]["suspend"] is True, "the mutating webhook did not suspend the Job"

    wl = wait_for("the Job's Workload", lambda: workload_of(cluster, namespace, "train"), log=log)
    assert wl["metadata"]["name"].startswith("job-train-")
    assert wl["spec"]["queueName"] == "lq"
    assert wl["spec"]["podSets"][0]["count"] == 2

    admitted = wait_for(
        "admission",
        lambda: (w := workload_of(cluster, namespace, "train")) and is_true(w, "Admitted") and w,
        log=log,
    )
    assignment = admitted["status"]["admission"]
    assert assignment["clusterQueue"] == CQ
    assert assignment["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"] == POOL
    assert assignment["podSetAssignments"][0]["resourceUsage"]["nvidia.com/gpu"] == "16"

    pods = wait_for(
        "2 running pods",
        lambda: (
            (p := job_pods(cluster, namespace, "train"))
            and len(p) == 2
            and all(x["status"].get("phase") in ("Running", "Succeeded") for x in p)
            and p
        ),
        log=log,
    )
    for pod in pods:
        assert pod["spec"]["nodeName"] in jobs_pool, "ran outside the flavor's nodes"
        assert pod["spec"]["nodeSelector"]["phalanx.dev/test-pool"] == POOL

    wait_for(
        "Job completion",
        lambda: is_true(get(cluster, "job", "train", namespace), "Complete"),
        timeout=60,
        log=log,
    )
    finished = wait_for(
        "Workload Finished",
        lambda: (w := workload_of(cluster, namespace, "train")) and is_true(w, "Finished") and w,
        log=log,
    )
    assert condition(finished, "Finished")["reason"] == "Succeeded"
    wait_for("quota back to zero", lambda: gpu_usage(cluster, CQ) == ("0", 0), timeout=20, log=log)
    metrics = phalanx_operator.metrics()
    assert f'kueue_admitted_workloads_total{{cluster_queue="{CQ}"}}' in metrics
    assert "phalanx_scheduling_cycle_duration_seconds_count" in metrics


def test_job_without_the_queue_label_is_untouched(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, jobs_pool: list[str], namespace: str
) -> None:
    job = gpu_job("plain", queue=None, pods=1, gpus=0, run_seconds="2")
    apply(cluster, job, namespace=namespace)
    assert not get(cluster, "job", "plain", namespace)["spec"].get("suspend")
    wait_for(
        "the unqueued Job to complete on its own",
        lambda: is_true(get(cluster, "job", "plain", namespace), "Complete"),
        timeout=60,
    )
    assert workload_of(cluster, namespace, "plain") is None
    annotations = get(cluster, "job", "plain", namespace)["spec"]["template"]["metadata"].get(
        "annotations", {}
    )
    assert "kueue.x-k8s.io/workload" not in annotations


def _quota_reserved_message(cluster: ClusterHandle, namespace: str, job: str) -> Any:
    wl = workload_of(cluster, namespace, job)
    c = condition(wl, "QuotaReserved") if wl else None
    return c if c and c.get("status") == "False" else None


def test_job_naming_a_missing_local_queue_stays_suspended_with_a_clear_condition(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, jobs_pool: list[str], namespace: str
) -> None:
    apply(cluster, gpu_job("lost", queue="no-such-queue"), namespace=namespace)
    reserved = wait_for(
        "a QuotaReserved=False condition",
        lambda: _quota_reserved_message(cluster, namespace, "lost"),
        log=phalanx_operator.log_tail,
    )
    assert reserved["reason"] == "Inadmissible"
    assert "LocalQueue no-such-queue doesn't exist" in reserved["message"]
    assert get(cluster, "job", "lost", namespace)["spec"]["suspend"] is True
    assert job_pods(cluster, namespace, "lost") == []


def test_deleting_a_local_queue_leaves_its_jobs_suspended_with_the_reason(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, jobs_pool: list[str], namespace: str
) -> None:
    log = phalanx_operator.log_tail
    # A stopped ClusterQueue keeps the Job pending (and therefore suspended) meanwhile.
    stopped = f"{CQ}-held"
    held = cluster_queue(stopped, flavor_name=POOL, gpus=8)
    held["spec"]["stopPolicy"] = "Hold"
    apply(cluster, held)
    try:
        apply(cluster, local_queue("lq", cluster_queue_name=stopped), namespace=namespace)
        apply(cluster, gpu_job("waits", queue="lq"), namespace=namespace)
        wait_for(
            "a pending explanation",
            lambda: (
                (c := _quota_reserved_message(cluster, namespace, "waits"))
                and "stopped" in c["message"]
            ),
            log=log,
        )
        cluster.kubectl_ok("delete", "localqueue.kueue.x-k8s.io", "lq", "-n", namespace)
        reserved = wait_for(
            "the LocalQueue-missing condition",
            lambda: (
                (c := _quota_reserved_message(cluster, namespace, "waits"))
                and "doesn't exist" in c["message"]
                and c
            ),
            timeout=30,
            log=log,
        )
        assert reserved["reason"] == "Inadmissible"
        assert "LocalQueue lq doesn't exist" in reserved["message"]
        assert get(cluster, "job", "waits", namespace)["spec"]["suspend"] is True
        assert job_pods(cluster, namespace, "waits") == []
    finally:
        delete_cluster_objects(cluster, f"clusterqueue.kueue.x-k8s.io/{stopped}")


def test_a_job_whose_workload_create_failed_is_retried_without_a_change(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, jobs_pool: list[str], namespace: str
) -> None:
    """A failed Workload create (here: the namespace's ResourceQuota allows no Workloads)
    is retried with backoff; the Job gets its Workload once the obstacle is gone, without
    anyone touching the Job (found by the SIGKILL fault test: a webhook still pointing at
    the killed process failed the create, and nothing retried it)."""
    log = phalanx_operator.log_tail
    apply(
        cluster,
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "no-workloads"},
            "spec": {"hard": {"count/workloads.kueue.x-k8s.io": "0"}},
        },
        namespace=namespace,
    )
    apply(cluster, local_queue("lq", cluster_queue_name=CQ), namespace=namespace)
    apply(cluster, gpu_job("blocked", queue="lq", pods=1, run_seconds="2"), namespace=namespace)
    wait_for(
        "the operator to report the failed create",
        lambda: any(
            "event=workload_create_failed" in line and "/blocked" in line
            for line in phalanx_operator.log.read_text(errors="replace").splitlines()
        ),
        timeout=30,
        log=log,
    )
    assert workload_of(cluster, namespace, "blocked") is None
    cluster.kubectl_ok("delete", "resourcequota", "no-workloads", "-n", namespace)
    wait_for(
        "the Job to complete after the retried create",
        lambda: is_true(get(cluster, "job", "blocked", namespace), "Complete"),
        timeout=90,
        log=log,
    )
    workload = workload_of(cluster, namespace, "blocked")
    assert workload is not None and is_true(workload, "Admitted")
