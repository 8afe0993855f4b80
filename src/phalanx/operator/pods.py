"""Plain Pods and pod groups (Kueue's ``pod`` integration), as pure functions over API dicts.

A Pod labelled ``kueue.x-k8s.io/queue-name`` is held at creation by the scheduling gate
``kueue.x-k8s.io/admission`` (the mutating webhook adds it); nothing of it runs until its
Workload is admitted and the gate is removed. Pods labelled ``kueue.x-k8s.io/pod-group-name``
with the annotation ``kueue.x-k8s.io/pod-group-total-count`` form one group and one Workload,
named after the group; the Workload is made only once the group's pods are all there, and
every gate is removed only on its admission, so a group never starts in part. A single Pod's
Workload is ``pod-<name>-<hash>``. Pods are grouped into pod sets by role (a hash of what
matters to admission: requests, node selector, affinity, tolerations, ...), as Kueue does.

A Pod cannot be suspended again: an evicted group's pods are deleted (Kueue's ``Stop``).
``phalanx.operator.podsync`` applies these rules.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from phalanx.operator import integration
from phalanx.operator.integration import Finish, FlavorInjection

__all__ = [
    "ADMISSION_GATE",
    "GROUP_NAME_LABEL",
    "GROUP_TOTAL_COUNT_ANNOTATION",
    "IS_GROUP_WORKLOAD_ANNOTATION",
    "MANAGED_LABEL",
    "PREBUILT_WORKLOAD_LABEL",
    "ROLE_HASH_ANNOTATION",
    "SERVING_ANNOTATION",
    "SUSPENDING_PARENT_ANNOTATION",
    "Group",
    "InvalidPodGroup",
    "admission_defaults",
    "gated",
    "group_finish",
    "group_of",
    "group_pod_sets",
    "owned_by_controller",
    "pod_set_of",
    "prebuilt",
    "role_hash",
    "serving",
    "start_patch",
    "suspending_parent",
    "terminal",
    "total_count",
    "workload_for_group",
    "workload_name",
]

ADMISSION_GATE = "kueue.x-k8s.io/admission"
GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
GROUP_TOTAL_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
ROLE_HASH_ANNOTATION = "kueue.x-k8s.io/role-hash"
IS_GROUP_WORKLOAD_ANNOTATION = "kueue.x-k8s.io/is-group-workload"
MANAGED_LABEL = "kueue.x-k8s.io/managed"
SUSPENDING_PARENT_ANNOTATION = "kueue.x-k8s.io/pod-suspending-parent"
"""On the pods of a parent that cannot be suspended (a LeaderWorkerSet): the parent's
framework, which queues them as pod groups it names."""
SERVING_ANNOTATION = "kueue.x-k8s.io/pod-group-serving"
"""A serving group's pods run until removed: its Workload never finishes."""
PREBUILT_WORKLOAD_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
"""The group's Workload is made by the parent's controller, not from the pods."""
_TOPOLOGY_GATE = "kueue.x-k8s.io/topology"
_PODSET_LABEL = "kueue.x-k8s.io/podset"
_SINGLE_POD_SET = "main"


class InvalidPodGroup(ValueError):
    """The group's pods disagree or are incomplete; the message says which and what to do."""


