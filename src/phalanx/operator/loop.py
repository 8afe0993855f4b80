"""The scheduling loop: coalesce changes, run a core cycle, apply its decisions.

One asyncio task. Each pass:

1. waits until something changed (or a periodic tick, for backoff expiries and timeouts),
   then lets a short window pass so a burst of events shares one cycle;
2. hands the changed objects to the core (:class:`CoreBridge`), together with the results of
   writes that failed since the last pass;
3. completes evictions whose pods are gone;
4. runs ``Scheduler.run_cycle`` in a worker thread, so a long cycle never stalls the event
   loop (the core is only touched here, between cycles);
5. applies the decisions the way a cache-backed controller must: the core already recorded
   them (state first), then the API writes run as tasks; a failed admission write makes the
   core forget the admission and requeue the workload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from phalanx.admission.decisions import Admit, CycleResult, EvictionReason, PendingReason
from phalanx.admission.preemption import FairSharingStrategy
from phalanx.admission.records import Phase
from phalanx.admission.scheduler import Scheduler, SchedulerConfig
from phalanx.api import convert
from phalanx.operator import conditions as cond
from phalanx.operator.afs import FairUsageKeeper
from phalanx.operator.bridge import CoreBridge
from phalanx.operator.budgets import BudgetKeeper
from phalanx.operator.checks import AdmissionCheckSync
from phalanx.operator.config import OperatorConfig
from phalanx.operator.decision_status import (
    Eviction,
    admission_status,
    evicted_at_once_status,
    evicted_status,
    eviction_done_status,
)
from phalanx.operator.finalizers import ResourceInUseFinalizers
from phalanx.operator.jobsync import JobController
from phalanx.operator.kindsync import KindController
from phalanx.operator.kube import KubeApi
from phalanx.operator.metrics import Metrics
from phalanx.operator.oracle import TopologyOracle
from phalanx.operator.podsync import PodGroupController
from phalanx.operator.retry import Backoff
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusFn, StatusWriter, WriteOutcome

__all__ = ["SchedulingLoop"]

logger = logging.getLogger(__name__)

_INADMISSIBLE = frozenset(
    {
        PendingReason.LOCAL_QUEUE_NOT_FOUND,
        PendingReason.CLUSTER_QUEUE_NOT_FOUND,
        PendingReason.CLUSTER_QUEUE_INACTIVE,
        PendingReason.LOCAL_QUEUE_STOPPED,
        PendingReason.NAMESPACE_MISMATCH,
        PendingReason.INACTIVE_WORKLOAD,
    }
)


def now_ms() -> int:
    return int(time.time() * 1000)


class SchedulingLoop:
    def __init__(
        self,
        *,
        api: KubeApi,
        state: ClusterState,
        writer: StatusWriter,
        jobs: JobController | None,
        metrics: Metrics,
        pod_groups: PodGroupController | None = None,
        kinds: Sequence[KindController] = (),
        config: OperatorConfig,
        validator: Callable[[dict[str, Any]], list[str]] | None = None,
        wait_synced: Callable[[], Any] | None = None,
    ) -> None:
        self.api = api
        self.state = state
        self.writer = writer
        self.jobs = jobs
        self.pod_groups = pod_groups
        self.kinds = tuple(kinds)
        self.metrics = metrics
        self.config = config
        self.oracle = TopologyOracle(balanced_placement=config.tas_balanced_placement)
        pods_ready = config.wait_for_pods_ready
        self.scheduler = Scheduler(
            config=SchedulerConfig(
                fair_sharing=config.fair_sharing,
                fair_sharing_strategies=tuple(
                    FairSharingStrategy(name) for name in config.fair_sharing_strategies
                ),
                backoff_base_ms=int(pods_ready.backoff_base_seconds * 1000),
                backoff_max_ms=int(pods_ready.backoff_max_seconds * 1000),
                admission_fair_sharing=config.admission_fair_sharing,
                decayed_fair_sharing=config.decayed_fair_sharing,
                budgets=config.budgets,
            ),
            placement=self.oracle,
        )
        self.fair_usage = FairUsageKeeper(self.scheduler, state, store_url=config.store_url)
        self.decayed_usage = FairUsageKeeper(
            self.scheduler, state, store_url=config.store_url, kind="ClusterQueue"
        )
        self.budgets = BudgetKeeper(self.scheduler, store_url=config.store_url, metrics=metrics)
        self.bridge = CoreBridge(self.scheduler, self.oracle, state, validator=validator)
        self.finalizers = ResourceInUseFinalizers(api, state, spawn=self._spawn)
        self.checks = AdmissionCheckSync(
            api=api,
            state=state,
            writer=writer,
            scheduler=self.scheduler,
            start_eviction=self._start_eviction,
            spawn=self._spawn,
        )
        writer.pending_allowed = self._still_pending
        self.evicting: dict[str, Eviction] = {}
        self._failed: list[tuple[str, int]] = []
        self._released: list[tuple[str, Eviction]] = []  # eviction-done writes that landed
        self._pods_ready_checked = 0  # (workload key, HTTP status) of failed admits
        self._wait_synced = wait_synced
        self._task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.ready = asyncio.Event()
        self.idle = asyncio.Event()
        """Set while no cycle runs: the core may then be read on the event loop (the visibility
        API reads the queues' order so)."""
        self.idle.set()
        self.cycles = 0
        self.tick_seconds = 2.0
        self.on_cycle: list[Callable[[CycleResult], None]] = []
        self.write_backoff = Backoff(initial=0.5, factor=2.0, maximum=30.0)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="phalanx-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._tasks):
            task.cancel()
        self.fair_usage.close()
        self.decayed_usage.close()

    def _still_pending(self, key: str) -> bool:
        # Read from writer tasks; a dict lookup and an attribute read, safe beside a cycle.
        return (
            self.scheduler.phase(key) in (Phase.PENDING, None)
            and key not in self.bridge.in_flight_admissions
        )

    # -- the loop -------------------------------------------------------------------------------

    async def run(self) -> None:
        if self._wait_synced is not None:
            await self._wait_synced()
        # Each reads the store once, bounded: side by side, the first cycle waits for the
        # slowest of them, not their sum.
        now = now_ms()
        await asyncio.gather(
            self.fair_usage.prefetch(now),
            self.decayed_usage.prefetch(now),
            self.budgets.prefetch(now),
        )
        first = self._sync()
        logger.info(
            "event=scheduler_ready workloads=%d restored=%d cluster_queues=%d",
            self.state.count("Workload"),
            len(first.restored),
            len(self.scheduler.queues),
        )
        self.ready.set()
        await self._cycle()
        while True:
            with contextlib.suppress(TimeoutError):
                # asyncio.timeout, never wait_for, in every long-running task: CPython 3.11's
                # wait_for can swallow a cancel arriving as the awaited event fires (a stop
                # once hung here on SIGTERM); tests/unit/operator/test_operator_no_wait_for.py.
                async with asyncio.timeout(self.tick_seconds):
                    await self.state.wait_changed()
            await asyncio.sleep(self.config.cycle_min_interval)
            self._sync()
            await self._cycle()

    def _sync(self) -> Any:
        now = now_ms()
        for key, status in self._failed:
            if status == 404:
                self.scheduler.delete_workload(key)
            else:
                # Forget the admission the API never recorded; the workload queues again.
                self.scheduler.workload_evicted(key, now=now)
        self._failed.clear()
        for key, eviction in self._released:
            self.bridge.in_flight_releases.discard(key)
            self.scheduler.workload_evicted(
                key,
                now=eviction.released_at,
                backoff=eviction.backoff,
                requeue_at=eviction.requeue_at,
            )
        self._released.clear()
        result = self.bridge.sync(self.state.drain(), now_ms=now)
        self.fair_usage.sync(now)
        self.decayed_usage.sync(now)
        self.finalizers.reconcile(in_core=self.scheduler.queues.__contains__)
        for key in result.deleted:
            self.writer.forget(key)
            self.evicting.pop(key, None)
        for key in result.evicted_elsewhere:
            self.evicting.pop(key, None)
        for key, reason in result.resume_eviction.items():
            self.evicting.setdefault(
                key, Eviction(reason=reason, message="", cluster_queue="", written=True)
            )
        for key, message in result.invalid.items():
            self.writer.explain(key, message=f"invalid workload: {message}", inadmissible=True)
        self._check_pods_ready(now)
        self.checks.reconcile(now_ms=now, evicting=self.evicting)
        self._progress_evictions(now)
        return result

    def _check_pods_ready(self, now: int) -> None:
        """Kueue's waitForPodsReady: an admitted workload whose pods are not all ready within
        the timeout is evicted (PodsReadyTimeout) and requeued with exponential backoff."""
        settings = self.config.wait_for_pods_ready
        if not settings.enabled or now - self._pods_ready_checked < 1000:
            return
        self._pods_ready_checked = now
        timeout_ms = settings.timeout_seconds * 1000
        for key, workload in self.state.objects["Workload"].items():
            if key in self.evicting:
                continue
            conditions = (workload.get("status") or {}).get("conditions") or []
            if not cond.is_true(conditions, cond.ADMITTED) or cond.is_true(
                conditions, cond.FINISHED
            ):
                continue
            if cond.is_true(conditions, cond.PODS_READY):
                continue
            admitted = cond.condition(conditions, cond.ADMITTED) or {}
            since = convert.timestamp_ms(admitted.get("lastTransitionTime"))
            if not since or now - since < timeout_ms:
                continue
            entry = self.scheduler.entries.get(key)
            if entry is None or entry.phase != Phase.ADMITTED:
                continue
            limit = settings.backoff_limit_count
            if limit is not None and entry.requeue_count >= limit:
                continue
            self._start_eviction(
                key,
                Eviction(
                    reason="PodsReadyTimeout",
                    message=f"Exceeded the PodsReady timeout of {settings.timeout_seconds:.0f}s",
                    cluster_queue=entry.cluster_queue or "",
                    backoff=True,
                ),
            )

    async def _cycle(self) -> None:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        self.idle.clear()
        try:
            result = await loop.run_in_executor(None, self.scheduler.run_cycle, now_ms())
        finally:
            self.idle.set()
        elapsed = time.perf_counter() - started
        self.cycles += 1
        self.metrics.cycle_duration.observe(elapsed)
        if result.decisions:
            logger.info(
                "event=cycle admitted=%d preempted=%d evicted=%d pending_explained=%d seconds=%.4f",
                len(result.admitted),
                len(result.preempted),
                len(result.evicted),
                len(result.pending),
                elapsed,
            )
        self._apply(result)
        self.budgets.export(result.time)
        for callback in self.on_cycle:
            callback(result)

    # -- decisions ------------------------------------------------------------------------------

    def _apply(self, result: CycleResult) -> None:
        for admit in result.admitted:
            self.bridge.in_flight_admissions.add(admit.workload)
            self.writer.forget(admit.workload)
            self._spawn(self._write_admission(admit))
        for preempt in result.preempted:
            for victim in preempt.victims:
                message = (
                    f"Preempted to accommodate {preempt.preemptor} in ClusterQueue"
                    f" {preempt.cluster_queue} ({victim.reason.value})"
                )
                self.metrics.preempted(preempt.cluster_queue, reason=victim.reason.value)
                self._start_eviction(
                    victim.workload,
                    Eviction(
                        reason="Preempted",
                        message=message,
                        cluster_queue=victim.cluster_queue,
                        preemption_reason=victim.reason.value,
                    ),
                )
        for evict in result.evicted:
            admission = self.scheduler.admission_of(evict.workload)
            message = evict.message
            if evict.reason == EvictionReason.DEACTIVATED:
                message = self.checks.deactivation_message(evict.workload) or message
            self._start_eviction(
                evict.workload,
                Eviction(
                    reason=evict.reason.value,
                    message=message,
                    cluster_queue=admission.cluster_queue if admission else "",
                ),
            )
        for key, explanation in result.pending.items():
            self.writer.explain(
                key,
                message=explanation.message,
                inadmissible=explanation.reason in _INADMISSIBLE,
            )

    async def _write_admission(self, admit: Admit) -> None:
        key = admit.workload
        try:
            build = admission_status(
                admit,
                checks=lambda a: self.checks.checks_for(admit.admission.cluster_queue, a),
            )
            outcome = await self._settled_write(key, build, verb="admit")
        finally:
            self.bridge.in_flight_admissions.discard(key)
        if not outcome.ok:
            # Known not to have landed (or the Workload is gone): the core forgets it.
            self._failed.append((key, outcome.status))
            self.state.mark_changed()
            return
        now = admit.time
        workload = self.state.get("Workload", key) or {}
        created = convert.timestamp_ms((workload.get("metadata") or {}).get("creationTimestamp"))
        wait = max(0.0, (now - created) / 1000) if created else 0.0
        self.metrics.admitted(admit.admission.cluster_queue, wait_seconds=wait)
        logger.info(
            "event=admitted workload=%s cluster_queue=%s flavors=%s wait_seconds=%.2f"
            " decided_ms=%d write_seconds=%.3f",
            key,
            admit.admission.cluster_queue,
            ",".join(sorted({f for ps in admit.admission.pod_sets for f in ps.flavors.values()})),
            wait,
            now,
            (now_ms() - now) / 1000,
        )
        if workload and not cond.is_true(
            (workload.get("status") or {}).get("conditions"), cond.ADMITTED
        ):
            # Admission checks pending: only the quota is reserved (Kueue's event); the
            # Admitted event comes when they are all Ready (phalanx.operator.checks).
            await self.writer.event(
                workload,
                reason="QuotaReserved",
                message=f"Quota reserved in ClusterQueue {admit.admission.cluster_queue}, "
                f"wait time since queued was {wait:.0f}s",
            )
        elif workload:
            await self.writer.event(
                workload,
                reason="Admitted",
                message=f"Admitted by ClusterQueue {admit.admission.cluster_queue}, "
                f"wait time since creation {wait:.0f}s",
            )

    async def _settled_write(self, key: str, build: StatusFn, *, verb: str) -> WriteOutcome:
        """``writer.apply_status`` until its outcome is known: a write that may have landed
        is neither forgotten nor repeated blindly; the writer reads it back, and while the
        API cannot be read the decision stands (the core keeps the quota counted)."""
        attempt = 0
        while True:
            outcome = await self.writer.apply_status(key, build, verb=verb)
            if not outcome.unknown:
                return outcome
            delay = self.write_backoff.delay(attempt)
            attempt += 1
            logger.warning(
                "event=write_outcome_unknown workload=%s verb=%s retry_in=%.1f error=%r",
                key,
                verb,
                delay,
                outcome.error,
            )
            await asyncio.sleep(delay)

    def _start_eviction(self, key: str, eviction: Eviction) -> None:
        if key in self.evicting:
            return
        self.evicting[key] = eviction
        self.writer.forget(key)
        self.metrics.evicted(eviction.cluster_queue, reason=eviction.reason)
        workload = self.state.get("Workload", key)
        if (
            workload is not None
            and not (workload.get("metadata") or {}).get("ownerReferences")
            and key not in self.bridge.in_flight_releases
        ):
            # Nothing runs for a Workload that nothing owns: one write evicts it and ends the
            # eviction (a Job's Workload needs two, the Job stopping between them).
            self._prepare_release(key, eviction, now_ms())
            self._spawn(self._write_eviction_at_once(key, eviction))
            return
        self._spawn(self._write_eviction(key, eviction))

    async def _write_eviction_at_once(self, key: str, eviction: Eviction) -> None:
        build = evicted_at_once_status(
            eviction, now_ms=eviction.released_at, requeue=eviction.requeue
        )
        try:
            outcome = await self._write_until_known(key, build, eviction, verb="evict")
        except BaseException:
            self.bridge.in_flight_releases.discard(key)
            raise
        eviction.written = True
        if not outcome.ok and outcome.status != 404:
            # Superseded before it was written (the Workload deleted or evicted anew).
            self.bridge.in_flight_releases.discard(key)
            self.state.mark_changed()
            return
        self.evicting.pop(key, None)
        self._released.append((key, eviction))
        logger.info(
            "event=evicting workload=%s reason=%s preemption=%s",
            key,
            eviction.reason,
            eviction.preemption_reason or "-",
        )
        logger.info("event=evicted workload=%s reason=%s writes=1", key, eviction.reason)
        await self._eviction_event(key, eviction)
        self.state.mark_changed()

    async def _write_until_known(
        self, key: str, build: StatusFn, eviction: Eviction, *, verb: str
    ) -> WriteOutcome:
        """``_settled_write`` until it lands, the Workload is gone, or the eviction is no
        longer this one. Not written, the victim would run on and its preemptor wait
        forever; the core still counts it, so retrying is safe."""
        attempt = 0
        while True:
            outcome = await self._settled_write(key, build, verb=verb)
            if outcome.ok or outcome.status == 404 or self.evicting.get(key) is not eviction:
                return outcome
            delay = self.write_backoff.delay(attempt)
            attempt += 1
            logger.warning(
                "event=evict_write_retry workload=%s retry_in=%.1f error=%r",
                key,
                delay,
                outcome.error,
            )
            await asyncio.sleep(delay)

    async def _eviction_event(self, key: str, eviction: Eviction) -> None:
        """The eviction's Event, unless the Workload finished before it could be evicted
        (nothing was written then: its status keeps the admission it finished with)."""
        workload = self.state.get("Workload", key)
        if workload is not None and not cond.is_true(
            (workload.get("status") or {}).get("conditions"), cond.FINISHED
        ):
            await self.writer.event(
                workload,
                reason="Preempted" if eviction.preemption_reason else "Evicted",
                message=eviction.message,
            )

    async def _write_eviction(self, key: str, eviction: Eviction) -> None:
        now = now_ms()

        build = evicted_status(eviction, now_ms=now)
        outcome = await self._write_until_known(key, build, eviction, verb="evict")
        eviction.written = True
        if outcome.status == 404:
            self.evicting.pop(key, None)
        logger.info(
            "event=evicting workload=%s reason=%s preemption=%s",
            key,
            eviction.reason,
            eviction.preemption_reason or "-",
        )
        await self._eviction_event(key, eviction)
        self.state.mark_changed()

    def _progress_evictions(self, now: int) -> None:
        """Finish evictions whose pods are gone: write the eviction done, then (next pass)
        release the quota in the core. Releasing first would let a preemptor be admitted
        while the API still shows its victim reserving."""
        for key, eviction in list(self.evicting.items()):
            if not eviction.written or key in self.bridge.in_flight_releases:
                continue
            workload = self.state.get("Workload", key)
            if workload is None:
                self.evicting.pop(key, None)
                continue
            if self.jobs is not None and not self.jobs.job_stopped(workload):
                continue
            if self.pod_groups is not None and not self.pod_groups.stopped(workload):
                continue
            if not all(kind.stopped(workload) for kind in self.kinds):
                continue
            self._prepare_release(key, eviction, now)
            self._spawn(self._write_eviction_done(key, eviction))

    def _prepare_release(self, key: str, eviction: Eviction, now: int) -> None:
        """The eviction's end as of ``now``: its requeue state (read here, between cycles,
        not from the write task) and the release marked in flight."""
        eviction.released_at = now
        if eviction.backoff:
            eviction.requeue = self.scheduler.next_requeue(key, now=now)
        elif eviction.requeue_at is not None:
            entry = self.scheduler.entries.get(key)
            count = entry.requeue_count if entry is not None else 0
            eviction.requeue = (count, max(eviction.requeue_at, now))
        self.bridge.in_flight_releases.add(key)

    async def _write_eviction_done(self, key: str, eviction: Eviction) -> None:
        now = eviction.released_at
        requeue = eviction.requeue

        build = eviction_done_status(eviction, now_ms=now, requeue=requeue)
        try:
            outcome = await self._settled_write(key, build, verb="requeue")
        except BaseException:
            self.bridge.in_flight_releases.discard(key)
            raise
        if not outcome.ok and outcome.status != 404:
            # Not written: the workload keeps its quota and the next pass tries again.
            self.bridge.in_flight_releases.discard(key)
            self.state.mark_changed()
            return
        self.evicting.pop(key, None)
        self._released.append((key, eviction))
        self.state.mark_changed()
        logger.info("event=evicted workload=%s reason=%s", key, eviction.reason)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("event=write_task_failed error=%r", task.exception())
