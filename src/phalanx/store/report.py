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
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import DateTime, Engine, bindparam, select, text
from sqlalchemy.orm import Session

from phalanx.store import events as ev
from phalanx.store.models import WorkloadEvent

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


def usage(engine: Engine, *, since: dt.datetime, until: dt.datetime, by: str) -> list[UsageRow]:
    """Usage per group (see :data:`GROUPINGS`) in ``[since, until)`` (naive UTC).

    The pairing is done in SQL (see :func:`_reservations`); the groups' sums are taken there
    too, and only the per-admission waits (one integer of microseconds per admission, in
    Workload and time order) are fetched. Resource-seconds equal the Python pairing's up to
    the order floating-point terms are summed in."""
    if by not in GROUPINGS:
        raise ValueError(f"--by {by!r}: use one of {', '.join(GROUPINGS)}")
    dialect = engine.dialect.name
    params = {"since": since, "until": until}
    groups: dict[str, UsageRow] = {}

    def row(key: str) -> UsageRow:
        found = groups.get(key)
        if found is None:
            found = groups[key] = UsageRow(group=key)
        return found

    with engine.connect() as connection:
        if dialect == "postgresql":
            # The pass sorts what the index does not; keep it in memory.
            connection.exec_driver_sql("SET LOCAL work_mem = '256MB'")
        result = connection.execute(_usage_statement(dialect, by), params)
        for kind, key, resource, value in result:
            if kind == 0:
                row(key).resource_seconds[resource] += float(value)
            elif kind == 1:
                row(key).admissions += 1
                row(key).waits.append(int(value) / 1e6)
            else:
                row(key).preemptions += int(value)
        connection.rollback()
    return [groups[k] for k in sorted(groups)]


_QR = f"'{ev.QUOTA_RESERVED}'"
_ENDS_SQL = ", ".join(f"'{t}'" for t in _ENDS)
_CLOSED_SQL = ", ".join(f"'{t}'" for t in _CLOSED)


def _micros(dialect: str, column: str) -> str:
    """``column`` (a naive UTC time) as integer microseconds since the epoch, exactly."""
    if dialect == "sqlite":
        # SQLAlchemy stores 'YYYY-MM-DD HH:MM:SS.ffffff'.
        return (
            f"(CAST(strftime('%s', {column}) AS INTEGER) * 1000000"
            f" + CAST(substr({column}, 21, 6) AS INTEGER))"
        )
    return f"CAST(EXTRACT(EPOCH FROM {column}) * 1000000 AS BIGINT)"


def _after(a: str, b: str) -> str:
    """Event ``a`` comes after event ``b`` in a Workload's ``(at, id)`` order."""
    return f"({a}.at > {b}.at OR ({a}.at = {b}.at AND {a}.id > {b}.id))"


def _reservations() -> str:
    """CTEs ending in ``res``: one row per quota reservation of the Workloads the report
    reads (``uid``, ``r_id``, its start ``r_at``, its end ``end_at`` not yet clipped at
    ``since``, when the Workload was queued before it ``queued_at``), and ``mixed``: the
    Workloads whose preemptions need counting.

    The rules, per Workload in ``(at, id)`` order over its events before ``until``: each
    ``quota_reserved`` opens a reservation; the first ``quota_released``/``finished``/
    ``deleted`` after it closes it; if another reservation comes first, that one closes it at
    the last eviction in between, or at itself; one still open closes at ``until``. The
    Workload was queued at its creation (its first event without one) before its first
    reservation, and at the previous one's end after. Workloads whose events all precede
    ``since`` and that finished or were deleted are left out.

    One grouped pass per Workload (``per_uid``, in the order of the unique key's ``(uid,
    transition, at)`` index, which covers it) settles the Workloads with one reservation, no
    end before it and no preemption: most of them. The others (``mixed``) are paired with
    window functions over their own events: ``rq`` numbers the reservation each event
    follows, each segment gives its first end and last eviction, and LEAD/LAG give the next
    reservation and the previous one's end."""
    return f"""
WITH per_uid AS (
  SELECT uid,
    SUM(CASE WHEN transition = {_QR} THEN 1 ELSE 0 END) AS reservations,
    MIN(CASE WHEN transition = {_QR} THEN id END) AS r_id,
    MIN(CASE WHEN transition = {_QR} THEN at END) AS r_at,
    MIN(CASE WHEN transition IN ({_ENDS_SQL}) THEN at END) AS ended_at,
    SUM(CASE WHEN transition = '{ev.PREEMPTED}' THEN 1 ELSE 0 END) AS preempted,
    MIN(CASE WHEN transition = '{ev.CREATED}' THEN at END) AS created_at,
    MIN(at) AS first_at
  FROM workload_events
  WHERE at < :until
  GROUP BY uid
),
relevant AS (
  SELECT uid, reservations, r_id, r_at, ended_at, preempted,
    COALESCE(created_at, first_at) AS created_at,
    CASE WHEN reservations = 1 AND preempted = 0 AND (ended_at IS NULL OR ended_at > r_at)
      THEN 1 ELSE 0 END AS simple
  FROM per_uid
  WHERE reservations > 0
    AND (r_at >= :since
         OR EXISTS (SELECT 1 FROM workload_events x WHERE x.uid = per_uid.uid AND x.at >= :since)
         OR NOT EXISTS (SELECT 1 FROM workload_events x
                        WHERE x.uid = per_uid.uid AND x.transition IN ({_CLOSED_SQL})))
),
mixed AS (
  SELECT uid, created_at, preempted FROM relevant WHERE simple = 0
),
ordered AS (
  SELECT e.id, e.uid, e.transition, e.at,
    SUM(CASE WHEN e.transition = {_QR} THEN 1 ELSE 0 END)
      OVER (PARTITION BY e.uid ORDER BY e.at, e.id ROWS UNBOUNDED PRECEDING) AS rq
  FROM workload_events e
  WHERE e.uid IN (SELECT uid FROM mixed) AND e.at < :until
    AND e.transition IN ({_QR}, {_ENDS_SQL}, '{ev.EVICTED}')
),
segments AS (
  SELECT uid, rq,
    MIN(CASE WHEN transition = {_QR} THEN id END) AS r_id,
    MIN(CASE WHEN transition = {_QR} THEN at END) AS r_at,
    MIN(CASE WHEN transition IN ({_ENDS_SQL}) THEN at END) AS ended_at,
    MAX(CASE WHEN transition = '{ev.EVICTED}' THEN at END) AS evicted_at
  FROM ordered
  WHERE rq > 0
  GROUP BY uid, rq
),
paired AS (
  SELECT s.uid, s.rq, s.r_id, s.r_at, s.ended_at, s.evicted_at, m.created_at,
    LEAD(s.r_at) OVER (PARTITION BY s.uid ORDER BY s.rq) AS next_at,
    LAG(s.ended_at) OVER (PARTITION BY s.uid ORDER BY s.rq) AS prev_ended_at,
    LAG(s.evicted_at) OVER (PARTITION BY s.uid ORDER BY s.rq) AS prev_evicted_at
  FROM segments s JOIN mixed m ON m.uid = s.uid
),
res AS (
  SELECT uid, r_id, r_at, COALESCE(ended_at, :until) AS end_at, created_at AS queued_at
  FROM relevant WHERE simple = 1
  UNION ALL
  SELECT uid, r_id, r_at,
    COALESCE(ended_at, CASE WHEN next_at IS NOT NULL THEN COALESCE(evicted_at, next_at) END,
             :until) AS end_at,
    CASE WHEN rq = 1 THEN created_at
         ELSE COALESCE(prev_ended_at, prev_evicted_at, r_at) END AS queued_at
  FROM paired
),
preempted AS (
  SELECT p.uid, p.at, p.id,
    (SELECT q.id FROM workload_events q
     WHERE q.uid = p.uid AND q.transition = {_QR} AND q.at <= p.at AND {_after("p", "q")}
     ORDER BY q.at DESC, q.id DESC LIMIT 1) AS r_id
  FROM workload_events p
  WHERE p.uid IN (SELECT uid FROM mixed WHERE preempted > 0)
    AND p.transition = '{ev.PREEMPTED}' AND p.at >= :since AND p.at < :until
)"""


