"""A budget's usage in its window, read back from the reservation intervals: each
reservation's held amount times its overlap with ``[since, at)``, for one LocalQueue or one
ClusterQueue and one resource (SQLite and PostgreSQL)."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import Engine

from phalanx.store import db
from phalanx.store import events as ev
from phalanx.store.budget_usage import used_resource_hours
from phalanx.store.intervals import micros

T0 = dt.datetime(2026, 11, 30)
GPU = "nvidia.com/gpu"


@pytest.fixture
def engine(store_url: str):  # type: ignore[no-untyped-def]
    engine = db.open_engine(store_url)
    db.upgrade(engine)
    yield engine
    engine.dispose()


def _events(uid: str, lq: str, cq: str, gpus: int, *steps: tuple[str, float]) -> list[ev.Event]:
    """One Workload: (transition, hours after T0) steps; reservations hold ``gpus`` GPUs in
    two flavors (summed) and 500m CPU."""
    out = []
    for transition, hours in steps:
        usage: tuple[ev.Usage, ...] = ()
        if transition == ev.QUOTA_RESERVED:
            usage = (
                ev.Usage(pod_set="main", resource=GPU, flavor="h100", amount=gpus - 1),
                ev.Usage(pod_set="side", resource=GPU, flavor="a100", amount=1),
                ev.Usage(pod_set="main", resource="cpu", flavor="default", amount=500),
            )
        out.append(
            ev.Event(
                uid=uid,
                transition=transition,
                at=T0 + dt.timedelta(hours=hours),
                namespace="team-a",
                name=uid,
                local_queue=lq,
                cluster_queue=cq if transition == ev.QUOTA_RESERVED else None,
                usage=usage,
            )
        )
    return out


def _hours(engine: Engine, since: float, at: float, **scope: str) -> dict[str, float]:
    return {
        resource: used_resource_hours(
            engine,
            resource=resource,
            since_us=micros(T0 + dt.timedelta(hours=since)),
            at_us=micros(T0 + dt.timedelta(hours=at)),
            **scope,
        )
        for resource in (GPU, "cpu")
    }


def test_usage_is_the_overlap_of_each_reservation_with_the_window(engine: Engine) -> None:
    events = [
        # Before the window and into it: 2 GPUs over [-2h, 3h) -> 3h inside from 0.
        *_events(
            "w1", "main", "cq", 2, (ev.CREATED, -3), (ev.QUOTA_RESERVED, -2), (ev.FINISHED, 3)
        ),
        # Evicted and reserved again: [1h, 2h) ends at the eviction, then [4h, open).
        *_events(
            "w2",
            "main",
            "cq",
            4,
            (ev.QUOTA_RESERVED, 1),
            (ev.EVICTED, 2),
            (ev.QUOTA_RESERVED, 4),
        ),
        # Entirely before the window: not counted.
        *_events("w3", "main", "cq", 8, (ev.QUOTA_RESERVED, -5), (ev.QUOTA_RELEASED, -1)),
        # Another LocalQueue of the same ClusterQueue.
        *_events("w4", "other", "cq", 1, (ev.QUOTA_RESERVED, 0), (ev.FINISHED, 5)),
        # Another ClusterQueue.
        *_events("w5", "elsewhere", "cq2", 3, (ev.QUOTA_RESERVED, 0), (ev.DELETED, 1)),
    ]
    db.write_events(engine, events)
    # At 6h: w1 2 x 3 + w2 4 x 1 + w2 4 x 2 (open, up to now) = 18.
    local = _hours(engine, 0, 6, local_queue="team-a/main")
    assert local[GPU] == pytest.approx(18.0)
    assert local["cpu"] == pytest.approx(0.5 * (3 + 1 + 2))
    cluster = _hours(engine, 0, 6, cluster_queue="cq")
    assert cluster[GPU] == pytest.approx(18.0 + 5.0)
    assert _hours(engine, 0, 6, cluster_queue="cq2")[GPU] == pytest.approx(3.0)
    # Earlier, at 2.5h: w1 2 x 2.5; w2's first reservation was ended at its eviction (2h) only
    # by the reservation at 4h, which a store read at 2.5h would not have had: up to 2.5h,
    # as the usage report counts it.
    assert _hours(engine, 0, 2.5, local_queue="team-a/main")[GPU] == pytest.approx(5.0 + 6.0)
    # A later window: only the open reservation.
    assert _hours(engine, 10, 12, local_queue="team-a/main")[GPU] == pytest.approx(8.0)
    assert _hours(engine, 0, 6, local_queue="team-b/main")[GPU] == 0.0


def test_exactly_one_scope(engine: Engine) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        used_resource_hours(engine, resource=GPU, since_us=0, at_us=1)
