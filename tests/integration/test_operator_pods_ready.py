"""waitForPodsReady: an admitted Job whose pods cannot start is evicted after the timeout
(``Evicted`` reason ``PodsReadyTimeout``), suspended, and requeued with exponential backoff."""

from __future__ import annotations

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
    get,
    gpu_job,
    is_true,
    local_queue,
    node_pool,
    start_operator,
    wait_for,
    workload_of,
)

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

POOL = "phx-ready"


def test_pods_never_ready_are_evicted_and_requeued_with_backoff(
    cluster: ClusterHandle,
    kueue_crds: Path,
    tmp_path: Path,
    namespace: str,
    cleanup: list[str],
) -> None:
    cq_name = f"{namespace}-{int(time.time()) % 100000}"
    cq = cluster_queue(cq_name, flavor_name=POOL, gpus=16)
    # Quota for a device no node has: admitted, but its pod stays unschedulable.
    group = cq["spec"]["resourceGroups"][0]
    group["coveredResources"].append("example.com/widget")
    group["flavors"][0]["resources"].append({"name": "example.com/widget", "nominalQuota": "4"})
    with node_pool(cluster, POOL, racks=1, hosts=1):
        cleanup += [
            f"clusterqueue.kueue.x-k8s.io/{cq_name}",
            f"resourceflavor.kueue.x-k8s.io/{POOL}",
        ]
        apply(cluster, flavor(POOL, pool=POOL), cq)
        op = start_operator(
            cluster,
            tmp_path,
            "--wait-for-pods-ready=4",
            "--requeue-backoff-base=2",
            name="pods-ready",
        )
        try:
            apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)
            job = gpu_job("stuck", queue="lq", gpus=1)
            resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
            resources["requests"]["example.com/widget"] = "1"
            resources["limits"]["example.com/widget"] = "1"
            apply(cluster, job, namespace=namespace)
            wait_for(
                "admission",
                lambda: (w := workload_of(cluster, namespace, "stuck")) and is_true(w, "Admitted"),
                log=op.log_tail,
            )
            evicted = wait_for(
                "the PodsReady timeout eviction",
                lambda: (
                    (w := workload_of(cluster, namespace, "stuck"))
                    and (c := condition(w, "Evicted"))
                    and c["reason"] == "PodsReadyTimeout"
                    and w
                ),
                timeout=30,
                log=op.log_tail,
            )
            assert condition(evicted, "PodsReady")["status"] == "False"
            wait_for(
                "requeued with a backoff",
                lambda: (
                    (w := workload_of(cluster, namespace, "stuck"))
                    and (w.get("status") or {}).get("requeueState", {}).get("count") == 1
                    and not is_true(w, "QuotaReserved")
                ),
                timeout=30,
                log=op.log_tail,
            )
            assert get(cluster, "job", "stuck", namespace)["spec"]["suspend"] is True
            # After the 2 s backoff it is admitted again, and times out again: count 2.
            wait_for(
                "the second timeout",
                lambda: (
                    (w := workload_of(cluster, namespace, "stuck"))
                    and (w.get("status") or {}).get("requeueState", {}).get("count") == 2
                ),
                timeout=60,
                log=op.log_tail,
            )
        finally:
            op.stop()
            delete_cluster_objects(
                cluster,
                f"clusterqueue.kueue.x-k8s.io/{cq_name}",
                f"resourceflavor.kueue.x-k8s.io/{POOL}",
            )
