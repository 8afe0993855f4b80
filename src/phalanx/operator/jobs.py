"""batch/v1 Job integration (Kueue's ``batch/job``), as pure functions over API dicts.

A Job labelled ``kueue.x-k8s.io/queue-name`` is suspended at creation (mutating webhook) and
represented by a Workload that the scheduler admits. These functions build that Workload, and
the patches that start a Job on admission and stop it on eviction. They do no I/O, so the
rules are unit-tested without a cluster; ``phalanx.operator.jobsync`` applies them.
:data:`JOB` is the Job's adapter on the integration framework (``phalanx.operator.integration``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from phalanx.operator import integration
from phalanx.operator.integration import (
    SUSPEND_PATCH,
    Finish,
    FlavorInjection,
    PriorityResolution,
    finish_from_conditions,
)

__all__ = [
    "JOB",
    "JOB_MIN_PARALLELISM_ANNOTATION",
    "JOB_UID_LABEL",
    "MAIN_POD_SET",
    "PODSET_LABEL",
    "PRIORITY_CLASS_LABEL",
    "QUEUE_LABEL",
    "TOPOLOGY_GATE",
    "WORKLOAD_ANNOTATION",
    "FlavorInjection",
    "InvalidJob",
    "JobFinish",
    "JobIntegration",
    "PriorityResolution",
    "WorkloadPriorityClassNotFound",
    "admission_patch",
    "job_finish",
    "job_finishing",
    "job_pod_sets",
    "min_parallelism",
    "pods_ready",
    "queue_name",
    "resolve_priority",
    "resolve_priority_of_templates",
    "restore_patch",
    "start_time_clearable",
    "topology_request",
    "workload_count",
    "workload_for_job",
    "workload_name",
]

QUEUE_LABEL = integration.QUEUE_LABEL
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = integration.JOB_UID_LABEL
PROVREQ_ANNOTATION_PREFIX = "provreq.kueue.x-k8s.io/"
"""Job annotations Kueue copies to the Workload: the ProvisioningRequest's parameters."""
JOB_MIN_PARALLELISM_ANNOTATION = "kueue.x-k8s.io/job-min-parallelism"
WORKLOAD_ANNOTATION = "kueue.x-k8s.io/workload"
PODSET_LABEL = "kueue.x-k8s.io/podset"
TOPOLOGY_GATE = "kueue.x-k8s.io/topology"
KUEUE_GROUP = "kueue.x-k8s.io"
MAIN_POD_SET = "main"

_TOPOLOGY_ANNOTATIONS = {
    "kueue.x-k8s.io/podset-required-topology": "required",
    "kueue.x-k8s.io/podset-preferred-topology": "preferred",
}
_UNCONSTRAINED_ANNOTATION = "kueue.x-k8s.io/podset-unconstrained-topology"
_SLICE_LEVEL_ANNOTATION = "kueue.x-k8s.io/podset-slice-required-topology"
_SLICE_SIZE_ANNOTATION = "kueue.x-k8s.io/podset-slice-size"
_MAX_LEVEL_NAME = 63


def workload_name(job_name: str, job_uid: str) -> str:
    """Kueue's name for the Workload of a Job, so tools that look it up by name find it."""
    return integration.kueue_workload_name(
        prefix="job", kind="Job", group="batch", name=job_name, uid=job_uid
    )


def workload_count(workload: Mapping[str, Any], pod_set: str = MAIN_POD_SET) -> int:
    for ps in (workload.get("spec") or {}).get("podSets") or ():
        if ps.get("name") == pod_set:
            return int(ps.get("count", 1))
    return 0


def queue_name(job: Mapping[str, Any]) -> str | None:
    labels = (job.get("metadata") or {}).get("labels") or {}
    value = labels.get(QUEUE_LABEL)
    return str(value) if value else None


