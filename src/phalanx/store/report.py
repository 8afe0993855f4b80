"""Reports read from the store: usage per group over a window, and one Workload's timeline.

Usage pairs each quota reservation with the transition that ended it (quota released,
finished, deleted; a later reservation of the same Workload ends it at the eviction before it,
or at itself), clips it to the window and multiplies by what the reservation held. A
reservation still open is counted up to the end of the window.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, case, func, or_, select
from sqlalchemy.orm import Session

from phalanx.store import events as ev
from phalanx.store.models import EventResource, WorkloadEvent

__all__ = [
    "GROUPINGS",
    "TimelineEntry",
    "UsageRow",
    "resource_unit",
    "timeline",
    "usage",
]

GROUPINGS = ("namespace", "localqueue", "clusterqueue", "flavor")

_ENDS = (ev.QUOTA_RELEASED, ev.FINISHED, ev.DELETED)
_CLOSED = (ev.FINISHED, ev.DELETED)


@dataclass
class UsageRow:
    group: str
    admissions: int = 0
    preemptions: int = 0
    waits: list[float] = field(default_factory=list)
    resource_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Resource -> base units x seconds."""

    def wait_percentile(self, q: float) -> float | None:
        if not self.waits:
            return None
        if len(self.waits) == 1:
            return self.waits[0]
        return statistics.quantiles(self.waits, n=100, method="inclusive")[round(q * 100) - 1]

    def resource_hours(self) -> dict[str, float]:
        """Resource -> hours of the resource in its display unit (cores, GiB, devices)."""
        return {
            r: seconds / 3600 / resource_unit(r)[1]
            for r, seconds in sorted(self.resource_seconds.items())
        }


def resource_unit(resource: str) -> tuple[str, int]:
    """How a resource's base unit displays: CPU in cores, memory in GiB, the rest as is."""
    if resource == "cpu":
        return "cores", 1000
    if resource.endswith(("memory", "storage")) or resource.startswith("hugepages-"):
        return "GiB", 1 << 30
    return "", 1


@dataclass(frozen=True)
class _Row:
    id: int
    uid: str
    transition: str
    at: dt.datetime
    namespace: str
    local_queue: str | None
    cluster_queue: str | None