def _usage_statement(dialect: str, by: str) -> Any:
    """Three kinds of rows: (0, group, resource, base units x seconds), (1, group, None, wait
    in microseconds) per admission in reservation order, (2, group, None, preemptions)."""
    start = "CASE WHEN res.r_at > :since THEN res.r_at ELSE :since END"
    seconds = f"({_micros(dialect, 'res.end_at')} - {_micros(dialect, start)})"
    if dialect == "postgresql":
        seconds = f"CAST({seconds} AS DOUBLE PRECISION)"
    keys = {
        "namespace": "r.namespace",
        "localqueue": "r.namespace || '/' || COALESCE(r.local_queue, '')",
        "clusterqueue": "COALESCE(r.cluster_queue, '')",
    }
    if by == "flavor":
        held_key = "er.flavor"
        key = "COALESCE(f.flavor, '')"
        flavors = (
            "LEFT JOIN (SELECT DISTINCT event_id, flavor FROM workload_event_resources) f"
            " ON f.event_id = {id}"
        )
    else:
        held_key = key = keys[by]
        flavors = ""
    sql = f"""{_reservations()},
held AS (
  SELECT 0 AS kind, {held_key} AS grp, er.resource AS resource,
    SUM(er.amount * ({seconds} / 1000000.0)) AS value,
    CAST(NULL AS VARCHAR) AS uid, CAST(NULL AS TIMESTAMP) AS r_at,
    CAST(NULL AS BIGINT) AS r_id
  FROM res
  JOIN workload_events r ON r.id = res.r_id
  JOIN workload_event_resources er ON er.event_id = res.r_id
  WHERE res.end_at > :since AND res.end_at > res.r_at
  GROUP BY {held_key}, er.resource
),
admitted AS (
  SELECT 1 AS kind, {key} AS grp, CAST(NULL AS VARCHAR) AS resource,
    {_micros(dialect, "res.r_at")} - {_micros(dialect, "res.queued_at")} AS value,
    res.uid AS uid, res.r_at AS r_at, res.r_id AS r_id
  FROM res
  JOIN workload_events r ON r.id = res.r_id
  {flavors.format(id="res.r_id")}
  WHERE res.r_at >= :since
),
preemptions AS (
  SELECT 2 AS kind, {key} AS grp, CAST(NULL AS VARCHAR) AS resource, COUNT(*) AS value,
    CAST(NULL AS VARCHAR) AS uid, CAST(NULL AS TIMESTAMP) AS r_at,
    CAST(NULL AS BIGINT) AS r_id
  FROM preempted p
  JOIN workload_events r ON r.id = p.r_id
  {flavors.format(id="p.r_id")}
  WHERE NOT EXISTS (
    SELECT 1 FROM workload_events e
    WHERE e.uid = p.uid AND e.transition IN ({_ENDS_SQL})
      AND {_after("e", "r")} AND {_after("p", "e")})
  GROUP BY {key}
)
SELECT kind, grp, resource, value FROM (
  SELECT * FROM held UNION ALL SELECT * FROM admitted UNION ALL SELECT * FROM preemptions
) everything
ORDER BY kind, uid, r_at, r_id"""
    return text(sql).bindparams(
        bindparam("since", type_=DateTime()), bindparam("until", type_=DateTime())
    )


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