def owned_by_jobset(job: Mapping[str, Any]) -> bool:
    """Whether a JobSet made the Job (its controller owner): the JobSet is what is queued,
    so a queue label its replicated job's template carries does not queue the Job itself
    (Kueue skips a Job whose owner is a kind it manages)."""
    for owner in (job.get("metadata") or {}).get("ownerReferences") or ():
        if owner.get("controller") and str(owner.get("apiVersion", "")).startswith(
            "jobset.x-k8s.io/"
        ):
            return True
    return False


class InvalidJob(ValueError):
    """The Job cannot be represented by a Workload; the message names the field and the fix."""


class WorkloadPriorityClassNotFound(LookupError):
    """The Job's ``kueue.x-k8s.io/priority-class`` names a WorkloadPriorityClass that does not
    exist; as in Kueue, no Workload is created until it does."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"WorkloadPriorityClass {name!r} named by label {PRIORITY_CLASS_LABEL} does not"
            " exist: create it, or fix the label"
        )
        self.name = name


def resolve_priority(
    job: Mapping[str, Any],
    *,
    workload_priority_classes: Mapping[str, int],
    priority_classes: Mapping[str, int],
    default_priority: int = 0,
) -> PriorityResolution:
    """The Job's WorkloadPriorityClass label wins over its pods' PriorityClass, as in Kueue.

    A named WorkloadPriorityClass that does not exist raises
    :class:`WorkloadPriorityClassNotFound` (Kueue creates no Workload then: running it at the
    default priority would quietly give it the wrong place in the queue). A pod
    PriorityClass that does not exist leaves the default, as the pods' own admission decides
    about it.
    """
    labels = (job.get("metadata") or {}).get("labels") or {}
    wpc = labels.get(PRIORITY_CLASS_LABEL)
    if wpc:
        if wpc not in workload_priority_classes:
            raise WorkloadPriorityClassNotFound(str(wpc))
        return PriorityResolution(
            value=workload_priority_classes[wpc],
            ref={"group": KUEUE_GROUP, "kind": "WorkloadPriorityClass", "name": wpc},
        )
    pod_spec = (((job.get("spec") or {}).get("template") or {}).get("spec")) or {}
    pc = pod_spec.get("priorityClassName")
    if pc and pc in priority_classes:
        return PriorityResolution(
            value=priority_classes[pc],
            ref={"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": pc},
        )
    return PriorityResolution(value=default_priority, ref=None)


def resolve_priority_of_templates(
    obj: Mapping[str, Any],
    templates: Iterable[Mapping[str, Any]],
    *,
    workload_priority_classes: Mapping[str, int],
    priority_classes: Mapping[str, int],
) -> PriorityResolution:
    """:func:`resolve_priority` for a kind with several pod templates (JobSet, PyTorchJob,
    ...): its WorkloadPriorityClass label first, else the PriorityClass of the first template
    that names one (Kueue reads the pod sets in order)."""
    pod_class = next(
        (
            str(pc)
            for template in templates
            if (pc := (template.get("spec") or {}).get("priorityClassName"))
        ),
        None,
    )
    # The Job rule reads spec.template.spec.priorityClassName: give it the chosen one.
    probe = {
        "metadata": obj.get("metadata") or {},
        "spec": {"template": {"spec": {"priorityClassName": pod_class} if pod_class else {}}},
    }
    return resolve_priority(
        probe,
        workload_priority_classes=workload_priority_classes,
        priority_classes=priority_classes,
    )


def _pod_count(spec: Mapping[str, Any]) -> int:
    parallelism = spec.get("parallelism")
    count = 1 if parallelism is None else int(parallelism)
    completions = spec.get("completions")
    if completions is not None:
        count = min(count, int(completions))
    return count


def topology_request(annotations: Mapping[str, str], count: int) -> dict[str, Any] | None:
    """The topology request of a pod template's Kueue annotations (None without one)."""
    request: dict[str, Any] = {}
    for annotation, field_name in _TOPOLOGY_ANNOTATIONS.items():
        if annotations.get(annotation):
            request[field_name] = annotations[annotation]
    if str(annotations.get(_UNCONSTRAINED_ANNOTATION, "")).lower() == "true":
        request["unconstrained"] = True
    slice_level = annotations.get(_SLICE_LEVEL_ANNOTATION) or ""
    slice_size = _slice_size(annotations.get(_SLICE_SIZE_ANNOTATION))
    if 0 < len(slice_level) <= _MAX_LEVEL_NAME and slice_size is not None and slice_size <= count:
        request["podSetSliceRequiredTopology"] = slice_level
        request["podSetSliceSize"] = slice_size
    # An invalid slice pair stays on the template only: the Workload is still created (its
    # schema would refuse the fields), and the core explains the annotation's problem.
    if request:
        request["podIndexLabel"] = "batch.kubernetes.io/job-completion-index"
    return request or None


