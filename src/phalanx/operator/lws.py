"""LeaderWorkerSet integration (Kueue's ``leaderworkerset.x-k8s.io/leaderworkerset``), as pure
functions over API dicts.

A LeaderWorkerSet serves: each of its ``spec.replicas`` groups is a leader pod and ``size - 1``
workers that run until the group is scaled away. It cannot be suspended, so, as in Kueue, it is
admitted per group, through its pods:

- the mutating webhook puts the queue label and the annotations
  ``kueue.x-k8s.io/pod-suspending-parent`` and ``kueue.x-k8s.io/pod-group-serving`` on its
  leader and worker templates; the pods its StatefulSets make carry them, and the pod webhook
  creates every such pod gated (``kueue.x-k8s.io/admission``);
- one Workload per group index, named ``leaderworkerset-<name>-<index>-<hash>``, owned by the
  LeaderWorkerSet, with the pod sets ``leader`` (1) and ``worker`` (size - 1), or ``main``
  (size) without a leader template;
- each pod, once the LWS pod webhook gave it its group index, is labelled into its group
  (``kueue.x-k8s.io/pod-group-name`` = the Workload's name, the prebuilt-workload label, the
  group's total count and its role ``leader``/``worker``/``main``); the pod-group controller
  ungates the group's pods on admission and deletes them on eviction, as for any pod group;
- scaling down deletes the Workloads of the groups gone; deleting the LeaderWorkerSet deletes
  the rest (owner references). A serving group's Workload never finishes.

``phalanx.operator.lwssync`` applies these rules.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from phalanx.operator import integration, jobs, pods

__all__ = [
    "API_VERSION",
    "COMPONENT_INDEX_ANNOTATION",
    "FRAMEWORK",
    "GROUP",
    "GROUP_INDEX_LABEL",
    "GROUP_SERVING_ANNOTATION",
    "KIND",
    "LEADER_NAME_ANNOTATION",
    "NAME_LABEL",
    "PLURAL",
    "PREBUILT_WORKLOAD_LABEL",
    "SUSPENDED_BY_PARENT_ANNOTATION",
    "WORKER_INDEX_LABEL",
    "PodGroupLabels",
    "desired_workloads",
    "pod_group_labels",
    "pod_sets",
    "queue_name",
    "replicas",
    "resolve_priority",
    "size",
    "suspended_by_lws",
    "template_defaults",
    "validate_lws",
    "workload_manifest",
    "workload_name",
]

FRAMEWORK = "leaderworkerset.x-k8s.io/leaderworkerset"
GROUP = "leaderworkerset.x-k8s.io"
API_VERSION = f"{GROUP}/v1"
KIND = "LeaderWorkerSet"
PLURAL = "leaderworkersets"

NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
"""The LWS controller puts it on every StatefulSet and pod of the set."""
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LEADER_NAME_ANNOTATION = "leaderworkerset.sigs.k8s.io/leader-name"
"""On worker pods only: the name of their group's leader."""
_LWS_PREFIX = "leaderworkerset.sigs.k8s.io"

SUSPENDED_BY_PARENT_ANNOTATION = pods.SUSPENDING_PARENT_ANNOTATION
GROUP_SERVING_ANNOTATION = pods.SERVING_ANNOTATION
PREBUILT_WORKLOAD_LABEL = pods.PREBUILT_WORKLOAD_LABEL
COMPONENT_INDEX_ANNOTATION = "kueue.x-k8s.io/component-workload-index"
_OWNER_GVK_ANNOTATION = "kueue.x-k8s.io/job-owner-gvk"
_OWNER_NAME_ANNOTATION = "kueue.x-k8s.io/job-owner-name"
_PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"

