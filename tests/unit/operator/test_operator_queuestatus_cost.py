"""Queue status snapshots cost O(queues + workloads that changed): each ClusterQueue's
status is computed once per snapshot whatever the number of its LocalQueues, the
LocalQueue counts come from an index updated by the workloads that changed (never a scan of
every workload), an unchanged LocalQueue's status is not rebuilt, and the index always
agrees with a full count, including the core's own moves (admissions, preemptions,
evictions) that no Workload event announced yet.

Costs are counted (calls, dictionary reads), never timed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from phalanx.admission.model import (
    ClusterQueue,
    FlavorQuotas,
    LocalQueue,
    PodSet,
    Preemption,
    PreemptionPolicy,
    ResourceFlavor,
    ResourceGroup,
    Workload,
)
from phalanx.admission.records import Entry
from phalanx.admission.scheduler import Scheduler
from phalanx.operator.metrics import Metrics
from phalanx.operator.queuestatus import LocalQueueCounts, QueueStatus, local_queue_counts
from phalanx.operator.state import ClusterState
from phalanx.quotas.resources import ResourceQuota

CPU = 1000  # one CPU, in the core's units (millicores)


class CountingEntries(dict[str, Entry]):
    """The scheduler's workload map, counting full scans and single reads."""

    def __init__(self) -> None:
        super().__init__()
        self.scans = 0
        self.reads = 0

    def values(self) -> Any:
        self.scans += 1
        return super().values()

    def items(self) -> Any:
        self.scans += 1
        return super().items()

    def keys(self) -> Any:
        self.scans += 1
        return super().keys()

    def __iter__(self) -> Iterator[str]:
        self.scans += 1
        return super().__iter__()

    def get(self, key: str, default: Any = None) -> Any:
        self.reads += 1
        return super().get(key, default)

    def reset(self) -> None:
        self.scans = 0
        self.reads = 0


class World:
    """A ClusterState (what the operator sees) and a Scheduler (the core) kept in step, as
    the bridge keeps them; one ClusterQueue ``cq`` with ``local_queues`` LocalQueues."""

    def __init__(
        self, *, local_queues: int, cpus: int, preemption: bool = False, recount: float = 1e9
    ) -> None:
        self.state = ClusterState()
        self.scheduler = Scheduler()
        self.entries = CountingEntries()
        self.scheduler.entries = self.entries
        self.status = QueueStatus(
            None,  # type: ignore[arg-type]
            self.state,
            Metrics(),
            interval=1.0,
            recount_seconds=recount,
        )
        self.scheduler.apply_resource_flavor(ResourceFlavor("default"))
        self.scheduler.set_namespace("default", {})
        policy = PreemptionPolicy.LOWER_PRIORITY if preemption else PreemptionPolicy.NEVER
        self.scheduler.apply_cluster_queue(
            ClusterQueue(
                "cq",
                (
                    ResourceGroup(
                        ("cpu",),
                        (FlavorQuotas("default", {"cpu": ResourceQuota(cpus * CPU)}),),
                    ),
                ),
                preemption=Preemption(within_cluster_queue=policy),
            )
        )
        self.state.apply("ClusterQueue", None, cq_object())
        self.lqs = [f"lq{i:02d}" for i in range(local_queues)]
        for name in self.lqs:
            self.scheduler.apply_local_queue(LocalQueue("default", name, "cq"))
            self.state.apply("LocalQueue", None, lq_object(name))
        self.now = 0

    def submit(self, name: str, lq: str, *, priority: int = 0) -> None:
        self.state.apply("Workload", "ADDED", wl_object(name))
        self.scheduler.add_workload(
            Workload(
                "default",
                name,
                lq,
                (PodSet("main", 1, {"cpu": CPU}),),
                priority=priority,
                creation_time=self.now,
            )
        )

    def finish(self, name: str) -> None:
        self.state.apply("Workload", "DELETED", wl_object(name))
        self.scheduler.finish_workload(f"default/{name}")

    def cycle(self) -> Any:
        self.now += 1
        return self.scheduler.run_cycle(self.now)

    def snapshot(self) -> dict[tuple[str, str], dict[str, Any]]:
        self.status.snapshot(self.scheduler, {}, force=True)
        return self.status._snapshot

    def assert_counts_exact(self) -> None:
        expected = local_queue_counts(self.scheduler)
        got = {key: totals.as_dict() for key, totals in self.status.counts.totals.items()}
        assert got == expected
        snapshot = self.status._snapshot
        for name in self.lqs:
            status = snapshot[("LocalQueue", f"default/{name}")]
            mine = expected.get(f"default/{name}", {"pending": 0, "reserving": 0, "admitted": 0})
            assert status["pendingWorkloads"] == mine["pending"]
            assert status["reservingWorkloads"] == mine["reserving"]
            assert status["admittedWorkloads"] == mine["admitted"]


def cq_object() -> dict[str, Any]:
    return {
        "metadata": {"name": "cq"},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu"],
                    "flavors": [{"name": "default", "resources": [{"name": "cpu"}]}],
                }
            ],
        },
    }


