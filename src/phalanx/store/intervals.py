"""Reservations as intervals: each quota reservation paired with what ended it, computed when
its events are written (:func:`phalanx.store.db.write_events`) so that the usage report reads
intervals overlapping its window instead of the whole event history.

The pairing rules, per Workload, over its events in ``(at, id)`` order (``id`` is the order
the store received them in, which decides ties in time):

- each ``quota_reserved`` opens a reservation; the first ``quota_released``, ``finished`` or
  ``deleted`` after it closes it there;
- if another reservation comes first, that one closes it at the last ``evicted`` in between,
  or at itself; a report whose window ends before that later reservation does not see it yet,
  and counts the reservation up to the window's end (:attr:`Interval.closed_us` says when the
  end became known);
- the wait before a reservation runs from the Workload's creation (its first ``created``, else
  its first event) for the first, from the previous reservation's end after;
- a ``preempted`` belongs to the reservation open at it;
- a reservation left open by a Workload that had already finished or been deleted (a stray
  reservation after the end) counts only in windows that start no later than the Workload's
  last event (:attr:`Interval.stray_until_us`): such a Workload's history is not read for
  windows after it.

These are the rules of the Python pairing the report used first (kept as the oracle in
``tests/unit/store/test_store_report_sql.py``). Times here are integer microseconds since the
Unix epoch (UTC), the unit of the interval tables: exact arithmetic in SQL on every backend.

Any write recomputes the intervals of every Workload it added an event to, from all of that
Workload's stored events, so late and out-of-order events (a resync after an outage) and
replays leave the same rows as one write of everything in order.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Connection, CursorResult

from phalanx.store import events as ev

__all__ = [
    "EPOCH",
    "OPEN",
    "TABLE_COLUMNS",
    "Interval",
    "Stored",
    "StoredEvent",
    "extend",
    "micros",
    "pair",
    "read_histories",
    "stored_micros",
    "table_rows",
]

EPOCH = dt.datetime(1970, 1, 1)
OPEN = 2**63 - 1
"""``closed_us`` of a reservation still open: never, so that one index range (``closed_us >
since``) finds every reservation a window may overlap, open ones included."""
_ONE_US = dt.timedelta(microseconds=1)
_ENDS = frozenset((ev.QUOTA_RELEASED, ev.FINISHED, ev.DELETED))
_CLOSED = frozenset((ev.FINISHED, ev.DELETED))


def micros(at: dt.datetime) -> int:
    """A naive UTC time as integer microseconds since the epoch."""
    return (at - EPOCH) // _ONE_US


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One stored event, as much of it as the pairing needs."""

    id: int
    uid: str
    transition: str
    at_us: int
    namespace: str
    local_queue: str | None
    cluster_queue: str | None
    held: tuple[tuple[str, str, int], ...] = ()
    """For a reservation: (resource, flavor, amount in base units), one per pod set."""


@dataclass(slots=True)
class Interval:
    """One reservation: ``id`` is its ``quota_reserved`` event's id."""

    id: int
    uid: str
    namespace: str
    local_queue: str | None
    cluster_queue: str | None
    start_us: int
    wait_us: int
    end_us: int | None = None
    """When it stopped holding quota; None while open."""
    closed_us: int | None = None
    """When the event that ended it happened: ``end_us``, unless a later reservation ended it
    (at the eviction before it), then that reservation's time."""
    stray_until_us: int | None = None
    preempted_us: list[int] = field(default_factory=list)
    held: dict[tuple[str, str], int] = field(default_factory=dict)
    """(resource, flavor) -> amount, summed over pod sets."""


def pair(events: Sequence[StoredEvent]) -> list[Interval]:
    """The reservations of one Workload from all of its events (any order)."""
    ordered = sorted(events, key=lambda e: (e.at_us, e.id))
    if not ordered:
        return []
    created = next((e.at_us for e in ordered if e.transition == ev.CREATED), ordered[0].at_us)
    return _go_on(ordered, None, created, closed=False)


