"""RayJobs (Kueue's ``ray.io/rayjob`` integration) on the local control plane, with KubeRay's
real operator (``github.com/ray-project/kuberay/ray-operator``, built from its Go module)
beside it: a labelled RayJob is suspended at creation and gets a Workload with pod sets
``head``, one per worker group and ``submitter``; it waits whole while quota is short, is
admitted whole, KubeRay makes its RayCluster and submitter Job from the injected templates and
their pods run on KWOK nodes of the admitted flavor; a preempted RayJob is suspended through
``spec.suspend`` with its templates restored, its RayCluster and pods gone before the
preemptor runs, re-admitted later and runs again; each ends, and the quota returns to zero.

KWOK pods run no Ray: KubeRay marks a RayJob ``Complete`` only once the Ray dashboard on its
head pod says the Ray job succeeded, which nothing here can answer. What ends these RayJobs
is KubeRay's own ``activeDeadlineSeconds``: past it, KubeRay sets ``jobDeploymentStatus:
Failed`` (``DeadlineExceeded``), the Workload finishes as Failed and the RayCluster is
deleted. The success path (``Complete`` with ``jobStatus: SUCCEEDED``) is covered by the
rules' unit tests only."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    RACK,
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
    topology,
    wait_for,
    workload_of,
)

from phalanx.devcluster.handle import ClusterHandle
from phalanx.operator import rayjob as rules

pytestmark = pytest.mark.integration

POOL = "phx-rayjobs"
RAYJOBS = "rayjobs.ray.io"
RAYCLUSTERS = "rayclusters.ray.io"
POOL_LABEL = "phalanx.dev/test-pool"
IMAGE = "rayproject/ray:2.46.0"


def a_rayjob(
    name: str,
    *,
    workers: int,
    gpus: int,
    deadline_seconds: int,
    priority_class: str | None = None,
    worker_annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A RayJob of a 1-CPU head and ``workers`` workers of ``gpus`` GPUs, submitted by
    KubeRay's default submitter Job (K8sJobMode), ended by KubeRay after
    ``deadline_seconds``."""
    labels = {"kueue.x-k8s.io/queue-name": "lq"}
    if priority_class:
        labels["kueue.x-k8s.io/priority-class"] = priority_class

    def pod(container: str, requests: dict[str, str]) -> dict[str, Any]:
        return {
            "spec": {
                "containers": [
                    {
                        "name": container,
                        "image": IMAGE,
                        "resources": {"requests": requests, "limits": requests},
                    }
                ]
            }
        }

    worker = pod("ray-worker", {"cpu": "1", "nvidia.com/gpu": str(gpus)})
    if worker_annotations:
        worker["metadata"] = {"annotations": worker_annotations}
    return {
        "apiVersion": rules.API_VERSION,
        "kind": "RayJob",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "entrypoint": "python -c 'print(1)'",
            "shutdownAfterJobFinishes": True,
            "activeDeadlineSeconds": deadline_seconds,
            "rayClusterSpec": {
                "headGroupSpec": {"rayStartParams": {}, "template": pod("ray-head", {"cpu": "1"})},
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": workers,
                        "minReplicas": 0,
                        "maxReplicas": workers,
                        "rayStartParams": {},
                        "template": worker,
                    }
                ],
            },
        },
    }


def rayjob_pods(cluster: ClusterHandle, namespace: str, name: str) -> list[dict[str, Any]]:
    """Every pod of the RayJob (head, workers, submitter), by the label admission puts on its
    templates."""
    return get_list(cluster, "pods", namespace, "-l", f"{rules.ORIGIN_LABEL}={name}")


def ray_clusters(cluster: ClusterHandle, namespace: str, name: str) -> list[dict[str, Any]]:
    return get_list(cluster, RAYCLUSTERS, namespace, "-l", f"{rules.ORIGIN_LABEL}={name}")


def templates(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]["rayClusterSpec"]
    return {
        "head": spec["headGroupSpec"]["template"],
        **{g["groupName"]: g["template"] for g in spec["workerGroupSpecs"]},
    }


def as_submitted(cluster_spec: dict[str, Any]) -> dict[str, Any]:
    """The cluster spec without empty template metadata: KubeRay's first update of a RayJob
    (its finalizer) writes each template's ``metadata`` back as ``{}`` (a Go struct's
    ``creationTimestamp: null``, pruned), so whether it is there depends on which came first,
    that update or the Workload's record of the templates."""
    spec = copy.deepcopy(cluster_spec)
    for template in (
        spec["headGroupSpec"]["template"],
        *(g["template"] for g in spec.get("workerGroupSpecs") or ()),
    ):
        if template.get("metadata") == {}:
            del template["metadata"]
    return spec


