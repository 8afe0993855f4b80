"""Kueue's resource-in-use finalizer on ResourceFlavors, on the local control plane: a flavor
that a ClusterQueue names, even a terminating one whose Workloads still hold quota, is not
deleted until nothing uses it."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    OperatorProcess,
    apply,
    cluster_queue,
    delete_cluster_objects,
    flavor,
    gpu_job,
    is_true,
    local_queue,
    node_pool,
    wait_for,
    workload_of,
)

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

POOL = "phx-fin"
FINALIZER = "kueue.x-k8s.io/resource-in-use"


def _object(cluster: ClusterHandle, ref: str) -> dict[str, Any] | None:
    result = cluster.kubectl("get", ref, "-o", "json")
    if result.returncode != 0:
        return None
    obj: dict[str, Any] = json.loads(result.stdout)
    return obj


def _finalizers(cluster: ClusterHandle, ref: str) -> list[str]:
    obj = _object(cluster, ref)
    return list(((obj or {}).get("metadata") or {}).get("finalizers") or ())


def test_a_flavor_in_use_stays_until_its_cluster_queue_and_workloads_are_gone(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, namespace: str
) -> None:
    suffix = int(time.time()) % 100000
    rf, unused = f"{POOL}-{suffix}", f"{POOL}-unused-{suffix}"
    cq = f"{namespace}-fin-{suffix}"
    rf_ref, cq_ref = f"resourceflavor.kueue.x-k8s.io/{rf}", f"clusterqueue.kueue.x-k8s.io/{cq}"
    unused_ref = f"resourceflavor.kueue.x-k8s.io/{unused}"
    with node_pool(cluster, rf, racks=1, hosts=1):
        try:
            apply(
                cluster,
                flavor(rf, pool=rf),
                flavor(unused, pool=rf),
                cluster_queue(cq, flavor_name=rf, gpus=8),
            )
            wait_for(
                "both flavors finalized",
                lambda: (
                    FINALIZER in _finalizers(cluster, rf_ref)
                    and FINALIZER in _finalizers(cluster, unused_ref)
                ),
                log=phalanx_operator.log_tail,
            )
            # A flavor nothing uses goes at once.
            cluster.kubectl_ok("delete", unused_ref, "--wait=false")
            wait_for(
                "the unused flavor deleted",
                lambda: _object(cluster, unused_ref) is None,
                timeout=30,
                log=phalanx_operator.log_tail,
            )

            apply(cluster, local_queue("lq", cluster_queue_name=cq), namespace=namespace)
            apply(cluster, gpu_job("held", queue="lq"), namespace=namespace)
            wait_for(
                "the Job admitted",
                lambda: (
                    (w := workload_of(cluster, namespace, "held")) is not None
                    and is_true(w, "Admitted")
                ),
                log=phalanx_operator.log_tail,
            )
            cluster.kubectl_ok("delete", rf_ref, "--wait=false")
            time.sleep(2)
            obj = _object(cluster, rf_ref)
            assert obj is not None and obj["metadata"].get("deletionTimestamp"), (
                "a flavor a ClusterQueue names was deleted"
            )
            # The ClusterQueue goes terminating (its Workload holds quota) and still names it.
            cluster.kubectl_ok("delete", cq_ref, "--wait=false")
            time.sleep(2)
            assert _object(cluster, cq_ref) is not None
            assert _object(cluster, rf_ref) is not None, (
                "a flavor a terminating ClusterQueue names was deleted"
            )
            w = workload_of(cluster, namespace, "held")
            assert w is not None and is_true(w, "Admitted"), "the flavor's deletion evicted"

            cluster.kubectl_ok("delete", "job", "held", "-n", namespace, "--wait=false")
            wait_for(
                "the ClusterQueue, then the flavor, gone",
                lambda: _object(cluster, cq_ref) is None and _object(cluster, rf_ref) is None,
                timeout=60,
                log=phalanx_operator.log_tail,
            )
        finally:
            delete_cluster_objects(cluster, cq_ref, rf_ref, unused_ref)
