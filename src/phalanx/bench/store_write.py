"""What the usage history writer costs per Workload, without a cluster.

Drives the operator's own writer (:class:`phalanx.operator.history.HistoryRecorder`, fed
through a :class:`phalanx.operator.state.ClusterState` as the informers feed it) with the
Workload versions of a run shaped like Kueue's baseline scenario: 30 ClusterQueues, each
creating 350 small Workloads every 100 ms, 100 medium every 500 ms and 50 large every 1.2 s.
Each Workload is created, often marked pending first (``QuotaReserved=False``), reserved and
admitted in one status write, sometimes written again with no transition changed, finished;
one in ten is evicted and preempted once and admitted again. The versions are applied in
order of a simulated clock, and the backlog is written every ``flush_interval`` simulated
seconds, as the writer batches on a live operator.

The figure is the writer's CPU per Workload (``phalanx_store_cpu_seconds``, which counts the
derivation on the event loop and the writes in worker threads) beside the whole process's:
the bench's own work (building and applying the versions) is the difference.
"""

from __future__ import annotations

import asyncio
import cProfile
import datetime as dt
import io
import pstats
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from phalanx.operator.history import HistoryRecorder
from phalanx.operator.state import ClusterState
from phalanx.store import db, intervals

__all__ = ["MAX_WORKLOADS", "StoreWriteResult", "run", "top_of_profile"]

_START = dt.datetime(2026, 1, 1)
_CLASSES = (  # (name, count per ClusterQueue, creation interval s, runtime s, cpus)
    ("small", 350, 0.1, 0.2, 1),
    ("medium", 100, 0.5, 0.5, 5),
    ("large", 50, 1.2, 1.0, 20),
)

MAX_WORKLOADS = 30 * sum(count for _name, count, *_rest in _CLASSES)


@dataclass(frozen=True)
class StoreWriteResult:
    backend: str
    workloads: int
    versions: int
    events: int
    batches: int
    store_cpu_s: float
    process_cpu_s: float
    wall_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "workloads": self.workloads,
            "versions": self.versions,
            "events": self.events,
            "batches": self.batches,
            "store_cpu_s": round(self.store_cpu_s, 3),
            "store_cpu_us_per_workload": round(1e6 * self.store_cpu_s / max(self.workloads, 1)),
            "store_cpu_us_per_event": round(1e6 * self.store_cpu_s / max(self.events, 1), 1),
            "process_cpu_s": round(self.process_cpu_s, 3),
            "wall_s": round(self.wall_s, 3),
        }


def run(
    url: str,
    *,
    workloads: int = 15_000,
    seed: int = 1,
    flush_interval: float = 3.0,
    profile: Path | None = None,
    onto_existing: bool = False,
) -> StoreWriteResult:
    """Write ``workloads`` synthetic Workloads' histories into the empty store at ``url``;
    with ``profile``, save cProfile's statistics of the whole run there. ``onto_existing``
    writes into a store that already holds history (what its size costs the writer), under
    UIDs of their own (``bench-<8 hex>-<n>``), so they never meet a stored Workload, and
    from the hour after the latest stored time, as a live operator's transitions come after
    everything its store holds (a run at the stored times would insert into the middle of
    every time-ordered index, which no live store does)."""
    engine = db.open_engine(url)
    db.upgrade(engine)
    with engine.connect() as connection:
        if (
            not onto_existing
            and connection.exec_driver_sql("SELECT 1 FROM workload_events LIMIT 1").first()
        ):
            engine.dispose()
            raise db.StoreError(
                f"store {url!r} already holds events: the bench counts what it writes, give"
                " it an empty store (a new SQLite file, say), or --onto-existing to measure"
                " what the stored history costs the writer"
            )
        start = _START
        if onto_existing:
            latest = connection.exec_driver_sql("SELECT max(at) FROM workload_events").scalar()
            if latest is not None:  # a live store only ever gets times after what it holds
                stored = intervals.EPOCH + dt.timedelta(
                    microseconds=intervals.stored_micros(latest)
                )
                start = max(start, _next_hour(stored))
    tag = f"bench-{uuid.uuid4().hex[:8]}" if onto_existing else "uid"
    versions = sorted(_versions(workloads, random.Random(seed), tag, start), key=lambda v: v[0])
    profiler = cProfile.Profile(time.process_time) if profile is not None else None

    async def main() -> tuple[HistoryRecorder, int]:
        state = ClusterState()
        recorder = HistoryRecorder(state, CollectorRegistry(), url=url, engine=engine)
        await recorder.resync()  # an empty state: starts taking the feed
        batches = 0
        next_flush = flush_interval
        for resource_version, (at, version) in enumerate(versions, start=1):
            while at >= next_flush:
                while recorder.backlog:
                    await recorder.flush_once()
                    batches += 1
                next_flush += flush_interval
            version["metadata"]["resourceVersion"] = str(resource_version)
            state.apply("Workload", "MODIFIED", version)
        while recorder.backlog:
            await recorder.flush_once()
            batches += 1
        return recorder, batches

    started, process = time.perf_counter(), time.process_time()
    if profiler is None:
        recorder, batches = asyncio.run(main())
    else:
        # cProfile sees one thread: the writes run on the loop's thread while it profiles.
        to_thread = asyncio.to_thread

        async def inline(function: Any, /, *args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs)

        asyncio.to_thread = inline
        profiler.enable()
        try:
            recorder, batches = asyncio.run(main())
        finally:
            profiler.disable()
            asyncio.to_thread = to_thread
        assert profile is not None
        profiler.dump_stats(str(profile))
    result = StoreWriteResult(
        backend=engine.dialect.name,
        workloads=workloads,
        versions=len(versions),
        events=int(recorder.written_total._value.get()),
        batches=batches,
        store_cpu_s=recorder.cpu_total._value.get(),
        process_cpu_s=time.process_time() - process,
        wall_s=time.perf_counter() - started,
    )
    engine.dispose()
    return result


