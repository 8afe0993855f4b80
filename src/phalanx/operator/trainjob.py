"""Kubeflow Trainer v2 TrainJob integration (Kueue's ``trainer.kubeflow.org/trainjob``), as pure
functions over API dicts.

A TrainJob (``trainer.kubeflow.org/v1alpha1``) names a training runtime; the Trainer's controller
builds a JobSet of the same name from the runtime, the TrainJob's ``trainer`` settings and its
``spec.runtimePatches``, and keeps rebuilding it while the TrainJob is suspended. Labelled
``kueue.x-k8s.io/queue-name``, a TrainJob is suspended at creation and gets an empty runtime
patch of manager ``kueue.x-k8s.io/manager`` (mutating webhook, as Kueue's).

Kueue computes the pod sets by running the Trainer's runtime framework in its own process. Phalanx
reads them from that JobSet instead, once the Trainer has made it from the held TrainJob: one pod
set per replicated job, exactly as for a JobSet (``phalanx.operator.jobset``). A JobSet whose
templates still carry an admission (a Workload annotation) is not read: the Trainer rebuilds it
from the held TrainJob first.

Admission writes each pod set's node selector, tolerations, scheduling gates, labels and
annotations into the Kueue runtime patch (one replicated job patch per pod set) and sets
``spec.suspend: false``; the Trainer rebuilds the JobSet from the patched runtime and resumes it.
Eviction sets ``spec.suspend: true`` (the Trainer suspends the JobSet, whose Jobs' pods are
deleted) and empties the patch's replicated jobs. The TrainJob's ``Complete`` or ``Failed``
condition finishes the Workload. :data:`TRAINJOB` is the adapter; ``phalanx.operator.kindsync``
applies it with the JobSet as its source (``phalanx.operator.kinds``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from phalanx.operator import integration, jobs, jobset
from phalanx.operator.integration import Finish, FlavorInjection, finish_from_conditions

__all__ = [
    "API_VERSION",
    "FRAMEWORK",
    "GROUP",
    "KIND",
    "RUNTIME_PATCH_MANAGER",
    "TRAINJOB",
    "InvalidTrainJob",
    "TrainJobIntegration",
    "active",
    "hold_patch",
    "jobset_is_current",
    "kueue_patch_index",
    "owns_jobset",
    "pod_sets_from_jobset",
    "pods_ready",
    "resolve_priority_from",
    "trainjob_finish",
    "workload_name",
]

FRAMEWORK = "trainer.kubeflow.org/trainjob"
GROUP = "trainer.kubeflow.org"
API_VERSION = f"{GROUP}/v1alpha1"
KIND = "TrainJob"
RUNTIME_PATCH_MANAGER = "kueue.x-k8s.io/manager"
"""The runtime patch Kueue (and Phalanx) owns in ``spec.runtimePatches``."""


class InvalidTrainJob(ValueError):
    """The TrainJob cannot be represented by a Workload; the message names the field and the fix."""


def workload_name(name: str, uid: str) -> str:
    """Kueue's name for a TrainJob's Workload: ``trainjob-<name>-<hash>``."""
    return integration.kueue_workload_name(
        prefix="trainjob", kind=KIND, group=GROUP, name=name, uid=uid
    )


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def _empty_patch() -> dict[str, Any]:
    return {
        "manager": RUNTIME_PATCH_MANAGER,
        "trainingRuntimeSpec": {"template": {"spec": {}}},
    }


def kueue_patch_index(obj: Mapping[str, Any]) -> int | None:
    """The index of the Kueue runtime patch in ``spec.runtimePatches`` (None: there is none)."""
    for index, patch in enumerate(_spec(obj).get("runtimePatches") or ()):
        if patch.get("manager") == RUNTIME_PATCH_MANAGER:
            return index
    return None


def hold_patch(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The mutating webhook's merge patch for a queued TrainJob: suspended, with the Kueue runtime
    patch appended when it has none (the other managers' patches are kept)."""
    patches = [copy.deepcopy(dict(p)) for p in _spec(obj).get("runtimePatches") or ()]
    if kueue_patch_index(obj) is None:
        patches.append(_empty_patch())
    return {"spec": {"suspend": True, "runtimePatches": patches}}


def owns_jobset(trainjob: Mapping[str, Any], js: Mapping[str, Any]) -> bool:
    """Whether the JobSet is the one the Trainer made for this TrainJob (its controller owner,
    by UID)."""
    return integration.controlled_by(js, KIND, uid=(trainjob.get("metadata") or {}).get("uid"))


