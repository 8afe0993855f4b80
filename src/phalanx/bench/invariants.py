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

Watch gaps (an API-server restart, a ``410 Gone``): the informer lists again, and a list is
one snapshot of the API at one resourceVersion. :class:`InvariantWatch` hands each relist over
whole (``on_workload_list``): the checker replaces its view with it (a Workload not in it is
gone, every one in it is as listed), applies the releases before the reservations and judges
the limits once, on the listed state. Fed item by item, a relist would pass through states
the API never had (a Workload admitted in the gap counted beside one that finished in the gap
but comes later in the list, or that was deleted and is reported only after the list), and
report overshoots that never happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from phalanx.operator.informer import EventHandler, Informer
from phalanx.operator.kube import CLUSTER_QUEUES, WORKLOADS, KubeApi, Resource
from phalanx.quotas.quantity import QuantityError, parse_quantity

__all__ = [
    "InvariantChecker",
    "InvariantWatch",
    "ListingInformer",
    "Violation",
    "WorkloadHistory",
    "admission_usage",
]

logger = logging.getLogger(__name__)

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
    resource_version: str = ""
    """Of the last version applied (watch event or relist)."""
    reserved_since: str = ""
    """``lastTransitionTime`` of ``QuotaReserved`` when the current reservation was seen: a
    relist showing another one means the reservation was released and taken again in the
    gap."""


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


def _transition(obj: Mapping[str, Any], kind: str) -> str:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind:
            return str(c.get("lastTransitionTime") or "")
    return ""


@dataclass
class _Queue:
    cohort: str | None
    nominal: Usage
    borrowing: dict[FlavorResource, int | None]


@dataclass(frozen=True)
class _Seen:
    """One Workload version as the checker reads it."""

    history: WorkloadHistory
    obj: dict[str, Any]
    reserved: bool
    finished: bool
    evicted: bool
    admission: Any


TRACE_LIMIT = 50_000


