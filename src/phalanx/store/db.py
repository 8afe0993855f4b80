"""Opening the store, migrating it, and writing events into it idempotently."""

from __future__ import annotations

import os
import weakref
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import TypeVar, cast

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Dialect, Engine, Table, create_engine, event, inspect
from sqlalchemy.engine import make_url

from phalanx.store import events as ev
from phalanx.store import intervals
from phalanx.store.events import Event
from phalanx.store.models import (
    EventResource,
    Reservation,
    ReservationPreemption,
    ReservationResource,
    WorkloadEvent,
)

__all__ = [
    "DEFAULT_PATH",
    "SQLITE_PRAGMAS",
    "StoreError",
    "current_revision",
    "default_url",
    "downgrade",
    "head_revision",
    "open_engine",
    "rebuild_reservations",
    "upgrade",
    "write_events",
]

DEFAULT_PATH = Path("~/.local/state/phalanx/store.db")
"""Where the SQLite store lives unless ``--store`` or ``$PHALANX_STORE`` names another; in a
cluster, point it at a volume (or a PostgreSQL URL)."""

STORE_ENV = "PHALANX_STORE"
SQLITE_PRAGMAS = (
    "foreign_keys=ON",
    "journal_mode=WAL",
    # 32 MiB of page cache per connection rather than SQLite's 2 MiB: each batch touches a
    # leaf page per new Workload in every index keyed by UID, and with 2 MiB most came from
    # the file again (pread calls: 175,000 writing 15,000 Workloads into an empty file,
    # 237,000 onto 368,000 stored events; 32,000 and 52,000 with 16 MiB or more).
    "cache_size=-32768",
    # A checkpoint every 10,000 WAL pages (40 MB) rather than 1,000: a page the writer
    # changes in every batch (the tail of each index) goes to the file once per checkpoint.
    "wal_autocheckpoint=10000",
)
"""Set on every SQLite connection (see docs/store.md, the writer's cost)."""
_T = TypeVar("_T")


class StoreError(Exception):
    """A store URL that cannot be used, with what to do about it."""


def default_url() -> str:
    """``$PHALANX_STORE``, else a SQLite file under ``~/.local/state/phalanx``."""
    return os.environ.get(STORE_ENV) or f"sqlite:///{DEFAULT_PATH.expanduser()}"


def open_engine(url: str, *, create: bool = True) -> Engine:
    """An engine for ``url``: ``sqlite:///PATH`` (the folder is created, unless not
    ``create``: readers refuse a missing file rather than leave an empty one behind) or
    ``postgresql+psycopg://...`` (``postgresql://`` means the same)."""
    try:
        parsed = make_url(url)
    except Exception as error:  # sqlalchemy raises ArgumentError; any parse failure is ours
        raise StoreError(
            f"--store {url!r} is not a database URL; use sqlite:///PATH or"
            " postgresql://USER@HOST:PORT/DB"
        ) from error
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            path = Path(parsed.database).expanduser()
            if not create and not path.exists():
                raise StoreError(
                    f"store {url!r}: no such file; the operator creates it (--store), or run "
                    "`phalanx store upgrade --store URL`"
                )
            path.parent.mkdir(parents=True, exist_ok=True)
            parsed = parsed.set(database=str(path))
        engine = create_engine(parsed, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection, _record):  # type: ignore[no-untyped-def]
            cursor = dbapi_connection.cursor()
            for pragma in SQLITE_PRAGMAS:
                cursor.execute(f"PRAGMA {pragma}")
            cursor.close()

        return engine
    if parsed.get_backend_name() == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        return create_engine(parsed, pool_pre_ping=True)
    raise StoreError(
        f"--store {url!r}: backend {parsed.get_backend_name()!r} is not supported;"
        " use sqlite:///PATH or postgresql://..."
    )


