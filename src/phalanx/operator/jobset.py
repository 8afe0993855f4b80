"""JobSet integration (Kueue's ``jobset.x-k8s.io/jobset``), as pure functions over API dicts.

A JobSet (``jobset.x-k8s.io/v1alpha2``) labelled ``kueue.x-k8s.io/queue-name`` is suspended at
creation (``spec.suspend``, mutating webhook) and represented by one Workload with one pod set
per replicated job: named after it, ``count`` = replicas x the Job's pods (parallelism capped
by completions), the replicated job's pod template. Admission injects each pod set's flavors
into its replicated job's pod template and sets ``spec.suspend: false``; the JobSet controller
copies those templates onto its child Jobs when it resumes them. Eviction sets
``spec.suspend: true`` (the JobSet controller suspends its Jobs, whose pods are deleted) and
puts back the templates the Workload recorded. The JobSet's ``Completed`` or ``Failed``
condition finishes the Workload. :data:`JOBSET` is the adapter;
``phalanx.operator.kindsync`` applies it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from phalanx.operator import integration, jobs, templates
from phalanx.operator.integration import (
    SUSPEND_PATCH,
    Finish,
    FlavorInjection,
    finish_from_conditions,
)

__all__ = [
    "API_VERSION",
    "FRAMEWORK",
    "GROUP",
    "JOBSET",
    "JOBSET_NAME_LABEL",
    "KIND",
    "MAX_POD_SETS",
    "InvalidJobSet",
    "JobSetIntegration",
    "child_job_stopped",
    "jobset_finish",
    "made_by_trainjob",
    "needs_workload",
    "pod_sets",
    "pods_per_replica",
    "pods_ready",
    "replicas",
    "resolve_priority",
    "workload_name",
]

FRAMEWORK = "jobset.x-k8s.io/jobset"
GROUP = "jobset.x-k8s.io"
API_VERSION = f"{GROUP}/v1alpha2"
KIND = "JobSet"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
"""The JobSet controller puts it on every child Job and pod."""
TRAINJOB_KIND = "TrainJob"
"""Kubeflow Trainer v2's kind, whose JobSets are its own (``phalanx.operator.trainjob``)."""
MAX_POD_SETS = 8
"""A Workload holds at most 8 pod sets (Kueue's schema), so at most 8 replicated jobs."""


class InvalidJobSet(ValueError):
    """The JobSet cannot be represented by a Workload; the message names the field and the fix."""


def workload_name(name: str, uid: str) -> str:
    """Kueue's name for a JobSet's Workload: ``jobset-<name>-<hash>``."""
    return integration.kueue_workload_name(
        prefix="jobset", kind=KIND, group=GROUP, name=name, uid=uid
    )


