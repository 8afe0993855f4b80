"""The LeaderWorkerSet controller: one Workload per group, and each gated pod of the set put
into its group's pod group. Rules in ``phalanx.operator.lws``.

A LeaderWorkerSet cannot be suspended, so it does not run on the generic controller of
``phalanx.operator.kindsync``. Its pods are held by the admission scheduling gate (the pod
webhook gates every pod whose template this integration marked) and the pod-group controller
(``phalanx.operator.podsync``) does the rest, as for any pod group with a prebuilt Workload:
it ungates the group's pods once its Workload is admitted and deletes them on eviction (the
StatefulSets make them again, gated). What this controller adds is Kueue's LWS reconciler:

- a Workload per group index ``0 .. replicas-1``, created when missing; the Workloads of
  groups scaled away are deleted (deleting the set deletes the others: owner references);
- a pod of the set, once the LWS pod webhook gave it its group index, is labelled with its
  group (the Workload's name), its group's size and its role (``leader``/``worker``).

It reconciles one LeaderWorkerSet at a time from the cached state, queued by a change to the
set, to one of its Workloads or to one of its pods.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from phalanx.operator import jobs, lws, pods
from phalanx.operator.keyed import KeyedQueue
from phalanx.operator.kube import JSON_PATCH, PODS, WORKLOADS, ApiError, KubeApi, Resource
from phalanx.operator.metrics import Metrics
from phalanx.operator.retry import TRANSIENT_ERRORS
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusWriter

__all__ = ["LEADER_WORKER_SETS", "LeaderWorkerSetController"]

LEADER_WORKER_SETS = Resource(lws.GROUP, "v1", lws.PLURAL)

logger = logging.getLogger(__name__)


class LeaderWorkerSetController:
    def __init__(
        self,
        api: KubeApi,
        state: ClusterState,
        writer: StatusWriter,
        metrics: Metrics,
        *,
        ready: asyncio.Event | None = None,
    ) -> None:
        self.api = api
        self.state = state
        self.writer = writer
        self.metrics = metrics
        self.ready = ready or asyncio.Event()
        if ready is None:
            self.ready.set()
        self.work = KeyedQueue(
            lws.PLURAL,
            lambda key: self.reconcile(key),
            log_as="leaderworkerset",
            ready=self.ready,
            expected=TRANSIENT_ERRORS,
        )
        self._workloads_of: dict[str, set[str]] = {}  # set key -> keys of its Workloads
        self._set_of_workload: dict[str, str] = {}
        self._pods_of: dict[str, set[str]] = {}  # set key -> keys of its marked pods
        self._set_of_pod: dict[str, str] = {}
        self._told: dict[str, str] = {}
        self._waiting_for_class: dict[str, set[str]] = {}  # class name -> set keys
        state.subscribe(self._on_change)

    def start(self) -> None:
        self.work.start()

    async def stop(self) -> None:
        await self.work.stop()

    # -- change routing -------------------------------------------------------------------------

    def _on_change(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        if kind == lws.KIND:
            if obj is None:
                self.work.forget(key)
                self._told.pop(key, None)
            self.work.add(key)
        elif kind == "Workload":
            self._track(key, _owner_key(obj), self._workloads_of, self._set_of_workload)
        elif kind == "Pod":
            self._track(key, _set_key_of_pod(key, obj), self._pods_of, self._set_of_pod)
        elif kind == "WorkloadPriorityClass" and obj is not None:
            for waiting in sorted(self._waiting_for_class.pop(key, ())):
                self.work.add(waiting)

    def _track(
        self,
        key: str,
        owner: str | None,
        children: dict[str, set[str]],
        owner_of: dict[str, str],
    ) -> None:
        old = owner_of.pop(key, None)
        if old is not None:
            children.get(old, set()).discard(key)
            if not children.get(old):
                children.pop(old, None)
            self.work.add(old)
        if owner is not None:
            owner_of[key] = owner
            children.setdefault(owner, set()).add(key)
            self.work.add(owner)

    # -- reconcile ------------------------------------------------------------------------------

    async def reconcile(self, key: str) -> None:
        obj = self.state.get(lws.KIND, key)
        if obj is None or lws.queue_name(obj) is None:
            return
        if obj["metadata"].get("deletionTimestamp"):
            return
        namespace = obj["metadata"]["namespace"]
        desired = lws.desired_workloads(obj)
        for name, index in desired.items():
            if self.state.get("Workload", f"{namespace}/{name}") is None:
                await self._create_workload(key, obj, index)
        for wl_key in sorted(self._workloads_of.get(key, ())):
            if wl_key.partition("/")[2] not in desired:
                await self._delete_workload(key, wl_key)
        for pod_key in sorted(self._pods_of.get(key, ())):
            pod = self.state.get("Pod", pod_key)
            if pod is not None and pods.gated(pod):
                change = lws.pod_group_labels(obj, pod)
                if change is not None:
                    await self._label_pod(pod, change)

    async def _create_workload(self, key: str, obj: dict[str, Any], index: int) -> None:
        try:
            priority = lws.resolve_priority(
                obj,
                workload_priority_classes={
                    n: int(o.get("value", 0))
                    for n, o in self.state.objects["WorkloadPriorityClass"].items()
                },
                priority_classes={
                    n: int(o.get("value", 0))
                    for n, o in self.state.objects["PriorityClass"].items()
                },
            )
        except jobs.WorkloadPriorityClassNotFound as missing:
            self._waiting_for_class.setdefault(missing.name, set()).add(key)
            await self._tell(obj, "WorkloadPriorityClassNotFound", str(missing))
            return
        body = lws.workload_manifest(
            obj, index=index, priority=priority.value, priority_ref=priority.ref
        )
        namespace = obj["metadata"]["namespace"]
        try:
            created = await self.api.create(WORKLOADS, body, namespace=namespace)
        except ApiError as error:
            if error.conflict:
                return  # created by an earlier pass; its watch event is on the way
            if error.status == 403 and "being terminated" in str(error):
                return
            self.metrics.api_write("Workload", "create", ok=False)
            await self._tell(obj, "CreatedWorkloadFailed", str(error))
            raise
        self.metrics.api_write("Workload", "create", ok=True)
        self.state.apply("Workload", "ADDED", created)
        name = body["metadata"]["name"]
        await self.writer.event(
            obj, reason="CreatedWorkload", message=f"Created Workload: {namespace}/{name}"
        )
        logger.info(
            "event=workload_created kind=LeaderWorkerSet key=%s workload=%s group=%d",
            key,
            name,
            index,
        )

    async def _delete_workload(self, key: str, wl_key: str) -> None:
        namespace, _, name = wl_key.partition("/")
        try:
            await self.api.delete(WORKLOADS, name, namespace=namespace)
        except ApiError as error:
            if error.not_found:
                return
            self.metrics.api_write("Workload", "delete", ok=False)
            raise
        self.metrics.api_write("Workload", "delete", ok=True)
        logger.info(
            "event=workload_deleted kind=LeaderWorkerSet key=%s workload=%s reason=scaled_down",
            key,
            name,
        )

    async def _label_pod(self, pod: dict[str, Any], change: lws.PodGroupLabels) -> None:
        metadata = pod["metadata"]
        patch = [
            {"op": "test", "path": "/metadata/uid", "value": metadata.get("uid")},
            {"op": "add", "path": "/metadata/labels", "value": change.labels},
            {"op": "add", "path": "/metadata/annotations", "value": change.annotations},
        ]
        try:
            updated = await self.api.patch(
                PODS,
                metadata["name"],
                patch,
                namespace=metadata["namespace"],
                content_type=JSON_PATCH,
            )
        except ApiError as error:
            self.metrics.api_write("Pod", "label", ok=False)
            if error.not_found or error.status == 422:
                return  # gone, or replaced by a new pod of the same name (the test failed)
            raise
        self.metrics.api_write("Pod", "label", ok=True)
        self.state.apply("Pod", "MODIFIED", updated)

    async def _tell(self, obj: dict[str, Any], reason: str, message: str) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        if self._told.get(key) == message:
            return
        self._told[key] = message
        logger.warning(
            "event=workload_refused kind=LeaderWorkerSet key=%s reason=%s message=%r",
            key,
            reason,
            message,
        )
        await self.writer.event(obj, reason=reason, message=message, warning=True)


def _owner_key(workload: dict[str, Any] | None) -> str | None:
    if workload is None:
        return None
    metadata = workload.get("metadata") or {}
    for owner in metadata.get("ownerReferences") or ():
        if owner.get("kind") == lws.KIND and owner.get("apiVersion") == lws.API_VERSION:
            return f"{metadata.get('namespace')}/{owner.get('name')}"
    return None


def _set_key_of_pod(key: str, pod: dict[str, Any] | None) -> str | None:
    if pod is None or not lws.suspended_by_lws(pod):
        return None
    name = ((pod.get("metadata") or {}).get("labels") or {}).get(lws.NAME_LABEL)
    return f"{key.partition('/')[0]}/{name}" if name else None
