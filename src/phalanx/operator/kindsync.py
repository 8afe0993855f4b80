"""The controller of every kind with its own CRD and controller (JobSet, ...): a Workload per
queued object, start on admission, hold and restore on eviction, finish on its end. Each kind's
rules are an :class:`~phalanx.operator.integration.OwnedKind` (``phalanx.operator.jobset``, ...);
:class:`KindSpec` adds what this controller watches beside the object.

Like the Job controller it reconciles one object at a time from the cached state (a change to
the object, its Workload, one of its pods or one of its children queues it), performs at most
one write per pass and lets the write's echo bring it back. The kind's own controller does the
rest: it makes the pods (or children) while the object runs, copies the injected templates onto
them, and deletes them when the object is held again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from phalanx.operator import conditions as cond
from phalanx.operator import integration, jobs
from phalanx.operator.integration import OwnedKind
from phalanx.operator.keyed import KeyedQueue
from phalanx.operator.kube import JSON_PATCH, WORKLOADS, ApiError, KubeApi, Resource
from phalanx.operator.metrics import Metrics
from phalanx.operator.retry import TRANSIENT_ERRORS
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusWriter

__all__ = ["ChildWatch", "KindController", "KindSpec", "SourceWatch"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChildWatch:
    """Objects the kind's controller makes whose own state says whether they still run (a
    JobSet's child Jobs): an evicted object's quota is released only once each is stopped."""

    state_kind: str
    """The name the operator's state keeps them under (``JobSetJob``)."""
    resource: Resource
    owner_label: str
    """The label on each child naming its owner (in the same namespace)."""
    stopped: Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True)
class SourceWatch:
    """The object the kind's own controller derives from it, of the same namespace and name,
    from which the Workload's pod sets are read (a TrainJob's JobSet: Kueue runs the Trainer's
    runtime framework in its own process to compute them; the JobSet is its result)."""

    state_kind: str
    """The name the operator's state keeps them under (``TrainJobSet``)."""
    resource: Resource
    kind: str
    """Its kind, as an Event names it."""
    current: Callable[[Mapping[str, Any], Mapping[str, Any]], bool]
    """(object, source): the source was made from the object as it is held now."""
    pod_sets: Callable[[Mapping[str, Any], Mapping[str, Any]], list[dict[str, Any]]]
    """(object, source): the Workload's pod sets; ``ValueError`` names the field and the fix."""
    priority: Callable[..., integration.PriorityResolution]
    """(object, pod sets, workload_priority_classes=, priority_classes=)."""
    pods_ready: Callable[[Mapping[str, Any], Mapping[str, Any]], bool]
    held: Callable[[Mapping[str, Any]], bool]
    """(source): it makes nothing (a JobSet with ``spec.suspend: true``)."""


@dataclass(frozen=True)
class KindSpec:
    """One kind as the operator runs it: its rules, its webhooks and the children it watches."""

    rules: OwnedKind
    hold_at_creation: (
        Mapping[str, Any] | Callable[[Mapping[str, Any]], Mapping[str, Any]] | None
    ) = None
    """The merge patch the mutating webhook applies to a queued object at creation, so that
    nothing of it runs before admission (``{"spec": {"suspend": True}}``), or the function of
    the object that makes it."""
    validate: Callable[[Mapping[str, Any], Mapping[str, Any] | None], list[str]] | None = None
    """The validating webhook's check of a queued object (``old`` on an update): one message
    per problem, each starting with its field path."""
    child: ChildWatch | None = None
    source: SourceWatch | None = None
    restore_when: Callable[[Mapping[str, Any]], bool] | None = None
    """A held object's admission is taken out only once this holds of it (a TrainJob: none
    of its Jobs active, which the Trainer's webhook requires to change its runtime patches);
    its own status changes bring it back."""

    @property
    def resource(self) -> Resource:
        group, _, version = self.rules.api_version.rpartition("/")
        return Resource(group, version, self.rules.plural)

    @property
    def state_kind(self) -> str:
        return self.rules.kind


class RetryLater(Exception):
    """A write failed (logged where it failed); the object is tried again later."""


