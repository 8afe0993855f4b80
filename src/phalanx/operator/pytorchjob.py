"""Kubeflow PyTorchJob integration (Kueue's ``kubeflow.org/pytorchjob``), as pure functions
over API dicts.

A PyTorchJob (``kubeflow.org/v1``, run by the Kubeflow training-operator) labelled
``kueue.x-k8s.io/queue-name`` is held at creation (``spec.runPolicy.suspend``, mutating
webhook) and represented by one Workload with one pod set per replica type, in Kueue's order
``master`` then ``worker`` (the replica type lower-cased; a type the job does not have is left
out): ``count`` = the type's ``replicas`` (default 1), its pod template. Admission injects each
pod set's flavors into its replica type's pod template and sets ``runPolicy.suspend: false``;
the training-operator then makes the pods from those templates. Eviction sets
``runPolicy.suspend: true`` (the training-operator deletes the pods) and puts back the
templates the Workload recorded. The job's ``Succeeded`` or ``Failed`` condition finishes the
Workload; its ``Running`` condition is Kueue's PodsReady. :data:`PYTORCHJOB` is the adapter;
``phalanx.operator.kindsync`` applies it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from phalanx.operator import integration, jobs, templates
from phalanx.operator.integration import Finish, FlavorInjection, finish_from_conditions

__all__ = [
    "API_VERSION",
    "FRAMEWORK",
    "GROUP",
    "JOB_NAME_LABEL",
    "KIND",
    "PYTORCHJOB",
    "REPLICA_INDEX_LABEL",
    "REPLICA_TYPES",
    "InvalidPyTorchJob",
    "PyTorchJobIntegration",
    "needs_workload",
    "pod_sets",
    "pods_ready",
    "pytorchjob_finish",
    "resolve_priority",
    "workload_name",
]

FRAMEWORK = "kubeflow.org/pytorchjob"
GROUP = "kubeflow.org"
API_VERSION = f"{GROUP}/v1"
KIND = "PyTorchJob"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
"""The training-operator puts it on every pod it makes for the job."""
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
"""Each pod's index within its replica type: the pod index of a topology request."""
REPLICA_TYPES = ("Master", "Worker")
"""The replica types, in the order of the Workload's pod sets (Kueue's
``OrderedReplicaTypes``)."""
_SPECS = "pytorchReplicaSpecs"


class InvalidPyTorchJob(ValueError):
    """The PyTorchJob cannot be represented by a Workload; the message names the field and
    the fix."""


def workload_name(name: str, uid: str) -> str:
    """Kueue's name for a PyTorchJob's Workload: ``pytorchjob-<name>-<hash>``."""
    return integration.kueue_workload_name(
        prefix="pytorchjob", kind=KIND, group=GROUP, name=name, uid=uid
    )


