"""The RayJob integration (Kueue's ``ray.io/rayjob``): pod sets head, each worker group, the
submitter; Kueue's Workload naming; the start patch with each pod set's flavors on its template
(and the RayJob's name as a label, so every pod names it); the restore; the end from
``jobDeploymentStatus``; the webhook's checks; and the generic controller's flow for a RayJob
against a scripted API (its RayCluster keeps an eviction's quota until it is gone)."""

from __future__ import annotations

import asyncio
import copy
import hashlib
from typing import Any

import jsonpatch
import kopf
import pytest
from kind_harness import KindHarness

from phalanx.operator import integration, jobs
from phalanx.operator import rayjob as rj
from phalanx.operator.job_validation import validate_rayjob
from phalanx.operator.kube import RAYCLUSTERS
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


def group(name: str, replicas: int | None = 2, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"groupName": name, "template": extra.pop("template", template())}
    if replicas is not None:
        body["replicas"] = replicas
    return {**body, **extra}


def a_rayjob(*groups: dict[str, Any], suspend: bool = True, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": "pi",
            "namespace": NS,
            "uid": "rj-uid-1",
            "labels": {"kueue.x-k8s.io/queue-name": "lq"},
        },
        "spec": {
            "suspend": suspend,
            "shutdownAfterJobFinishes": True,
            "entrypoint": "python pi.py",
            "rayClusterSpec": {
                "headGroupSpec": {"template": template("2")},
                "workerGroupSpecs": list(groups) or [group("small", 2), group("big", 1)],
            },
            **spec,
        },
    }


# -- rules ----------------------------------------------------------------------------------------


def test_pod_sets_are_head_then_each_worker_group_then_the_default_submitter() -> None:
    obj = a_rayjob(group("small", 3), group("multi", 2, numOfHosts=4), group("one", None))
    sets = rj.pod_sets(obj)
    assert [(p["name"], p["count"]) for p in sets] == [
        ("head", 1),
        ("small", 3),
        ("multi", 8),  # replicas x numOfHosts
        ("one", 1),  # replicas defaults to 1
        ("submitter", 1),  # K8sJobMode is KubeRay's default
    ]
    assert sets[0]["template"] == obj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    sets[1]["template"]["spec"]["nodeSelector"] = {"x": "y"}
    assert (
        "nodeSelector"
        not in obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    )
    # KubeRay's default submitter: the head's image and its default resources.
    (container,) = sets[-1]["template"]["spec"]["containers"]
    assert container == {
        "name": "ray-job-submitter",
        "image": "rayproject/ray:2.46.0",
        "resources": {
            "limits": {"cpu": "1", "memory": "1Gi"},
            "requests": {"cpu": "500m", "memory": "200Mi"},
        },
    }


def test_the_submitter_pod_set_follows_the_submission_mode() -> None:
    own = template("250m")
    named = a_rayjob(submitterPodTemplate=own)
    assert rj.pod_sets(named)[-1] == {"name": "submitter", "count": 1, "template": own}
    for mode in ("HTTPMode", "InteractiveMode"):
        sets = rj.pod_sets(a_rayjob(submissionMode=mode))
        assert [p["name"] for p in sets] == ["head", "small", "big"]
    # SidecarMode: KubeRay adds the submitter to the head pod, which counts it.
    sidecar = rj.pod_sets(a_rayjob(submissionMode="SidecarMode"))
    assert [p["name"] for p in sidecar] == ["head", "small", "big"]
    assert [c["name"] for c in sidecar[0]["template"]["spec"]["containers"]] == [
        "ray",
        "ray-job-submitter",
    ]


def test_each_groups_topology_annotations_become_its_request_without_a_pod_index() -> None:
    rack = {"annotations": {"kueue.x-k8s.io/podset-required-topology": "example.com/rack"}}
    obj = a_rayjob(group("workers", 4, template=template(metadata=rack)))
    head, workers, submitter = rj.pod_sets(obj)
    assert workers["topologyRequest"] == {"required": "example.com/rack"}
    assert "topologyRequest" not in head and "topologyRequest" not in submitter


