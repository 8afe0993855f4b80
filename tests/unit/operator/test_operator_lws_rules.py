"""The LeaderWorkerSet integration (Kueue's ``leaderworkerset.x-k8s.io/leaderworkerset``): a
Workload per group with Kueue's naming and the pod sets ``leader``/``worker`` (or ``main``),
the webhook's template marks, each pod's group labels, the webhook's checks; and how the
pod-group rules take an LWS pod (grouped only once labelled, never finished as a serving
group, its Workload never made from the pods)."""

from __future__ import annotations

import asyncio
import copy
import hashlib
from typing import Any

from test_operator_jobsync_flow import ScriptedApi

from phalanx.operator import integration, lws, pods
from phalanx.operator.configfile import FRAMEWORKS
from phalanx.operator.kube import ApiError, Resource
from phalanx.operator.lwssync import LeaderWorkerSetController
from phalanx.operator.metrics import Metrics
from phalanx.operator.podsync import PodGroupController
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusWriter

NS = "serving"
UID = "lws-uid-1"


def template(cpu: str = "1", **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "labels": {"app": "vllm", "leaderworkerset.sigs.k8s.io/template-revision-hash": "x"},
            "annotations": dict(annotations),
        },
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
    }


def an_lws(
    *, replicas: int | None = 2, size: int | None = 4, leader: bool = True, **labels: str
) -> dict[str, Any]:
    lwt: dict[str, Any] = {"workerTemplate": template("2")}
    if size is not None:
        lwt["size"] = size
    if leader:
        lwt["leaderTemplate"] = template("1")
    spec: dict[str, Any] = {"leaderWorkerTemplate": lwt}
    if replicas is not None:
        spec["replicas"] = replicas
    return {
        "apiVersion": lws.API_VERSION,
        "kind": lws.KIND,
        "metadata": {
            "name": "llm",
            "namespace": NS,
            "uid": UID,
            "labels": {integration.QUEUE_LABEL: "lq", **labels},
        },
        "spec": spec,
    }


def a_pod(*, index: str | None = "1", worker: bool = False, gated: bool = True) -> dict[str, Any]:
    """A pod as LWS's StatefulSets make it from a marked template."""
    labels = {lws.NAME_LABEL: "llm", integration.QUEUE_LABEL: "lq"}
    if index is not None:
        labels[lws.GROUP_INDEX_LABEL] = index
    annotations = {
        lws.SUSPENDED_BY_PARENT_ANNOTATION: lws.FRAMEWORK,
        lws.GROUP_SERVING_ANNOTATION: "true",
    }
    if worker:
        annotations[lws.LEADER_NAME_ANNOTATION] = "llm-1"
    return {
        "metadata": {
            "name": "llm-1-1" if worker else "llm-1",
            "namespace": NS,
            "uid": "pod-uid",
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [{"kind": "StatefulSet", "name": "llm", "controller": True}],
        },
        "spec": {"schedulingGates": [{"name": pods.ADMISSION_GATE}] if gated else []},
    }


def test_workload_name_is_kueues_per_group_index() -> None:
    # Catches: a name without the group index (every group would share one Workload) or a
    # hash over other fields than Kueue's (a cluster taken over from Kueue gets duplicates).
    digest = hashlib.sha1(b"LeaderWorkerSet\nleaderworkerset.x-k8s.io\nllm-1\n" + UID.encode())
    assert lws.workload_name("llm", UID, 1) == f"leaderworkerset-llm-1-{digest.hexdigest()[:5]}"
    assert lws.workload_name("llm", UID, 0) != lws.workload_name("llm", UID, 1)


def test_one_workload_per_group_and_replicas_default_to_one() -> None:
    # Catches: an off-by-one in the group range, or no default for an unset spec.replicas.
    assert sorted(lws.desired_workloads(an_lws(replicas=3)).values()) == [0, 1, 2]
    assert list(lws.desired_workloads(an_lws(replicas=None)).values()) == [0]
    assert lws.desired_workloads(an_lws(replicas=0)) == {}


