"""The usage report reads the reservation intervals the writer keeps (phalanx.store.intervals);
a straightforward Python pairing over the events (the report as it was first, kept here as the
oracle and the specification) must give the same rows on random histories: several Workloads,
evictions, releases, re-admissions, preemptions, deletions, ties in time, events stored out of
order across many writes (so each Workload's intervals are recomputed as its events arrive),
windows cutting reservations."""

from __future__ import annotations

import datetime as dt
import random
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine, case, func, or_, select

from phalanx.store import db, report
from phalanx.store import events as ev
from phalanx.store.models import EventResource, WorkloadEvent

T0 = dt.datetime(2026, 3, 1)
_ENDS = (ev.QUOTA_RELEASED, ev.FINISHED, ev.DELETED)
_CLOSED = (ev.FINISHED, ev.DELETED)


# -- the oracle: the Python pairing the report used before -------------------------------------


@dataclass(frozen=True)
class _Row:
    id: int
    uid: str
    transition: str
    at: dt.datetime
    namespace: str
    local_queue: str | None
    cluster_queue: str | None


def oracle_usage(
    engine: Engine, *, since: dt.datetime, until: dt.datetime, by: str
) -> list[report.UsageRow]:
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
    groups: dict[str, report.UsageRow] = {}

    def rows_for(reservation: _Row, flavors: Iterable[str]) -> list[report.UsageRow]:
        keys = _group_keys(reservation, by=by, flavors=flavors)
        return [groups.setdefault(k, report.UsageRow(group=k)) for k in keys]

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


# -- random histories ---------------------------------------------------------------------------


def _history(rng: random.Random, uid: str) -> list[ev.Event]:
    """One Workload's events: mostly plausible lifecycles (reserve, evict, release, reserve
    again, finish, delete), with noise: ends before any reservation, missing creations,
    several evictions, ties in time (minute resolution) and stray transitions."""
    team = rng.randrange(3)
    base = {
        "uid": uid,
        "namespace": f"team-{team}",
        "name": f"job-{uid}",
        "local_queue": rng.choice([f"lq-{team}", None, ""]),
    }
    at = rng.randrange(0, 200)
    events: list[ev.Event] = []

    def add(transition: str, minute: int, **extra: object) -> None:
        events.append(
            ev.Event(transition=transition, at=T0 + dt.timedelta(minutes=minute), **base, **extra)  # type: ignore[arg-type]
        )

    if rng.random() < 0.9:
        add(ev.CREATED, at)
    if rng.random() < 0.2:
        add(ev.QUOTA_RELEASED, at + rng.randrange(0, 3))  # pending: released before reserved
    for _ in range(rng.randrange(1, 4)):
        at += rng.randrange(0, 30)
        usage = tuple(
            ev.Usage(pod_set="main", resource=r, flavor=rng.choice(["a100", "h100", ""]), amount=n)
            for r, n in (("nvidia.com/gpu", rng.choice([0, 1, 4])), ("cpu", 500))
            if rng.random() < 0.8
        )
        add(ev.QUOTA_RESERVED, at, cluster_queue=rng.choice(["cq-a", "cq-b", None]), usage=usage)
        if rng.random() < 0.5:
            add(ev.ADMITTED, at, cluster_queue="cq-a")
        step = rng.random()
        if step < 0.4:
            at += rng.randrange(0, 40)
            for _ in range(rng.randrange(1, 3)):
                add(ev.EVICTED, at + rng.randrange(0, 3), reason="Preempted")
            if rng.random() < 0.7:
                add(ev.PREEMPTED, at + rng.randrange(0, 3), reason="InClusterQueue")
            if rng.random() < 0.6:
                at += rng.randrange(0, 5)
                add(ev.QUOTA_RELEASED, at)
        elif step < 0.5:
            add(ev.PREEMPTED, at + rng.randrange(0, 20))  # a stray preemption while running
        elif step < 0.6:
            break  # still holding it
    if rng.random() < 0.6:
        at += rng.randrange(0, 60)
        add(ev.FINISHED, at, reason="Succeeded")
    if rng.random() < 0.4:
        add(ev.DELETED, at + rng.randrange(0, 10))
    if rng.random() < 0.1:
        add(ev.QUOTA_RESERVED, at + rng.randrange(0, 10), cluster_queue="cq-b")
    return events