def _alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", "phalanx.store:migrations")
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply the shipped migrations up to ``revision``."""
    command.upgrade(_alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str) -> None:
    _WITH_INTERVALS.discard(engine)
    command.downgrade(_alembic_config(engine), revision)


def head_revision() -> str:
    head = ScriptDirectory.from_config(
        _alembic_config(create_engine("sqlite://"))
    ).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def write_events(engine: Engine, events: Sequence[Event]) -> int:
    """Insert the events not yet stored, in one transaction; return how many were new.

    In the same transaction, the reservation intervals of every Workload that got a new event
    and has a reservation are paired again from all of its stored events
    (:mod:`phalanx.store.intervals`) and those that changed are rewritten: a replay changes
    nothing, and events arriving late or out of order leave the same intervals as one write
    of everything.

    A key already stored is skipped by the insert itself (``ON CONFLICT DO NOTHING``), so a
    concurrent writer (an old leader still flushing) storing the same key first costs nothing
    but that row; on PostgreSQL writers take turns on a transaction-scoped advisory lock, so
    the one that writes last pairs the events of both.
    """
    unique = list({e.key: e for e in events}.values())
    if not unique:
        return 0
    with engine.begin() as connection:
        return _insert_missing(connection, unique)


_EVENTS = cast(Table, WorkloadEvent.__table__)
_EVENT_RESOURCES = cast(Table, EventResource.__table__)
_EVENT_COLUMNS = (
    "uid",
    "transition",
    "at",
    "namespace",
    "name",
    "local_queue",
    "cluster_queue",
    "priority",
    "reason",
    "message",
    "flavors",
    "topology",
)
_RESERVATION_LOCK = 0x70686C78  # "phlx": one writer at a time (PostgreSQL)


def _insert_missing(connection: Connection, events: Sequence[Event]) -> int:
    # Driver-level executemany of plain tuples (SQLAlchemy's per-row parameter processing of
    # a Core insert was most of the writer's CPU): the events in order, so that their ids grow
    # in that order (ids decide ties in time: the intervals need them). Writers take turns
    # (the lock; SQLite's one writer), so the rows above the largest id before are this
    # batch's new ones: one range read on the primary key gives them with their ids.
    _lock(connection)
    sql = _driver_sql(connection.dialect)
    before = connection.exec_driver_sql("SELECT max(id) FROM workload_events").scalar() or 0
    sql.events.execute(connection, [_row(e) for e in events])
    new: dict[tuple[str, str, int], int] = {}
    for event_id, uid, transition, at in connection.exec_driver_sql(
        f"SELECT id, uid, transition, at FROM workload_events WHERE id > {sql.mark}", (before,)
    ):
        new[(uid, transition, intervals.stored_micros(at))] = event_id
    resources: list[tuple[object, ...]] = []
    fresh: dict[str, list[intervals.StoredEvent]] = {}
    for one in events:
        at_us = intervals.micros(one.at)
        event_id = new.get((one.uid, one.transition, at_us))
        if event_id is not None:
            resources.extend(
                (event_id, u.pod_set, u.resource, u.flavor, u.amount) for u in one.usage
            )
            fresh.setdefault(one.uid, []).append(_stored_event(event_id, at_us, one))
    sql.event_resources.execute(connection, resources)
    if fresh and _has_intervals(connection):
        _update_reservations(connection, fresh, before)
    return len(new)


def _stored_event(event_id: int, at_us: int, one: Event) -> intervals.StoredEvent:
    """``one`` as :func:`intervals.read_histories` would read it back."""
    return intervals.StoredEvent(
        id=event_id,
        uid=one.uid,
        transition=one.transition,
        at_us=at_us,
        namespace=one.namespace,
        local_queue=one.local_queue,
        cluster_queue=one.cluster_queue,
        held=tuple((u.resource, u.flavor, u.amount) for u in one.usage)
        if one.transition == ev.QUOTA_RESERVED
        else (),
    )


def _update_reservations(
    connection: Connection, fresh: dict[str, list[intervals.StoredEvent]], before: int
) -> None:
    """Bring the stored intervals of the Workloads in ``fresh`` (uid -> its new events, those
    with an id above ``before``) up to their events.

    What is stored is the pairing of the events before (every write leaves it so), so only
    reservations whose pairing changed are written, and only Workloads whose pairing can have
    changed are looked at: those with a new reservation, and those that already had one (any
    event can move a reservation's bounds: even an admission is a Workload's last event).
    When a Workload's new events all come after its stored ones (the live writer's case), the
    pairing goes on from its stored intervals and a summary of its events read from the
    unique key's index (:func:`intervals.extend`); otherwise its whole history is read and
    paired again."""
    kept = _stored_reservations(connection, sorted(fresh))
    looking = sorted(
        uid
        for uid, new in fresh.items()
        if uid in kept or any(e.transition == ev.QUOTA_RESERVED for e in new)
    )
    summaries = _summaries(connection, looking, before)
    stale: list[int] = []
    found: list[intervals.Interval] = []
    again: set[str] = set()
    for uid in looking:
        summary = summaries.get(uid)
        if summary is not None:
            summary.reservations = kept.get(uid, [])
        extended = intervals.extend(summary, fresh[uid])
        if extended is None:
            again.add(uid)
            continue
        found.extend(extended[0])
        stale.extend(extended[1])
    for history in intervals.read_histories(connection, again):
        then = {one.id: one for one in intervals.pair([s for s in history if s.id <= before])}
        for one in intervals.pair(history):
            old = then.pop(one.id, None)
            if old != one:
                found.append(one)
                if old is not None:
                    stale.append(one.id)
        stale.extend(then)  # paired no more (none today: each quota_reserved opens one)
    _delete_reservations(connection, stale)
    _insert_reservations(connection, found)


_SUMMARY = """
SELECT uid, max(at), min(at),
  min(CASE WHEN transition = '{created}' THEN at END),
  max(CASE WHEN transition = '{evicted}' THEN at END),
  max(CASE WHEN transition IN ('{finished}', '{deleted}') THEN 1 ELSE 0 END)
