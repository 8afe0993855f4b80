"""The PyTorchJob integration (Kueue's ``kubeflow.org/pytorchjob``): one pod set per replica type
(``master`` then ``worker``), Kueue's Workload naming, the hold through
``spec.runPolicy.suspend``, the start patch with each pod set's flavors on its replica type,
the restore, the end, PodsReady, the priority, the webhook's checks; and the generic
controller's flow for it against a scripted API (Workload, start, eviction: suspend then
restore, pods left, finish)."""

from __future__ import annotations

import asyncio
import copy
import hashlib
from typing import Any

import jsonpatch
import pytest
from kind_harness import KindHarness
from test_operator_ungate import ScriptedPods

from phalanx.operator import integration, jobs
from phalanx.operator import pytorchjob as pt
from phalanx.operator.configfile import FRAMEWORKS
from phalanx.operator.job_validation import validate_pytorchjob
from phalanx.operator.kinds import by_framework
from phalanx.operator.metrics import Metrics
from phalanx.operator.state import ClusterState
from phalanx.operator.ungate import GateRemover
from phalanx.placement import encode_topology_assignment

NS = "team-a"


def replica(*, replicas: int | None = 1, annotations: dict[str, str] | None = None, **pod: Any):
    spec: dict[str, Any] = {
        "template": {
            "spec": {
                "containers": [
                    {"name": "pytorch", "image": "x", "resources": {"requests": {"cpu": "1"}}}
                ],
                **pod,
            }
        }
    }
    if annotations is not None:
        spec["template"]["metadata"] = {"annotations": annotations}
    if replicas is not None:
        spec["replicas"] = replicas
    return spec


def a_pytorchjob(
    master: dict[str, Any] | None = None,
    worker: dict[str, Any] | None = None,
    *,
    suspend: bool | None = True,
) -> dict[str, Any]:
    specs = {}
    if master is not None:
        specs["Master"] = master
    if worker is not None:
        specs["Worker"] = worker
    if not specs:
        specs = {"Master": replica(), "Worker": replica(replicas=3)}
    spec: dict[str, Any] = {"pytorchReplicaSpecs": specs}
    if suspend is not None:
        spec["runPolicy"] = {"suspend": suspend}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": "trainer",
            "namespace": NS,
            "uid": "pt-uid-1",
            "labels": {"kueue.x-k8s.io/queue-name": "lq"},
        },
        "spec": spec,
    }


# -- rules ----------------------------------------------------------------------------------------


def test_one_pod_set_per_replica_type_master_first_lower_case_counting_replicas() -> None:
    # Written Worker first: the pod sets still follow Kueue's order, master then worker.
    obj = a_pytorchjob()
    obj["spec"]["pytorchReplicaSpecs"] = {
        "Worker": replica(replicas=4),
        "Master": replica(replicas=None),  # replicas defaults to 1
    }
    sets = pt.pod_sets(obj)
    assert [(p["name"], p["count"]) for p in sets] == [("master", 1), ("worker", 4)]
    assert sets[1]["template"] == obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    sets[1]["template"]["spec"]["nodeSelector"] = {"x": "y"}
    assert "nodeSelector" not in obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    # A job of workers only has one pod set.
    only = a_pytorchjob(worker=replica(replicas=2))
    assert [(p["name"], p["count"]) for p in pt.pod_sets(only)] == [("worker", 2)]


def test_a_pytorchjob_without_master_or_worker_is_refused_with_the_field() -> None:
    obj = a_pytorchjob()
    obj["spec"]["pytorchReplicaSpecs"] = {"Chief": replica()}
    with pytest.raises(pt.InvalidPyTorchJob, match=r"spec.pytorchReplicaSpecs: neither Master"):
        pt.pod_sets(obj)


