"""ClusterQueue and LocalQueue status, batched: at most one write per queue per interval.

The scheduling loop takes a snapshot from the core between cycles (the core is only read
there); a flusher task writes each queue whose status differs from what it last wrote, by
server-side apply. Kueue writes queue status on every change; during a burst that is one
write per admission per queue, which Phalanx avoids.

A snapshot costs O(queues + workloads that changed), not O(workloads): each ClusterQueue's
status is computed once, and the LocalQueue counts are kept by ``LocalQueueCounts`` from the
workloads that changed since the last snapshot (Workload events, and the core's own moves
in and out of admitted, claiming and evicting), with a full recount now and then as a
safety net.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from phalanx.admission.records import Entry, Phase
from phalanx.admission.scheduler import ClusterQueueStatus, Scheduler
from phalanx.operator import conditions as cond
from phalanx.operator.afs import decayed_status
from phalanx.operator.afs import status_of as afs_status_of
from phalanx.operator.history import StoreHealth
from phalanx.operator.kube import CLUSTER_QUEUES, LOCAL_QUEUES, ApiError, KubeApi, Resource
from phalanx.operator.metrics import Metrics
from phalanx.operator.retry import TRANSIENT_ERRORS
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import APPLY_PATCH, FIELD_MANAGER
from phalanx.quotas.quantity import format_quantity

__all__ = [
    "STORE_CONDITION",
    "LocalQueueCounts",
    "QueueStatus",
    "cluster_queue_status",
    "local_queue_counts",
]

STORE_CONDITION = "HistoryStoreAvailable"
"""A ClusterQueue condition Phalanx adds when it writes a usage history store."""
_STORE = "store"

logger = logging.getLogger(__name__)

Usage = Mapping[tuple[str, str], int]
Flavors = list[tuple[str, list[str]]]


def _flavor_list(
    usage: Usage, *, flavors: list[tuple[str, list[str]]], borrowed: Usage | None
) -> list[dict[str, Any]]:
    """Kueue lists every flavor and resource of the queue, zeros included."""
    out = []
    for flavor, resources in flavors:
        entries = []
        for resource in resources:
            entry: dict[str, Any] = {
                "name": resource,
                "total": format_quantity(usage.get((flavor, resource), 0), resource=resource),
            }
            if borrowed is not None:
                entry["borrowed"] = format_quantity(
                    borrowed.get((flavor, resource), 0), resource=resource
                )
            entries.append(entry)
        out.append({"name": flavor, "resources": entries})
    return out


def _spec_flavors(cq: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    flavors: list[tuple[str, list[str]]] = []
    for group in (cq.get("spec") or {}).get("resourceGroups") or ():
        for flavor in group.get("flavors") or ():
            flavors.append((flavor["name"], [r["name"] for r in flavor.get("resources") or ()]))
    return flavors


def cluster_queue_status(
    scheduler: Scheduler,
    cq: Mapping[str, Any],
    *,
    invalid: str | None = None,
    status: ClusterQueueStatus | None = None,
    flavors: Flavors | None = None,
) -> dict[str, Any]:
    """The status Phalanx owns on a ClusterQueue (without condition timestamps); ``status``
    and ``flavors``, when given, are the core's status and the spec's flavors, already
    computed."""
    name = cq["metadata"]["name"]
    if invalid is not None or name not in scheduler.queues:
        return {
            "active": ("False", "InvalidSpec" if invalid else "Pending", invalid or "Not ready"),
            "pendingWorkloads": 0,
            "reservingWorkloads": 0,
            "admittedWorkloads": 0,
        }
    st = status if status is not None else scheduler.cluster_queue_status(name)
    if flavors is None:
        flavors = _spec_flavors(cq)
    if st.active:
        active = ("True", "Ready", "Can admit new workloads")
    else:
        reason, _, detail = st.reason.partition(": ")
        active = ("False", reason or "Inactive", detail or st.reason)
    return {
        "active": active,
        "pendingWorkloads": st.pending,
        "reservingWorkloads": st.reserving,
        "admittedWorkloads": st.admitted,
        "flavorsReservation": _flavor_list(st.usage, flavors=flavors, borrowed=st.borrowed),
        "flavorsUsage": _flavor_list(st.usage, flavors=flavors, borrowed=st.borrowed),
        "fairSharing": _fair_sharing(scheduler, name, st.weighted_share),
    }


def _fair_sharing(scheduler: Scheduler, name: str, weighted_share: int) -> dict[str, Any]:
    """``status.fairSharing``; with decayed fair sharing, the ClusterQueue's decayed usage
    as last sampled beside its share (a new leader restores it from there)."""
    found: dict[str, Any] = {"weightedShare": weighted_share}
    ledger = scheduler.decayed_usage
    usage = ledger.get(name) if ledger is not None else None
    if usage is not None:
        found["admissionFairSharingStatus"] = decayed_status(usage)
    return found


Contribution = tuple[str, int, int, int, dict[tuple[str, str], int] | None]
"""What one workload adds to its LocalQueue's counts: (LocalQueue key, pending, reserving,
admitted, usage)."""


def _contribution(entry: Entry) -> Contribution:
    if entry.phase == Phase.PENDING:
        return (entry.local_queue, 1, 0, 0, None)
    admitted = 1 if entry.phase in (Phase.ADMITTED, Phase.EVICTING) else 0
    return (entry.local_queue, 0, 1, admitted, dict(entry.usage) if entry.usage else None)


def local_queue_counts(scheduler: Scheduler) -> dict[str, dict[str, Any]]:
    """Per LocalQueue key: pending / reserving / admitted counts and usage by flavor, by a
    scan of every workload (``LocalQueueCounts`` keeps the same numbers incrementally)."""
    out: dict[str, dict[str, Any]] = {}
    for entry in list(scheduler.entries.values()):
        lq_key, pending, reserving, admitted, usage = _contribution(entry)
        lq = out.setdefault(lq_key, {"pending": 0, "reserving": 0, "admitted": 0, "usage": {}})
        lq["pending"] += pending
        lq["reserving"] += reserving
        lq["admitted"] += admitted
        for fr, amount in (usage or {}).items():
            lq["usage"][fr] = lq["usage"].get(fr, 0) + amount
    return out


class LocalQueueTotals:
    """One LocalQueue's counts; ``version`` changes whenever they do."""

    __slots__ = ("admitted", "pending", "reserving", "usage", "version")

    def __init__(self) -> None:
        self.pending = 0
        self.reserving = 0
        self.admitted = 0
        self.usage: dict[tuple[str, str], int] = {}
        self.version = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "pending": self.pending,
            "reserving": self.reserving,
            "admitted": self.admitted,
            "usage": dict(self.usage),
        }