FROM workload_events
WHERE id <= {mark} AND uid IN ({marks})
GROUP BY uid"""


def _summaries(
    connection: Connection, uids: Sequence[str], before: int
) -> dict[str, intervals.Stored]:
    """What :func:`intervals.extend` needs of the events up to ``before`` of each of
    ``uids`` that has any (read from the unique key's index on SQLite: no event row)."""
    mark = _driver_sql(connection.dialect).mark
    found: dict[str, intervals.Stored] = {}
    for chunk in _chunks(uids, 500):
        sql = _SUMMARY.format(
            created=ev.CREATED,
            evicted=ev.EVICTED,
            finished=ev.FINISHED,
            deleted=ev.DELETED,
            mark=mark,
            marks=", ".join([mark] * len(chunk)),
        )
        for uid, last, first, created, evicted, closed in connection.exec_driver_sql(
            sql, (before, *chunk)
        ):
            found[str(uid)] = intervals.Stored(
                last_us=intervals.stored_micros(last),
                first_us=intervals.stored_micros(first),
                created_us=None if created is None else intervals.stored_micros(created),
                evicted_us=None if evicted is None else intervals.stored_micros(evicted),
                closed=bool(closed),
            )
    return found


def _stored_reservations(
    connection: Connection, uids: Sequence[str]
) -> dict[str, list[intervals.Interval]]:
    """The stored intervals of those of ``uids`` that have any; an open one with what it
    holds and its preemptions, the others as their row goes."""
    mark = _driver_sql(connection.dialect).mark
    found: dict[str, list[intervals.Interval]] = {}
    opened: dict[int, intervals.Interval] = {}
    for chunk in _chunks(uids, 500):
        rows = connection.exec_driver_sql(
            "SELECT id, uid, namespace, local_queue, cluster_queue, start_us, end_us,"
            " closed_us, wait_us, stray_until_us FROM workload_reservations"
            f" WHERE uid IN ({', '.join([mark] * len(chunk))})",
            tuple(chunk),
        )
        for ident, uid, namespace, lq, cq, start, end, closed, wait, stray in rows:
            one = intervals.Interval(
                id=int(ident),
                uid=str(uid),
                namespace=str(namespace),
                local_queue=lq,
                cluster_queue=cq,
                start_us=int(start),
                wait_us=int(wait),
                end_us=None if end is None else int(end),
                closed_us=None if closed is None or closed == intervals.OPEN else int(closed),
                stray_until_us=None if stray is None else int(stray),
            )
            found.setdefault(one.uid, []).append(one)
            if one.end_us is None:
                opened[one.id] = one
    for part in _chunks(sorted(opened), 500):
        marks = ", ".join([mark] * len(part))
        for ident, resource, flavor, amount in connection.exec_driver_sql(
            "SELECT reservation_id, resource, flavor, amount FROM workload_reservation_resources"
            f" WHERE reservation_id IN ({marks})",
            tuple(part),
        ):
            opened[int(ident)].held[(str(resource), str(flavor))] = int(amount)
        for ident, at_us in connection.exec_driver_sql(
            "SELECT reservation_id, at_us FROM workload_reservation_preemptions"
            f" WHERE reservation_id IN ({marks}) ORDER BY reservation_id, at_us",
            tuple(part),
        ):
            opened[int(ident)].preempted_us.append(int(at_us))
    return found


_WITH_INTERVALS: weakref.WeakSet[Engine] = weakref.WeakSet()


def _has_intervals(connection: Connection) -> bool:
    """Whether the store is at revision 0003 or later (a store at an older revision takes
    events without intervals; upgrading fills them from the events)."""
    engine = connection.engine
    if engine in _WITH_INTERVALS:
        return True
    if inspect(connection).has_table(Reservation.__tablename__):
        _WITH_INTERVALS.add(engine)
        return True
    return False


def _lock(connection: Connection) -> None:
    """On PostgreSQL, a transaction-scoped advisory lock: two writers adding events of one
    Workload concurrently each read the other's only once it has committed, and the one that
    pairs last sees both (SQLite lets one writer in at a time anyway)."""
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_RESERVATION_LOCK})")


