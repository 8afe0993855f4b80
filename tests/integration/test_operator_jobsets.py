"""JobSets (Kueue's ``jobset.x-k8s.io/jobset`` integration) on the local control plane, with
JobSet's real controller (``sigs.k8s.io/jobset``, built from its Go module) beside it: a
labelled JobSet is suspended at creation and gets a Workload with one pod set per replicated
job; it waits whole while quota is short, is admitted whole, its pods run on KWOK nodes of the
admitted flavor and it completes; a preempted JobSet is suspended through ``spec.suspend``
with its templates restored, re-admitted later and completes; the quota returns to zero."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    OperatorProcess,
    apply,
    cluster_queue,
    condition,
    flavor,
    get,
    get_list,
    gpu_job,
    gpu_usage,
    is_true,
    local_queue,
    node_pool,
    priority_classes,
    start_operator,
    wait_for,
    workload_of,
)

from phalanx.devcluster.handle import ClusterHandle
from phalanx.operator import jobset as rules

pytestmark = pytest.mark.integration

POOL = "phx-jobsets"
JOBSETS = "jobsets.jobset.x-k8s.io"
POOL_LABEL = "phalanx.dev/test-pool"


def a_jobset(
    name: str,
    *,
    workers: int,
    gpus: int,
    run_seconds: str = "3",
    priority_class: str | None = None,
) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": "lq"}
    if priority_class:
        labels["kueue.x-k8s.io/priority-class"] = priority_class

    def replicated(rname: str, replicas: int, requests: dict[str, str]) -> dict[str, Any]:
        return {
            "name": rname,
            "replicas": replicas,
            "template": {
                "spec": {
                    "parallelism": 1,
                    "completions": 1,
                    # Pods deleted by a suspension may count as failures of the child Job.
                    "backoffLimit": 4,
                    "template": {
                        "metadata": {"annotations": {"phalanx.dev/run-seconds": run_seconds}},
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": rname,
                                    "image": "example.invalid/train:1",
                                    "resources": {"requests": requests, "limits": requests},
                                }
                            ],
                        },
                    },
                }
            },
        }

    return {
        "apiVersion": rules.API_VERSION,
        "kind": "JobSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicatedJobs": [
                replicated("driver", 1, {"cpu": "1"}),
                replicated("workers", workers, {"cpu": "1", "nvidia.com/gpu": str(gpus)}),
            ]
        },
    }


def jobset_pods(cluster: ClusterHandle, namespace: str, name: str) -> list[dict[str, Any]]:
    return get_list(cluster, "pods", namespace, "-l", f"{rules.JOBSET_NAME_LABEL}={name}")


def templates(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r["template"]["spec"]["template"] for r in obj["spec"]["replicatedJobs"]}


@pytest.fixture
def jobset_operator(
    cluster: ClusterHandle,
    kueue_crds: Path,
    jobset_controller: Path,
    tmp_path: Path,
    cleanup: list[str],
) -> Any:
    """A ClusterQueue of 8 GPUs on a dedicated pool (two 8-GPU nodes) and an operator with
    the JobSet integration enabled (integrations.frameworks)."""
    cq_name = f"jobsets-{int(time.time()) % 100000}"
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "integrations": {"frameworks": ["batch/job", rules.FRAMEWORK]},
            }
        )
    )
    with node_pool(cluster, POOL, racks=1, hosts=2):
        cleanup += [
            f"clusterqueue.kueue.x-k8s.io/{cq_name}",
            f"resourceflavor.kueue.x-k8s.io/{POOL}",
        ]
        apply(cluster, flavor(POOL, pool=POOL), cluster_queue(cq_name, flavor_name=POOL, gpus=8))
        op = start_operator(cluster, tmp_path, f"--config={config}", name="jobsets")

        def log(lines: int = 80) -> str:
            controller = "\n".join(jobset_controller.read_text(errors="replace").splitlines()[-30:])
            return f"{op.log_tail(lines)}\n---- JobSet controller ----\n{controller}"

        try:
            yield cq_name, op, log
        finally:
            op.stop()


def test_a_jobset_waits_whole_while_quota_is_short_then_one_that_fits_runs_and_completes(
    cluster: ClusterHandle,
    namespace: str,
    jobset_operator: tuple[str, OperatorProcess, Any],
) -> None:
    cq_name, _op, log = jobset_operator
    apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)

    # 3 workers x 4 GPUs = 12 GPUs against 8 of quota: suspended at creation, waits whole.
    apply(cluster, a_jobset("big", workers=3, gpus=4), namespace=namespace)
    big = get(cluster, JOBSETS, "big", namespace)
    assert big["spec"]["suspend"] is True, "the webhook did not suspend the queued JobSet"
    wl = wait_for(
        "big's Workload, pending with an explanation",
        lambda: (
            (w := workload_of(cluster, namespace, "big", kind="JobSet"))
            and (c := condition(w, "QuotaReserved"))
            and c["status"] == "False"
            and c.get("message")
            and w
        ),
        log=log,
    )
    assert wl["metadata"]["name"] == rules.workload_name("big", big["metadata"]["uid"])
    assert [(p["name"], p["count"]) for p in wl["spec"]["podSets"]] == [
        ("driver", 1),
        ("workers", 3),
    ]
    pending = condition(wl, "QuotaReserved")
    assert pending is not None and "nvidia.com/gpu" in pending["message"], pending
    time.sleep(3)
    assert jobset_pods(cluster, namespace, "big") == [], "a pod of the short JobSet started"
    assert get(cluster, JOBSETS, "big", namespace)["spec"]["suspend"] is True

    # 2 workers x 4 GPUs fit: admitted whole, runs on the flavor's nodes, completes.
    apply(cluster, a_jobset("fits", workers=2, gpus=4), namespace=namespace)
    admitted = wait_for(
        "fits admitted",
        lambda: (
            (w := workload_of(cluster, namespace, "fits", kind="JobSet"))
            and is_true(w, "Admitted")
            and w
        ),
        log=log,
    )
    assignments = {a["name"]: a for a in admitted["status"]["admission"]["podSetAssignments"]}
    assert {n: a["count"] for n, a in assignments.items()} == {"driver": 1, "workers": 2}
    started = get(cluster, JOBSETS, "fits", namespace)
    assert started["spec"]["suspend"] is False
    assert {n: t["spec"]["nodeSelector"] for n, t in templates(started).items()} == {
        "driver": {POOL_LABEL: POOL},
        "workers": {POOL_LABEL: POOL},
    }
    pods = wait_for(
        "fits' 3 pods bound to the pool's nodes",
        lambda: (
            (ps := jobset_pods(cluster, namespace, "fits"))
            and len(ps) == 3
            and all(p["spec"].get("nodeName", "").startswith(POOL) for p in ps)
            and ps
        ),
        log=log,
    )
    assert all(p["spec"]["nodeSelector"] == {POOL_LABEL: POOL} for p in pods)
    wait_for(
        "fits Completed and its Workload Finished",
        lambda: (
            is_true(get(cluster, JOBSETS, "fits", namespace), "Completed")
            and (w := workload_of(cluster, namespace, "fits", kind="JobSet"))
            and is_true(w, "Finished")
        ),
        timeout=120,
        log=log,
    )
    finished = condition(workload_of(cluster, namespace, "fits", kind="JobSet") or {}, "Finished")
    assert finished is not None and finished["reason"] == "Succeeded"
    assert not is_true(workload_of(cluster, namespace, "big", kind="JobSet") or {}, "QuotaReserved")
    cluster.kubectl_ok("delete", JOBSETS, "big", "-n", namespace, "--wait=false")
    wait_for("the quota back to zero", lambda: gpu_usage(cluster, cq_name) == ("0", 0), log=log)


def test_a_preempted_jobset_is_suspended_restored_readmitted_and_completes(
    cluster: ClusterHandle,
    namespace: str,
    jobset_operator: tuple[str, OperatorProcess, Any],
    cleanup: list[str],
) -> None:
    cq_name, _op, log = jobset_operator
    low, high, classes = priority_classes(namespace, cleanup)
    apply(
        cluster,
        *classes,
        cluster_queue(
            cq_name, flavor_name=POOL, gpus=8, preemption={"withinClusterQueue": "LowerPriority"}
        ),
    )
    # Long enough to be preempted while running, short enough to finish once re-admitted.
    # Created before its LocalQueue, so that the templates read back are the submitted ones
    # (with the queue there, it can be admitted and started before the read).
    apply(
        cluster,
        a_jobset("low", workers=2, gpus=4, run_seconds="30", priority_class=low),
        namespace=namespace,
    )
    original = templates(get(cluster, JOBSETS, "low", namespace))
    apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)
    wait_for(
        "low's 3 pods running on the pool",
        lambda: (
            (ps := jobset_pods(cluster, namespace, "low"))
            and len(ps) == 3
            and all(p["spec"].get("nodeName", "").startswith(POOL) for p in ps)
        ),
        log=log,
    )
    # A higher-priority Job of all 8 GPUs preempts it; it runs 10 s, long enough to see low
    # held.
    apply(
        cluster,
        gpu_job("urgent", queue="lq", gpus=8, run_seconds="10", priority_class=high),
        namespace=namespace,
    )
    wait_for(
        "low evicted (preempted)",
        lambda: (
            (w := workload_of(cluster, namespace, "low", kind="JobSet"))
            and (c := condition(w, "Evicted"))
            and c["status"] == "True"
            and condition(w, "Preempted") is not None
        ),
        log=log,
    )
    seen: list[Any] = []

    def restored() -> bool:
        js = get(cluster, JOBSETS, "low", namespace)
        seen[:] = [js["spec"].get("suspend"), templates(js)]
        return js["spec"]["suspend"] is True and templates(js) == original

    try:
        wait_for(
            "low suspended through spec.suspend with its templates restored",
            restored,
            log=log,
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\nlast seen: {seen}\noriginal: {original}") from None
    wait_for(
        "low's pods gone and urgent admitted",
        lambda: (
            jobset_pods(cluster, namespace, "low") == []
            and any(
                is_true(w, "Admitted")
                for w in get_list(cluster, "workloads.kueue.x-k8s.io", namespace)
                if w["metadata"]["name"].startswith("job-urgent-")
            )
        ),
        log=log,
    )
    # urgent finishes; low is admitted again, resumed by the JobSet controller, completes.
    readmitted = wait_for(
        "low re-admitted and running again",
        lambda: (
            (w := workload_of(cluster, namespace, "low", kind="JobSet"))
            and is_true(w, "Admitted")
            and not is_true(w, "Evicted")
            and get(cluster, JOBSETS, "low", namespace)["spec"]["suspend"] is False
            and len(jobset_pods(cluster, namespace, "low")) == 3
            and w
        ),
        timeout=120,
        log=log,
    )
    assert readmitted["status"]["admission"]["podSetAssignments"][1]["name"] == "workers"
    wait_for(
        "low Completed and its Workload Finished",
        lambda: (
            is_true(get(cluster, JOBSETS, "low", namespace), "Completed")
            and is_true(workload_of(cluster, namespace, "low", kind="JobSet") or {}, "Finished")
        ),
        timeout=150,
        log=log,
    )
    wait_for("the quota back to zero", lambda: gpu_usage(cluster, cq_name) == ("0", 0), log=log)


def test_a_queued_jobset_of_a_disabled_integration_is_left_alone_with_an_event(
    cluster: ClusterHandle,
    kueue_crds: Path,
    jobset_controller: Path,
    tmp_path: Path,
    namespace: str,
) -> None:
    """The default frameworks (batch/job only, as in Kueue), and an operator that may list
    JobSets: the labelled JobSet runs as if Phalanx were not there, and is told why.
    Catches an operator that watches only enabled kinds (no Event) or that queues them."""
    op = start_operator(cluster, tmp_path, name="jobsets-disabled")
    try:
        apply(cluster, a_jobset("free", workers=1, gpus=0), namespace=namespace)
        event = wait_for(
            "the IntegrationNotEnabled event on the JobSet",
            lambda: next(
                (
                    e
                    for e in get_list(cluster, "events", namespace)
                    if e.get("reason") == "IntegrationNotEnabled"
                    and e["involvedObject"].get("kind") == "JobSet"
                ),
                None,
            ),
            log=op.log_tail,
        )
        assert event["involvedObject"]["name"] == "free"
        assert event["type"] == "Normal"
        assert f"the integration {rules.FRAMEWORK!r} is not enabled" in event["message"]
        js = get(cluster, JOBSETS, "free", namespace)
        assert not js["spec"].get("suspend"), "a JobSet of a disabled integration was suspended"
        wait_for(
            "the JobSet's pods created by its own controller, never held by Phalanx",
            lambda: jobset_pods(cluster, namespace, "free"),
            log=op.log_tail,
        )
        assert workload_of(cluster, namespace, "free", kind="JobSet") is None, "a Workload was made"
    finally:
        op.stop()