def lq_object(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"}, "spec": {"clusterQueue": "cq"}}


def wl_object(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"}}


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> Callable[[], int]:
    calls = 0
    real = getattr(owner, name)

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return lambda: calls


def test_each_cluster_queue_status_is_computed_once_per_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(local_queues=50, cpus=10)
    for i in range(100):
        world.submit(f"w{i}", world.lqs[i % 50])
    world.cycle()
    computed = count_calls(monkeypatch, world.scheduler, "cluster_queue_status")
    snapshot = world.snapshot()
    assert computed() == 1  # not once more per LocalQueue (50) and for the metrics
    status = snapshot[("ClusterQueue", "cq")]
    assert status["admittedWorkloads"] == 10 and status["pendingWorkloads"] == 90
    world.assert_counts_exact()


def test_a_snapshot_reads_only_the_workloads_that_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(local_queues=50, cpus=100)
    for i in range(5000):
        world.submit(f"w{i:04d}", world.lqs[i % 50])
    world.cycle()  # admits 100
    world.snapshot()  # the first one counts everything
    world.snapshot()  # and the next looks once more at what the first one saw arrive
    world.assert_counts_exact()

    world.entries.reset()
    examined = count_calls(monkeypatch, LocalQueueCounts, "_examine")
    for i in range(3):
        world.finish(f"w{i:04d}")
    world.cycle()  # admits 3 more: the core's own move, no Workload event yet
    world.entries.reset()
    world.snapshot()

    assert world.entries.scans == 0  # no pass over the 5,000 workloads
    # 3 finished (their events, and their leaving the admitted set), 3 admitted.
    assert examined() == 6
    assert world.entries.reads == 6
    world.assert_counts_exact()


def test_only_the_local_queues_that_changed_are_rebuilt(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(local_queues=50, cpus=1000)
    for i in range(500):
        world.submit(f"w{i:03d}", world.lqs[i % 50])
    world.cycle()
    world.snapshot()
    world.snapshot()
    rebuilt = count_calls(monkeypatch, world.status, "_local_queue_status")
    world.snapshot()
    assert rebuilt() == 0
    world.submit("late", "lq07")
    world.snapshot()
    assert rebuilt() == 1
    world.assert_counts_exact()


def test_counts_stay_exact_through_preemptions_and_evictions() -> None:
    world = World(local_queues=5, cpus=10, preemption=True)
    for i in range(10):
        world.submit(f"low{i}", world.lqs[i % 5])
    world.cycle()
    world.snapshot()
    world.assert_counts_exact()
    for i in range(4):
        world.submit(f"high{i}", world.lqs[(i + 1) % 5], priority=10)
    result = world.cycle()  # claims and evictions, decided by the core alone
    assert result.preempted
    world.snapshot()
    world.assert_counts_exact()
    for preempt in result.preempted:
        for victim in preempt.victims:
            world.scheduler.workload_evicted(victim.workload, now=world.now)
    world.snapshot()  # victims released, no Workload event
    world.assert_counts_exact()
    world.cycle()  # the preemptors are admitted
    world.snapshot()
    world.assert_counts_exact()
    for i in range(10):
        world.finish(f"low{i}")
    world.cycle()
    world.snapshot()
    world.assert_counts_exact()


def test_an_event_seen_before_the_core_has_it_is_looked_at_again() -> None:
    world = World(local_queues=2, cpus=10)
    world.snapshot()
    # The watch event arrives while a cycle runs; the core gets it at the next sync.
    world.state.apply("Workload", "ADDED", wl_object("early"))
    world.snapshot()
    assert world.status.counts.get("default/lq00") is None
    world.scheduler.add_workload(Workload("default", "early", "lq00", (PodSet("m", 1, {}),)))
    world.snapshot()
    totals = world.status.counts.get("default/lq00")
    assert totals is not None and totals.pending == 1
    world.assert_counts_exact()


def test_the_periodic_recount_repairs_what_no_event_announced() -> None:
    counts = LocalQueueCounts(recount_seconds=60.0)
    world = World(local_queues=1, cpus=10)
    counts.refresh(world.scheduler, now=0.0)
    # A workload the index was never told of (no event, not admitted).
    world.scheduler.add_workload(Workload("default", "quiet", "lq00", (PodSet("m", 1, {}),)))
    counts.refresh(world.scheduler, now=30.0)
    assert counts.get("default/lq00") is None
    counts.refresh(world.scheduler, now=61.0)
    totals = counts.get("default/lq00")
    assert totals is not None and totals.pending == 1


def test_emptied_local_queues_leave_no_totals_behind() -> None:
    world = World(local_queues=3, cpus=10)
    for i in range(6):
        world.submit(f"w{i}", world.lqs[i % 3])
    world.cycle()
    world.snapshot()
    for i in range(6):
        world.finish(f"w{i}")
    world.snapshot()
    world.snapshot()
    assert world.status.counts.totals == {}
    assert world.status.counts._counted == {}


def test_events_nobody_looks_at_are_bounded() -> None:
    """A standby replica's informers deliver events; its loop never refreshes the counts."""
    counts = LocalQueueCounts(max_events=100)
    for i in range(10_000):
        counts.workload_changed(f"default/w{i}")
    assert len(counts._events) <= 100
    world = World(local_queues=1, cpus=10)
    world.submit("w", "lq00")
    counts.refresh(world.scheduler, now=0.0)
    counts.refresh(world.scheduler, now=1.0)
    assert counts._recounts_due == 0
    totals = counts.get("default/lq00")
    assert totals is not None and totals.pending == 1
