"""The usage history writer: Workload lifecycle events into the store, off the hot path.

Fed by the cluster state's change feed (every Workload version the operator observes, its own
status writes included), it derives events (:func:`phalanx.store.events.events_of`) into a
bounded backlog and a background task writes them in batches, in a worker thread. Scheduling
never waits on the database:

- the listener only derives and enqueues; a full backlog drops the newest events, counts them
  (``phalanx_store_events_dropped_total``) and marks a resync;
- while the database is slow or down, writes back off (up to 30 s) and the backlog stays
  (``phalanx_store_backlog_events``, ``phalanx_store_up``);
- on start (as leader, once the informers have listed), and after a write succeeds again
  following dropped events, the gap is filled from the API's state: every Workload held is
  derived again (its conditions carry the transitions' times, so nothing is counted twice), and
  reservations the store holds open for Workloads no longer in the API end as ``deleted``.

What a resync cannot recover is a transition whose condition was overwritten meanwhile (an
eviction followed by a new admission while the backlog was full): that loss is the dropped
count, never silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy import Engine, case, func, select

from phalanx.operator.state import ClusterState
from phalanx.store import db, quotas
from phalanx.store import events as ev
from phalanx.store.models import WorkloadEvent

__all__ = ["UNAVAILABLE_AFTER_SECONDS", "HistoryRecorder", "StoreHealth"]

UNAVAILABLE_AFTER_SECONDS = 10.0


@dataclass(frozen=True)
class StoreHealth:
    """The store's state as a condition says it."""

    ok: bool
    reason: str
    message: str


logger = logging.getLogger(__name__)

_Key = tuple[str, str, dt.datetime]
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