def _replicated_jobs(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((obj.get("spec") or {}).get("replicatedJobs") or ())


def _pod_template(rjob: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((rjob.get("template") or {}).get("spec") or {}).get("template") or {}


def pods_per_replica(rjob: Mapping[str, Any]) -> int:
    """The pods one child Job runs at once: parallelism (default 1) capped by completions."""
    job_spec = (rjob.get("template") or {}).get("spec") or {}
    parallelism = job_spec.get("parallelism")
    count = 1 if parallelism is None else int(parallelism)
    completions = job_spec.get("completions")
    if completions is not None:
        count = min(count, int(completions))
    return count


def _replicas(rjob: Mapping[str, Any]) -> int:
    replicas = rjob.get("replicas")
    return 1 if replicas is None else int(replicas)


def pod_sets(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One pod set per replicated job, in the JobSet's order: its name, ``count`` = replicas x
    pods per replica, its pod template, and the topology request of the template's Kueue
    annotations (placed as one pod set: topology sub-groups per replica are not implemented).
    Raises :class:`InvalidJobSet` when the JobSet cannot be a Workload."""
    rjobs = _replicated_jobs(obj)
    if not rjobs:
        raise InvalidJobSet("spec.replicatedJobs: empty; a JobSet needs at least one")
    if len(rjobs) > MAX_POD_SETS:
        raise InvalidJobSet(
            f"spec.replicatedJobs: {len(rjobs)} replicated jobs, but a Workload holds at most"
            f" {MAX_POD_SETS} pod sets; merge replicated jobs or split the JobSet"
        )
    result: list[dict[str, Any]] = []
    for index, rjob in enumerate(rjobs):
        name = str(rjob.get("name") or "")
        if not name:
            raise InvalidJobSet(f"spec.replicatedJobs[{index}].name: empty; name it")
        template = copy.deepcopy(dict(_pod_template(rjob)))
        count = _replicas(rjob) * pods_per_replica(rjob)
        pod_set: dict[str, Any] = {"name": name, "count": count, "template": template}
        annotations = (template.get("metadata") or {}).get("annotations") or {}
        topology = jobs.topology_request(annotations, count)
        if topology:
            pod_set["topologyRequest"] = topology
        result.append(pod_set)
    return result


def resolve_priority(
    obj: Mapping[str, Any],
    *,
    workload_priority_classes: Mapping[str, int],
    priority_classes: Mapping[str, int],
) -> jobs.PriorityResolution:
    """The WorkloadPriorityClass label first, else the PriorityClass of the first replicated
    job whose pod template names one (Kueue reads the pod sets in order)."""
    return jobs.resolve_priority_of_templates(
        obj,
        (_pod_template(rjob) for rjob in _replicated_jobs(obj)),
        workload_priority_classes=workload_priority_classes,
        priority_classes=priority_classes,
    )


def jobset_finish(obj: Mapping[str, Any]) -> Finish | None:
    """The JobSet's end: its ``Completed`` or ``Failed`` condition, once true."""
    return finish_from_conditions(
        obj,
        succeeded="Completed",
        failed="Failed",
        kind="JobSet",
        success_message="JobSet completed",
    )


def needs_workload(obj: Mapping[str, Any]) -> bool:
    """A queued JobSet without a Workload gets one unless it is being deleted or has ended."""
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return jobset_finish(obj) is None


def replicas(obj: Mapping[str, Any]) -> int:
    """The child Jobs a JobSet runs: its replicated jobs' replicas (default 1 each)."""
    return sum(_replicas(r) for r in _replicated_jobs(obj))


def pods_ready(obj: Mapping[str, Any]) -> bool:
    """Kueue's PodsReady for a JobSet: as many child Jobs ready or succeeded as replicas."""
    done = sum(
        int(s.get("ready") or 0) + int(s.get("succeeded") or 0)
        for s in (obj.get("status") or {}).get("replicatedJobsStatus") or ()
    )
    return done >= replicas(obj)


def made_by_trainjob(obj: Mapping[str, Any]) -> bool:
    """Whether a TrainJob made the JobSet (its controller owner): the TrainJob is queued."""
    return integration.controlled_by(obj, TRAINJOB_KIND)


def child_job_stopped(job: Mapping[str, Any]) -> bool:
    """A JobSet's child Job runs nothing: it ended, or it is suspended, the Job controller has
    seen that (``Suspended`` condition) and counts no active pod."""
    status = job.get("status") or {}
    conditions = status.get("conditions") or ()
    if any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
    ):
        return True
    suspended = any(c.get("type") == "Suspended" and c.get("status") == "True" for c in conditions)
    return bool((job.get("spec") or {}).get("suspend")) and suspended and not status.get("active")


def _template_path(index: int) -> str:
    return f"/spec/replicatedJobs/{index}/template/spec/template"


def _guard(index: int, name: str) -> dict[str, Any]:
    # Each patch addresses replicated jobs by index: the test refuses it if the list differs.
    return {"op": "test", "path": f"/spec/replicatedJobs/{index}/name", "value": name}


class JobSetIntegration:
    """JobSet on the integration framework: ``spec.suspend`` holds it, each replicated job is
    a pod set of the same name."""

    framework = FRAMEWORK
    api_version = API_VERSION
    kind = KIND
    plural = "jobsets"
    pod_owner_label = JOBSET_NAME_LABEL

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
        """The queue label's value; None for a TrainJob's JobSet (which carries the labels of
        the TrainJob's runtime: the TrainJob is what is queued)."""
        if made_by_trainjob(obj):
            return None
        return jobs.queue_name(obj)

    def workload_name(self, obj: Mapping[str, Any]) -> str:
        metadata = obj["metadata"]
        return workload_name(metadata["name"], metadata["uid"])

    def pod_sets(self, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        return pod_sets(obj)

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
        """Every replicated job's template gets its pod set's admission, then the JobSet is
        unsuspended; nothing (an empty patch) unless every replicated job was admitted: a
        JobSet starts whole or not at all."""
        rjobs = _replicated_jobs(obj)
        if not rjobs or any(str(r.get("name")) not in injections for r in rjobs):
            return []
        ops: list[dict[str, Any]] = []
        for index, rjob in enumerate(rjobs):
            name = str(rjob.get("name"))
            ops.append(_guard(index, name))
            ops.extend(
                templates.inject(
                    _pod_template(rjob),
                    _template_path(index),
                    workload_name=workload_name,
                    injection=injections[name],
                )
            )
        ops.append({"op": "add", "path": "/spec/suspend", "value": False})
        return ops

    def restore_patch(
        self, obj: Mapping[str, Any], *, pod_sets: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        """Suspend, and put back each replicated job's template as its pod set recorded it
        (a replicated job the Workload has no pod set for is left as it is)."""
        recorded = {str(p.get("name")): p.get("template") or {} for p in pod_sets}
        ops: list[dict[str, Any]] = [{"op": "add", "path": "/spec/suspend", "value": True}]
        for index, rjob in enumerate(_replicated_jobs(obj)):
            name = str(rjob.get("name"))
            if name in recorded:
                ops.append(_guard(index, name))
                ops.extend(
                    templates.restore(recorded[name], _pod_template(rjob), _template_path(index))
                )
        return ops

    def injected(self, obj: Mapping[str, Any]) -> bool:
        return any(
            jobs.WORKLOAD_ANNOTATION
            in ((_pod_template(r).get("metadata") or {}).get("annotations") or {})
            for r in _replicated_jobs(obj)
        )

    def finished(self, obj: Mapping[str, Any]) -> Finish | None:
        return jobset_finish(obj)


JOBSET = JobSetIntegration()
"""The JobSet integration (its adapter holds no state)."""
