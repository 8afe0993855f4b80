"""Restarts: all state is rebuilt from the API; an admitted Workload is restored, never
admitted twice, and its quota is neither lost nor counted twice."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    apply,
    cluster_queue,
    condition,
    delete_cluster_objects,
    flavor,
    gpu_job,
    gpu_usage,
    is_true,
    local_queue,
    node_pool,
    start_operator,
    wait_for,
    workload_of,
)

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

POOL = "phx-restart"


def test_restart_restores_admissions_without_readmitting_or_leaking_quota(
    cluster: ClusterHandle,
    kueue_crds: Path,
    tmp_path: Path,
    namespace: str,
    cleanup: list[str],
) -> None:
    cq = f"{namespace}-{int(time.time()) % 100000}"
    with node_pool(cluster, POOL, racks=1, hosts=3):
        cleanup += [f"clusterqueue.kueue.x-k8s.io/{cq}", f"resourceflavor.kueue.x-k8s.io/{POOL}"]
        apply(cluster, flavor(POOL, pool=POOL), cluster_queue(cq, flavor_name=POOL, gpus=16))
        first = start_operator(cluster, tmp_path, name="first")
        try:
            apply(cluster, local_queue("lq", cluster_queue_name=cq), namespace=namespace)
            for name in ("a", "b", "c"):
                apply(cluster, gpu_job(name, queue="lq"), namespace=namespace)
            wait_for(
                "two admitted, one pending",
                lambda: (
                    sum(
                        bool((w := workload_of(cluster, namespace, j)) and is_true(w, "Admitted"))
                        for j in ("a", "b", "c")
                    )
                    == 2
                    and gpu_usage(cluster, cq) == ("16", 2)
                ),
                log=first.log_tail,
            )
        finally:
            code = first.stop()
        assert code == 0, f"the operator did not shut down cleanly on SIGTERM (exit {code})"
        before = {j: workload_of(cluster, namespace, j) for j in ("a", "b", "c")}
        admitted = sorted(j for j, w in before.items() if w and is_true(w, "Admitted"))
        (waiting,) = [j for j in ("a", "b", "c") if j not in admitted]

        second = start_operator(cluster, tmp_path, name="second")
        try:
            time.sleep(3)
            log = second.log.read_text()
            for job in admitted:
                wl = workload_of(cluster, namespace, job)
                assert wl is not None
                old, new = before[job], wl
                assert old is not None
                assert new["status"]["admission"] == old["status"]["admission"]
                # Not admitted again: the condition did not transition.
                assert (
                    condition(new, "Admitted")["lastTransitionTime"]
                    == condition(old, "Admitted")["lastTransitionTime"]
                )
                assert (
                    f"event=workload_restored workload={namespace}/{wl['metadata']['name']}" in log
                )
                assert f"event=admitted workload={namespace}/{wl['metadata']['name']}" not in log
            pending = workload_of(cluster, namespace, waiting)
            assert pending is not None and not is_true(pending, "Admitted")
            assert gpu_usage(cluster, cq) == ("16", 2)

            # The restored usage is exact: finishing one admits the waiting Job, and no more.
            cluster.kubectl_ok("delete", "job", admitted[0], "-n", namespace, "--wait=false")
            wait_for(
                "the waiting Job admitted into the freed quota",
                lambda: (w := workload_of(cluster, namespace, waiting)) and is_true(w, "Admitted"),
                timeout=30,
                log=second.log_tail,
            )
            wait_for(
                "16 GPUs in use again",
                lambda: gpu_usage(cluster, cq) == ("16", 2),
                log=second.log_tail,
            )
        finally:
            second.stop()
            delete_cluster_objects(
                cluster,
                f"clusterqueue.kueue.x-k8s.io/{cq}",
                f"resourceflavor.kueue.x-k8s.io/{POOL}",
            )


def test_a_deleted_cluster_queue_in_use_survives_a_restart_until_its_workloads_are_gone(
    cluster: ClusterHandle,
    kueue_crds: Path,
    tmp_path: Path,
    namespace: str,
) -> None:
    """Kueue's resource-in-use finalizer: the terminating state lives in the API, not in one
    process's memory, so a restart neither drops the ClusterQueue nor orphans its usage."""
    cq = f"{namespace}-del-{int(time.time()) % 100000}"
    finalizer = "kueue.x-k8s.io/resource-in-use"

    def cq_object() -> dict[str, object] | None:
        result = cluster.kubectl("get", "clusterqueue", cq, "-o", "json")
        if result.returncode != 0:
            return None
        obj: dict[str, object] = json.loads(result.stdout)
        return obj

    def finalizers() -> list[str]:
        obj = cq_object()
        metadata = obj.get("metadata") if obj else None
        return list((metadata or {}).get("finalizers") or ())  # type: ignore[attr-defined]

    with node_pool(cluster, POOL, racks=1, hosts=2):
        apply(cluster, flavor(POOL, pool=POOL), cluster_queue(cq, flavor_name=POOL, gpus=16))
        first = start_operator(cluster, tmp_path, name="first")
        try:
            apply(cluster, local_queue("lq", cluster_queue_name=cq), namespace=namespace)
            apply(cluster, gpu_job("held", queue="lq"), namespace=namespace)
            wait_for(
                "the Job admitted and the ClusterQueue finalized",
                lambda: (
                    (w := workload_of(cluster, namespace, "held")) is not None
                    and is_true(w, "Admitted")
                    and finalizer in finalizers()
                ),
                log=first.log_tail,
            )
            cluster.kubectl_ok("delete", "clusterqueue", cq, "--wait=false")
            time.sleep(2)
            assert cq_object() is not None, "deleted while a Workload holds its quota"
        finally:
            first.stop()
        second = start_operator(cluster, tmp_path, name="second")
        try:
            time.sleep(3)
            obj = cq_object()
            assert obj is not None and finalizer in finalizers(), (
                f"the restart let go of a ClusterQueue in use:\n{second.log_tail()}"
            )
            assert gpu_usage(cluster, cq)[1] == 1
            cluster.kubectl_ok("delete", "job", "held", "-n", namespace, "--wait=false")
            wait_for(
                "the ClusterQueue gone once its last Workload is",
                lambda: cq_object() is None,
                timeout=60,
                log=second.log_tail,
            )
        finally:
            second.stop()
            cluster.kubectl(
                "patch",
                "clusterqueue",
                cq,
                "--type=merge",
                "-p",
                '{"metadata":{"finalizers":null}}',
            )
            delete_cluster_objects(
                cluster,
                f"clusterqueue.kueue.x-k8s.io/{cq}",
                f"resourceflavor.kueue.x-k8s.io/{POOL}",
            )