def rebuild_reservations(connection: Connection, uids: Collection[str] | None = None) -> int:
    """Replace the reservation intervals of ``uids`` (else of every Workload) with those their
    stored events give, in the caller's transaction; return how many there are now."""
    _lock(connection)
    return _replace_reservations(connection, uids, intervals.read_histories(connection, uids))


def _replace_reservations(
    connection: Connection,
    uids: Collection[str] | None,
    histories: Iterable[Sequence[intervals.StoredEvent]],
) -> int:
    found: list[intervals.Interval] = []
    for history in histories:
        found.extend(intervals.pair(history))
    if uids is None:
        for table in (ReservationResource, ReservationPreemption, Reservation):
            connection.exec_driver_sql(f"DELETE FROM {table.__tablename__}")
    else:
        mark = _driver_sql(connection.dialect).mark
        owned: list[int] = []
        for chunk in _chunks(sorted(uids), 500):
            marks = ", ".join([mark] * len(chunk))
            owned.extend(
                connection.exec_driver_sql(
                    f"SELECT id FROM workload_reservations WHERE uid IN ({marks})", tuple(chunk)
                ).scalars()
            )
        _delete_reservations(connection, owned)
    _insert_reservations(connection, found)
    return len(found)


def _delete_reservations(connection: Connection, ids: Sequence[int]) -> None:
    mark = _driver_sql(connection.dialect).mark
    for chunk in _chunks(ids, 500):
        marks = ", ".join([mark] * len(chunk))
        for table, column in (
            ("workload_reservation_resources", "reservation_id"),
            ("workload_reservation_preemptions", "reservation_id"),
            ("workload_reservations", "id"),
        ):
            connection.exec_driver_sql(
                f"DELETE FROM {table} WHERE {column} IN ({marks})", tuple(chunk)
            )


def _insert_reservations(connection: Connection, found: Iterable[intervals.Interval]) -> None:
    sql = _driver_sql(connection.dialect)
    rows, held, preempted = intervals.table_rows(found)
    for insert_, values in (
        (sql.reservations, rows),
        (sql.reservation_resources, held),
        (sql.reservation_preemptions, preempted),
    ):
        insert_.execute(connection, [tuple(v[c] for c in insert_.columns) for v in values])