class LocalQueueCounts:
    """Per LocalQueue counts, kept up to date from the workloads that changed.

    ``refresh`` (once per snapshot) re-examines only: the Workloads with a watch event since
    the two previous refreshes (an event is absorbed by the core at the scheduling loop's
    next sync, which may come after the refresh that first sees it), and the workloads the
    core moved in or out of a ClusterQueue's admitted set, the claims or the evictions on
    its own (found by set differences, only for ClusterQueues whose counts or usage moved).
    Every ``recount_seconds``, and for a new scheduler, everything is counted again.

    The keys of events no refresh has looked at are bounded by ``max_events``: beyond, they
    are dropped for a recount (a standby replica's informers run, its loop does not).
    """

    def __init__(self, *, recount_seconds: float = 60.0, max_events: int = 100_000) -> None:
        self.recount_seconds = recount_seconds
        self.max_events = max_events
        self._recounts_due = 0
        self.totals: dict[str, LocalQueueTotals] = {}
        self._scheduler: Scheduler | None = None
        self._recounted_at = 0.0
        self._version = 0
        self._counted: dict[str, Contribution] = {}
        self._events: set[str] = set()
        self._events_before: set[str] = set()
        self._queue_marks: dict[str, tuple[object, ...]] = {}
        self._admitted: dict[str, set[str]] = {}
        self._claims: set[str] = set()
        self._evicting: set[str] = set()

    def workload_changed(self, key: str) -> None:
        """A Workload had a watch event (or the operator recorded its own write)."""
        self._events.add(key)
        if len(self._events) > self.max_events:
            # Recount twice: once for what the core has, once more for what it had not yet.
            self._events.clear()
            self._events_before.clear()
            self._recounts_due = 2

    def get(self, local_queue: str) -> LocalQueueTotals | None:
        return self.totals.get(local_queue)

    def refresh(self, scheduler: Scheduler, *, now: float) -> None:
        if (
            self._recounts_due
            or scheduler is not self._scheduler
            or now - self._recounted_at >= self.recount_seconds
        ):
            self.recount(scheduler, now=now)
            return
        changed = self._events | self._events_before
        self._events_before, self._events = self._events, set()
        for name, state in scheduler.queues.items():
            mark = (len(state.admitted), state.queue.pending, tuple(state.node.usage.items()))
            if self._queue_marks.get(name) == mark:
                continue
            self._queue_marks[name] = mark
            seen = self._admitted.setdefault(name, set())
            moved = state.admitted.keys() ^ seen  # in C: no Python code per workload
            seen ^= moved
            changed |= moved
        for name in [n for n in self._queue_marks if n not in scheduler.queues]:
            del self._queue_marks[name]
            changed |= self._admitted.pop(name, set())
        for now_in, seen in (
            (scheduler.claims, self._claims),
            (scheduler.evicting, self._evicting),
        ):
            moved = now_in.keys() ^ seen
            seen ^= moved
            changed |= moved
        for key in changed:
            self._examine(scheduler, key)

    def recount(self, scheduler: Scheduler, *, now: float) -> None:
        """Count every workload again (a new scheduler, or the periodic safety net)."""
        self._scheduler = scheduler
        self._recounted_at = now
        self._recounts_due = max(0, self._recounts_due - 1)
        self.totals = {}
        self._counted = {}
        # Events since the last loop sync are not in the core yet: look at them again.
        self._events_before, self._events = self._events, set()
        for key, entry in scheduler.entries.items():
            contribution = _contribution(entry)
            self._counted[key] = contribution
            self._add(contribution, 1)
        self._queue_marks = {
            name: (len(state.admitted), state.queue.pending, tuple(state.node.usage.items()))
            for name, state in scheduler.queues.items()
        }
        self._admitted = {name: set(state.admitted) for name, state in scheduler.queues.items()}
        self._claims = set(scheduler.claims)
        self._evicting = set(scheduler.evicting)

    def _examine(self, scheduler: Scheduler, key: str) -> None:
        entry = scheduler.entries.get(key)
        new = _contribution(entry) if entry is not None else None
        old = self._counted.get(key)
        if old == new:
            return
        if old is not None:
            self._add(old, -1)
        if new is None:
            del self._counted[key]
        else:
            self._counted[key] = new
            self._add(new, 1)

    def _add(self, contribution: Contribution, sign: int) -> None:
        lq_key, pending, reserving, admitted, usage = contribution
        totals = self.totals.get(lq_key)
        if totals is None:
            totals = self.totals[lq_key] = LocalQueueTotals()
        totals.pending += sign * pending
        totals.reserving += sign * reserving
        totals.admitted += sign * admitted
        for fr, amount in (usage or {}).items():
            total = totals.usage.get(fr, 0) + sign * amount
            if total:
                totals.usage[fr] = total
            else:
                totals.usage.pop(fr, None)
        self._version += 1
        totals.version = self._version
        if not (totals.pending or totals.reserving or totals.admitted or totals.usage):
            del self.totals[lq_key]


