"""A ClusterQueue deleted while workloads still hold its quota stays Terminating until they
finish (Kueue's finalizer); one of the same name applied meanwhile is the live queue again:
the old workloads keep counting in its usage and their finishing does not delete it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from core_builders import LOWER, Cluster, MakeClusterQueue, MakeFlavorQuotas, MakeWorkload

from phalanx.admission.decisions import CycleResult, PendingReason
from phalanx.admission.records import Phase


def queue(nominal: int = 8) -> MakeClusterQueue:
    return (
        MakeClusterQueue("cq")
        .resource_group(MakeFlavorQuotas("default").resource("cpu", nominal))
        .preemption(within=LOWER)
    )


def wl(name: str, cpu: int, priority: int = 0) -> MakeWorkload:
    return MakeWorkload(name).queue("cq").request("cpu", cpu).priority(priority)


@dataclass
class Case:
    name: str
    actions: list[str]
    """delete, apply, apply-16, finish-old, submit-new (4 cpu), submit-big (12 cpu),
    submit-high (8 cpu, preempts old), evict-old, cycle; "old" (4 cpu) is admitted first."""
    exists: bool
    active: bool = True
    usage: int = 0
    """cpu (milli) counted in the queue at the end."""
    new_phase: Phase | None = None
    new_reason: PendingReason | None = None


CASES = [
    Case("deleted with admitted work is Terminating", ["delete"], True, False, 4000),
    Case("its last workload finishing deletes it", ["delete", "finish-old"], False),
    Case(
        "re-applied: live again, the old workload counts",
        ["delete", "apply", "submit-new", "cycle"],
        True,
        usage=8000,
        new_phase=Phase.ADMITTED,
    ),
    Case(
        "re-applied: the old workload finishing does not delete it",
        ["delete", "apply", "finish-old", "submit-new", "cycle"],
        True,
        usage=4000,
        new_phase=Phase.ADMITTED,
    ),
    Case(
        "re-applied with more quota: old usage plus the new quota",
        ["delete", "apply-16", "submit-big", "cycle", "finish-old"],
        True,
        usage=12000,
        new_phase=Phase.ADMITTED,
    ),
    Case(
        "a workload submitted while Terminating waits, then is admitted after re-apply",
        ["delete", "submit-new", "cycle"],
        True,
        False,
        4000,
        new_phase=Phase.PENDING,
        new_reason=PendingReason.CLUSTER_QUEUE_NOT_FOUND,
    ),
    Case(
        "... and admitted once the queue is applied again",
        ["delete", "submit-new", "cycle", "apply", "cycle", "finish-old"],
        True,
        usage=4000,
        new_phase=Phase.ADMITTED,
    ),
    Case(
        "deleted again after re-apply: gone when the old workload finishes",
        ["delete", "apply", "delete", "finish-old"],
        False,
    ),
    Case(
        "a preemptor's claim released in a Terminating queue lets it go",
        ["submit-high", "cycle", "delete", "evict-old", "cycle"],
        False,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_terminating_cluster_queue(case: Case) -> None:
    cluster = Cluster(queues=[queue().obj()])
    s = cluster.scheduler
    cluster.admit_all(wl("old", 4))
    result: CycleResult | None = None
    for action in case.actions:
        if action == "delete":
            s.delete_cluster_queue("cq")
        elif action == "apply":
            s.apply_cluster_queue(queue().obj())
        elif action == "apply-16":
            s.apply_cluster_queue(queue(16).obj())
        elif action == "finish-old":
            s.finish_workload("default/old")
        elif action == "submit-new":
            cluster.submit(wl("new", 4))
        elif action == "submit-big":
            cluster.submit(wl("new", 12))
        elif action == "submit-high":
            cluster.submit(wl("high", 8, priority=9))
        elif action == "evict-old":
            s.workload_evicted("default/old", now=cluster.now)
        elif action == "cycle":
            result = cluster.cycle()
        else:
            raise AssertionError(action)
    assert ("cq" in s.queues) == case.exists
    if case.exists:
        status = s.cluster_queue_status("cq")
        assert status.active == case.active, status.reason
        assert (status.reason == "Terminating") == (not case.active)
        assert cluster.usage("cq") == case.usage
    if case.new_phase is not None:
        assert cluster.phase("new") == case.new_phase
    if case.new_reason is not None:
        assert result is not None
        assert result.pending["default/new"].reason == case.new_reason