LEADER = "leader"
WORKER = "worker"
MAIN = "main"
"""Kueue's default pod set name: the only one of a LeaderWorkerSet without a leader template."""


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def _lwt(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _spec(obj).get("leaderWorkerTemplate") or {}


def queue_name(obj: Mapping[str, Any]) -> str | None:
    value = ((obj.get("metadata") or {}).get("labels") or {}).get(integration.QUEUE_LABEL)
    return str(value) if value else None


def replicas(obj: Mapping[str, Any]) -> int:
    """``spec.replicas``, 1 when unset (the API's default)."""
    value = _spec(obj).get("replicas")
    return 1 if value is None else int(value)


def size(obj: Mapping[str, Any]) -> int:
    """``spec.leaderWorkerTemplate.size``: pods per group, leader included; 1 when unset."""
    value = _lwt(obj).get("size")
    return 1 if value is None else int(value)


def workload_name(name: str, uid: str, index: int) -> str:
    """Kueue's name for a group's Workload: ``leaderworkerset-<name>-<index>-<hash>``, the
    hash over the kind, group, ``<name>-<index>`` and the LeaderWorkerSet's UID."""
    return integration.kueue_workload_name(
        prefix="leaderworkerset", kind=KIND, group=GROUP, name=f"{name}-{index}", uid=uid
    )


def desired_workloads(obj: Mapping[str, Any]) -> dict[str, int]:
    """The Workload each group should have, by name, with its group index."""
    metadata = obj.get("metadata") or {}
    name, uid = str(metadata.get("name")), str(metadata.get("uid"))
    return {workload_name(name, uid, i): i for i in range(max(replicas(obj), 0))}


def _drop_lws_keys(values: Mapping[str, Any] | None) -> dict[str, Any]:
    """Kueue drops the LWS controller's own keys from a pod set's template (they differ per
    group and pod), all but the set's name."""
    return {
        k: v for k, v in (values or {}).items() if not k.startswith(_LWS_PREFIX) or k == NAME_LABEL
    }


def _pod_set(
    name: str, count: int, template: Mapping[str, Any], *, pod_index_label: str | None
) -> dict[str, Any]:
    metadata = template.get("metadata") or {}
    clean: dict[str, Any] = {"spec": copy.deepcopy(dict(template.get("spec") or {}))}
    labels = _drop_lws_keys(metadata.get("labels"))
    annotations = _drop_lws_keys(metadata.get("annotations"))
    if labels or annotations:
        clean["metadata"] = {
            **({"labels": labels} if labels else {}),
            **({"annotations": annotations} if annotations else {}),
        }
    pod_set: dict[str, Any] = {"name": name, "count": count, "template": clean}
    topology = jobs.topology_request(metadata.get("annotations") or {}, count)
    if topology:
        # The leader is one pod: no index to place by; workers by their worker index.
        topology.pop("podIndexLabel", None)
        if pod_index_label is not None:
            topology["podIndexLabel"] = pod_index_label
        pod_set["topologyRequest"] = topology
    return pod_set


def pod_sets(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One group's pod sets: ``leader`` (1) and ``worker`` (size - 1) with a leader template,
    else ``main`` (size), each with its template's topology request (workers indexed by
    ``leaderworkerset.sigs.k8s.io/worker-index``)."""
    lwt = _lwt(obj)
    count = size(obj)
    result = []
    worker_name = MAIN
    leader = lwt.get("leaderTemplate")
    if leader is not None:
        worker_name = WORKER
        count -= 1
        result.append(_pod_set(LEADER, 1, leader, pod_index_label=None))
    worker = lwt.get("workerTemplate") or {}
    result.append(_pod_set(worker_name, count, worker, pod_index_label=WORKER_INDEX_LABEL))
    return result


def resolve_priority(
    obj: Mapping[str, Any],
    *,
    workload_priority_classes: Mapping[str, int],
    priority_classes: Mapping[str, int],
) -> jobs.PriorityResolution:
    """The WorkloadPriorityClass label first, else the PriorityClass of the first template
    naming one (leader, then worker: the pod sets' order)."""
    lwt = _lwt(obj)
    templates = [t for t in (lwt.get("leaderTemplate"), lwt.get("workerTemplate")) if t]
    return jobs.resolve_priority_of_templates(
        obj,
        templates,
        workload_priority_classes=workload_priority_classes,
        priority_classes=priority_classes,
    )


def workload_manifest(
    obj: Mapping[str, Any],
    *,
    index: int,
    priority: int,
    priority_ref: Mapping[str, str] | None,
) -> dict[str, Any]:
    """Group ``index``'s Workload: a group Workload (``kueue.x-k8s.io/is-group-workload``)
    owned by the LeaderWorkerSet, so the garbage collector deletes it with the set."""
    metadata = obj["metadata"]
    name = workload_name(str(metadata["name"]), str(metadata["uid"]), index)
    spec: dict[str, Any] = {
        "queueName": queue_name(obj) or "",
        "podSets": pod_sets(obj),
        "priority": priority,
        "active": True,
    }
    if priority_ref is not None:
        spec["priorityClassRef"] = dict(priority_ref)
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": metadata["namespace"],
            "labels": {integration.JOB_UID_LABEL: metadata["uid"]},
            "annotations": {
                pods.IS_GROUP_WORKLOAD_ANNOTATION: "true",
                _OWNER_GVK_ANNOTATION: f"{GROUP}/v1, Kind={KIND}",
                _OWNER_NAME_ANNOTATION: metadata["name"],
                COMPONENT_INDEX_ANNOTATION: str(index),
            },
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": KIND,
                    "name": metadata["name"],
                    "uid": metadata["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def template_defaults(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the mutating webhook merges into a queued LeaderWorkerSet: on each of its pod
    templates the queue label (and the WorkloadPriorityClass label), the annotation naming
    this integration as the pods' suspending parent, and the serving-group annotation."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    template_labels = {integration.QUEUE_LABEL: queue_name(obj) or ""}
    if labels.get(_PRIORITY_CLASS_LABEL):
        template_labels[_PRIORITY_CLASS_LABEL] = str(labels[_PRIORITY_CLASS_LABEL])
    meta = {
        "metadata": {
            "labels": template_labels,
            "annotations": {
                SUSPENDED_BY_PARENT_ANNOTATION: FRAMEWORK,
                GROUP_SERVING_ANNOTATION: "true",
            },
        }
    }
    lwt: dict[str, Any] = {"workerTemplate": copy.deepcopy(meta)}
    if _lwt(obj).get("leaderTemplate") is not None:
        lwt["leaderTemplate"] = copy.deepcopy(meta)
    return {"spec": {"leaderWorkerTemplate": lwt}}


def suspended_by_lws(pod: Mapping[str, Any]) -> bool:
    """A pod of a queued LeaderWorkerSet (its template carried this integration's mark)."""
    return pods.suspending_parent(pod) == FRAMEWORK


@dataclass(frozen=True)
class PodGroupLabels:
    """What a gated LWS pod gets to join its group's pod group."""

    labels: dict[str, str]
    annotations: dict[str, str]


def pod_group_labels(obj: Mapping[str, Any], pod: Mapping[str, Any]) -> PodGroupLabels | None:
    """The labels and annotations that put an LWS pod into its group (Kueue's ``setDefault``
    of the LWS reconciler): the group's Workload as its pod group and prebuilt Workload, the
    group's total count and its role as pod set. None while the pod has no group index yet
    (the LWS pod webhook sets it) or already has its group."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    index = labels.get(GROUP_INDEX_LABEL)
    if index is None or labels.get(pods.GROUP_NAME_LABEL):
        return None
    lws_meta = obj.get("metadata") or {}
    name = workload_name(str(lws_meta.get("name")), str(lws_meta.get("uid")), int(index))
    if _lwt(obj).get("leaderTemplate") is None:
        role = MAIN
    else:
        role = WORKER if LEADER_NAME_ANNOTATION in annotations else LEADER
    new_labels = {
        **labels,
        pods.MANAGED_LABEL: "true",
        pods.GROUP_NAME_LABEL: name,
        PREBUILT_WORKLOAD_LABEL: name,
    }
    queue = queue_name(obj)
    if queue:
        new_labels[integration.QUEUE_LABEL] = queue
    return PodGroupLabels(
        labels=new_labels,
        annotations={
            **annotations,
            pods.GROUP_TOTAL_COUNT_ANNOTATION: str(size(obj)),
            pods.ROLE_HASH_ANNOTATION: role,
        },
    )


def validate_lws(obj: Mapping[str, Any], *, old: Mapping[str, Any] | None) -> list[str]:
    """Kueue's checks of a queued LeaderWorkerSet: replicas not negative; the queue name may
    change only while no group is ready, and not be removed."""
    errors = []
    if replicas(obj) < 0:
        errors.append(f"spec.replicas: {replicas(obj)} must be >= 0")
    if old is not None:
        before, after = queue_name(old), queue_name(obj)
        ready = int((old.get("status") or {}).get("readyReplicas") or 0)
        if before != after and (ready > 0 or not after):
            errors.append(
                f"metadata.labels[{integration.QUEUE_LABEL}]: field is immutable once a group"
                f" is ready or when removed ({before!r} -> {after!r}); delete and recreate the"
                " LeaderWorkerSet to move it to another queue"
            )
    return errors