class QueueStatus:
    def __init__(
        self,
        api: KubeApi,
        state: ClusterState,
        metrics: Metrics,
        *,
        interval: float = 1.0,
        recount_seconds: float = 60.0,
    ) -> None:
        self.api = api
        self.state = state
        self.metrics = metrics
        self.interval = interval
        self.counts = LocalQueueCounts(recount_seconds=recount_seconds)
        self._snapshot: dict[tuple[str, str], dict[str, Any]] = {}
        self._written: dict[tuple[str, str], dict[str, Any]] = {}
        # LocalQueue key -> (what its status was built from, the status): rebuilt only when
        # one of them changed, so an unchanged queue costs a comparison per snapshot.
        self._local: dict[str, tuple[tuple[object, ...], dict[str, Any]]] = {}
        self._taken = 0.0
        self._task: asyncio.Task[None] | None = None
        # A queue created since the last snapshot: its status is due at once (kubectl shows
        # blank columns until it is written), not after the batching interval.
        self._new_queue = False
        self._wake = asyncio.Event()
        self.store_health: Callable[[], StoreHealth] | None = None
        """The usage history store's health, when the operator writes one: each
        ClusterQueue's ``HistoryStoreAvailable`` condition says it."""
        state.subscribe(self._on_change)

    def _on_change(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        if kind == "Workload":
            self.counts.workload_changed(key)
        elif (
            kind in ("ClusterQueue", "LocalQueue")
            and obj is not None
            and (kind, key) not in self._snapshot
        ):
            self._new_queue = True

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="phalanx-qstatus")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def snapshot(
        self, scheduler: Scheduler, invalid: Mapping[str, str], *, force: bool = False
    ) -> None:
        """Called by the scheduling loop between cycles (at most once per interval)."""
        now = time.monotonic()
        if not force and not self._new_queue and now - self._taken < self.interval:
            return
        self._taken = now
        if self._new_queue:
            self._new_queue = False
            self._wake.set()
        cluster_queues = self.state.objects["ClusterQueue"]
        snapshot: dict[tuple[str, str], dict[str, Any]] = {}
        for kind, name in self._snapshot:
            if kind == "ClusterQueue" and name not in cluster_queues:
                self.metrics.forget_queue(name)  # deleted: its series must not linger
                self._written.pop((kind, name), None)
        # Each ClusterQueue's status once, whatever the number of its LocalQueues.
        statuses = {
            name: scheduler.cluster_queue_status(name)
            for name in cluster_queues
            if name in scheduler.queues
        }
        flavors = {name: _spec_flavors(cq) for name, cq in cluster_queues.items()}
        store = self.store_health() if self.store_health is not None else None
        for name, cq in cluster_queues.items():
            st = statuses.get(name)
            snapshot[("ClusterQueue", name)] = cluster_queue_status(
                scheduler,
                cq,
                invalid=invalid.get(f"ClusterQueue/{name}"),
                status=st,
                flavors=flavors[name],
            )
            if store is not None:
                snapshot[("ClusterQueue", name)][_STORE] = store
            self._metrics(scheduler, name, cq, st, flavors[name])
        self.counts.refresh(scheduler, now=now)
        local: dict[str, tuple[tuple[object, ...], dict[str, Any]]] = {}
        fair_queues = set(scheduler.fair_sharing_local_queues())
        for key, lq in self.state.objects["LocalQueue"].items():
            cq_name = (lq.get("spec") or {}).get("clusterQueue", "")
            totals = self.counts.get(key)
            st = statuses.get(cq_name)
            built_from: tuple[object, ...] = (
                lq,
                cluster_queues.get(cq_name),
                None if st is None else st.active,
                None if totals is None else totals.version,
            )
            fair = scheduler.fair_usage.get(key) if scheduler.fair_usage is not None else None
            if fair is not None and key not in fair_queues:
                fair = None
            built_from += (None if fair is None else (fair.reported_at, str(fair.reported)),)
            cached = self._local.get(key)
            if cached is not None and cached[0] == built_from:
                status = cached[1]
            else:
                status = self._local_queue_status(
                    key, lq, cq_name, statuses, flavors.get(cq_name, []), totals
                )
                if fair is not None:
                    status["fairSharing"] = afs_status_of(fair)
            local[key] = (built_from, status)
            snapshot[("LocalQueue", key)] = status
        self._local = local
        self._snapshot = snapshot

    def _local_queue_status(
        self,
        key: str,
        lq: Mapping[str, Any],
        cq_name: str,
        statuses: Mapping[str, ClusterQueueStatus],
        flavors: Flavors,
        totals: LocalQueueTotals | None,
    ) -> dict[str, Any]:
        st = statuses.get(cq_name)
        if st is None:
            active = (
                "False",
                "ClusterQueueDoesNotExist",
                f"Can't submit new workloads to clusterQueue {cq_name}",
            )
        elif not st.active:
            active = ("False", "ClusterQueueIsInactive", f"ClusterQueue {cq_name} is inactive")
        elif ((lq.get("spec") or {}).get("stopPolicy") or "None") != "None":
            active = ("False", "Stopped", "LocalQueue is stopped")
        else:
            active = ("True", "Ready", "Can submit new workloads to localQueue")
        usage = _flavor_list(totals.usage if totals else {}, flavors=flavors, borrowed=None)
        return {
            "active": active,
            "pendingWorkloads": totals.pending if totals else 0,
            "reservingWorkloads": totals.reserving if totals else 0,
            "admittedWorkloads": totals.admitted if totals else 0,
            "flavorsReservation": usage,
            "flavorsUsage": usage,
        }

    def _metrics(
        self,
        scheduler: Scheduler,
        name: str,
        cq: Mapping[str, Any],
        st: ClusterQueueStatus | None,
        flavors: Flavors,
    ) -> None:
        if st is None or name not in scheduler.queues:
            self.metrics.forget_queue(name)
            return
        cohort = (cq.get("spec") or {}).get("cohortName") or ""
        nominal = {
            (flavor, resource): float(scheduler.queues[name].node.nominal((flavor, resource)))
            for flavor, resources in flavors
            for resource in resources
        }
        self.metrics.queue_state(
            name,
            cohort=cohort,
            active=st.active,
            pending_active=st.pending,
            pending_inadmissible=0,
            reserving=st.reserving,
            admitted=st.admitted,
            usage={fr: float(v) for fr, v in st.usage.items()},
            nominal=nominal,
        )

    async def _run(self) -> None:
        # Never ends on an error: a status writer that died quietly would leave every queue
        # reporting what it held at that moment (found by the API-server restart fault test).
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self._write_changed()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                logger.error("event=queue_status_pass_failed error=%r", error)

    async def _write_changed(self) -> None:
        for (kind, key), status in list(self._snapshot.items()):
            last = self._written.get((kind, key))
            if last is status or last == status:
                continue
            try:
                written = await self._write(kind, key, status)
            except TRANSIENT_ERRORS as error:
                # The API server is unreachable: stop this pass, the next one retries.
                self.metrics.api_write(kind, "status", ok=False)
                logger.warning(
                    "event=queue_status_failed kind=%s name=%s error=%r", kind, key, error
                )
                return
            if written:
                self._written[(kind, key)] = status

    async def _write(self, kind: str, key: str, status: Mapping[str, Any]) -> bool:
        current = self.state.get(kind, key)
        if current is None:
            return False
        active_status, reason, message = status["active"]
        now_ms = int(time.time() * 1000)
        store: StoreHealth | None = status.get(_STORE)
        owned = ("Active", STORE_CONDITION) if store is not None else ("Active",)
        conditions = cond.set_condition(
            [
                c
                for c in (current.get("status") or {}).get("conditions") or ()
                if c.get("type") in owned
            ],
            "Active",
            status=active_status == "True",
            reason=reason,
            message=message,
            now_ms=now_ms,
        )
        if store is not None:
            conditions = cond.set_condition(
                conditions,
                STORE_CONDITION,
                status=store.ok,
                reason=store.reason,
                message=store.message,
                now_ms=now_ms,
            )
        body_status = {k: v for k, v in status.items() if k not in ("active", _STORE)}
        body_status["conditions"] = conditions
        resource: Resource = CLUSTER_QUEUES if kind == "ClusterQueue" else LOCAL_QUEUES
        namespace, _, name = key.rpartition("/")
        metadata: dict[str, str] = {"name": name}
        if namespace:
            metadata["namespace"] = namespace
        body = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": kind,
            "metadata": metadata,
            "status": body_status,
        }
        try:
            response = await self.api.request(
                "PATCH",
                resource.path(namespace=namespace or None, name=name) + "/status",
                params={"fieldManager": FIELD_MANAGER, "force": "true"},
                body=body,
                content_type=APPLY_PATCH,
            )
        except ApiError as error:
            self.metrics.api_write(kind, "status", ok=False)
            if not error.not_found:
                logger.warning(
                    "event=queue_status_failed kind=%s name=%s error=%r", kind, key, str(error)
                )
            return False
        self.metrics.api_write(kind, "status", ok=True)
        self.state.apply(kind, "MODIFIED", response)
        return True
