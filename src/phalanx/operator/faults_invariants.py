"""Admission invariants, checked from outside the operator by watching the API.

The fault suite and ``phalanx bench e2e`` run this beside the operator for the whole run; it
sees exactly what any client sees, so it judges the operator by its effects, not its logs.

What counts as a violation:

- ``double_admission``: a Workload whose ``status.admission`` changed while it stayed
  reserved, or that was reserved again without an eviction (``QuotaReserved`` going False,
  or ``Evicted=True``) in between. Re-admission after an eviction is legitimate and counted.
- ``overshoot``: at the moment a Workload becomes reserved, its ClusterQueue's reserved
  usage (the sum over its reserved, unfinished Workloads) exceeds ``nominalQuota +
  borrowingLimit`` (``nominalQuota`` without a cohort), or its cohort's total exceeds the
  sum of its members' nominal quotas (flat cohorts; Cohort objects' own quotas are added).
- ``status_overshoot``: a ClusterQueue's own ``status.flavorsReservation`` above the same
  bound (what the operator reports).
- ``duplicate_workload``: two Workloads owned by the same Job.
- at the end (:meth:`InvariantChecker.final_problems`): ``leak``, reserved usage left
  after every Workload finished, in the watched Workloads or in ClusterQueue status.

Lowering a quota below current usage is not an overshoot (Kueue does not evict for it), so
limits are checked when usage grows, against the quota known at that moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from phalanx.operator.informer import Informer
from phalanx.operator.kube import CLUSTER_QUEUES, WORKLOADS, KubeApi, Resource
from phalanx.quotas.quantity import QuantityError, parse_quantity

__all__ = [
    "InvariantChecker",
    "InvariantWatch",
    "Violation",
    "WorkloadHistory",
    "admission_usage",
]

COHORTS = Resource("kueue.x-k8s.io", "v1beta2", "cohorts", namespaced=False)
FlavorResource = tuple[str, str]
Usage = dict[FlavorResource, int]


@dataclass(frozen=True)
class Violation:
    kind: str
    subject: str
    detail: str
    at: float

    def __str__(self) -> str:
        return f"{self.kind} {self.subject}: {self.detail}"


@dataclass
class WorkloadHistory:
    """What one Workload (by uid) went through, as the watch showed it."""

    key: str
    cluster_queue: str = ""
    admissions: int = 0
    evictions: int = 0
    finished: bool = False
    held: Usage | None = None
    admission: Any = None
    evicted_since_admission: bool = True
    owner_job: str | None = None
    first_seen: float = 0.0
    admitted_at: list[float] = field(default_factory=list)
    inferred: bool = False
    """First seen already Finished with an admission: the watch was cut (an API-server
    restart) while it was reserved, so its admission is counted without being watched."""


def _quantity(value: Any, resource: str) -> int:
    try:
        return parse_quantity(str(value), resource=resource)
    except QuantityError:
        return 0


def admission_usage(admission: Mapping[str, Any] | None) -> Usage:
    """``status.admission`` -> usage per (flavor, resource), in base units."""
    usage: Usage = {}
    for psa in (admission or {}).get("podSetAssignments") or ():
        flavors = psa.get("flavors") or {}
        for resource, amount in (psa.get("resourceUsage") or {}).items():
            flavor = flavors.get(resource, "")
            key = (str(flavor), str(resource))
            usage[key] = usage.get(key, 0) + _quantity(amount, resource)
    return usage


def _conditions(obj: Mapping[str, Any]) -> dict[str, str]:
    return {
        str(c.get("type")): str(c.get("status"))
        for c in (obj.get("status") or {}).get("conditions") or ()
    }


@dataclass
class _Queue:
    cohort: str | None
    nominal: Usage
    borrowing: dict[FlavorResource, int | None]


class InvariantChecker:
    """Fed with watch events (``on_workload``, ``on_cluster_queue``, ``on_cohort``); thread
    safe, so a test thread can read it while an event loop thread feeds it."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.violations: list[Violation] = []
        self.workloads: dict[str, WorkloadHistory] = {}  # by uid
        self.queues: dict[str, _Queue] = {}
        self.queue_status: dict[str, dict[str, Any]] = {}
        self.cohort_quota: dict[str, Usage] = {}
        self.reserved: dict[str, Usage] = {}  # cluster queue -> reserved usage
        self._jobs: dict[str, set[str]] = {}  # job uid -> workload uids
        self.max_usage: dict[str, Usage] = {}
        self.events = 0

    # -- feeding --------------------------------------------------------------------------------

    def on_cluster_queue(self, event_type: str, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        with self._lock:
            self.events += 1
            if event_type == "DELETED":
                self.queues.pop(name, None)
                self.queue_status.pop(name, None)
                return
            spec = obj.get("spec") or {}
            nominal: Usage = {}
            borrowing: dict[FlavorResource, int | None] = {}
            for group in spec.get("resourceGroups") or ():
                for flavor in group.get("flavors") or ():
                    for res in flavor.get("resources") or ():
                        key = (str(flavor.get("name")), str(res.get("name")))
                        nominal[key] = _quantity(res.get("nominalQuota", 0), key[1])
                        limit = res.get("borrowingLimit")
                        borrowing[key] = None if limit is None else _quantity(limit, key[1])
            self.queues[name] = _Queue(spec.get("cohortName"), nominal, borrowing)
            status = obj.get("status") or {}
            self.queue_status[name] = status
            reported = _status_usage(status.get("flavorsReservation"))
            for key, amount in reported.items():
                bound = self._queue_bound(name, key)
                if bound is not None and amount > bound:
                    self._violate(
                        "status_overshoot",
                        name,
                        f"status.flavorsReservation {key[0]}/{key[1]} = {amount} > {bound}",
                    )

    def on_cohort(self, event_type: str, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        with self._lock:
            if event_type == "DELETED":
                self.cohort_quota.pop(name, None)
                return
            quota: Usage = {}
            for group in (obj.get("spec") or {}).get("resourceGroups") or ():
                for flavor in group.get("flavors") or ():
                    for res in flavor.get("resources") or ():
                        key = (str(flavor.get("name")), str(res.get("name")))
                        quota[key] = _quantity(res.get("nominalQuota", 0), key[1])
            self.cohort_quota[name] = quota

    def on_workload(self, event_type: str, obj: dict[str, Any]) -> None:
        metadata = obj.get("metadata") or {}
        uid = str(metadata.get("uid", ""))
        key = f"{metadata.get('namespace')}/{metadata.get('name')}"
        now = self._clock()
        with self._lock:
            self.events += 1
            history = self.workloads.get(uid)
            if history is None:
                history = self.workloads[uid] = WorkloadHistory(key=key, first_seen=now)
                for owner in metadata.get("ownerReferences") or ():
                    if owner.get("kind") == "Job":
                        history.owner_job = str(owner.get("uid"))
                        siblings = self._jobs.setdefault(history.owner_job, set())
                        siblings.add(uid)
                        if len(siblings) > 1:
                            self._violate(
                                "duplicate_workload",
                                key,
                                f"Job {owner.get('name')} owns {len(siblings)} Workloads",
                            )
            if event_type == "DELETED":
                self._release(history)
                return
            status = obj.get("status") or {}
            conditions = _conditions(obj)
            finished = conditions.get("Finished") == "True"
            admission = status.get("admission")
            reserved = (
                conditions.get("QuotaReserved") == "True" and bool(admission) and not finished
            )
            if conditions.get("Evicted") == "True":
                history.evicted_since_admission = True
            if finished:
                history.finished = True
                if not history.admissions and isinstance(admission, dict) and admission:
                    # Reserved and finished while the watch was down: a relist shows only
                    # the end. It was admitted (Finished keeps status.admission); count it
                    # once and say so, rather than report it never admitted.
                    history.admissions = 1
                    history.inferred = True
                    history.cluster_queue = str(admission.get("clusterQueue", ""))
            if reserved and isinstance(admission, dict):
                self._reserve(history, admission, now)
            else:
                if history.held is not None and not finished:
                    history.evictions += 1
                    history.evicted_since_admission = True
                self._release(history)

    # -- transitions ----------------------------------------------------------------------------

    def _reserve(self, history: WorkloadHistory, admission: Mapping[str, Any], now: float) -> None:
        if history.held is not None:
            if admission != history.admission:
                self._violate(
                    "double_admission",
                    history.key,
                    f"admission changed while reserved: {history.admission} -> {admission}",
                )
                self._release(history)
                history.evicted_since_admission = True  # reported once, just above
            else:
                return
        if history.admissions and not history.evicted_since_admission:
            self._violate(
                "double_admission",
                history.key,
                f"reserved again (admission #{history.admissions + 1}) without an eviction",
            )
        history.admissions += 1
        history.admitted_at.append(now)
        history.evicted_since_admission = False
        history.admission = admission
        history.cluster_queue = str(admission.get("clusterQueue", ""))
        usage = admission_usage(admission)
        history.held = usage
        total = self.reserved.setdefault(history.cluster_queue, {})
        for key, amount in usage.items():
            total[key] = total.get(key, 0) + amount
        self._check_limits(history, usage)

    def _release(self, history: WorkloadHistory) -> None:
        if history.held is None:
            return
        total = self.reserved.setdefault(history.cluster_queue, {})
        for key, amount in history.held.items():
            total[key] = total.get(key, 0) - amount
        history.held = None
        history.admission = None

    def _queue_bound(self, name: str, key: FlavorResource) -> int | None:
        queue = self.queues.get(name)
        if queue is None or key not in queue.nominal:
            return None
        nominal = queue.nominal[key]
        if not queue.cohort:
            return nominal
        limit = queue.borrowing.get(key)
        return None if limit is None else nominal + limit

    def _check_limits(self, history: WorkloadHistory, usage: Usage) -> None:
        name = history.cluster_queue
        queue = self.queues.get(name)
        total = self.reserved.get(name, {})
        peak = self.max_usage.setdefault(name, {})
        for key in usage:
            peak[key] = max(peak.get(key, 0), total.get(key, 0))
            if queue is None:
                continue
            if key not in queue.nominal:
                self._violate(
                    "overshoot", history.key, f"{name} has no quota for {key[0]}/{key[1]}"
                )
                continue
            bound = self._queue_bound(name, key)
            if bound is not None and total.get(key, 0) > bound:
                self._violate(
                    "overshoot",
                    history.key,
                    f"ClusterQueue {name} {key[0]}/{key[1]} reserved {total[key]} > {bound}"
                    " (nominal + borrowingLimit)",
                )
        if queue is not None and queue.cohort:
            members = [n for n, q in self.queues.items() if q.cohort == queue.cohort]
            for key in usage:
                capacity = sum(self.queues[n].nominal.get(key, 0) for n in members)
                capacity += self.cohort_quota.get(queue.cohort, {}).get(key, 0)
                used = sum(self.reserved.get(n, {}).get(key, 0) for n in members)
                if used > capacity:
                    self._violate(
                        "overshoot",
                        history.key,
                        f"cohort {queue.cohort} {key[0]}/{key[1]} reserved {used} > {capacity}"
                        " (sum of nominal quotas)",
                    )

    def _violate(self, kind: str, subject: str, detail: str) -> None:
        self.violations.append(Violation(kind, subject, detail, self._clock()))

    # -- reading --------------------------------------------------------------------------------

    def snapshot(self) -> list[Violation]:
        with self._lock:
            return list(self.violations)

    def history_by_key(self) -> dict[str, WorkloadHistory]:
        with self._lock:
            return {h.key: h for h in self.workloads.values()}

    def final_problems(self, *, queues: Iterable[str] | None = None) -> list[str]:
        """Leaks once everything should have finished: reserved usage in the watched
        Workloads, and in each ClusterQueue's own status."""
        with self._lock:
            names = sorted(queues if queues is not None else self.queues)
            problems = [str(v) for v in self.violations]
            for h in self.workloads.values():
                if h.held is not None:
                    problems.append(f"leak {h.key}: still reserved in {h.cluster_queue}")
            for name in names:
                left = {k: v for k, v in self.reserved.get(name, {}).items() if v}
                if left:
                    problems.append(f"leak {name}: reserved usage left {left}")
                status = self.queue_status.get(name) or {}
                for field_name in ("flavorsReservation", "flavorsUsage"):
                    reported = {k: v for k, v in _status_usage(status.get(field_name)).items() if v}
                    if reported:
                        problems.append(f"leak {name}: status.{field_name} = {reported}")
                for count in ("reservingWorkloads", "admittedWorkloads"):
                    if int(status.get(count) or 0):
                        problems.append(f"leak {name}: status.{count} = {status.get(count)}")
            return problems


def _status_usage(flavors: Any) -> Usage:
    usage: Usage = {}
    for flavor in flavors or ():
        for res in flavor.get("resources") or ():
            key = (str(flavor.get("name")), str(res.get("name")))
            usage[key] = _quantity(res.get("total", 0), key[1])
    return usage


class InvariantWatch:
    """Runs an :class:`InvariantChecker` on its own informers, in the caller's event loop
    (:meth:`start`) or in a background thread with its own loop (:meth:`start_thread`, for
    synchronous tests)."""

    def __init__(
        self,
        api_factory: Callable[[], KubeApi],
        *,
        checker: InvariantChecker | None = None,
        label_selector: str | None = None,
    ) -> None:
        self.api_factory = api_factory
        self.checker = checker or InvariantChecker()
        self.label_selector = label_selector
        self.informers: list[Informer] = []
        self._api: KubeApi | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._synced = threading.Event()

    async def start(self) -> None:
        self._api = self.api_factory()
        c = self.checker
        self.informers = [
            Informer(self._api, CLUSTER_QUEUES, c.on_cluster_queue),
            Informer(self._api, COHORTS, c.on_cohort),
            Informer(self._api, WORKLOADS, c.on_workload, label_selector=self.label_selector),
        ]
        for informer in self.informers:
            informer.start()
        await asyncio.gather(*(i.synced.wait() for i in self.informers))
        self._synced.set()

    async def stop(self) -> None:
        for informer in self.informers:
            await informer.stop()
        if self._api is not None:
            await self._api.close()

    def start_thread(self, *, timeout: float = 60.0) -> None:
        def main() -> None:
            async def run() -> None:
                self._loop = asyncio.get_running_loop()
                self._stop = asyncio.Event()
                await self.start()
                await self._stop.wait()
                await self.stop()

            asyncio.run(run())

        self._thread = threading.Thread(target=main, name="invariant-watch", daemon=True)
        self._thread.start()
        if not self._synced.wait(timeout):
            raise TimeoutError(f"the invariant watch did not list within {timeout}s")

    def stop_thread(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=30)
