"""Admission fair sharing in the operator, without a cluster: ``--config``'s
``admissionFairSharing`` (Kueue's names, Go durations, validation naming the field), and the
LocalQueue usage kept across leaders: restored from the status, rebuilt from the store when
the status has none, sampled and written back as Kueue's ``admissionFairSharingStatus``."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from phalanx.admission.fair_usage import AdmissionFairSharing
from phalanx.admission.model import ClusterQueue, FlavorQuotas, LocalQueue, ResourceGroup
from phalanx.admission.scheduler import Scheduler, SchedulerConfig
from phalanx.cli.operator_cmd import _admission_fair_sharing
from phalanx.operator.afs import FairUsageKeeper, consumed_from_status, status_of
from phalanx.operator.configfile import ConfigFileError, parse
from phalanx.operator.state import ClusterState
from phalanx.quotas.resources import ResourceQuota
from phalanx.store import db
from phalanx.store import events as ev

GPU = "nvidia.com/gpu"
HOUR = 3_600_000


def _config(**section: Any) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "admissionFairSharing": section,
    }


def test_admission_fair_sharing_is_read_with_kueues_names_and_defaults() -> None:
    parsed = parse(
        _config(usageHalfLifeTime="168h", resourceWeights={GPU: 1, "cpu": 0, "memory": 0.5})
    )
    afs = parsed.admission_fair_sharing
    assert afs is not None
    assert afs.usage_half_life_seconds == 168 * 3600
    assert afs.usage_sampling_interval_seconds == 300  # Kueue's default: 5m
    assert afs.resource_weights == {GPU: 1.0, "cpu": 0.0, "memory": 0.5}
    core = _admission_fair_sharing(afs)
    assert core == AdmissionFairSharing(
        usage_half_life_ms=168 * HOUR,
        usage_sampling_interval_ms=300_000,
        resource_weights={GPU: 1.0, "cpu": 0.0, "memory": 0.5},
    )
    short = parse(_config(usageHalfLifeTime="0", usageSamplingInterval="1m30s"))
    assert short.admission_fair_sharing is not None
    assert short.admission_fair_sharing.usage_half_life_seconds == 0
    assert short.admission_fair_sharing.usage_sampling_interval_seconds == 90
    assert parse({**_config(), "admissionFairSharing": None}).admission_fair_sharing is None


def test_the_feature_gate_turns_it_off() -> None:
    document = {**_config(usageHalfLifeTime="1h"), "featureGates": {"AdmissionFairSharing": False}}
    parsed = parse(document)
    assert parsed.admission_fair_sharing is None
    assert "featureGates.AdmissionFairSharing" not in parsed.ignored
    on = {**_config(usageHalfLifeTime="1h"), "featureGates": {"AdmissionFairSharing": True}}
    assert parse(on).admission_fair_sharing is not None


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"usageHalfLifeTime": "1 week"}, "admissionFairSharing.usageHalfLifeTime: '1 week'"),
        ({"usageHalfLifeTime": "-1h"}, "admissionFairSharing.usageHalfLifeTime: must be 0 or"),
        ({}, "admissionFairSharing.usageHalfLifeTime: required"),
        (
            {"usageHalfLifeTime": "1h", "usageSamplingInterval": "0s"},
            "admissionFairSharing.usageSamplingInterval: must be above 0",
        ),
        (
            {"usageHalfLifeTime": "1h", "usageSamplingInterval": 300},
            "admissionFairSharing.usageSamplingInterval: 300 is not a duration",
        ),
        (
            {"usageHalfLifeTime": "1h", "resourceWeights": {"cpu": -1}},
            "admissionFairSharing.resourceWeights.cpu: must be 0 or more",
        ),
        (
            {"usageHalfLifeTime": "1h", "resourceWeights": {"cpu": "high"}},
            "admissionFairSharing.resourceWeights.cpu: must be a number",
        ),
        (
            {"usageHalfLifeTime": "1h", "resourceWeights": [GPU]},
            "admissionFairSharing.resourceWeights: must be a mapping",
        ),
        (
            {"usageHalfLifeTime": "1h", "halfLife": "1h"},
            "admissionFairSharing.halfLife: not supported",
        ),
    ],
)
def test_each_problem_names_its_field(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigFileError) as info:
        parse(_config(**section))
    assert any(p.startswith(message) for p in info.value.problems), info.value.problems


# -- status and store ----------------------------------------------------------------------------


def _scheduler() -> Scheduler:
    afs = AdmissionFairSharing(usage_half_life_ms=HOUR, usage_sampling_interval_ms=60_000)
    s = Scheduler(config=SchedulerConfig(admission_fair_sharing=afs))
    group = ResourceGroup((GPU,), (FlavorQuotas("default", {GPU: ResourceQuota(8)}),))
    cq = ClusterQueue("cq", resource_groups=(group,))
    s.apply_cluster_queue(dataclasses.replace(cq, usage_based_fair_sharing=True))
    s.apply_local_queue(LocalQueue("team-a", "lq-a", "cq"))
    s.apply_local_queue(LocalQueue("team-a", "lq-b", "cq"))
    return s


def _lq(name: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"namespace": "team-a", "name": name, "resourceVersion": "1"},
        "spec": {"clusterQueue": "cq"},
    }
    if status is not None:
        obj["status"] = status
    return obj


def test_status_round_trip_at_milli_precision() -> None:
    s = _scheduler()
    s.restore_local_queue_usage("team-a/lq-a", {GPU: 0.75, "cpu": 2.0, "memory": 2.0**31}, 0)
    usage = s.fair_usage.get("team-a/lq-a") if s.fair_usage else None
    assert usage is not None
    status = status_of(usage)
    assert status["admissionFairSharingStatus"] == {
        "consumedResources": {"cpu": "2", "memory": "2147483648", GPU: "750m"},
        "lastUpdate": "1970-01-01T00:00:00Z",
    }
    assert status["weightedShare"] == 0
    assert consumed_from_status({"status": {"fairSharing": status}}) == {
        "cpu": 2.0,
        "memory": 2.0**31,
        GPU: 0.75,
    }
    assert consumed_from_status({"status": {"fairSharing": {"weightedShare": 0}}}) is None


def test_a_new_leader_restores_from_status_then_store_then_empty(tmp_path: Path) -> None:
    """lq-a has a status: restored from it. lq-b has none: rebuilt from the store's history
    (4 GPUs held for the last hour, half-life 1h: 4 x 0.5 = 2). Without a store lq-b starts
    empty. Every LocalQueue is sampled at once and gets a status to write."""
    url = f"sqlite:///{tmp_path}/store.db"
    engine = db.open_engine(url)
    db.upgrade(engine)
    now = dt.datetime(2026, 1, 1, 12)
    now_ms = int(now.replace(tzinfo=dt.UTC).timestamp() * 1000)
    hour_ago = (now - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    workload = {
        "metadata": {
            "uid": "u1",
            "namespace": "team-a",
            "name": "w",
            "creationTimestamp": hour_ago,
        },
        "spec": {"queueName": "lq-b"},
        "status": {
            "admission": {
                "clusterQueue": "cq",
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
        "admissionFairSharingStatus": {"consumedResources": {GPU: "3"}, "lastUpdate": hour_ago}
    }
    state.apply("LocalQueue", "ADDED", _lq("lq-a", {"fairSharing": {"weightedShare": 0, **stored}}))
    state.apply("LocalQueue", "ADDED", _lq("lq-b"))

    s = _scheduler()
    keeper = FairUsageKeeper(s, state, store_url=url)
    asyncio.run(keeper.prefetch(now_ms))  # before the first cycle, in a worker thread
    keeper.sync(now_ms)
    keeper.close()
    assert s.fair_usage is not None
    a, b = s.fair_usage.get("team-a/lq-a"), s.fair_usage.get("team-a/lq-b")
    assert a is not None and b is not None
    assert a.consumed == {GPU: 3.0} and a.last_update == now_ms  # from now, as Kueue
    assert b.consumed[GPU] == pytest.approx(2.0)
    assert status_of(b)["admissionFairSharingStatus"]["consumedResources"] == {GPU: "2"}
    # The one with the lower usage is served first.
    assert s.local_queue_usage("team-a/lq-b") < s.local_queue_usage("team-a/lq-a")

    plain = _scheduler()
    FairUsageKeeper(plain, state, store_url=None).sync(now_ms)
    assert plain.fair_usage is not None
    fresh = plain.fair_usage.get("team-a/lq-b")
    assert fresh is not None and fresh.consumed == {} and fresh.reported_at == now_ms


def test_a_store_that_does_not_answer_delays_the_first_cycle_only_by_the_bound() -> None:
    """The rebuild runs in a worker thread within a time bound: the event loop stays free
    (liveness, webhooks) and a LocalQueue the store did not answer for starts empty."""
    state = ClusterState()
    state.apply("LocalQueue", "ADDED", _lq("lq-b"))
    s = _scheduler()
    keeper = FairUsageKeeper(s, state, store_url="postgresql+psycopg://nobody@10.255.255.1/x")
    release = threading.Event()

    def hanging(key: str, now_ms: int) -> dict[str, float] | None:
        release.wait(10)
        return {GPU: 9.0}

    keeper._from_store = hanging  # type: ignore[method-assign]

    async def main() -> float:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        started = time.monotonic()
        await keeper.prefetch(0, timeout=0.3)
        waited = time.monotonic() - started
        task.cancel()
        release.set()  # let the worker thread end (asyncio.run waits for it on exit)
        assert ticks >= 10, "the event loop kept running while the store hung"
        return waited

    waited = asyncio.run(main())
    assert waited < 2.0
    keeper.sync(0)
    assert s.fair_usage is not None
    fresh = s.fair_usage.get("team-a/lq-b")
    assert fresh is not None and fresh.consumed == {}


def test_sampling_waits_for_the_interval() -> None:
    s = _scheduler()
    state = ClusterState()
    keeper = FairUsageKeeper(s, state)
    keeper.sync(0)
    assert s.fair_usage is not None
    s.restore_local_queue_usage("team-a/lq-a", {GPU: 4.0}, 0)
    keeper.sync(59_999)  # not due: the interval is 1 minute
    entry = s.fair_usage.get("team-a/lq-a")
    assert entry is not None and entry.consumed == {GPU: 4.0}
    keeper.sync(60_000)
    assert entry.consumed[GPU] == pytest.approx(4.0 * 0.5 ** (1 / 60))
    assert entry.reported_at == 60_000
