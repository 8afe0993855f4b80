"""The resource-in-use finalizer: added to live ClusterQueues, removed from a deleted one
only once the core has let it go, and a deleted ClusterQueue stays terminating after a
restart while restored Workloads hold its quota."""

from __future__ import annotations

from typing import Any

from phalanx.admission.scheduler import Scheduler
from phalanx.operator.bridge import CoreBridge
from phalanx.operator.finalizers import RESOURCE_IN_USE, ClusterQueueFinalizers, finalizer_patch
from phalanx.operator.oracle import TopologyOracle
from phalanx.operator.state import ClusterState


def cluster_queue(*, rv: str = "5", deleting: bool = False, finalizers: list[str] | None = None):
    metadata: dict[str, Any] = {"name": "cq", "resourceVersion": rv, "uid": "u1", "generation": 1}
    if finalizers is not None:
        metadata["finalizers"] = finalizers
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": metadata,
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu"],
                    "flavors": [
                        {"name": "default", "resources": [{"name": "cpu", "nominalQuota": "4"}]}
                    ],
                }
            ],
        },
    }


def test_the_patch_adds_guarded_by_the_resource_version() -> None:
    assert finalizer_patch(cluster_queue(), keep=True) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "5"},
        {"op": "add", "path": "/metadata/finalizers", "value": [RESOURCE_IN_USE]},
    ]
    other = finalizer_patch(cluster_queue(finalizers=["x"]), keep=True)
    assert other is not None and other[-1]["path"] == "/metadata/finalizers/-"
    assert finalizer_patch(cluster_queue(finalizers=[RESOURCE_IN_USE]), keep=True) is None


def test_the_patch_removes_only_our_finalizer() -> None:
    patch = finalizer_patch(cluster_queue(finalizers=["x", RESOURCE_IN_USE]), keep=False)
    assert patch is not None
    assert patch[-2:] == [
        {"op": "test", "path": "/metadata/finalizers/1", "value": RESOURCE_IN_USE},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]
    assert finalizer_patch(cluster_queue(finalizers=["x"]), keep=False) is None


def test_reconcile_keeps_the_finalizer_while_the_core_holds_the_queue() -> None:
    state = ClusterState()
    state.apply("ClusterQueue", None, cluster_queue(deleting=True, finalizers=[RESOURCE_IN_USE]))
    spawned: list[Any] = []

    def spawn(coro: Any) -> None:
        spawned.append(coro)
        coro.close()

    finalizers = ClusterQueueFinalizers(None, state, spawn=spawn)  # type: ignore[arg-type]
    finalizers.reconcile(in_core=lambda name: True)
    assert spawned == []
    finalizers.reconcile(in_core=lambda name: False)
    assert len(spawned) == 1


def workload(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "generation": 1,
            "resourceVersion": "9",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "queueName": "lq",
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {
                        "spec": {
                            "containers": [{"name": "c", "resources": {"requests": {"cpu": "4"}}}]
                        }
                    },
                }
            ],
        },
        "status": {
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                {"type": "Admitted", "status": "True", "reason": "Admitted"},
            ],
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {
                        "name": "main",
                        "count": 1,
                        "flavors": {"cpu": "default"},
                        "resourceUsage": {"cpu": "4"},
                    }
                ],
            },
        },
    }


def test_after_a_restart_a_deleted_queue_in_use_stays_terminating() -> None:
    """The first sync sees the deleted ClusterQueue before the Workloads: it must not be let
    go of before the restored Workloads are counted in it."""
    scheduler = Scheduler()
    state = ClusterState()
    bridge = CoreBridge(scheduler, TopologyOracle(), state)
    state.apply(
        "ResourceFlavor",
        None,
        {"kind": "ResourceFlavor", "metadata": {"name": "default", "resourceVersion": "1"}},
    )
    state.apply("ClusterQueue", None, cluster_queue(deleting=True, finalizers=[RESOURCE_IN_USE]))
    state.apply("Workload", None, workload("held"))
    bridge.sync(state.drain(), now_ms=1)
    assert "cq" in scheduler.queues, "let go of while a restored Workload holds its quota"
    assert scheduler.queues["cq"].terminating
    state.apply("Workload", "DELETED", workload("held"))
    bridge.sync(state.drain(), now_ms=2)
    assert "cq" not in scheduler.queues