class KindController:
    def __init__(
        self,
        spec: KindSpec,
        api: KubeApi,
        state: ClusterState,
        writer: StatusWriter,
        metrics: Metrics,
        *,
        ready: asyncio.Event | None = None,
        enabled: bool = True,
    ) -> None:
        self.spec = spec
        self.api = api
        self.integration = spec.rules
        self.kind = spec.state_kind
        self.resource = spec.resource
        # Disabled (``integrations.frameworks`` without it): a queued object is left alone,
        # with an Event saying so.
        self.enabled = enabled
        self.state = state
        self.writer = writer
        self.metrics = metrics
        self.ready = ready or asyncio.Event()
        if ready is None:
            self.ready.set()
        self.work = KeyedQueue(
            spec.rules.plural,
            lambda key: self.reconcile(key),
            log_as=self.kind.lower(),
            ready=self.ready,
            expected=(RetryLater, *TRANSIENT_ERRORS),
        )
        self._pods_of: dict[str, set[str]] = {}  # object key -> keys of its live pods
        self._owner_of_pod: dict[str, str] = {}
        self._refused: dict[str, tuple[str, str]] = {}  # key -> (reason, resourceVersion)
        self._waiting_for_class: dict[str, set[str]] = {}
        state.subscribe(self._on_change)

    def start(self) -> None:
        self.work.start()

    async def stop(self) -> None:
        await self.work.stop()

    # -- change routing -------------------------------------------------------------------------

    def _on_change(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        if kind == self.kind:
            if obj is None:
                self.work.forget(key)
                self._refused.pop(key, None)
            self.work.add(key)
        elif kind == "Workload" and obj is not None:
            owner = self._owner_key(obj)
            if owner is not None:
                self.work.add(owner)
        elif kind == "Pod":
            self._track_pod(key, obj)
        elif self.spec.source is not None and kind == self.spec.source.state_kind:
            self.work.add(key)  # the object of the same namespace and name

        elif kind == "WorkloadPriorityClass" and obj is not None:
            for waiting in sorted(self._waiting_for_class.pop(key, ())):
                self.work.add(waiting)

    def _track_pod(self, key: str, obj: dict[str, Any] | None) -> None:
        old = self._owner_of_pod.pop(key, None)
        if old is not None:
            pods = self._pods_of.get(old)
            if pods is not None:
                pods.discard(key)
                if not pods:
                    del self._pods_of[old]
                    self.work.add(old)
        owner = self._labelled_owner(key, obj, self.integration.pod_owner_label)
        if owner is not None:
            self._owner_of_pod[key] = owner
            self._pods_of.setdefault(owner, set()).add(key)

    @staticmethod
    def _labelled_owner(key: str, obj: dict[str, Any] | None, label: str) -> str | None:
        """The key of the object a pod or child names by ``label`` (the same namespace)."""
        if obj is None:
            return None
        name = ((obj.get("metadata") or {}).get("labels") or {}).get(label)
        return f"{key.partition('/')[0]}/{name}" if name else None

    # -- what the scheduling loop asks ----------------------------------------------------------

    def stopped(self, workload: dict[str, Any]) -> bool:
        """An evicted Workload's object is held, none of its pods is left and each of its
        children says it is stopped (or the object is gone). A Workload no object of this
        kind owns is not this controller's.

        The object's own status is not enough: evicted right after it was started, a JobSet
        may still carry the ``Suspended`` condition from before the start while its Jobs
        create pods. A child Job's condition is written by the Job controller in the same
        status update as its pods' count, so it cannot say suspended while pods it made run."""
        key = self._owner_key(workload)
        if key is None:
            return True
        obj = self.state.get(self.kind, key)
        if obj is None:
            return True
        if not self.integration.suspended(obj) or self._pods_of.get(key):
            return False
        source = self.spec.source
        if source is not None:
            # The kind's controller holds the source after the object: until then the source
            # may still make children and pods.
            derived = self.state.get(source.state_kind, key)
            if derived is not None and not source.held(derived):
                return False
        child = self.spec.child
        return child is None or all(child.stopped(c) for c in self._children(child, key))

    def _children(self, child: ChildWatch, key: str) -> list[dict[str, Any]]:
        namespace, _, name = key.partition("/")
        return [
            obj
            for obj in self.state.objects[child.state_kind].values()
            if (obj.get("metadata") or {}).get("namespace") == namespace
            and ((obj.get("metadata") or {}).get("labels") or {}).get(child.owner_label) == name
        ]

    # -- reconcile ------------------------------------------------------------------------------

    async def reconcile(self, key: str) -> None:
        obj = self.state.get(self.kind, key)
        if obj is None or self.integration.queue_name(obj) is None:
            return
        if not self.enabled:
            await self._refuse(
                obj,
                "IntegrationNotEnabled",
                integration.disabled_message(framework=self.integration.framework, kind=self.kind),
                warning=False,
            )
            return
        wl_key = f"{obj['metadata']['namespace']}/{self.integration.workload_name(obj)}"
        workload = self.state.get("Workload", wl_key)
        if workload is None:
            if self.integration.needs_workload(obj):
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
                logger.info("event=%s_suspended key=%s", self.kind.lower(), key)
        elif self.integration.injected(obj):
            pod_sets = (workload.get("spec") or {}).get("podSets") or []
            await self._restore(key, obj, pod_sets)

    async def _restore(self, key: str, obj: dict[str, Any], pod_sets: list[dict[str, Any]]) -> None:
        """Take a held object's admission out (once its kind allows it)."""
        restore_when = self.spec.restore_when
        if restore_when is not None and not restore_when(obj):
            return
        patch = self.integration.restore_patch(obj, pod_sets=pod_sets)
        if await self._patch(obj, patch, "restore"):
            logger.info("event=%s_restored key=%s", self.kind.lower(), key)

    async def _create_workload(self, key: str, obj: dict[str, Any]) -> None:
        if not self.integration.suspended(obj):
            # Created while the webhook was unavailable: hold it before anything runs.
            await self._patch(obj, self.integration.suspend_patch(obj), "suspend")
        source = self.spec.source
        derived = None
        if source is not None:
            if self.integration.suspended(obj) and self.integration.injected(obj):
                # Its Workload was deleted while it ran: the source is rebuilt with the old
                # admission until that is taken out (the pod sets need not be written back).
                await self._restore(key, obj, [])
                return
            derived = self.state.get(source.state_kind, key)
            if derived is None or not source.current(obj, derived):
                await self._refuse(
                    obj,
                    f"WaitingFor{source.kind}",
                    f"waiting for the {source.kind} {obj['metadata']['name']!r} that the"
                    f" {self.kind}'s controller makes from it while it is held: the Workload's"
                    f" pod sets are read from it",
                    warning=False,
                )
                return
        classes = {
            "workload_priority_classes": {
                n: int(o.get("value", 0))
                for n, o in self.state.objects["WorkloadPriorityClass"].items()
            },
            "priority_classes": {
                n: int(o.get("value", 0)) for n, o in self.state.objects["PriorityClass"].items()
            },
        }
        try:
            if source is not None and derived is not None:
                pod_sets = source.pod_sets(obj, derived)
                priority = source.priority(obj, pod_sets, **classes)
            else:
                pod_sets = self.integration.pod_sets(obj)
                priority = self.integration.resolve_priority(obj, **classes)
            body = integration.workload_manifest(
                self.integration,
                obj,
                pod_sets=pod_sets,
                priority=priority.value,
                priority_ref=priority.ref,
            )
        except jobs.WorkloadPriorityClassNotFound as missing:
            self._waiting_for_class.setdefault(missing.name, set()).add(key)
            await self._refuse(obj, "WorkloadPriorityClassNotFound", str(missing))
            return
        except ValueError as invalid:  # the rules' own error, naming the field and the fix
            await self._refuse(obj, f"Invalid{self.kind}", str(invalid))
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
            logger.warning(
                "event=workload_create_failed kind=%s key=%s error=%r", self.kind, key, str(error)
            )
            await self.writer.event(
                obj, reason="CreatedWorkloadFailed", message=str(error), warning=True
            )
            raise RetryLater(str(error)) from error
        self.metrics.api_write("Workload", "create", ok=True)
        self.state.apply("Workload", "ADDED", created)
        logger.info(
            "event=workload_created kind=%s key=%s workload=%s pod_sets=%d",
            self.kind,
            key,
            body["metadata"]["name"],
            len(body["spec"]["podSets"]),
        )

    async def _refuse(
        self, obj: dict[str, Any], reason: str, message: str, *, warning: bool = True
    ) -> None:
        """Say why the object gets no Workload, once per version of it."""
        metadata = obj["metadata"]
        key = f"{metadata['namespace']}/{metadata['name']}"
        seen = (reason, str(metadata.get("resourceVersion", "")))
        if self._refused.get(key) == seen:
            return
        self._refused[key] = seen
        logger.warning(
            "event=workload_refused kind=%s key=%s reason=%s message=%r",
            self.kind,
            key,
            reason,
            message,
        )
        await self.writer.event(obj, reason=reason, message=message, warning=warning)

    async def _start(self, obj: dict[str, Any], workload: dict[str, Any]) -> None:
        injections = integration.injections(workload, flavors=self.state.objects["ResourceFlavor"])
        patch = self.integration.start_patch(
            obj, workload_name=workload["metadata"]["name"], injections=injections
        )
        if patch and await self._patch(obj, patch, "start"):
            logger.info(
                "event=%s_started key=%s/%s pod_sets=%d",
                self.kind.lower(),
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
        source = self.spec.source
        if source is None:
            ready = self.integration.pods_ready(obj)
        else:
            key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
            derived = self.state.get(source.state_kind, key)
            ready = derived is not None and source.pods_ready(obj, derived)
        await self.writer.pods_ready(wl_key, workload, ready=ready)

    async def _patch(self, obj: dict[str, Any], patch: list[dict[str, Any]], verb: str) -> bool:
        metadata = obj["metadata"]
        try:
            updated = await self.api.patch(
                self.resource,
                metadata["name"],
                patch,
                namespace=metadata["namespace"],
                content_type=JSON_PATCH,
            )
        except ApiError as error:
            self.metrics.api_write(self.kind, verb, ok=False)
            if error.not_found:
                return False
            logger.warning(
                "event=patch_failed kind=%s key=%s/%s verb=%s error=%r",
                self.kind,
                metadata["namespace"],
                metadata["name"],
                verb,
                str(error),
            )
            raise RetryLater(str(error)) from error
        self.metrics.api_write(self.kind, verb, ok=True)
        self.state.apply(self.kind, "MODIFIED", updated)
        return True

    def _owner_key(self, workload: dict[str, Any]) -> str | None:
        metadata = workload.get("metadata") or {}
        for owner in metadata.get("ownerReferences") or ():
            if (
                owner.get("kind") == self.kind
                and owner.get("apiVersion") == self.integration.api_version
            ):
                return f"{metadata.get('namespace')}/{owner.get('name')}"
        return None
