"""The ``kueue.x-k8s.io/resource-in-use`` finalizer on ClusterQueues and ResourceFlavors,
as Kueue keeps it.

A ClusterQueue deleted while Workloads still hold its quota must stay until they are gone;
kept only in memory, that "terminating" state would be lost by a restart (the object would
vanish from the API and the restored Workloads become orphans). So every live ClusterQueue
carries the finalizer, and the leader removes it from a deleted one once the core no longer
has the queue (no admitted Workload and no victim still being evicted holds quota in it).

A ResourceFlavor is held the same way while it is in use. Kueue's rule (its ResourceFlavor
controller asks the cache for the ClusterQueues using the flavor) is that a ClusterQueue,
terminating ones included, names it in ``spec.resourceGroups``; since a ClusterQueue with
admitted Workloads is itself held, that covers them. Phalanx also holds a flavor that an
admitted, unfinished Workload's ``status.admission`` names after its ClusterQueue dropped it
from its spec: those pods run with the flavor's node labels and their quota is counted in it.

Workloads: Phalanx creates its Workloads without the finalizer, but Kueue creates every
Workload of a Job with it and removes it itself once the Workload is finished or being
deleted. A cluster taken over from Kueue (docs/install.md, "Upgrading from Kueue") has such
Workloads, and so may a Workload a user wrote by hand: the leader removes the finalizer from
one that is finished or being deleted, as Kueue would, so a deleted Job's Workload goes away
and its quota returns instead of staying held by a finalizer nobody serves. Only Workloads
that carry it are looked at (a change feed keeps the list), not every Workload per pass.

Only the scheduling loop calls :meth:`ResourceInUseFinalizers.reconcile`, between cycles, with
the core's current view; the patches run as tasks and a failed one is retried on a later pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from phalanx.operator import conditions as cond
from phalanx.operator.kube import (
    CLUSTER_QUEUES,
    JSON_PATCH,
    KUEUE,
    TRANSIENT_ERRORS,
    WORKLOADS,
    ApiError,
    KubeApi,
    Resource,
)
from phalanx.operator.state import ClusterState

__all__ = [
    "RESOURCE_FLAVORS",
    "RESOURCE_IN_USE",
    "ResourceInUseFinalizers",
    "finalizer_patch",
    "flavors_in_use",
]

logger = logging.getLogger(__name__)

RESOURCE_IN_USE = "kueue.x-k8s.io/resource-in-use"
RESOURCE_FLAVORS = Resource(KUEUE, "v1beta2", "resourceflavors", namespaced=False)
_RESOURCES = {
    "ClusterQueue": CLUSTER_QUEUES,
    "ResourceFlavor": RESOURCE_FLAVORS,
    "Workload": WORKLOADS,
}


def finalizer_patch(obj: Mapping[str, Any], *, keep: bool) -> list[dict[str, Any]] | None:
    """A JSON patch that adds (``keep``) or removes the finalizer, guarded by the object's
    resourceVersion so it never applies to a version it was not computed from; None when
    there is nothing to do."""
    metadata = obj.get("metadata") or {}
    finalizers = metadata.get("finalizers") or ()
    # Checked first, before anything is built: every cycle asks this of every ClusterQueue
    # and ResourceFlavor, and nearly always there is nothing to do.
    if (RESOURCE_IN_USE in finalizers) is keep:
        return None
    guard = {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": metadata.get("resourceVersion"),
    }
    if keep:
        if not finalizers:
            return [
                guard,
                {"op": "add", "path": "/metadata/finalizers", "value": [RESOURCE_IN_USE]},
            ]
        return [guard, {"op": "add", "path": "/metadata/finalizers/-", "value": RESOURCE_IN_USE}]
    index = list(finalizers).index(RESOURCE_IN_USE)
    return [
        guard,
        {"op": "test", "path": f"/metadata/finalizers/{index}", "value": RESOURCE_IN_USE},
        {"op": "remove", "path": f"/metadata/finalizers/{index}"},
    ]


def flavors_in_use(
    cluster_queues: Iterable[Mapping[str, Any]], workloads: Iterable[Mapping[str, Any]]
) -> set[str]:
    """The flavors a ClusterQueue names in its resource groups (Kueue's rule), and those an
    admitted, unfinished Workload holds quota of."""
    used: set[str] = set()
    for cq in cluster_queues:
        for group in (cq.get("spec") or {}).get("resourceGroups") or ():
            used.update(f.get("name", "") for f in group.get("flavors") or ())
    for wl in workloads:
        status = wl.get("status") or {}
        admission = status.get("admission")
        if not admission or cond.is_true(status.get("conditions"), cond.FINISHED):
            continue
        for assignment in admission.get("podSetAssignments") or ():
            used.update((assignment.get("flavors") or {}).values())
    return used


class ResourceInUseFinalizers:
    def __init__(self, api: KubeApi, state: ClusterState, *, spawn: Callable[[Any], None]) -> None:
        self.api = api
        self.state = state
        self._spawn = spawn
        self._in_flight: set[tuple[str, str]] = set()
        self._workloads: set[str] = set()
        """Keys of Workloads that carry the finalizer (from the change feed)."""
        state.subscribe(self._on_change)

    def _on_change(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        if kind != "Workload":
            return
        if obj is not None and RESOURCE_IN_USE in (
            (obj.get("metadata") or {}).get("finalizers") or ()
        ):
            self._workloads.add(key)
        else:
            self._workloads.discard(key)

    def reconcile(self, *, in_core: Callable[[str], bool]) -> None:
        """Add the finalizer to live ClusterQueues and ResourceFlavors; remove it from deleted
        ClusterQueues the core has let go of (``in_core(name)`` is False) and from deleted
        ResourceFlavors nothing uses any more."""
        for name, obj in list(self.state.objects["ClusterQueue"].items()):
            deleting = _deleting(obj)
            if deleting and in_core(name):
                continue  # still holds quota: the finalizer stays
            self._keep("ClusterQueue", name, obj, keep=not deleting)
        flavors = self.state.objects["ResourceFlavor"]
        used: set[str] | None = None  # computed only when a flavor is being deleted
        for name, obj in list(flavors.items()):
            deleting = _deleting(obj)
            if deleting:
                if used is None:
                    used = flavors_in_use(
                        self.state.objects["ClusterQueue"].values(),
                        self.state.objects["Workload"].values(),
                    )
                if name in used:
                    continue  # named by a ClusterQueue or held by a Workload
            self._keep("ResourceFlavor", name, obj, keep=not deleting)
        for key in list(self._workloads):
            workload = self.state.get("Workload", key)
            if workload is not None and (_deleting(workload) or _finished(workload)):
                self._keep("Workload", key, workload, keep=False)

    def _keep(self, kind: str, name: str, obj: Mapping[str, Any], *, keep: bool) -> None:
        if (kind, name) in self._in_flight:
            return
        patch = finalizer_patch(obj, keep=keep)
        if patch is None:
            return
        self._in_flight.add((kind, name))
        self._spawn(self._patch(kind, name, patch, adding=keep))

    async def _patch(
        self, kind: str, name: str, patch: list[dict[str, Any]], *, adding: bool
    ) -> None:
        namespace, path_name = None, name
        if _RESOURCES[kind].namespaced:
            namespace, _, path_name = name.partition("/")
        try:
            updated = await self.api.patch(
                _RESOURCES[kind], path_name, patch, namespace=namespace, content_type=JSON_PATCH
            )
        except ApiError as error:
            if error.status not in (404, 409, 422):  # gone, or changed: the next pass sees it
                logger.warning(
                    "event=finalizer_patch_failed kind=%s name=%s error=%r", kind, name, str(error)
                )
            return
        except TRANSIENT_ERRORS as error:
            # Harmless to repeat: the resourceVersion guard makes a landed patch fail its test.
            logger.warning(
                "event=finalizer_patch_failed kind=%s name=%s error=%r", kind, name, error
            )
            return
        finally:
            self._in_flight.discard((kind, name))
        logger.info(
            "event=%s kind=%s name=%s finalizer=%s",
            "finalizer_added" if adding else "finalizer_removed",
            kind,
            name,
            RESOURCE_IN_USE,
        )
        metadata = updated.get("metadata") or {}
        if metadata and not (metadata.get("deletionTimestamp") and not metadata.get("finalizers")):
            # Not when the patch released a deleted object: the API server removes it at
            # once, and its DELETED watch event may already have been applied; recording
            # the response after it would bring back a ghost that holds its flavors forever.
            self.state.apply(kind, "MODIFIED", updated)


def _deleting(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def _finished(obj: Mapping[str, Any]) -> bool:
    return cond.is_true((obj.get("status") or {}).get("conditions") or (), cond.FINISHED)
