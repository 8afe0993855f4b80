"""Preemption: policies, the minimal victim set, candidate order, the preemptor's claim.

From Kueue's docs: concepts/preemption.md ("Classic Preemption": candidates, targets,
heuristics 1-4 and the minimisation step) and concepts/cluster_queue.md ("Preemption").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from core_builders import (
    ANY,
    LOWER,
    LOWER_OR_NEWER,
    NEVER,
    Cluster,
    MakeClusterQueue,
    MakeFlavorQuotas,
    MakeWorkload,
    admitted_names,
    victim_names,
)

from phalanx.admission.decisions import PreemptionReason
from phalanx.admission.model import PreemptionPolicy
from phalanx.admission.records import Phase


def cq(
    name: str,
    nominal: str,
    *,
    cohort: str | None = "c",
    borrowing: str | None = None,
    within: PreemptionPolicy = NEVER,
    reclaim: PreemptionPolicy = NEVER,
    borrow: PreemptionPolicy = NEVER,
    threshold: int | None = None,
) -> MakeClusterQueue:
    queue = MakeClusterQueue(name).resource_group(
        MakeFlavorQuotas("default").resource("cpu", nominal, borrowing)
    )
    if cohort:
        queue.cohort(cohort)
    return queue.preemption(within=within, reclaim=reclaim, borrow=borrow, threshold=threshold)


def wl(name: str, queue: str, cpu: str, priority: int = 0, created: int = 0) -> MakeWorkload:
    return MakeWorkload(name).queue(queue).request("cpu", cpu).priority(priority).created(created)


@dataclass
class PreemptCase:
    name: str
    queues: list[MakeClusterQueue]
    running: list[MakeWorkload]
    """Admitted in order, one cycle each (so later ones are more recently admitted)."""
    incoming: MakeWorkload
    victims: list[str]
    """Expected victims; empty: no preemption (the incoming workload stays pending)."""
    reasons: dict[str, PreemptionReason] = field(default_factory=dict)


CASES = [
    PreemptCase(
        "withinClusterQueue Never: no preemption",
        queues=[cq("a", "4", cohort=None)],
        running=[wl("low", "a", "4", 0)],
        incoming=wl("high", "a", "4", 10),
        victims=[],
    ),
    PreemptCase(
        "withinClusterQueue LowerPriority preempts a lower priority workload",
        queues=[cq("a", "4", cohort=None, within=LOWER)],
        running=[wl("low", "a", "4", 0)],
        incoming=wl("high", "a", "4", 10),
        victims=["low"],
        reasons={"low": PreemptionReason.IN_CLUSTER_QUEUE},
    ),
    PreemptCase(
        "withinClusterQueue LowerPriority spares equal priority",
        queues=[cq("a", "4", cohort=None, within=LOWER)],
        running=[wl("old", "a", "4", 5, created=1)],
        incoming=wl("new", "a", "4", 5, created=2),
        victims=[],
    ),
    PreemptCase(
        "LowerOrNewerEqualPriority preempts a newer workload of equal priority",
        queues=[cq("a", "4", cohort=None, within=LOWER_OR_NEWER)],
        running=[wl("newer", "a", "4", 5, created=9)],
        incoming=wl("older", "a", "4", 5, created=1),
        victims=["newer"],
    ),
    PreemptCase(
        "LowerOrNewerEqualPriority spares an older workload of equal priority",
        queues=[cq("a", "4", cohort=None, within=LOWER_OR_NEWER)],
        running=[wl("older", "a", "4", 5, created=1)],
        incoming=wl("newer", "a", "4", 5, created=9),
        victims=[],
    ),
    PreemptCase(
        "never preempts higher priority",
        queues=[cq("a", "4", cohort=None, within=LOWER)],
        running=[wl("vip", "a", "4", 100)],
        incoming=wl("mid", "a", "4", 10),
        victims=[],
    ),
    PreemptCase(
        "minimal set: lowest priority first, only as many as needed",
        queues=[cq("a", "6", cohort=None, within=LOWER)],
        running=[wl("p1", "a", "2", 1), wl("p2", "a", "2", 2), wl("p3", "a", "2", 3)],
        incoming=wl("high", "a", "3", 10),
        victims=["p1", "p2"],
    ),
    PreemptCase(
        "minimal set: a big victim added back when a small one is enough",
        queues=[cq("a", "6", cohort=None, within=LOWER)],
        running=[wl("small", "a", "1", 2), wl("big", "a", "4", 1), wl("mid", "a", "1", 3)],
        incoming=wl("high", "a", "2", 10),
        # Order tried: big (prio 1), then small; big alone frees enough, small is added back.
        victims=["big"],
    ),
    PreemptCase(
        "among equal priority the most recently admitted goes first",
        queues=[cq("a", "4", cohort=None, within=LOWER)],
        running=[wl("first", "a", "2", 0), wl("second", "a", "2", 0)],
        incoming=wl("high", "a", "2", 10),
        victims=["second"],
    ),
    PreemptCase(
        "reclaimWithinCohort Never: a borrower keeps the lent quota",
        queues=[cq("a", "4"), cq("b", "4")],
        running=[wl("b1", "b", "4"), wl("b2", "b", "4")],
        incoming=wl("a1", "a", "4", 10),
        victims=[],
    ),
    PreemptCase(
        "reclaimWithinCohort Any reclaims nominal quota from a borrower of any priority",
        queues=[cq("a", "4", reclaim=ANY), cq("b", "4")],
        running=[wl("b1", "b", "4", 100), wl("b2", "b", "4", 100)],
        incoming=wl("a1", "a", "4", 0),
        victims=["b2"],
        reasons={"b2": PreemptionReason.IN_COHORT_RECLAMATION},
    ),
    PreemptCase(
        "reclaimWithinCohort LowerPriority only takes lower priority borrowers",
        queues=[cq("a", "4", reclaim=LOWER), cq("b", "4")],
        running=[wl("b1", "b", "4", 100), wl("b2", "b", "4", 100)],
        incoming=wl("a1", "a", "4", 10),
        victims=[],
    ),
    PreemptCase(
        "reclaimWithinCohort LowerPriority with a lower priority borrower",
        queues=[cq("a", "4", reclaim=LOWER), cq("b", "4")],
        running=[wl("b1", "b", "4", 1), wl("b2", "b", "4", 1)],
        incoming=wl("a1", "a", "4", 10),
        victims=["b2"],
    ),
    PreemptCase(
        "reclaim never touches a queue within its nominal quota",
        queues=[cq("a", "4", reclaim=ANY), cq("b", "4"), cq("c", "4")],
        running=[wl("b1", "b", "4"), wl("c1", "c", "4"), wl("c2", "c", "4")],
        incoming=wl("a1", "a", "4"),
        victims=["c2"],
    ),
    PreemptCase(
        "reclaim only when the preemptor fits within its nominal quota",
        queues=[cq("a", "4", reclaim=ANY), cq("b", "4")],
        running=[wl("a1", "a", "4"), wl("b1", "b", "4")],
        incoming=wl("a2", "a", "2", 50),
        victims=[],
    ),
    PreemptCase(
        "borrowWithinCohort LowerPriority: may preempt lower priority borrowers while borrowing",
        queues=[cq("a", "4", reclaim=LOWER, borrow=LOWER), cq("b", "0"), cq("x", "8")],
        running=[wl("a1", "a", "4", 50), wl("b1", "b", "4", 1), wl("x1", "x", "4", 99)],
        incoming=wl("a2", "a", "4", 50),
        victims=["b1"],
        reasons={"b1": PreemptionReason.IN_COHORT_RECLAIM_WHILE_BORROWING},
    ),
    PreemptCase(
        "borrowWithinCohort maxPriorityThreshold protects workloads above it",
        queues=[
            cq("a", "4", reclaim=LOWER, borrow=LOWER, threshold=5),
            cq("b", "0"),
            cq("x", "8"),
        ],
        running=[wl("a1", "a", "4", 50), wl("b1", "b", "4", 10), wl("x1", "x", "4", 99)],
        incoming=wl("a2", "a", "4", 50),
        victims=[],
    ),
    PreemptCase(
        "a queue at its nominal quota preempts only in itself, not in the cohort",
        queues=[cq("a", "4", within=LOWER, reclaim=ANY), cq("b", "0"), cq("x", "8")],
        running=[wl("a1", "a", "4", 1), wl("b1", "b", "4", 1), wl("x1", "x", "4", 99)],
        incoming=wl("a2", "a", "4", 50),
        victims=["a1"],
        reasons={"a1": PreemptionReason.IN_CLUSTER_QUEUE},
    ),
    PreemptCase(
        "a request above nominal quota never preempts without borrowWithinCohort",
        queues=[cq("a", "4", within=LOWER, reclaim=ANY), cq("b", "0"), cq("x", "8")],
        running=[wl("a1", "a", "4", 1), wl("b1", "b", "4", 1), wl("x1", "x", "4", 99)],
        incoming=wl("a2", "a", "6", 50),
        victims=[],
    ),
    PreemptCase(
        "borrowers' workloads are preferred over the preemptor's own queue",
        queues=[cq("a", "4", within=LOWER, reclaim=ANY), cq("b", "4")],
        running=[wl("a1", "a", "2", 0), wl("b1", "b", "4", 0), wl("b2", "b", "2", 0)],
        incoming=wl("a2", "a", "2", 10),
        victims=["b2"],
    ),
    PreemptCase(
        "reclaiming nominal quota may also need the preemptor's own lower priority work",
        queues=[cq("a", "4", within=LOWER, reclaim=ANY), cq("b", "4")],
        running=[wl("a1", "a", "2", 0), wl("b1", "b", "4", 0), wl("b2", "b", "2", 0)],
        incoming=wl("a2", "a", "4", 10),
        victims=["a1", "b2"],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_preemption(case: PreemptCase) -> None:
    cluster = Cluster(queues=[q.obj() for q in case.queues])
    for running in case.running:
        cluster.admit_all(running)
    result = cluster.submit(case.incoming).cycle()
    incoming = case.incoming.obj().key
    assert victim_names(result) == sorted(case.victims)
    if case.victims:
        assert [p.preemptor for p in result.preempted] == [incoming]
        reasons = {v.workload.split("/")[1]: v.reason for p in result.preempted for v in p.victims}
        for name, reason in case.reasons.items():
            assert reasons[name] == reason
        after = cluster.complete_preemptions(result)
        assert incoming in {a.workload for a in after.admitted}
    else:
        assert result.preempted == ()
        assert incoming not in {a.workload for a in result.admitted}
        assert cluster.scheduler.phase(incoming) == Phase.PENDING


def test_preemptor_keeps_its_claim_while_victims_terminate() -> None:
    cluster = Cluster(queues=[cq("a", "4", cohort=None, within=LOWER).obj()])
    cluster.admit_all(wl("low", "a", "4", 0))
    result = cluster.submit(wl("high", "a", "4", 10)).cycle()
    assert victim_names(result) == ["low"]
    assert cluster.phase("high") == Phase.CLAIMING
    # The victim is still terminating; a newcomer that would fit in the freed quota must not
    # take it, even at higher priority than the preemptor's.
    cluster.submit(wl("sneaky", "a", "1", 5))
    sneaky = cluster.cycle()
    assert sneaky.admitted == () and sneaky.preempted == ()
    assert cluster.usage("a") == 4000
    cluster.scheduler.workload_evicted("default/low", now=cluster.now)
    done = cluster.cycle()
    assert admitted_names(done) == ["high"]
    assert cluster.phase("low") == Phase.PENDING
    assert cluster.usage("a") == 4000


def test_deleting_the_preemptor_releases_its_claim() -> None:
    cluster = Cluster(queues=[cq("a", "4", cohort=None, within=LOWER).obj()])
    cluster.admit_all(wl("low", "a", "4", 0))
    cluster.submit(wl("high", "a", "4", 10)).cycle()
    cluster.scheduler.delete_workload("default/high")
    cluster.scheduler.workload_evicted("default/low", now=cluster.now)
    assert admitted_names(cluster.cycle()) == ["low"]
    assert cluster.usage("a") == 4000


def test_a_victim_is_not_preempted_twice() -> None:
    cluster = Cluster(queues=[cq("a", "4", cohort=None, within=LOWER).obj()])
    cluster.admit_all(wl("low", "a", "4", 0))
    first = cluster.submit(wl("high1", "a", "4", 10)).cycle()
    second = cluster.submit(wl("high2", "a", "4", 10)).cycle()
    assert victim_names(first) == ["low"]
    assert second.preempted == ()


def test_victim_requeues_by_creation_time() -> None:
    cluster = Cluster(queues=[cq("a", "4", cohort=None, within=LOWER).obj()])
    cluster.admit_all(wl("old", "a", "4", 0, created=1))
    cluster.submit(wl("newer", "a", "4", 0, created=5))
    cluster.cycle()
    result = cluster.submit(wl("high", "a", "4", 10, created=9)).cycle()
    assert victim_names(result) == ["old"]
    cluster.complete_preemptions(result)
    cluster.scheduler.finish_workload("default/high")
    # Kueue orders a preempted workload by its creation time: "old" is still ahead.
    assert admitted_names(cluster.cycle()) == ["old"]
