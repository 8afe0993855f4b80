"""The integration framework: what the operator needs to know about a kind of job.

Kueue integrates each kind of job (batch/v1 Job, JobSet, Pods, ...) through a small adapter
(its ``GenericJob`` interface); Phalanx does the same. An :class:`Integration` is pure: it
reads and patches API dicts and does no I/O, so every kind's rules are unit-tested without a
cluster. It says how to find the object's queue and Workload, derive the Workload's pod sets,
start the object with an admission injected, stop it again with its templates restored, and
read whether it finished. The controllers apply these answers.

The parts that are the same for every kind live here too: which injection each admitted pod
set gets (:func:`injections`) and the Workload's metadata and spec (:func:`workload_manifest`).
Kinds are named by Kueue's ``integrations.frameworks`` names (:data:`KUEUE_FRAMEWORKS`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from phalanx.operator.admission_checks import PodSetChanges

__all__ = [
    "JOB_UID_LABEL",
    "KUEUE_FRAMEWORKS",
    "QUEUE_LABEL",
    "SUSPEND_PATCH",
    "Finish",
    "FlavorInjection",
    "Integration",
    "OwnedKind",
    "PriorityResolution",
    "controlled_by",
    "disabled_message",
    "finish_from_conditions",
    "injections",
    "kueue_workload_name",
    "workload_manifest",
]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
_KUEUE_GROUP = "kueue.x-k8s.io"
_HASH_LENGTH = 5
_MAX_NAME = 253

KUEUE_FRAMEWORKS = (
    "batch/job",
    "kubeflow.org/mpijob",
    "ray.io/rayjob",
    "ray.io/raycluster",
    "jobset.x-k8s.io/jobset",
    "kubeflow.org/paddlejob",
    "kubeflow.org/pytorchjob",
    "kubeflow.org/tfjob",
    "kubeflow.org/xgboostjob",
    "kubeflow.org/jaxjob",
    "trainer.kubeflow.org/trainjob",
    "workload.codeflare.dev/appwrapper",
    "pod",
    "deployment",
    "statefulset",
    "leaderworkerset.x-k8s.io/leaderworkerset",
)
"""Every name Kueue accepts in ``integrations.frameworks``."""


@dataclass(frozen=True)
class FlavorInjection:
    """What admission adds to a pod set's template (from the assigned flavors)."""

    pod_set: str
    count: int
    node_labels: Mapping[str, str]
    tolerations: Sequence[Mapping[str, Any]]
    topology_gated: bool
    labels: Mapping[str, str] = field(default_factory=dict)
    """From admission checks' ``podSetUpdates`` (as are the annotations)."""
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PriorityResolution:
    """A Workload's priority and the class it came from (None: the default)."""

    value: int
    ref: dict[str, str] | None


@dataclass(frozen=True)
class Finish:
    """How a job ended, as its Workload's ``Finished`` condition says it."""

    succeeded: bool
    reason: str
    message: str


def finish_from_conditions(
    obj: Mapping[str, Any], *, succeeded: str, failed: str, kind: str, success_message: str
) -> Finish | None:
    """A job's end from its own status conditions: ``succeeded`` or ``failed`` (their type
    names) once true, with the condition's message (or a default naming ``kind``)."""
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("status") != "True":
            continue
        if condition.get("type") == succeeded:
            return Finish(True, "Succeeded", condition.get("message") or success_message)
        if condition.get("type") == failed:
            return Finish(False, "Failed", condition.get("message") or f"{kind} failed")
    return None


def controlled_by(obj: Mapping[str, Any], kind: str, *, uid: str | None = None) -> bool:
    """Whether an object of ``kind`` (with ``uid``, when given) is the object's controller
    owner: a RayJob's RayCluster, a TrainJob's JobSet. The owner is what is queued."""
    return any(
        o.get("controller") and o.get("kind") == kind and (uid is None or o.get("uid") == uid)
        for o in (obj.get("metadata") or {}).get("ownerReferences") or ()
    )


SUSPEND_PATCH: tuple[dict[str, Any], ...] = ({"op": "add", "path": "/spec/suspend", "value": True},)
"""The JSON patch that holds a kind with ``spec.suspend`` (Job, JobSet)."""


