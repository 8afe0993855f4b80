"""The resource-in-use finalizer: added to live ClusterQueues and ResourceFlavors, removed
from a deleted ClusterQueue only once the core has let it go (a deleted ClusterQueue stays
terminating after a restart while restored Workloads hold its quota), and from a deleted
ResourceFlavor only once no ClusterQueue names it and no admitted Workload holds it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from phalanx.admission.scheduler import Scheduler
from phalanx.operator.bridge import CoreBridge
from phalanx.operator.finalizers import (
    RESOURCE_IN_USE,
    ResourceInUseFinalizers,
    finalizer_patch,
    flavors_in_use,
)
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

    finalizers = ResourceInUseFinalizers(None, state, spawn=spawn)  # type: ignore[arg-type]
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


# -- ResourceFlavors ------------------------------------------------------------------------------


def flavor(name: str, *, deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "resourceVersion": "3"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        metadata["finalizers"] = [RESOURCE_IN_USE]
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": metadata}


class RecordingApi:
    def __init__(self) -> None:
        self.patches: list[tuple[str, str, list[dict[str, Any]]]] = []

    async def patch(self, resource: Any, name: str, patch: Any, **_: Any) -> dict[str, Any]:
        self.patches.append((resource.plural, name, patch))
        return {}


def finalizer_writes(state: ClusterState) -> list[tuple[str, str, str]]:
    """(plural, name, add/remove) of the patches one reconcile pass sends."""
    api = RecordingApi()
    coros: list[Any] = []
    ResourceInUseFinalizers(api, state, spawn=coros.append).reconcile(  # type: ignore[arg-type]
        in_core=lambda name: True
    )

    async def run() -> None:
        for coro in coros:
            await coro

    asyncio.run(run())
    return [(plural, name, patch[-1]["op"]) for plural, name, patch in api.patches]


def finished(wl: dict[str, Any]) -> dict[str, Any]:
    wl["status"]["conditions"].append({"type": "Finished", "status": "True", "reason": "Succeeded"})
    return wl


@pytest.mark.parametrize(
    ("objects", "writes"),
    [
        pytest.param([flavor("default")], [("resourceflavors", "default", "add")], id="live"),
        pytest.param(
            [flavor("default", deleting=True)],
            [("resourceflavors", "default", "remove")],
            id="deleted-unused",
        ),
        pytest.param(
            [flavor("default", deleting=True), cluster_queue(finalizers=[RESOURCE_IN_USE])],
            [],
            id="deleted-named-by-a-cluster-queue",
        ),
        pytest.param(
            [
                flavor("default", deleting=True),
                cluster_queue(deleting=True, finalizers=[RESOURCE_IN_USE]),
            ],
            [],
            id="deleted-named-by-a-terminating-cluster-queue",
        ),
        pytest.param(
            [flavor("default", deleting=True), workload("held")],
            [],
            id="deleted-held-by-an-admitted-workload",
        ),
        pytest.param(
            [flavor("default", deleting=True), finished(workload("done"))],
            [("resourceflavors", "default", "remove")],
            id="deleted-a-finished-workload-does-not-hold",
        ),
        pytest.param(
            [flavor("other", deleting=True), cluster_queue(finalizers=[RESOURCE_IN_USE])],
            [("resourceflavors", "other", "remove")],
            id="deleted-another-flavor-is-used",
        ),
    ],
)
def test_a_resource_flavor_keeps_the_finalizer_while_in_use(
    objects: list[dict[str, Any]], writes: list[tuple[str, str, str]]
) -> None:
    state = ClusterState()
    for obj in objects:
        state.apply(obj["kind"], None, obj)
    assert finalizer_writes(state) == writes


def test_flavors_in_use_are_those_named_or_held() -> None:
    assert flavors_in_use([cluster_queue()], []) == {"default"}
    assert flavors_in_use([], [workload("held")]) == {"default"}
    assert flavors_in_use([], [finished(workload("done"))]) == set()


def test_the_answer_to_a_release_is_not_recorded_over_the_deletion() -> None:
    """The DELETED watch event of a released ClusterQueue can come before the answer to the
    patch that released it; recording that answer would bring the queue back into the state
    for good, holding its flavor (seen on the local control plane)."""
    state = ClusterState()
    state.apply("ClusterQueue", None, cluster_queue(deleting=True, finalizers=[RESOURCE_IN_USE]))
    state.apply("ResourceFlavor", None, flavor("default", deleting=True))

    class ReleasingApi(RecordingApi):
        async def patch(self, resource: Any, name: str, patch: Any, **kw: Any) -> dict[str, Any]:
            await super().patch(resource, name, patch, **kw)
            released = cluster_queue(rv="6", deleting=True, finalizers=[])
            state.apply("ClusterQueue", "DELETED", released)  # the watch was faster
            return released

    coros: list[Any] = []
    finalizers = ResourceInUseFinalizers(ReleasingApi(), state, spawn=coros.append)  # type: ignore[arg-type]
    finalizers.reconcile(in_core=lambda name: False)
    asyncio.run(coros[0])
    assert "cq" not in state.objects["ClusterQueue"]
    assert finalizer_writes(state) == [("resourceflavors", "default", "remove")]


def _workload(
    *, finalizers: list[str], rv: int = 9, finished: bool = False, deleting: bool = False
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": "job-train-1a2b3",
        "namespace": "team-a",
        "resourceVersion": str(rv),
        "uid": "w1",
        "finalizers": finalizers,
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    conditions = [{"type": "Finished", "status": "True"}] if finished else []
    return {"metadata": metadata, "spec": {}, "status": {"conditions": conditions}}


def test_a_kueue_workloads_finalizer_is_removed_once_it_is_finished_or_deleted() -> None:
    # Kueue creates a Job's Workload with the finalizer and removes it itself; after a move
    # from Kueue nobody else does, and a deleted Job's Workload would hold its quota forever.
    state = ClusterState()
    spawned: list[Any] = []

    def spawn(coro: Any) -> None:
        spawned.append(coro)
        coro.close()

    finalizers = ResourceInUseFinalizers(None, state, spawn=spawn)  # type: ignore[arg-type]
    key = ("Workload", "team-a/job-train-1a2b3")
    state.apply("Workload", None, _workload(finalizers=["other", RESOURCE_IN_USE]))
    finalizers.reconcile(in_core=lambda name: False)
    assert spawned == [], "a running Workload keeps it"
    for version in (
        _workload(finalizers=[RESOURCE_IN_USE], rv=10, finished=True),
        _workload(finalizers=[RESOURCE_IN_USE], rv=11, deleting=True),
    ):
        state.apply("Workload", None, version)
        finalizers._in_flight.clear()
        spawned.clear()
        finalizers.reconcile(in_core=lambda name: False)
        assert len(spawned) == 1 and key in finalizers._in_flight, version["metadata"]
    # Without the finalizer (removed, or never there) it is not looked at again.
    finalizers._in_flight.clear()
    spawned.clear()
    state.apply("Workload", None, _workload(finalizers=[], rv=12, deleting=True))
    finalizers.reconcile(in_core=lambda name: False)
    assert spawned == [] and not finalizers._workloads


def test_the_workload_patch_is_sent_to_its_namespace() -> None:
    calls: list[tuple[Any, ...]] = []

    class Api:
        async def patch(self, resource: Any, name: str, patch: Any, **kwargs: Any) -> Any:
            calls.append((resource.plural, name, kwargs.get("namespace")))
            return {"metadata": {"deletionTimestamp": "x", "finalizers": []}}

    state = ClusterState()
    finalizers = ResourceInUseFinalizers(Api(), state, spawn=lambda c: None)  # type: ignore[arg-type]
    patch = finalizer_patch(_workload(finalizers=[RESOURCE_IN_USE]), keep=False)
    assert patch is not None
    asyncio.run(finalizers._patch("Workload", "team-a/job-train-1a2b3", patch, adding=False))
    assert calls == [("workloads", "job-train-1a2b3", "team-a")]
