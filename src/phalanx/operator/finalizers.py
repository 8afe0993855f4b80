"""The ``kueue.x-k8s.io/resource-in-use`` finalizer on ClusterQueues, as Kueue keeps it.

A ClusterQueue deleted while Workloads still hold its quota must stay until they are gone;
kept only in memory, that "terminating" state would be lost by a restart (the object would
vanish from the API and the restored Workloads become orphans). So every live ClusterQueue
carries the finalizer, and the leader removes it from a deleted one once the core no longer
has the queue (no admitted Workload and no victim still being evicted holds quota in it).

Only the scheduling loop calls :meth:`ClusterQueueFinalizers.reconcile`, between cycles, with
the core's current view; the patches run as tasks and a failed one is retried on a later pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from phalanx.operator.kube import (
    CLUSTER_QUEUES,
    JSON_PATCH,
    TRANSIENT_ERRORS,
    ApiError,
    KubeApi,
)
from phalanx.operator.state import ClusterState

__all__ = ["RESOURCE_IN_USE", "ClusterQueueFinalizers", "finalizer_patch"]

logger = logging.getLogger(__name__)

RESOURCE_IN_USE = "kueue.x-k8s.io/resource-in-use"


def finalizer_patch(obj: Mapping[str, Any], *, keep: bool) -> list[dict[str, Any]] | None:
    """A JSON patch that adds (``keep``) or removes the finalizer, guarded by the object's
    resourceVersion so it never applies to a version it was not computed from; None when
    there is nothing to do."""
    metadata = obj.get("metadata") or {}
    finalizers = list(metadata.get("finalizers") or ())
    guard = {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": metadata.get("resourceVersion"),
    }
    if keep:
        if RESOURCE_IN_USE in finalizers:
            return None
        if not finalizers:
            return [
                guard,
                {"op": "add", "path": "/metadata/finalizers", "value": [RESOURCE_IN_USE]},
            ]
        return [guard, {"op": "add", "path": "/metadata/finalizers/-", "value": RESOURCE_IN_USE}]
    if RESOURCE_IN_USE not in finalizers:
        return None
    index = finalizers.index(RESOURCE_IN_USE)
    return [
        guard,
        {"op": "test", "path": f"/metadata/finalizers/{index}", "value": RESOURCE_IN_USE},
        {"op": "remove", "path": f"/metadata/finalizers/{index}"},
    ]


class ClusterQueueFinalizers:
    def __init__(self, api: KubeApi, state: ClusterState, *, spawn: Callable[[Any], None]) -> None:
        self.api = api
        self.state = state
        self._spawn = spawn
        self._in_flight: set[str] = set()

    def reconcile(self, *, in_core: Callable[[str], bool]) -> None:
        """Add the finalizer to live ClusterQueues; remove it from deleted ones the core has
        let go of (``in_core(name)`` is False)."""
        for name, obj in list(self.state.objects["ClusterQueue"].items()):
            if name in self._in_flight:
                continue
            deleting = bool((obj.get("metadata") or {}).get("deletionTimestamp"))
            if deleting and in_core(name):
                continue  # still holds quota: the finalizer stays
            patch = finalizer_patch(obj, keep=not deleting)
            if patch is None:
                continue
            self._in_flight.add(name)
            self._spawn(self._patch(name, patch, adding=not deleting))

    async def _patch(self, name: str, patch: list[dict[str, Any]], *, adding: bool) -> None:
        try:
            updated = await self.api.patch(CLUSTER_QUEUES, name, patch, content_type=JSON_PATCH)
        except ApiError as error:
            if error.status not in (404, 409, 422):  # gone, or changed: the next pass sees it
                logger.warning(
                    "event=finalizer_patch_failed cluster_queue=%s error=%r", name, str(error)
                )
            return
        except TRANSIENT_ERRORS as error:
            # Harmless to repeat: the resourceVersion guard makes a landed patch fail its test.
            logger.warning("event=finalizer_patch_failed cluster_queue=%s error=%r", name, error)
            return
        finally:
            self._in_flight.discard(name)
        logger.info(
            "event=%s cluster_queue=%s finalizer=%s",
            "finalizer_added" if adding else "finalizer_removed",
            name,
            RESOURCE_IN_USE,
        )
        if updated.get("metadata"):
            self.state.apply("ClusterQueue", "MODIFIED", updated)