def test_pod_sets_are_leader_and_workers_with_kueues_names() -> None:
    # Catches: the leader counted among the workers (size, not size - 1), other names.
    sets = lws.pod_sets(an_lws(size=4))
    assert [(p["name"], p["count"]) for p in sets] == [("leader", 1), ("worker", 3)]
    assert sets[0]["template"]["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1"}
    assert sets[1]["template"]["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "2"}


def test_without_a_leader_template_the_one_pod_set_is_main_of_size() -> None:
    # Catches: a "worker" pod set of size - 1 where every pod is a worker.
    sets = lws.pod_sets(an_lws(size=3, leader=False))
    assert [(p["name"], p["count"]) for p in sets] == [("main", 3)]
    assert [(p["name"], p["count"]) for p in lws.pod_sets(an_lws(size=None, leader=False))] == [
        ("main", 1)
    ]


def test_pod_set_templates_drop_the_lws_controllers_keys_but_the_set_name() -> None:
    # Catches: a revision hash copied into the Workload (it differs per rollout).
    obj = an_lws()
    obj["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"][lws.NAME_LABEL] = (
        "llm"
    )
    labels = lws.pod_sets(obj)[1]["template"]["metadata"]["labels"]
    assert labels == {"app": "vllm", lws.NAME_LABEL: "llm"}


def test_topology_request_per_pod_set_workers_indexed_by_worker_index() -> None:
    # Catches: the Job's completion-index label on LWS pods (no such label: the topology
    # ungater could not order them), or no request read from the templates.
    obj = an_lws()
    rack = {"kueue.x-k8s.io/podset-required-topology": "example.com/rack"}
    obj["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["annotations"] = rack
    obj["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["annotations"] = rack
    leader, worker = lws.pod_sets(obj)
    assert worker["topologyRequest"] == {
        "required": "example.com/rack",
        "podIndexLabel": lws.WORKER_INDEX_LABEL,
    }
    assert leader["topologyRequest"] == {"required": "example.com/rack"}
    assert "topologyRequest" not in lws.pod_sets(an_lws())[1]


def test_workload_is_a_group_workload_owned_by_the_set() -> None:
    # Catches: a Workload the pod-group controller would not route (no group annotation), or
    # one the garbage collector would not delete with the set (no owner reference).
    wl = lws.workload_manifest(an_lws(), index=1, priority=7, priority_ref=None)
    meta = wl["metadata"]
    assert meta["name"] == lws.workload_name("llm", UID, 1)
    assert meta["annotations"][pods.IS_GROUP_WORKLOAD_ANNOTATION] == "true"
    assert meta["annotations"][lws.COMPONENT_INDEX_ANNOTATION] == "1"
    assert meta["labels"] == {integration.JOB_UID_LABEL: UID}
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "LeaderWorkerSet",
        "llm",
        UID,
        True,
    )
    assert wl["spec"]["queueName"] == "lq" and wl["spec"]["priority"] == 7
    assert [p["name"] for p in wl["spec"]["podSets"]] == ["leader", "worker"]


def test_webhook_marks_each_template_with_queue_parent_and_serving() -> None:
    # Catches: an unmarked template (its pods would start ungated), or a leaderTemplate
    # invented for a set without one (the LWS would change shape).
    patch = lws.template_defaults(an_lws(**{"kueue.x-k8s.io/priority-class": "high"}))
    lwt = patch["spec"]["leaderWorkerTemplate"]
    for name in ("leaderTemplate", "workerTemplate"):
        meta = lwt[name]["metadata"]
        assert meta["labels"] == {
            integration.QUEUE_LABEL: "lq",
            "kueue.x-k8s.io/priority-class": "high",
        }
        assert meta["annotations"] == {
            lws.SUSPENDED_BY_PARENT_ANNOTATION: lws.FRAMEWORK,
            lws.GROUP_SERVING_ANNOTATION: "true",
        }
    assert (
        "leaderTemplate"
        not in lws.template_defaults(an_lws(leader=False))["spec"]["leaderWorkerTemplate"]
    )


def test_pod_joins_its_groups_pod_group_with_its_role() -> None:
    # Catches: a leader taken for a worker (or the reverse: its pod set would not match),
    # the wrong group's Workload, a missing total count.
    obj = an_lws()
    leader = lws.pod_group_labels(obj, a_pod(index="1"))
    worker = lws.pod_group_labels(obj, a_pod(index="1", worker=True))
    assert leader is not None and worker is not None
    name = lws.workload_name("llm", UID, 1)
    assert leader.labels[pods.GROUP_NAME_LABEL] == name
    assert leader.labels[lws.PREBUILT_WORKLOAD_LABEL] == name
    assert leader.labels[pods.MANAGED_LABEL] == "true"
    assert leader.annotations[pods.GROUP_TOTAL_COUNT_ANNOTATION] == "4"
    assert leader.annotations[pods.ROLE_HASH_ANNOTATION] == "leader"
    assert worker.annotations[pods.ROLE_HASH_ANNOTATION] == "worker"
    no_leader = lws.pod_group_labels(an_lws(leader=False), a_pod(worker=True))
    assert no_leader is not None and no_leader.annotations[pods.ROLE_HASH_ANNOTATION] == "main"


def test_pod_waits_for_its_group_index_and_is_labelled_once() -> None:
    # Catches: a pod put in a group before the LWS webhook says which (group "None"), or
    # patched again on every pass.
    obj = an_lws()
    assert lws.pod_group_labels(obj, a_pod(index=None)) is None
    change = lws.pod_group_labels(obj, a_pod())
    assert change is not None
    labelled = a_pod()
    labelled["metadata"]["labels"] = change.labels
    assert lws.pod_group_labels(obj, labelled) is None


def test_pod_group_rules_take_an_lws_pod_only_once_labelled() -> None:
    # Catches: an LWS pod taken for a single Pod (a Workload per pod) before its group is
    # known, or ignored as a controller's pod once it is.
    pod = a_pod()
    assert pods.group_of(pod) is None
    change = lws.pod_group_labels(an_lws(), pod)
    assert change is not None
    pod["metadata"]["labels"] = change.labels
    pod["metadata"]["annotations"] = change.annotations
    group = pods.group_of(pod)
    assert group is not None
    assert (group.name, group.is_group, group.parent) == (
        lws.workload_name("llm", UID, 1),
        True,
        lws.FRAMEWORK,
    )
    assert pods.pod_set_of(pod, group) == "leader"
    assert pods.prebuilt([pod])
    # A Job's pod (a controller's, no suspending parent) stays the Job's.
    job_pod = {
        "metadata": {
            "name": "j",
            "namespace": NS,
            "labels": {integration.QUEUE_LABEL: "lq"},
            "ownerReferences": [{"kind": "Job", "controller": True}],
        }
    }
    assert pods.group_of(job_pod) is None and not pods.prebuilt([job_pod])


def test_serving_pods_are_marked_by_the_template_annotation() -> None:
    # Catches: a serving group finished (and its quota released) when one pod goes away.
    pod = a_pod()
    assert pods.serving([pod])
    del pod["metadata"]["annotations"][lws.GROUP_SERVING_ANNOTATION]
    assert not pods.serving([pod])


def test_validation_queue_name_immutable_once_ready_or_removed() -> None:
    # Catches: a queue change under running groups (their quota would be in the old queue).
    old = an_lws()
    moved = an_lws()
    moved["metadata"]["labels"][integration.QUEUE_LABEL] = "other"
    assert lws.validate_lws(moved, old=old) == []
    old["status"] = {"readyReplicas": 1}
    (error,) = lws.validate_lws(moved, old=old)
    assert error.startswith(f"metadata.labels[{integration.QUEUE_LABEL}]")
    removed = an_lws()
    del removed["metadata"]["labels"][integration.QUEUE_LABEL]
    assert lws.validate_lws(removed, old=an_lws())
    assert lws.validate_lws(an_lws(replicas=-1), old=None) == ["spec.replicas: -1 must be >= 0"]


def test_framework_is_configurable_by_kueues_name() -> None:
    # Catches: a config naming the framework refused.
    assert lws.FRAMEWORK in FRAMEWORKS
    assert lws.FRAMEWORK in integration.KUEUE_FRAMEWORKS


# -- the controllers against a scripted API -------------------------------------------------------


class DeletingApi(ScriptedApi):
    async def delete(self, resource: Resource, name: str, *, namespace: str | None = None) -> None:
        if self.objects.pop((resource.plural, f"{namespace}/{name}"), None) is None:
            raise ApiError(404, {"reason": "NotFound"}, method="DELETE", path=name)


class Harness:
    def __init__(self, obj: dict[str, Any] | None = None) -> None:
        self.api = DeletingApi()
        self.state = ClusterState()
        writer = StatusWriter(self.api, self.state, Metrics())  # type: ignore[arg-type]
        self.sets = LeaderWorkerSetController(
            self.api,  # type: ignore[arg-type]
            self.state,
            writer,
            Metrics(),
        )
        # ``pod`` disabled: the LWS integration alone runs its pods' groups.
        self.groups = PodGroupController(
            self.api,  # type: ignore[arg-type]
            self.state,
            writer,
            Metrics(),
            enabled=False,
            parents=[lws.FRAMEWORK],
        )
        self.state.apply(
            "ResourceFlavor",
            None,
            {"metadata": {"name": "h100"}, "spec": {"nodeLabels": {"g": "1"}}},
        )
        self.put("leaderworkersets", lws.KIND, obj or an_lws())

    def put(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        self.api.objects[(plural, key)] = obj
        self.state.apply(kind, "ADDED", self.api._bump(obj))

    def workloads(self) -> dict[str, dict[str, Any]]:
        return {k: o for (kind, k), o in self.api.objects.items() if kind == "workloads"}

    def sync_workloads(self) -> None:
        for wl in self.workloads().values():
            self.state.apply("Workload", "MODIFIED", copy.deepcopy(wl))
        for key in list(self.state.objects["Workload"]):
            if key not in self.workloads():
                self.state.apply("Workload", "DELETED", self.state.objects["Workload"][key])


def test_controller_makes_a_workload_per_group_and_deletes_scaled_down_ones() -> None:
    # Catches: a Workload for the whole set (not per group), or groups scaled away keeping
    # their Workloads (and their quota).
    async def main() -> None:
        h = Harness()
        await h.sets.reconcile(f"{NS}/llm")
        names = {lws.workload_name("llm", UID, i) for i in (0, 1)}
        assert {k.partition("/")[2] for k in h.workloads()} == names
        h.sync_workloads()
        scaled = an_lws(replicas=1)
        h.put("leaderworkersets", lws.KIND, scaled)
        await h.sets.reconcile(f"{NS}/llm")
        assert {k.partition("/")[2] for k in h.workloads()} == {lws.workload_name("llm", UID, 0)}

    asyncio.run(main())


def test_a_groups_pods_are_labelled_then_ungated_only_on_its_admission() -> None:
    # Catches: an LWS pod ungated before its group's Workload is admitted, or never (the
    # pod-group controller not running its groups with ``pod`` disabled).
    async def main() -> None:
        h = Harness()
        await h.sets.reconcile(f"{NS}/llm")
        h.sync_workloads()
        pod = a_pod(index="1")
        h.put("pods", "Pod", pod)
        await h.sets.reconcile(f"{NS}/llm")
        labelled = h.api.objects[("pods", f"{NS}/llm-1")]
        name = lws.workload_name("llm", UID, 1)
        assert labelled["metadata"]["labels"][pods.GROUP_NAME_LABEL] == name
        h.state.apply("Pod", "MODIFIED", copy.deepcopy(labelled))
        group_key = f"{NS}/{name}"
        await h.groups.reconcile(group_key)
        assert pods.gated(h.api.objects[("pods", f"{NS}/llm-1")]), "ungated before admission"
        assert len(h.workloads()) == 2, "the pod-group controller made a Workload of its own"
        wl = h.api.objects[("workloads", group_key)]
        wl["status"] = {
            "conditions": [
                {"type": "QuotaReserved", "status": "True"},
                {"type": "Admitted", "status": "True"},
            ],
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {"name": "leader", "count": 1, "flavors": {"cpu": "h100"}},
                    {"name": "worker", "count": 3, "flavors": {"cpu": "h100"}},
                ],
            },
        }
        h.state.apply("Workload", "MODIFIED", h.api._bump(wl))
        await h.groups.reconcile(group_key)
        started = h.api.objects[("pods", f"{NS}/llm-1")]
        assert not pods.gated(started)
        assert started["spec"]["nodeSelector"] == {"g": "1"}
        assert started["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "leader"
        # Serving: a group whose pods are not all there is never finished.
        conditions = h.api.objects[("workloads", group_key)]["status"]["conditions"]
        assert not any(c["type"] == "Finished" for c in conditions)

    asyncio.run(main())


def test_a_missing_priority_class_is_told_and_its_creation_retries_the_set() -> None:
    # Catches: a set whose WorkloadPriorityClass is created after it never getting its
    # Workloads (nothing else queues it once its pods have settled).
    async def main() -> None:
        h = Harness(an_lws(**{"kueue.x-k8s.io/priority-class": "low"}))

        def events() -> list[str]:
            return [o["reason"] for (kind, _), o in h.api.objects.items() if kind == "events"]

        async def until(done: Any) -> None:
            for _ in range(200):
                if done():
                    return
                await asyncio.sleep(0.01)

        h.sets.work.start()
        await until(lambda: events() == ["WorkloadPriorityClassNotFound"])
        assert events() == ["WorkloadPriorityClassNotFound"] and h.workloads() == {}
        h.state.apply("WorkloadPriorityClass", "ADDED", {"metadata": {"name": "low"}, "value": 10})
        await until(lambda: len(h.workloads()) == 2)
        await h.sets.stop()
        assert len(h.workloads()) == 2
        assert {w["spec"]["priority"] for w in h.workloads().values()} == {10}

    asyncio.run(main())