def _same(got: list[report.UsageRow], want: list[report.UsageRow]) -> None:
    assert [r.group for r in got] == [r.group for r in want]
    for g, w in zip(got, want, strict=True):
        assert (g.admissions, g.preemptions, g.waits) == (w.admissions, w.preemptions, w.waits)
        assert set(g.resource_seconds) == set(w.resource_seconds), g.group
        for resource, seconds in w.resource_seconds.items():
            assert g.resource_seconds[resource] == pytest.approx(seconds, rel=1e-12, abs=1e-6)
        if w.waits:
            assert g.wait_percentile(0.95) == w.wait_percentile(0.95)


@pytest.fixture
def engine(store_url: str):  # type: ignore[no-untyped-def]
    engine = db.open_engine(store_url)
    db.upgrade(engine)
    yield engine
    engine.dispose()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_interval_report_equals_the_python_pairing(engine: Engine, seed: int) -> None:
    rng = random.Random(seed)
    events = [e for i in range(60) for e in _history(rng, f"uid-{i:03d}")]
    rng.shuffle(events)  # stored out of order, across writes: ids do not follow time
    for start in range(0, len(events), 37):
        db.write_events(engine, events[start : start + 37])
    windows = [(T0 - dt.timedelta(days=1), T0 + dt.timedelta(days=2))]
    for _ in range(12):
        a, b = sorted(rng.sample(range(-10, 420), 2))
        windows.append((T0 + dt.timedelta(minutes=a), T0 + dt.timedelta(minutes=b)))
    checked = 0
    for since, until in windows:
        for by in report.GROUPINGS:
            want = oracle_usage(engine, since=since, until=until, by=by)
            _same(report.usage(engine, since=since, until=until, by=by), want)
            checked += sum(r.admissions + r.preemptions for r in want)
    assert checked > 100  # the histories exercise the report


def test_ties_between_an_end_and_a_new_reservation_follow_the_stored_order(
    engine: Engine,
) -> None:
    """A release and a new reservation in the same second: which came first is the order they
    were stored in (their ids), as the Python pairing read them."""
    base = {"namespace": "team-a", "name": "job", "local_queue": "lq"}
    gpu = (ev.Usage(pod_set="main", resource="nvidia.com/gpu", flavor="h100", amount=2),)
    at = [T0 + dt.timedelta(minutes=m) for m in range(4)]
    for uid, order in (("released-first", (1, 2)), ("reserved-first", (2, 1))):
        first = [
            ev.Event(uid=uid, transition=ev.CREATED, at=at[0], **base),
            ev.Event(uid=uid, transition=ev.QUOTA_RESERVED, at=at[0], usage=gpu, **base),
            ev.Event(uid=uid, transition=ev.EVICTED, at=at[1], **base),
        ]
        tied = {
            1: ev.Event(uid=uid, transition=ev.QUOTA_RELEASED, at=at[2], **base),
            2: ev.Event(uid=uid, transition=ev.QUOTA_RESERVED, at=at[2], usage=gpu, **base),
        }
        db.write_events(engine, first)
        for key in order:
            db.write_events(engine, [tied[key]])
    until = T0 + dt.timedelta(minutes=10)
    for by in report.GROUPINGS:
        want = oracle_usage(engine, since=T0, until=until, by=by)
        _same(report.usage(engine, since=T0, until=until, by=by), want)
    (row,) = report.usage(engine, since=T0, until=until, by="namespace")
    assert statistics.median(row.waits) >= 0