def _slice_size(text: str | None) -> int | None:
    try:
        size = int(text) if text is not None else 0
    except ValueError:
        return None
    return size if size >= 1 else None


def min_parallelism(job: Mapping[str, Any]) -> int | None:
    """The ``kueue.x-k8s.io/job-min-parallelism`` annotation (partial admission), checked as
    Kueue's Job webhook checks it: an integer above 0 and below ``spec.parallelism``."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(JOB_MIN_PARALLELISM_ANNOTATION)
    if text is None:
        return None
    where = f"metadata.annotations[{JOB_MIN_PARALLELISM_ANNOTATION}]"
    try:
        value = int(str(text))
    except ValueError:
        raise InvalidJob(f"{where}: {text!r} is not an integer; set a whole number") from None
    parallelism = _pod_count(job.get("spec") or {})
    if value <= 0 or value >= parallelism:
        raise InvalidJob(
            f"{where}: {value} must be above 0 and below the Job's pod count ({parallelism}:"
            " parallelism, capped by completions); set it in that range or remove it"
        )
    return value


def job_pod_sets(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Job's one pod set ``main``: its pod template, ``count`` = parallelism capped by
    completions, ``minCount`` and the topology request from the annotations. Raises
    :class:`InvalidJob` when an annotation cannot be honoured."""
    spec = job.get("spec") or {}
    template = copy.deepcopy(spec.get("template") or {})
    pod_set: dict[str, Any] = {
        "name": MAIN_POD_SET,
        "count": _pod_count(spec),
        "template": template,
    }
    min_count = min_parallelism(job)
    if min_count is not None:
        pod_set["minCount"] = min_count
    topology = topology_request(
        (template.get("metadata") or {}).get("annotations") or {}, pod_set["count"]
    )
    if topology:
        pod_set["topologyRequest"] = topology
    return [pod_set]


def workload_for_job(job: Mapping[str, Any], *, priority: PriorityResolution) -> dict[str, Any]:
    """The Workload manifest for a queued Job: one pod set ``main`` from the pod template.
    Raises :class:`InvalidJob` when an annotation cannot be honoured."""
    body = integration.workload_manifest(
        JOB,
        job,
        pod_sets=job_pod_sets(job),
        priority=priority.value,
        priority_ref=priority.ref,
    )
    # Kueue copies the Job's ProvisioningRequest parameters (provisioning/sample-job.yaml's
    # provreq.kueue.x-k8s.io/maxRunDurationSeconds) to the Workload, where the check reads them.
    provreq = {
        key: value
        for key, value in ((job.get("metadata") or {}).get("annotations") or {}).items()
        if key.startswith(PROVREQ_ANNOTATION_PREFIX)
    }
    if provreq:
        body["metadata"]["annotations"] = provreq
    return body


def pods_ready(job: Mapping[str, Any]) -> bool:
    """Kueue's PodsReady for a Job: its pods (the lesser of parallelism and completions) are
    ready or have succeeded, those the Job controller has not counted yet included (a pod
    that just succeeded is in ``uncountedTerminatedPods`` before ``succeeded``)."""
    status = job.get("status") or {}
    uncounted = (status.get("uncountedTerminatedPods") or {}).get("succeeded") or ()
    done = int(status.get("ready") or 0) + int(status.get("succeeded") or 0) + len(uncounted)
    return done >= _pod_count(job.get("spec") or {})


