"""What happens to each benchmark Workload, and the runner's part of Kueue's perf test:
finish each one ``runtimeMs`` after it was seen Admitted.

Kueue's runner (``test/performance/scheduler/runner/controller``) remembers when it saw a
Workload become Admitted and, ``runtimeMs`` later, sets ``Finished=True`` through a status
patch; an eviction meanwhile cancels that, and a later admission starts the clock again.
Time to admission counts from the Workload's *scheduled* creation (the generator's timeline,
:meth:`PlannedWorkload.scheduled_at`) to the (last) time it was seen Admitted, so creates the
bench could not send on time (a backlog at the API server, a starved event loop) count
against the system rather than vanishing from the figure. The figure Kueue's recorder takes,
from the first sight of the Workload (its actual creation), is kept beside it as
``from_create``; the difference is the creation lag, reported on its own.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from phalanx.bench.core_replay import ClassResult
from phalanx.bench.objects import PlannedWorkload

__all__ = ["AdmissionTiming", "Track", "WorkloadTracker", "percentile"]

logger = logging.getLogger(__name__)


@dataclass
class Track:
    planned: PlannedWorkload
    seen_at: float | None = None
    """When the Workload was first known to exist: its create answered, or an informer
    event, whichever came first."""
    admitted_since: float | None = None
    last_admission_at: float | None = None
    admissions: int = 0
    evictions: int = 0
    finished_at: float | None = None
    generation: int = 0
    finish_due_at: float | None = None
    """When the runner's clock for the last admission ran out (the finish write was sent)."""
    finish_acked_at: float | None = None
    """When the API server answered that finish write."""


def _condition_true(obj: dict[str, Any], kind: str) -> bool:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind:
            return bool(c.get("status") == "True")
    return False


@dataclass(frozen=True)
class AdmissionTiming:
    """Time to admission and creation lag of a run, in milliseconds."""

    classes: dict[str, ClassResult]
    """Per workload class: count, average time to admission *from the scheduled creation*
    (what Kueue's ``wlClassesMaxAvgTimeToAdmissionMs`` is checked against), evictions."""
    avg_from_create_ms: dict[str, int]
    """Per workload class: average time to admission from the actual creation."""
    p50_ms: int
    p99_ms: int
    """Over every admitted workload, from the scheduled creation."""
    p50_from_create_ms: int
    p99_from_create_ms: int
    creation_lag_p50_ms: int
    creation_lag_p99_ms: int
    creation_lag_max_ms: int
    """Actual minus scheduled creation, over every created workload."""


