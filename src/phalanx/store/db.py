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
from sqlalchemy import (
    Connection,
    Engine,
    Table,
    create_engine,
    delete,
    event,
    insert,
    inspect,
    select,
    text,
    tuple_,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

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
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
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
    are computed again from all of its stored events (:mod:`phalanx.store.intervals`): a
    replay changes nothing, and events arriving late or out of order leave the same intervals
    as one write of everything.

    Existing keys are read first; a concurrent writer (an old leader still flushing) that
    inserts the same key in between makes the batch fail on the unique key, and it is then
    written one event at a time, each skipping what is there.
    """
    unique = list({e.key: e for e in events}.values())
    if not unique:
        return 0
    try:
        with Session(engine) as session, session.begin():
            return _insert_missing(session, unique)
    except IntegrityError:
        written = 0
        for one in unique:
            try:
                with Session(engine) as session, session.begin():
                    written += _insert_missing(session, [one])
            except IntegrityError:
                continue  # stored by the other writer meanwhile: that is the row we want
        return written


_EVENTS = cast(Table, WorkloadEvent.__table__)
_EVENT_RESOURCES = cast(Table, EventResource.__table__)


def _insert_missing(session: Session, events: Sequence[Event]) -> int:
    present: set[tuple[str, str, object]] = set()
    for chunk in _chunks(events, 300):
        keys = [(e.uid, e.transition, e.at) for e in chunk]
        rows = session.execute(
            select(WorkloadEvent.uid, WorkloadEvent.transition, WorkloadEvent.at).where(
                tuple_(WorkloadEvent.uid, WorkloadEvent.transition, WorkloadEvent.at).in_(keys)
            )
        )
        present.update((uid, transition, at) for uid, transition, at in rows)
    new = [e for e in events if e.key not in present]
    if not new:
        return 0
    # Bulk inserts (the ORM's unit of work cost most of the writer's CPU): the events in
    # order, in one statement per batch of rows, so their ids grow in that order (ids decide
    # ties in time: the intervals need them), then what each reservation holds.
    # (RETURNING in parameter order makes SQLite insert one row per statement: the ids are
    # read back by key instead, one query per 300.)
    connection = session.connection()  # Core executemany: the ORM's bulk path went row by row
    connection.execute(insert(_EVENTS), [_values(e) for e in new])
    ids: dict[tuple[str, str, object], int] = {}
    for chunk in _chunks([e for e in new if e.usage], 300):
        keys = [(e.uid, e.transition, e.at) for e in chunk]
        stored = session.execute(
            select(
                WorkloadEvent.id, WorkloadEvent.uid, WorkloadEvent.transition, WorkloadEvent.at
            ).where(tuple_(WorkloadEvent.uid, WorkloadEvent.transition, WorkloadEvent.at).in_(keys))
        )
        ids.update(((uid, transition, at), event_id) for event_id, uid, transition, at in stored)
    held = [
        {
            "event_id": ids[event.key],
            "pod_set": u.pod_set,
            "resource": u.resource,
            "flavor": u.flavor,
            "amount": u.amount,
        }
        for event in new
        for u in event.usage
    ]
    if held:
        connection.execute(insert(_EVENT_RESOURCES), held)
    if _has_intervals(session):
        rebuild_reservations(session.connection(), {e.uid for e in new})
    return len(new)


_WITH_INTERVALS: weakref.WeakSet[Engine] = weakref.WeakSet()


def _has_intervals(session: Session) -> bool:
    """Whether the store is at revision 0003 or later (a store at an older revision takes
    events without intervals; upgrading fills them from the events)."""
    engine = session.get_bind()
    assert isinstance(engine, Engine)
    if engine in _WITH_INTERVALS:
        return True
    if inspect(session.connection()).has_table(Reservation.__tablename__):
        _WITH_INTERVALS.add(engine)
        return True
    return False


_RESERVATION_LOCK = 0x70686C78  # "phlx": one writer at a time rebuilds intervals (PostgreSQL)


def rebuild_reservations(connection: Connection, uids: Collection[str] | None = None) -> int:
    """Replace the reservation intervals of ``uids`` (else of every Workload) with those their
    stored events give, in the caller's transaction; return how many there are now.

    On PostgreSQL a transaction-scoped advisory lock is taken first: two writers adding
    events of one Workload concurrently each read the other's only once it has committed,
    and the one that rebuilds last sees both (SQLite lets one writer in at a time anyway)."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _RESERVATION_LOCK})
    found: list[intervals.Interval] = []
    for history in intervals.read_histories(connection, uids):
        found.extend(intervals.pair(history))
    targets = None if uids is None else sorted(uids)
    for chunk in [None] if targets is None else _chunks(targets, 500):
        owned = select(Reservation.id)
        if chunk is not None:
            owned = owned.where(Reservation.uid.in_(chunk))
        connection.execute(
            delete(ReservationResource).where(ReservationResource.reservation_id.in_(owned))
        )
        connection.execute(
            delete(ReservationPreemption).where(ReservationPreemption.reservation_id.in_(owned))
        )
        removed = delete(Reservation)
        if chunk is not None:
            removed = removed.where(Reservation.uid.in_(chunk))
        connection.execute(removed)
    rows, held, preempted = intervals.table_rows(found)
    for table, values in (
        (Reservation, rows),
        (ReservationResource, held),
        (ReservationPreemption, preempted),
    ):
        for start in range(0, len(values), 5_000):
            connection.execute(insert(table), values[start : start + 5_000])
    return len(rows)


def _values(event: Event) -> dict[str, object]:
    return {
        "uid": event.uid,
        "transition": event.transition,
        "at": event.at,
        "namespace": event.namespace,
        "name": event.name,
        "local_queue": event.local_queue,
        "cluster_queue": event.cluster_queue,
        "priority": event.priority,
        "reason": event.reason,
        "message": event.message,
        "flavors": {k: dict(v) for k, v in event.flavors.items()} if event.flavors else None,
        "topology": [dict(t) for t in event.topology] if event.topology else None,
    }


def _chunks(items: Sequence[_T], size: int) -> Iterable[Sequence[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
