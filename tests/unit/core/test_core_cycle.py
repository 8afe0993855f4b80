"""The cycle: ordering across ClusterQueues, explanations, restarts, determinism, fair sharing.

From Kueue's docs: concepts/cluster_queue.md (a queue within its nominal quota is served
before one that borrows), concepts/preemption.md ("Fair Sharing": share value, admission
order, preemption strategies) and the scheduler's cycle (nominate, order, admit).
"""

from __future__ import annotations

import pytest
from core_builders import (
    ANY,
    LOWER,
    Cluster,
    MakeClusterQueue,
    MakeFlavorQuotas,
    MakeWorkload,
    admitted_names,
    flavor,
    victim_names,
)

from phalanx.admission.decisions import FitMode, PendingReason, PreemptionReason
from phalanx.admission.model import Admission, PodSetAssignment
from phalanx.admission.records import Phase
from phalanx.admission.scheduler import SchedulerConfig


def queue(name: str, nominal: str, cohort: str | None = "c") -> MakeClusterQueue:
    q = MakeClusterQueue(name).resource_group(MakeFlavorQuotas("default").resource("cpu", nominal))
    return q.cohort(cohort) if cohort else q


def wl(name: str, to: str, cpu: str, priority: int = 0, created: int = 0) -> MakeWorkload:
    return MakeWorkload(name).queue(to).request("cpu", cpu).priority(priority).created(created)


@pytest.mark.parametrize(
    ("a_priority", "b_priority", "first"),
    [
        (100, 0, "b1"),  # b fits its nominal quota, a would borrow: b first despite priority
        (0, 100, "b1"),
    ],
)
def test_a_queue_within_nominal_is_served_before_a_borrower(
    a_priority: int, b_priority: int, first: str
) -> None:
    cluster = Cluster(queues=[queue("a", "4").obj(), queue("b", "4").obj()])
    cluster.admit_all(wl("a0", "a", "4"))
    result = cluster.submit(
        wl("a1", "a", "4", a_priority, created=1), wl("b1", "b", "4", b_priority, created=2)
    ).cycle()
    assert admitted_names(result) == [first]


def test_between_borrowers_priority_decides() -> None:
    cluster = Cluster(
        queues=[queue("a", "2").obj(), queue("b", "2").obj(), queue("lender", "4").obj()]
    )
    cluster.admit_all(wl("a0", "a", "2"), wl("b0", "b", "2"))
    result = cluster.submit(wl("a1", "a", "4", 1, created=1), wl("b1", "b", "4", 9, created=2))
    assert admitted_names(result.cycle()) == ["b1"]


def test_many_queues_admit_in_one_cycle_and_fill_the_cohort() -> None:
    cluster = Cluster(queues=[queue(f"q{i}", "2").obj() for i in range(4)])
    for i in range(4):
        cluster.submit(*(wl(f"q{i}-{j}", f"q{i}", "1", created=j) for j in range(4)))
    result = cluster.cycle()
    assert len(result.admitted) == 8
    assert sum(cluster.usage(f"q{i}") for i in range(4)) == 8000


def test_explanation_lists_flavors_resources_and_blockers() -> None:
    q = (
        MakeClusterQueue("cq")
        .cohort("c")
        .resource_group(
            MakeFlavorQuotas("spot").resource("cpu", "2"),
            MakeFlavorQuotas("on-demand").resource("cpu", "1"),
        )
    )
    lender = (
        MakeClusterQueue("lender")
        .cohort("c")
        .resource_group(MakeFlavorQuotas("spot").resource("cpu", "1"))
    )
    cluster = Cluster(flavors=[flavor("spot"), flavor("on-demand")], queues=[q.obj(), lender.obj()])
    cluster.admit_all(wl("holder", "cq", "2"))
    cluster.submit(wl("w", "cq", "3")).cycle()
    explanation = cluster.scheduler.explain("default/w")
    assert explanation is not None
    assert explanation.reason == PendingReason.WAITING_FOR_QUOTA
    assert "\n" not in explanation.message and "spot" in explanation.message
    attempts = explanation.pod_sets[0].attempts
    assert [a.flavor for a in attempts] == ["spot", "on-demand"]
    spot = attempts[0].resources[0]
    assert (spot.requested, spot.nominal, spot.used) == (3000, 2000, 2000)
    assert spot.available == 1000 and spot.borrowable == 1000
    assert attempts[1].mode == FitMode.NO_FIT
    assert "default/holder" in explanation.blocking
    assert "max" in explanation.details() and "on-demand" in explanation.details()


def test_preempt_explanation_names_the_victims_to_be() -> None:
    cluster = Cluster(queues=[queue("a", "4", None).preemption(within=LOWER).obj()])
    cluster.admit_all(wl("low", "a", "4", 0))
    result = cluster.submit(wl("high", "a", "4", 9)).cycle()
    explanation = result.pending["default/high"]
    assert explanation.reason == PendingReason.WAITING_FOR_PREEMPTED_WORKLOADS
    assert "1 workload" in explanation.message


