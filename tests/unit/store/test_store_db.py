"""The store on SQLite and PostgreSQL: migrations both ways, idempotent writes, the reports."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from sqlalchemy import func, insert, inspect, select
from sqlalchemy.orm import Session
from store_builders import condition, workload

from phalanx.store import db, intervals, report
from phalanx.store import events as ev
from phalanx.store.models import EventResource, WorkloadEvent

T0 = dt.datetime(2026, 1, 1)


def _at(minutes: float) -> str:
    return (T0 + dt.timedelta(minutes=minutes)).isoformat() + "Z"


def _count(engine: db.Engine) -> int:
    with Session(engine) as session:
        return int(session.scalar(select(func.count()).select_from(WorkloadEvent)) or 0)


@pytest.fixture
def engine(store_url: str):  # type: ignore[no-untyped-def]
    engine = db.open_engine(store_url)
    db.upgrade(engine)
    yield engine
    engine.dispose()


# -- migrations --------------------------------------------------------------------------------


def test_upgrade_from_empty_and_downgrade_to_empty(store_url: str) -> None:
    engine = db.open_engine(store_url)
    assert db.current_revision(engine) is None
    db.upgrade(engine)
    assert db.current_revision(engine) == db.head_revision()
    tables = set(inspect(engine).get_table_names())
    assert {"workload_events", "workload_event_resources"} <= tables
    db.downgrade(engine, "base")
    assert db.current_revision(engine) is None
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    engine.dispose()


def test_upgrade_from_the_previous_revision_keeps_rows(store_url: str) -> None:
    engine = db.open_engine(store_url)
    db.upgrade(engine, "0001")
    db.write_events(engine, ev.events_of(workload()))
    db.upgrade(engine, "0002")
    assert db.current_revision(engine) == "0002"
    indexes = {i["name"] for i in inspect(engine).get_indexes("workload_events")}
    assert "ix_workload_events_at" in indexes
    db.downgrade(engine, "0001")
    assert "ix_workload_events_at" not in {
        i["name"] for i in inspect(engine).get_indexes("workload_events")
    }
    assert _count(engine) == 1
    engine.dispose()


def test_revision_0005_drops_the_second_uid_index_and_keeps_rows(store_url: str) -> None:
    """Up: the unique key is the one index on uid, and reads by uid still find the events;
    down: the index is back. Catches a writer still maintaining two indexes on uid."""
    engine = db.open_engine(store_url)
    db.upgrade(engine, "0004")
    db.write_events(engine, ev.events_of(workload()))

    def indexes() -> set[str]:
        return {i["name"] for i in inspect(engine).get_indexes("workload_events") if i["name"]}

    assert "ix_workload_events_uid" in indexes()
    db.upgrade(engine, "0005")
    assert "ix_workload_events_uid" not in indexes()
    with engine.connect() as connection:
        histories = list(intervals.read_histories(connection, ["uid-1"]))
    assert [[e.transition for e in h] for h in histories] == [["created"]]
    db.write_events(engine, ev.events_of(workload(uid="uid-2", name="job-2")))
    db.downgrade(engine, "0004")
    assert "ix_workload_events_uid" in indexes()
    assert _count(engine) == 2
    engine.dispose()


def test_a_sqlite_connection_caches_32_mib_and_checkpoints_every_10000_pages(
    tmp_path: Path,
) -> None:
    """Catches SQLite's defaults (2 MiB of cache, a checkpoint every 1,000 pages), with which
    the writer read most index pages from the file again in every batch of a large store."""
    engine = db.open_engine(f"sqlite:///{tmp_path}/store.db")
    with engine.connect() as first, engine.connect() as second:  # every connection
        for connection in (first, second):
            assert connection.exec_driver_sql("PRAGMA cache_size").scalar() == -32768
            assert connection.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 10000
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()


def test_a_url_of_another_backend_says_what_to_use() -> None:
    with pytest.raises(db.StoreError, match="sqlite:///PATH or postgresql"):
        db.open_engine("mysql://x@y/z")


# -- idempotent writes -------------------------------------------------------------------------


def _running(uid: str = "uid-1", **kwargs: object) -> dict[str, object]:
    return workload(
        uid=uid,
        cluster_queue="cq",
        conditions=[condition("QuotaReserved", _at(1)), condition("Admitted", _at(1))],
        **kwargs,  # type: ignore[arg-type]
    )


def test_the_same_transition_is_stored_once(engine: db.Engine) -> None:
    events = ev.events_of(_running())
    assert db.write_events(engine, events) == 3
    assert db.write_events(engine, events + events) == 0
    assert db.write_events(engine, ev.events_of(_running())) == 0
    assert _count(engine) == 3
    with Session(engine) as session:
        held = session.scalars(select(EventResource)).all()
        assert sorted((r.resource, r.flavor, r.amount) for r in held) == [
            ("cpu", "default", 2000),
            ("nvidia.com/gpu", "h100", 4),
        ]


def test_a_second_writer_racing_on_the_same_keys_keeps_one_row(engine: db.Engine) -> None:
    events = ev.events_of(_running())
    db.write_events(engine, events[:1])
    # Another writer stored one of the keys through SQLAlchemy's own insert: the writer's
    # driver-level insert must see it as the same key (the same stored form of its time, on
    # every backend), skip it and count only the third as new.
    other = events[1]
    with Session(engine) as session, session.begin():
        session.execute(
            insert(WorkloadEvent),
            [
                {
                    "uid": other.uid,
                    "transition": other.transition,
                    "at": other.at,
                    "namespace": other.namespace,
                    "name": other.name,
                    "cluster_queue": other.cluster_queue,
                }
            ],
        )
    assert db.write_events(engine, events) == 1
    assert _count(engine) == 3


# -- reports -----------------------------------------------------------------------------------


def _history(engine: db.Engine) -> None:
    """team-a: uid-1 holds 4 GPUs for 60 min, finished; uid-2 is preempted after 30 min,
    released at 31, reserved again at 40 and still runs. team-b: uid-3 holds 2 GPUs of a100
    from 10 to 70 and is then deleted."""
    finished = workload(
        uid="uid-1",
        cluster_queue="cq-a",
        conditions=[
            condition("QuotaReserved", _at(1)),
            condition("Finished", _at(61), reason="Succeeded"),
        ],
    )
    preempted = workload(
        uid="uid-2",
        name="job-2",
        created=_at(0),
        conditions=[
            condition("QuotaReserved", _at(31), status="False", reason="Preempted"),
            condition("Evicted", _at(30), reason="Preempted", message="by team-b/job-3"),
            condition("Preempted", _at(30), reason="InCohortReclamation"),
        ],
    )
    first = workload(
        uid="uid-2",
        name="job-2",
        cluster_queue="cq-a",
        conditions=[condition("QuotaReserved", _at(0))],
    )
    again = workload(
        uid="uid-2",
        name="job-2",
        cluster_queue="cq-a",
        conditions=[condition("QuotaReserved", _at(40))],
    )
    other = workload(
        uid="uid-3",
        namespace="team-b",
        name="job-3",
        queue="lq-b",
        created=_at(5),
        cluster_queue="cq-b",
        gpus=2,
        flavor="a100",
        conditions=[condition("QuotaReserved", _at(10))],
    )
    deleted = ev.deleted_event(other, at=T0 + dt.timedelta(minutes=70))
    assert deleted is not None
    for obj in (finished, first, preempted, again, other):
        db.write_events(engine, ev.events_of(obj))
    db.write_events(engine, [deleted])


def test_usage_by_namespace_counts_each_reservation_once(engine: db.Engine) -> None:
    _history(engine)
    _history(engine)  # a restart deriving it all again
    rows = report.usage(engine, since=T0, until=T0 + dt.timedelta(minutes=100), by="namespace")
    by_group = {r.group: r for r in rows}
    a, b = by_group["team-a"], by_group["team-b"]
    # uid-1: 4 GPUs x 60 min; uid-2: 4 x 31 (held until released) + 4 x 60 (40..100).
    assert a.resource_hours()["nvidia.com/gpu"] == pytest.approx(4 * (60 + 31 + 60) / 60)
    assert b.resource_hours()["nvidia.com/gpu"] == pytest.approx(2 * 60 / 60)
    assert (a.admissions, a.preemptions, b.admissions, b.preemptions) == (3, 1, 1, 0)
    # waits: uid-1 1 min, uid-2 0 min then 9 min after its release (31 -> 40).
    assert sorted(a.waits) == [0.0, 60.0, 540.0]
    assert b.waits == [300.0]
    assert a.wait_percentile(0.5) == 60.0


def test_usage_is_clipped_to_the_window(engine: db.Engine) -> None:
    _history(engine)
    rows = report.usage(
        engine,
        since=T0 + dt.timedelta(minutes=50),
        until=T0 + dt.timedelta(minutes=60),
        by="clusterqueue",
    )
    by_group = {r.group: r for r in rows}
    # 50..60: uid-1 and uid-2 hold 4 GPUs each in cq-a; uid-3 holds 2 in cq-b.
    assert by_group["cq-a"].resource_hours()["nvidia.com/gpu"] == pytest.approx(8 * 10 / 60)
    assert by_group["cq-b"].resource_hours()["nvidia.com/gpu"] == pytest.approx(2 * 10 / 60)
    assert by_group["cq-a"].admissions == 0


def test_usage_by_flavor_and_localqueue(engine: db.Engine) -> None:
    _history(engine)
    until = T0 + dt.timedelta(minutes=100)
    flavors = {r.group: r for r in report.usage(engine, since=T0, until=until, by="flavor")}
    assert set(flavors) == {"a100", "default", "h100"}
    assert flavors["h100"].resource_hours() == {"nvidia.com/gpu": pytest.approx(4 * 151 / 60)}
    assert flavors["default"].resource_hours()["cpu"] == pytest.approx(2 * 151 / 60 + 1 * 60 / 60)
    queues = {r.group for r in report.usage(engine, since=T0, until=until, by="localqueue")}
    assert queues == {"team-a/lq-a", "team-b/lq-b"}
    with pytest.raises(ValueError, match="--by"):
        report.usage(engine, since=T0, until=until, by="team")


def test_the_timeline_lists_every_transition_in_order(engine: db.Engine) -> None:
    _history(engine)
    entries = report.timeline(engine, namespace="team-a", name="job-2")
    assert [e.transition for e in entries] == [
        "created",
        "quota_reserved",
        "evicted",
        "preempted",
        "quota_released",
        "quota_reserved",
    ]
    assert entries[2].message == "by team-b/job-3"
    assert ("main", "nvidia.com/gpu", "h100", 4) in entries[1].resources


def test_the_report_refuses_a_missing_sqlite_file_without_creating_it(tmp_path: Path) -> None:
    from phalanx.cli.main import main

    path = tmp_path / "nothing.db"
    assert main(["report", "usage", "--store", f"sqlite:///{path}"]) == 2
    assert not path.exists()


def test_the_report_commands_print_table_csv_and_json(
    store_url: str, engine: db.Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    from phalanx.cli.main import main

    recent = workload(
        uid="now",
        cluster_queue="cq-a",
        created=(dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)).isoformat(),
        conditions=[
            condition(
                "QuotaReserved", (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
            )
        ],
    )
    db.write_events(engine, ev.events_of(recent))
    assert main(["report", "usage", "--by", "clusterqueue", "--store", store_url]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == [
        "clusterqueue",
        "admissions",
        "preemptions",
        "wait_p50_s",
        "wait_p95_s",
        "cpu_hours_cores",
        "nvidia.com/gpu_hours",
    ]
    assert table[1].split()[:5] == ["cq-a", "1", "0", "3600.0", "3600.0"]
    assert main(["report", "usage", "--format", "json", "--store", store_url]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["nvidia.com/gpu_hours"] == pytest.approx(4.0, rel=0.01)
    assert main(["report", "usage", "--format", "csv", "--by", "flavor", "--store", store_url]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("flavor,admissions,")
    assert main(["report", "workload", "team-a/job-1", "--store", store_url]) == 0
    out = capsys.readouterr().out
    assert "quota_reserved" in out and "main:nvidia.com/gpu=4@h100" in out


def test_the_bench_generator_fills_rows_the_report_reads(engine: db.Engine) -> None:
    from phalanx.bench import store_rows

    written, _seconds = store_rows.fill(engine, rows=2_000, chunk=500)
    assert 2_000 <= written < 2_010
    assert _count(engine) == written
    took = store_rows.measure(engine)
    assert set(took) == set(report.GROUPINGS)
    until = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    rows = report.usage(engine, since=until - dt.timedelta(days=40), until=until, by="namespace")
    assert sum(r.admissions for r in rows) > 400


def test_the_reports_say_when_the_store_is_off(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from phalanx.cli.main import main

    monkeypatch.setenv("PHALANX_STORE", "off")
    assert main(["report", "usage"]) == 2
    assert "the usage history store is off ($PHALANX_STORE=off)" in capsys.readouterr().err
    assert main(["store", "current"]) == 2
    assert "give --store URL" in capsys.readouterr().err
