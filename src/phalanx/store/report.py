"""Reports read from the store: usage per group over a window, and one Workload's timeline.

Usage reads each quota reservation as the interval the writer stored for it
(:mod:`phalanx.store.intervals`: paired with the transition that ended it — quota released,
finished, deleted; a later reservation of the same Workload ends it at the eviction before
it, or at itself), clips it to the window and multiplies by what the reservation held. A
reservation still open is counted up to the end of the window.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from phalanx.store import intervals, quotas
from phalanx.store.models import WorkloadEvent

__all__ = [
    "GROUPINGS",
    "QuotaUse",
    "TimelineEntry",
    "UsageRow",
    "quota_use",
    "resource_seconds_per_bucket",
    "resource_unit",
    "timeline",
    "usage",
]

QuotaUse = quotas.QuotaUse

GROUPINGS = ("namespace", "localqueue", "clusterqueue", "flavor")


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

    Reads the reservation intervals (:mod:`phalanx.store.intervals`) that overlap the window
    and sums overlap x amount per group and resource in SQL; admissions and their waits (one
    integer of microseconds each, in Workload and time order) from the reservations that
    start in the window; preemptions from those in it."""
    if by not in GROUPINGS:
        raise ValueError(f"--by {by!r}: use one of {', '.join(GROUPINGS)}")
    params = {"since": intervals.micros(since), "until": intervals.micros(until)}
    groups: dict[str, UsageRow] = {}

    def row(key: str) -> UsageRow:
        found = groups.get(key)
        if found is None:
            found = groups[key] = UsageRow(group=key)
        return found

    with engine.connect() as connection:
        for key, resource, value in connection.execute(_held_statement(by), params):
            row(key).resource_seconds[resource] += float(value)
        seen: tuple[object, str] | None = None
        for key, wait, *reservation in connection.execute(_admitted_statement(by), params):
            if reservation:  # by flavor: each of a reservation's flavors once
                if (reservation[0], key) == seen:
                    continue
                seen = (reservation[0], key)
            found = row(key)
            found.admissions += 1
            found.waits.append(int(wait) / 1e6)
        for key, count in connection.execute(_preempted_statement(by), params):
            row(key).preemptions += int(count)
        connection.rollback()
    return [groups[k] for k in sorted(groups)]


def quota_use(
    engine: Engine, *, since: dt.datetime, until: dt.datetime
) -> dict[str, dict[str, quotas.QuotaUse]]:
    """ClusterQueue -> resource -> its quota, the part of it used and what it borrowed over
    ``[since, until)`` (base units x seconds; :func:`phalanx.store.quotas.quota_use`), over
    the same reservations :func:`usage` reads."""
    return quotas.quota_use(engine, since=since, until=until, overlapping=_OVERLAPPING)


