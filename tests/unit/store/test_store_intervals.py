"""Reservations stored as intervals (revision 0003), on SQLite and PostgreSQL: the migration
both ways and its backfill, the writer keeping them in the events' transaction (replays,
late and out-of-order events, concurrent writers), and the rules of the pairing."""

from __future__ import annotations

import datetime as dt
import random
import threading
from typing import Any

import pytest
from sqlalchemy import inspect, select
from test_store_report_sql import T0, _history, _same, oracle_usage

from phalanx.store import db, intervals, report
from phalanx.store import events as ev
from phalanx.store.models import Reservation, ReservationPreemption, ReservationResource

_TABLES = {
    "workload_reservations",
    "workload_reservation_resources",
    "workload_reservation_preemptions",
}


def _snapshot(engine: db.Engine) -> dict[str, list[tuple[Any, ...]]]:
    with engine.connect() as connection:
        return {
            model.__tablename__: sorted(
                tuple(row) for row in connection.execute(select(model.__table__))
            )
            for model in (Reservation, ReservationResource, ReservationPreemption)
        }


def _rebuilt(engine: db.Engine) -> dict[str, list[tuple[Any, ...]]]:
    """The intervals computed again from all stored events, in one pass."""
    with engine.begin() as connection:
        db.rebuild_reservations(connection)
    return _snapshot(engine)


def _histories(seed: int, count: int = 40) -> list[ev.Event]:
    rng = random.Random(seed)
    return [e for i in range(count) for e in _history(rng, f"uid-{i:03d}")]


def _at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def _us(minutes: float) -> int:
    return intervals.micros(_at(minutes))


def _d(minutes: float) -> int:
    """A duration in microseconds."""
    return round(minutes * 60_000_000)


_BASE = {"namespace": "team-a", "name": "job", "local_queue": "lq"}
_GPU = (ev.Usage(pod_set="main", resource="nvidia.com/gpu", flavor="h100", amount=2),)


def _event(uid: str, transition: str, minutes: float, **extra: Any) -> ev.Event:
    return ev.Event(uid=uid, transition=transition, at=_at(minutes), **_BASE, **extra)


@pytest.fixture
def engine(store_url: str):  # type: ignore[no-untyped-def]
    engine = db.open_engine(store_url)
    db.upgrade(engine)
    yield engine
    engine.dispose()


# -- the migration ------------------------------------------------------------------------------


