"""The operator's history writer: off the hot path, bounded, visible, and gap-filling after
an outage without counting anything twice."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from prometheus_client import CollectorRegistry
from sqlalchemy import select
from sqlalchemy.orm import Session
from store_builders import condition, workload

from phalanx.operator.history import UNAVAILABLE_AFTER_SECONDS, HistoryRecorder, _open_workloads
from phalanx.operator.state import ClusterState
from phalanx.store import db, report
from phalanx.store.events import deleted_event, events_of
from phalanx.store.models import QuotaAmount, QuotaVersion, WorkloadEvent


def _stored(url: str) -> list[tuple[str, str]]:
    engine = db.open_engine(url)
    with Session(engine) as session:
        rows = session.execute(
            select(WorkloadEvent.uid, WorkloadEvent.transition).order_by(
                WorkloadEvent.uid, WorkloadEvent.at, WorkloadEvent.id
            )
        ).all()
    engine.dispose()
    return [(uid, transition) for uid, transition in rows]


def _reserved(uid: str, version: int, **kwargs: Any) -> dict[str, Any]:
    obj = workload(
        uid=uid,
        name=uid,
        cluster_queue="cq",
        conditions=[condition("QuotaReserved", "2026-01-01T00:01:00Z")],
        **kwargs,
    )
    obj["metadata"]["resourceVersion"] = str(version)
    return obj


def _run(
    url: str, script: Callable[[ClusterState, HistoryRecorder], Awaitable[None]], **kwargs: Any
) -> HistoryRecorder:
    async def main() -> HistoryRecorder:
        state = ClusterState()
        recorder = HistoryRecorder(
            state, CollectorRegistry(), url=url, flush_interval=0.02, max_backoff=0.05, **kwargs
        )
        recorder.start()
        await script(state, recorder)
        await recorder.stop()
        return recorder

    return asyncio.run(main())


async def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_observed_transitions_are_written_once(store_url: str) -> None:
    async def script(state: ClusterState, recorder: HistoryRecorder) -> None:
        state.apply("Workload", None, workload(uid="w1", name="w1"))
        state.apply("Workload", "MODIFIED", _reserved("w1", 2))
        state.apply("Workload", "MODIFIED", _reserved("w1", 3))  # same transitions again
        await _until(lambda: recorder.backlog == 0 and recorder.written_total._value.get() == 2)
        state.apply("Workload", "DELETED", _reserved("w1", 4))
        await _until(lambda: recorder.backlog == 0 and recorder.written_total._value.get() == 3)

    _run(store_url, script)
    assert _stored(store_url) == [("w1", "created"), ("w1", "quota_reserved"), ("w1", "deleted")]


def test_an_outage_keeps_a_bounded_backlog_then_fills_the_gap_from_the_state(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    down = True
    real = db.write_events

    def flaky(engine: db.Engine, events: Any) -> int:
        if down:
            raise ConnectionError("database down")
        return real(engine, events)

    monkeypatch.setattr(db, "write_events", flaky)

    async def script(state: ClusterState, recorder: HistoryRecorder) -> None:
        nonlocal down
        await _until(lambda: recorder.up._value.get() == 1)  # migrated, nothing to write yet
        for i in range(10):
            state.apply("Workload", None, _reserved(f"w{i}", 1))
        errors = recorder.errors_total._value.get()
        await _until(lambda: recorder.errors_total._value.get() >= errors + 2)
        assert recorder.up._value.get() == 0
        assert recorder.backlog == 4, "bounded: the newest events were dropped"
        assert recorder.dropped_total._value.get() == 16
        # The ClusterQueues' HistoryStoreAvailable condition: not for one failed write, but
        # once writes have failed for a while; its message stays the same while it lasts.
        assert recorder.health().ok
        later = time.monotonic() + UNAVAILABLE_AFTER_SECONDS
        health = recorder.health(now=later)
        assert not health.ok and health.reason == "StoreUnavailable"
        assert "scheduling goes on" in health.message
        assert recorder.health(now=later + 30) == health
        down = False
        await _until(lambda: recorder.backlog == 0 and recorder.up._value.get() == 1)
        assert recorder.health(now=later + 60).ok

    recorder = _run(url, script, max_backlog=4)
    stored = _stored(url)
    # Every Workload's both transitions, once: the resync re-derived them from the state.
    assert sorted(stored) == sorted(
        (f"w{i}", kind) for i in range(10) for kind in ("created", "quota_reserved")
    )
    assert recorder.written_total._value.get() == 20


def test_a_new_leader_fills_in_what_happened_while_none_wrote(store_url: str) -> None:
    """A first recorder stores a reservation; the Workload finishes and another is deleted
    while no recorder runs; the next one finds both from the state and the store."""

    async def first(state: ClusterState, recorder: HistoryRecorder) -> None:
        state.apply("Workload", None, _reserved("done", 1))
        state.apply("Workload", None, _reserved("gone", 1))
        await _until(lambda: recorder.written_total._value.get() == 4)

    _run(store_url, first)
    finished = _reserved("done", 2)
    finished["status"]["conditions"].append(
        condition("Finished", "2026-01-01T01:00:00Z", reason="Succeeded")
    )

    async def main() -> None:
        state = ClusterState()
        state.apply("Workload", None, finished)  # listed before the recorder starts
        ready = asyncio.Event()
        recorder = HistoryRecorder(
            state, CollectorRegistry(), url=store_url, ready=ready, flush_interval=0.02
        )
        recorder.start()
        await asyncio.sleep(0.05)
        assert recorder.written_total._value.get() == 0, "waits for the informers' lists"
        ready.set()
        await _until(lambda: recorder.written_total._value.get() == 2)
        await recorder.stop()

    asyncio.run(main())
    stored = _stored(store_url)
    assert ("done", "finished") in stored and ("gone", "deleted") in stored
    assert len(stored) == 6


def test_the_store_cpu_counter_counts_the_stores_work_and_nothing_else(store_url: str) -> None:
    """``phalanx_store_cpu_seconds`` is what bench e2e reports as the store's share of the
    operator's CPU: it must grow with the store's work (deriving, writing) and must not take in
    other work on the event loop (a counter of the process's CPU time would)."""
    spun = 0.0

    async def script(state: ClusterState, recorder: HistoryRecorder) -> None:
        nonlocal spun
        for n in range(50):
            state.apply("Workload", None, _reserved(f"w{n}", 2))
        await _until(lambda: recorder.backlog == 0 and recorder.written_total._value.get() == 100)
        started = time.thread_time()
        while time.thread_time() - started < 0.5:  # the scheduler's work, say
            pass
        spun = time.thread_time() - started

    process_before = time.process_time()
    recorder = _run(store_url, script)
    process = time.process_time() - process_before
    counted = recorder.cpu_total._value.get()
    assert counted > 0
    assert counted <= process - spun


def _cluster_queue(
    name: str,
    gpus: str,
    generation: int,
    version: int,
    *,
    uid: str = "",
    created: str = "2026-01-01T00:00:00Z",
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": uid or f"uid-{name}",
            "generation": generation,
            "resourceVersion": str(version),
            "creationTimestamp": created,
        },
        "spec": {
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": "h100",
                            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}],
                        }
                    ],
                }
            ]
        },
        "status": {"admittedWorkloads": version},
    }


