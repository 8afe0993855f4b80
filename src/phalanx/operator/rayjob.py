"""RayJob integration (Kueue's ``ray.io/rayjob``), as pure functions over API dicts.

A RayJob (KubeRay, ``ray.io/v1``) labelled ``kueue.x-k8s.io/queue-name`` is suspended at
creation (``spec.suspend``, mutating webhook) and represented by one Workload with Kueue's pod
sets: ``head`` (one pod, the head group's template), then one per worker group named after its
``groupName`` (``count`` = replicas x ``numOfHosts``), then, in ``K8sJobMode`` (KubeRay's
default), ``submitter``: the one pod of the Job that submits the Ray job (the RayJob's
``submitterPodTemplate``, or KubeRay's default submitter). In ``SidecarMode`` the submitter is
a container KubeRay adds to the head pod: the head pod set counts it.

Admission injects each pod set's flavors into its template and sets ``spec.suspend: false``;
KubeRay then creates the RayCluster (and the submitter Job) from those templates. Eviction sets
``spec.suspend: true``: KubeRay deletes the RayCluster and the submitter Job, whose pods the
garbage collector deletes; the templates the Workload recorded are put back. The RayJob ends
when KubeRay sets ``status.jobDeploymentStatus`` to ``Complete`` or ``Failed``; it succeeded if
``status.jobStatus`` is ``SUCCEEDED`` (as Kueue reads it).

Where Phalanx differs from Kueue: Kueue finds a RayJob's pods by ``ray.io/cluster`` (the
RayCluster's generated name, cleared from the RayJob's status once suspended). Here admission
also labels every template with ``ray.io/originated-from-cr-name: <the RayJob's name>`` (the
label KubeRay itself puts on the RayCluster and the submitter Job), so that every pod of the
RayJob, including the submitter's, names it until the last one is gone. :data:`RAYJOB` is the
adapter; ``phalanx.operator.kindsync`` applies it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from phalanx.operator import integration, jobs, templates
from phalanx.operator.integration import SUSPEND_PATCH, Finish, FlavorInjection

__all__ = [
    "API_VERSION",
    "FRAMEWORK",
    "GROUP",
    "HEAD_POD_SET",
    "KIND",
    "MAX_POD_SETS",
    "ORIGIN_LABEL",
    "RAYJOB",
    "SUBMITTER_POD_SET",
    "InvalidRayJob",
    "RayJobIntegration",
    "cluster_pod_sets",
    "default_submitter_template",
    "needs_workload",
    "pod_sets",
    "pods_ready",
    "ray_pod_set",
    "raycluster_stopped",
    "rayjob_finish",
    "resolve_priority",
    "submission_mode",
    "worker_count",
    "workload_name",
]

FRAMEWORK = "ray.io/rayjob"
GROUP = "ray.io"
API_VERSION = f"{GROUP}/v1"
KIND = "RayJob"
HEAD_POD_SET = "head"
SUBMITTER_POD_SET = "submitter"
ORIGIN_LABEL = "ray.io/originated-from-cr-name"
"""KubeRay puts it on the RayCluster and the submitter Job it makes for a RayJob; admission
puts it on the pod templates too (see the module's docstring)."""
ORIGIN_KIND_LABEL = "ray.io/originated-from-crd"
MAX_POD_SETS = 8
"""A Workload holds at most 8 pod sets; Kueue counts the head and the worker groups."""
K8S_JOB_MODE = "K8sJobMode"
SIDECAR_MODE = "SidecarMode"
SUBMITTER_CONTAINER = "ray-job-submitter"
_SUBMITTER_RESOURCES: dict[str, Any] = {
    "limits": {"cpu": "1", "memory": "1Gi"},
    "requests": {"cpu": "500m", "memory": "200Mi"},
}
"""KubeRay's default submitter container resources (its ``GetDefaultSubmitterTemplate``)."""
_COMPLETE = "Complete"
_FAILED = "Failed"
_SUCCEEDED = "SUCCEEDED"
_CLUSTER_READY = "ready"


class InvalidRayJob(ValueError):
    """The RayJob cannot be represented by a Workload; the message names the field and the fix."""


def workload_name(name: str, uid: str) -> str:
    """Kueue's name for a RayJob's Workload: ``rayjob-<name>-<hash>``."""
    return integration.kueue_workload_name(
        prefix="rayjob", kind=KIND, group=GROUP, name=name, uid=uid
    )


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def _cluster_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _spec(obj).get("rayClusterSpec") or {}


def _head_template(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (_cluster_spec(obj).get("headGroupSpec") or {}).get("template") or {}


def _worker_groups(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(_cluster_spec(obj).get("workerGroupSpecs") or ())


def submission_mode(obj: Mapping[str, Any]) -> str:
    """``spec.submissionMode``; KubeRay's CRD defaults it to ``K8sJobMode``."""
    return str(_spec(obj).get("submissionMode") or K8S_JOB_MODE)


def worker_count(group: Mapping[str, Any]) -> int:
    """A worker group's pods: replicas (default 1) times ``numOfHosts`` when above 1."""
    replicas = group.get("replicas")
    count = 1 if replicas is None else int(replicas)
    hosts = int(group.get("numOfHosts") or 1)
    return count * hosts if hosts > 1 else count


def default_submitter_template(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The submitter Job's pod template KubeRay uses when the RayJob names none: one
    container with the head's image and KubeRay's default resources."""
    containers = (_head_template(obj).get("spec") or {}).get("containers") or ()
    if not containers:
        raise InvalidRayJob(
            "spec.rayClusterSpec.headGroupSpec.template.spec.containers: empty; the head"
            " group needs its Ray container (the submitter uses its image)"
        )
    return {
        "spec": {
            "containers": [
                {
                    "name": SUBMITTER_CONTAINER,
                    "image": containers[0].get("image"),
                    "resources": copy.deepcopy(_SUBMITTER_RESOURCES),
                }
            ],
            "restartPolicy": "Never",
        }
    }


def _submitter_template(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    template = _spec(obj).get("submitterPodTemplate")
    return template if template is not None else default_submitter_template(obj)


def _topology(template: Mapping[str, Any], count: int) -> dict[str, Any] | None:
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    request = jobs.topology_request(annotations, count)
    if request:
        # Ray's pods carry no completion index: Kueue builds their requests without one.
        request.pop("podIndexLabel", None)
    return request


def ray_pod_set(name: str, count: int, template: Mapping[str, Any]) -> dict[str, Any]:
    """A pod set of a Ray pod template, with its topology request (no pod index label)."""
    pod_set: dict[str, Any] = {"name": name, "count": count, "template": copy.deepcopy(template)}
    topology = _topology(template, count)
    if topology:
        pod_set["topologyRequest"] = topology
    return pod_set


def cluster_pod_sets(
    cluster: Mapping[str, Any],
    *,
    where: str,
    sidecar_submitter: bool = False,
    reserved: Sequence[str] = (HEAD_POD_SET,),
    error: type[ValueError] = InvalidRayJob,
) -> list[dict[str, Any]]:
    """A Ray cluster spec's pod sets, as Kueue's ``BuildPodSets``: ``head`` (1 pod), then each
    worker group by its ``groupName``. ``where`` is the spec's field path for errors;
    ``sidecar_submitter`` adds KubeRay's submitter container to the head (SidecarMode)."""
    groups = list(cluster.get("workerGroupSpecs") or ())
    if len(groups) + 1 > MAX_POD_SETS:
        raise error(
            f"{where}.workerGroupSpecs: {len(groups)} worker groups and the head"
            f" make {len(groups) + 1} pod sets, but a Workload holds at most {MAX_POD_SETS};"
            " merge worker groups"
        )
    head = copy.deepcopy(dict((cluster.get("headGroupSpec") or {}).get("template") or {}))
    if sidecar_submitter:
        # KubeRay adds the submitter to the head pod with its default resources.
        spec = head.setdefault("spec", {})
        spec["containers"] = [
            *(spec.get("containers") or []),
            {"name": SUBMITTER_CONTAINER, "resources": copy.deepcopy(_SUBMITTER_RESOURCES)},
        ]
    result = [ray_pod_set(HEAD_POD_SET, 1, head)]
    for index, group in enumerate(groups):
        name = str(group.get("groupName") or "")
        if not name:
            raise error(f"{where}.workerGroupSpecs[{index}].groupName: empty; name it")
        if name in reserved:
            raise error(
                f"{where}.workerGroupSpecs[{index}].groupName: {name!r} is the"
                " name of another pod set of the Workload; rename the worker group"
            )
        result.append(ray_pod_set(name, worker_count(group), group.get("template") or {}))
    return result


def pod_sets(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``head``, then each worker group by its name, then ``submitter`` in K8sJobMode, as
    Kueue builds them. Raises :class:`InvalidRayJob` when the RayJob cannot be a Workload."""
    if not _spec(obj).get("rayClusterSpec"):
        raise InvalidRayJob(
            "spec.rayClusterSpec: required for a queued RayJob (Kueue cannot queue one that"
            " runs on an existing cluster); describe the cluster, or remove the queue label"
        )
    result = cluster_pod_sets(
        _cluster_spec(obj),
        where="spec.rayClusterSpec",
        sidecar_submitter=submission_mode(obj) == SIDECAR_MODE,
        reserved=(HEAD_POD_SET, SUBMITTER_POD_SET),
        error=InvalidRayJob,
    )
    if submission_mode(obj) == K8S_JOB_MODE:
        if len(result) + 1 > MAX_POD_SETS:
            # Kueue counts the head and the groups only, and its Workload would be refused.
            raise InvalidRayJob(
                f"spec.rayClusterSpec.workerGroupSpecs: {len(result) - 1} worker groups, the"
                f" head and the submitter Job (K8sJobMode) make {len(result) + 1} pod sets,"
                f" but a Workload holds at most {MAX_POD_SETS}; merge worker groups, or submit"
                " another way (spec.submissionMode)"
            )
        result.append(ray_pod_set(SUBMITTER_POD_SET, 1, _submitter_template(obj)))
    return result


def resolve_priority(
    obj: Mapping[str, Any],
    *,
    workload_priority_classes: Mapping[str, int],
    priority_classes: Mapping[str, int],
) -> jobs.PriorityResolution:
    """The WorkloadPriorityClass label first, else the PriorityClass of the first pod set's
    template that names one (head, workers, submitter: Kueue reads the pod sets in order)."""
    ordered = [_head_template(obj), *(g.get("template") or {} for g in _worker_groups(obj))]
    if submission_mode(obj) == K8S_JOB_MODE and _spec(obj).get("submitterPodTemplate"):
        ordered.append(_spec(obj)["submitterPodTemplate"])
    return jobs.resolve_priority_of_templates(
        obj,
        ordered,
        workload_priority_classes=workload_priority_classes,
        priority_classes=priority_classes,
    )


def rayjob_finish(obj: Mapping[str, Any]) -> Finish | None:
    """The RayJob's end as Kueue reads it: ``jobDeploymentStatus`` ``Complete`` or ``Failed``,
    succeeded when ``jobStatus`` is ``SUCCEEDED``, with KubeRay's message."""
    status = obj.get("status") or {}
    deployment = status.get("jobDeploymentStatus")
    if deployment not in (_COMPLETE, _FAILED):
        return None
    message = str(status.get("message") or "")
    if status.get("jobStatus") == _SUCCEEDED:
        return Finish(True, "Succeeded", message or "RayJob completed")
    return Finish(False, "Failed", message or f"RayJob ended {deployment}")


def needs_workload(obj: Mapping[str, Any]) -> bool:
    """A queued RayJob without a Workload gets one unless it is being deleted or has ended."""
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return rayjob_finish(obj) is None


def pods_ready(obj: Mapping[str, Any]) -> bool:
    """Kueue's PodsReady for a RayJob: the RayCluster it reports is ``ready``."""
    cluster = (obj.get("status") or {}).get("rayClusterStatus") or {}
    return cluster.get("state") == _CLUSTER_READY


def raycluster_stopped(cluster: Mapping[str, Any]) -> bool:
    """A RayJob's RayCluster runs until it is gone: KubeRay deletes it in the background, the
    garbage collector then deletes its pods (which are counted by their own label). A
    RayCluster a RayService of the same name made is not the RayJob's."""
    labels = (cluster.get("metadata") or {}).get("labels") or {}
    return str(labels.get(ORIGIN_KIND_LABEL, KIND)) != KIND


# -- patches ------------------------------------------------------------------------------------

_HEAD_PATH = "/spec/rayClusterSpec/headGroupSpec/template"
_SUBMITTER_PATH = "/spec/submitterPodTemplate"


def _worker_path(index: int) -> str:
    return f"/spec/rayClusterSpec/workerGroupSpecs/{index}/template"


def _guard(index: int, name: str) -> dict[str, Any]:
    # Worker groups are addressed by index: the test refuses the patch if the list differs.
    return {
        "op": "test",
        "path": f"/spec/rayClusterSpec/workerGroupSpecs/{index}/groupName",
        "value": name,
    }


def _templates(obj: Mapping[str, Any]) -> Iterator[tuple[str, str, Mapping[str, Any], int | None]]:
    """Each pod set's name, template path, live template and worker index (None: no guard)."""
    yield HEAD_POD_SET, _HEAD_PATH, _head_template(obj), None
    for index, group in enumerate(_worker_groups(obj)):
        yield str(group.get("groupName")), _worker_path(index), group.get("template") or {}, index
    if submission_mode(obj) == K8S_JOB_MODE:
        yield SUBMITTER_POD_SET, _SUBMITTER_PATH, _spec(obj).get("submitterPodTemplate") or {}, None


class RayJobIntegration:
    """RayJob on the integration framework: ``spec.suspend`` holds it; its pod sets are the
    head, each worker group and the submitter."""

    framework = FRAMEWORK
    api_version = API_VERSION
    kind = KIND
    plural = "rayjobs"
    pod_owner_label = ORIGIN_LABEL

    def needs_workload(self, obj: Mapping[str, Any]) -> bool:
        return needs_workload(obj)

    def pods_ready(self, obj: Mapping[str, Any]) -> bool:
        return pods_ready(obj)

    def resolve_priority(
        self,
        obj: Mapping[str, Any],
        *,
        workload_priority_classes: Mapping[str, int],
        priority_classes: Mapping[str, int],
    ) -> jobs.PriorityResolution:
        return resolve_priority(
            obj,
            workload_priority_classes=workload_priority_classes,
            priority_classes=priority_classes,
        )

    def queue_name(self, obj: Mapping[str, Any]) -> str | None:
        """The queue label's value; None for a RayJob on an existing cluster
        (``spec.clusterSelector``), which Kueue does not manage."""
        if _spec(obj).get("clusterSelector"):
            return None
        return jobs.queue_name(obj)

    def workload_name(self, obj: Mapping[str, Any]) -> str:
        metadata = obj["metadata"]
        return workload_name(metadata["name"], metadata["uid"])

    def pod_sets(self, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        return pod_sets(obj)

    def suspended(self, obj: Mapping[str, Any]) -> bool:
        return bool(_spec(obj).get("suspend"))

    def suspend_patch(self, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [dict(op) for op in SUSPEND_PATCH]

    def start_patch(
        self,
        obj: Mapping[str, Any],
        *,
        workload_name: str,
        injections: Mapping[str, FlavorInjection],
    ) -> list[dict[str, Any]]:
        """Every pod set's template gets its admission (the submitter's default template is
        written out first when the RayJob names none, as Kueue does), then the RayJob is
        unsuspended; nothing (an empty patch) unless every pod set was admitted."""
        found = list(_templates(obj))
        if any(name not in injections for name, _, _, _ in found):
            return []
        owner = str(obj["metadata"]["name"])
        ops: list[dict[str, Any]] = []
        for name, path, template, index in found:
            if index is not None:
                ops.append(_guard(index, name))
            if name == SUBMITTER_POD_SET and _spec(obj).get("submitterPodTemplate") is None:
                template = default_submitter_template(obj)
                ops.append({"op": "add", "path": path, "value": template})
            ops.extend(
                templates.inject(
                    template,
                    path,
                    workload_name=workload_name,
                    injection=injections[name],
                    labels={ORIGIN_LABEL: owner},
                )
            )
        ops.append({"op": "add", "path": "/spec/suspend", "value": False})
        return ops

    def restore_patch(
        self, obj: Mapping[str, Any], *, pod_sets: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        """Suspend, and put back each template as its pod set recorded it (a template the
        Workload has no pod set for is left as it is; the submitter template admission wrote
        out stays, as Kueue leaves it)."""
        recorded = {str(p.get("name")): p.get("template") or {} for p in pod_sets}
        ops: list[dict[str, Any]] = [{"op": "add", "path": "/spec/suspend", "value": True}]
        for name, path, template, index in _templates(obj):
            if name not in recorded or (name == SUBMITTER_POD_SET and not template):
                continue
            if index is not None:
                ops.append(_guard(index, name))
            # Only metadata, node selector, tolerations and gates are restored: the sidecar
            # submitter the head pod set counts in SidecarMode is never written back.
            ops.extend(templates.restore(recorded[name], template, path))
        return ops

    def injected(self, obj: Mapping[str, Any]) -> bool:
        return any(
            jobs.WORKLOAD_ANNOTATION in ((t.get("metadata") or {}).get("annotations") or {})
            for _, _, t, _ in _templates(obj)
        )

    def finished(self, obj: Mapping[str, Any]) -> Finish | None:
        return rayjob_finish(obj)


RAYJOB = RayJobIntegration()
"""The RayJob integration (its adapter holds no state)."""
