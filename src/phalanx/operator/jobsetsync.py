"""The JobSet controller (Kueue's ``jobset.x-k8s.io/jobset``): a Workload per queued JobSet,
start on admission, suspend and restore on eviction, finish on its end. Rules in
``phalanx.operator.jobset``.

Like the Job controller it reconciles one JobSet at a time from the cached state (a change to
the JobSet, its Workload or one of its pods queues it), performs at most one write per pass and
lets the write's echo bring it back. The JobSet controller (``sigs.k8s.io/jobset``) does the
rest: it creates the child Jobs suspended while the JobSet is, copies the injected templates
onto them when it resumes them, and suspends them (their pods are deleted) when the JobSet is
suspended again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from phalanx.operator import conditions as cond
from phalanx.operator import integration, jobs
from phalanx.operator import jobset as rules
from phalanx.operator.keyed import KeyedQueue
from phalanx.operator.kube import JOBSETS, JSON_PATCH, WORKLOADS, ApiError, KubeApi
from phalanx.operator.metrics import Metrics
from phalanx.operator.retry import TRANSIENT_ERRORS
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusWriter

__all__ = ["JobSetController"]

_KIND = rules.KIND

logger = logging.getLogger(__name__)


class RetryLater(Exception):
    """A write failed (logged where it failed); the JobSet is tried again later."""


class JobSetController:
    def __init__(
        self,
        api: KubeApi,
        state: ClusterState,
        writer: StatusWriter,
        metrics: Metrics,
        *,
        ready: asyncio.Event | None = None,
        enabled: bool = True,
    ) -> None:
        self.api = api
        self.integration = rules.JOBSET
        # Disabled (``integrations.frameworks`` without it): a queued JobSet is left alone,
        # with an Event saying so.
        self.enabled = enabled
        self.state = state
        self.writer = writer
        self.metrics = metrics
        self.ready = ready or asyncio.Event()
        if ready is None:
            self.ready.set()
        self.work = KeyedQueue(
            "jobsets",
            lambda key: self.reconcile(key),
            log_as="jobset",
            ready=self.ready,
            expected=(RetryLater, *TRANSIENT_ERRORS),
        )
        self._pods_of: dict[str, set[str]] = {}  # jobset key -> keys of its live pods
        self._jobset_of_pod: dict[str, str] = {}
        self._refused: dict[str, tuple[str, str]] = {}  # key -> (reason, resourceVersion)
        self._waiting_for_class: dict[str, set[str]] = {}
        state.subscribe(self._on_change)

    def start(self) -> None:
        self.work.start()

    async def stop(self) -> None:
        await self.work.stop()

    # -- change routing -------------------------------------------------------------------------

    def _on_change(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        if kind == _KIND:
            if obj is None:
                self.work.forget(key)
                self._refused.pop(key, None)
            self.work.add(key)
        elif kind == "Workload" and obj is not None:
            owner = _owner_key(obj)
            if owner is not None:
                self.work.add(owner)
        elif kind == "Pod":
            self._track_pod(key, obj)
        elif kind == "WorkloadPriorityClass" and obj is not None:
            for waiting in sorted(self._waiting_for_class.pop(key, ())):
                self.work.add(waiting)

    def _track_pod(self, key: str, obj: dict[str, Any] | None) -> None:
        old = self._jobset_of_pod.pop(key, None)
        if old is not None:
            pods = self._pods_of.get(old)
            if pods is not None:
                pods.discard(key)
                if not pods:
                    del self._pods_of[old]
                    self.work.add(old)
        if obj is None:
            return
        labels = (obj.get("metadata") or {}).get("labels") or {}
        name = labels.get(rules.JOBSET_NAME_LABEL)
        if name:
            owner = f"{obj['metadata']['namespace']}/{name}"
            self._jobset_of_pod[key] = owner
            self._pods_of.setdefault(owner, set()).add(key)

    # -- what the scheduling loop asks ----------------------------------------------------------

    def stopped(self, workload: dict[str, Any]) -> bool:
        """An evicted Workload's JobSet is suspended, each of its child Jobs is suspended with
        the Job controller's ``Suspended`` condition and no active pod (or has ended), and
        none of its pods is left (or the JobSet is gone). A Workload no JobSet owns is not
        this controller's.

        The JobSet's own ``Suspended`` condition is not enough: evicted right after it was
        started, it may still carry the one from before the start while its Jobs create
        pods. A child Job's condition is written by the Job controller in the same status
        update as its pods' count, so it cannot say suspended while pods it made run."""
        key = _owner_key(workload)
        if key is None:
            return True
        obj = self.state.get(_KIND, key)
        if obj is None:
            return True
        if not self.integration.suspended(obj) or self._pods_of.get(key):
            return False
        return all(rules.child_job_stopped(job) for job in self._children(key))

    def _children(self, key: str) -> list[dict[str, Any]]:
        namespace, _, name = key.partition("/")
        return [
            job
            for job in self.state.objects["JobSetJob"].values()
            if (job.get("metadata") or {}).get("namespace") == namespace
            and ((job.get("metadata") or {}).get("labels") or {}).get(rules.JOBSET_NAME_LABEL)
            == name
        ]

    # -- reconcile ------------------------------------------------------------------------------

    async def reconcile(self, key: str) -> None:
        obj = self.state.get(_KIND, key)
        if obj is None or self.integration.queue_name(obj) is None:
            return
        if not self.enabled:
            await self._refuse(
                obj,
                "IntegrationNotEnabled",
                integration.disabled_message(framework=rules.FRAMEWORK, kind=_KIND),
                warning=False,
            )
            return
        wl_key = f"{obj['metadata']['namespace']}/{self.integration.workload_name(obj)}"
        workload = self.state.get("Workload", wl_key)
        if workload is None:
            if rules.needs_workload(obj):
                await self._create_workload(key, obj)
            return
        status = workload.get("status") or {}
        conditions = status.get("conditions") or []
        finish = self.integration.finished(obj)
        if finish is not None:
            if not cond.is_true(conditions, cond.FINISHED):
                await self._finish(wl_key, finish)
            return
        if cond.is_true(conditions, cond.FINISHED):
            return
        admitted = cond.is_true(conditions, cond.ADMITTED) and status.get("admission")
        evicted = cond.is_true(conditions, cond.EVICTED)
        suspended = self.integration.suspended(obj)
        if admitted and not evicted:
            if suspended:
                await self._start(obj, workload)
            else:
                await self._sync_pods_ready(wl_key, obj)
            return
        # Evicted or not admitted: held, with the templates it was created with.
        if not suspended:
            if await self._patch(obj, self.integration.suspend_patch(obj), "suspend"):
                logger.info("event=jobset_suspended jobset=%s", key)
        elif self.integration.injected(obj):
            pod_sets = (workload.get("spec") or {}).get("podSets") or []
            patch = self.integration.restore_patch(obj, pod_sets=pod_sets)
            if await self._patch(obj, patch, "restore"):
                logger.info("event=jobset_restored jobset=%s", key)

    async def _create_workload(self, key: str, obj: dict[str, Any]) -> None:
        if not self.integration.suspended(obj):
            # Created while the webhook was unavailable: hold it before anything runs.
            await self._patch(obj, self.integration.suspend_patch(obj), "suspend")
        try:
            priority = rules.resolve_priority(
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
            body = integration.workload_manifest(
                self.integration,
                obj,
                pod_sets=self.integration.pod_sets(obj),
                priority=priority.value,
                priority_ref=priority.ref,
            )
        except jobs.WorkloadPriorityClassNotFound as missing:
            self._waiting_for_class.setdefault(missing.name, set()).add(key)
            await self._refuse(obj, "WorkloadPriorityClassNotFound", str(missing))
            return
        except rules.InvalidJobSet as invalid:
            await self._refuse(obj, "InvalidJobSet", str(invalid))
            return
        namespace = obj["metadata"]["namespace"]
        try:
            created = await self.api.create(WORKLOADS, body, namespace=namespace)
        except ApiError as error:
            if error.conflict:
                return  # created by an earlier pass; its watch event is on the way
            if error.status == 403 and "being terminated" in str(error):
                return
            self.metrics.api_write("Workload", "create", ok=False)
            logger.warning("event=workload_create_failed jobset=%s error=%r", key, str(error))
            await self.writer.event(
                obj, reason="CreatedWorkloadFailed", message=str(error), warning=True
            )
            raise RetryLater(str(error)) from error
        self.metrics.api_write("Workload", "create", ok=True)
        self.state.apply("Workload", "ADDED", created)
        logger.info(
            "event=workload_created jobset=%s workload=%s pod_sets=%d",
            key,
            body["metadata"]["name"],
            len(body["spec"]["podSets"]),
        )

    async def _refuse(
        self, obj: dict[str, Any], reason: str, message: str, *, warning: bool = True
    ) -> None:
        """Say why the JobSet gets no Workload, once per JobSet version."""
        metadata = obj["metadata"]
        key = f"{metadata['namespace']}/{metadata['name']}"
        seen = (reason, str(metadata.get("resourceVersion", "")))
        if self._refused.get(key) == seen:
            return
        self._refused[key] = seen
        logger.warning("event=jobset_refused jobset=%s reason=%s message=%r", key, reason, message)
        await self.writer.event(obj, reason=reason, message=message, warning=warning)

    async def _start(self, obj: dict[str, Any], workload: dict[str, Any]) -> None:
        injections = integration.injections(workload, flavors=self.state.objects["ResourceFlavor"])
        patch = self.integration.start_patch(
            obj, workload_name=workload["metadata"]["name"], injections=injections
        )
        if patch and await self._patch(obj, patch, "start"):
            logger.info(
                "event=jobset_started jobset=%s/%s pod_sets=%d",
                obj["metadata"]["namespace"],
                obj["metadata"]["name"],
                len(injections),
            )

    async def _finish(self, wl_key: str, finish: integration.Finish) -> None:
        outcome = await self.writer.finish(
            wl_key, succeeded=finish.succeeded, message=finish.message
        )
        if outcome.ok:
            logger.info("event=workload_finished workload=%s reason=%s", wl_key, finish.reason)
        elif outcome.status != 404:
            raise RetryLater(outcome.error)

    async def _sync_pods_ready(self, wl_key: str, obj: dict[str, Any]) -> None:
        workload = self.state.get("Workload", wl_key) or {}
        await self.writer.pods_ready(wl_key, workload, ready=rules.pods_ready(obj))

    async def _patch(self, obj: dict[str, Any], patch: list[dict[str, Any]], verb: str) -> bool:
        metadata = obj["metadata"]
        try:
            updated = await self.api.patch(
                JOBSETS,
                metadata["name"],
                patch,
                namespace=metadata["namespace"],
                content_type=JSON_PATCH,
            )
        except ApiError as error:
            self.metrics.api_write(_KIND, verb, ok=False)
            if error.not_found:
                return False
            logger.warning(
                "event=jobset_patch_failed jobset=%s/%s verb=%s error=%r",
                metadata["namespace"],
                metadata["name"],
                verb,
                str(error),
            )
            raise RetryLater(str(error)) from error
        self.metrics.api_write(_KIND, verb, ok=True)
        self.state.apply(_KIND, "MODIFIED", updated)
        return True


def _owner_key(workload: dict[str, Any]) -> str | None:
    metadata = workload.get("metadata") or {}
    for owner in metadata.get("ownerReferences") or ():
        if owner.get("kind") == _KIND and owner.get("apiVersion") == rules.API_VERSION:
            return f"{metadata.get('namespace')}/{owner.get('name')}"
    return None
