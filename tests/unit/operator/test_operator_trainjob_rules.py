"""TrainJob integration rules (``phalanx.operator.trainjob``), pure, and the generic controller
running them with the Trainer's JobSet as the source of the pod sets, against a scripted API."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import jsonpatch
from kind_harness import KindHarness

from phalanx.operator import integration, jobs
from phalanx.operator import jobset as js
from phalanx.operator import trainjob as tj
from phalanx.operator.job_validation import validate_jobset, validate_trainjob

NS = "team-a"
MANAGER = "kueue.x-k8s.io/manager"


def a_trainjob(*, suspend: bool = True, patches: list[dict[str, Any]] | None = None):
    spec: dict[str, Any] = {
        "runtimeRef": {"name": "torch-distributed"},
        "trainer": {"numNodes": 4},
        "suspend": suspend,
    }
    if patches is not None:
        spec["runtimePatches"] = patches
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "llm",
            "namespace": NS,
            "uid": "tj-uid-1",
            "labels": {"kueue.x-k8s.io/queue-name": "lq"},
        },
        "spec": spec,
    }


def kueue_entry(**spec: Any) -> dict[str, Any]:
    return {"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": spec}}}


def the_jobset(*, suspend: bool = True, uid: str = "tj-uid-1", annotations=None):
    """The JobSet the Trainer makes: named after the TrainJob, controlled by it."""
    template = {
        "metadata": {"annotations": dict(annotations or {})},
        "spec": {
            "priorityClassName": "high",
            "containers": [{"name": "node", "resources": {"requests": {"nvidia.com/gpu": "8"}}}],
        },
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "llm",
            "namespace": NS,
            "uid": "js-uid",
            "ownerReferences": [
                {"kind": "TrainJob", "name": "llm", "uid": uid, "controller": True},
            ],
        },
        "spec": {
            "suspend": suspend,
            "replicatedJobs": [
                {
                    "name": "node",
                    "replicas": 1,
                    "template": {
                        "spec": {"parallelism": 4, "completions": 4, "template": template}
                    },
                }
            ],
        },
    }


def injection(**extra: Any) -> integration.FlavorInjection:
    return integration.FlavorInjection(
        pod_set="node",
        count=4,
        node_labels={"gpu": "h100"},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        topology_gated=True,
        **extra,
    )


def patched_jobs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    [entry] = [p for p in obj["spec"]["runtimePatches"] if p["manager"] == MANAGER]
    return entry["trainingRuntimeSpec"]["template"]["spec"].get("replicatedJobs") or []


# -- rules ----------------------------------------------------------------------------------------


def test_workload_name_is_kueues() -> None:
    assert tj.workload_name("llm", "tj-uid-1") == integration.kueue_workload_name(
        prefix="trainjob", kind="TrainJob", group="trainer.kubeflow.org", name="llm", uid="tj-uid-1"
    )
    assert tj.workload_name("llm", "tj-uid-1").startswith("trainjob-llm-")


def test_the_webhook_holds_it_and_appends_the_kueue_patch_keeping_the_others() -> None:
    other = {"manager": "team.example/tuner", "trainingRuntimeSpec": {"template": {}}}
    held = tj.hold_patch(a_trainjob(suspend=False, patches=[other]))
    assert held == {"spec": {"suspend": True, "runtimePatches": [other, kueue_entry()]}}
    # Already there (a re-sent request): not added twice.
    again = tj.hold_patch(a_trainjob(patches=[kueue_entry()]))
    assert again["spec"]["runtimePatches"] == [kueue_entry()]
    assert tj.hold_patch(a_trainjob())["spec"]["runtimePatches"] == [kueue_entry()]


def test_pod_sets_are_the_jobsets_one_per_replicated_job() -> None:
    (pod_set,) = tj.pod_sets_from_jobset(a_trainjob(), the_jobset())
    assert (pod_set["name"], pod_set["count"]) == ("node", 4)
    assert pod_set["template"]["spec"]["containers"][0]["resources"]["requests"] == {
        "nvidia.com/gpu": "8"
    }


def test_a_jobset_that_cannot_be_a_workload_names_the_runtime() -> None:
    bad = the_jobset()
    bad["spec"]["replicatedJobs"][0]["name"] = ""
    try:
        tj.pod_sets_from_jobset(a_trainjob(), bad)
    except tj.InvalidTrainJob as error:
        assert "runtime 'torch-distributed' (spec.runtimeRef)" in str(error)
        assert "spec.replicatedJobs[0].name: empty" in str(error)
    else:
        raise AssertionError("an unnamed replicated job was accepted")


def test_only_its_own_held_jobset_without_an_admission_gives_the_pod_sets() -> None:
    trainjob = a_trainjob()
    assert tj.jobset_is_current(trainjob, the_jobset())
    assert not tj.jobset_is_current(trainjob, the_jobset(uid="another-trainjob"))
    assert not tj.jobset_is_current(trainjob, the_jobset(suspend=False))
    stale = the_jobset(annotations={jobs.WORKLOAD_ANNOTATION: "trainjob-llm-1a2b3"})
    assert not tj.jobset_is_current(trainjob, stale)


def test_priority_from_the_label_else_the_jobsets_templates() -> None:
    pod_sets = tj.pod_sets_from_jobset(a_trainjob(), the_jobset())
    by_class = tj.resolve_priority_from(
        a_trainjob(), pod_sets, workload_priority_classes={}, priority_classes={"high": 900}
    )
    assert by_class.value == 900
    labelled = a_trainjob()
    labelled["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "urgent"
    by_label = tj.resolve_priority_from(
        labelled, pod_sets, workload_priority_classes={"urgent": 5000}, priority_classes={}
    )
    assert by_label.value == 5000


def test_start_writes_each_pod_sets_admission_into_the_kueue_patch_and_unsuspends() -> None:
    obj = a_trainjob(patches=[{"manager": "other"}, kueue_entry()])
    patch = tj.TRAINJOB.start_patch(
        obj, workload_name="wl-1", injections={"node": injection(labels={"team": "a"})}
    )
    started = jsonpatch.apply_patch(obj, patch)
    assert started["spec"]["suspend"] is False
    assert started["spec"]["runtimePatches"][0] == {"manager": "other"}
    [node] = patched_jobs(started)
    assert node == {
        "name": "node",
        "template": {
            "spec": {
                "template": {
                    "metadata": {
                        "labels": {"team": "a", "kueue.x-k8s.io/podset": "node"},
                        "annotations": {"kueue.x-k8s.io/workload": "wl-1"},
                    },
                    "spec": {
                        "nodeSelector": {"gpu": "h100"},
                        "tolerations": [
                            {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
                        ],
                        "schedulingGates": [{"name": "kueue.x-k8s.io/topology"}],
                    },
                }
            }
        },
    }
    assert tj.TRAINJOB.injected(started) and not tj.TRAINJOB.injected(obj)
    # The entry is addressed by index behind a test of its manager.
    assert {"op": "test", "path": "/spec/runtimePatches/1/manager", "value": MANAGER} in patch
    moved = a_trainjob(patches=[kueue_entry(), {"manager": "other"}])
    try:
        jsonpatch.apply_patch(moved, patch)
    except jsonpatch.JsonPatchTestFailed:
        pass
    else:
        raise AssertionError("a patch for a moved entry was applied")


def test_start_adds_the_kueue_patch_when_the_webhook_missed_it() -> None:
    for obj in (a_trainjob(), a_trainjob(patches=[{"manager": "other"}])):
        started = jsonpatch.apply_patch(
            obj, tj.TRAINJOB.start_patch(obj, workload_name="w", injections={"node": injection()})
        )
        assert [p["name"] for p in patched_jobs(started)] == ["node"]
    assert tj.TRAINJOB.start_patch(a_trainjob(), workload_name="w", injections={}) == []


def test_restore_suspends_and_empties_the_kueue_patch() -> None:
    obj = a_trainjob(suspend=False, patches=[kueue_entry(replicatedJobs=[{"name": "node"}])])
    restored = jsonpatch.apply_patch(obj, tj.TRAINJOB.restore_patch(obj, pod_sets=[]))
    assert restored["spec"]["suspend"] is True
    assert restored["spec"]["runtimePatches"] == [kueue_entry()]
    assert not tj.TRAINJOB.injected(restored)


def test_suspend_writes_only_spec_suspend() -> None:
    """The Trainer's webhook refuses a runtime patch change while the JobSet runs: a TrainJob
    created without the webhook is held first, and gets the Kueue patch at admission."""
    obj = a_trainjob(suspend=False)
    assert tj.TRAINJOB.suspend_patch(obj) == [{"op": "add", "path": "/spec/suspend", "value": True}]


def test_writing_the_whole_patch_list_is_guarded_by_the_version_read() -> None:
    obj = a_trainjob()
    obj["metadata"]["resourceVersion"] = "41"
    patch = tj.TRAINJOB.start_patch(obj, workload_name="w", injections={"node": injection()})
    assert patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    changed = copy.deepcopy(obj)
    changed["metadata"]["resourceVersion"] = "42"
    try:
        jsonpatch.apply_patch(changed, patch)
    except jsonpatch.JsonPatchTestFailed:
        pass
    else:
        raise AssertionError("the whole list was written over a newer version")


def test_active_from_its_jobs_status() -> None:
    obj = a_trainjob()
    assert not tj.active(obj)
    obj["status"] = {"jobsStatus": [{"name": "node", "active": 0, "succeeded": 2}]}
    assert not tj.active(obj)
    obj["status"]["jobsStatus"].append({"name": "init", "active": 1})
    assert tj.active(obj)


def test_finished_from_the_trainjob_conditions_and_pods_ready_from_its_jobs() -> None:
    obj = a_trainjob()
    assert tj.trainjob_finish(obj) is None
    obj["status"] = {"conditions": [{"type": "Complete", "status": "True", "message": "done"}]}
    assert tj.trainjob_finish(obj) == integration.Finish(True, "Succeeded", "done")
    obj["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
    assert tj.trainjob_finish(obj) == integration.Finish(False, "Failed", "TrainJob failed")
    jobset = the_jobset()
    jobset["spec"]["replicatedJobs"].append({"name": "init", "replicas": 2})
    obj["status"] = {"jobsStatus": [{"name": "node", "ready": 1}, {"name": "init", "ready": 1}]}
    assert not tj.pods_ready(obj, jobset)
    obj["status"]["jobsStatus"][1]["succeeded"] = 1
    assert tj.pods_ready(obj, jobset)


def test_a_trainjobs_jobset_is_not_queued_nor_checked_as_a_jobset() -> None:
    jobset = the_jobset()
    jobset["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "lq"}  # runtime labels
    assert js.JOBSET.queue_name(jobset) is None
    jobset["spec"]["replicatedJobs"] *= 9  # more than 8 pod sets: the TrainJob's problem
    assert validate_jobset(jobset) == []
    del jobset["metadata"]["ownerReferences"]
    assert js.JOBSET.queue_name(jobset) == "lq"
    assert validate_jobset(jobset)


def test_the_webhook_checks_the_queue_name() -> None:
    obj = a_trainjob()
    assert validate_trainjob(obj) == []
    obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "Not_A_Queue"
    (error,) = validate_trainjob(obj)
    assert error.startswith("metadata.labels[kueue.x-k8s.io/queue-name]: 'Not_A_Queue'")
    assert "of the TrainJob's namespace" in error


# -- the controller against a scripted API --------------------------------------------------------


class Harness(KindHarness):
    def __init__(self) -> None:
        super().__init__(
            framework=tj.FRAMEWORK,
            plural="trainjobs",
            state_kind="TrainJob",
            obj=a_trainjob(patches=[kueue_entry()]),
            assignments=[("node", 4, {"nvidia.com/gpu": "h100"})],
            flavors={"h100": {}},
            capture_events=True,
        )

    def trainer_makes_the_jobset(self, **kwargs: Any) -> None:
        self.state.apply("TrainJobSet", "ADDED", the_jobset(**kwargs))

    def trainer_reports(self, *, active: int) -> None:
        obj = self.obj()
        obj["status"] = {"jobsStatus": [{"name": "node", "active": active}]}
        self.state.apply("TrainJob", "MODIFIED", self.api._bump(obj))


def test_the_workload_waits_for_the_trainers_jobset_then_runs_and_is_stopped_through_the_patch():
    async def main() -> None:
        h = Harness()
        await h.reconcile()
        assert h.api.creates == 0, "a Workload before the Trainer made the JobSet"
        assert len(h.events) == 1 and h.events[0].startswith("WaitingForJobSet: waiting for")
        await h.reconcile()
        assert len(h.events) == 1, "the wait is told once per version of the TrainJob"
        # A JobSet with an admission still in it (the Trainer has not rebuilt it): not read.
        h.trainer_makes_the_jobset(annotations={jobs.WORKLOAD_ANNOTATION: "old"})
        await h.reconcile()
        assert h.api.creates == 0
        h.trainer_makes_the_jobset()
        await h.reconcile()
        wl = h.api.workload()
        assert wl["metadata"]["name"] == tj.workload_name("llm", "tj-uid-1")
        assert [(p["name"], p["count"]) for p in wl["spec"]["podSets"]] == [("node", 4)]
        assert wl["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
        h.admit()
        await h.reconcile()
        assert h.obj()["spec"]["suspend"] is False
        assert [p["name"] for p in patched_jobs(h.obj())] == ["node"]
        # Evicted: held through spec.suspend, then the patch emptied.
        wl = h.evict()
        await h.reconcile()
        assert h.obj()["spec"]["suspend"] is True and patched_jobs(h.obj())
        # Its Jobs still active: the patch waits (the Trainer's webhook would refuse it).
        h.trainer_reports(active=2)
        await h.reconcile()
        assert patched_jobs(h.obj())
        h.trainer_reports(active=0)
        await h.reconcile()
        assert patched_jobs(h.obj()) == []
        assert h.api.creates == 1
        # The Trainer has not held the JobSet yet: it may still make pods, the quota waits.
        h.trainer_makes_the_jobset(suspend=False)
        assert not h.ctl.stopped(h.api.workload())
        h.trainer_makes_the_jobset()
        # Its pods name it by the JobSet's label: its quota waits for them.
        pod = {"metadata": {"name": "p", "namespace": NS, "labels": {js.JOBSET_NAME_LABEL: "llm"}}}
        h.state.apply("Pod", "ADDED", copy.deepcopy(pod))
        assert not h.ctl.stopped(h.api.workload())
        h.state.apply("Pod", "DELETED", pod)
        assert h.ctl.stopped(h.api.workload())

    asyncio.run(main())


def test_a_workload_deleted_while_it_ran_is_made_again_once_the_admission_is_taken_out():
    """Its JobSet keeps the old admission until the runtime patch is emptied: that comes first,
    then a Workload from the rebuilt JobSet."""

    async def main() -> None:
        h = Harness()
        h.trainer_makes_the_jobset()
        await h.reconcile()
        h.admit()
        await h.reconcile()
        assert h.obj()["spec"]["suspend"] is False
        h.trainer_makes_the_jobset(annotations={jobs.WORKLOAD_ANNOTATION: "wl"}, suspend=False)
        wl = h.api.workload()
        del h.api.objects[("workloads", f"{NS}/{wl['metadata']['name']}")]
        h.state.apply("Workload", "DELETED", wl)
        await h.reconcile()  # held first
        assert h.obj()["spec"]["suspend"] is True and patched_jobs(h.obj())
        await h.reconcile()  # then the admission out
        assert patched_jobs(h.obj()) == [] and h.api.creates == 1
        await h.reconcile()  # the JobSet still has the old admission: no Workload from it
        assert h.api.creates == 1
        h.trainer_makes_the_jobset()
        await h.reconcile()
        assert h.api.creates == 2

    asyncio.run(main())
