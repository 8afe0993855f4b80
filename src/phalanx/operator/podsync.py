"""The Pod controller (Kueue's ``pod`` integration): a Workload per complete pod group or
queued Pod, every gate removed on admission, the pods deleted on eviction, finished when all
pods are terminal. Rules in ``phalanx.operator.pods``.

Like the Job controller it reconciles one group at a time from the cached state, one step per
pass where a write's echo brings it back. The informer sees live pods only (finished pods leave
it as deletions), so a group that lost pods is read once from the API to tell a pod that
finished from one that was deleted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Any

from phalanx.operator import conditions as cond
from phalanx.operator import integration, jobs, pods
from phalanx.operator.keyed import KeyedQueue
from phalanx.operator.kube import JSON_PATCH, PODS, WORKLOADS, ApiError, KubeApi
from phalanx.operator.metrics import Metrics
from phalanx.operator.retry import TRANSIENT_ERRORS
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusWriter

__all__ = ["FRAMEWORK", "PodGroupController"]

FRAMEWORK = "pod"
"""Kueue's ``integrations.frameworks`` name of this integration."""


logger = logging.getLogger(__name__)


class PodGroupController:
    def __init__(
        self,
        api: KubeApi,
        state: ClusterState,
        writer: StatusWriter,
        metrics: Metrics,
        *,
        ready: asyncio.Event | None = None,
        enabled: bool = True,
        parents: Collection[str] = (),
    ) -> None:
        self.api = api
        self.state = state
        self.writer = writer
        self.metrics = metrics
        self.enabled = enabled
        # The enabled frameworks whose parents suspend their pods as pod groups (a
        # LeaderWorkerSet's): their groups run whether or not ``pod`` itself is enabled.
        self.parents = frozenset(parents)
        self.ready = ready or asyncio.Event()
        if ready is None:
            self.ready.set()
        self.work = KeyedQueue(
            "pods",
            lambda key: self.reconcile(key),
            log_as="pod_group",
            ready=self.ready,
            expected=TRANSIENT_ERRORS,
        )
        self._groups: dict[str, pods.Group] = {}
        self._members: dict[str, set[str]] = {}  # group key -> keys of its live pods
        self._group_of_pod: dict[str, str] = {}
        self._told: dict[str, str] = {}  # group key -> last message told on it
        self._stopping: set[str] = set()  # group keys whose pods were deleted for an eviction
        state.subscribe(self._on_change)

    def start(self) -> None:
        self.work.start()

    async def stop(self) -> None:
        await self.work.stop()

    # -- change routing -------------------------------------------------------------------------

    def _on_change(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        if kind == "Pod":
            old = self._group_of_pod.pop(key, None)
            if old is not None:
                self._members.get(old, set()).discard(key)
                self.work.add(old)
            group = pods.group_of(obj) if obj is not None else None
            if group is not None:
                self._groups[group.key] = group
                self._group_of_pod[key] = group.key
                self._members.setdefault(group.key, set()).add(key)
                self.work.add(group.key)
        elif kind == "Workload" and obj is not None:
            group_key = _group_key_of_workload(obj)
            if group_key is not None and group_key in self._groups:
                self.work.add(group_key)

    # -- what the scheduling loop asks ----------------------------------------------------------

    def stopped(self, workload: dict[str, Any]) -> bool:
        """An evicted Workload's pods are gone, but for those still gated (they never ran):
        its quota may be released. A Workload that no Pod owns is not this controller's."""
        group_key = _group_key_of_workload(workload)
        if group_key is None:
            return True
        return all(pods.gated(p) for p in self._live_pods(group_key))

    # -- reconcile ------------------------------------------------------------------------------

    def _live_pods(self, group_key: str) -> list[dict[str, Any]]:
        found = (self.state.get("Pod", k) for k in sorted(self._members.get(group_key, ())))
        return [p for p in found if p is not None]

    async def reconcile(self, group_key: str) -> None:
        group = self._groups.get(group_key)
        if group is None:
            return
        live = self._live_pods(group_key)
        enabled = self.enabled if group.parent is None else group.parent in self.parents
        if not enabled:
            if live:
                await self._tell(
                    group_key,
                    live,
                    "IntegrationNotEnabled",
                    integration.disabled_message(framework=group.parent or FRAMEWORK, kind="Pod"),
                    warning=False,
                )
            return
        workload = self._workload(group, live)
        if workload is None:
            if pods.prebuilt(live):
                return  # its parent's controller makes it; its creation queues the group
            if live and all(pods.gated(p) for p in live if not pods.terminal(p)):
                await self._create_workload(group, live)
            return
        conditions = (workload.get("status") or {}).get("conditions") or []
        if cond.is_true(conditions, cond.FINISHED):
            return
        wl_key = f"{group.namespace}/{workload['metadata']['name']}"
        status = workload.get("status") or {}
        admitted = cond.is_true(conditions, cond.ADMITTED) and status.get("admission")
        if cond.is_true(conditions, cond.EVICTED) or (not admitted and group_key in self._stopping):
            await self._stop(group_key, live)
            return
        if not admitted:
            return
        self._stopping.discard(group_key)
        injections = integration.injections(workload, flavors=self.state.objects["ResourceFlavor"])
        for pod in live:
            if pods.gated(pod):
                injection = injections.get(pods.pod_set_of(pod, group))
                if injection is not None:
                    await self._start_pod(pod, workload["metadata"]["name"], injection)
        total = sum(int(ps.get("count", 1)) for ps in workload["spec"].get("podSets") or ())
        if len(live) < total and not pods.serving(live):
            await self._maybe_finish(group, wl_key, total)

    def _workload(self, group: pods.Group, live: list[dict[str, Any]]) -> dict[str, Any] | None:
        if group.is_group:
            return self.state.get("Workload", f"{group.namespace}/{group.name}")
        if live:
            name = pods.workload_name(group, live)
            return self.state.get("Workload", f"{group.namespace}/{name}")
        # The single Pod left the informer (finished): find its Workload by owner.
        for obj in self.state.all("Workload"):
            if _group_key_of_workload(obj) == group.key:
                return obj
        return None

    async def _create_workload(self, group: pods.Group, live: list[dict[str, Any]]) -> None:
        try:
            priority = jobs.resolve_priority(
                {"metadata": live[0]["metadata"], "spec": {"template": {"spec": live[0]["spec"]}}},
                workload_priority_classes={
                    name: int(o.get("value", 0))
                    for name, o in self.state.objects["WorkloadPriorityClass"].items()
                },
                priority_classes={
                    name: int(o.get("value", 0))
                    for name, o in self.state.objects["PriorityClass"].items()
                },
            )
            body = pods.workload_for_group(
                group, live, priority=priority.value, priority_ref=priority.ref
            )
        except jobs.WorkloadPriorityClassNotFound as missing:
            await self._tell(group.key, live, "WorkloadPriorityClassNotFound", str(missing))
            return
        except pods.InvalidPodGroup as invalid:
            # Kueue's reason for a group it cannot make a Workload of (yet).
            await self._tell(group.key, live, "ErrWorkloadCompose", str(invalid))
            return
        try:
            created = await self.api.create(WORKLOADS, body, namespace=group.namespace)
        except ApiError as error:
            if error.conflict:
                return
            self.metrics.api_write("Workload", "create", ok=False)
            raise
        self.metrics.api_write("Workload", "create", ok=True)
        self.state.apply("Workload", "ADDED", created)
        self._told.pop(group.key, None)
        logger.info(
            "event=workload_created pod_group=%s workload=%s pods=%d",
            group.key,
            body["metadata"]["name"],
            len(live),
        )

    async def _tell(
        self,
        group_key: str,
        live: list[dict[str, Any]],
        reason: str,
        message: str,
        *,
        warning: bool = True,
    ) -> None:
        """An Event on each pod of the group, once per message."""
        if self._told.get(group_key) == message:
            return
        self._told[group_key] = message
        logger.warning(
            "event=pod_group_refused group=%s reason=%s message=%r", group_key, reason, message
        )
        for pod in live:
            await self.writer.event(pod, reason=reason, message=message, warning=warning)

    async def _start_pod(
        self, pod: dict[str, Any], workload_name: str, injection: integration.FlavorInjection
    ) -> None:
        metadata = pod["metadata"]
        patch = pods.start_patch(pod, workload_name=workload_name, injection=injection)
        try:
            updated = await self.api.patch(
                PODS,
                metadata["name"],
                patch,
                namespace=metadata["namespace"],
                content_type=JSON_PATCH,
            )
        except ApiError as error:
            self.metrics.api_write("Pod", "start", ok=False)
            if error.not_found:
                return
            raise
        self.metrics.api_write("Pod", "start", ok=True)
        self.state.apply("Pod", "MODIFIED", updated)

    async def _stop(self, group_key: str, live: list[dict[str, Any]]) -> None:
        """A Pod cannot be held again: an evicted group's pods are deleted (Kueue's Stop);
        whoever made them makes them again to be queued anew."""
        self._stopping.add(group_key)
        for pod in live:
            if pods.gated(pod) or pod["metadata"].get("deletionTimestamp"):
                continue
            try:
                await self.api.delete(
                    PODS, pod["metadata"]["name"], namespace=pod["metadata"]["namespace"]
                )
                self.metrics.api_write("Pod", "delete", ok=True)
            except ApiError as error:
                if not error.not_found:
                    self.metrics.api_write("Pod", "delete", ok=False)
                    raise

    async def _maybe_finish(self, group: pods.Group, wl_key: str, total: int) -> None:
        """Read the group's pods from the API (the informer has only the live ones) and
        write ``Finished`` once every pod is terminal."""
        if group.is_group:
            everyone = await self.api.list_all(
                PODS,
                namespace=group.namespace,
                label_selector=f"{pods.GROUP_NAME_LABEL}={group.name}",
            )
        else:
            # A list by name, not a get: the operator's role grants pods list, watch, patch
            # and delete only (manifests/base/rbac.yaml).
            everyone = await self.api.list_all(
                PODS, namespace=group.namespace, field_selector=f"metadata.name={group.name}"
            )
        finish = pods.group_finish(group, everyone, total=total)
        if finish is None:
            return
        outcome = await self.writer.finish(
            wl_key, succeeded=finish.succeeded, message=finish.message
        )
        if outcome.ok:
            logger.info("event=workload_finished workload=%s reason=%s", wl_key, finish.reason)


def _group_key_of_workload(workload: dict[str, Any]) -> str | None:
    metadata = workload.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    if annotations.get(pods.IS_GROUP_WORKLOAD_ANNOTATION) == "true":
        # Owned by its pods, or by the parent that made it for them (a LeaderWorkerSet).
        return f"{metadata.get('namespace')}/{metadata.get('name')}"
    owners = [o for o in metadata.get("ownerReferences") or () if o.get("kind") == "Pod"]
    if not owners:
        return None
    return f"{metadata.get('namespace')}/{owners[0].get('name')}"
