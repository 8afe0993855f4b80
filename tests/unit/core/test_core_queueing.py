"""Queues: priority and FIFO, StrictFIFO vs BestEffortFIFO, parking and waking, routing
through LocalQueues and namespace selectors, stop policies, requeue backoff.

From Kueue's docs: concepts/cluster_queue.md ("Queueing strategy", "Namespace selector",
"StopPolicy"), concepts/local_queue.md, concepts/workload_priority_class.md, and the
waitForPodsReady requeuing strategy (exponential backoff).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from core_builders import (
    Cluster,
    MakeClusterQueue,
    MakeFlavorQuotas,
    MakeWorkload,
    admitted_names,
)

from phalanx.admission.decisions import EvictionReason, PendingReason
from phalanx.admission.model import (
    LabelSelector,
    LocalQueue,
    SelectorRequirement,
    StopPolicy,
    WorkloadPriorityClass,
)
from phalanx.admission.records import Phase
from phalanx.admission.scheduler import SchedulerConfig


def queue(name: str = "cq", nominal: str = "4", cohort: str | None = None) -> MakeClusterQueue:
    q = MakeClusterQueue(name).resource_group(MakeFlavorQuotas("default").resource("cpu", nominal))
    return q.cohort(cohort) if cohort else q


def wl(name: str, cpu: str, *, priority: int = 0, created: int = 0, to: str = "cq") -> MakeWorkload:
    return MakeWorkload(name).queue(to).request("cpu", cpu).priority(priority).created(created)


@dataclass
class OrderCase:
    name: str
    strict: bool
    pending: list[MakeWorkload]
    admitted: list[str]


ORDER_CASES = [
    OrderCase(
        "higher priority first",
        strict=False,
        pending=[wl("low", "3", priority=1, created=1), wl("high", "3", priority=9, created=2)],
        admitted=["high"],
    ),
    OrderCase(
        "FIFO by creation time within a priority",
        strict=False,
        pending=[wl("second", "3", created=2), wl("first", "3", created=1)],
        admitted=["first"],
    ),
    OrderCase(
        "BestEffortFIFO: a head that does not fit lets a smaller one pass",
        strict=False,
        pending=[wl("big", "5", created=1), wl("small", "2", created=2)],
        admitted=["small"],
    ),
    OrderCase(
        "StrictFIFO: a head that does not fit blocks the queue",
        strict=True,
        pending=[wl("big", "5", created=1), wl("small", "2", created=2)],
        admitted=[],
    ),
    OrderCase(
        "StrictFIFO admits in order while things fit",
        strict=True,
        pending=[wl("a", "2", created=1), wl("b", "2", created=2), wl("c", "1", created=3)],
        admitted=["a", "b"],
    ),
    OrderCase(
        "a deep queue drains within one cycle",
        strict=False,
        pending=[wl(f"w{i}", "1", created=i) for i in range(6)],
        admitted=["w0", "w1", "w2", "w3"],
    ),
]


@pytest.mark.parametrize("case", ORDER_CASES, ids=[c.name for c in ORDER_CASES])
def test_queue_order(case: OrderCase) -> None:
    q = queue()
    if case.strict:
        q.strict_fifo()
    cluster = Cluster(queues=[q.obj()])
    result = cluster.submit(*case.pending).cycle()
    assert admitted_names(result) == case.admitted


def test_strict_fifo_tries_a_new_higher_priority_head() -> None:
    cluster = Cluster(queues=[queue().strict_fifo().obj()])
    cluster.submit(wl("big", "5", created=1)).cycle()
    result = cluster.submit(wl("urgent", "2", priority=5, created=9)).cycle()
    assert admitted_names(result) == ["urgent"]


def test_parked_workloads_are_not_retried_until_something_changes() -> None:
    cluster = Cluster(queues=[queue().obj()])
    cluster.admit_all(wl("running", "4"))
    first = cluster.submit(wl("waiting", "2", created=1), wl("same", "2", created=2)).cycle()
    assert first.admitted == ()
    assert first.attempts == 1  # "same" has the same shape: parked with "waiting"
    idle = cluster.cycle()
    assert idle.attempts == 0
    cluster.scheduler.finish_workload("default/running")
    assert admitted_names(cluster.cycle()) == ["waiting", "same"]


def test_quota_freed_elsewhere_in_the_cohort_wakes_parked_workloads() -> None:
    cluster = Cluster(queues=[queue("a", "2", "c").obj(), queue("b", "2", "c").obj()])
    cluster.admit_all(wl("b1", "4", to="b"))
    assert cluster.submit(wl("a1", "2", to="a")).cycle().admitted == ()
    cluster.scheduler.finish_workload("default/b1")
    assert admitted_names(cluster.cycle()) == ["a1"]


def test_a_quota_increase_wakes_parked_workloads() -> None:
    cluster = Cluster(queues=[queue(nominal="2").obj()])
    assert cluster.submit(wl("w", "3")).cycle().admitted == ()
    cluster.scheduler.apply_cluster_queue(queue(nominal="4").obj())
    assert admitted_names(cluster.cycle()) == ["w"]


@dataclass
class RouteCase:
    name: str
    selector: LabelSelector | None
    labels: dict[str, str]
    admitted: bool


ROUTE_CASES = [
    RouteCase("empty selector matches every namespace", LabelSelector(), {}, True),
    RouteCase("null selector matches no namespace", None, {"team": "a"}, False),
    RouteCase("matchLabels match", LabelSelector({"team": "a"}), {"team": "a"}, True),
    RouteCase("matchLabels mismatch", LabelSelector({"team": "a"}), {"team": "b"}, False),
    RouteCase(
        "matchExpressions In",
        LabelSelector(match_expressions=(SelectorRequirement("team", "In", ("a", "b")),)),
        {"team": "b"},
        True,
    ),
    RouteCase(
        "matchExpressions DoesNotExist",
        LabelSelector(match_expressions=(SelectorRequirement("team", "DoesNotExist"),)),
        {"team": "b"},
        False,
    ),
]


@pytest.mark.parametrize("case", ROUTE_CASES, ids=[c.name for c in ROUTE_CASES])
def test_namespace_selector(case: RouteCase) -> None:
    cluster = Cluster(queues=[queue().namespace_selector(case.selector).obj()])
    cluster.scheduler.set_namespace("default", case.labels)
    result = cluster.submit(wl("w", "1")).cycle()
    assert (admitted_names(result) == ["w"]) == case.admitted
    if not case.admitted:
        explanation = cluster.scheduler.explain("default/w")
        assert explanation is not None
        assert explanation.reason == PendingReason.NAMESPACE_MISMATCH
        assert "namespaceSelector" in explanation.message


def test_relabelled_namespace_is_routed_again() -> None:
    cluster = Cluster(queues=[queue().namespace_selector(LabelSelector({"team": "a"})).obj()])
    assert cluster.submit(wl("w", "1")).cycle().admitted == ()
    cluster.scheduler.set_namespace("default", {"team": "a"})
    assert admitted_names(cluster.cycle()) == ["w"]


def test_missing_local_queue_then_created() -> None:
    cluster = Cluster(queues=[queue().obj()])
    cluster.submit(MakeWorkload("w").queue("nope").request("cpu", "1")).cycle()
    explanation = cluster.scheduler.explain("default/w")
    assert explanation is not None and explanation.reason == PendingReason.LOCAL_QUEUE_NOT_FOUND
    cluster.scheduler.apply_local_queue(LocalQueue("default", "nope", "cq"))
    assert admitted_names(cluster.cycle()) == ["w"]


def test_local_queue_pointing_at_a_missing_cluster_queue() -> None:
    cluster = Cluster(queues=[queue().obj()])
    cluster.scheduler.apply_local_queue(LocalQueue("default", "lost", "ghost"))
    cluster.submit(MakeWorkload("w").queue("lost").request("cpu", "1")).cycle()
    explanation = cluster.scheduler.explain("default/w")
    assert explanation is not None
    assert explanation.reason == PendingReason.CLUSTER_QUEUE_NOT_FOUND


def test_cluster_queue_hold_stops_admission_but_keeps_running_work() -> None:
    cluster = Cluster(queues=[queue().obj()])
    cluster.admit_all(wl("running", "2"))
    cluster.scheduler.apply_cluster_queue(queue().stop(StopPolicy.HOLD).obj())
    result = cluster.submit(wl("new", "1")).cycle()
    assert result.admitted == () and result.evicted == ()
    assert cluster.phase("running") == Phase.ADMITTED
    explanation = cluster.scheduler.explain("default/new")
    assert explanation is not None and explanation.reason == PendingReason.CLUSTER_QUEUE_INACTIVE
    cluster.scheduler.apply_cluster_queue(queue().obj())
    assert admitted_names(cluster.cycle()) == ["new"]


def test_cluster_queue_hold_and_drain_evicts_admitted_work() -> None:
    cluster = Cluster(queues=[queue().obj()])
    cluster.admit_all(wl("running", "2"))
    cluster.scheduler.apply_cluster_queue(queue().stop(StopPolicy.HOLD_AND_DRAIN).obj())
    result = cluster.cycle()
    assert [(e.workload, e.reason) for e in result.evicted] == [
        ("default/running", EvictionReason.CLUSTER_QUEUE_STOPPED)
    ]
    assert cluster.usage("cq") == 2000  # until the operator reports the pods gone
    cluster.scheduler.workload_evicted("default/running", now=cluster.now)
    assert cluster.usage("cq") == 0
    assert cluster.phase("running") == Phase.PENDING
    assert cluster.cycle().admitted == ()


def test_local_queue_hold_affects_only_that_local_queue() -> None:
    cluster = Cluster(queues=[queue().obj()])
    cluster.scheduler.apply_local_queue(LocalQueue("default", "other", "cq"))
    cluster.scheduler.apply_local_queue(LocalQueue("default", "cq", "cq", StopPolicy.HOLD))
    result = cluster.submit(wl("held", "1"), wl("free", "1", to="other")).cycle()
    assert admitted_names(result) == ["free"]
    explanation = cluster.scheduler.explain("default/held")
    assert explanation is not None and explanation.reason == PendingReason.LOCAL_QUEUE_STOPPED
    cluster.scheduler.apply_local_queue(LocalQueue("default", "cq", "cq"))
    assert admitted_names(cluster.cycle()) == ["held"]


def test_local_queue_hold_and_drain_evicts_its_workloads() -> None:
    cluster = Cluster(queues=[queue().obj()])
    cluster.admit_all(wl("running", "1"))
    cluster.scheduler.apply_local_queue(
        LocalQueue("default", "cq", "cq", StopPolicy.HOLD_AND_DRAIN)
    )
    result = cluster.cycle()
    assert [e.reason for e in result.evicted] == [EvictionReason.LOCAL_QUEUE_STOPPED]


def test_inactive_workload_is_held_and_deactivating_an_admitted_one_evicts_it() -> None:
    cluster = Cluster(queues=[queue().obj()])
    result = cluster.submit(wl("off", "1").inactive()).cycle()
    assert result.admitted == ()
    explanation = cluster.scheduler.explain("default/off")
    assert explanation is not None and explanation.reason == PendingReason.INACTIVE_WORKLOAD
    cluster.admit_all(wl("on", "1"))
    cluster.submit(wl("on", "1").inactive())
    evicted = cluster.cycle().evicted
    assert [(e.workload, e.reason) for e in evicted] == [("default/on", EvictionReason.DEACTIVATED)]


def test_priority_class_value_is_used_when_priority_is_unset() -> None:
    cluster = Cluster(queues=[queue().obj()])
    cluster.scheduler.apply_priority_class(WorkloadPriorityClass("urgent", 1000))
    result = cluster.submit(
        MakeWorkload("plain").queue("cq").request("cpu", "3").created(1),
        MakeWorkload("classy").queue("cq").request("cpu", "3").created(2).priority_class("urgent"),
    ).cycle()
    assert admitted_names(result) == ["classy"]


@pytest.mark.parametrize(("evictions", "delay"), [(1, 1000), (2, 2000), (3, 4000), (6, 5000)])
def test_requeue_backoff_is_exponential_and_capped(evictions: int, delay: int) -> None:
    config = SchedulerConfig(backoff_base_ms=1000, backoff_max_ms=5000)
    cluster = Cluster(queues=[queue().obj()], config=config)
    cluster.admit_all(wl("w", "1"))
    for n in range(evictions):
        entry = cluster.scheduler.entries["default/w"]
        if entry.phase != Phase.ADMITTED:
            cluster.now = entry.requeue_at
            assert admitted_names(cluster.cycle(0)) == ["w"]
        evicted_at = cluster.now
        # What the operator writes as requeueState before the core releases must match.
        predicted = cluster.scheduler.next_requeue("default/w", now=evicted_at)
        cluster.scheduler.workload_evicted("default/w", now=evicted_at, backoff=True)
        entry = cluster.scheduler.entries["default/w"]
        assert predicted == (entry.requeue_count, entry.requeue_at) == (n + 1, predicted[1])
        if n == evictions - 1:
            explanation = cluster.scheduler.explain("default/w")
            assert explanation is not None and explanation.reason == PendingReason.BACKOFF
            assert cluster.cycle(delay - 1).admitted == ()
            assert admitted_names(cluster.cycle(1)) == ["w"]