class InvariantChecker:
    """Fed with watch events (``on_workload``, ``on_cluster_queue``, ``on_cohort``) and with
    whole relists (``on_workload_list``, ``on_cluster_queue_list``, ``on_cohort_list``); thread
    safe, so a test thread can read it while an event loop thread feeds it.

    ``trace`` keeps the last :data:`TRACE_LIMIT` Workload versions applied (with their
    resourceVersions) and the relists, so a violation can be checked against what the API
    said (:meth:`trace_lines`)."""

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
        self.relists = 0
        self.trace: deque[tuple[Any, ...]] = deque(maxlen=TRACE_LIMIT)

    # -- feeding: admin kinds -------------------------------------------------------------------

    def on_cluster_queue(self, event_type: str, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        with self._lock:
            self.events += 1
            if event_type == "DELETED":
                self.queues.pop(name, None)
                self.queue_status.pop(name, None)
                return
            self._apply_cluster_queue(name, obj)

    def on_cluster_queue_list(self, objects: Sequence[dict[str, Any]]) -> None:
        """A relist: the ClusterQueues not in it are gone."""
        with self._lock:
            self.events += len(objects)
            names = {(o.get("metadata") or {}).get("name", "") for o in objects}
            for name in set(self.queues) - names:
                self.queues.pop(name, None)
                self.queue_status.pop(name, None)
            for obj in objects:
                self._apply_cluster_queue((obj.get("metadata") or {}).get("name", ""), obj)

    def _apply_cluster_queue(self, name: str, obj: dict[str, Any]) -> None:
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
                    f"status.flavorsReservation {key[0]}/{key[1]} = {amount} > {bound}"
                    f" (resourceVersion {(obj.get('metadata') or {}).get('resourceVersion')})",
                )

    def on_cohort(self, event_type: str, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        with self._lock:
            if event_type == "DELETED":
                self.cohort_quota.pop(name, None)
                return
            self._apply_cohort(name, obj)

    def on_cohort_list(self, objects: Sequence[dict[str, Any]]) -> None:
        """A relist: the Cohorts not in it are gone."""
        with self._lock:
            names = {(o.get("metadata") or {}).get("name", "") for o in objects}
            for name in set(self.cohort_quota) - names:
                self.cohort_quota.pop(name, None)
            for obj in objects:
                self._apply_cohort((obj.get("metadata") or {}).get("name", ""), obj)

    def _apply_cohort(self, name: str, obj: dict[str, Any]) -> None:
        quota: Usage = {}
        for group in (obj.get("spec") or {}).get("resourceGroups") or ():
            for flavor in group.get("flavors") or ():
                for res in flavor.get("resources") or ():
                    key = (str(flavor.get("name")), str(res.get("name")))
                    quota[key] = _quantity(res.get("nominalQuota", 0), key[1])
        self.cohort_quota[name] = quota

    # -- feeding: workloads ---------------------------------------------------------------------

    def on_workload(self, event_type: str, obj: dict[str, Any]) -> None:
        """One watch event: a state the API had, right after the previous event's."""
        now = self._clock()
        with self._lock:
            self.events += 1
            seen = self._read(obj, now)
            self._trace(now, event_type, seen)
            if event_type == "DELETED":
                self._release(seen.history)
                return
            self._mark_progress(seen)
            if seen.reserved:
                if self._reserve(seen.history, seen.obj, seen.admission, now):
                    self._check_limits([seen.history], context="")
            else:
                self._stop_holding(seen)

    def on_workload_list(
        self, objects: Sequence[dict[str, Any]], *, resource_version: str | None = None
    ) -> None:
        """A relist: every Workload the API had at ``resource_version``, and nothing else.

        The view is replaced by it. What changed in the gap is applied releases first (gone,
        finished, evicted), then reservations, and the limits are judged once, on the listed
        state: never on a mix of listed and stale Workloads."""
        now = self._clock()
        context = f" (relist at resourceVersion {resource_version})"
        with self._lock:
            self.events += len(objects)
            self.relists += 1
            self.trace.append((now, "LIST", resource_version, len(objects)))
            listed = [self._read(obj, now) for obj in objects]
            uids = {id(s.history) for s in listed}
            for history in self.workloads.values():
                if id(history) not in uids and history.held is not None:
                    # Deleted in the gap: whatever it held is free at this resourceVersion.
                    self.trace.append((now, "GONE", history.key, history.resource_version))
                    self._release(history)
            for seen in listed:
                self._trace(now, "LISTED", seen)
                self._mark_progress(seen)
                if not seen.reserved:
                    self._stop_holding(seen)
                elif seen.history.held is not None:
                    self._gap_reservation(seen)
            grown = [
                seen.history
                for seen in listed
                if seen.reserved and self._reserve(seen.history, seen.obj, seen.admission, now)
            ]
            self._check_limits(grown, context=context)

    def _read(self, obj: dict[str, Any], now: float) -> _Seen:
        metadata = obj.get("metadata") or {}
        uid = str(metadata.get("uid", ""))
        history = self.workloads.get(uid)
        if history is None:
            key = f"{metadata.get('namespace')}/{metadata.get('name')}"
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
        history.resource_version = str(metadata.get("resourceVersion") or "")
        status = obj.get("status") or {}
        conditions = _conditions(obj)
        finished = conditions.get("Finished") == "True"
        admission = status.get("admission")
        reserved = (
            conditions.get("QuotaReserved") == "True"
            and isinstance(admission, dict)
            and bool(admission)
            and not finished
        )
        return _Seen(
            history, obj, reserved, finished, conditions.get("Evicted") == "True", admission
        )

    def _mark_progress(self, seen: _Seen) -> None:
        history = seen.history
        if seen.evicted:
            history.evicted_since_admission = True
        if seen.finished:
            history.finished = True
            admission = seen.admission
            if not history.admissions and isinstance(admission, dict) and admission:
                # Reserved and finished while the watch was down: a relist shows only
                # the end. It was admitted (Finished keeps status.admission); count it
                # once and say so, rather than report it never admitted.
                history.admissions = 1
                history.inferred = True
                history.cluster_queue = str(admission.get("clusterQueue", ""))

    def _stop_holding(self, seen: _Seen) -> None:
        history = seen.history
        if history.held is not None and not seen.finished:
            history.evictions += 1
            history.evicted_since_admission = True
        self._release(history)

    def _gap_reservation(self, seen: _Seen) -> None:
        """A Workload reserved before the gap and reserved in the relist: the same reservation,
        or one released and taken again in the gap. ``QuotaReserved`` moves its
        ``lastTransitionTime`` only when its status changes, so a new one means it went False
        in between: an eviction, as a watch would have shown it. The old usage is released
        here, before any reservation is counted, and :meth:`_reserve` judges the new one; the
        same transition time with another admission is a double admission (``_reserve``)."""
        history = seen.history
        since = _transition(seen.obj, "QuotaReserved")
        if history.reserved_since and since and since != history.reserved_since:
            history.evictions += 1
            history.evicted_since_admission = True
            self._release(history)

    # -- transitions ----------------------------------------------------------------------------

    def _reserve(
        self,
        history: WorkloadHistory,
        obj: Mapping[str, Any],
        admission: Mapping[str, Any],
        now: float,
    ) -> bool:
        """Count a reservation; True when usage grew (the limits are to be checked)."""
        if history.held is not None:
            if admission != history.admission:
                self._violate(
                    "double_admission",
                    history.key,
                    f"admission changed while reserved: {history.admission} -> {admission}"
                    f" (resourceVersion {history.resource_version})",
                )
                self._release(history)
                history.evicted_since_admission = True  # reported once, just above
            else:
                return False
        if history.admissions and not history.evicted_since_admission:
            self._violate(
                "double_admission",
                history.key,
                f"reserved again (admission #{history.admissions + 1}) without an eviction"
                f" (resourceVersion {history.resource_version})",
            )
        history.admissions += 1
        history.admitted_at.append(now)
        history.evicted_since_admission = False
        history.admission = admission
        history.reserved_since = _transition(obj, "QuotaReserved")
        history.cluster_queue = str(admission.get("clusterQueue", ""))
        usage = admission_usage(admission)
        history.held = usage
        total = self.reserved.setdefault(history.cluster_queue, {})
        for key, amount in usage.items():
            total[key] = total.get(key, 0) + amount
        return True

    def _release(self, history: WorkloadHistory) -> None:
        if history.held is None:
            return
        total = self.reserved.setdefault(history.cluster_queue, {})
        for key, amount in history.held.items():
            total[key] = total.get(key, 0) - amount
        history.held = None
        history.admission = None
        history.reserved_since = ""

    def _queue_bound(self, name: str, key: FlavorResource) -> int | None:
        queue = self.queues.get(name)
        if queue is None or key not in queue.nominal:
            return None
        nominal = queue.nominal[key]
        if not queue.cohort:
            return nominal
        limit = queue.borrowing.get(key)
        return None if limit is None else nominal + limit

    def _check_limits(self, grown: Sequence[WorkloadHistory], *, context: str) -> None:
        """Judge the current view where ``grown`` added usage: each bound once, the first
        Workload that grew it named as the subject."""
        judged: set[tuple[str, str, FlavorResource]] = set()
        for history in grown:
            name = history.cluster_queue
            usage = history.held or {}
            queue = self.queues.get(name)
            total = self.reserved.get(name, {})
            peak = self.max_usage.setdefault(name, {})
            for key in usage:
                peak[key] = max(peak.get(key, 0), total.get(key, 0))
                if queue is None or ("queue", name, key) in judged:
                    continue
                judged.add(("queue", name, key))
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
                        f" (nominal + borrowingLimit){context}; held by"
                        f" {self._holders([name], key)}",
                    )
            if queue is None or not queue.cohort:
                continue
            members = [n for n, q in self.queues.items() if q.cohort == queue.cohort]
            for key in usage:
                if ("cohort", queue.cohort, key) in judged:
                    continue
                judged.add(("cohort", queue.cohort, key))
                capacity = sum(self.queues[n].nominal.get(key, 0) for n in members)
                capacity += self.cohort_quota.get(queue.cohort, {}).get(key, 0)
                used = sum(self.reserved.get(n, {}).get(key, 0) for n in members)
                if used > capacity:
                    self._violate(
                        "overshoot",
                        history.key,
                        f"cohort {queue.cohort} {key[0]}/{key[1]} reserved {used} > {capacity}"
                        f" (sum of nominal quotas){context}; held by"
                        f" {self._holders(members, key)}",
                    )

    def _holders(self, queues: Sequence[str], key: FlavorResource) -> str:
        """``name@resourceVersion=amount`` of every Workload counted in ``queues``."""
        held = sorted(
            (h.key.rsplit("/", 1)[-1], h.resource_version, (h.held or {}).get(key, 0))
            for h in self.workloads.values()
            if h.held and h.cluster_queue in queues and (h.held or {}).get(key)
        )
        return ", ".join(f"{name}@{rv}={amount}" for name, rv, amount in held)

    def _violate(self, kind: str, subject: str, detail: str) -> None:
        self.violations.append(Violation(kind, subject, detail, self._clock()))
        self.trace.append((self._clock(), "VIOLATION", kind, subject, detail))

    def _trace(self, now: float, event_type: str, seen: _Seen) -> None:
        h = seen.history
        state = (
            "finished"
            if seen.finished
            else f"reserved:{(seen.admission or {}).get('clusterQueue', '')}"
            if seen.reserved
            else "evicted"
            if seen.evicted
            else "pending"
        )
        gpus = ",".join(f"{k[1]}={v}" for k, v in sorted(admission_usage(seen.admission).items()))
        self.trace.append((now, event_type, h.key, h.resource_version, state, gpus))

    # -- reading --------------------------------------------------------------------------------

    def snapshot(self) -> list[Violation]:
        with self._lock:
            return list(self.violations)

    def history_by_key(self) -> dict[str, WorkloadHistory]:
        with self._lock:
            return {h.key: h for h in self.workloads.values()}

    def trace_lines(self) -> list[str]:
        """The trace, one line per Workload version, relist or violation."""
        with self._lock:
            rows = list(self.trace)
        return [f"{row[0]:.3f} " + " ".join(str(x) for x in row[1:]) for row in rows]

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