@dataclass(frozen=True)
class Group:
    """Where a queued Pod belongs: a named group, or itself alone (``name`` is the Pod's)."""

    namespace: str
    name: str
    is_group: bool
    parent: str | None = None
    """The framework of the parent that suspends the pods (None: the ``pod`` framework's)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def owned_by_controller(pod: Mapping[str, Any]) -> bool:
    """Whether a controller (a Job, a ReplicaSet, ...) made the Pod: its owner is queued, or
    not, as a whole, so the pod integration leaves it alone (a Job's pods may carry the
    queue label from its template)."""
    owners = (pod.get("metadata") or {}).get("ownerReferences") or ()
    return any(o.get("controller") for o in owners)


def suspending_parent(pod: Mapping[str, Any]) -> str | None:
    """The framework whose parent object suspends the Pod (a LeaderWorkerSet's pods)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(SUSPENDING_PARENT_ANNOTATION)
    return str(value) if value else None


def serving(pods: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the group serves (its pods never finish as a group)."""
    return any(
        ((p.get("metadata") or {}).get("annotations") or {}).get(SERVING_ANNOTATION) == "true"
        for p in pods
    )


def prebuilt(pods: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the group's Workload is made by its parent's controller."""
    return any(
        ((p.get("metadata") or {}).get("labels") or {}).get(PREBUILT_WORKLOAD_LABEL) for p in pods
    )


def group_of(pod: Mapping[str, Any]) -> Group | None:
    """The queued Pod's group; None for a Pod without a queue name, or made by a controller
    (not the pod integration's) unless a suspending parent put it into a named group."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if not labels.get(integration.QUEUE_LABEL):
        return None
    parent = suspending_parent(pod)
    if parent is not None:
        # Its parent's controller names its group; until then it is no group's.
        name = labels.get(GROUP_NAME_LABEL)
        namespace = str(metadata.get("namespace"))
        return Group(namespace, str(name), is_group=True, parent=parent) if name else None
    if owned_by_controller(pod):
        return None
    group = labels.get(GROUP_NAME_LABEL)
    if group:
        return Group(str(metadata.get("namespace")), str(group), is_group=True)
    return Group(str(metadata.get("namespace")), str(metadata.get("name")), is_group=False)


def role_hash(pod_spec: Mapping[str, Any]) -> str:
    """The first 8 hex digits of SHA-256 over the Pod's shape for admission: what decides
    which quota and nodes it needs (Kueue's role hash, over the same fields)."""

    def containers(items: Iterable[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
        if not items:
            return None
        return [
            {
                "ports": c.get("ports"),
                "resources": {"requests": (c.get("resources") or {}).get("requests")},
            }
            for c in items
        ]

    shape: dict[str, Any] = {
        "affinity": pod_spec.get("affinity"),
        "containers": containers(pod_spec.get("containers")),
        "initContainers": containers(pod_spec.get("initContainers")),
        "nodeSelector": pod_spec.get("nodeSelector"),
        "overhead": pod_spec.get("overhead"),
        "priority": pod_spec.get("priority"),
        "resourceClaims": pod_spec.get("resourceClaims"),
        "runtimeClassName": pod_spec.get("runtimeClassName"),
        "tolerations": pod_spec.get("tolerations"),
        "topologySpreadConstraints": pod_spec.get("topologySpreadConstraints"),
    }
    if pod_spec.get("resources") is not None:
        shape["resources"] = (pod_spec.get("resources") or {}).get("requests")
    text = json.dumps({"spec": shape}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _role(pod: Mapping[str, Any]) -> str:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(ROLE_HASH_ANNOTATION) or role_hash(pod.get("spec") or {}))


def admission_defaults(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the mutating webhook adds to a queued Pod at creation: the admission gate (and the
    topology gate, removed at start unless the admission has a topology assignment), the
    managed label and the role hash. Returns the new ``metadata``/``spec`` parts to merge."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    gates = list(spec.get("schedulingGates") or [])
    for name in (ADMISSION_GATE, _TOPOLOGY_GATE):
        if not any(g.get("name") == name for g in gates):
            gates.append({"name": name})
    return {
        "labels": {**(metadata.get("labels") or {}), MANAGED_LABEL: "true"},
        "annotations": {
            **(metadata.get("annotations") or {}),
            ROLE_HASH_ANNOTATION: role_hash(spec),
        },
        "schedulingGates": gates,
    }


def gated(pod: Mapping[str, Any]) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or ()
    return any(g.get("name") == ADMISSION_GATE for g in gates)


def terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def total_count(pods: Sequence[Mapping[str, Any]]) -> int:
    """The group's ``kueue.x-k8s.io/pod-group-total-count``, which every pod must agree on."""
    counts: set[str] = set()
    for pod in pods:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        counts.add(str(annotations.get(GROUP_TOTAL_COUNT_ANNOTATION, "")))
    if len(counts) != 1:
        raise InvalidPodGroup(
            f"annotation {GROUP_TOTAL_COUNT_ANNOTATION} differs between the group's pods"
            f" ({', '.join(sorted(counts))}); give every pod the same value"
        )
    (text,) = counts
    try:
        value = int(text)
    except ValueError:
        raise InvalidPodGroup(
            f"annotation {GROUP_TOTAL_COUNT_ANNOTATION}: {text!r} is not an integer; set the"
            " number of pods in the group"
        ) from None
    if value < 1:
        raise InvalidPodGroup(
            f"annotation {GROUP_TOTAL_COUNT_ANNOTATION}: {value} must be greater than zero"
        )
    return value


def group_pod_sets(group: Group, pods: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The Workload's pod sets: one ``main`` of count 1 for a single Pod; for a group, one
    per role (named by the role hash, sorted), counting the group's runnable pods.

    Raises :class:`InvalidPodGroup` while the group has fewer runnable pods than its total
    count (Kueue makes no Workload then: admitting part of it would start a partial gang),
    or when its pods disagree on the queue or the total count."""
    live = [p for p in pods if not terminal(p)]
    if not group.is_group:
        (pod,) = pods
        return [{"name": _SINGLE_POD_SET, "count": 1, "template": _template(pod)}]
    total = total_count(live or pods)
    queues = {_queue(p) for p in live}
    if len(queues) > 1:
        raise InvalidPodGroup(
            f"the pods of group {group.name!r} name different queues"
            f" ({', '.join(sorted(q or '' for q in queues))}); label them all with one"
        )
    if len(live) < total:
        raise InvalidPodGroup(
            f"'{group.name}' group has fewer runnable pods than expected ({len(live)} of"
            f" {total}); it is queued once all its pods exist"
        )
    by_role: dict[str, dict[str, Any]] = {}
    for pod in sorted(live, key=lambda p: str(p["metadata"]["name"]))[:total]:
        role = _role(pod)
        if role in by_role:
            by_role[role]["count"] += 1
        else:
            by_role[role] = {"name": role, "count": 1, "template": _template(pod)}
    return [by_role[name] for name in sorted(by_role)]


def _queue(pod: Mapping[str, Any]) -> str | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    value = labels.get(integration.QUEUE_LABEL)
    return str(value) if value else None


def _template(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod set's template: the Pod's spec, as Kueue copies it (no metadata)."""
    return {"spec": copy.deepcopy(dict(pod.get("spec") or {}))}


def workload_name(group: Group, pods: Sequence[Mapping[str, Any]]) -> str:
    """A group's Workload is named after the group; a single Pod's is ``pod-<name>-<hash>``
    (Kueue's naming over kind ``Pod`` of the core group, name and UID)."""
    if group.is_group:
        return group.name
    (pod,) = pods
    return integration.kueue_workload_name(
        prefix="pod", kind="Pod", group="", name=group.name, uid=str(pod["metadata"]["uid"])
    )


def workload_for_group(
    group: Group,
    pods: Sequence[Mapping[str, Any]],
    *,
    priority: int,
    priority_ref: Mapping[str, str] | None,
) -> dict[str, Any]:
    """The Workload of a complete group (or a single Pod), owned by each of its pods: the
    garbage collector deletes it with the last of them."""
    live = [p for p in pods if not terminal(p)] if group.is_group else list(pods)
    pod_sets = group_pod_sets(group, live)
    spec: dict[str, Any] = {
        "queueName": _queue(live[0]) or "",
        "podSets": pod_sets,
        "priority": priority,
        "active": True,
    }
    if priority_ref is not None:
        spec["priorityClassRef"] = dict(priority_ref)
    metadata: dict[str, Any] = {
        "name": workload_name(group, live),
        "namespace": group.namespace,
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": p["metadata"]["name"],
                "uid": p["metadata"]["uid"],
                **({} if group.is_group else {"controller": True}),
            }
            for p in sorted(live, key=lambda p: str(p["metadata"]["name"]))
        ],
    }
    if group.is_group:
        metadata["annotations"] = {IS_GROUP_WORKLOAD_ANNOTATION: "true"}
    else:
        metadata["labels"] = {integration.JOB_UID_LABEL: live[0]["metadata"]["uid"]}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": metadata,
        "spec": spec,
    }


def pod_set_of(pod: Mapping[str, Any], group: Group) -> str:
    """Which pod set of its Workload the Pod belongs to."""
    return _role(pod) if group.is_group else _SINGLE_POD_SET


def start_patch(
    pod: Mapping[str, Any], *, workload_name: str, injection: FlavorInjection
) -> list[dict[str, Any]]:
    """A JSON patch that gives a gated Pod its admission (node selector and tolerations of
    the flavors and checks, the pod set label and the workload annotation) and removes the
    admission gate; the topology gate stays only for a topology assignment (the gate remover
    then places the Pod). A gated Pod's node selector may be added to, its gates removed."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    tolerations = list(spec.get("tolerations") or [])
    for toleration in injection.tolerations:
        if toleration not in tolerations:
            tolerations.append(dict(toleration))
    drop = {ADMISSION_GATE} if injection.topology_gated else {ADMISSION_GATE, _TOPOLOGY_GATE}
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") not in drop]
    labels = {**(metadata.get("labels") or {}), **injection.labels}
    labels[_PODSET_LABEL] = injection.pod_set
    annotations = {**(metadata.get("annotations") or {}), **injection.annotations}
    annotations["kueue.x-k8s.io/workload"] = workload_name
    return [
        {"op": "test", "path": "/metadata/uid", "value": metadata.get("uid")},
        {"op": "add", "path": "/metadata/labels", "value": labels},
        {"op": "add", "path": "/metadata/annotations", "value": annotations},
        {
            "op": "add",
            "path": "/spec/nodeSelector",
            "value": {**(spec.get("nodeSelector") or {}), **injection.node_labels},
        },
        {"op": "add", "path": "/spec/tolerations", "value": tolerations},
        {"op": "add", "path": "/spec/schedulingGates", "value": gates},
    ]


def group_finish(group: Group, pods: Sequence[Mapping[str, Any]], *, total: int) -> Finish | None:
    """The end of a group once every pod is terminal: Succeeded when ``total`` pods
    succeeded (Kueue's "Pods succeeded: n/m."), Failed otherwise. A single Pod ends with
    its phase and message."""
    if not pods or not all(terminal(p) for p in pods):
        return None
    if not group.is_group:
        (pod,) = pods
        status = pod.get("status") or {}
        succeeded = status.get("phase") == "Succeeded"
        message = str(status.get("message") or ("Pod succeeded" if succeeded else "Pod failed"))
        return Finish(succeeded, "Succeeded" if succeeded else "Failed", message)
    done = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Succeeded")
    message = f"Pods succeeded: {done}/{total}."
    if done >= total:
        return Finish(True, "Succeeded", message)
    return Finish(False, "Failed", message)