def test_upgrade_from_empty_creates_the_interval_tables_and_downgrade_drops_them(
    store_url: str,
) -> None:
    engine = db.open_engine(store_url)
    db.upgrade(engine)
    assert db.current_revision(engine) == db.head_revision()
    names = set(inspect(engine).get_table_names())
    assert names >= _TABLES
    indexes = {i["name"] for i in inspect(engine).get_indexes("workload_reservations")}
    assert {"ix_workload_reservations_window", "ix_workload_reservations_start"} <= indexes
    db.write_events(engine, _histories(1, count=5))
    db.downgrade(engine, "0002")
    assert not _TABLES & set(inspect(engine).get_table_names())
    assert db.write_events(engine, _histories(2, count=3)) > 0, "an old store takes events"
    db.upgrade(engine)
    db.downgrade(engine, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    engine.dispose()


@pytest.mark.parametrize("seed", [4, 5])
def test_upgrade_from_0002_backfills_what_the_writer_would_have_written(
    store_url: str, seed: int
) -> None:
    engine = db.open_engine(store_url)
    db.upgrade(engine, "0002")
    events = _histories(seed)
    random.Random(seed).shuffle(events)
    for start in range(0, len(events), 29):
        db.write_events(engine, events[start : start + 29])
    db.upgrade(engine)
    backfilled = _snapshot(engine)
    assert len(backfilled["workload_reservations"]) > 40
    assert backfilled["workload_reservation_preemptions"], "the histories preempt"
    assert _rebuilt(engine) == backfilled
    windows = [(T0 - dt.timedelta(days=1), T0 + dt.timedelta(days=1)), (_at(60), _at(180))]
    for since, until in windows:
        for by in report.GROUPINGS:
            want = oracle_usage(engine, since=since, until=until, by=by)
            _same(report.usage(engine, since=since, until=until, by=by), want)
    # Written on, the upgraded store keeps its intervals as a fresh one does.
    db.write_events(engine, [_event("uid-000", ev.DELETED, 500)])
    assert _rebuilt(engine) == _snapshot(engine)
    db.downgrade(engine, "0002")
    db.upgrade(engine)
    assert _snapshot(engine) == _rebuilt(engine)
    engine.dispose()


# -- the writer ---------------------------------------------------------------------------------


def test_replays_leave_the_same_rows(engine: db.Engine) -> None:
    events = _histories(6)
    db.write_events(engine, events)
    first = _snapshot(engine)
    assert db.write_events(engine, events) == 0
    rng = random.Random(6)
    for _ in range(5):
        assert db.write_events(engine, rng.sample(events, 50)) == 0
    assert _snapshot(engine) == first == _rebuilt(engine)


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_events_out_of_order_across_writes_leave_what_one_pass_gives(
    engine: db.Engine, seed: int
) -> None:
    """Shuffled, in batches of varying size, some repeated: after every write the intervals
    are those a pass over everything stored so far gives."""
    rng = random.Random(seed)
    events = _histories(seed)
    rng.shuffle(events)
    start = 0
    while start < len(events):
        size = rng.randrange(1, 60)
        batch = events[start : start + size] + rng.sample(events[: start + 1], min(3, start + 1))
        db.write_events(engine, batch)
        start += size
        if rng.random() < 0.2:
            assert _snapshot(engine) == _rebuilt(engine)
    assert _snapshot(engine) == _rebuilt(engine)


def _reservations(engine: db.Engine, uid: str) -> list[tuple[Any, ...]]:
    with engine.connect() as connection:
        return [
            tuple(row)
            for row in connection.execute(
                select(
                    Reservation.start_us,
                    Reservation.end_us,
                    Reservation.closed_us,
                    Reservation.wait_us,
                    Reservation.preempted,
                    Reservation.stray_until_us,
                )
                .where(Reservation.uid == uid)
                .order_by(Reservation.start_us)
            )
        ]


def test_a_resync_writing_old_events_late_closes_and_splits_reservations(
    engine: db.Engine,
) -> None:
    """The live feed saw the Workload created and reserved at 10; an outage hid its eviction
    at 30, release at 31, second reservation at 40 and deletion at 90: the resync writes
    them late, the deletion first."""
    uid = "w"
    db.write_events(
        engine, [_event(uid, ev.CREATED, 0), _event(uid, ev.QUOTA_RESERVED, 10, usage=_GPU)]
    )
    assert _reservations(engine, uid) == [(_us(10), None, intervals.OPEN, _d(10), False, None)]
    db.write_events(engine, [_event(uid, ev.DELETED, 90)])
    assert _reservations(engine, uid) == [(_us(10), _us(90), _us(90), _d(10), False, None)]
    db.write_events(
        engine,
        [
            _event(uid, ev.QUOTA_RESERVED, 40, usage=_GPU),
            _event(uid, ev.PREEMPTED, 30),
            _event(uid, ev.EVICTED, 30),
        ],
    )
    # Without the release, the second reservation ends the first at the eviction before it.
    assert _reservations(engine, uid) == [
        (_us(10), _us(30), _us(40), _d(10), True, None),
        (_us(40), _us(90), _us(90), _d(10), False, None),
    ]
    db.write_events(engine, [_event(uid, ev.QUOTA_RELEASED, 31)])
    assert _reservations(engine, uid) == [
        (_us(10), _us(31), _us(31), _d(10), True, None),
        (_us(40), _us(90), _us(90), _d(9), False, None),
    ]
    assert _snapshot(engine) == _rebuilt(engine)
    # A window ending between the eviction and the next reservation does not see it yet.
    (row,) = report.usage(engine, since=_at(0), until=_at(35), by="namespace")
    assert row.resource_seconds["nvidia.com/gpu"] == pytest.approx(2 * 21 * 60)


def test_a_later_reservation_without_an_eviction_ends_the_previous_at_itself(
    engine: db.Engine,
) -> None:
    uid = "v"
    db.write_events(engine, [_event(uid, ev.QUOTA_RESERVED, 20, usage=_GPU)])
    db.write_events(engine, [_event(uid, ev.QUOTA_RESERVED, 50, usage=_GPU)])
    db.write_events(engine, [_event(uid, ev.CREATED, 5)])  # late: the wait is from it
    assert _reservations(engine, uid) == [
        (_us(20), _us(50), _us(50), _d(15), False, None),
        (_us(50), None, intervals.OPEN, 0, False, None),
    ]


def test_a_reservation_after_the_workload_finished_counts_until_its_last_event(
    engine: db.Engine,
) -> None:
    uid = "s"
    db.write_events(
        engine,
        [
            _event(uid, ev.QUOTA_RESERVED, 0, usage=_GPU),
            _event(uid, ev.FINISHED, 10),
            _event(uid, ev.QUOTA_RESERVED, 20, usage=_GPU),
        ],
    )
    assert _reservations(engine, uid)[-1] == (_us(20), None, intervals.OPEN, _d(10), False, _us(20))
    for since, until in ((_at(15), _at(60)), (_at(25), _at(60))):
        for by in report.GROUPINGS:
            want = oracle_usage(engine, since=since, until=until, by=by)
            _same(report.usage(engine, since=since, until=until, by=by), want)
    assert report.usage(engine, since=_at(25), until=_at(60), by="namespace") == []


def test_any_event_alone_in_a_batch_moves_the_bounds_it_sets(engine: db.Engine) -> None:
    """The writer re-pairs a Workload only when it got a reservation or already had one, and
    rewrites only the reservations whose pairing changed: an admission alone in its batch is
    still the Workload's last event (how far a stray reservation reaches), a late creation
    still starts the first wait."""
    uid = "s"
    db.write_events(
        engine,
        [
            _event(uid, ev.QUOTA_RESERVED, 0, usage=_GPU),
            _event(uid, ev.FINISHED, 10),
            _event(uid, ev.QUOTA_RESERVED, 20, usage=_GPU),
        ],
    )
    db.write_events(engine, [_event(uid, ev.ADMITTED, 30)])
    assert _reservations(engine, uid)[-1] == (_us(20), None, intervals.OPEN, _d(10), False, _us(30))
    db.write_events(engine, [_event(uid, ev.CREATED, -5)])
    assert _reservations(engine, uid)[0] == (_us(0), _us(10), _us(10), _d(5), False, None)
    pending = "p"  # no reservation: nothing to pair
    db.write_events(engine, [_event(pending, ev.CREATED, 0), _event(pending, ev.QUOTA_RELEASED, 1)])
    assert _reservations(engine, pending) == []
    assert _snapshot(engine) == _rebuilt(engine)


def test_concurrent_writers_of_one_workload_leave_the_intervals_of_both(
    postgres_url: str,
) -> None:
    # PostgreSQL only (SQLite admits one writer at a time): two leaders' writers, or a resync
    # racing the live feed, writing halves of one Workload's history at once.
    engine = db.open_engine(postgres_url)
    db.upgrade(engine)
    try:
        _concurrent_rounds(engine)
    finally:
        engine.dispose()


def _concurrent_rounds(engine: db.Engine) -> None:
    for round_ in range(10):
        uid = f"c{round_}"
        halves = (
            [_event(uid, ev.CREATED, 0), _event(uid, ev.QUOTA_RESERVED, 10, usage=_GPU)],
            [_event(uid, ev.FINISHED, 70), _event(uid, ev.DELETED, 71)],
        )
        barrier = threading.Barrier(2)

        def write(batch: list[ev.Event], barrier: threading.Barrier) -> None:
            barrier.wait()
            db.write_events(engine, batch)

        threads = [threading.Thread(target=write, args=(half, barrier)) for half in halves]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert _reservations(engine, uid) == [(_us(10), _us(70), _us(70), _d(10), False, None)]


# -- the per-bucket query of the plot -----------------------------------------------------------


@pytest.mark.parametrize("seed", [10, 11])
def test_per_bucket_usage_is_the_report_over_each_bucket(engine: db.Engine, seed: int) -> None:
    rng = random.Random(seed)
    events = _histories(seed, count=60)
    rng.shuffle(events)
    for start in range(0, len(events), 41):
        db.write_events(engine, events[start : start + 41])
    checked = 0
    for _ in range(6):
        a, b = sorted(rng.sample(range(-10, 420), 2))
        since, until = _at(a), _at(b)
        width = dt.timedelta(minutes=rng.choice([1, 7, 30, 45.5, 500]))
        for by in report.GROUPINGS:
            got = report.resource_seconds_per_bucket(
                engine, since=since, until=until, width=width, by=by
            )
            begin, index = since, 0
            while begin < until:
                want = report.usage(engine, since=begin, until=min(begin + width, until), by=by)
                for row in want:
                    if not row.resource_seconds:
                        continue
                    held = got[row.group][index]
                    assert set(held) >= set(row.resource_seconds), (row.group, index)
                    for resource, seconds in row.resource_seconds.items():
                        assert held[resource] == pytest.approx(seconds, rel=1e-9, abs=1e-3)
                        checked += 1
                listed = {row.group for row in want if row.resource_seconds}
                for group, buckets in got.items():
                    if group not in listed:
                        assert not any(buckets[index].values()), (group, index)
                begin += width
                index += 1
            assert all(len(buckets) == index for buckets in got.values())
    assert checked > 100


# -- going on from the stored intervals (the live writer's case) -------------------------------


def _as_stored(events: list[ev.Event]) -> list[intervals.StoredEvent]:
    """``events`` in time order, ids in that order (as one write of them in order gives)."""
    ordered = sorted(events, key=lambda e: e.at)
    return [
        db._stored_event(i, intervals.micros(e.at), e)  # as the writer hands them on
        for i, e in enumerate(ordered, start=1)
    ]


def _summary(prefix: list[intervals.StoredEvent]) -> intervals.Stored | None:
    if not prefix:
        return None
    of = {e.transition: [x.at_us for x in prefix if x.transition == e.transition] for e in prefix}
    ends = of.get(ev.FINISHED, []) + of.get(ev.DELETED, [])
    return intervals.Stored(
        last_us=max(e.at_us for e in prefix),
        first_us=min(e.at_us for e in prefix),
        created_us=min(of[ev.CREATED]) if ev.CREATED in of else None,
        evicted_us=max(of[ev.EVICTED]) if ev.EVICTED in of else None,
        closed=bool(ends),
        reservations=intervals.pair(prefix),
    )


def test_going_on_from_the_stored_intervals_gives_what_pairing_everything_gives() -> None:
    """Every split of many random histories into what is stored and what comes after: the
    stored intervals, with what :func:`intervals.extend` writes over them, are the pairing of
    the whole history (a wrong wait, end, eviction, preemption or stray bound shows here), and
    it declines only the splits it must."""
    rng = random.Random(11)
    splits = declined = 0
    for n in range(400):
        history = _as_stored(_history(rng, f"uid-{n}"))
        whole = {one.id: one for one in intervals.pair(history)}
        for k in range(len(history)):
            prefix, suffix = history[:k], history[k:]
            stored = _summary(prefix)
            result = intervals.extend(stored, suffix)
            splits += 1
            if result is None:
                declined += 1
                continue
            written, replaced = result
            kept = {one.id: one for one in intervals.pair(prefix) if one.id not in replaced}
            assert not set(kept) & {one.id for one in written}
            assert kept | {one.id: one for one in written} == whole, (n, k)
    assert splits > 1500
    assert declined < splits * 0.15, (declined, splits)


def test_written_in_time_order_the_writer_pairs_from_the_intervals_not_the_events(
    engine: db.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live writer's case: events arrive in time order, in batches. After every write the
    intervals are those a pass over everything gives, and the events of a Workload are read
    back only for the few splits the intervals cannot go on from."""
    read: list[str] = []
    original = intervals.read_histories

    def counting(connection: Any, uids: Any = None, **kwargs: Any) -> Any:
        if uids is not None:
            read.extend(uids)
        return original(connection, uids, **kwargs)

    monkeypatch.setattr(intervals, "read_histories", counting)
    rng = random.Random(12)
    events = sorted(_histories(12, count=60), key=lambda e: e.at)
    start = 0
    writes = 0
    while start < len(events):
        size = rng.randrange(1, 25)
        db.write_events(engine, events[start : start + size])
        start += size
        writes += 1
        if rng.random() < 0.3:
            assert _snapshot(engine) == _rebuilt(engine)
    assert _snapshot(engine) == _rebuilt(engine)
    reserved = {e.uid for e in events if e.transition == ev.QUOTA_RESERVED}
    assert len(read) < len(reserved) / 4, (len(read), len(reserved), writes)