def _avg(values: Sequence[float]) -> int:
    return int(sum(values) / len(values)) if values else 0


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -int(-pct * len(ordered) // 100)))
    return ordered[rank - 1]


class WorkloadTracker:
    """Fed by a Workload informer (:meth:`on_event`); calls ``finish(track, generation)``
    ``runtimeMs`` after each admission, on the running event loop."""

    def __init__(
        self,
        planned: Sequence[PlannedWorkload],
        *,
        finish: Callable[[Track, int], Coroutine[Any, Any, None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tracks = {p.key: Track(p) for p in planned}
        self._finish = finish
        self._clock = clock
        self.finished = 0
        self.all_finished = asyncio.Event()
        self.intervals: list[tuple[str, float, float, int]] = []
        """(ClusterQueue class, start, end, usage in milli-CPU) of every admission."""
        self.last_finished_at: float | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.unknown_events = 0

    def created(self, key: str, at: float) -> None:
        track = self.tracks[key]
        if track.seen_at is None or at < track.seen_at:
            track.seen_at = at

    def on_event(self, event_type: str, obj: dict[str, Any]) -> None:
        metadata = obj.get("metadata") or {}
        key = f"{metadata.get('namespace')}/{metadata.get('name')}"
        track = self.tracks.get(key)
        if track is None or event_type == "DELETED":
            self.unknown_events += track is None
            return
        now = self._clock()
        if track.seen_at is None:
            track.seen_at = now
        if track.finished_at is not None:
            return
        if _condition_true(obj, "Finished"):
            self._close(track, now)
            track.finished_at = now
            self.last_finished_at = now
            self.finished += 1
            if self.finished == len(self.tracks):
                self.all_finished.set()
            return
        admitted = _condition_true(obj, "Admitted")
        if admitted and track.admitted_since is None:
            track.admitted_since = now
            track.last_admission_at = now
            track.admissions += 1
            track.generation += 1
            self._schedule(track, track.generation)
        elif not admitted and track.admitted_since is not None:
            self._close(track, now)
            track.evictions += 1
            track.generation += 1  # the pending finish is stale now

    def _close(self, track: Track, now: float) -> None:
        if track.admitted_since is not None:
            p = track.planned
            self.intervals.append((p.cq_class, track.admitted_since, now, p.usage))
            track.admitted_since = None

    def _schedule(self, track: Track, generation: int) -> None:
        loop = asyncio.get_running_loop()

        def fire() -> None:
            if track.generation != generation or track.finished_at is not None:
                return
            track.finish_due_at = self._clock()
            task = loop.create_task(self._finish(track, generation))
            self._tasks.add(task)
            task.add_done_callback(self._done)

        loop.call_later(track.planned.runtime_ms / 1000, fire)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("event=bench_finish_failed error=%r", task.exception())

    async def drain(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    # -- results --------------------------------------------------------------------------------

    def times_to_admission_ms(self, *, start: float) -> dict[str, list[float]]:
        """Per workload class, for every admitted workload: from its scheduled creation
        (``start``, the run's origin, plus its ``at_ms``) to its last admission."""
        out: dict[str, list[float]] = {}
        for t in self.tracks.values():
            if t.last_admission_at is not None:
                out.setdefault(t.planned.class_name, []).append(
                    1000 * (t.last_admission_at - t.planned.scheduled_at(start))
                )
        return out

    def times_from_creation_ms(self) -> dict[str, list[float]]:
        """Per workload class, for every admitted workload: from its actual creation (first
        sight, as Kueue's recorder) to its last admission. Blind to a creation backlog."""
        out: dict[str, list[float]] = {}
        for t in self.tracks.values():
            if t.last_admission_at is not None and t.seen_at is not None:
                out.setdefault(t.planned.class_name, []).append(
                    1000 * (t.last_admission_at - t.seen_at)
                )
        return out

    def release_latencies_ms(self) -> list[float]:
        """Per finished workload that left another waiting in its cohort: from the sight of
        its ``Finished`` to the next admission seen in that cohort of a workload that existed
        by then. The time a release takes to turn into work (the informer, the cycle, the
        admission write and its watch event), where the finish made room for a waiter."""
        admissions: dict[str, list[tuple[float, float]]] = {}
        for t in self.tracks.values():
            if t.last_admission_at is not None and t.seen_at is not None:
                admissions.setdefault(t.planned.cohort, []).append((t.last_admission_at, t.seen_at))
        for times in admissions.values():
            times.sort()
        out: list[float] = []
        for t in self.tracks.values():
            if t.finished_at is None:
                continue
            times = admissions.get(t.planned.cohort, [])
            i = bisect.bisect_left(times, (t.finished_at, -math.inf))
            for admitted_at, seen_at in times[i:]:
                if seen_at < t.finished_at:
                    out.append(1000 * (admitted_at - t.finished_at))
                    break
        return out

    TIMELINE_COLUMNS = (
        "workload",
        "class",
        "cohort",
        "scheduled_ms",
        "created_ms",
        "admitted_ms",
        "finish_sent_ms",
        "finish_acked_ms",
        "finished_ms",
        "admissions",
        "evictions",
    )

    def timeline(self, *, start: float) -> list[tuple[object, ...]]:
        """One row per workload (:attr:`TIMELINE_COLUMNS`), times in ms from ``start`` as the
        bench saw them, empty where it never happened: where each one's time went, as
        Kueue's runner writes ``wlStates.csv``. ``admitted_ms`` is the last admission."""

        def ms(at: float | None) -> object:
            return "" if at is None else round(1000 * (at - start))

        return [
            (
                t.planned.key,
                t.planned.class_name,
                t.planned.cohort,
                t.planned.at_ms,
                ms(t.seen_at),
                ms(t.last_admission_at),
                ms(t.finish_due_at),
                ms(t.finish_acked_at),
                ms(t.finished_at),
                t.admissions,
                t.evictions,
            )
            for t in self.tracks.values()
        ]

    def creation_lags_ms(self, *, start: float) -> list[float]:
        """Per created workload: actual creation (first sight) minus scheduled creation."""
        return [
            1000 * (t.seen_at - t.planned.scheduled_at(start))
            for t in self.tracks.values()
            if t.seen_at is not None
        ]

    def timing(self, *, start: float) -> AdmissionTiming:
        """The run's admission figures, ``start`` being the origin of the schedule."""
        waits = self.times_to_admission_ms(start=start)
        from_create = self.times_from_creation_ms()
        counts: dict[str, int] = {}
        evictions: dict[str, int] = {}
        for track in self.tracks.values():
            cls = track.planned.class_name
            counts[cls] = counts.get(cls, 0) + 1
            evictions[cls] = evictions.get(cls, 0) + track.evictions
        all_waits = [w for ws in waits.values() for w in ws]
        all_from_create = [w for ws in from_create.values() for w in ws]
        lags = self.creation_lags_ms(start=start)
        return AdmissionTiming(
            classes={
                cls: ClassResult(
                    count=counts[cls],
                    avg_time_to_admission_ms=_avg(waits.get(cls, [])),
                    evictions=evictions[cls],
                )
                for cls in counts
            },
            avg_from_create_ms={cls: _avg(from_create.get(cls, [])) for cls in counts},
            p50_ms=int(percentile(all_waits, 50)),
            p99_ms=int(percentile(all_waits, 99)),
            p50_from_create_ms=int(percentile(all_from_create, 50)),
            p99_from_create_ms=int(percentile(all_from_create, 99)),
            creation_lag_p50_ms=int(percentile(lags, 50)),
            creation_lag_p99_ms=int(percentile(lags, 99)),
            creation_lag_max_ms=int(max(lags, default=0.0)),
        )

    def usage_pct(
        self, *, nominal_by_class: dict[str, int], start: float, end: float
    ) -> dict[str, float]:
        """Average reserved usage over [start, end] as % of the class's total nominal quota."""
        integral: dict[str, float] = {}
        for cls, a, b, usage in self.intervals:
            lo, hi = max(a, start), min(b, end)
            if hi > lo:
                integral[cls] = integral.get(cls, 0.0) + usage * (hi - lo)
        span = end - start
        return {
            cls: (
                100.0 * integral.get(cls, 0.0) / (nominal * span) if nominal and span > 0 else 0.0
            )
            for cls, nominal in nominal_by_class.items()
        }