def _replica_specs(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The job's replica specs of the known types, in pod-set order."""
    specs = (obj.get("spec") or {}).get(_SPECS) or {}
    return {rtype: specs[rtype] or {} for rtype in REPLICA_TYPES if rtype in specs}


def _template(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    return spec.get("template") or {}


def _replicas(spec: Mapping[str, Any]) -> int:
    replicas = spec.get("replicas")
    return 1 if replicas is None else int(replicas)


def _pod_set_name(replica_type: str) -> str:
    return replica_type.lower()


def pod_sets(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One pod set per replica type (``master``, then ``worker``): ``count`` = its replicas,
    its pod template, and the topology request of the template's Kueue annotations (pods
    indexed by ``training.kubeflow.org/replica-index``). Raises :class:`InvalidPyTorchJob`
    when the job has neither a Master nor a Worker."""
    specs = _replica_specs(obj)
    if not specs:
        raise InvalidPyTorchJob(
            f"spec.{_SPECS}: neither Master nor Worker; a PyTorchJob needs at least one of them"
        )
    result: list[dict[str, Any]] = []
    for rtype, spec in specs.items():
        template = copy.deepcopy(dict(_template(spec)))
        count = _replicas(spec)
        pod_set: dict[str, Any] = {"name": _pod_set_name(rtype), "count": count}
        pod_set["template"] = template
        annotations = (template.get("metadata") or {}).get("annotations") or {}
        topology = jobs.topology_request(annotations, count)
        if topology:
            pod_set["topologyRequest"] = {**topology, "podIndexLabel": REPLICA_INDEX_LABEL}
        result.append(pod_set)
    return result


def resolve_priority(
    obj: Mapping[str, Any],
    *,
    workload_priority_classes: Mapping[str, int],
    priority_classes: Mapping[str, int],
) -> jobs.PriorityResolution:
    """The WorkloadPriorityClass label first, else ``runPolicy.schedulingPolicy
    .priorityClass``, else the PriorityClass of the first replica type's template that names
    one (Master before Worker), as Kueue's ``PriorityClass`` reads them."""
    run_policy = (obj.get("spec") or {}).get("runPolicy") or {}
    scheduling_class = (run_policy.get("schedulingPolicy") or {}).get("priorityClass")
    templates: list[Mapping[str, Any]] = []
    if scheduling_class:
        templates.append({"spec": {"priorityClassName": scheduling_class}})
    templates.extend(_template(spec) for spec in _replica_specs(obj).values())
    return jobs.resolve_priority_of_templates(
        obj,
        templates,
        workload_priority_classes=workload_priority_classes,
        priority_classes=priority_classes,
    )


def pytorchjob_finish(obj: Mapping[str, Any]) -> Finish | None:
    """The job's end: its ``Succeeded`` or ``Failed`` condition, once true."""
    return finish_from_conditions(
        obj,
        succeeded="Succeeded",
        failed="Failed",
        kind=KIND,
        success_message="PyTorchJob succeeded",
    )


def needs_workload(obj: Mapping[str, Any]) -> bool:
    """A queued PyTorchJob without a Workload gets one unless it is being deleted or ended."""
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return pytorchjob_finish(obj) is None


def pods_ready(obj: Mapping[str, Any]) -> bool:
    """Kueue's PodsReady for a PyTorchJob: its ``Running`` condition is true."""
    return any(
        c.get("type") == "Running" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or ()
    )


def _suspend_ops(obj: Mapping[str, Any], value: bool) -> list[dict[str, Any]]:
    # runPolicy may be absent from a submitted job: then it is added whole.
    if "runPolicy" in (obj.get("spec") or {}):
        return [{"op": "add", "path": "/spec/runPolicy/suspend", "value": value}]
    return [{"op": "add", "path": "/spec/runPolicy", "value": {"suspend": value}}]


def _template_path(replica_type: str) -> str:
    return f"/spec/{_SPECS}/{replica_type}/template"


def _guard(replica_type: str, spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    # The patch is computed for this many replicas: the test refuses it if the job has been
    # resized since it was read. An absent count (1) cannot be tested and is not guarded.
    if "replicas" not in spec:
        return []
    path = f"/spec/{_SPECS}/{replica_type}/replicas"
    return [{"op": "test", "path": path, "value": spec["replicas"]}]


class PyTorchJobIntegration:
    """PyTorchJob on the integration framework: ``spec.runPolicy.suspend`` holds it, each
    replica type is a pod set named after it in lower case."""

    framework = FRAMEWORK
    api_version = API_VERSION
    kind = KIND
    plural = "pytorchjobs"
    pod_owner_label = JOB_NAME_LABEL

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
        return jobs.queue_name(obj)

    def workload_name(self, obj: Mapping[str, Any]) -> str:
        metadata = obj["metadata"]
        return workload_name(metadata["name"], metadata["uid"])

    def pod_sets(self, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        return pod_sets(obj)

    def suspended(self, obj: Mapping[str, Any]) -> bool:
        run_policy = (obj.get("spec") or {}).get("runPolicy") or {}
        return bool(run_policy.get("suspend"))

    def suspend_patch(self, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        return _suspend_ops(obj, True)

    def start_patch(
        self,
        obj: Mapping[str, Any],
        *,
        workload_name: str,
        injections: Mapping[str, FlavorInjection],
    ) -> list[dict[str, Any]]:
        """Every replica type's template gets its pod set's admission, then the job is
        unsuspended; nothing (an empty patch) unless every replica type was admitted: a
        PyTorchJob starts whole or not at all."""
        specs = _replica_specs(obj)
        if not specs or any(_pod_set_name(t) not in injections for t in specs):
            return []
        ops: list[dict[str, Any]] = []
        for rtype, spec in specs.items():
            ops.extend(_guard(rtype, spec))
            ops.extend(
                templates.inject(
                    _template(spec),
                    _template_path(rtype),
                    workload_name=workload_name,
                    injection=injections[_pod_set_name(rtype)],
                )
            )
        ops.extend(_suspend_ops(obj, False))
        return ops

    def restore_patch(
        self, obj: Mapping[str, Any], *, pod_sets: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        """Suspend, and put back each replica type's template as its pod set recorded it (a
        replica type the Workload has no pod set for is left as it is)."""
        recorded = {str(p.get("name")): p.get("template") or {} for p in pod_sets}
        ops = _suspend_ops(obj, True)
        for rtype, spec in _replica_specs(obj).items():
            name = _pod_set_name(rtype)
            if name in recorded:
                ops.extend(_guard(rtype, spec))
                ops.extend(
                    templates.restore(recorded[name], _template(spec), _template_path(rtype))
                )
        return ops

    def injected(self, obj: Mapping[str, Any]) -> bool:
        return any(
            jobs.WORKLOAD_ANNOTATION
            in ((_template(spec).get("metadata") or {}).get("annotations") or {})
            for spec in _replica_specs(obj).values()
        )

    def finished(self, obj: Mapping[str, Any]) -> Finish | None:
        return pytorchjob_finish(obj)


PYTORCHJOB = PyTorchJobIntegration()
"""The PyTorchJob integration (its adapter holds no state)."""