def test_the_topology_annotations_of_a_replica_type_index_pods_by_replica_index() -> None:
    rack = {"kueue.x-k8s.io/podset-required-topology": "example.com/rack"}
    obj = a_pytorchjob(replica(), replica(replicas=4, annotations=rack))
    master, worker = pt.pod_sets(obj)
    assert "topologyRequest" not in master
    assert worker["topologyRequest"] == {
        "required": "example.com/rack",
        "podIndexLabel": "training.kubeflow.org/replica-index",
    }


def test_workload_name_is_kueues() -> None:
    digest = hashlib.sha1(b"PyTorchJob\nkubeflow.org\ntrainer\npt-uid-1").hexdigest()[:5]
    assert pt.workload_name("trainer", "pt-uid-1") == f"pytorchjob-trainer-{digest}"
    assert pt.PYTORCHJOB.workload_name(a_pytorchjob()) == f"pytorchjob-trainer-{digest}"


def test_the_workload_is_owned_by_the_pytorchjob() -> None:
    obj = a_pytorchjob()
    body = integration.workload_manifest(
        pt.PYTORCHJOB, obj, pod_sets=pt.pod_sets(obj), priority=0, priority_ref=None
    )
    (owner,) = body["metadata"]["ownerReferences"]
    assert (owner["apiVersion"], owner["kind"], owner["uid"]) == (
        "kubeflow.org/v1",
        "PyTorchJob",
        "pt-uid-1",
    )
    assert [p["name"] for p in body["spec"]["podSets"]] == ["master", "worker"]