def _go_on(
    ordered: Sequence[StoredEvent],
    open_: Interval | None,
    queued_since: int,
    *,
    closed: bool,
    evicted_at: int | None = None,
) -> list[Interval]:
    """The pairing rules over ``ordered`` (in ``(at, id)`` order), from a Workload's state
    after the events before them: the reservation still open (changed in place) and its
    latest eviction, when it began to wait, whether it had ended. Returns the reservations
    ``ordered`` opens."""
    found: list[Interval] = []
    for event in ordered:
        transition = event.transition
        if transition == ev.QUOTA_RESERVED:
            if open_ is not None:
                open_.end_us = evicted_at if evicted_at is not None else event.at_us
                open_.closed_us = event.at_us
                queued_since = open_.end_us
            held: dict[tuple[str, str], int] = {}
            for resource, flavor, amount in event.held:
                held[(resource, flavor)] = held.get((resource, flavor), 0) + amount
            open_ = Interval(
                id=event.id,
                uid=event.uid,
                namespace=event.namespace,
                local_queue=event.local_queue,
                cluster_queue=event.cluster_queue,
                start_us=event.at_us,
                wait_us=event.at_us - queued_since,
                held=held,
            )
            evicted_at = None
            found.append(open_)
        elif open_ is None:
            continue
        elif transition == ev.EVICTED:
            evicted_at = event.at_us
        elif transition == ev.PREEMPTED:
            open_.preempted_us.append(event.at_us)
        elif transition in _ENDS:
            open_.end_us = open_.closed_us = event.at_us
            queued_since = event.at_us
            open_, evicted_at = None, None
    if open_ is not None and (closed or any(e.transition in _CLOSED for e in ordered)):
        open_.stray_until_us = ordered[-1].at_us
    return found


@dataclass(slots=True)
class Stored:
    """What the store holds of one Workload before a write: enough to go on pairing from
    without reading its events (:func:`extend`)."""

    last_us: int
    """Its latest event's time."""
    first_us: int
    created_us: int | None
    """Its first ``created`` event's time, if it has one."""
    evicted_us: int | None
    """Its latest ``evicted`` event's time, if it has one."""
    closed: bool
    """Whether it has a ``finished`` or ``deleted`` event."""
    reservations: list[Interval] = field(default_factory=list)
    """Its stored intervals; the open one complete (``held``, ``preempted_us``), the others
    as far as their row goes."""


def extend(
    stored: Stored | None, new: Sequence[StoredEvent]
) -> tuple[list[Interval], list[int]] | None:
    """The pairing after ``new`` events of one Workload, all later than its stored ones (in
    ``(at, id)`` order: their ids are larger), are added to ``stored``, computed from the
    stored intervals instead of the stored events: ``(intervals to write, ids of stored
    intervals they replace)``. None when it cannot be (an event earlier than a stored one, a
    stored reservation open after an eviction or after the Workload's end): the caller pairs
    the whole history then. Gives what :func:`pair` over all of the events gives."""
    ordered = sorted(new, key=lambda e: (e.at_us, e.id))
    if not ordered:
        return [], []
    if stored is None:
        return pair(ordered), []
    if ordered[0].at_us < stored.last_us:
        return None
    opened = [r for r in stored.reservations if r.end_us is None]
    if len(opened) > 1:
        return None
    before: Interval | None = opened[0] if opened else None
    open_: Interval | None = None
    evicted_at: int | None = None
    queued_since = 0
    if before is not None:
        if before.stray_until_us is not None:
            return None
        if stored.evicted_us is not None and stored.evicted_us >= before.start_us:
            if stored.evicted_us == before.start_us:
                return None  # before or after the reservation: only their ids say
            evicted_at = stored.evicted_us  # the latest, so the one a reservation ends it at
        if any((r.start_us, r.id) > (before.start_us, before.id) for r in stored.reservations):
            return None
        # A copy to go on with (its lists and dicts too): ``before`` stays what is stored.
        open_ = replace(before, preempted_us=list(before.preempted_us), held=dict(before.held))
    elif stored.reservations:
        last = max(stored.reservations, key=lambda r: (r.start_us, r.id))
        assert last.end_us is not None
        queued_since = last.end_us
    elif stored.created_us is not None:
        queued_since = stored.created_us
    else:
        queued_since = next(
            (e.at_us for e in ordered if e.transition == ev.CREATED), stored.first_us
        )
    found = _go_on(ordered, open_, queued_since, closed=stored.closed, evicted_at=evicted_at)
    if open_ is not None and before is not None and open_ != before:  # changed in place
        return [open_, *found], [before.id]
    return found, []


_HISTORY = """
SELECT e.id, e.uid, e.transition, e.at, e.namespace, e.local_queue, e.cluster_queue,
  r.resource, r.flavor, r.amount
FROM workload_events e
LEFT JOIN workload_event_resources r ON r.event_id = e.id AND e.transition = '{qr}'
{where}
ORDER BY e.uid, e.at, e.id"""


