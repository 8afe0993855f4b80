"""``explain`` names who holds what a workload needs, and ``what-if`` answers what the next
cycle would decide, from the same code paths as the cycle, without changing the core."""

from __future__ import annotations

from typing import Any

from core_builders import (
    ANY,
    LOWER,
    Cluster,
    MakeClusterQueue,
    MakeFlavorQuotas,
    MakePodSet,
    MakeWorkload,
    victim_names,
)
from test_core_topology import cluster as tas_cluster
from test_core_topology import gang

from phalanx.admission import insight
from phalanx.admission.decisions import PendingReason
from phalanx.admission.model import LocalQueue
from phalanx.admission.scheduler import Scheduler
from phalanx.admission.whatif import Verdict


def team(name: str, nominal: str, *, reclaim: Any = None, within: Any = None) -> Any:
    queue = (
        MakeClusterQueue(name)
        .cohort("c")
        .resource_group(MakeFlavorQuotas("default").resource("cpu", nominal))
    )
    kwargs = {}
    if reclaim is not None:
        kwargs["reclaim"] = reclaim
    if within is not None:
        kwargs["within"] = within
    return queue.preemption(**kwargs).obj()


def wl(name: str, queue: str, cpu: str, priority: int = 0, created: int = 0) -> MakeWorkload:
    return MakeWorkload(name).queue(queue).request("cpu", cpu).priority(priority).created(created)


def borrowing_cluster(reclaim: Any = None) -> Cluster:
    """team-b runs 12 CPUs on a nominal 8, borrowing 4 of team-a's; team-a has nothing."""
    c = Cluster(queues=[team("team-a", "8", reclaim=reclaim), team("team-b", "8")])
    c.admit_all(wl("b1", "team-b", "6"), wl("b2", "team-b", "6"))
    return c


def fingerprint(s: Scheduler) -> Any:
    """Everything a decision depends on: quota usage, workload records, queue order, holds."""
    usage = {node.name: dict(node.usage) for root in s.tree.roots() for node in root.walk()}
    entries = {
        k: (e.phase, e.where, e.cluster_queue, e.explanation, dict(e.usage))
        for k, e in s.entries.items()
    }
    queues = {name: [e.key for e in st.queue.entries()] for name, st in s.queues.items()}
    return (usage, entries, queues, sorted(s.claims), sorted(s.active), s._seq, s.cycle_number)


# -- explain --------------------------------------------------------------------------------------


def test_explain_names_the_borrower_and_how_much_is_missing() -> None:
    c = borrowing_cluster()
    c.submit(wl("a1", "team-a", "8"))
    c.cycle()
    report = c.scheduler.explain_report("default/a1")
    assert report is not None
    assert report.explanation.reason == PendingReason.WAITING_FOR_QUOTA
    assert [(s.flavor, s.resource, s.missing) for s in report.shortfalls] == [
        ("default", "cpu", 4000)
    ]
    assert [(b.cluster_queue, b.borrowed) for b in report.borrowers] == [("team-b", 4000)]
    text = report.text()
    assert "Needs 4 more cpu in flavor default" in text
    assert "ClusterQueue team-b borrows 4 cpu in flavor default" in text
    assert "reclaimWithinCohort: Never" in text
    assert report.position is not None and report.position.cluster_queue == 0


def test_explain_of_a_request_beyond_the_cohort_says_to_shrink_it() -> None:
    c = borrowing_cluster()
    c.submit(wl("a1", "team-a", "8"))
    # Not tried yet: the report still has its position, and no numbers to put on it.
    report = c.scheduler.explain_report("default/a1")
    assert report is not None and report.shortfalls == ()
    assert report.position is not None
    c.scheduler.add_workload(wl("a0", "team-a", "20").obj())  # the cohort has 16
    c.cycle()
    report = c.scheduler.explain_report("default/a0")
    assert report is not None and report.explanation.reason == PendingReason.EXCEEDS_MAX_QUOTA
    assert "raise the quota or shrink the request" in report.text()


def test_explain_names_the_topology_shortage_with_the_best_domain() -> None:
    s = tas_cluster()
    s.add_workload(gang("wide", 3).obj())  # 3 nodes' worth; racks have 2
    s.run_cycle(1)
    report = s.explain_report("default/wide")
    assert report is not None
    assert report.explanation.reason == PendingReason.TOPOLOGY_PLACEMENT_FAILED
    assert "largest free: rack rack-0 fits 2" in report.text()
    assert any("topology domain" in hint for hint in report.hints)


def test_explain_report_of_an_admitted_workload_is_none() -> None:
    c = borrowing_cluster()
    assert c.scheduler.explain_report("default/b1") is None


# -- what-if --------------------------------------------------------------------------------------


def test_what_if_admits_now_with_flavors_and_changes_nothing() -> None:
    c = borrowing_cluster()
    before = fingerprint(c.scheduler)
    answer = c.scheduler.what_if(wl("a1", "team-a", "4").obj())
    assert fingerprint(c.scheduler) == before
    assert answer.verdict == Verdict.ADMIT
    assert answer.cluster_queue == "team-a"
    assert answer.admission is not None
    assert dict(answer.admission.pod_sets[0].flavors) == {"cpu": "default"}
    assert answer.ahead == 0
    # And the real cycle agrees.
    c.submit(wl("a1", "team-a", "4"))
    assert [a.workload for a in c.cycle().admitted] == ["default/a1"]