def test_finish_returns_usage_to_where_it_was() -> None:
    cluster = Cluster(queues=[queue("a", "4").obj(), queue("b", "4").obj()])
    cluster.admit_all(wl("b0", "b", "3"))
    before = {n: dict(cluster.scheduler.tree.cluster_queue(n).root.usage) for n in ("a", "b")}
    cluster.admit_all(wl("a1", "a", "5"))
    cluster.scheduler.finish_workload("default/a1")
    after = {n: dict(cluster.scheduler.tree.cluster_queue(n).root.usage) for n in ("a", "b")}
    assert after == before
    assert cluster.usage("a") == 0 and cluster.usage("b") == 3000


def test_restored_admission_counts_without_a_cycle_and_is_not_admitted_twice() -> None:
    cluster = Cluster(queues=[queue("a", "4", None).obj()])
    workload = wl("old", "a", "3").obj()
    admission = Admission("a", (PodSetAssignment("main", 1, {"cpu": "default"}, {"cpu": 3000}),))
    cluster.scheduler.restore_admitted(workload, admission)
    assert cluster.usage("a") == 3000
    assert cluster.phase("old") == Phase.ADMITTED
    result = cluster.submit(wl("new", "a", "2")).cycle()
    assert result.admitted == ()
    cluster.scheduler.finish_workload("default/old")
    assert admitted_names(cluster.cycle()) == ["new"]


def test_restore_before_the_queue_exists_is_applied_when_it_appears() -> None:
    cluster = Cluster(queues=[])
    admission = Admission("late", (PodSetAssignment("main", 1, {"cpu": "default"}, {"cpu": 1000}),))
    cluster.scheduler.restore_admitted(wl("w", "late", "1").obj(), admission)
    cluster.scheduler.apply_cluster_queue(queue("late", "4", None).obj())
    assert cluster.usage("late") == 1000


def _scenario() -> list[tuple[str, object]]:
    cluster = Cluster(
        queues=[
            queue("a", "4").preemption(within=LOWER, reclaim=ANY).obj(),
            queue("b", "4").preemption(within=LOWER, reclaim=ANY).obj(),
        ]
    )
    trace: list[tuple[str, object]] = []
    for step in range(12):
        cluster.submit(
            wl(f"a{step}", "a", str(1 + step % 3), priority=step % 4, created=step),
            wl(f"b{step}", "b", str(1 + (step * 7) % 4), priority=(step * 3) % 5, created=step),
        )
        result = cluster.cycle()
        trace.append(("cycle", result))
        for p in result.preempted:
            for v in p.victims:
                cluster.scheduler.workload_evicted(v.workload, now=cluster.now)
        if step % 3 == 2:
            for admit in result.admitted:
                cluster.scheduler.finish_workload(admit.workload)
    return trace


def test_same_input_same_decisions() -> None:
    assert _scenario() == _scenario()


def test_fair_sharing_orders_by_dominant_resource_share() -> None:
    config = SchedulerConfig(fair_sharing=True)
    cluster = Cluster(
        queues=[queue("a", "2").obj(), queue("b", "2").obj(), queue("lender", "6").obj()],
        config=config,
    )
    cluster.admit_all(wl("a0", "a", "4"))  # a borrows 2 of 6 lendable
    result = cluster.submit(wl("a1", "a", "2", 9, created=1), wl("b1", "b", "4", 0, created=2))
    # b (share after admission 2/6) goes before a (4/6) although a has higher priority.
    assert admitted_names(result.cycle()) == ["b1", "a1"]


def test_fair_sharing_weight_changes_the_order() -> None:
    config = SchedulerConfig(fair_sharing=True)
    cluster = Cluster(
        queues=[
            queue("a", "2").weight(3000).obj(),
            queue("b", "2").obj(),
            queue("lender", "4").obj(),
        ],
        config=config,
    )
    cluster.admit_all(wl("a0", "a", "4"))
    result = cluster.submit(wl("a1", "a", "2", created=1), wl("b1", "b", "4", created=2))
    # a's share (4 borrowed of 4, weight 3) is below b's (2 of 4, weight 1).
    assert admitted_names(result.cycle())[0] == "a1"


def test_fair_sharing_preemption_evens_out_borrowing() -> None:
    config = SchedulerConfig(fair_sharing=True)
    cluster = Cluster(
        queues=[
            queue("a", "2").preemption(reclaim=ANY).obj(),
            queue("b", "2").preemption(reclaim=ANY).obj(),
            queue("lender", "4").obj(),
        ],
        config=config,
    )
    cluster.admit_all(*(wl(f"a{i}", "a", "1", created=i) for i in range(6)))
    result = cluster.submit(wl("b1", "b", "4", created=10)).cycle()
    victims = victim_names(result)
    assert len(victims) == 2 and all(v.startswith("a") for v in victims)
    reasons = {v.reason for p in result.preempted for v in p.victims}
    assert reasons == {PreemptionReason.IN_COHORT_FAIR_SHARING}
    after = cluster.complete_preemptions(result)
    assert admitted_names(after) == ["b1"]
    assert cluster.usage("a") == cluster.usage("b") == 4000