def admission_patch(
    job: Mapping[str, Any],
    *,
    workload_name_: str,
    injection: FlavorInjection,
) -> list[dict[str, Any]]:
    """A JSON patch that injects the flavor into the suspended Job's template and starts it.

    JSON patch (not merge) because the result must be exact: the original template plus the
    flavor, so that :func:`restore_patch` can bring back exactly the original.
    """
    spec = job.get("spec") or {}
    template = spec.get("template") or {}
    pod_spec = template.get("spec") or {}
    tmeta = template.get("metadata") or {}
    node_selector = {**(pod_spec.get("nodeSelector") or {}), **injection.node_labels}
    tolerations = list(pod_spec.get("tolerations") or [])
    for toleration in injection.tolerations:
        if toleration not in tolerations:
            tolerations.append(dict(toleration))
    labels = {**(tmeta.get("labels") or {}), **injection.labels, PODSET_LABEL: injection.pod_set}
    annotations = {
        **(tmeta.get("annotations") or {}),
        **injection.annotations,
        WORKLOAD_ANNOTATION: workload_name_,
    }
    gates = [g for g in pod_spec.get("schedulingGates") or [] if g.get("name") != TOPOLOGY_GATE]
    if injection.topology_gated:
        gates.append({"name": TOPOLOGY_GATE})
    ops: list[dict[str, Any]] = [
        {
            "op": "add",
            "path": "/spec/template/metadata",
            "value": {**tmeta, "labels": labels, "annotations": annotations},
        },
        {"op": "add", "path": "/spec/template/spec/nodeSelector", "value": node_selector},
        {"op": "add", "path": "/spec/template/spec/tolerations", "value": tolerations},
        {"op": "add", "path": "/spec/template/spec/schedulingGates", "value": gates},
    ]
    if injection.count != _pod_count(spec):
        # Partial admission: run as many pods as were admitted.
        ops.append({"op": "add", "path": "/spec/parallelism", "value": injection.count})
    ops.append({"op": "add", "path": "/spec/suspend", "value": False})
    return ops


def restore_patch(
    job: Mapping[str, Any],
    *,
    original_template: Mapping[str, Any],
    original_parallelism: int | None,
) -> list[dict[str, Any]]:
    """Suspend the Job and put back the template the Workload recorded before admission."""
    tmeta = original_template.get("metadata") or {}
    pod_spec = original_template.get("spec") or {}
    ops: list[dict[str, Any]] = [
        {"op": "add", "path": "/spec/suspend", "value": True},
        {"op": "add", "path": "/spec/template/metadata", "value": copy.deepcopy(dict(tmeta))},
        {
            "op": "add",
            "path": "/spec/template/spec/nodeSelector",
            "value": dict(pod_spec.get("nodeSelector") or {}),
        },
        {
            "op": "add",
            "path": "/spec/template/spec/tolerations",
            "value": list(pod_spec.get("tolerations") or []),
        },
        {
            "op": "add",
            "path": "/spec/template/spec/schedulingGates",
            "value": list(pod_spec.get("schedulingGates") or []),
        },
    ]
    spec = job.get("spec") or {}
    if original_parallelism is not None and spec.get("parallelism") != original_parallelism:
        ops.append({"op": "add", "path": "/spec/parallelism", "value": original_parallelism})
    return ops


JobFinish = Finish
"""A Job's end (the framework's :class:`~phalanx.operator.integration.Finish`)."""


def job_finishing(job: Mapping[str, Any]) -> bool:
    """Whether the Job controller has decided the Job's end: ``SuccessCriteriaMet`` or
    ``FailureTarget`` (it waits for the last pods before ``Complete``/``Failed``), or ended."""
    for condition in (job.get("status") or {}).get("conditions") or ():
        if condition.get("status") == "True" and condition.get("type") in _ENDING:
            return True
    return False


_ENDING = frozenset({"SuccessCriteriaMet", "FailureTarget", "Complete", "Failed"})