def test_what_if_names_exactly_the_victims_the_cycle_preempts() -> None:
    c = borrowing_cluster(reclaim=ANY)
    c.admit_all(wl("a-low", "team-a", "2"))
    before = fingerprint(c.scheduler)
    incoming = wl("a1", "team-a", "6", priority=5)
    answer = c.scheduler.what_if(incoming.obj())
    assert fingerprint(c.scheduler) == before
    assert answer.verdict == Verdict.PREEMPT
    predicted = sorted(v.workload.split("/", 1)[1] for v in answer.victims)
    assert predicted  # team-b borrows 4 of team-a's 8: one of its 6-CPU workloads goes
    c.submit(incoming)
    assert victim_names(c.cycle()) == predicted


def test_what_if_within_cluster_queue_victims_match_the_cycle() -> None:
    c = Cluster(queues=[team("solo", "6", within=LOWER)])
    c.admit_all(wl("p1", "solo", "2", 1), wl("p2", "solo", "2", 2), wl("p3", "solo", "2", 3))
    answer = c.scheduler.what_if(wl("high", "solo", "3", 10).obj())
    assert sorted(v.workload for v in answer.victims) == ["default/p1", "default/p2"]
    c.submit(wl("high", "solo", "3", 10))
    assert victim_names(c.cycle()) == ["p1", "p2"]


def test_what_if_position_behind_higher_priority_and_older_workloads() -> None:
    c = Cluster(queues=[team("solo", "4")])
    c.admit_all(wl("running", "solo", "4"))
    c.submit(
        wl("high", "solo", "4", priority=9, created=1),
        wl("old", "solo", "4", priority=0, created=1),
        wl("low", "solo", "4", priority=-1, created=1),
    )
    c.cycle()
    before = fingerprint(c.scheduler)
    answer = c.scheduler.what_if(wl("new", "solo", "4", created=5).obj())
    assert fingerprint(c.scheduler) == before
    assert answer.verdict == Verdict.PENDING
    assert answer.position is not None and answer.position.cluster_queue == 2
    assert answer.position.local_queue == 2
    assert answer.explanation is not None
    assert answer.explanation.reason == PendingReason.WAITING_FOR_QUOTA


def test_what_if_held_without_a_local_queue() -> None:
    c = Cluster(queues=[team("solo", "4")])
    answer = c.scheduler.what_if(wl("x", "nowhere", "1").obj())
    assert answer.verdict == Verdict.HELD
    assert "LocalQueue nowhere doesn't exist" in answer.message


def test_what_if_on_a_topology_flavor_places_without_reserving() -> None:
    s = tas_cluster()
    before = fingerprint(s)
    answer = s.what_if(gang("fits", 2).obj())
    assert answer.verdict == Verdict.ADMIT
    assert answer.admission is not None
    assert answer.admission.pod_sets[0].topology_assignment is not None
    assert fingerprint(s) == before
    # Nothing was reserved: a gang taking all of both racks still fits for real.
    s.add_workload(gang("all", 4, required=False).obj())
    assert [a.workload for a in s.run_cycle(1).admitted] == ["default/all"]


def test_positions_counted_without_sorting_match_the_queue_order() -> None:
    c = Cluster(queues=[team("solo", "1")])
    c.scheduler.apply_local_queue(LocalQueue("default", "other", "solo"))
    c.admit_all(wl("running", "solo", "1"))
    for i in range(12):
        queue = "solo" if i % 3 else "other"
        c.submit(wl(f"w{i}", queue, "1", priority=i % 4, created=10 - i % 5))
    c.cycle()
    order = insight.pending_order(c.scheduler, "solo")
    assert order is not None and len(order) == 12
    seen: dict[str, int] = {}
    for index, entry in enumerate(order):
        position = insight.position_of(c.scheduler, entry)
        assert position == insight.Position(index, seen.get(entry.local_queue, 0)), entry.key
        seen[entry.local_queue] = seen.get(entry.local_queue, 0) + 1


def test_what_if_partial_admission_gets_the_counts_the_cycle_admits() -> None:
    c = Cluster(queues=[team("solo", "4")])
    c.admit_all(wl("running", "solo", "1"))
    gang = (
        MakeWorkload("gang")
        .queue("solo")
        .pod_sets(MakePodSet("workers", 6).request("cpu", 1).min_count(2))
    )
    before = fingerprint(c.scheduler)
    answer = c.scheduler.what_if(gang.obj())
    assert fingerprint(c.scheduler) == before
    assert answer.verdict == Verdict.ADMIT
    assert "partial admission (workers 3 of 6 pods)" in answer.message
    assert answer.admission is not None and answer.admission.pod_sets[0].count == 3
    c.submit(gang)
    admitted = c.cycle().admitted
    assert [a.admission.pod_sets[0].count for a in admitted] == [3]