def test_priority_from_the_label_then_the_scheduling_policy_then_master_before_worker() -> None:
    classes = {"low": 1, "mid": 50, "high": 100}
    obj = a_pytorchjob(replica(priorityClassName="low"), replica(priorityClassName="high"))
    got = pt.resolve_priority(obj, workload_priority_classes={}, priority_classes=classes)
    assert got.value == 1, "the master's class comes before the worker's"
    obj["spec"]["runPolicy"]["schedulingPolicy"] = {"priorityClass": "mid"}
    got = pt.resolve_priority(obj, workload_priority_classes={}, priority_classes=classes)
    assert got.value == 50 and got.ref is not None and got.ref["name"] == "mid"
    obj["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "urgent"
    got = pt.resolve_priority(obj, workload_priority_classes={"urgent": 7}, priority_classes={})
    assert got.value == 7


def test_held_through_run_policy_suspend_added_whole_when_absent() -> None:
    obj = a_pytorchjob(suspend=False)
    assert not pt.PYTORCHJOB.suspended(obj)
    held = jsonpatch.apply_patch(obj, pt.PYTORCHJOB.suspend_patch(obj))
    assert held["spec"]["runPolicy"] == {"suspend": True} and pt.PYTORCHJOB.suspended(held)
    bare = a_pytorchjob(suspend=None)
    assert not pt.PYTORCHJOB.suspended(bare)
    held = jsonpatch.apply_patch(bare, pt.PYTORCHJOB.suspend_patch(bare))
    assert held["spec"]["runPolicy"] == {"suspend": True}
    # The webhook's merge patch at creation holds the same field.
    assert by_framework()[pt.FRAMEWORK].hold_at_creation == {
        "spec": {"runPolicy": {"suspend": True}}
    }


def _injections() -> dict[str, integration.FlavorInjection]:
    return {
        "master": integration.FlavorInjection(
            pod_set="master",
            count=1,
            node_labels={"pool": "cpu"},
            tolerations=[],
            topology_gated=False,
        ),
        "worker": integration.FlavorInjection(
            pod_set="worker",
            count=3,
            node_labels={"gpu": "h100"},
            tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            topology_gated=True,
        ),
    }


def test_start_injects_each_pod_sets_flavors_into_its_replica_type_and_unsuspends() -> None:
    obj = a_pytorchjob(replica(nodeSelector={"zone": "a"}), replica(replicas=3))
    patch = pt.PYTORCHJOB.start_patch(obj, workload_name="wl-1", injections=_injections())
    started = jsonpatch.apply_patch(obj, patch)
    assert started["spec"]["runPolicy"]["suspend"] is False
    specs = started["spec"]["pytorchReplicaSpecs"]
    master, worker = specs["Master"]["template"], specs["Worker"]["template"]
    assert master["spec"]["nodeSelector"] == {"zone": "a", "pool": "cpu"}
    assert master["metadata"]["labels"] == {"kueue.x-k8s.io/podset": "master"}
    assert master["metadata"]["annotations"] == {"kueue.x-k8s.io/workload": "wl-1"}
    assert worker["spec"]["nodeSelector"] == {"gpu": "h100"}
    assert worker["spec"]["tolerations"] == [
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert worker["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/topology"}]
    assert pt.PYTORCHJOB.injected(started) and not pt.PYTORCHJOB.injected(obj)
    # Computed for 3 workers: refused if the job was resized since it was read.
    resized = copy.deepcopy(obj)
    resized["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 5
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(resized, patch)


def test_a_pytorchjob_starts_whole_or_not_at_all() -> None:
    obj = a_pytorchjob()
    only_master = {"master": _injections()["master"]}
    assert pt.PYTORCHJOB.start_patch(obj, workload_name="wl", injections=only_master) == []


def test_restore_suspends_and_puts_back_every_recorded_template() -> None:
    obj = a_pytorchjob(
        replica(nodeSelector={"zone": "a"}, annotations={"note": "x"}), replica(replicas=3)
    )
    recorded = pt.pod_sets(obj)
    started = jsonpatch.apply_patch(
        obj, pt.PYTORCHJOB.start_patch(obj, workload_name="wl", injections=_injections())
    )
    patch = pt.PYTORCHJOB.restore_patch(started, pod_sets=recorded)
    restored = jsonpatch.apply_patch(started, patch)
    assert restored["spec"]["runPolicy"]["suspend"] is True
    # Exactly as submitted: no empty metadata, node selector, tolerations or gates left.
    assert restored["spec"]["pytorchReplicaSpecs"] == obj["spec"]["pytorchReplicaSpecs"]
    assert not pt.PYTORCHJOB.injected(restored)


def test_finished_from_the_succeeded_or_failed_condition() -> None:
    obj = a_pytorchjob()
    assert pt.PYTORCHJOB.finished(obj) is None
    obj["status"] = {"conditions": [{"type": "Running", "status": "True"}]}
    assert pt.PYTORCHJOB.finished(obj) is None and pt.needs_workload(obj)
    done = "PyTorchJob trainer is successfully completed."
    obj["status"]["conditions"].append({"type": "Succeeded", "status": "True", "message": done})
    assert pt.PYTORCHJOB.finished(obj) == integration.Finish(True, "Succeeded", done)
    obj["status"] = {"conditions": [{"type": "Failed", "status": "True", "message": "boom"}]}
    assert pt.PYTORCHJOB.finished(obj) == integration.Finish(False, "Failed", "boom")
    assert not pt.needs_workload(obj)


def test_pods_ready_is_the_running_condition() -> None:
    obj = a_pytorchjob()
    obj["status"] = {"conditions": [{"type": "Created", "status": "True"}]}
    assert not pt.pods_ready(obj)
    obj["status"]["conditions"].append({"type": "Running", "status": "False"})
    assert not pt.pods_ready(obj)
    obj["status"]["conditions"][-1]["status"] = "True"
    assert pt.pods_ready(obj)


def test_the_framework_is_kueues_name_and_enabled_by_configuration() -> None:
    assert pt.FRAMEWORK in integration.KUEUE_FRAMEWORKS
    assert pt.FRAMEWORK in FRAMEWORKS


def test_the_webhook_checks_queue_name_and_each_replica_types_topology_annotations() -> None:
    obj = a_pytorchjob()
    assert validate_pytorchjob(obj) == []
    bad = copy.deepcopy(obj)
    bad["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "Not_A_Queue"
    (error,) = validate_pytorchjob(bad)
    assert error.startswith("metadata.labels[kueue.x-k8s.io/queue-name]")
    running = a_pytorchjob(suspend=False)
    moved = copy.deepcopy(running)
    moved["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "other"
    (error,) = validate_pytorchjob(moved, old=running)
    assert "while the PyTorchJob runs" in error and "spec.runPolicy.suspend: true" in error
    held = a_pytorchjob(suspend=True)
    moved = copy.deepcopy(held)
    moved["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "other"
    assert validate_pytorchjob(moved, old=held) == []
    both = a_pytorchjob(
        replica(),
        replica(
            annotations={
                "kueue.x-k8s.io/podset-required-topology": "rack",
                "kueue.x-k8s.io/podset-preferred-topology": "rack",
            }
        ),
    )
    (error,) = validate_pytorchjob(both)
    assert error.startswith("spec.pytorchReplicaSpecs[Worker].template.metadata.annotations:")
    too_big = a_pytorchjob(
        replica(),
        replica(
            replicas=2,
            annotations={
                "kueue.x-k8s.io/podset-slice-required-topology": "rack",
                "kueue.x-k8s.io/podset-slice-size": "3",
            },
        ),
    )
    (error,) = validate_pytorchjob(too_big)
    assert "must not be greater than the replica type's 2 pods" in error


# -- the generic controller, for PyTorchJobs, against a scripted API ----------------------------


class Harness(KindHarness):
    def __init__(self) -> None:
        super().__init__(
            framework=pt.FRAMEWORK,
            plural="pytorchjobs",
            state_kind="PyTorchJob",
            obj=a_pytorchjob(),
            assignments=[
                ("master", 1, {"cpu": "cpu"}),
                ("worker", 3, {"nvidia.com/gpu": "h100"}),
            ],
        )

    def pod(self, name: str, *, deleted: bool = False) -> None:
        labels = {pt.JOB_NAME_LABEL: "trainer"}
        pod = {"metadata": {"name": name, "namespace": NS, "labels": labels}}
        self.state.apply("Pod", "DELETED" if deleted else "ADDED", pod)


def test_a_queued_pytorchjob_is_admitted_whole_preempted_restored_and_finished() -> None:
    async def main() -> None:
        h = Harness()
        await h.reconcile()
        wl = h.api.workload()
        assert wl["metadata"]["name"] == pt.workload_name("trainer", "pt-uid-1")
        assert [(p["name"], p["count"]) for p in wl["spec"]["podSets"]] == [
            ("master", 1),
            ("worker", 3),
        ]
        await h.reconcile()
        assert h.obj()["spec"]["runPolicy"]["suspend"] is True and h.api.creates == 1
        h.admit()
        await h.reconcile()
        specs = h.obj()["spec"]["pytorchReplicaSpecs"]
        assert h.obj()["spec"]["runPolicy"]["suspend"] is False
        assert specs["Master"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}
        assert specs["Worker"]["template"]["spec"]["nodeSelector"] == {"gpu": "h100"}
        h.pod("trainer-worker-0")
        h.its_controller_writes(conditions=[{"type": "Running", "status": "True"}])
        await h.reconcile()
        conds = {c["type"]: c["status"] for c in h.api.workload()["status"]["conditions"]}
        assert conds["PodsReady"] == "True"
        # Preempted: held through spec.runPolicy.suspend, then the templates put back.
        wl = h.evict()
        assert not h.ctl.stopped(wl), "a running PyTorchJob is not stopped"
        await h.reconcile()
        assert h.obj()["spec"]["runPolicy"]["suspend"] is True
        assert not h.ctl.stopped(wl), "its pod is left"
        await h.reconcile()
        restored = h.obj()
        assert not pt.PYTORCHJOB.injected(restored)
        assert (
            restored["spec"]["pytorchReplicaSpecs"] == a_pytorchjob()["spec"]["pytorchReplicaSpecs"]
        )
        h.pod("trainer-worker-0", deleted=True)
        assert h.ctl.stopped(wl), "held with no pod left: its quota may be released"
        # Re-admitted, started again, succeeds.
        wl["status"]["conditions"] = [
            c for c in wl["status"]["conditions"] if c["type"] != "Evicted"
        ]
        h.state.apply("Workload", "MODIFIED", h.api._bump(wl))
        h.admit()
        await h.reconcile()
        assert h.obj()["spec"]["runPolicy"]["suspend"] is False
        h.its_controller_writes(
            conditions=[{"type": "Succeeded", "status": "True", "message": "done"}]
        )
        await h.reconcile()
        finished = {c["type"]: c for c in h.api.workload()["status"]["conditions"]}
        assert finished["Finished"]["status"] == "True"
        assert finished["Finished"]["reason"] == "Succeeded"

    asyncio.run(main())


def test_a_pytorchjob_created_unsuspended_is_held_before_its_workload() -> None:
    async def main() -> None:
        h = Harness()
        obj = h.obj()
        del obj["spec"]["runPolicy"]
        h.state.apply("PyTorchJob", "MODIFIED", h.api._bump(obj))
        await h.reconcile()
        assert h.obj()["spec"]["runPolicy"] == {"suspend": True}
        assert h.api.creates == 1

    asyncio.run(main())


def test_pytorchjob_state_kind_is_namespaced_and_tracked() -> None:
    state = ClusterState()
    state.apply("PyTorchJob", "ADDED", a_pytorchjob())
    assert state.get("PyTorchJob", f"{NS}/trainer") is not None
    assert jobs.queue_name(a_pytorchjob()) == "lq"


# -- topology: its pods released into the domains by their replica index ------------------------


def test_gated_workers_go_to_the_domain_of_their_replica_index() -> None:
    """The gate remover reads the pod index from the label the pod set's topology request
    names: worker 0 to the first rack, worker 1 to the second, whatever their names' order."""
    rack = "cloud.provider.com/topology-rack"
    workload = {
        "metadata": {"name": "wl", "namespace": NS, "resourceVersion": "1"},
        "spec": {
            "podSets": [
                {
                    "name": "worker",
                    "count": 2,
                    "topologyRequest": {
                        "required": rack,
                        "podIndexLabel": pt.REPLICA_INDEX_LABEL,
                    },
                }
            ]
        },
        "status": {
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {
                        "name": "worker",
                        "count": 2,
                        "topologyAssignment": encode_topology_assignment(
                            [rack], [(("r0",), 1), (("r1",), 1)]
                        ),
                    }
                ],
            }
        },
    }

    def worker(name: str, index: int) -> dict[str, Any]:
        labels = {jobs.PODSET_LABEL: "worker", pt.REPLICA_INDEX_LABEL: str(index)}
        return {
            "metadata": {
                "name": name,
                "namespace": NS,
                "resourceVersion": "1",
                "labels": labels,
                "annotations": {jobs.WORKLOAD_ANNOTATION: "wl"},
            },
            "spec": {"schedulingGates": [{"name": jobs.TOPOLOGY_GATE}]},
        }

    async def main() -> None:
        state = ClusterState()
        api = ScriptedPods(state, {})
        remover = GateRemover(api, state, Metrics())  # type: ignore[arg-type]
        remover.start()
        try:
            state.apply("Workload", "ADDED", workload)
            # Named against their index: by name alone "a" would take the first rack.
            state.apply("Pod", "ADDED", worker("a-worker", 1))
            state.apply("Pod", "ADDED", worker("b-worker", 0))
            for name in ("a-worker", "b-worker"):
                await asyncio.wait_for(api.event(name).wait(), 5.0)
            selectors = {
                name: (state.get("Pod", f"{NS}/{name}") or {})["spec"].get("nodeSelector")
                for name in ("a-worker", "b-worker")
            }
        finally:
            await remover.stop()
        assert selectors == {"b-worker": {rack: "r0"}, "a-worker": {rack: "r1"}}

    asyncio.run(main())
