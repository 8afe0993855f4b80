"""A LocalQueue's decayed usage rebuilt from the store (admission fair sharing after a lost
status), on SQLite and PostgreSQL, against values worked out by hand and against Kueue's
sampled recurrence."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from store_builders import condition, workload

from phalanx.admission import fair_usage as afs
from phalanx.store import db
from phalanx.store import events as ev
from phalanx.store.decay import cluster_queue_consumed, local_queue_consumed

GPU = "nvidia.com/gpu"
HOUR = 3600.0


def _at(hours: float) -> str:
    return (dt.datetime(2026, 1, 1) + dt.timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _store(url: str, *versions: dict[str, Any]) -> Any:
    engine = db.open_engine(url)
    db.upgrade(engine)
    db.write_events(engine, [e for version in versions for e in ev.events_of(version)])
    return engine


def _reserved(uid: str, *, at: float, gpus: int, queue: str = "lq-a", **kw: Any) -> dict[str, Any]:
    extra = kw.pop("conditions", [])
    return workload(
        uid=uid,
        name=uid,
        queue=queue,
        created=_at(at),
        cluster_queue="cq",
        gpus=gpus,
        conditions=[condition("QuotaReserved", _at(at)), *extra],
        **kw,
    )


def test_rebuilt_usage_is_the_decay_kernel_integrated_over_each_reservation(
    store_url: str,
) -> None:
    """Half-life 1h, looked at 4h after T0:
    - w1: 4 GPUs (2 cores) from 0h to 2h (finished): 4 x (0.5^2 - 0.5^4) = 0.75 GPU;
    - w2: 2 GPUs (1 core) from 3h, still held: 2 x (1 - 0.5) = 1 GPU;
    - w3: 8 GPUs from 0h, evicted at 0.5h, quota released at 1h (held until then), reserved
      again at 3.5h: 8 x (0.5^3 - 0.5^4) + 8 x (1 - 0.5^0.5) = 0.5 + 2.343 GPU;
    - another LocalQueue's workload and another namespace's lq-a: not counted."""
    finished = _reserved("w1", at=0, gpus=4, conditions=[condition("Finished", _at(2))])
    held = _reserved("w2", at=3, gpus=2)
    evicted = _reserved(
        "w3",
        at=0,
        gpus=8,
        conditions=[
            condition("Evicted", _at(0.5)),
            condition("QuotaReserved", _at(1), status="False"),
        ],
    )
    again = _reserved("w3", at=0, gpus=8)
    again["status"]["conditions"] = [condition("QuotaReserved", _at(3.5))]
    other_queue = _reserved("w4", at=0, gpus=16, queue="lq-b")
    other_namespace = _reserved("w5", at=0, gpus=16, namespace="team-b")
    engine = _store(store_url, finished, held, evicted, again, other_queue, other_namespace)
    at = dt.datetime(2026, 1, 1, 4)
    consumed = local_queue_consumed(
        engine, namespace="team-a", local_queue="lq-a", at=at, half_life_seconds=HOUR
    )
    w3 = 8 * (0.5**3 - 0.5**4) + 8 * (1 - 0.5**0.5)
    assert consumed[GPU] == pytest.approx(0.75 + 1.0 + w3)
    assert consumed["cpu"] == pytest.approx((0.75 + 1.0 + w3) / 2)  # 500m per GPU
    assert set(consumed) == {GPU, "cpu"}
    # Nothing for a queue without history; nothing with a half-life of 0.
    assert (
        local_queue_consumed(
            engine, namespace="team-a", local_queue="none", at=at, half_life_seconds=HOUR
        )
        == {}
    )
    assert (
        local_queue_consumed(
            engine, namespace="team-a", local_queue="lq-a", at=at, half_life_seconds=0
        )
        == {}
    )
    engine.dispose()


def test_rebuilt_usage_equals_kueue_sampling_every_minute(store_url: str) -> None:
    """The same history replayed through Kueue's recurrence (sampled each minute, usage
    constant between samples) lands on the same consumed value."""
    finished = _reserved("w1", at=0, gpus=3, conditions=[condition("Finished", _at(5))])
    held = _reserved("w2", at=6, gpus=1)
    engine = _store(store_url, finished, held)
    at = dt.datetime(2026, 1, 1, 8)
    rebuilt = local_queue_consumed(
        engine, namespace="team-a", local_queue="lq-a", at=at, half_life_seconds=2 * HOUR
    )
    consumed: dict[str, float] = {}
    for minute in range(1, 8 * 60 + 1):
        gpus = 3.0 if minute <= 5 * 60 else (1.0 if minute > 6 * 60 else 0.0)
        consumed = afs.decayed(consumed, {GPU: gpus}, 60_000, 2 * 3_600_000)
    assert rebuilt[GPU] == pytest.approx(consumed[GPU], rel=1e-9)
    engine.dispose()


def test_a_cluster_queue_counts_only_the_reservations_it_held(store_url: str) -> None:
    """Decayed fair sharing rebuilds a ClusterQueue's usage the same way. w1 held 4 GPUs in
    cq from 0h to 1h (evicted, released), then from 2h in cq-b, still held at 4h (half-life
    1h): cq counts 4 x (0.5^3 - 0.5^4) = 0.25 GPU, cq-b 4 x (1 - 0.5^2) = 3."""
    first = workload(
        uid="w1",
        name="w1",
        created=_at(0),
        cluster_queue="cq",
        conditions=[condition("QuotaReserved", _at(0))],
    )
    evicted = workload(
        uid="w1",
        name="w1",
        created=_at(0),
        cluster_queue="cq",
        conditions=[
            condition("Evicted", _at(1)),
            condition("QuotaReserved", _at(1), status="False"),
        ],
    )
    moved = workload(
        uid="w1",
        name="w1",
        created=_at(0),
        cluster_queue="cq-b",
        conditions=[condition("QuotaReserved", _at(2))],
    )
    engine = _store(store_url, first, evicted, moved)
    at = dt.datetime(2026, 1, 1, 4)
    here = cluster_queue_consumed(engine, cluster_queue="cq", at=at, half_life_seconds=HOUR)
    there = cluster_queue_consumed(engine, cluster_queue="cq-b", at=at, half_life_seconds=HOUR)
    assert here[GPU] == pytest.approx(0.25)
    assert there[GPU] == pytest.approx(3.0)
    engine.dispose()
