"""RayCluster integration (Kueue's ``ray.io/raycluster``), as pure functions over API dicts.

A RayCluster (KubeRay, ``ray.io/v1``) labelled ``kueue.x-k8s.io/queue-name`` is suspended at
creation (``spec.suspend``) and represented by one Workload with the pod sets ``head`` and one
per worker group, as a RayJob's cluster (``phalanx.operator.rayjob``). Admission injects each
pod set's flavors into its template and sets ``spec.suspend: false``: KubeRay creates the
pods. Eviction sets ``spec.suspend: true`` (KubeRay deletes the pods) and puts the templates
back. KubeRay labels every pod ``ray.io/cluster: <the RayCluster's name>``.

A RayCluster never finishes (Kueue's rule: a cluster serves until it is deleted; deleting it
deletes its Workload and frees the quota). A RayCluster a RayJob made is the RayJob's: it
carries the RayJob's labels, the queue label too, but is not queued itself.
:data:`RAYCLUSTER` is the adapter; ``phalanx.operator.kindsync`` applies it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from phalanx.operator import integration, jobs, rayjob, templates
from phalanx.operator.integration import SUSPEND_PATCH, Finish, FlavorInjection

__all__ = [
    "CLUSTER_LABEL",
    "FRAMEWORK",
    "KIND",
    "RAYCLUSTER",
    "InvalidRayCluster",
    "RayClusterIntegration",
    "owned_by_rayjob",
    "pod_sets",
    "pods_ready",
    "workload_name",
]

FRAMEWORK = "ray.io/raycluster"
KIND = "RayCluster"
CLUSTER_LABEL = "ray.io/cluster"
"""KubeRay puts it on every pod of a RayCluster, naming it."""
_READY = "ready"


class InvalidRayCluster(ValueError):
    """The RayCluster cannot be represented by a Workload; the message names the field and
    the fix."""


def workload_name(name: str, uid: str) -> str:
    """Kueue's name for a RayCluster's Workload: ``raycluster-<name>-<hash>``."""
    return integration.kueue_workload_name(
        prefix="raycluster", kind=KIND, group=rayjob.GROUP, name=name, uid=uid
    )


def owned_by_rayjob(obj: Mapping[str, Any]) -> bool:
    """Whether a RayJob made the RayCluster (its controller owner): the RayJob is queued."""
    return integration.controlled_by(obj, rayjob.KIND)


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def pod_sets(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``head``, then each worker group by its name (Kueue's ``BuildPodSets``)."""
    return rayjob.cluster_pod_sets(_spec(obj), where="spec", error=InvalidRayCluster)


def pods_ready(obj: Mapping[str, Any]) -> bool:
    """Kueue's PodsReady for a RayCluster: its state is ``ready``."""
    return (obj.get("status") or {}).get("state") == _READY


_HEAD_PATH = "/spec/headGroupSpec/template"


def _templates(obj: Mapping[str, Any]) -> Iterator[tuple[str, str, Mapping[str, Any], int | None]]:
    yield (
        rayjob.HEAD_POD_SET,
        _HEAD_PATH,
        (_spec(obj).get("headGroupSpec") or {}).get("template") or {},
        None,
    )
    for index, group in enumerate(_spec(obj).get("workerGroupSpecs") or ()):
        path = f"/spec/workerGroupSpecs/{index}/template"
        yield str(group.get("groupName")), path, group.get("template") or {}, index


def _guard(index: int, name: str) -> dict[str, Any]:
    # Worker groups are addressed by index: the test refuses the patch if the list differs.
    return {"op": "test", "path": f"/spec/workerGroupSpecs/{index}/groupName", "value": name}


class RayClusterIntegration:
    """RayCluster on the integration framework: ``spec.suspend`` holds it; its pod sets are
    the head and each worker group."""

    framework = FRAMEWORK
    api_version = rayjob.API_VERSION
    kind = KIND
    plural = "rayclusters"
    pod_owner_label = CLUSTER_LABEL

    def needs_workload(self, obj: Mapping[str, Any]) -> bool:
        return not (obj.get("metadata") or {}).get("deletionTimestamp")

    def pods_ready(self, obj: Mapping[str, Any]) -> bool:
        return pods_ready(obj)

    def resolve_priority(
        self,
        obj: Mapping[str, Any],
        *,
        workload_priority_classes: Mapping[str, int],
        priority_classes: Mapping[str, int],
    ) -> jobs.PriorityResolution:
        return jobs.resolve_priority_of_templates(
            obj,
            (t for _, _, t, _ in _templates(obj)),
            workload_priority_classes=workload_priority_classes,
            priority_classes=priority_classes,
        )

    def queue_name(self, obj: Mapping[str, Any]) -> str | None:
        """The queue label's value; None for a RayJob's RayCluster (which copies the RayJob's
        labels: the RayJob is what is queued)."""
        return None if owned_by_rayjob(obj) else jobs.queue_name(obj)

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
        """Every template gets its pod set's admission, then the RayCluster is unsuspended;
        nothing unless every pod set was admitted."""
        found = list(_templates(obj))
        if any(name not in injections for name, _, _, _ in found):
            return []
        ops: list[dict[str, Any]] = []
        for name, path, template, index in found:
            if index is not None:
                ops.append(_guard(index, name))
            ops.extend(
                templates.inject(
                    template, path, workload_name=workload_name, injection=injections[name]
                )
            )
        ops.append({"op": "add", "path": "/spec/suspend", "value": False})
        return ops

    def restore_patch(
        self, obj: Mapping[str, Any], *, pod_sets: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        """Suspend, and put back each template as its pod set recorded it."""
        recorded = {str(p.get("name")): p.get("template") or {} for p in pod_sets}
        ops: list[dict[str, Any]] = [{"op": "add", "path": "/spec/suspend", "value": True}]
        for name, path, template, index in _templates(obj):
            if name not in recorded:
                continue
            if index is not None:
                ops.append(_guard(index, name))
            ops.extend(templates.restore(recorded[name], template, path))
        return ops

    def injected(self, obj: Mapping[str, Any]) -> bool:
        return any(
            jobs.WORKLOAD_ANNOTATION in ((t.get("metadata") or {}).get("annotations") or {})
            for _, _, t, _ in _templates(obj)
        )

    def finished(self, obj: Mapping[str, Any]) -> Finish | None:
        """Never: a RayCluster serves until it is deleted (Kueue's rule)."""
        return None


RAYCLUSTER = RayClusterIntegration()
"""The RayCluster integration (its adapter holds no state)."""