def test_a_rayjob_that_cannot_be_a_workload_is_refused_with_the_field() -> None:
    bare = a_rayjob()
    del bare["spec"]["rayClusterSpec"]
    with pytest.raises(rj.InvalidRayJob, match=r"^spec.rayClusterSpec: required"):
        rj.pod_sets(bare)
    eight = a_rayjob(*[group(f"g{i}") for i in range(8)])
    with pytest.raises(rj.InvalidRayJob, match=r"8 worker groups.*9 pod sets.*at most 8"):
        rj.pod_sets(eight)
    # Seven groups fit beside the head, but not with the submitter too (Kueue's check counts
    # the head and the groups only; its Workload would then be refused).
    seven = a_rayjob(*[group(f"g{i}") for i in range(7)])
    with pytest.raises(rj.InvalidRayJob, match=r"7 worker groups, the head and the submitter"):
        rj.pod_sets(seven)
    seven["spec"]["submissionMode"] = "HTTPMode"
    assert len(rj.pod_sets(seven)) == 8
    with pytest.raises(rj.InvalidRayJob, match=r"workerGroupSpecs\[1\].groupName: 'submitter'"):
        rj.pod_sets(a_rayjob(group("a"), group("submitter")))
    no_image = a_rayjob()
    no_image["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"] = []
    with pytest.raises(rj.InvalidRayJob, match=r"headGroupSpec.template.spec.containers: empty"):
        rj.pod_sets(no_image)


def test_workload_name_is_kueues() -> None:
    digest = hashlib.sha1(b"RayJob\nray.io\npi\nrj-uid-1").hexdigest()[:5]
    assert rj.workload_name("pi", "rj-uid-1") == f"rayjob-pi-{digest}"
    assert rj.RAYJOB.workload_name(a_rayjob()) == f"rayjob-pi-{digest}"


def test_the_workload_is_owned_by_the_rayjob() -> None:
    obj = a_rayjob()
    body = integration.workload_manifest(
        rj.RAYJOB, obj, pod_sets=rj.pod_sets(obj), priority=0, priority_ref=None
    )
    (owner,) = body["metadata"]["ownerReferences"]
    assert (owner["apiVersion"], owner["kind"], owner["name"]) == ("ray.io/v1", "RayJob", "pi")
    assert body["spec"]["queueName"] == "lq"


def test_a_rayjob_on_an_existing_cluster_is_not_queued() -> None:
    obj = a_rayjob(clusterSelector={"ray.io/cluster": "shared"})
    assert rj.RAYJOB.queue_name(obj) is None
    assert rj.RAYJOB.queue_name(a_rayjob()) == "lq"