def jobset_is_current(trainjob: Mapping[str, Any], js: Mapping[str, Any]) -> bool:
    """The JobSet can give the Workload its pod sets: the TrainJob's, suspended with it, and
    without an admission in any template (the Trainer has rebuilt it from the held TrainJob)."""
    if not owns_jobset(trainjob, js) or not (js.get("spec") or {}).get("suspend"):
        return False
    for rjob in (js.get("spec") or {}).get("replicatedJobs") or ():
        template = ((rjob.get("template") or {}).get("spec") or {}).get("template") or {}
        if jobs.WORKLOAD_ANNOTATION in ((template.get("metadata") or {}).get("annotations") or {}):
            return False
    return True


def pod_sets_from_jobset(
    trainjob: Mapping[str, Any], js: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """One pod set per replicated job of the TrainJob's JobSet, as for a JobSet. Raises
    :class:`InvalidTrainJob` naming the runtime when the JobSet cannot be a Workload."""
    try:
        return jobset.pod_sets(js)
    except jobset.InvalidJobSet as invalid:
        runtime = (_spec(trainjob).get("runtimeRef") or {}).get("name", "")
        raise InvalidTrainJob(
            f"the JobSet the Trainer made from runtime {runtime!r} (spec.runtimeRef): {invalid};"
            " change the training runtime or the TrainJob's spec.runtimePatches"
        ) from None


def resolve_priority_from(
    obj: Mapping[str, Any],
    pod_sets: Sequence[Mapping[str, Any]],
    *,
    workload_priority_classes: Mapping[str, int],
    priority_classes: Mapping[str, int],
) -> jobs.PriorityResolution:
    """The WorkloadPriorityClass label first, else the PriorityClass of the first pod set's
    template that names one (the runtime's templates, as the JobSet has them)."""
    return jobs.resolve_priority_of_templates(
        obj,
        (p.get("template") or {} for p in pod_sets),
        workload_priority_classes=workload_priority_classes,
        priority_classes=priority_classes,
    )


def active(obj: Mapping[str, Any]) -> bool:
    """Whether one of its Jobs still has active pods (Kueue's ``IsActive``, from its status's
    ``jobsStatus``). The Trainer's webhook refuses a change to the runtime patches while so."""
    return any(
        int(s.get("active") or 0) > 0 for s in (obj.get("status") or {}).get("jobsStatus") or ()
    )


def trainjob_finish(obj: Mapping[str, Any]) -> Finish | None:
    """The TrainJob's end: its ``Complete`` or ``Failed`` condition, once true."""
    return finish_from_conditions(
        obj, succeeded="Complete", failed="Failed", kind=KIND, success_message="TrainJob completed"
    )


def pods_ready(obj: Mapping[str, Any], js: Mapping[str, Any]) -> bool:
    """Kueue's PodsReady for a TrainJob: as many of its Jobs ready or succeeded (its status's
    ``jobsStatus``) as its JobSet has replicas."""
    replicas = jobset.replicas(js)
    done = sum(
        int(s.get("ready") or 0) + int(s.get("succeeded") or 0)
        for s in (obj.get("status") or {}).get("jobsStatus") or ()
    )
    return replicas > 0 and done >= replicas


def _replicated_job_patch(name: str, workload: str, injection: FlavorInjection) -> dict[str, Any]:
    """One pod set's admission as a replicated job patch (Kueue's ``RunWithPodSetsInfo``)."""
    pod_spec: dict[str, Any] = {}
    if injection.node_labels:
        pod_spec["nodeSelector"] = dict(injection.node_labels)
    if injection.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in injection.tolerations]
    if injection.topology_gated:
        pod_spec["schedulingGates"] = [{"name": jobs.TOPOLOGY_GATE}]
    metadata = {
        "labels": {**injection.labels, jobs.PODSET_LABEL: injection.pod_set},
        "annotations": {**injection.annotations, jobs.WORKLOAD_ANNOTATION: workload},
    }
    return {
        "name": name,
        "template": {"spec": {"template": {"metadata": metadata, "spec": pod_spec}}},
    }


