"""ClusterQueue quotas over time (revision 0004), on SQLite and PostgreSQL: one version per
spec generation written once, and per ClusterQueue and resource over a window its quota, the
part used and what it borrowed beyond its nominal quota (what ``phalanx report usage --by
clusterqueue`` shows)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from sqlalchemy import Engine

from phalanx.store import db, quotas, report
from phalanx.store import events as ev

T0 = dt.datetime(2026, 11, 30)
GPU = "nvidia.com/gpu"
HOUR = 3600.0


@pytest.fixture
def engine(store_url: str):  # type: ignore[no-untyped-def]
    engine = db.open_engine(store_url)
    db.upgrade(engine)
    yield engine
    engine.dispose()


def _cq(
    name: str, gpus: str, *, generation: int = 1, uid: str = "", **extra: Any
) -> dict[str, Any]:
    resource: dict[str, Any] = {"name": GPU, "nominalQuota": gpus, **extra}
    return {
        "metadata": {
            "name": name,
            "uid": uid or f"uid-{name}",
            "generation": generation,
            "creationTimestamp": "2026-11-30T00:00:00Z",
        },
        "spec": {
            "cohortName": "all",
            "resourceGroups": [
                {
                    "coveredResources": [GPU, "cpu"],
                    "flavors": [
                        {
                            "name": "h100",
                            "resources": [resource, {"name": "cpu", "nominalQuota": "500m"}],
                        }
                    ],
                }
            ],
        },
    }


def _at(hours: float) -> dt.datetime:
    return T0 + dt.timedelta(hours=hours)


def _reservation(uid: str, cq: str, gpus: int, start: float, end: float) -> list[ev.Event]:
    usage = (ev.Usage(pod_set="main", resource=GPU, flavor="h100", amount=gpus),)
    common = {"namespace": "team-a", "name": uid, "local_queue": "lq"}
    return [
        ev.Event(uid, ev.QUOTA_RESERVED, _at(start), cluster_queue=cq, usage=usage, **common),
        ev.Event(uid, ev.FINISHED, _at(end), **common),
    ]


def test_a_snapshot_is_the_spec_of_one_generation() -> None:
    first = quotas.snapshot_of(_cq("cq", "8", borrowingLimit="4"), seen_at=_at(5))
    assert first is not None
    assert first.key == ("uid-cq", 1, False)
    assert first.at == T0, "the first generation dates from the ClusterQueue's creation"
    assert first.cohort == "all"
    assert first.amounts == (("h100", "cpu", 500, None, None), ("h100", GPU, 8, 4, None))
    later = quotas.snapshot_of(_cq("cq", "4", generation=2), seen_at=_at(5))
    assert later is not None and later.at == _at(5) and later.key == ("uid-cq", 2, False)
    gone = quotas.snapshot_of(_cq("cq", "4", generation=2), seen_at=_at(6), deleted=True)
    assert gone is not None and gone.amounts == () and gone.key == ("uid-cq", 2, True)
    # A quantity the webhook would refuse is left out, not raised into the change feed.
    odd = quotas.snapshot_of(_cq("cq", "eight"), seen_at=_at(5))
    assert odd is not None and [a[1] for a in odd.amounts] == ["cpu"]
    assert quotas.snapshot_of({"metadata": {"name": "x"}}, seen_at=_at(5)) is None


def test_versions_are_written_once(engine: Engine) -> None:
    snapshots = [
        quotas.snapshot_of(_cq("cq", "8"), seen_at=_at(0)),
        quotas.snapshot_of(_cq("cq", "4", generation=2), seen_at=_at(3)),
    ]
    batch = [s for s in snapshots if s is not None]
    assert quotas.write_snapshots(engine, batch) == 2
    assert quotas.write_snapshots(engine, batch) == 0, "a replay writes nothing"
    assert quotas.live_queues(engine) == [("uid-cq", "cq", 2)]
    gone = quotas.snapshot_of(_cq("cq", "4", generation=2), seen_at=_at(4), deleted=True)
    assert gone is not None and quotas.write_snapshots(engine, [gone]) == 1
    assert quotas.live_queues(engine) == []


def test_quota_used_share_and_borrowing_follow_the_quota_versions(engine: Engine) -> None:
    """8 GPUs nominal from 0h, 4 from 3h (generation 2). Reservations: 4 GPUs [0h, 2h),
    12 GPUs [2h, 3h) (4 beyond the quota), 6 GPUs [3h, 4h) (2 beyond the new quota), and
    2 GPUs [1h, 2h) beside the first (6 of 8: nothing borrowed)."""
    for snap in (
        quotas.snapshot_of(_cq("cq", "8"), seen_at=_at(0)),
        quotas.snapshot_of(_cq("cq", "4", generation=2), seen_at=_at(3)),
    ):
        assert snap is not None
        quotas.write_snapshots(engine, [snap])
    db.write_events(
        engine,
        [
            *_reservation("w1", "cq", 4, 0, 2),
            *_reservation("w2", "cq", 12, 2, 3),
            *_reservation("w3", "cq", 6, 3, 4),
            *_reservation("w4", "cq", 2, 1, 2),
        ],
    )
    use = report.quota_use(engine, since=_at(0), until=_at(4))["cq"][GPU]
    assert use.quota / HOUR == pytest.approx(8 * 3 + 4 * 1)
    assert use.used / HOUR == pytest.approx(4 * 2 + 12 + 6 + 2)
    assert use.borrowed / HOUR == pytest.approx(4 + 2)
    assert use.used_share == pytest.approx(28 / 28)
    # A window cut inside the reservations: [1.5h, 2.5h).
    cut = report.quota_use(engine, since=_at(1.5), until=_at(2.5))["cq"][GPU]
    assert cut.quota / HOUR == pytest.approx(8)
    assert cut.used / HOUR == pytest.approx(0.5 * 6 + 0.5 * 12)
    assert cut.borrowed / HOUR == pytest.approx(0.5 * 4)
    # The CPU quota is there without any use of it.
    cpu = report.quota_use(engine, since=_at(0), until=_at(4))["cq"]["cpu"]
    assert cpu.quota / HOUR == pytest.approx(500 * 4) and cpu.used == 0


def test_time_before_the_first_version_counts_nowhere(engine: Engine) -> None:
    """A ClusterQueue first seen at 2h (its creation before the store existed, say): its
    usage before that has no quota to compare with, so it counts neither as used nor as
    borrowed; after its deletion its quota is 0."""
    later = quotas.snapshot_of(_cq("cq", "4", generation=3), seen_at=_at(2))
    assert later is not None
    gone = quotas.snapshot_of(_cq("cq", "4", generation=3), seen_at=_at(5), deleted=True)
    assert gone is not None
    quotas.write_snapshots(engine, [later, gone])
    db.write_events(engine, _reservation("w1", "cq", 6, 0, 6))
    use = report.quota_use(engine, since=_at(0), until=_at(6))["cq"][GPU]
    assert use.quota / HOUR == pytest.approx(4 * 3)
    assert use.used / HOUR == pytest.approx(6 * 4)
    assert use.borrowed / HOUR == pytest.approx(2 * 3 + 6 * 1)


def test_downgrade_drops_the_quota_tables_and_upgrade_restores_them(engine: Engine) -> None:
    snap = quotas.snapshot_of(_cq("cq", "8"), seen_at=_at(0))
    assert snap is not None
    quotas.write_snapshots(engine, [snap])
    db.downgrade(engine, "0003")
    assert db.current_revision(engine) == "0003"
    db.upgrade(engine)
    assert db.current_revision(engine) == db.head_revision()
    assert quotas.live_queues(engine) == []


def test_report_usage_by_clusterqueue_shows_quota_share_and_borrowing(
    store_url: str, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """Created 3 h ago with 8 GPUs, one 12-GPU reservation over the last hour: 24 quota
    GPU-hours, 12 used (50.0%), 4 borrowed; a ClusterQueue without a stored quota shows '-'."""
    from phalanx.cli.main import main

    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    cq = _cq("cq-a", "8")
    cq["metadata"]["creationTimestamp"] = (now - dt.timedelta(hours=3)).isoformat() + "Z"
    snap = quotas.snapshot_of(cq, seen_at=now)
    assert snap is not None
    quotas.write_snapshots(engine, [snap])
    hour_ago = (now - dt.timedelta(hours=1) - T0) / dt.timedelta(hours=1)
    db.write_events(
        engine,
        [
            *_reservation("w1", "cq-a", 12, hour_ago, hour_ago + 24)[:1],
            *_reservation("w2", "cq-b", 1, hour_ago, hour_ago + 24)[:1],
        ],
    )
    args = ["report", "usage", "--by", "clusterqueue", "--store", store_url]
    assert main([*args, "--format", "json"]) == 0
    rows = {r["clusterqueue"]: r for r in json.loads(capsys.readouterr().out)}
    a = rows["cq-a"]
    assert a["nvidia.com/gpu_quota_hours"] == pytest.approx(24, rel=0.01)
    assert a["nvidia.com/gpu_quota_used_pct"] == pytest.approx(50.0, abs=0.5)
    assert a["nvidia.com/gpu_borrowed_hours"] == pytest.approx(4, rel=0.01)
    assert rows["cq-b"]["nvidia.com/gpu_quota_hours"] is None
    assert main(["report", "usage", "--by", "clusterqueue", "--store", store_url]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[-3:] == [
        "nvidia.com/gpu_quota_hours",
        "nvidia.com/gpu_quota_used_pct",
        "nvidia.com/gpu_borrowed_hours",
    ]