class _Insert:
    """An executemany INSERT of plain tuples straight to the driver: its SQL in the dialect's
    parameter style, and the bind processors of the columns that have one (SQLite's datetimes
    as SQLAlchemy stores them, JSON), applied per row exactly as SQLAlchemy would."""

    def __init__(
        self, dialect: Dialect, table: Table, columns: Sequence[str], skip: Sequence[str] = ()
    ) -> None:
        quote = dialect.identifier_preparer.quote
        mark = _mark(dialect)
        self.columns = tuple(columns)
        self.sql = (
            f"INSERT INTO {quote(table.name)} ({', '.join(quote(c) for c in columns)})"
            f" VALUES ({', '.join([mark] * len(columns))})"
        )
        if skip:
            self.sql += f" ON CONFLICT ({', '.join(quote(c) for c in skip)}) DO NOTHING"
        self.processors = [
            (index, processor)
            for index, column in enumerate(columns)
            if (processor := table.c[column].type.dialect_impl(dialect).bind_processor(dialect))
            is not None
        ]

    def execute(self, connection: Connection, rows: list[tuple[object, ...]]) -> None:
        """Insert ``rows`` (values in the columns' order)."""
        if not rows:
            return
        if self.processors:
            rows = [self._processed(row) for row in rows]
        connection.exec_driver_sql(self.sql, rows)

    def _processed(self, row: tuple[object, ...]) -> tuple[object, ...]:
        values = list(row)
        for index, processor in self.processors:
            value = values[index]
            if value is not None:
                values[index] = processor(value)
        return tuple(values)


class _DriverSql:
    """The writer's statements for one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        self.mark = _mark(dialect)
        self.events = _Insert(dialect, _EVENTS, _EVENT_COLUMNS, ("uid", "transition", "at"))
        self.event_resources = _Insert(
            dialect,
            _EVENT_RESOURCES,
            ("event_id", "pod_set", "resource", "flavor", "amount"),
        )
        columns = intervals.TABLE_COLUMNS
        self.reservations = _Insert(
            dialect, cast(Table, Reservation.__table__), columns["workload_reservations"]
        )
        self.reservation_resources = _Insert(
            dialect,
            cast(Table, ReservationResource.__table__),
            columns["workload_reservation_resources"],
        )
        self.reservation_preemptions = _Insert(
            dialect,
            cast(Table, ReservationPreemption.__table__),
            columns["workload_reservation_preemptions"],
        )


_DRIVER_SQL: dict[tuple[str, str, str], _DriverSql] = {}


def _driver_sql(dialect: Dialect) -> _DriverSql:
    key = (dialect.name, str(dialect.driver), str(dialect.paramstyle))
    found = _DRIVER_SQL.get(key)
    if found is None:
        found = _DRIVER_SQL[key] = _DriverSql(dialect)
    return found


def _mark(dialect: Dialect) -> str:
    """One positional parameter in the driver's own style."""
    if dialect.paramstyle == "qmark":
        return "?"
    if dialect.paramstyle in ("format", "pyformat"):
        return "%s"
    raise StoreError(
        f"store driver {dialect.driver!r}: parameter style {dialect.paramstyle!r} is not"
        " supported; use sqlite:///PATH or postgresql+psycopg://..."
    )


def _row(event: Event) -> tuple[object, ...]:
    """The event's values in the order of ``_EVENT_COLUMNS``."""
    return (
        event.uid,
        event.transition,
        event.at,
        event.namespace,
        event.name,
        event.local_queue,
        event.cluster_queue,
        event.priority,
        event.reason,
        event.message,
        {k: dict(v) for k, v in event.flavors.items()} if event.flavors else None,
        [dict(t) for t in event.topology] if event.topology else None,
    )


def _chunks(items: Sequence[_T], size: int) -> Iterable[Sequence[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