def read_histories(
    connection: Connection, uids: Collection[str] | None = None, *, chunk: int = 500
) -> Iterator[list[StoredEvent]]:
    """Each Workload's stored events (of ``uids``, else all), one list per Workload. Reads
    the event tables as revision 0001 made them (the interval migration uses it too)."""
    if uids is None:
        yield from _grouped(
            _fetched(connection.exec_driver_sql(_HISTORY.format(qr=ev.QUOTA_RESERVED, where="")))
        )
        return
    # Straight to the driver (compiling an expanding IN per chunk cost more than the query).
    mark = "?" if connection.dialect.paramstyle == "qmark" else "%s"
    ordered = sorted(uids)
    for start in range(0, len(ordered), chunk):
        part = tuple(ordered[start : start + chunk])
        where = f"WHERE e.uid IN ({', '.join([mark] * len(part))})"
        yield from _grouped(
            _fetched(
                connection.exec_driver_sql(_HISTORY.format(qr=ev.QUOTA_RESERVED, where=where), part)
            )
        )


def _fetched(result: CursorResult[Any]) -> Iterator[Sequence[object]]:
    """The rows, fetched many at a time (one at a time cost a call into the driver each)."""
    while rows := result.fetchmany(2_000):
        yield from rows


def _grouped(rows: Iterable[Sequence[object]]) -> Iterator[list[StoredEvent]]:
    current: list[StoredEvent] = []
    held: list[tuple[str, str, int]] = []
    last: tuple[object, ...] | None = None

    def flush_event() -> None:
        assert last is not None
        ident, uid, transition, at, namespace, local_queue, cluster_queue = last
        current.append(
            StoredEvent(
                id=int(ident),  # type: ignore[call-overload]
                uid=str(uid),
                transition=str(transition),
                at_us=micros(_as_datetime(at)),
                namespace=str(namespace),
                local_queue=local_queue,  # type: ignore[arg-type]
                cluster_queue=cluster_queue,  # type: ignore[arg-type]
                held=tuple(held),
            )
        )
        held.clear()

    for row in rows:
        head = tuple(row[:7])
        if last is not None and head[0] != last[0]:
            flush_event()
            if head[1] != last[1]:
                yield current
                current = []
        last = head
        resource, flavor, amount = row[7], row[8], row[9]
        if resource is not None:
            held.append((str(resource), str(flavor), int(amount)))  # type: ignore[call-overload]
    if last is not None:
        flush_event()
        yield current


def stored_micros(value: object) -> int:
    """A time as the driver returns it from the store (a datetime, or SQLite's text), in
    microseconds since the epoch."""
    return micros(_as_datetime(value))


def _as_datetime(value: object) -> dt.datetime:
    """A stored time as a naive UTC datetime (SQLite through text() returns the string)."""
    if isinstance(value, dt.datetime):
        return (
            value.replace(tzinfo=None)
            if value.tzinfo is None
            else value.astimezone(dt.UTC).replace(tzinfo=None)
        )
    return dt.datetime.fromisoformat(str(value))


TABLE_COLUMNS = {
    "workload_reservations": (
        "id",
        "uid",
        "namespace",
        "local_queue",
        "cluster_queue",
        "start_us",
        "end_us",
        "closed_us",
        "wait_us",
        "preempted",
        "stray_until_us",
    ),
    "workload_reservation_resources": ("reservation_id", "resource", "flavor", "amount"),
    "workload_reservation_preemptions": ("reservation_id", "at_us"),
}
"""The columns of the rows :func:`table_rows` gives, per table, in the rows' order."""


def table_rows(
    intervals: Iterable[Interval],
) -> tuple[list[dict[str, object]], list[dict[str, object]], list[dict[str, object]]]:
    """Rows for ``workload_reservations``, ``workload_reservation_resources`` and
    ``workload_reservation_preemptions`` (their columns as revision 0003 made them)."""
    reservations: list[dict[str, object]] = []
    resources: list[dict[str, object]] = []
    preemptions: list[dict[str, object]] = []
    for one in intervals:
        reservations.append(
            {
                "id": one.id,
                "uid": one.uid,
                "namespace": one.namespace,
                "local_queue": one.local_queue,
                "cluster_queue": one.cluster_queue,
                "start_us": one.start_us,
                "end_us": one.end_us,
                "closed_us": OPEN if one.closed_us is None else one.closed_us,
                "wait_us": one.wait_us,
                "preempted": bool(one.preempted_us),
                "stray_until_us": one.stray_until_us,
            }
        )
        resources.extend(
            {"reservation_id": one.id, "resource": r, "flavor": f, "amount": amount}
            for (r, f), amount in one.held.items()
        )
        preemptions.extend({"reservation_id": one.id, "at_us": at} for at in one.preempted_us)
    return reservations, resources, preemptions