def _versions(url: str) -> list[tuple[str, int, bool, int | None]]:
    """The stored quota versions, sorted (none before the recorder has migrated the store)."""
    engine = db.open_engine(url)
    if db.current_revision(engine) != db.head_revision():
        engine.dispose()
        return []
    with Session(engine) as session:
        rows = session.execute(
            select(
                QuotaVersion.cluster_queue,
                QuotaVersion.generation,
                QuotaVersion.deleted,
                QuotaAmount.nominal,
            )
            .outerjoin(QuotaAmount, QuotaAmount.version_id == QuotaVersion.id)
            .order_by(QuotaVersion.id)
        ).all()
    engine.dispose()
    return sorted((cq, gen, deleted, nominal) for cq, gen, deleted, nominal in rows)


def test_cluster_queue_quotas_are_stored_once_per_generation_and_at_deletion(
    store_url: str,
) -> None:
    """Status writes (same generation) store nothing; a spec change stores a version; a
    deletion seen live, and one found at a new leader's resync, store the deletion."""

    async def first(state: ClusterState, recorder: HistoryRecorder) -> None:
        await _until(lambda: recorder._migrated)  # changes seen live, not by the first resync
        state.apply("ClusterQueue", None, _cluster_queue("a", "8", 1, 1))
        state.apply("ClusterQueue", "MODIFIED", _cluster_queue("a", "8", 1, 2))  # status
        state.apply("ClusterQueue", "MODIFIED", _cluster_queue("a", "4", 2, 3))
        state.apply("ClusterQueue", None, _cluster_queue("b", "2", 1, 1))
        state.apply("ClusterQueue", None, _cluster_queue("c", "1", 1, 1))
        state.apply("ClusterQueue", "DELETED", _cluster_queue("c", "1", 1, 2))
        await _until(lambda: len(_versions(store_url)) == 5)

    _run(store_url, first)
    assert _versions(store_url) == [
        ("a", 1, False, 8),
        ("a", 2, False, 4),
        ("b", 1, False, 2),
        ("c", 1, False, 1),
        ("c", 1, True, None),
    ]

    async def second(state: ClusterState, recorder: HistoryRecorder) -> None:
        await _until(lambda: len(_versions(store_url)) == 6)

    # The next leader's state has "a" only: "b" was deleted while no leader ran.
    def with_a(state: ClusterState, recorder: HistoryRecorder) -> Awaitable[None]:
        state.apply("ClusterQueue", None, _cluster_queue("a", "4", 2, 9))
        return second(state, recorder)

    _run(store_url, with_a)
    assert _versions(store_url) == [
        ("a", 1, False, 8),
        ("a", 2, False, 4),
        ("b", 1, False, 2),
        ("b", 1, True, None),
        ("c", 1, False, 1),
        ("c", 1, True, None),
    ]


