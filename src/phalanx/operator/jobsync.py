"""The batch/v1 Job controller: Workload per queued Job, start on admission, stop on eviction,
finish on completion.

What is particular to the kind (pod sets, suspension, injection, restore, end) comes from the
Job's adapter on the integration framework (``jobs.JOB``); what is particular to the batch/v1
Job controller (``status.startTime`` guarding the template, its ``Suspended`` condition) is
here.

It reconciles one Job at a time from the cached state (a change to a Job or to its Workload
queues the Job), performs at most one write per pass, and lets the write's echo bring it back
for the next step, so every step is idempotent and a restart resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Any

from phalanx.operator import conditions as cond
from phalanx.operator import integration, jobs
from phalanx.operator.keyed import KeyedQueue
from phalanx.operator.kube import JOBS, JSON_PATCH, WORKLOADS, ApiError, KubeApi
from phalanx.operator.metrics import Metrics
from phalanx.operator.retry import TRANSIENT_ERRORS
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusWriter

__all__ = ["JobController"]


logger = logging.getLogger(__name__)


class RetryLater(Exception):
    """A reconcile's write failed (logged where it failed); the Job is tried again later."""


class JobController:
    def __init__(
        self,
        api: KubeApi,
        state: ClusterState,
        writer: StatusWriter,
        metrics: Metrics,
        *,
        ready: asyncio.Event | None = None,
        concurrency: int = 8,
        frameworks: Collection[str] = ("batch/job",),
    ) -> None:
        self.api = api
        self.integration = jobs.JOB
        # Disabled (``integrations.frameworks`` without ``batch/job``): queued Jobs are left
        # alone, with an Event saying so.
        self.enabled = self.integration.framework in frameworks
        self.state = state
        self.writer = writer
        self.metrics = metrics
        self.concurrency = concurrency
        # Nothing is written before every informer has listed: a Job's Workload may exist.
        self.ready = ready or asyncio.Event()
        if ready is None:
            self.ready.set()
        self.work = KeyedQueue(
            "jobs",
            lambda key: self.reconcile(key),
            log_as="job",
            ready=self.ready,
            expected=(RetryLater, *TRANSIENT_ERRORS),
            workers=concurrency,
        )
        # workload key -> job key, and back, for live Jobs only: a Job's deletion drops both.
        self._owner_of: dict[str, str] = {}
        self._workload_of: dict[str, str] = {}
        self._pods_of: dict[str, set[str]] = {}  # job key -> keys of its live pods
        self._job_of_pod: dict[str, str] = {}
        # WorkloadPriorityClass name -> Jobs waiting for it to exist; job key -> (reason,
        # resourceVersion) of the last refusal told on it.
        self._waiting_for_class: dict[str, set[str]] = {}
        self._refused: dict[str, tuple[str, str]] = {}
        state.subscribe(self._on_change)

    def start(self) -> None:
        self.work.start()

    async def stop(self) -> None:
        await self.work.stop()

    # -- change routing -------------------------------------------------------------------------

    def _on_change(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        if kind == "Pod":
            self._track_pod(key, obj)
            return
        if kind == "WorkloadPriorityClass":
            if obj is not None:
                for waiting in sorted(self._waiting_for_class.pop(key, ())):
                    self.work.add(waiting)
            return
        if kind == "Job":
            if obj is not None:
                self._own(key, _workload_key(obj))
            else:
                self._disown(key)
            self.work.add(key)
        elif kind == "Workload":
            # A deleted Workload whose Job lives keeps its entry: the Job must hear of the
            # deletion (to create it again) and the next one has the same name.
            job_key = self._owner_of.get(key)
            if job_key is None and obj is not None:
                job_key = _owner_job_key(obj)
            if job_key is not None:
                self.work.add(job_key)

    def _own(self, job_key: str, workload_key: str) -> None:
        old = self._workload_of.get(job_key)
        if old is not None and old != workload_key and self._owner_of.get(old) == job_key:
            del self._owner_of[old]
        self._workload_of[job_key] = workload_key
        self._owner_of[workload_key] = job_key

    def _disown(self, job_key: str) -> None:
        """The Job is gone: forget its Workload and its pending retry."""
        workload_key = self._workload_of.pop(job_key, None)
        if workload_key is not None and self._owner_of.get(workload_key) == job_key:
            del self._owner_of[workload_key]
        self.work.forget(job_key)
        self._refused.pop(job_key, None)
        for name in [n for n, jobs_ in self._waiting_for_class.items() if job_key in jobs_]:
            self._waiting_for_class[name].discard(job_key)
            if not self._waiting_for_class[name]:
                del self._waiting_for_class[name]

    def _track_pod(self, key: str, obj: dict[str, Any] | None) -> None:
        """Index live pods by Job: an eviction is complete only when none is left."""
        old = self._job_of_pod.pop(key, None)
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
        job_name = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")
        if job_name:
            job_key = f"{obj['metadata']['namespace']}/{job_name}"
            self._job_of_pod[key] = job_key
            self._pods_of.setdefault(job_key, set()).add(key)

    def requeue_all(self) -> None:
        for key in list(self.state.objects["Job"]):
            self.work.add(key)

    # -- what the scheduling loop asks ----------------------------------------------------------

    def job_of(self, workload: dict[str, Any]) -> dict[str, Any] | None:
        job_key = _owner_job_key(workload)
        return self.state.get("Job", job_key) if job_key else None

    def is_job_owned(self, workload: dict[str, Any]) -> bool:
        return _owner_job_key(workload) is not None

    def job_stopped(self, workload: dict[str, Any]) -> bool:
        """An evicted Workload's Job is suspended, the Job controller has acted on it, and
        none of its pods is left (or the Job is gone).

        ``status.active`` alone is not enough: right after a Job is unsuspended its status
        still says 0 active while the Job controller is creating pods.
        """
        job_key = _owner_job_key(workload)
        job = self.state.get("Job", job_key) if job_key else None
        if job is None or job_key is None:
            return True
        spec = job.get("spec") or {}
        status = job.get("status") or {}
        return (
            bool(spec.get("suspend"))
            and cond.is_true(status.get("conditions"), "Suspended")
            and not status.get("active")
            and not self._pods_of.get(job_key)
        )

    # -- reconcile ------------------------------------------------------------------------------

    async def reconcile(self, job_key: str) -> None:
        job = self.state.get("Job", job_key)
        if job is None:
            return
        if self.integration.queue_name(job) is None:
            return
        if not self.enabled:
            await self._refuse(
                job,
                "IntegrationNotEnabled",
                integration.disabled_message(
                    framework=self.integration.framework, kind=self.integration.kind
                ),
                warning=False,
            )
            return
        wl_key = _workload_key(job)
        workload = self.state.get("Workload", wl_key)
        spec = job.get("spec") or {}
        if workload is None:
            if jobs.needs_workload(job):
                await self._create_workload(job)
            return
        status = workload.get("status") or {}
        conditions = status.get("conditions") or []
        finish = self.integration.finished(job)
        if finish is not None:
            if not cond.is_true(conditions, cond.FINISHED):
                await self._finish(wl_key, finish)
            return
        if cond.is_true(conditions, cond.FINISHED):
            return
        if jobs.job_finishing(job):
            # Its end is decided: Complete or Failed follows, nothing to change, unless its
            # startTime is gone (see _repair_start_time).
            if not (job.get("status") or {}).get("startTime"):
                await self._repair_start_time(job_key, job)
            return
        admitted = cond.is_true(conditions, cond.ADMITTED) and status.get("admission")
        evicted = cond.is_true(conditions, cond.EVICTED)
        if admitted and not evicted:
            if not spec.get("suspend"):
                await self._sync_pods_ready(wl_key, job, workload)
            elif await self._template_mutable(job_key, job):
                await self._start_job(job, workload, status["admission"])
            return
        # Evicted, or not admitted: the Job must stay (or be put back) suspended, with the
        # template it was created with.
        if not spec.get("suspend"):
            await self._stop_job(job, workload)
        elif self.integration.injected(job) and await self._template_mutable(job_key, job):
            await self._restore_template(job, workload)

    async def _create_workload(self, job: dict[str, Any]) -> None:
        if not self.integration.suspended(job):
            # Created while the webhook was unavailable: suspend it before anything runs.
            await self._patch_job(job, self.integration.suspend_patch(job), "suspend")
        job_key = f"{job['metadata']['namespace']}/{job['metadata']['name']}"
        try:
            priority = jobs.resolve_priority(
                job,
                workload_priority_classes={
                    name: int(o.get("value", 0))
                    for name, o in self.state.objects["WorkloadPriorityClass"].items()
                },
                priority_classes={
                    name: int(o.get("value", 0))
                    for name, o in self.state.objects["PriorityClass"].items()
                },
            )
            body = jobs.workload_for_job(job, priority=priority)
        except jobs.WorkloadPriorityClassNotFound as missing:
            # Kueue's answer: no Workload and a warning Event; the class's creation (or any
            # change to the Job) brings the Job back.
            self._waiting_for_class.setdefault(missing.name, set()).add(job_key)
            await self._refuse(job, "WorkloadPriorityClassNotFound", str(missing))
            return
        except jobs.InvalidJob as invalid:
            await self._refuse(job, "InvalidJob", str(invalid))
            return
        namespace = job["metadata"]["namespace"]
        try:
            created = await self.api.create(WORKLOADS, body, namespace=namespace)
            self.metrics.api_write("Workload", "create", ok=True)
            self.state.apply("Workload", "ADDED", created)
            logger.info(
                "event=workload_created job=%s/%s workload=%s",
                namespace,
                job["metadata"]["name"],
                body["metadata"]["name"],
            )
        except ApiError as error:
            if error.conflict:
                return  # created by an earlier pass; its watch event is on the way
            if error.status == 403 and "being terminated" in str(error):
                return  # the namespace is going away, and the Job with it
            self.metrics.api_write("Workload", "create", ok=False)
            logger.warning(
                "event=workload_create_failed job=%s/%s error=%r",
                namespace,
                job["metadata"]["name"],
                str(error),
            )
            await self.writer.event(
                job, reason="CreatedWorkloadFailed", message=str(error), warning=True
            )
            raise RetryLater(str(error)) from error

    async def _refuse(
        self, job: dict[str, Any], reason: str, message: str, *, warning: bool = True
    ) -> None:
        """No Workload for this Job as it is: say why on the Job, once per Job version (the
        Job's next change, or the missing object's creation, tries again)."""
        metadata = job["metadata"]
        seen = (reason, str(metadata.get("resourceVersion", "")))
        job_key = f"{metadata['namespace']}/{metadata['name']}"
        if self._refused.get(job_key) == seen:
            return
        self._refused[job_key] = seen
        logger.warning("event=job_refused job=%s reason=%s message=%r", job_key, reason, message)
        await self.writer.event(job, reason=reason, message=message, warning=warning)

    async def _start_job(
        self, job: dict[str, Any], workload: dict[str, Any], admission: dict[str, Any]
    ) -> None:
        del admission  # read from the Workload with its admission checks' podSetUpdates
        injections = integration.injections(workload, flavors=self.state.objects["ResourceFlavor"])
        patch = self.integration.start_patch(
            job, workload_name=workload["metadata"]["name"], injections=injections
        )
        if not patch:
            return
        if await self._patch_job(job, patch, "start"):
            flavors = {
                flavor
                for injected in injections.values()
                for flavor in _assigned_flavors(workload, injected.pod_set)
            }
            logger.info(
                "event=job_started job=%s/%s flavors=%s",
                job["metadata"]["namespace"],
                job["metadata"]["name"],
                ",".join(sorted(flavors)),
            )

    async def _stop_job(self, job: dict[str, Any], workload: dict[str, Any]) -> None:
        if await self._patch_job(job, self.integration.suspend_patch(job), "suspend"):
            logger.info(
                "event=job_suspended job=%s/%s",
                job["metadata"]["namespace"],
                job["metadata"]["name"],
            )

    async def _template_mutable(self, job_key: str, job: dict[str, Any]) -> bool:
        """Whether the suspended Job's template may be written now; if it has run before
        (``status.startTime``), clear that first once it is safe, and say no this pass.

        The API server keeps a Job's scheduling directives immutable while ``startTime`` is
        set; the Job controller keeps it on a suspended Job (Kueue clears it the same way).
        It is cleared only when :func:`jobs.start_time_clearable` holds and no pod of the
        Job is left, with the Job's resourceVersion as a precondition: if the Job controller
        wrote in between (a pod succeeded, the Job is ending), the patch is refused and the
        Job is judged again from what it wrote. A Job whose ``startTime`` is cleared while it
        can still finish could never be marked Complete.
        """
        if not (job.get("status") or {}).get("startTime"):
            return True
        if self._pods_of.get(job_key) or not jobs.start_time_clearable(job):
            return False  # the Job controller's next write, or a pod's going, brings it back
        await self._patch_start_time(job_key, job, None)
        return False  # the next pass writes the template, from the Job as it is now

    async def _repair_start_time(self, job_key: str, job: dict[str, Any]) -> None:
        """Give an ending Job without ``startTime`` one back, so the Job controller can mark
        it Complete or Failed (the API server refuses either without one).

        :meth:`_template_mutable` clears ``startTime`` only when nothing in the Job's status
        says it could still finish, but a pod's success the Job controller had not counted
        yet is not in that status: it then decides the end (``SuccessCriteriaMet``) after the
        clear. A suspended Job may get a ``startTime`` again; its creation time keeps
        ``completionTime`` after it.
        """
        created = job["metadata"].get("creationTimestamp")
        if created and await self._patch_start_time(job_key, job, created):
            logger.info("event=job_start_time_restored job=%s", job_key)

    async def _patch_start_time(self, job_key: str, job: dict[str, Any], value: str | None) -> bool:
        """Write the Job's ``status.startTime`` under its resourceVersion; whether it was
        written. A conflict (the Job controller wrote in between: its watch event queues the
        Job again) or a Job already gone is no; any other failure is retried later."""
        metadata = job["metadata"]
        body: dict[str, Any] = {"status": {"startTime": value}}
        if metadata.get("resourceVersion"):
            body["metadata"] = {"resourceVersion": metadata["resourceVersion"]}
        try:
            updated = await self.api.patch(
                JOBS, metadata["name"], body, namespace=metadata["namespace"], subresource="status"
            )
        except ApiError as error:
            self.metrics.api_write("Job", "status", ok=False)
            if error.conflict or error.not_found:
                return False
            logger.warning("event=job_status_failed job=%s error=%r", job_key, str(error))
            raise RetryLater(str(error)) from error
        self.metrics.api_write("Job", "status", ok=True)
        self.state.apply("Job", "MODIFIED", updated)
        return True

    async def _restore_template(self, job: dict[str, Any], workload: dict[str, Any]) -> None:
        pod_sets = (workload.get("spec") or {}).get("podSets") or []
        patch = self.integration.restore_patch(job, pod_sets=pod_sets)
        if patch:
            await self._patch_job(job, patch, "restore")

    async def _finish(self, wl_key: str, finish: integration.Finish) -> None:
        outcome = await self.writer.finish(
            wl_key, succeeded=finish.succeeded, message=finish.message
        )
        if outcome.ok:
            logger.info("event=workload_finished workload=%s reason=%s", wl_key, finish.reason)
        elif outcome.status != 404:
            raise RetryLater(outcome.error)

    async def _sync_pods_ready(
        self, wl_key: str, job: dict[str, Any], workload: dict[str, Any]
    ) -> None:
        await self.writer.pods_ready(wl_key, workload, ready=jobs.pods_ready(job))

    async def _patch_job(self, job: dict[str, Any], patch: list[dict[str, Any]], verb: str) -> bool:
        metadata = job["metadata"]
        try:
            updated = await self.api.patch(
                JOBS,
                metadata["name"],
                patch,
                namespace=metadata["namespace"],
                content_type=JSON_PATCH,
            )
        except ApiError as error:
            self.metrics.api_write("Job", verb, ok=False)
            if not error.not_found:
                logger.warning(
                    "event=job_patch_failed job=%s/%s verb=%s error=%r",
                    metadata["namespace"],
                    metadata["name"],
                    verb,
                    str(error),
                )
                raise RetryLater(str(error)) from error
            return False
        self.metrics.api_write("Job", verb, ok=True)
        self.state.apply("Job", "MODIFIED", updated)
        return True


def _workload_key(job: dict[str, Any]) -> str:
    metadata = job["metadata"]
    return f"{metadata['namespace']}/{jobs.workload_name(metadata['name'], metadata['uid'])}"


def _owner_job_key(workload: dict[str, Any]) -> str | None:
    metadata = workload.get("metadata") or {}
    for owner in metadata.get("ownerReferences") or ():
        if owner.get("kind") == "Job" and owner.get("apiVersion") == "batch/v1":
            return f"{metadata.get('namespace')}/{owner.get('name')}"
    return None


def _assigned_flavors(workload: dict[str, Any], pod_set: str) -> set[str]:
    admission = (workload.get("status") or {}).get("admission") or {}
    for psa in admission.get("podSetAssignments") or ():
        if psa.get("name") == pod_set:
            return set((psa.get("flavors") or {}).values())
    return set()
