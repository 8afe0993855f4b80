"""TrainJobs (Kueue's ``trainer.kubeflow.org/trainjob`` integration) on the local control plane,
with Kubeflow Trainer v2's real controller manager and JobSet's beside it: a labelled TrainJob
is suspended at creation with the Kueue runtime patch; its Workload's pod sets are read from the
JobSet the Trainer makes; it waits whole while quota is short with an explanation, is admitted
whole through the runtime patch, its pods run on KWOK nodes of the admitted flavor, it
completes, and the quota returns to zero. A preempted TrainJob is held, its runtime patch
emptied, re-admitted, and completes. The operator enables the JobSet integration too and the
runtime labels its JobSet with the queue name: the Trainer's JobSet is still not queued itself.

Named to run late, as the trainer addon's own test (its build is among the last)."""

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
from phalanx.operator import trainjob as rules

pytestmark = pytest.mark.integration

POOL = "phx-trainjobs"
POOL_LABEL = "phalanx.dev/test-pool"
TRAINJOBS = "trainjobs.trainer.kubeflow.org"
JOBSETS = "jobsets.jobset.x-k8s.io"
RUNTIME = "phx-torch-queued"
LONG_RUNTIME = "phx-torch-queued-20s"


def a_runtime(name: str = RUNTIME, *, run_seconds: str = "3") -> dict[str, Any]:
    """A one-step torch runtime (the shape of the Trainer's torch-distributed one) whose pods
    run ``run_seconds`` on KWOK."""
    return {
        "apiVersion": rules.API_VERSION,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                # The JobSet gets the runtime's labels: with this one it looks queued, and
                # must still be left to its TrainJob by the JobSet integration.
                "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "lq"}},
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {
                                    "labels": {
                                        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"
                                    }
                                },
                                "spec": {
                                    "template": {
                                        "metadata": {
                                            "annotations": {"phalanx.dev/run-seconds": run_seconds}
                                        },
                                        "spec": {
                                            "containers": [
                                                {"name": "node", "image": "pytorch/pytorch:2"}
                                            ]
                                        },
                                    }
                                },
                            },
                        }
                    ]
                },
            },
        },
    }


def a_trainjob(
    name: str, *, nodes: int, gpus: int, runtime: str = RUNTIME, priority_class: str | None = None
) -> dict[str, Any]:
    resources = {"cpu": "1", "nvidia.com/gpu": str(gpus)}
    labels = {"kueue.x-k8s.io/queue-name": "lq"}
    if priority_class:
        labels["kueue.x-k8s.io/priority-class"] = priority_class
    return {
        "apiVersion": rules.API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "runtimeRef": {"name": runtime},
            "trainer": {
                "numNodes": nodes,
                "resourcesPerNode": {"requests": resources, "limits": resources},
            },
        },
    }


def pods_of(cluster: ClusterHandle, namespace: str, name: str) -> list[dict[str, Any]]:
    return get_list(cluster, "pods", namespace, "-l", f"jobset.sigs.k8s.io/jobset-name={name}")


def kueue_patch(obj: dict[str, Any]) -> dict[str, Any]:
    found = [
        p
        for p in obj["spec"].get("runtimePatches") or ()
        if p["manager"] == rules.RUNTIME_PATCH_MANAGER
    ]
    assert len(found) == 1, obj["spec"].get("runtimePatches")
    return found[0]


@pytest.fixture
def trainjob_operator(
    cluster: ClusterHandle,
    kueue_crds: Path,
    trainer_controller: Path,
    tmp_path: Path,
    cleanup: list[str],
) -> Any:
    """A ClusterQueue of 8 GPUs on a dedicated pool (two 8-GPU nodes), the runtimes, and an
    operator with the TrainJob and JobSet integrations enabled."""
    cq_name = f"trainjobs-{int(time.time()) % 100000}"
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "integrations": {
                    "frameworks": ["batch/job", "jobset.x-k8s.io/jobset", rules.FRAMEWORK]
                },
            }
        )
    )
    with node_pool(cluster, POOL, racks=1, hosts=2):
        cleanup += [
            f"clusterqueue.kueue.x-k8s.io/{cq_name}",
            f"resourceflavor.kueue.x-k8s.io/{POOL}",
            f"clustertrainingruntime.trainer.kubeflow.org/{RUNTIME}",
            f"clustertrainingruntime.trainer.kubeflow.org/{LONG_RUNTIME}",
        ]
        apply(
            cluster,
            a_runtime(),
            a_runtime(LONG_RUNTIME, run_seconds="20"),
            flavor(POOL, pool=POOL),
            cluster_queue(cq_name, flavor_name=POOL, gpus=8),
        )
        op = start_operator(cluster, tmp_path, f"--config={config}", name="trainjobs")

        def log(lines: int = 80) -> str:
            trainer = "\n".join(trainer_controller.read_text(errors="replace").splitlines()[-30:])
            return f"{op.log_tail(lines)}\n---- Trainer ----\n{trainer}"

        try:
            yield cq_name, op, log
        finally:
            op.stop()


