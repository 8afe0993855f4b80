"""Workload objects as the API returns them, for the store's tests."""

from __future__ import annotations

from typing import Any

__all__ = ["condition", "workload"]


def condition(
    kind: str, at: str, *, status: str = "True", reason: str = "", message: str = ""
) -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "lastTransitionTime": at,
        "reason": reason or kind,
        "message": message,
    }


def workload(
    *,
    uid: str = "uid-1",
    namespace: str = "team-a",
    name: str = "job-1",
    queue: str = "lq-a",
    created: str = "2026-01-01T00:00:00Z",
    cluster_queue: str | None = None,
    gpus: int = 4,
    flavor: str = "h100",
    conditions: list[dict[str, Any]] | None = None,
    topology: dict[str, Any] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": conditions or []}
    if cluster_queue is not None:
        assignment: dict[str, Any] = {
            "name": "main",
            "count": gpus,
            "flavors": {"nvidia.com/gpu": flavor, "cpu": "default"},
            "resourceUsage": {"nvidia.com/gpu": str(gpus), "cpu": f"{gpus * 500}m"},
        }
        if topology is not None:
            assignment["topologyAssignment"] = topology
        status["admission"] = {"clusterQueue": cluster_queue, "podSetAssignments": [assignment]}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "uid": uid,
            "namespace": namespace,
            "name": name,
            "creationTimestamp": created,
            "resourceVersion": "1",
        },
        "spec": {"queueName": queue, "priority": 0, "podSets": []},
        "status": status,
    }
