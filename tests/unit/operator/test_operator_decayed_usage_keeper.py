"""Decayed fair sharing in the operator, without a cluster: ``--config``'s
``decayedFairSharing`` (Go durations, validation naming the field, refused without
``fairSharing.enable``), and each ClusterQueue's decayed usage kept across leaders: written in
its status beside ``weightedShare``, restored from there, rebuilt from the store when the
status has none."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from phalanx.admission.fair_usage import AdmissionFairSharing
from phalanx.admission.model import ClusterQueue, FlavorQuotas, ResourceGroup
from phalanx.admission.scheduler import Scheduler, SchedulerConfig
from phalanx.cli.operator_cmd import _admission_fair_sharing
from phalanx.operator.afs import FairUsageKeeper, consumed_from_status
from phalanx.operator.configfile import ConfigFileError, parse
from phalanx.operator.queuestatus import cluster_queue_status
from phalanx.operator.state import ClusterState
from phalanx.quotas.resources import ResourceQuota
from phalanx.store import db
from phalanx.store import events as ev

GPU = "nvidia.com/gpu"
HOUR = 3_600_000


def _config(section: Any, *, fair_sharing: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "fairSharing": {"enable": fair_sharing},
        "decayedFairSharing": section,
    }


def test_decayed_fair_sharing_is_read_with_go_durations() -> None:
    parsed = parse(_config({"usageHalfLifeTime": "168h", "usageSamplingInterval": "10m"}))
    section = parsed.decayed_fair_sharing
    assert section is not None
    assert _admission_fair_sharing(section) == AdmissionFairSharing(
        usage_half_life_ms=168 * HOUR, usage_sampling_interval_ms=600_000
    )
    assert parsed.admission_fair_sharing is None  # the two are independent
    default = parse(_config({"usageHalfLifeTime": "24h"})).decayed_fair_sharing
    assert default is not None and default.usage_sampling_interval_seconds == 300
    assert parse(_config(None)).decayed_fair_sharing is None


@pytest.mark.parametrize(
    ("section", "fair_sharing", "message"),
    [
        ({"usageHalfLifeTime": "1h"}, False, "decayedFairSharing: orders ClusterQueues"),
        ({}, True, "decayedFairSharing.usageHalfLifeTime: required"),
        ({"usageHalfLifeTime": "-1h"}, True, "decayedFairSharing.usageHalfLifeTime: must be 0"),
        (
            {"usageHalfLifeTime": "1h", "usageSamplingInterval": "0s"},
            True,
            "decayedFairSharing.usageSamplingInterval: must be above 0",
        ),
        (
            {"usageHalfLifeTime": "1h", "resourceWeights": {"cpu": 0}},
            True,
            "decayedFairSharing.resourceWeights: not supported",
        ),
        ("168h", True, "decayedFairSharing: must be a mapping"),
    ],
)
def test_each_problem_names_its_field(section: Any, fair_sharing: bool, message: str) -> None:
    with pytest.raises(ConfigFileError) as info:
        parse(_config(section, fair_sharing=fair_sharing))
    assert any(p.startswith(message) for p in info.value.problems), info.value.problems


# -- status and store ----------------------------------------------------------------------------


def _scheduler() -> Scheduler:
    decay = AdmissionFairSharing(usage_half_life_ms=HOUR, usage_sampling_interval_ms=60_000)
    s = Scheduler(config=SchedulerConfig(fair_sharing=True, decayed_fair_sharing=decay))
    group = ResourceGroup((GPU,), (FlavorQuotas("default", {GPU: ResourceQuota(4)}),))
    for name in ("team-a", "team-b"):
        s.apply_cluster_queue(ClusterQueue(name, resource_groups=(group,), cohort="org"))
    return s


def _cq(name: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"cohortName": "org"},
    }
    if status is not None:
        obj["status"] = status
    return obj


def test_a_new_leader_restores_from_status_then_store(tmp_path: Path) -> None:
    """team-a's status holds its decayed usage: restored from it. team-b's has none: rebuilt
    from the store (4 GPUs reserved in team-b for the last hour, half-life 1h: 4 x 0.5 = 2).
    The status then written carries both, beside ``weightedShare``."""
    url = f"sqlite:///{tmp_path}/store.db"
    engine = db.open_engine(url)
    db.upgrade(engine)
    now = dt.datetime(2026, 1, 1, 12)
    now_ms = int(now.replace(tzinfo=dt.UTC).timestamp() * 1000)
    hour_ago = (now - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    workload = {
        "metadata": {"uid": "u1", "namespace": "ns", "name": "w", "creationTimestamp": hour_ago},
        "spec": {"queueName": "lq"},
        "status": {
            "admission": {
                "clusterQueue": "team-b",
                "podSetAssignments": [
                    {
                        "name": "main",
                        "count": 4,
                        "flavors": {GPU: "default"},
                        "resourceUsage": {GPU: "4"},
                    }
                ],
            },
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "lastTransitionTime": hour_ago}
            ],
        },
    }
    db.write_events(engine, ev.events_of(workload))
    engine.dispose()
    state = ClusterState()
    stored = {
        "weightedShare": 0,
        "admissionFairSharingStatus": {"consumedResources": {GPU: "3"}, "lastUpdate": hour_ago},
    }
    state.apply("ClusterQueue", "ADDED", _cq("team-a", {"fairSharing": stored}))
    state.apply("ClusterQueue", "ADDED", _cq("team-b"))

    s = _scheduler()
    keeper = FairUsageKeeper(s, state, store_url=url, kind="ClusterQueue")
    asyncio.run(keeper.prefetch(now_ms))
    keeper.sync(now_ms)
    keeper.close()
    assert s.decayed_usage is not None
    a, b = s.decayed_usage.get("team-a"), s.decayed_usage.get("team-b")
    assert a is not None and b is not None
    assert a.consumed == {GPU: 3.0} and a.last_update == now_ms
    assert b.consumed[GPU] == pytest.approx(2.0)
    written = cluster_queue_status(s, _cq("team-b"))["fairSharing"]
    assert written == {
        "weightedShare": 0,
        "admissionFairSharingStatus": {
            "consumedResources": {GPU: "2"},
            "lastUpdate": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    }
    assert consumed_from_status({"status": {"fairSharing": written}}) == {GPU: 2.0}
    # Without a store team-b starts empty; the LocalQueue keeper leaves ClusterQueues alone.
    plain = _scheduler()
    FairUsageKeeper(plain, state).sync(now_ms)
    assert plain.decayed_usage is not None and plain.decayed_usage.get("team-b") is None
    FairUsageKeeper(plain, state, kind="ClusterQueue").sync(now_ms)
    fresh = plain.decayed_usage.get("team-b")
    assert fresh is not None and fresh.consumed == {}


def test_without_decayed_fair_sharing_the_status_has_only_the_share() -> None:
    group = ResourceGroup((GPU,), (FlavorQuotas("default", {GPU: ResourceQuota(4)}),))
    s = Scheduler(config=SchedulerConfig(fair_sharing=True))
    s.apply_cluster_queue(ClusterQueue("team-a", resource_groups=(group,), cohort="org"))
    FairUsageKeeper(s, ClusterState(), kind="ClusterQueue").sync(0)
    assert cluster_queue_status(s, _cq("team-a"))["fairSharing"] == {"weightedShare": 0}