def top_of_profile(path: Path, lines: int = 30) -> str:
    """The ``lines`` functions with the most cumulative time in a saved profile."""
    out = io.StringIO()
    pstats.Stats(str(path), stream=out).sort_stats("cumulative").print_stats(lines)
    return out.getvalue()


def _versions(
    count: int, rng: random.Random, tag: str = "uid", start: dt.datetime = _START
) -> Iterator[tuple[float, dict[str, Any]]]:
    """(simulated second, Workload version) of ``count`` Workloads, spread over the
    ClusterQueues and classes as the baseline scenario creates them."""
    plan = [
        (cq, name, index * interval, runtime, cpus)
        for cq in range(30)
        for name, per_queue, interval, runtime, cpus in _CLASSES
        for index in range(per_queue)
    ]
    plan.sort(key=lambda one: (one[2], one[0]))  # the first ``count`` created
    for n, (cq, size, created, runtime, cpus) in enumerate(plan[:count]):
        uid = f"{tag}-{n:06d}"
        name = f"{size}-{n}"
        queue = f"lq-{cq}"
        base = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {
                "name": name,
                "namespace": f"ns-{cq % 5}",
                "uid": uid,
                "creationTimestamp": _stamp(start, created),
                "labels": {"kueue.x-k8s.io/job-uid": uid},
            },
            "spec": {
                "queueName": queue,
                "priority": {"small": 50, "medium": 100, "large": 200}[size],
                "podSets": [
                    {
                        "name": "main",
                        "count": 1,
                        "template": {
                            "spec": {
                                "containers": [
                                    {
                                        "name": "c",
                                        "resources": {"requests": {"cpu": str(cpus)}},
                                    }
                                ]
                            }
                        },
                    }
                ],
            },
        }
        yield created, _version(base, [])
        at = created
        conditions: list[dict[str, Any]] = []
        if rng.random() < 0.4:
            at += rng.uniform(0.01, 1)
            conditions = [_condition("QuotaReserved", "False", _stamp(start, at), "Pending")]
            yield at, _version(base, conditions)
        rounds = 2 if rng.random() < 0.1 else 1
        for round_ in range(rounds):
            at += rng.uniform(0.05, 60)
            admission = {
                "clusterQueue": f"cq-{cq}",
                "podSetAssignments": [
                    {
                        "name": "main",
                        "count": 1,
                        "flavors": {"cpu": "default"},
                        "resourceUsage": {"cpu": str(cpus)},
                    }
                ],
            }
            conditions = [
                *(c for c in conditions if c["type"] not in ("QuotaReserved", "Admitted")),
                _condition("QuotaReserved", "True", _stamp(start, at), "QuotaReserved"),
                _condition("Admitted", "True", _stamp(start, at), "Admitted"),
            ]
            yield at, _version(base, conditions, admission)
            if rng.random() < 0.5:  # a status write that changes no transition
                yield at + 0.01, _version(base, conditions, admission, note="requeued")
            if round_ + 1 < rounds:
                at += rng.uniform(0.05, runtime)
                conditions = [
                    *conditions,
                    _condition(
                        "Evicted",
                        "True",
                        _stamp(start, at),
                        "Preempted",
                        "preempted by a higher one",
                    ),
                    _condition("Preempted", "True", _stamp(start, at), "InClusterQueue"),
                ]
                yield at, _version(base, conditions, admission)
                at += rng.uniform(0.05, 1)
                conditions = [
                    _condition("QuotaReserved", "False", _stamp(start, at), "Pending"),
                    _condition("Admitted", "False", _stamp(start, at), "NoReservation"),
                    *(c for c in conditions if c["type"] in ("Evicted", "Preempted")),
                ]
                yield at, _version(base, conditions)
        at += runtime + rng.uniform(0, 2)
        yield (
            at,
            _version(
                base, [*conditions, _condition("Finished", "True", _stamp(start, at), "Succeeded")]
            ),
        )


def _version(
    base: dict[str, Any],
    conditions: list[dict[str, Any]],
    admission: dict[str, Any] | None = None,
    *,
    note: str = "",
) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [dict(c) for c in conditions]}
    if admission is not None:
        status["admission"] = admission
    if note:
        status["requeueState"] = {"count": 1}
    return {**base, "metadata": dict(base["metadata"]), "status": status}


def _condition(kind: str, status: str, at: str, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "lastTransitionTime": at,
        "reason": reason,
        "message": message or reason,
    }


def _stamp(start: dt.datetime, seconds: float) -> str:
    return (start + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _next_hour(at: dt.datetime) -> dt.datetime:
    return at.replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=1)
