"""``phalanx store bench-write``: the writer's bench drives the operator's recorder end to end
(on SQLite and PostgreSQL), and what it leaves is what the store should hold."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from phalanx.bench import store_write
from phalanx.store import db
from phalanx.store.models import Reservation, WorkloadEvent


def test_the_write_bench_stores_every_workloads_history_once(store_url: str) -> None:
    result = store_write.run(store_url, workloads=300)
    engine = db.open_engine(store_url)
    try:
        with engine.connect() as connection:
            events = connection.execute(select(func.count()).select_from(WorkloadEvent)).scalar()
            uids = connection.execute(select(func.count(func.distinct(WorkloadEvent.uid)))).scalar()
            finished = connection.execute(
                select(func.count()).where(WorkloadEvent.transition == "finished")
            ).scalar()
            open_ = connection.execute(
                select(func.count()).where(Reservation.end_us.is_(None))
            ).scalar()
        assert result.events == events > 4 * 300 * 0.9
        assert uids == finished == 300
        assert open_ == 0, "every Workload finished: no reservation left open"
        assert 0 < result.store_cpu_s <= result.process_cpu_s
        with engine.begin() as connection:  # what the writer kept is the pairing of everything
            before = connection.execute(select(Reservation.__table__)).all()
            db.rebuild_reservations(connection)
            assert sorted(connection.execute(select(Reservation.__table__)).all()) == sorted(before)
    finally:
        engine.dispose()


def test_the_write_bench_refuses_a_store_that_holds_events(store_url: str) -> None:
    store_write.run(store_url, workloads=5)
    with pytest.raises(db.StoreError, match="already holds events"):
        store_write.run(store_url, workloads=5)


def test_onto_existing_writes_a_second_run_beside_the_first_under_its_own_uids(
    store_url: str,
) -> None:
    first = store_write.run(store_url, workloads=50)
    second = store_write.run(store_url, workloads=50, onto_existing=True)
    assert second.events == first.events, "the second run's events were all new"
    engine = db.open_engine(store_url)
    try:
        with engine.connect() as connection:
            uids = connection.execute(select(func.count(func.distinct(WorkloadEvent.uid)))).scalar()
            stored = connection.execute(select(func.count()).select_from(WorkloadEvent)).scalar()
            first_ends, second_starts = connection.execute(
                select(
                    func.max(WorkloadEvent.at).filter(WorkloadEvent.uid.like("uid-%")),
                    func.min(WorkloadEvent.at).filter(WorkloadEvent.uid.like("bench-%")),
                )
            ).one()
        assert uids == 100 and stored == first.events + second.events
        # After everything stored, as a live operator's transitions come (catches a second run
        # at the first one's times, inserting into the middle of every time-ordered index).
        assert second_starts > first_ends
    finally:
        engine.dispose()
