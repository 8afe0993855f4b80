"""RayClusters (Kueue's ``ray.io/raycluster`` integration) on the local control plane, with
KubeRay's real operator beside it: a labelled RayCluster is suspended at creation and gets a
Workload with pod sets ``head`` and one per worker group, is admitted whole, its pods run on
KWOK nodes of the admitted flavor and the Workload is PodsReady once KubeRay reports the
cluster ready; deleting it frees the quota. With the RayJob integration enabled too, a
RayJob's RayCluster (which copies the RayJob's queue label) gets no Workload of its own."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    apply,
    cluster_queue,
    flavor,
    get,
    get_list,
    gpu_job,
    gpu_usage,
    is_true,
    local_queue,
    node_pool,
    start_operator,
    wait_for,
)
from test_operator_rayjobs import a_rayjob, running_on_pool, with_memory

from phalanx.devcluster.handle import ClusterHandle
from phalanx.operator import raycluster as rules
from phalanx.operator import rayjob

pytestmark = pytest.mark.integration

POOL = "phx-rayjobs"
RAYCLUSTERS = "rayclusters.ray.io"
POOL_LABEL = "phalanx.dev/test-pool"


def a_raycluster(name: str, *, workers: int, gpus: int) -> dict[str, Any]:
    cluster_spec = a_rayjob(name, workers=workers, gpus=gpus, deadline_seconds=600)["spec"][
        "rayClusterSpec"
    ]
    return {
        "apiVersion": rayjob.API_VERSION,
        "kind": "RayCluster",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
        "spec": cluster_spec,
    }


def workloads(cluster: ClusterHandle, namespace: str) -> list[dict[str, Any]]:
    return get_list(cluster, "workloads.kueue.x-k8s.io", namespace)


def test_a_raycluster_is_held_admitted_whole_and_frees_its_quota_when_deleted(
    cluster: ClusterHandle,
    namespace: str,
    kueue_crds: Path,
    ray_controller: Path,
    tmp_path: Path,
    cleanup: list[str],
) -> None:
    cq_name = f"rayclusters-{int(time.time()) % 100000}"
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "integrations": {"frameworks": ["batch/job", rayjob.FRAMEWORK, rules.FRAMEWORK]},
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
            with_memory(cluster_queue(cq_name, flavor_name=POOL, gpus=16)),
        )
        op = start_operator(cluster, tmp_path, f"--config={config}", name="rayclusters")
        log = op.log_tail
        try:
            # Created before its LocalQueue: held, and KubeRay makes no pod.
            apply(cluster, a_raycluster("serve", workers=2, gpus=4), namespace=namespace)
            serve = get(cluster, RAYCLUSTERS, "serve", namespace)
            assert serve["spec"]["suspend"] is True, "the webhook did not suspend it"
            time.sleep(2)
            assert get_list(cluster, "pods", namespace, "-l", f"{rules.CLUSTER_LABEL}=serve") == []
            apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)
            name = rules.workload_name("serve", serve["metadata"]["uid"])
            admitted = wait_for(
                "serve admitted",
                lambda: (
                    (w := get(cluster, "workloads.kueue.x-k8s.io", name, namespace))
                    and is_true(w, "Admitted")
                    and w
                ),
                log=log,
            )
            assert [(p["name"], p["count"]) for p in admitted["spec"]["podSets"]] == [
                ("head", 1),
                ("gpu", 2),
            ]
            wait_for(
                "serve's 3 pods running on the pool and its Workload PodsReady",
                lambda: (
                    running_on_pool(
                        get_list(cluster, "pods", namespace, "-l", f"{rules.CLUSTER_LABEL}=serve"),
                        3,
                    )
                    and is_true(
                        get(cluster, "workloads.kueue.x-k8s.io", name, namespace), "PodsReady"
                    )
                ),
                log=log,
            )
            # A RayJob's RayCluster carries the RayJob's queue label: only the RayJob is queued.
            apply(
                cluster,
                a_rayjob("pi", workers=1, gpus=4, deadline_seconds=600),
                namespace=namespace,
            )
            wait_for(
                "pi's RayCluster running",
                lambda: (
                    (
                        cs := get_list(
                            cluster, RAYCLUSTERS, namespace, "-l", f"{rayjob.ORIGIN_LABEL}=pi"
                        )
                    )
                    and (cs[0].get("status") or {}).get("state") == "ready"
                ),
                log=log,
            )
            names = sorted(
                w["metadata"]["name"].rsplit("-", 1)[0] for w in workloads(cluster, namespace)
            )
            assert names == ["raycluster-serve", "rayjob-pi"], names
            cluster.kubectl_ok("delete", "rayjobs.ray.io", "pi", "-n", namespace, "--wait=false")
            cluster.kubectl_ok("delete", RAYCLUSTERS, "serve", "-n", namespace, "--wait=false")
            wait_for(
                "the quota back to zero", lambda: gpu_usage(cluster, cq_name) == ("0", 0), log=log
            )
        finally:
            op.stop()


def test_a_preempted_raycluster_is_suspended_restored_and_readmitted(
    cluster: ClusterHandle,
    namespace: str,
    kueue_crds: Path,
    ray_controller: Path,
    tmp_path: Path,
    cleanup: list[str],
) -> None:
    cq_name = f"rayclusters-{int(time.time()) % 100000}"
    low, high = f"{namespace[:40]}-low", f"{namespace[:40]}-high"
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
            *(f"workloadpriorityclass.kueue.x-k8s.io/{n}" for n in (low, high)),
        ]
        apply(
            cluster,
            flavor(POOL, pool=POOL),
            *(
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "WorkloadPriorityClass",
                    "metadata": {"name": n},
                    "value": v,
                }
                for n, v in ((low, 10), (high, 1000))
            ),
            with_memory(
                cluster_queue(
                    cq_name,
                    flavor_name=POOL,
                    gpus=8,
                    preemption={"withinClusterQueue": "LowerPriority"},
                )
            ),
        )
        op = start_operator(cluster, tmp_path, f"--config={config}", name="rayclusters-preempt")
        log = op.log_tail
        try:
            serve = a_raycluster("serve", workers=2, gpus=4)
            serve["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = low
            apply(cluster, serve, namespace=namespace)
            original = get(cluster, RAYCLUSTERS, "serve", namespace)["spec"]
            apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)

            def serve_pods() -> list[dict[str, Any]]:
                return get_list(cluster, "pods", namespace, "-l", f"{rules.CLUSTER_LABEL}=serve")

            wait_for("serve's 3 pods running", lambda: running_on_pool(serve_pods(), 3), log=log)
            apply(
                cluster,
                gpu_job("urgent", queue="lq", gpus=8, run_seconds="600", priority_class=high),
                namespace=namespace,
            )

            def held() -> bool:
                spec = get(cluster, RAYCLUSTERS, "serve", namespace)["spec"]
                unchanged = all(
                    spec[k] == original[k] for k in ("headGroupSpec", "workerGroupSpecs")
                )
                return spec.get("suspend") is True and unchanged

            wait_for("serve suspended with its templates restored", held, log=log)
            wait_for(
                "serve's pods gone and urgent admitted",
                lambda: (
                    serve_pods() == []
                    and any(
                        is_true(w, "Admitted")
                        for w in workloads(cluster, namespace)
                        if w["metadata"]["name"].startswith("job-urgent-")
                    )
                ),
                log=log,
            )
            cluster.kubectl_ok("delete", "job", "urgent", "-n", namespace, "--wait=false")
            wait_for(
                "serve re-admitted and running again",
                lambda: (
                    get(cluster, RAYCLUSTERS, "serve", namespace)["spec"]["suspend"] is False
                    and running_on_pool(serve_pods(), 3)
                ),
                timeout=120,
                log=log,
            )
            cluster.kubectl_ok("delete", RAYCLUSTERS, "serve", "-n", namespace, "--wait=false")
            wait_for(
                "the quota back to zero", lambda: gpu_usage(cluster, cq_name) == ("0", 0), log=log
            )
        finally:
            op.stop()