def running_on_pool(pods: list[dict[str, Any]], count: int) -> bool:
    """``count`` pods bound to the pool's nodes, each running (or, the submitter's, which
    KWOK ends after 5 s as a Job's pod, done)."""
    return len(pods) == count and all(
        p["spec"].get("nodeName", "").startswith(POOL)
        and p["status"].get("phase") in ("Running", "Succeeded")
        for p in pods
    )


def ended_by_kuberay(cluster: ClusterHandle, namespace: str, name: str) -> bool:
    rayjob = get(cluster, RAYJOBS, name, namespace)
    workload = workload_of(cluster, namespace, name, kind="RayJob") or {}
    return (rayjob.get("status") or {}).get("jobDeploymentStatus") == "Failed" and is_true(
        workload, "Finished"
    )


@pytest.fixture
def ray_operator(
    cluster: ClusterHandle,
    kueue_crds: Path,
    ray_controller: Path,
    tmp_path: Path,
    cleanup: list[str],
) -> Any:
    """A ClusterQueue of 8 GPUs (and CPU and memory, which the default submitter requests) on
    a dedicated pool (two 8-GPU nodes) and an operator with the RayJob integration enabled."""
    cq_name = f"rayjobs-{int(time.time()) % 100000}"
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
        apply(
            cluster,
            flavor(POOL, pool=POOL),
            with_memory(cluster_queue(cq_name, flavor_name=POOL, gpus=8)),
        )
        op = start_operator(cluster, tmp_path, f"--config={config}", name="rayjobs")

        def log(lines: int = 80) -> str:
            controller = "\n".join(ray_controller.read_text(errors="replace").splitlines()[-30:])
            return f"{op.log_tail(lines)}\n---- KubeRay operator ----\n{controller}"

        try:
            yield cq_name, op, log
        finally:
            op.stop()


def with_memory(cq: dict[str, Any]) -> dict[str, Any]:
    """The ClusterQueue also covering memory (KubeRay's default submitter requests 200Mi)."""
    group = cq["spec"]["resourceGroups"][0]
    group["coveredResources"].append("memory")
    group["flavors"][0]["resources"].append({"name": "memory", "nominalQuota": "1Ti"})
    return cq


def test_a_rayjob_waits_whole_while_quota_is_short_then_one_that_fits_runs_and_ends(
    cluster: ClusterHandle,
    namespace: str,
    ray_operator: tuple[str, OperatorProcess, Any],
) -> None:
    cq_name, _op, log = ray_operator
    apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)

    # 3 workers x 4 GPUs = 12 GPUs against 8 of quota: suspended at creation, waits whole.
    apply(cluster, a_rayjob("big", workers=3, gpus=4, deadline_seconds=600), namespace=namespace)
    big = get(cluster, RAYJOBS, "big", namespace)
    assert big["spec"]["suspend"] is True, "the webhook did not suspend the queued RayJob"
    wl = wait_for(
        "big's Workload, pending with an explanation",
        lambda: (
            (w := workload_of(cluster, namespace, "big", kind="RayJob"))
            and (c := condition(w, "QuotaReserved"))
            and c["status"] == "False"
            and c.get("message")
            and w
        ),
        log=log,
    )
    assert wl["metadata"]["name"] == rules.workload_name("big", big["metadata"]["uid"])
    assert [(p["name"], p["count"]) for p in wl["spec"]["podSets"]] == [
        ("head", 1),
        ("gpu", 3),
        ("submitter", 1),
    ]
    pending = condition(wl, "QuotaReserved")
    assert pending is not None and "nvidia.com/gpu" in pending["message"], pending
    time.sleep(3)
    assert ray_clusters(cluster, namespace, "big") == [], "KubeRay made the short RayJob's cluster"
    assert get(cluster, RAYJOBS, "big", namespace)["status"]["jobDeploymentStatus"] == "Suspended"

    # 2 workers x 4 GPUs fit: admitted whole; KubeRay makes its cluster and submitter there.
    apply(cluster, a_rayjob("fits", workers=2, gpus=4, deadline_seconds=40), namespace=namespace)
    admitted = wait_for(
        "fits admitted",
        lambda: (
            (w := workload_of(cluster, namespace, "fits", kind="RayJob"))
            and is_true(w, "Admitted")
            and w
        ),
        log=log,
    )
    assignments = admitted["status"]["admission"]["podSetAssignments"]
    assert [(a["name"], a["count"]) for a in assignments] == [
        ("head", 1),
        ("gpu", 2),
        ("submitter", 1),
    ]
    started = get(cluster, RAYJOBS, "fits", namespace)
    assert started["spec"]["suspend"] is False
    assert {n: t["spec"]["nodeSelector"] for n, t in templates(started).items()} == {
        "head": {POOL_LABEL: POOL},
        "gpu": {POOL_LABEL: POOL},
    }
    assert started["spec"]["submitterPodTemplate"]["spec"]["nodeSelector"] == {POOL_LABEL: POOL}
    # The head, two workers and the submitter Job's pod, all on the pool's nodes.
    pods = wait_for(
        "fits' 4 pods running on the pool's nodes",
        lambda: (ps := rayjob_pods(cluster, namespace, "fits")) and running_on_pool(ps, 4) and ps,
        log=log,
    )
    kinds = sorted(p["metadata"]["labels"].get("kueue.x-k8s.io/podset") for p in pods)
    assert kinds == ["gpu", "gpu", "head", "submitter"]
    # KubeRay made the submitter once the RayCluster was ready. (The RayJob's own
    # status.rayClusterStatus, which Kueue's PodsReady reads, is copied only along with an
    # answer of the Ray dashboard, so the Workload is never PodsReady on KWOK.)
    (ray_cluster,) = ray_clusters(cluster, namespace, "fits")
    assert ray_cluster["status"]["state"] == "ready", ray_cluster["status"]
    # No Ray answers on KWOK: KubeRay ends the RayJob at its deadline.
    wait_for(
        "fits ended by KubeRay (Failed) and its Workload Finished",
        lambda: ended_by_kuberay(cluster, namespace, "fits"),
        timeout=150,
        log=log,
    )
    finished = condition(workload_of(cluster, namespace, "fits", kind="RayJob") or {}, "Finished")
    assert finished is not None and finished["reason"] == "Failed", finished
    assert "activeDeadlineSeconds" in finished["message"], finished
    wait_for(
        "fits' RayCluster deleted by KubeRay",
        lambda: ray_clusters(cluster, namespace, "fits") == [],
        log=log,
    )
    assert not is_true(workload_of(cluster, namespace, "big", kind="RayJob") or {}, "QuotaReserved")
    cluster.kubectl_ok("delete", RAYJOBS, "big", "-n", namespace, "--wait=false")
    wait_for("the quota back to zero", lambda: gpu_usage(cluster, cq_name) == ("0", 0), log=log)