def test_a_trainjob_waits_whole_while_quota_is_short_then_one_that_fits_runs_and_completes(
    cluster: ClusterHandle,
    namespace: str,
    trainjob_operator: tuple[str, OperatorProcess, Any],
) -> None:
    cq_name, _op, log = trainjob_operator
    apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)

    # 3 nodes x 4 GPUs = 12 GPUs against 8 of quota: suspended at creation, waits whole.
    apply(cluster, a_trainjob("big", nodes=3, gpus=4), namespace=namespace)
    big = get(cluster, TRAINJOBS, "big", namespace)
    assert big["spec"]["suspend"] is True, "the webhook did not suspend the queued TrainJob"
    assert "replicatedJobs" not in kueue_patch(big)["trainingRuntimeSpec"]["template"]["spec"]
    wl = wait_for(
        "big's Workload, pending with an explanation",
        lambda: (
            (w := workload_of(cluster, namespace, "big", kind="TrainJob"))
            and (c := condition(w, "QuotaReserved"))
            and c["status"] == "False"
            and c.get("message")
            and w
        ),
        timeout=90,
        log=log,
    )
    assert wl["metadata"]["name"] == rules.workload_name("big", big["metadata"]["uid"])
    # Read from the Trainer's JobSet: one pod set per replicated job, numNodes pods.
    assert [(p["name"], p["count"]) for p in wl["spec"]["podSets"]] == [("node", 3)]
    requests = wl["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]
    assert requests["requests"]["nvidia.com/gpu"] == "4"
    pending = condition(wl, "QuotaReserved")
    assert pending is not None and "nvidia.com/gpu" in pending["message"], pending
    # The Trainer's JobSet is the TrainJob's: held, and not queued on its own.
    jobset = get(cluster, JOBSETS, "big", namespace)
    assert jobset["spec"]["suspend"] is True
    time.sleep(3)
    assert pods_of(cluster, namespace, "big") == [], "a pod of the short TrainJob started"
    assert get(cluster, TRAINJOBS, "big", namespace)["spec"]["suspend"] is True

    # 2 nodes x 4 GPUs fit: admitted whole through the runtime patch, runs on the flavor's
    # nodes, completes.
    apply(cluster, a_trainjob("fits", nodes=2, gpus=4), namespace=namespace)
    admitted = wait_for(
        "fits admitted",
        lambda: (
            (w := workload_of(cluster, namespace, "fits", kind="TrainJob"))
            and is_true(w, "Admitted")
            and w
        ),
        timeout=90,
        log=log,
    )
    assignments = admitted["status"]["admission"]["podSetAssignments"]
    assert [(a["name"], a["count"]) for a in assignments] == [("node", 2)]
    started = get(cluster, TRAINJOBS, "fits", namespace)
    assert started["spec"]["suspend"] is False
    [patched] = kueue_patch(started)["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = patched["template"]["spec"]["template"]
    assert patched["name"] == "node"
    assert pod["spec"]["nodeSelector"] == {POOL_LABEL: POOL}
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "node"
    assert pod["metadata"]["annotations"]["kueue.x-k8s.io/workload"] == admitted["metadata"]["name"]
    pods = wait_for(
        "fits' 2 pods bound to the pool's nodes",
        lambda: (
            (ps := pods_of(cluster, namespace, "fits"))
            and len(ps) == 2
            and all(p["spec"].get("nodeName", "").startswith(POOL) for p in ps)
            and ps
        ),
        timeout=90,
        log=log,
    )
    assert all(p["spec"]["nodeSelector"] == {POOL_LABEL: POOL} for p in pods)
    wait_for(
        "fits Complete and its Workload Finished",
        lambda: (
            is_true(get(cluster, TRAINJOBS, "fits", namespace), "Complete")
            and (w := workload_of(cluster, namespace, "fits", kind="TrainJob"))
            and is_true(w, "Finished")
        ),
        timeout=120,
        log=log,
    )
    finished = condition(workload_of(cluster, namespace, "fits", kind="TrainJob") or {}, "Finished")
    assert finished is not None and finished["reason"] == "Succeeded"
    # No Workload of the Trainer's JobSets: the TrainJobs are what is queued.
    owners = [
        o["kind"]
        for w in get_list(cluster, "workloads.kueue.x-k8s.io", namespace)
        for o in w["metadata"].get("ownerReferences") or ()
    ]
    assert sorted(owners) == ["TrainJob", "TrainJob"], owners
    assert not is_true(
        workload_of(cluster, namespace, "big", kind="TrainJob") or {}, "QuotaReserved"
    )
    cluster.kubectl_ok("delete", TRAINJOBS, "big", "-n", namespace, "--wait=false")
    wait_for("the quota back to zero", lambda: gpu_usage(cluster, cq_name) == ("0", 0), log=log)


def test_a_preempted_trainjob_is_suspended_its_patch_emptied_readmitted_and_completes(
    cluster: ClusterHandle,
    namespace: str,
    trainjob_operator: tuple[str, OperatorProcess, Any],
    cleanup: list[str],
) -> None:
    cq_name, _op, log = trainjob_operator
    low, high, classes = priority_classes(namespace, cleanup)
    apply(
        cluster,
        *classes,
        cluster_queue(
            cq_name, flavor_name=POOL, gpus=8, preemption={"withinClusterQueue": "LowerPriority"}
        ),
    )
    apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)
    # 20 s of work: long enough to be preempted while running, short enough once re-admitted.
    apply(
        cluster,
        a_trainjob("low", nodes=2, gpus=4, runtime=LONG_RUNTIME, priority_class=low),
        namespace=namespace,
    )
    wait_for(
        "low's 2 pods running on the pool",
        lambda: (
            (ps := pods_of(cluster, namespace, "low"))
            and len(ps) == 2
            and all(p["spec"].get("nodeName", "").startswith(POOL) for p in ps)
        ),
        timeout=90,
        log=log,
    )
    # A higher-priority Job of all 8 GPUs preempts it.
    apply(
        cluster,
        gpu_job("urgent", queue="lq", gpus=8, run_seconds="8", priority_class=high),
        namespace=namespace,
    )
    wait_for(
        "low evicted (preempted)",
        lambda: (
            (w := workload_of(cluster, namespace, "low", kind="TrainJob"))
            and is_true(w, "Evicted")
            and condition(w, "Preempted") is not None
        ),
        log=log,
    )
    wait_for(
        "low suspended with its runtime patch emptied, its pods gone and urgent admitted",
        lambda: (
            (tj := get(cluster, TRAINJOBS, "low", namespace))["spec"]["suspend"] is True
            and "replicatedJobs" not in kueue_patch(tj)["trainingRuntimeSpec"]["template"]["spec"]
            and pods_of(cluster, namespace, "low") == []
            and any(
                is_true(w, "Admitted")
                for w in get_list(cluster, "workloads.kueue.x-k8s.io", namespace)
                if w["metadata"]["name"].startswith("job-urgent-")
            )
        ),
        timeout=90,
        log=log,
    )
    # The Trainer rebuilt the JobSet from the runtime as submitted: no admission in it.
    jobset = get(cluster, JOBSETS, "low", namespace)
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert "kueue.x-k8s.io/workload" not in (template["metadata"].get("annotations") or {})
    # urgent finishes; low is admitted again, resumed by the Trainer, completes.
    wait_for(
        "low re-admitted and running again",
        lambda: (
            (w := workload_of(cluster, namespace, "low", kind="TrainJob"))
            and is_true(w, "Admitted")
            and not is_true(w, "Evicted")
            and get(cluster, TRAINJOBS, "low", namespace)["spec"]["suspend"] is False
            and len(pods_of(cluster, namespace, "low")) == 2
        ),
        timeout=120,
        log=log,
    )
    wait_for(
        "low Complete and its Workload Finished",
        lambda: (
            is_true(get(cluster, TRAINJOBS, "low", namespace), "Complete")
            and is_true(workload_of(cluster, namespace, "low", kind="TrainJob") or {}, "Finished")
        ),
        timeout=150,
        log=log,
    )
    wait_for("the quota back to zero", lambda: gpu_usage(cluster, cq_name) == ("0", 0), log=log)