class ListingInformer(Informer):
    """An :class:`Informer` that hands each (re)list over whole: ``on_list(objects,
    resource_version)`` once the list completed, instead of one event per listed object
    (and one ``DELETED`` per vanished one) as the informer delivers them. Watch events go to
    ``handler`` as usual. A list that fails part-way is dropped; the informer lists again."""

    def __init__(
        self,
        api: KubeApi,
        resource: Resource,
        handler: EventHandler,
        on_list: Callable[[list[dict[str, Any]], str | None], None],
        **kwargs: Any,
    ) -> None:
        super().__init__(api, resource, self._dispatch, **kwargs)
        self._on_event = handler
        self._on_list = on_list
        self._listing: list[dict[str, Any]] | None = None

    def _dispatch(self, kind: str, obj: dict[str, Any]) -> None:
        if self._listing is None:
            self._on_event(kind, obj)
        elif kind != "DELETED":  # vanished objects: implied by their absence from the list
            self._listing.append(obj)

    async def _relist(self) -> None:
        self._listing = []
        try:
            await super()._relist()
            listed = self._listing
        finally:
            self._listing = None
        # No await since the list ended: nothing (not even ``synced`` waiters) runs before
        # the snapshot is applied.
        try:
            self._on_list(listed, self.resource_version)
        except Exception:
            self.stats.handler_errors += 1
            logger.exception("event=list_handler_error resource=%s", self.name)


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
            ListingInformer(
                self._api,
                CLUSTER_QUEUES,
                c.on_cluster_queue,
                lambda objects, _rv: c.on_cluster_queue_list(objects),
            ),
            ListingInformer(
                self._api, COHORTS, c.on_cohort, lambda objects, _rv: c.on_cohort_list(objects)
            ),
            ListingInformer(
                self._api,
                WORKLOADS,
                c.on_workload,
                lambda objects, rv: c.on_workload_list(objects, resource_version=rv),
                label_selector=self.label_selector,
            ),
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
