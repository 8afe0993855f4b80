"""The RayCluster integration (Kueue's ``ray.io/raycluster``): pod sets head and each worker
group, Kueue's Workload naming, a RayJob's RayCluster left to the RayJob (not queued, held or
checked), the start and restore patches, never finished, the webhook's checks."""

from __future__ import annotations

import asyncio
import copy
import hashlib
from typing import Any

import jsonpatch
import kopf
import pytest

from phalanx.operator import integration
from phalanx.operator import raycluster as rc
from phalanx.operator.job_validation import validate_raycluster
from phalanx.operator.webhooks import register_webhooks

NS = "team-a"


def template(cpu: str = "1", **extra: Any) -> dict[str, Any]:
    metadata = extra.pop("metadata", None)
    body: dict[str, Any] = {
        "spec": {
            "containers": [
                {
                    "name": "ray",
                    "image": "rayproject/ray:2.46.0",
                    "resources": {"requests": {"cpu": cpu}},
                }
            ],
            **extra,
        }
    }
    if metadata is not None:
        body["metadata"] = metadata
    return body


def a_raycluster(*groups: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": "serve",
            "namespace": NS,
            "uid": "rc-uid-1",
            "labels": {"kueue.x-k8s.io/queue-name": "lq"},
        },
        "spec": {
            "suspend": True,
            "headGroupSpec": {"template": template("2")},
            "workerGroupSpecs": list(groups)
            or [
                {"groupName": "small", "replicas": 2, "template": template()},
                {"groupName": "multi", "replicas": 2, "numOfHosts": 2, "template": template()},
            ],
            **spec,
        },
    }


def a_rayjobs_cluster() -> dict[str, Any]:
    obj = a_raycluster()
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "pi", "uid": "u", "controller": True}
    ]
    return obj


def test_pod_sets_are_the_head_then_each_worker_group() -> None:
    sets = rc.pod_sets(a_raycluster())
    assert [(p["name"], p["count"]) for p in sets] == [("head", 1), ("small", 2), ("multi", 4)]
    with pytest.raises(rc.InvalidRayCluster, match=r"^spec.workerGroupSpecs: 8 worker groups"):
        rc.pod_sets(
            a_raycluster(*[{"groupName": f"g{i}", "template": template()} for i in range(8)])
        )


def test_workload_name_is_kueues() -> None:
    digest = hashlib.sha1(b"RayCluster\nray.io\nserve\nrc-uid-1").hexdigest()[:5]
    assert rc.RAYCLUSTER.workload_name(a_raycluster()) == f"raycluster-serve-{digest}"


def test_a_rayjobs_cluster_is_the_rayjobs() -> None:
    assert rc.RAYCLUSTER.queue_name(a_raycluster()) == "lq"
    # It copies the RayJob's labels, the queue label too.
    assert rc.RAYCLUSTER.queue_name(a_rayjobs_cluster()) is None
    bad = a_rayjobs_cluster()
    bad["spec"]["enableInTreeAutoscaling"] = True
    assert validate_raycluster(bad) == []


def _injections() -> dict[str, integration.FlavorInjection]:
    return {
        name: integration.FlavorInjection(
            pod_set=name, count=1, node_labels={"pool": name}, tolerations=[], topology_gated=False
        )
        for name in ("head", "small", "multi")
    }


def test_start_injects_every_group_then_restore_puts_back_what_was_submitted() -> None:
    obj = a_raycluster()
    patch = rc.RAYCLUSTER.start_patch(obj, workload_name="wl", injections=_injections())
    started = jsonpatch.apply_patch(obj, patch)
    assert started["spec"]["suspend"] is False
    assert started["spec"]["headGroupSpec"]["template"]["spec"]["nodeSelector"] == {"pool": "head"}
    multi = started["spec"]["workerGroupSpecs"][1]["template"]
    assert multi["spec"]["nodeSelector"] == {"pool": "multi"}
    # KubeRay names the cluster on its pods itself: no RayJob label here.
    assert multi["metadata"]["labels"] == {"kueue.x-k8s.io/podset": "multi"}
    assert {"op": "test", "path": "/spec/workerGroupSpecs/1/groupName", "value": "multi"} in patch
    assert rc.RAYCLUSTER.injected(started)
    partial = {k: v for k, v in _injections().items() if k != "multi"}
    assert rc.RAYCLUSTER.start_patch(obj, workload_name="wl", injections=partial) == []
    restored = jsonpatch.apply_patch(
        started, rc.RAYCLUSTER.restore_patch(started, pod_sets=rc.pod_sets(obj))
    )
    assert restored["spec"]["suspend"] is True
    assert {k: v for k, v in restored["spec"].items() if k != "suspend"} == {
        k: v for k, v in obj["spec"].items() if k != "suspend"
    }
    assert not rc.RAYCLUSTER.injected(restored)


def test_a_raycluster_never_finishes_and_is_ready_by_its_state() -> None:
    obj = a_raycluster()
    obj["status"] = {"state": "failed", "reason": "boom"}
    assert rc.RAYCLUSTER.finished(obj) is None
    assert rc.RAYCLUSTER.needs_workload(obj)
    assert not rc.pods_ready(obj)
    obj["status"] = {"state": "ready"}
    assert rc.pods_ready(obj)
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not rc.RAYCLUSTER.needs_workload(obj)


def test_the_webhook_checks_what_kueue_checks() -> None:
    obj = a_raycluster()
    assert validate_raycluster(obj) == []
    auto = copy.deepcopy(obj)
    auto["spec"]["enableInTreeAutoscaling"] = True
    (error,) = validate_raycluster(auto)
    assert error.startswith("spec.enableInTreeAutoscaling: a queued RayCluster cannot autoscale")
    head = a_raycluster({"groupName": "head", "template": template()})
    (error,) = validate_raycluster(head)
    assert error.startswith("spec.workerGroupSpecs[0].groupName: 'head'")
    running = copy.deepcopy(obj)
    running["spec"]["suspend"] = False
    moved = copy.deepcopy(running)
    moved["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "other"
    (error,) = validate_raycluster(moved, old=running)
    assert "cannot be changed or removed while the RayCluster runs" in error


def test_the_hold_webhook_suspends_a_queued_raycluster_but_not_a_rayjobs() -> None:
    registry = kopf.OperatorRegistry()
    register_webhooks(registry, validator=lambda obj: [], frameworks=(rc.FRAMEWORK,))
    (hold,) = [
        h for h in registry._webhooks.get_all_handlers() if h.id == "suspend-queued-rayclusters"
    ]

    def patch_for(obj: dict[str, Any]) -> dict[str, Any]:
        patch: dict[str, Any] = {}
        asyncio.run(hold.fn(body=obj, patch=patch))  # type: ignore[call-arg]
        return patch

    assert patch_for(a_raycluster(suspend=False)) == {"spec": {"suspend": True}}
    assert patch_for(a_rayjobs_cluster()) == {}