def start_time_clearable(job: Mapping[str, Any]) -> bool:
    """Whether clearing the suspended Job's ``status.startTime`` (to make its template
    mutable again) is safe: the Job controller has seen the suspension (``Suspended=True``),
    no pod is active, terminating or uncounted, and the Job is neither ending nor complete by
    its counts.

    A Job that may still finish needs its ``startTime``: the API server refuses a
    ``Complete`` or ``Failed`` Job without one, so the Job controller could never finish it.
    """
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    if not spec.get("suspend") or job_finishing(job):
        return False
    suspended = any(
        c.get("type") == "Suspended" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    uncounted = status.get("uncountedTerminatedPods") or {}
    if not suspended or status.get("active") or status.get("terminating"):
        return False
    if uncounted.get("succeeded") or uncounted.get("failed"):
        return False
    succeeded = int(status.get("succeeded") or 0)
    completions = spec.get("completions")
    return succeeded == 0 if completions is None else succeeded < int(completions)


def needs_workload(job: Mapping[str, Any]) -> bool:
    """Whether a queued Job without a Workload should get one: not once it is being deleted
    or has finished, as in Kueue. Deleting a finished Job in the foreground deletes its
    Workload first; creating another would admit a Job that never runs again, and its owner
    reference would hold the Job's deletion back."""
    if (job.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return job_finish(job) is None


def job_finish(job: Mapping[str, Any]) -> JobFinish | None:
    """The Job's terminal condition (Complete or Failed), if it has one."""
    return finish_from_conditions(
        job,
        succeeded="Complete",
        failed="Failed",
        kind="Job",
        success_message="Job finished successfully",
    )


class JobIntegration:
    """batch/v1 Job on the integration framework (Kueue's ``batch/job``): ``spec.suspend``
    holds it, its one pod set ``main`` is its pod template."""

    framework = "batch/job"
    api_version = "batch/v1"
    kind = "Job"

    def queue_name(self, obj: Mapping[str, Any]) -> str | None:
        return None if owned_by_jobset(obj) else queue_name(obj)

    def workload_name(self, obj: Mapping[str, Any]) -> str:
        metadata = obj["metadata"]
        return workload_name(metadata["name"], metadata["uid"])

    def pod_sets(self, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        return job_pod_sets(obj)

    def suspended(self, obj: Mapping[str, Any]) -> bool:
        return bool((obj.get("spec") or {}).get("suspend"))

    def suspend_patch(self, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [dict(op) for op in SUSPEND_PATCH]

    def start_patch(
        self,
        obj: Mapping[str, Any],
        *,
        workload_name: str,
        injections: Mapping[str, FlavorInjection],
    ) -> list[dict[str, Any]]:
        injection = injections.get(MAIN_POD_SET)
        if injection is None:
            return []
        return admission_patch(obj, workload_name_=workload_name, injection=injection)

    def restore_patch(
        self, obj: Mapping[str, Any], *, pod_sets: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        main = next((p for p in pod_sets if p.get("name") == MAIN_POD_SET), None)
        if main is None:
            return []
        return restore_patch(
            obj,
            original_template=main.get("template") or {},
            original_parallelism=int(main.get("count", 1)),
        )

    def injected(self, obj: Mapping[str, Any]) -> bool:
        """The marks a start writes on the template: Phalanx's ``kueue.x-k8s.io/workload``
        annotation or the ``kueue.x-k8s.io/podset`` label (Kueue writes the label at every
        start and the annotation only with TAS, so a Job Kueue started before a move to
        Phalanx has at least the label)."""
        template = (obj.get("spec") or {}).get("template") or {}
        metadata = template.get("metadata") or {}
        return WORKLOAD_ANNOTATION in (metadata.get("annotations") or {}) or (
            PODSET_LABEL in (metadata.get("labels") or {})
        )

    def finished(self, obj: Mapping[str, Any]) -> Finish | None:
        return job_finish(obj)


JOB = JobIntegration()
"""The Job integration (its adapter holds no state)."""