def resource_seconds_per_bucket(
    engine: Engine, *, since: dt.datetime, until: dt.datetime, width: dt.timedelta, by: str
) -> dict[str, list[dict[str, float]]]:
    """Group -> per bucket (``[since + i x width, since + (i + 1) x width)``, the last one
    ending at ``until``) -> resource -> base units x seconds: what :func:`usage` over each
    bucket gives as ``resource_seconds`` (up to the order floating-point terms are added in),
    in one query. A group is listed if it held something in some bucket.

    Each reservation is cut to the part the buckets count (:func:`_covered`: its end, or up to
    a bucket's end where a bucket does not yet see what ended it), then split by integer
    arithmetic: a partial first and last bucket, and the whole buckets between as a step
    (+amount, -amount) summed up here."""
    if by not in GROUPINGS:
        raise ValueError(f"--by {by!r}: use one of {', '.join(GROUPINGS)}")
    width_us = width // dt.timedelta(microseconds=1)
    if width_us <= 0:
        raise ValueError("the bucket width must be positive")
    count = -(-(intervals.micros(until) - intervals.micros(since)) // width_us)
    params = {"since": intervals.micros(since), "until": intervals.micros(until), "w": width_us}
    found: dict[str, dict[str, list[float]]] = {}
    steps: dict[tuple[str, str], list[float]] = {}
    with engine.connect() as connection:
        for key, resource, kind, index, value in connection.execute(_buckets_statement(by), params):
            per_resource = found.setdefault(key, {})
            values = per_resource.setdefault(resource, [0.0] * count)
            if kind == 0:
                values[int(index)] += float(value)
            else:
                steps.setdefault((key, resource), [0.0] * (count + 1))[int(index)] += float(value)
        connection.rollback()
    whole = width_us / 1e6
    for (key, resource), step in steps.items():
        values = found[key][resource]
        rate = 0.0
        for index in range(count):
            rate += step[index]
            if rate:
                values[index] += rate * whole
    return {
        key: [
            {resource: values[index] for resource, values in sorted(per_resource.items())}
            for index in range(count)
        ]
        for key, per_resource in sorted(found.items())
    }


_KEYS = {
    "namespace": "r.namespace",
    "localqueue": "r.namespace || '/' || COALESCE(r.local_queue, '')",
    "clusterqueue": "COALESCE(r.cluster_queue, '')",
}
_OVERLAPPING = """r.closed_us > :since AND +r.start_us < :until
    AND (r.stray_until_us IS NULL OR r.stray_until_us >= :since)"""
"""The reservations that may overlap ``[since, until)``: not ended by its start (as far as
the store knows; an open one's ``closed_us`` is never) and started before its end: one range
of ``ix_workload_reservations_window``, which also holds every column read (the unary ``+``
keeps SQLite from the start index, which a window ending now does not narrow). The exact
overlap is computed from these."""


def _seconds(expression: str) -> str:
    """Microseconds (an integer expression) as seconds, in floating point on both backends."""
    return f"(CAST(({expression}) AS DOUBLE PRECISION) / 1000000)"


def _held_statement(by: str) -> Any:
    """(group, resource, base units x seconds) over the window.

    A reservation counts from its start to its end, clipped to the window; one whose end the
    window does not see yet (open, or ended by an event at or after ``until``) up to
    ``until``."""
    key = "x.flavor" if by == "flavor" else _KEYS[by]
    return text(f"""
SELECT {key}, x.resource, SUM(CAST(x.amount AS DOUBLE PRECISION) * {_seconds("r.held_us")})
FROM (
  SELECT r.id, r.namespace, r.local_queue, r.cluster_queue,
    (CASE WHEN r.closed_us < :until THEN r.end_us ELSE :until END)
      - (CASE WHEN r.start_us > :since THEN r.start_us ELSE :since END) AS held_us
  FROM workload_reservations r
  WHERE {_OVERLAPPING}
) r
JOIN workload_reservation_resources x ON x.reservation_id = r.id
WHERE r.held_us > 0
GROUP BY {key}, x.resource""")


def _admitted_statement(by: str) -> Any:
    """(group, wait in microseconds) per reservation that started in the window, in Workload
    and time order; by flavor, (flavor, wait, reservation id) per resource it holds (or ''
    for none), each flavor's rows adjacent, to be counted once per reservation."""
    window = "r.start_us >= :since AND r.start_us < :until"
    if by != "flavor":
        return text(f"""
SELECT {_KEYS[by]}, r.wait_us FROM workload_reservations r
WHERE {window}
ORDER BY r.uid, r.start_us, r.id""")
    # One row per (reservation, resource): the caller skips a reservation's repeated flavors.
    return text(f"""
SELECT COALESCE(x.flavor, ''), r.wait_us, r.id FROM workload_reservations r
LEFT JOIN workload_reservation_resources x ON x.reservation_id = r.id
WHERE {window}
ORDER BY r.uid, r.start_us, r.id, COALESCE(x.flavor, '')""")


def _preempted_statement(by: str) -> Any:
    """(group, preemptions in the window) of the reservations they were attributed to."""
    window = "p.at_us >= :since AND p.at_us < :until"
    if by != "flavor":
        return text(f"""
SELECT {_KEYS[by]}, COUNT(*) FROM workload_reservation_preemptions p
JOIN workload_reservations r ON r.id = p.reservation_id
WHERE {window}
GROUP BY {_KEYS[by]}""")
    return text(f"""
SELECT grp, COUNT(*) FROM (
  SELECT p.reservation_id, p.at_us, COALESCE(x.flavor, '') AS grp
  FROM workload_reservation_preemptions p
  LEFT JOIN workload_reservation_resources x ON x.reservation_id = p.reservation_id
  WHERE {window}
  GROUP BY p.reservation_id, p.at_us, COALESCE(x.flavor, '')
) t
GROUP BY grp""")


def _covered() -> str:
    """The end of the part of reservation ``r`` that the buckets count, given that each bucket
    counts it like :func:`usage` over that bucket would:

    - ended (by an event before ``until``) in bucket ``c``: the buckets before ``c`` do not
      see the end yet and count it to their own ends, bucket ``c`` to its end: so up to the
      later of its end and the start of bucket ``c``;
    - left open by a finished Workload (``stray_until_us``) in bucket ``k``: up to the end of
      bucket ``k``, the last whose report reads it;
    - else up to ``until``."""
    bucket_of_closed = ":since + ((r.closed_us - :since) / :w) * :w"
    after_stray = ":since + ((r.stray_until_us - :since) / :w + 1) * :w"
    return f"""CASE
      WHEN r.closed_us < :until THEN
        CASE WHEN r.end_us > {bucket_of_closed} THEN r.end_us ELSE {bucket_of_closed} END
      WHEN r.stray_until_us IS NOT NULL AND {after_stray} < :until THEN {after_stray}
      ELSE :until END"""


def _buckets_statement(by: str) -> Any:
    """(group, resource, kind, bucket, value): kind 0 adds base units x seconds to a bucket,
    kind 1 a step of base units held over whole buckets from that bucket on."""
    key = "x.flavor" if by == "flavor" else _KEYS[by]
    amount = "CAST(x.amount AS DOUBLE PRECISION)"
    first = _seconds("CASE WHEN ia = ib THEN b - a ELSE :since + (ia + 1) * :w - a END")
    last = _seconds("b - (:since + ib * :w)")
    return text(f"""
WITH cut AS (
  SELECT r.id, r.namespace, r.local_queue, r.cluster_queue,
    CASE WHEN r.start_us > :since THEN r.start_us ELSE :since END AS a,
    {_covered()} AS b
  FROM workload_reservations r
  WHERE {_OVERLAPPING}
),
spans AS (
  SELECT {key} AS grp, x.resource AS resource, {amount} AS amount, r.a AS a, r.b AS b,
    (r.a - :since) / :w AS ia, (r.b - 1 - :since) / :w AS ib
  FROM cut r
  JOIN workload_reservation_resources x ON x.reservation_id = r.id
  WHERE r.b > r.a
)
SELECT grp, resource, 0, ia, SUM(amount * {first})
FROM spans GROUP BY grp, resource, ia
UNION ALL
SELECT grp, resource, 0, ib, SUM(amount * {last})
FROM spans WHERE ib > ia GROUP BY grp, resource, ib
UNION ALL
SELECT grp, resource, 1, ia + 1, SUM(amount) FROM spans WHERE ib > ia + 1
GROUP BY grp, resource, ia + 1
UNION ALL
SELECT grp, resource, 1, ib, -SUM(amount) FROM spans WHERE ib > ia + 1
GROUP BY grp, resource, ib""")


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