class Integration(Protocol):
    """One kind of job, as the controllers see it. Every method is pure."""

    framework: str
    """Kueue's name in ``integrations.frameworks`` (``batch/job``)."""
    api_version: str
    kind: str

    def queue_name(self, obj: Mapping[str, Any]) -> str | None:
        """The LocalQueue the object is submitted to, if any."""

    def workload_name(self, obj: Mapping[str, Any]) -> str:
        """Kueue's name for the object's Workload."""

    def pod_sets(self, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The Workload's pod sets: name, count, template, and where the kind says so
        ``minCount`` and ``topologyRequest``. Raises ``ValueError`` with the field and the
        fix when the object cannot be represented."""

    def suspended(self, obj: Mapping[str, Any]) -> bool:
        """Whether the object is held: nothing of it runs until it is started."""

    def suspend_patch(self, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        """A JSON patch that holds the object (pods deleted by the kind's controller)."""

    def start_patch(
        self,
        obj: Mapping[str, Any],
        *,
        workload_name: str,
        injections: Mapping[str, FlavorInjection],
    ) -> list[dict[str, Any]]:
        """A JSON patch that injects each admitted pod set's flavors and starts the object."""

    def restore_patch(
        self, obj: Mapping[str, Any], *, pod_sets: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        """A JSON patch that holds the object and puts back the templates and counts the
        Workload recorded (its ``spec.podSets``) before admission."""

    def injected(self, obj: Mapping[str, Any]) -> bool:
        """Whether an admission is still injected (a held object to restore)."""

    def finished(self, obj: Mapping[str, Any]) -> Finish | None:
        """The object's end, once it has one."""


class OwnedKind(Integration, Protocol):
    """A kind with its own CRD and controller (JobSet, ...), run by the generic controller of
    ``phalanx.operator.kindsync``: what it needs beyond :class:`Integration`."""

    plural: str
    """The resource's plural name (``jobsets``); its group and version are ``api_version``'s."""
    pod_owner_label: str
    """The label the kind's controller puts on every pod it makes, naming the object (in the
    same namespace): an evicted object's quota is released only once none of them is left."""

    def needs_workload(self, obj: Mapping[str, Any]) -> bool:
        """A queued object without a Workload gets one unless it is being deleted or ended."""

    def pods_ready(self, obj: Mapping[str, Any]) -> bool:
        """Kueue's PodsReady for the object, from its own status."""

    def resolve_priority(
        self,
        obj: Mapping[str, Any],
        *,
        workload_priority_classes: Mapping[str, int],
        priority_classes: Mapping[str, int],
    ) -> PriorityResolution:
        """The Workload's priority: its WorkloadPriorityClass
        label first, else its pods' PriorityClass."""


def kueue_workload_name(*, prefix: str, kind: str, group: str, name: str, uid: str) -> str:
    """Kueue's Workload naming (``GetWorkloadNameForOwnerWithGVK``): ``<prefix>-<name>``
    cut to fit, then the first 5 hex digits of SHA-1 over kind, group, name and UID."""
    digest = hashlib.sha1(
        b"\n".join([kind.encode(), group.encode(), name.encode(), uid.encode()])
    ).hexdigest()
    head = f"{prefix}-{name}"[: _MAX_NAME - 1 - _HASH_LENGTH]
    return f"{head}-{digest[:_HASH_LENGTH]}"


def workload_manifest(
    integration: Integration,
    obj: Mapping[str, Any],
    *,
    pod_sets: list[dict[str, Any]],
    priority: int,
    priority_ref: Mapping[str, str] | None,
) -> dict[str, Any]:
    """The Workload for a queued object, owned by it (the garbage collector deletes it with
    the object; ``blockOwnerDeletion`` as Kueue sets it)."""
    metadata = obj["metadata"]
    spec: dict[str, Any] = {
        "queueName": integration.queue_name(obj) or "",
        "podSets": pod_sets,
        "priority": priority,
        "active": True,
    }
    if priority_ref is not None:
        spec["priorityClassRef"] = dict(priority_ref)
    return {
        "apiVersion": f"{_KUEUE_GROUP}/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": integration.workload_name(obj),
            "namespace": metadata["namespace"],
            "labels": {JOB_UID_LABEL: metadata["uid"]},
            "ownerReferences": [
                {
                    "apiVersion": integration.api_version,
                    "kind": integration.kind,
                    "name": metadata["name"],
                    "uid": metadata["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def injections(
    workload: Mapping[str, Any], *, flavors: Mapping[str, Mapping[str, Any]]
) -> dict[str, FlavorInjection]:
    """What each admitted pod set gets: its flavors' node labels and tolerations, then each
    admission check's ``podSetUpdates`` over them (as Kueue applies them at start), and the
    topology gate when it has a topology assignment. ``flavors`` maps a ResourceFlavor's name
    to the object; a missing one adds nothing."""
    spec_counts = {
        str(ps.get("name")): int(ps.get("count", 1))
        for ps in (workload.get("spec") or {}).get("podSets") or ()
    }
    status = workload.get("status") or {}
    assignments = (status.get("admission") or {}).get("podSetAssignments") or ()
    result: dict[str, FlavorInjection] = {}
    for psa in assignments:
        name = str(psa.get("name"))
        node_labels: dict[str, str] = {}
        tolerations: list[Mapping[str, Any]] = []
        for flavor_name in sorted(set((psa.get("flavors") or {}).values())):
            fspec = (flavors.get(flavor_name) or {}).get("spec") or {}
            node_labels.update(fspec.get("nodeLabels") or {})
            for toleration in fspec.get("tolerations") or ():
                if toleration not in tolerations:
                    tolerations.append(toleration)
        updates = PodSetChanges.of(status.get("admissionChecks"), name)
        node_labels.update(updates.node_selector)
        tolerations.extend(t for t in updates.tolerations if t not in tolerations)
        result[name] = FlavorInjection(
            pod_set=name,
            count=int(psa.get("count") or 0) or spec_counts.get(name, 0),
            node_labels=node_labels,
            tolerations=tolerations,
            topology_gated=bool(psa.get("topologyAssignment")),
            labels=updates.labels,
            annotations=updates.annotations,
        )
    return result


def disabled_message(*, framework: str, kind: str) -> str:
    """The Event on a queued object whose integration is not enabled: it is left alone."""
    return (
        f"{kind} has label {QUEUE_LABEL} but the integration {framework!r} is not enabled"
        " (integrations.frameworks of the operator's --config): it is not queued or"
        f" suspended; add {framework!r} to integrations.frameworks, or remove the label"
    )
