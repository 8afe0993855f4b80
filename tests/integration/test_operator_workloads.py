"""Workloads applied directly (no Job): admitted the same way, ``status.admission`` being the
hand-off; a Workload that someone else marks ``Finished=True`` (as Kueue's performance runner
does) is terminal and frees its quota."""

from __future__ import annotations

import json
import time
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
    gpu_usage,
    is_true,
    local_queue,
    node_pool,
    wait_for,
)

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

POOL = "phx-wl"


@pytest.fixture(scope="module")
def wl_pool(cluster: ClusterHandle, phalanx_operator: OperatorProcess) -> Iterator[list[str]]:
    with node_pool(cluster, POOL, racks=1, hosts=2) as nodes:
        apply(cluster, flavor(POOL, pool=POOL))
        try:
            yield nodes
        finally:
            delete_cluster_objects(cluster, f"resourceflavor.kueue.x-k8s.io/{POOL}")


def workload(name: str, *, pods: int, gpus: int = 8) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {
            "queueName": "lq",
            "podSets": [
                {
                    "name": "main",
                    "count": pods,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "c",
                                    "image": "example.invalid/x",
                                    "resources": {"requests": {"nvidia.com/gpu": str(gpus)}},
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }


def test_direct_workload_is_admitted_and_finished_by_someone_else_frees_quota(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, wl_pool: list[str], namespace: str
) -> None:
    log = phalanx_operator.log_tail
    cq = f"{namespace}-{int(time.time()) % 100000}"
    apply(cluster, cluster_queue(cq, flavor_name=POOL, gpus=16))
    try:
        apply(cluster, local_queue("lq", cluster_queue_name=cq), namespace=namespace)
        apply(cluster, workload("first", pods=2), namespace=namespace)
        first = wait_for(
            "the direct Workload admitted",
            lambda: (
                (w := get(cluster, "workloads.kueue.x-k8s.io", "first", namespace))
                and is_true(w, "Admitted")
                and w
            ),
            log=log,
        )
        (psa,) = first["status"]["admission"]["podSetAssignments"]
        assert psa["flavors"]["nvidia.com/gpu"] == POOL
        assert psa["count"] == 2 and psa["resourceUsage"]["nvidia.com/gpu"] == "16"
        assert is_true(first, "QuotaReserved")

        apply(cluster, workload("second", pods=1), namespace=namespace)
        wait_for(
            "the second Workload pending",
            lambda: (
                (
                    c := condition(
                        get(cluster, "workloads.kueue.x-k8s.io", "second", namespace),
                        "QuotaReserved",
                    )
                )
                and c["status"] == "False"
            ),
            log=log,
        )
        # Kueue's runner finishes a Workload by writing Finished=True into its status.
        conditions = first["status"]["conditions"] + [
            {
                "type": "Finished",
                "status": "True",
                "reason": "ByTest",
                "message": "By test runner",
                "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        ]
        cluster.kubectl_ok(
            "patch",
            "workloads.kueue.x-k8s.io",
            "first",
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"conditions": conditions}}),
        )
        wait_for(
            "the second Workload admitted with the freed quota",
            lambda: is_true(
                get(cluster, "workloads.kueue.x-k8s.io", "second", namespace), "Admitted"
            ),
            timeout=20,
            log=log,
        )
        wait_for("usage of the second only", lambda: gpu_usage(cluster, cq) == ("8", 1), log=log)
        # Terminal: the finished Workload keeps its admission record and is never re-admitted.
        finished = get(cluster, "workloads.kueue.x-k8s.io", "first", namespace)
        assert is_true(finished, "Finished")
        assert condition(finished, "Finished")["reason"] == "ByTest"
    finally:
        delete_cluster_objects(cluster, f"clusterqueue.kueue.x-k8s.io/{cq}")