def test_priority_from_the_label_else_the_first_template_naming_a_class() -> None:
    obj = a_rayjob(group("small"), group("big", template=template(priorityClassName="high")))
    got = rj.resolve_priority(obj, workload_priority_classes={}, priority_classes={"high": 100})
    assert got.value == 100
    obj["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "urgent"
    got = rj.resolve_priority(obj, workload_priority_classes={"urgent": 7}, priority_classes={})
    assert got.value == 7


def _injection(
    name: str, labels: dict[str, str], *, gated: bool = False
) -> integration.FlavorInjection:
    return integration.FlavorInjection(
        pod_set=name, count=1, node_labels=labels, tolerations=[], topology_gated=gated
    )


def _injections() -> dict[str, integration.FlavorInjection]:
    return {
        "head": _injection("head", {"pool": "cpu"}),
        "small": _injection("small", {"gpu": "h100"}, gated=True),
        "big": _injection("big", {"gpu": "h100"}),
        "submitter": _injection("submitter", {"pool": "cpu"}),
    }


def test_start_injects_each_pod_sets_flavors_and_the_rayjobs_name_then_unsuspends() -> None:
    obj = a_rayjob()
    patch = rj.RAYJOB.start_patch(obj, workload_name="wl-1", injections=_injections())
    started = jsonpatch.apply_patch(obj, patch)
    assert started["spec"]["suspend"] is False
    cluster = started["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]
    small, big = (g["template"] for g in cluster["workerGroupSpecs"])
    submitter = started["spec"]["submitterPodTemplate"]
    assert head["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert small["spec"]["nodeSelector"] == big["spec"]["nodeSelector"] == {"gpu": "h100"}
    assert small["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/topology"}]
    assert big["spec"]["schedulingGates"] == []
    assert head["metadata"]["labels"] == {
        "kueue.x-k8s.io/podset": "head",
        "ray.io/originated-from-cr-name": "pi",
    }
    assert small["metadata"]["annotations"] == {"kueue.x-k8s.io/workload": "wl-1"}
    # The default submitter template is written out, with its admission.
    assert submitter["spec"]["containers"][0]["name"] == "ray-job-submitter"
    assert submitter["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert submitter["metadata"]["labels"]["ray.io/originated-from-cr-name"] == "pi"
    assert rj.RAYJOB.injected(started) and not rj.RAYJOB.injected(obj)
    test = {
        "op": "test",
        "path": "/spec/rayClusterSpec/workerGroupSpecs/1/groupName",
        "value": "big",
    }
    assert test in patch


def test_a_rayjob_starts_whole_or_not_at_all() -> None:
    without_submitter = {k: v for k, v in _injections().items() if k != "submitter"}
    assert rj.RAYJOB.start_patch(a_rayjob(), workload_name="wl", injections=without_submitter) == []


def test_a_reordered_worker_group_list_refuses_the_start() -> None:
    obj = a_rayjob()
    patch = rj.RAYJOB.start_patch(obj, workload_name="wl", injections=_injections())
    swapped = copy.deepcopy(obj)
    groups = swapped["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    groups.reverse()
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(swapped, patch)


def test_restore_suspends_and_puts_back_every_recorded_template() -> None:
    own = template("250m", nodeSelector={"zone": "a"})
    for obj in (a_rayjob(), a_rayjob(submitterPodTemplate=own)):
        recorded = rj.pod_sets(obj)
        started = jsonpatch.apply_patch(
            obj, rj.RAYJOB.start_patch(obj, workload_name="wl", injections=_injections())
        )
        restored = jsonpatch.apply_patch(
            started, rj.RAYJOB.restore_patch(started, pod_sets=recorded)
        )
        assert restored["spec"]["suspend"] is True
        assert restored["spec"]["rayClusterSpec"] == obj["spec"]["rayClusterSpec"]
        assert not rj.RAYJOB.injected(restored)
        # The submitter template admission wrote out stays, as recorded (Kueue leaves it).
        assert restored["spec"]["submitterPodTemplate"] == recorded[-1]["template"]


def test_restore_leaves_an_absent_submitter_template_absent() -> None:
    # The Workload recorded a submitter template of the user's, since taken out of the
    # RayJob: the restore has no template to write into, and must not address one.
    own = template("250m", metadata={"labels": {"team": "a"}}, nodeSelector={"zone": "a"})
    recorded = rj.pod_sets(a_rayjob(submitterPodTemplate=own))
    obj = a_rayjob()
    head = obj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    head["metadata"] = {"annotations": {"kueue.x-k8s.io/workload": "wl"}}
    restored = jsonpatch.apply_patch(obj, rj.RAYJOB.restore_patch(obj, pod_sets=recorded))
    assert "submitterPodTemplate" not in restored["spec"]
    assert not rj.RAYJOB.injected(restored)


def test_finished_from_the_job_deployment_status_succeeded_by_the_job_status() -> None:
    obj = a_rayjob()
    for deployment in ("Initializing", "Running", "Suspended"):
        obj["status"] = {"jobDeploymentStatus": deployment, "jobStatus": "SUCCEEDED"}
        assert rj.RAYJOB.finished(obj) is None
    obj["status"] = {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "message": "done"}
    assert rj.RAYJOB.finished(obj) == integration.Finish(True, "Succeeded", "done")
    obj["status"] = {"jobDeploymentStatus": "Failed", "jobStatus": "RUNNING", "message": "deadline"}
    assert rj.RAYJOB.finished(obj) == integration.Finish(False, "Failed", "deadline")
    assert not rj.needs_workload(obj)
    obj["status"] = {"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"}
    finish = rj.RAYJOB.finished(obj)
    assert finish is not None and not finish.succeeded


def test_pods_ready_when_its_ray_cluster_is_ready() -> None:
    obj = a_rayjob()
    assert not rj.pods_ready(obj)
    obj["status"] = {"rayClusterStatus": {"state": "ready"}}
    assert rj.pods_ready(obj)


def test_a_ray_cluster_runs_until_gone_unless_another_kind_made_it() -> None:
    mine = {"metadata": {"labels": {"ray.io/originated-from-crd": "RayJob"}}}
    service = {"metadata": {"labels": {"ray.io/originated-from-crd": "RayService"}}}
    assert not rj.raycluster_stopped(mine)
    assert rj.raycluster_stopped(service)


def test_the_webhook_checks_what_kueue_checks() -> None:
    obj = a_rayjob()
    assert validate_rayjob(obj) == []

    def errors_of(change: Any) -> list[str]:
        bad = copy.deepcopy(obj)
        change(bad)
        return validate_rayjob(bad)

    (error,) = errors_of(lambda o: o["spec"].update(shutdownAfterJobFinishes=False))
    assert error.startswith("spec.shutdownAfterJobFinishes: must be true")
    (error,) = errors_of(lambda o: o["spec"]["rayClusterSpec"].update(enableInTreeAutoscaling=True))
    assert error.startswith("spec.rayClusterSpec.enableInTreeAutoscaling:")
    (error,) = errors_of(lambda o: o["spec"].update(clusterSelector={"ray.io/cluster": "c"}))
    assert error.startswith("spec.clusterSelector:")
    (error,) = errors_of(lambda o: o["spec"].pop("rayClusterSpec"))
    assert error.startswith("spec.rayClusterSpec: required")
    selector_only = copy.deepcopy(obj)
    del selector_only["spec"]["rayClusterSpec"]
    selector_only["spec"]["clusterSelector"] = {"ray.io/cluster": "c"}
    assert validate_rayjob(selector_only) == []
    (error,) = errors_of(
        lambda o: o["spec"]["rayClusterSpec"].update(
            workerGroupSpecs=[group(f"g{i}") for i in range(8)]
        )
    )
    assert "9 pod sets" in error and "at most 8" in error
    (error,) = errors_of(
        lambda o: o["spec"]["rayClusterSpec"].update(
            workerGroupSpecs=[group(f"g{i}") for i in range(7)]
        )
    )
    assert "the submitter Job (K8sJobMode) make 9 pod sets" in error
    (error,) = errors_of(
        lambda o: o["spec"]["rayClusterSpec"].update(workerGroupSpecs=[group("head")])
    )
    assert error.startswith("spec.rayClusterSpec.workerGroupSpecs[0].groupName: 'head'")
    both = {
        "annotations": {
            "kueue.x-k8s.io/podset-required-topology": "rack",
            "kueue.x-k8s.io/podset-preferred-topology": "rack",
        }
    }
    (error,) = errors_of(
        lambda o: o["spec"]["rayClusterSpec"].update(
            workerGroupSpecs=[group("w", template=template(metadata=both))]
        )
    )
    assert error.startswith(
        "spec.rayClusterSpec.workerGroupSpecs[0].template.metadata.annotations: set at most one"
    )
    (error,) = errors_of(
        lambda o: o["spec"]["rayClusterSpec"]["headGroupSpec"].update(
            template=template(metadata=both)
        )
    )
    assert error.startswith("spec.rayClusterSpec.headGroupSpec.template.metadata.annotations:")
    running = copy.deepcopy(obj)
    running["spec"]["suspend"] = False
    moved = copy.deepcopy(running)
    moved["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "other"
    (error,) = validate_rayjob(moved, old=running)
    assert "cannot be changed or removed while the RayJob runs" in error


def test_the_hold_webhook_suspends_a_queued_rayjob_but_not_one_on_an_existing_cluster() -> None:
    registry = kopf.OperatorRegistry()
    register_webhooks(registry, validator=lambda obj: [], frameworks=(rj.FRAMEWORK,))
    (hold,) = [h for h in registry._webhooks.get_all_handlers() if h.id == "suspend-queued-rayjobs"]

    def patch_for(obj: dict[str, Any]) -> dict[str, Any]:
        patch: dict[str, Any] = {}
        asyncio.run(hold.fn(body=obj, patch=patch))  # type: ignore[call-arg]
        return patch

    assert patch_for(a_rayjob(suspend=False)) == {"spec": {"suspend": True}}
    on_existing = a_rayjob(suspend=False, clusterSelector={"ray.io/cluster": "shared"})
    assert patch_for(on_existing) == {}


# -- the controller against a scripted API --------------------------------------------------------


class Harness(KindHarness):
    def __init__(self) -> None:
        flavors = {"head": "cpu", "small": "h100", "big": "h100", "submitter": "cpu"}
        super().__init__(
            framework=rj.FRAMEWORK,
            plural="rayjobs",
            state_kind="RayJob",
            obj=a_rayjob(),
            assignments=[(name, 1, {"cpu": f}) for name, f in flavors.items()],
        )

    def ray_cluster(self, *, deleted: bool = False) -> None:
        cluster = {
            "metadata": {
                "name": "pi-x7k2q",
                "namespace": NS,
                "labels": {
                    "ray.io/originated-from-cr-name": "pi",
                    "ray.io/originated-from-crd": "RayJob",
                },
            }
        }
        self.state.apply("RayJobCluster", "DELETED" if deleted else "ADDED", cluster)

    def pod(self, name: str, *, deleted: bool = False) -> None:
        pod = {"metadata": {"name": name, "namespace": NS, "labels": {rj.ORIGIN_LABEL: "pi"}}}
        self.state.apply("Pod", "DELETED" if deleted else "ADDED", pod)


def test_a_queued_rayjob_is_admitted_preempted_released_once_its_cluster_and_pods_are_gone() -> (
    None
):
    async def main() -> None:
        h = Harness()
        await h.reconcile()
        wl = h.api.workload()
        assert wl["metadata"]["name"] == rj.workload_name("pi", "rj-uid-1")
        assert [p["name"] for p in wl["spec"]["podSets"]] == ["head", "small", "big", "submitter"]
        h.admit()
        await h.reconcile()
        started = h.obj()
        assert started["spec"]["suspend"] is False
        assert started["spec"]["submitterPodTemplate"]["spec"]["nodeSelector"] == {"pool": "cpu"}
        h.ray_cluster()
        h.pod("pi-x7k2q-head")
        h.its_controller_writes(jobDeploymentStatus="Running", rayClusterStatus={"state": "ready"})
        await h.reconcile()
        conds = {c["type"]: c["status"] for c in h.api.workload()["status"]["conditions"]}
        assert conds["PodsReady"] == "True"
        wl = h.evict()
        await h.reconcile()
        assert h.obj()["spec"]["suspend"] is True
        await h.reconcile()
        assert not rj.RAYJOB.injected(h.obj())
        assert not h.ctl.stopped(wl), "its RayCluster is still there"
        h.ray_cluster(deleted=True)
        assert not h.ctl.stopped(wl), "a pod of it is left"
        h.pod("pi-x7k2q-head", deleted=True)
        assert h.ctl.stopped(wl)
        h.its_controller_writes(jobDeploymentStatus="Failed", message="deadline exceeded")
        await h.reconcile()
        finished = {c["type"]: c for c in h.api.workload()["status"]["conditions"]}
        assert finished["Finished"]["reason"] == "Failed"

    asyncio.run(main())


def test_rayclusters_resource() -> None:
    assert (RAYCLUSTERS.group, RAYCLUSTERS.version, RAYCLUSTERS.plural) == (
        "ray.io",
        "v1",
        "rayclusters",
    )
    assert jobs.queue_name(a_rayjob()) == "lq"