def usage(engine: Engine, *, since: dt.datetime, until: dt.datetime, by: str) -> list[UsageRow]:
    """Usage per group (see :data:`GROUPINGS`) in ``[since, until)`` (naive UTC)."""
    if by not in GROUPINGS:
        raise ValueError(f"--by {by!r}: use one of {', '.join(GROUPINGS)}")
    closed = func.sum(case((WorkloadEvent.transition.in_(_CLOSED), 1), else_=0))
    relevant = (
        select(WorkloadEvent.uid)
        .group_by(WorkloadEvent.uid)
        .having(or_(func.max(WorkloadEvent.at) >= since, closed == 0))
    )
    with engine.connect() as connection:
        rows = [
            _Row(*r)
            for r in connection.execute(
                select(
                    WorkloadEvent.id,
                    WorkloadEvent.uid,
                    WorkloadEvent.transition,
                    WorkloadEvent.at,
                    WorkloadEvent.namespace,
                    WorkloadEvent.local_queue,
                    WorkloadEvent.cluster_queue,
                )
                .where(WorkloadEvent.uid.in_(relevant), WorkloadEvent.at < until)
                .order_by(WorkloadEvent.uid, WorkloadEvent.at, WorkloadEvent.id)
            )
        ]
        held: dict[int, list[tuple[str, str, int]]] = defaultdict(list)
        for event_id, resource, flavor, amount in connection.execute(
            select(
                EventResource.event_id,
                EventResource.resource,
                EventResource.flavor,
                EventResource.amount,
            )
            .join(WorkloadEvent, WorkloadEvent.id == EventResource.event_id)
            .where(WorkloadEvent.uid.in_(relevant), WorkloadEvent.at < until)
        ):
            held[event_id].append((resource, flavor, amount))
    groups: dict[str, UsageRow] = {}

    def rows_for(reservation: _Row, flavors: Iterable[str]) -> list[UsageRow]:
        keys = _group_keys(reservation, by=by, flavors=flavors)
        return [groups.setdefault(k, UsageRow(group=k)) for k in keys]

    for _uid, events in _by_uid(rows):
        created = next((e.at for e in events if e.transition == ev.CREATED), events[0].at)
        queued_since = created
        open_: _Row | None = None
        evicted_at: dt.datetime | None = None

        def close(at: dt.datetime, reservation: _Row) -> None:
            start, end = max(reservation.at, since), min(at, until)
            if end <= start:
                return
            seconds = (end - start).total_seconds()
            for resource, flavor, amount in held.get(reservation.id, ()):
                for row in rows_for(reservation, [flavor]):
                    row.resource_seconds[resource] += amount * seconds

        for event in events:
            if event.transition == ev.QUOTA_RESERVED:
                if open_ is not None:
                    close(evicted_at or event.at, open_)
                    queued_since = evicted_at or event.at
                open_, evicted_at = event, None
                if since <= event.at:
                    flavors = {f for _r, f, _a in held.get(event.id, ())}
                    for row in rows_for(event, flavors):
                        row.admissions += 1
                        row.waits.append((event.at - queued_since).total_seconds())
            elif event.transition == ev.EVICTED and open_ is not None:
                evicted_at = event.at
            elif event.transition == ev.PREEMPTED and open_ is not None and since <= event.at:
                flavors = {f for _r, f, _a in held.get(open_.id, ())}
                for row in rows_for(open_, flavors):
                    row.preemptions += 1
            elif event.transition in _ENDS and open_ is not None:
                close(event.at, open_)
                open_, evicted_at, queued_since = None, None, event.at
        if open_ is not None:
            close(until, open_)
    return [groups[k] for k in sorted(groups)]


def _group_keys(reservation: _Row, *, by: str, flavors: Iterable[str]) -> list[str]:
    if by == "namespace":
        return [reservation.namespace]
    if by == "localqueue":
        return [f"{reservation.namespace}/{reservation.local_queue or ''}"]
    if by == "clusterqueue":
        return [reservation.cluster_queue or ""]
    return sorted(set(flavors)) or [""]


def _by_uid(rows: Sequence[_Row]) -> Iterable[tuple[str, list[_Row]]]:
    current: list[_Row] = []
    for row in rows:
        if current and current[0].uid != row.uid:
            yield current[0].uid, current
            current = []
        current.append(row)
    if current:
        yield current[0].uid, current


@dataclass(frozen=True)
class TimelineEntry:
    at: dt.datetime
    uid: str
    transition: str
    cluster_queue: str | None
    local_queue: str | None
    reason: str | None
    message: str | None
    flavors: dict[str, Any] | None
    topology: list[Any] | None
    resources: tuple[tuple[str, str, str, int], ...]
    """(pod set, resource, flavor, amount in base units)."""


def timeline(engine: Engine, *, namespace: str, name: str) -> list[TimelineEntry]:
    """Every stored transition of the Workloads named ``namespace/name`` (a name reused by a
    new Workload shows both, told apart by UID), oldest first."""
    with Session(engine) as session:
        found = session.scalars(
            select(WorkloadEvent)
            .where(WorkloadEvent.namespace == namespace, WorkloadEvent.name == name)
            .order_by(WorkloadEvent.at, WorkloadEvent.id)
        ).all()
        return [
            TimelineEntry(
                at=e.at,
                uid=e.uid,
                transition=e.transition,
                cluster_queue=e.cluster_queue,
                local_queue=e.local_queue,
                reason=e.reason,
                message=e.message,
                flavors=e.flavors,
                topology=e.topology,
                resources=tuple(
                    (r.pod_set, r.resource, r.flavor, r.amount)
                    for r in sorted(e.resources, key=lambda r: (r.pod_set, r.resource))
                ),
            )
            for e in found
        ]
