"""The dashboard's usage view on a SQLite store: which buckets a window has, the hours in
each (the usage report's query), which series a viewer may see, the 30 s cache; and the
decayed fair-share view from LocalQueue status."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from phalanx.dashboard.usage import (
    UsageReader,
    buckets_for,
    fair_share,
    read_usage,
    usage_view,
)
from phalanx.store import db
from phalanx.store import events as ev

NOW = dt.datetime(2026, 3, 10, 12, 20, 0)
EVERYONE = lambda _ns: True  # noqa: E731


def _iso(at: dt.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _workload(
    uid: str, namespace: str, queue: str, cq: str, gpus: int, start: dt.datetime, end: Any
) -> dict[str, Any]:
    """A Workload that held ``gpus`` GPUs of ``cq`` from ``start`` (until ``end``, if any)."""
    conditions = [{"type": "QuotaReserved", "status": "True", "lastTransitionTime": _iso(start)}]
    if end is not None:
        conditions.append({"type": "Finished", "status": "True", "lastTransitionTime": _iso(end)})
    return {
        "metadata": {
            "uid": uid,
            "namespace": namespace,
            "name": f"job-{uid}",
            "creationTimestamp": _iso(start - dt.timedelta(minutes=5)),
        },
        "spec": {"queueName": queue, "podSets": []},
        "status": {
            "conditions": conditions,
            "admission": {
                "clusterQueue": cq,
                "podSetAssignments": [
                    {
                        "name": "main",
                        "count": 1,
                        "flavors": {"nvidia.com/gpu": "h100", "cpu": "default"},
                        "resourceUsage": {"nvidia.com/gpu": str(gpus), "cpu": "2"},
                    }
                ],
            },
        },
    }


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[db.Engine]:
    """team-a/lq-a: 4 GPUs from 09:20 to 10:50; team-b/lq-b: 2 GPUs since 11:50, still held."""
    engine = db.open_engine(f"sqlite:///{tmp_path}/store.db")
    db.upgrade(engine)
    a = _workload("a", "team-a", "lq-a", "cq-a", 4, NOW - dt.timedelta(hours=3), None)
    a["status"]["conditions"].append(
        {
            "type": "Finished",
            "status": "True",
            "lastTransitionTime": _iso(NOW - dt.timedelta(minutes=90)),
        }
    )
    b = _workload("b", "team-b", "lq-b", "cq-b", 2, NOW - dt.timedelta(minutes=30), None)
    db.write_events(engine, ev.events_of(a) + ev.events_of(b))
    try:
        yield engine
    finally:
        engine.dispose()


def test_a_window_has_whole_aligned_buckets_the_last_one_current() -> None:
    since, width = buckets_for("24h", NOW)
    assert (since, width) == (dt.datetime(2026, 3, 9, 13), dt.timedelta(hours=1))
    since, width = buckets_for("7d", NOW)
    assert (since, width) == (dt.datetime(2026, 3, 4), dt.timedelta(days=1))
    since, width = buckets_for("30d", NOW)
    assert (since, width) == (dt.datetime(2026, 2, 9), dt.timedelta(days=1))
    with pytest.raises(ValueError, match="window='1y': use one of 24h, 7d, 30d"):
        buckets_for("1y", NOW)


def test_the_hours_per_bucket_are_the_reports(engine: db.Engine) -> None:
    data = read_usage(engine, window="24h", by="localqueue", now=NOW)
    assert len(data.starts) == 24
    assert data.starts[-1] == dt.datetime(2026, 3, 10, 12)
    view = usage_view(data, resource="nvidia.com/gpu", can_read=EVERYONE, cluster_scoped=True)
    assert view["width"] == "hour" and view["unit"] == ""
    series = {s["group"]: s["hours"] for s in view["series"]}
    assert set(series) == {"team-a/lq-a", "team-b/lq-b"}
    # team-a: 4 GPUs for 40 min in the 09:00 bucket, 50 min in the 10:00 one.
    assert series["team-a/lq-a"][-4:] == pytest.approx([4 * 40 / 60, 4 * 50 / 60, 0.0, 0.0])
    # team-b still holds 2 GPUs: counted up to now, 20 minutes of the current hour.
    assert series["team-b/lq-b"][-2:] == pytest.approx([2 * 10 / 60, 2 * 20 / 60])
    assert sum(series["team-a/lq-a"][:-4]) == 0
    assert view["resources"] == ["cpu", "nvidia.com/gpu"]
    cpu = usage_view(data, resource="cpu", can_read=EVERYONE, cluster_scoped=True)
    assert cpu["unit"] == "cores"
    assert {s["group"]: s["total"] for s in cpu["series"]} == pytest.approx(
        {"team-a/lq-a": 2 * 1.5, "team-b/lq-b": 2 * 0.5}
    )


def test_daily_buckets_for_a_week(engine: db.Engine) -> None:
    data = read_usage(engine, window="7d", by="namespace", now=NOW)
    view = usage_view(data, resource="nvidia.com/gpu", can_read=EVERYONE, cluster_scoped=True)
    assert view["width"] == "day" and len(view["starts"]) == 7
    assert view["starts"][-1] == "2026-03-10T00:00:00Z"
    totals = {s["group"]: s["hours"][-1] for s in view["series"]}
    assert totals == pytest.approx({"team-a": 6.0, "team-b": 1.0})


def test_a_viewer_sees_only_the_namespaces_it_may_read(engine: db.Engine) -> None:
    only_b = lambda ns: ns == "team-b"  # noqa: E731
    for by, groups in (("localqueue", ["team-b/lq-b"]), ("namespace", ["team-b"])):
        data = read_usage(engine, window="24h", by=by, now=NOW)
        view = usage_view(data, resource="nvidia.com/gpu", can_read=only_b, cluster_scoped=False)
        assert [s["group"] for s in view["series"]] == groups
        # team-a held cpu too: nothing of its series leaks through the resource list.
        assert view["resources"] == ["cpu", "nvidia.com/gpu"]
    data = read_usage(engine, window="24h", by="localqueue", now=NOW)
    nobody = usage_view(
        data, resource="nvidia.com/gpu", can_read=lambda _ns: False, cluster_scoped=False
    )
    assert nobody["series"] == [] and nobody["resources"] == ["nvidia.com/gpu"]


def test_clusterqueue_series_need_the_cluster_view(engine: db.Engine) -> None:
    data = read_usage(engine, window="24h", by="clusterqueue", now=NOW)
    refused = usage_view(data, resource="nvidia.com/gpu", can_read=EVERYONE, cluster_scoped=False)
    assert refused["series"] == [] and "may not list ClusterQueues" in refused["refused"]
    shown = usage_view(data, resource="nvidia.com/gpu", can_read=EVERYONE, cluster_scoped=True)
    assert [s["group"] for s in shown["series"]] == ["cq-a", "cq-b"]


def test_the_reader_caches_each_window_and_runs_off_the_loop(
    engine: db.Engine, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/store.db"

    async def twice(ttl: float) -> tuple[Any, Any]:
        reader = UsageReader(url, ttl=ttl)
        try:
            first = await reader.read(window="24h", by="localqueue")
            later = _workload("c", "team-c", "lq-c", "cq-a", 1, NOW, None)
            db.write_events(engine, ev.events_of(later))
            second = await reader.read(window="24h", by="localqueue")
            return first, second
        finally:
            reader.close()

    first, second = asyncio.run(twice(30.0))
    assert second is first, "read again within the cache's lifetime"
    first, second = asyncio.run(twice(0.0))
    assert "team-c/lq-c" in second.held and second is not first


def test_the_reader_says_what_is_wrong_with_the_store(tmp_path: Path) -> None:
    reader = UsageReader(f"sqlite:///{tmp_path}/missing.db")
    with pytest.raises(db.StoreError, match="no such file"):
        asyncio.run(reader.read(window="24h", by="localqueue"))
    with pytest.raises(ValueError, match="by='flavor': use one of"):
        asyncio.run(reader.read(window="24h", by="flavor"))


# -- the decayed fair-share view ----------------------------------------------------------------


def _cq(name: str, *, afs: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"resourceGroups": []}
    if afs:
        spec["admissionScope"] = {"admissionMode": "UsageBasedAdmissionFairSharing"}
    return {"metadata": {"name": name}, "spec": spec}


def _lq(
    namespace: str, name: str, cq: str, *, weight: str | None, gpus: str | None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"clusterQueue": cq}
    if weight is not None:
        spec["fairSharing"] = {"weight": weight}
    status: dict[str, Any] = {}
    if gpus is not None:
        status["fairSharing"] = {
            "weightedShare": 0,
            "admissionFairSharingStatus": {"consumedResources": {"nvidia.com/gpu": gpus}},
        }
    return {"metadata": {"namespace": namespace, "name": name}, "spec": spec, "status": status}


def _queues() -> tuple[dict[str, Any], dict[str, Any]]:
    cqs = {"fair": _cq("fair", afs=True), "plain": _cq("plain", afs=False)}
    lqs = {
        "team-a/lq": _lq("team-a", "lq", "fair", weight=None, gpus="6"),
        "team-b/lq": _lq("team-b", "lq", "fair", weight="3", gpus="2"),
        "team-c/lq": _lq("team-c", "lq", "fair", weight="500m", gpus=None),
        "team-a/other": _lq("team-a", "other", "plain", weight=None, gpus="9"),
    }
    return cqs, lqs


def test_fair_share_is_the_weight_over_the_queues_weights() -> None:
    cqs, lqs = _queues()
    [view] = fair_share(cqs, lqs, can_read=EVERYONE, cluster_scoped=True)
    assert view["clusterQueue"] == "fair"
    assert view["total"] == {"nvidia.com/gpu": 8.0}
    rows = {f"{q['namespace']}/{q['name']}": q for q in view["queues"]}
    assert set(rows) == {"team-a/lq", "team-b/lq", "team-c/lq"}, "only the fair-sharing queue"
    assert {k: q["fair"] for k, q in rows.items()} == pytest.approx(
        {"team-a/lq": 1 / 4.5, "team-b/lq": 3 / 4.5, "team-c/lq": 0.5 / 4.5}, abs=1e-4
    )
    assert rows["team-a/lq"]["consumed"] == {"nvidia.com/gpu": 6.0}
    assert rows["team-c/lq"]["consumed"] == {}
    assert {k: q["share"]["nvidia.com/gpu"] for k, q in rows.items()} == pytest.approx(
        {"team-a/lq": 0.75, "team-b/lq": 0.25, "team-c/lq": 0.0}
    )


def test_fair_share_shows_a_team_its_own_queues_and_no_sums() -> None:
    cqs, lqs = _queues()
    [view] = fair_share(cqs, lqs, can_read=lambda ns: ns == "team-b", cluster_scoped=False)
    assert [q["namespace"] for q in view["queues"]] == ["team-b"]
    assert view["total"] is None and "share" not in view["queues"][0]
    assert view["queues"][0]["fair"] == pytest.approx(3 / 4.5, abs=1e-4)
    assert fair_share(cqs, lqs, can_read=lambda ns: ns == "team-x", cluster_scoped=False) == []