def test_a_cluster_queue_recreated_while_no_leader_ran_keeps_its_quota(store_url: str) -> None:
    """Deleted and created again under the same name while no recorder ran: the old one's
    deletion is dated before the new one's creation, so the report reads the new quota, not
    the deletion's zero (found by review: it was dated at the resync, after the creation)."""

    async def first(state: ClusterState, recorder: HistoryRecorder) -> None:
        await _until(lambda: recorder._migrated)
        state.apply("ClusterQueue", None, _cluster_queue("a", "8", 1, 1))
        await _until(lambda: len(_versions(store_url)) == 1)

    _run(store_url, first)

    def recreated(state: ClusterState, recorder: HistoryRecorder) -> Awaitable[None]:
        new = _cluster_queue("a", "4", 1, 9, uid="uid-a2", created="2026-01-02T00:00:00Z")
        state.apply("ClusterQueue", None, new)
        return _until(lambda: len(_versions(store_url)) == 3)

    _run(store_url, recreated)
    engine = db.open_engine(store_url)
    later = dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(minutes=1)
    use = report.quota_use(engine, since=later, until=later + dt.timedelta(hours=1))
    engine.dispose()
    assert use["a"]["nvidia.com/gpu"].quota == pytest.approx(4 * 3600)


def test_a_resync_finds_every_workload_neither_finished_nor_deleted(store_url: str) -> None:
    """The Workloads a resync ends as ``deleted`` when the API no longer has them: every one
    the store holds without a ``finished`` or ``deleted`` event, reserved or not, with its
    namespace and name."""
    done = workload(
        uid="done",
        name="done",
        cluster_queue="cq",
        conditions=[
            condition("QuotaReserved", "2026-01-01T00:01:00Z"),
            condition("Finished", "2026-01-01T00:02:00Z", reason="Succeeded"),
        ],
    )
    released = workload(
        uid="released",
        name="released",
        conditions=[condition("QuotaReserved", "2026-01-01T00:01:00Z", status="False")],
    )
    engine = db.open_engine(store_url)
    db.upgrade(engine)
    db.write_events(
        engine,
        [
            *events_of(workload(uid="pending", name="pending", namespace="team-b")),
            *events_of(_reserved("reserved", 1)),
            *events_of(done),
            *events_of(_reserved("released", 1)),
            *events_of(released),
            *events_of(_reserved("gone", 1)),
            deleted_event(_reserved("gone", 1), at=dt.datetime(2026, 1, 1, 1)),
        ],
    )
    found = sorted((row["uid"], row["namespace"], row["name"]) for row in _open_workloads(engine))
    engine.dispose()
    assert found == [
        ("pending", "team-b", "pending"),
        ("released", "team-a", "released"),
        ("reserved", "team-a", "reserved"),
    ]


def test_a_resync_reads_the_event_rows_of_open_workloads_only(tmp_path: Path) -> None:
    """SQLite's plan for the resync's open Workloads: every event is read from a covering
    index, only the open Workloads' rows from the table. Catches grouping the event rows
    themselves (``SCAN workload_events USING INDEX ix_workload_events_uid``: a table read per
    stored event at every leader's start, 0.8 s of CPU on 368,000 events)."""
    engine = db.open_engine(f"sqlite:///{tmp_path}/store.db")
    db.upgrade(engine)
    statements: list[tuple[str, Any]] = []

    @sqlalchemy.event.listens_for(engine, "before_cursor_execute")
    def _seen(_c: Any, _cur: Any, statement: str, parameters: Any, *_rest: Any) -> None:
        statements.append((statement, parameters))

    _open_workloads(engine)
    sqlalchemy.event.remove(engine, "before_cursor_execute", _seen)
    plans: list[str] = []
    with engine.connect() as connection:
        for statement, parameters in statements:
            plans.extend(
                str(row[3])
                for row in connection.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)
            )
    engine.dispose()
    scans = [p for p in plans if p.startswith("SCAN workload_events")]
    assert scans and all("COVERING INDEX" in p for p in scans), plans