def test_a_preempted_rayjob_is_suspended_restored_readmitted_and_runs_again(
    cluster: ClusterHandle,
    namespace: str,
    ray_operator: tuple[str, OperatorProcess, Any],
    cleanup: list[str],
) -> None:
    cq_name, _op, log = ray_operator
    low, high, classes = priority_classes(namespace, cleanup)
    apply(
        cluster,
        *classes,
        with_memory(
            cluster_queue(
                cq_name,
                flavor_name=POOL,
                gpus=8,
                preemption={"withinClusterQueue": "LowerPriority"},
            )
        ),
    )
    # Created before its LocalQueue, so that the templates read back are the submitted ones.
    # Its deadline is long enough to be preempted while running, and restarts when KubeRay
    # starts it again.
    apply(
        cluster,
        a_rayjob("low", workers=2, gpus=4, deadline_seconds=45, priority_class=low),
        namespace=namespace,
    )
    original = as_submitted(get(cluster, RAYJOBS, "low", namespace)["spec"]["rayClusterSpec"])
    apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)
    wait_for(
        "low's 4 pods running on the pool",
        lambda: running_on_pool(rayjob_pods(cluster, namespace, "low"), 4),
        log=log,
    )
    # A higher-priority Job of all 8 GPUs preempts it; it runs until deleted below, so that
    # low is seen held however slowly this machine polls.
    apply(
        cluster,
        gpu_job("urgent", queue="lq", gpus=8, run_seconds="600", priority_class=high),
        namespace=namespace,
    )
    wait_for(
        "low evicted (preempted)",
        lambda: (
            (w := workload_of(cluster, namespace, "low", kind="RayJob"))
            and (c := condition(w, "Evicted"))
            and c["status"] == "True"
            and condition(w, "Preempted") is not None
        ),
        log=log,
    )
    seen: list[Any] = []

    def restored() -> bool:
        rj = get(cluster, RAYJOBS, "low", namespace)
        spec = as_submitted(rj["spec"]["rayClusterSpec"])
        seen[:] = [rj["spec"].get("suspend"), spec]
        return rj["spec"]["suspend"] is True and spec == original

    try:
        wait_for(
            "low suspended through spec.suspend with its templates restored",
            restored,
            log=log,
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\nlast seen: {seen}\noriginal: {original}") from None
    wait_for(
        "low's RayCluster and pods gone, and urgent admitted",
        lambda: (
            ray_clusters(cluster, namespace, "low") == []
            and rayjob_pods(cluster, namespace, "low") == []
            and any(
                is_true(w, "Admitted")
                for w in get_list(cluster, "workloads.kueue.x-k8s.io", namespace)
                if w["metadata"]["name"].startswith("job-urgent-")
            )
        ),
        log=log,
    )
    assert get(cluster, RAYJOBS, "low", namespace)["status"]["jobDeploymentStatus"] == "Suspended"
    # urgent goes away; low is admitted again and KubeRay makes a new cluster for it.
    cluster.kubectl_ok("delete", "job", "urgent", "-n", namespace, "--wait=false")
    readmitted = wait_for(
        "low re-admitted and running again",
        lambda: (
            (w := workload_of(cluster, namespace, "low", kind="RayJob"))
            and is_true(w, "Admitted")
            and not is_true(w, "Evicted")
            and get(cluster, RAYJOBS, "low", namespace)["spec"]["suspend"] is False
            and running_on_pool(rayjob_pods(cluster, namespace, "low"), 4)
            and w
        ),
        timeout=120,
        log=log,
    )
    assert [a["name"] for a in readmitted["status"]["admission"]["podSetAssignments"]] == [
        "head",
        "gpu",
        "submitter",
    ]
    wait_for(
        "low ended by KubeRay (Failed) and its Workload Finished",
        lambda: ended_by_kuberay(cluster, namespace, "low"),
        timeout=150,
        log=log,
    )
    wait_for("the quota back to zero", lambda: gpu_usage(cluster, cq_name) == ("0", 0), log=log)


TAS_POOL = "phx-rayjobs-tas"
TAS_TOPOLOGY = "phx-rayjobs-topology"


def test_a_rayjob_asking_a_required_rack_for_its_workers_lands_them_in_one_rack(
    cluster: ClusterHandle,
    namespace: str,
    kueue_crds: Path,
    ray_controller: Path,
    tmp_path: Path,
    cleanup: list[str],
) -> None:
    """Two racks of 4 hosts x 8 GPUs; 4 workers of 8 GPUs asking ``required`` rack fill one
    rack, each on its own host, their topology gates removed."""
    cq_name = f"rayjobs-tas-{int(time.time()) % 100000}"
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
    with node_pool(cluster, TAS_POOL, racks=2, hosts=4):
        cleanup += [
            f"clusterqueue.kueue.x-k8s.io/{cq_name}",
            f"resourceflavor.kueue.x-k8s.io/{TAS_POOL}",
            f"topology.kueue.x-k8s.io/{TAS_TOPOLOGY}",
        ]
        apply(
            cluster,
            topology(TAS_TOPOLOGY),
            flavor(TAS_POOL, pool=TAS_POOL, topology_name=TAS_TOPOLOGY),
            with_memory(cluster_queue(cq_name, flavor_name=TAS_POOL, gpus=64)),
        )
        op = start_operator(cluster, tmp_path, f"--config={config}", name="rayjobs-tas")
        try:
            apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)
            apply(
                cluster,
                a_rayjob(
                    "racked",
                    workers=4,
                    gpus=8,
                    deadline_seconds=600,
                    worker_annotations={"kueue.x-k8s.io/podset-required-topology": RACK},
                ),
                namespace=namespace,
            )
            admitted = wait_for(
                "racked admitted",
                lambda: (
                    (w := workload_of(cluster, namespace, "racked", kind="RayJob"))
                    and is_true(w, "Admitted")
                    and w
                ),
                log=op.log_tail,
            )
            (gpu_set,) = [p for p in admitted["spec"]["podSets"] if p["name"] == "gpu"]
            assert gpu_set["topologyRequest"] == {"required": RACK}
            selector = f"{rules.ORIGIN_LABEL}=racked,kueue.x-k8s.io/podset=gpu"
            workers = wait_for(
                "racked's 4 workers running",
                lambda: (
                    (ps := get_list(cluster, "pods", namespace, "-l", selector))
                    and len(ps) == 4
                    and all(p["status"].get("phase") == "Running" for p in ps)
                    and ps
                ),
                log=op.log_tail,
            )
            nodes = {
                n["metadata"]["name"]: n
                for n in get_list(cluster, "nodes", None, "-l", f"{POOL_LABEL}={TAS_POOL}")
            }
            racks = {nodes[p["spec"]["nodeName"]]["metadata"]["labels"][RACK] for p in workers}
            assert len(racks) == 1, f"the workers span racks {racks}"
            assert len({p["spec"]["nodeName"] for p in workers}) == 4
            for pod in workers:
                assert not pod["spec"].get("schedulingGates"), "a worker kept its topology gate"
            cluster.kubectl_ok("delete", RAYJOBS, "racked", "-n", namespace, "--wait=false")
            wait_for(
                "the quota back to zero",
                lambda: gpu_usage(cluster, cq_name) == ("0", 0),
                log=op.log_tail,
            )
        finally:
            op.stop()