class HistoryRecorder:
    """Writes what Workloads went through into the store; only the leader starts it."""

    def __init__(
        self,
        state: ClusterState,
        registry: CollectorRegistry,
        *,
        url: str,
        ready: asyncio.Event | None = None,
        namespaces: tuple[str, ...] = (),
        max_backlog: int = 100_000,
        batch_size: int = 1000,
        flush_interval: float = 3.0,
        max_backoff: float = 30.0,
        clock: Callable[[], dt.datetime] = _utcnow,
        engine: Engine | None = None,
    ) -> None:
        self.state = state
        self.url = url
        self.ready = ready
        self.namespaces = namespaces
        """The namespaces this operator watches (all when empty): only there does a Workload
        missing from the state mean it is gone."""
        self.max_backlog = max_backlog
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.max_backoff = max_backoff
        self._clock = clock
        self._engine = engine
        self._backlog: dict[_Key, ev.Event] = {}
        self._written: dict[str, set[_Key]] = {}
        """Per live Workload UID, the keys already stored (forgotten when it is deleted)."""
        self._quota_backlog: dict[tuple[str, int, bool], quotas.QuotaSnapshot] = {}
        self._quota_written: set[tuple[str, int, bool]] = set()
        """ClusterQueue quota versions (:mod:`phalanx.store.quotas`) waiting, and stored."""
        self._cluster_queues: dict[str, dict[str, Any]] = {}
        """ClusterQueue name -> its last object, for the deletion version."""
        self._names: dict[str, dict[str, Any]] = {}
        """Workload key -> its last object, for the deletion event (the feed sends None)."""
        self._signatures: dict[str, tuple[Any, ...]] = {}
        """Workload key -> ``events.signature`` of the version last derived."""
        self._active = False
        self._failing_since: float | None = None
        """Monotonic time of the first failed write since the last that succeeded."""
        self._failing_at = self._clock()
        """The same, naive UTC (for the condition's message)."""
        self._resync_needed = False
        self._migrated = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.backlog_gauge = Gauge(
            "phalanx_store_backlog_events",
            "Workload lifecycle events waiting to be written to the usage history store",
            registry=registry,
        )
        self.up = Gauge(
            "phalanx_store_up",
            "1 when the last write to the usage history store succeeded, else 0",
            registry=registry,
        )
        self.written_total = Counter(
            "phalanx_store_events_written",
            "Workload lifecycle events written to the usage history store (new rows)",
            registry=registry,
        )
        self.dropped_total = Counter(
            "phalanx_store_events_dropped",
            "Events dropped because the backlog was full (a resync from the API follows)",
            registry=registry,
        )
        self.errors_total = Counter(
            "phalanx_store_write_errors",
            "Failed writes to the usage history store (each is retried)",
            registry=registry,
        )
        self.cpu_total = Counter(
            "phalanx_store_cpu_seconds",
            "CPU time the usage history store costs the operator: deriving events on the"
            " event loop and writing them in worker threads (each thread's own CPU time)",
            registry=registry,
        )
        self.backlog_gauge.set_function(lambda: len(self._backlog))
        state.subscribe(self._on_change)

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    def health(self, *, now: float | None = None) -> StoreHealth:
        """Whether the store takes writes, for the ClusterQueues' ``HistoryStoreAvailable``
        condition: unavailable once writes have failed for :data:`UNAVAILABLE_AFTER_SECONDS`
        (one failed write that the next retry fixes is not worth a status write per queue)."""
        since = self._failing_since
        now = time.monotonic() if now is None else now
        if since is None or now - since < UNAVAILABLE_AFTER_SECONDS:
            return StoreHealth(True, "Writing", "the usage history store takes writes")
        # Nothing in it changes while the outage lasts (dropped events are the metrics' and the
        # log's to say): one status write per queue per outage.
        return StoreHealth(
            False,
            "StoreUnavailable",
            "writes to the usage history store have failed since"
            f" {self._failing_at.strftime('%Y-%m-%dT%H:%M:%SZ')}"
            + "; scheduling goes on, but usage reports, budgets and fair-sharing history lag"
            " until it is back (phalanx_store_up, phalanx_store_backlog_events,"
            " phalanx_store_events_dropped_total, the operator's log)",
        )

    # -- the feed (on the event loop, cheap) --------------------------------------------------

    def _on_change(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        if kind not in ("Workload", "ClusterQueue") or not self._active:
            return
        started = time.thread_time()
        try:
            if kind == "Workload":
                self._derive(key, obj)
            else:
                self._derive_quota(key, obj)
        finally:
            self.cpu_total.inc(time.thread_time() - started)

    def _derive_quota(self, key: str, obj: dict[str, Any] | None) -> None:
        if obj is None:
            last = self._cluster_queues.pop(key, None)
            if last is None:
                return
            snapshot = quotas.snapshot_of(last, seen_at=self._clock(), deleted=True)
        else:
            self._cluster_queues[key] = obj
            metadata = obj.get("metadata") or {}
            seen = (str(metadata.get("uid")), int(metadata.get("generation") or 1), False)
            if seen in self._quota_written or seen in self._quota_backlog:
                return  # a status write: the same quotas
            snapshot = quotas.snapshot_of(obj, seen_at=self._clock())
        if snapshot is not None and snapshot.key not in self._quota_written:
            # A few per ClusterQueue in its lifetime: never dropped for the backlog's bound.
            self._quota_backlog.setdefault(snapshot.key, snapshot)
            self._wake.set()

    def _derive(self, key: str, obj: dict[str, Any] | None) -> None:
        if obj is None:
            self._signatures.pop(key, None)
            last = self._names.pop(key, None)
            deleted = ev.deleted_event(last, at=self._clock()) if last is not None else None
            if deleted is not None:
                self._enqueue([deleted])
            return
        self._names[key] = {"metadata": obj.get("metadata"), "spec": obj.get("spec")}
        signature = ev.signature(obj)
        if self._signatures.get(key) == signature:
            return  # no transition changed (a status write): the same events as last time
        self._signatures[key] = signature
        self._enqueue(ev.events_of(obj))

    def _enqueue(self, events: list[ev.Event]) -> None:
        for event in events:
            key = event.key
            if key in self._backlog or key in self._written.get(event.uid, ()):
                continue
            if len(self._backlog) >= self.max_backlog:
                self.dropped_total.inc()
                if not self._resync_needed:
                    logger.warning(
                        "event=store_backlog_full backlog=%d action=drop_then_resync",
                        len(self._backlog),
                    )
                self._resync_needed = True
                continue
            self._backlog[key] = event
        if self._backlog:
            self._wake.set()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="phalanx-history")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._active = False
        if self._backlog and self._migrated:
            # A clean stop (leader hand-over) writes what it can in a few seconds; the next
            # leader's resync fills whatever is left.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5.0):
                    await self.flush_once()
        if self._engine is not None:
            self._engine.dispose()

    async def _run(self) -> None:
        if self.ready is not None:
            await self.ready.wait()
        self._active = True
        backoff = self.flush_interval
        while True:
            try:
                if not self._migrated:
                    await self._in_thread(self._migrate)
                    self._resync_needed = True
                if self._resync_needed:
                    await self.resync()
                await self._flush_quotas()
                while self._backlog:
                    await self.flush_once()
                self.up.set(1)
                self._failing_since = None
                backoff = self.flush_interval
            except Exception as error:  # the database, never the scheduler: retry later
                self.errors_total.inc()
                self.up.set(0)
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                    self._failing_at = self._clock()
                logger.warning(
                    "event=store_write_failed error=%r backlog=%d retry_in=%.1f",
                    error,
                    len(self._backlog),
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff)
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.flush_interval * 10):
                    await self._wake.wait()
            await asyncio.sleep(self.flush_interval)  # batch what arrives meanwhile

    async def _in_thread(
        self, function: Callable[_P, _R], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> _R:
        """``function`` in a worker thread, its CPU time counted as the store's."""

        def timed() -> _R:
            started = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.cpu_total.inc(time.thread_time() - started)

        return await asyncio.to_thread(timed)

    def _engine_or_open(self) -> Engine:
        if self._engine is None:
            self._engine = db.open_engine(self.url)
        return self._engine

    def _migrate(self) -> None:
        engine = self._engine_or_open()
        db.upgrade(engine)
        self._migrated = True
        logger.info("event=store_ready url=%s revision=%s", _redacted(self.url), db.head_revision())

    async def _flush_quotas(self) -> None:
        batch = list(self._quota_backlog.values())
        if not batch:
            return
        engine = self._engine_or_open()
        await self._in_thread(quotas.write_snapshots, engine, batch)
        for snapshot in batch:
            self._quota_backlog.pop(snapshot.key, None)
            self._quota_written.add(snapshot.key)

    async def flush_once(self) -> int:
        """Write one batch of the backlog; on success drop it from the backlog."""
        started = time.thread_time()
        batch = list(itertools.islice(self._backlog.values(), self.batch_size))
        self.cpu_total.inc(time.thread_time() - started)
        return await self._write(batch)

    async def _write(self, batch: list[ev.Event]) -> int:
        if not batch:
            return 0
        engine = self._engine_or_open()
        written = await self._in_thread(db.write_events, engine, batch)
        started = time.thread_time()  # the bookkeeping on the event loop is the store's too
        for event in batch:
            key = event.key
            self._backlog.pop(key, None)
            if event.transition == ev.DELETED:
                self._written.pop(event.uid, None)
            else:
                self._written.setdefault(event.uid, set()).add(key)
        self.written_total.inc(written)
        self.cpu_total.inc(time.thread_time() - started)
        return written

    async def resync(self) -> None:
        """Fill the gap from the API's state (see the module docstring).

        Written straight through in batches rather than through the backlog, whose bound is
        for the live feed: the events are re-derived from objects the state holds anyway."""
        self._active = True
        live: set[str] = set()
        derived: dict[_Key, ev.Event] = {}
        started = time.thread_time()
        for key, workload in list(self.state.objects["Workload"].items()):
            self._names[key] = {"metadata": workload.get("metadata"), "spec": workload.get("spec")}
            uid = (workload.get("metadata") or {}).get("uid")
            if uid:
                live.add(str(uid))
            for event in ev.events_of(workload):
                if event.key not in self._written.get(event.uid, ()):
                    derived[event.key] = event
        for name, cq in list(self.state.objects["ClusterQueue"].items()):
            self._cluster_queues[name] = cq
            snapshot = quotas.snapshot_of(cq, seen_at=self._clock())
            if snapshot is not None and snapshot.key not in self._quota_written:
                self._quota_backlog.setdefault(snapshot.key, snapshot)
        self.cpu_total.inc(time.thread_time() - started)
        engine = self._engine_or_open()
        # ClusterQueues the store holds as live but the API no longer has: deleted meanwhile.
        present = {
            str((cq.get("metadata") or {}).get("uid"))
            for cq in self.state.objects["ClusterQueue"].values()
        }
        for uid, name, generation in await self._in_thread(quotas.live_queues, engine):
            if uid not in present:
                # Recreated under the same name meanwhile: the old one ended before the new
                # one began (versions are read by name, in time order).
                at = self._clock()
                successor = self.state.objects["ClusterQueue"].get(name)
                if successor is not None:
                    began = quotas.created_at(successor)
                    if began is not None and began <= at:
                        at = began - dt.timedelta(microseconds=1)
                removed = quotas.QuotaSnapshot(uid, generation, True, name, None, at)
                self._quota_backlog.setdefault(removed.key, removed)
        await self._flush_quotas()
        open_ = await self._in_thread(_open_workloads, engine)
        now = self._clock()
        gone = [
            row
            for row in open_
            if row["uid"] not in live
            and (not self.namespaces or row["namespace"] in self.namespaces)
        ]
        for row in gone:
            deleted = ev.Event(
                uid=row["uid"],
                transition=ev.DELETED,
                at=now,
                namespace=row["namespace"],
                name=row["name"],
                reason="NotFoundOnResync",
            )
            derived[deleted.key] = deleted
        events = list(derived.values())
        for start in range(0, len(events), self.batch_size):
            await self._write(events[start : start + self.batch_size])
        self._resync_needed = False
        logger.info(
            "event=store_resync workloads=%d gone=%d written=%d backlog=%d",
            len(live),
            len(gone),
            len(events),
            len(self._backlog),
        )


def _open_workloads(engine: Engine) -> list[dict[str, str]]:
    """Workloads the store has seen neither finish nor be deleted.

    Which ones comes from the unique key's index alone ((uid, transition, at) holds both
    columns the grouping reads), their namespace and name from their own rows only: grouping
    the event rows themselves read every stored event's row through the uid index, 0.8 s of
    CPU on 368,000 events against 0.16 s this way, at every resync (a leader's start)."""
    closed = func.sum(case((WorkloadEvent.transition.in_((ev.FINISHED, ev.DELETED)), 1), else_=0))
    open_uids = select(WorkloadEvent.uid).group_by(WorkloadEvent.uid).having(closed == 0)
    with engine.connect() as connection:
        rows = connection.execute(
            select(
                WorkloadEvent.uid, func.min(WorkloadEvent.namespace), func.min(WorkloadEvent.name)
            )
            .where(WorkloadEvent.uid.in_(open_uids))
            .group_by(WorkloadEvent.uid)
        )
        return [{"uid": uid, "namespace": ns, "name": name} for uid, ns, name in rows]


def _redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