def _kueue_patch_ops(
    obj: Mapping[str, Any], replicated: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Ops that set the Kueue runtime patch's replicated jobs (adding the patch if missing)."""
    value = _empty_patch()
    if replicated:
        value["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"] = replicated
    index = kueue_patch_index(obj)
    if index is None:
        if _spec(obj).get("runtimePatches") is None:
            # The whole list is written: refused if the TrainJob changed since it was read.
            version = (obj.get("metadata") or {}).get("resourceVersion")
            guard = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}]
            return [
                *(guard if version else []),
                {"op": "add", "path": "/spec/runtimePatches", "value": [value]},
            ]
        return [{"op": "add", "path": "/spec/runtimePatches/-", "value": value}]
    path = f"/spec/runtimePatches/{index}"
    return [
        # Addressed by index: the test refuses the patch if the list changed meanwhile.
        {"op": "test", "path": f"{path}/manager", "value": RUNTIME_PATCH_MANAGER},
        {"op": "add", "path": f"{path}/trainingRuntimeSpec", "value": value["trainingRuntimeSpec"]},
    ]


def _patched_jobs(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    index = kueue_patch_index(obj)
    if index is None:
        return []
    patch = (_spec(obj).get("runtimePatches") or [])[index]
    spec = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}
    return list(spec.get("replicatedJobs") or ())


class TrainJobIntegration:
    """TrainJob on the integration framework: ``spec.suspend`` holds it, the Kueue runtime patch
    carries its admission; its pod sets come from its JobSet (see the module's docstring)."""

    framework = FRAMEWORK
    api_version = API_VERSION
    kind = KIND
    plural = "trainjobs"
    pod_owner_label = jobset.JOBSET_NAME_LABEL
    """The JobSet is named after the TrainJob: its pods name the TrainJob by this label."""

    def needs_workload(self, obj: Mapping[str, Any]) -> bool:
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            return False
        return trainjob_finish(obj) is None

    def pods_ready(self, obj: Mapping[str, Any]) -> bool:
        # Read with the JobSet (pods_ready above): the controller asks its source.
        return False

    def resolve_priority(
        self,
        obj: Mapping[str, Any],
        *,
        workload_priority_classes: Mapping[str, int],
        priority_classes: Mapping[str, int],
    ) -> jobs.PriorityResolution:
        return resolve_priority_from(
            obj,
            (),
            workload_priority_classes=workload_priority_classes,
            priority_classes=priority_classes,
        )

    def queue_name(self, obj: Mapping[str, Any]) -> str | None:
        return jobs.queue_name(obj)

    def workload_name(self, obj: Mapping[str, Any]) -> str:
        metadata = obj["metadata"]
        return workload_name(metadata["name"], metadata["uid"])

    def pod_sets(self, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        raise InvalidTrainJob(
            "spec.runtimeRef: a TrainJob's pod sets are read from the JobSet the Trainer makes"
            " from its runtime; install Kubeflow Trainer v2 and its JobSet controller"
        )

    def suspended(self, obj: Mapping[str, Any]) -> bool:
        return bool(_spec(obj).get("suspend"))

    def suspend_patch(self, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Only ``spec.suspend``: the Trainer's webhook refuses a change to the runtime patches
        while its JobSet runs (a TrainJob created without the webhook gets the Kueue patch at
        admission)."""
        return [{"op": "add", "path": "/spec/suspend", "value": True}]

    def start_patch(
        self,
        obj: Mapping[str, Any],
        *,
        workload_name: str,
        injections: Mapping[str, FlavorInjection],
    ) -> list[dict[str, Any]]:
        """The Kueue runtime patch gets one replicated job patch per admitted pod set, then
        the TrainJob is unsuspended; nothing (an empty patch) without an admitted pod set."""
        if not injections:
            return []
        replicated = [
            _replicated_job_patch(name, workload_name, injection)
            for name, injection in injections.items()
        ]
        return [
            *_kueue_patch_ops(obj, replicated),
            {"op": "add", "path": "/spec/suspend", "value": False},
        ]

    def restore_patch(
        self, obj: Mapping[str, Any], *, pod_sets: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        """Suspend, and empty the Kueue runtime patch: the Trainer rebuilds the JobSet from the
        runtime as it was submitted (the pod sets need not be written back)."""
        return [{"op": "add", "path": "/spec/suspend", "value": True}, *_kueue_patch_ops(obj, [])]

    def injected(self, obj: Mapping[str, Any]) -> bool:
        return bool(_patched_jobs(obj))

    def finished(self, obj: Mapping[str, Any]) -> Finish | None:
        return trainjob_finish(obj)


TRAINJOB = TrainJobIntegration()
"""The TrainJob integration (its adapter holds no state)."""
