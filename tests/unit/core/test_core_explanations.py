"""Every pending workload is explained after a cycle (DESIGN improvement 3), including those
parked untried because an equivalent one did not fit, and those behind a StrictFIFO head."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from core_builders import Cluster, MakeClusterQueue, MakeFlavorQuotas, MakeWorkload

from phalanx.admission.decisions import CycleResult, PendingReason
from phalanx.admission.model import LocalQueue, StopPolicy
from phalanx.admission.records import Phase

NOT_TRIED = "waiting in the queue; not tried yet"


def queue(*, strict: bool = False, stop: StopPolicy = StopPolicy.NONE) -> MakeClusterQueue:
    cq = MakeClusterQueue("cq").resource_group(MakeFlavorQuotas("default").resource("cpu", 8))
    return (cq.strict_fifo() if strict else cq).stop(stop)


def wl(name: str, cpu: int, *, created: int = 0) -> MakeWorkload:
    return MakeWorkload(name).queue("cq").request("cpu", cpu).created(created)


@dataclass
class Case:
    name: str
    strict: bool
    submit: list[MakeWorkload]
    expect: dict[str, PendingReason]
    """workload -> reason of the explanation in the (last) cycle's ``pending``."""
    same_message_as: dict[str, str] = field(default_factory=dict)
    before_last_cycle: Callable[[Cluster], None] | None = None
    """Something to do between a first cycle and the checked one."""
    message_contains: dict[str, str] = field(default_factory=dict)


def _resume(cluster: Cluster) -> None:
    cluster.scheduler.apply_cluster_queue(queue().obj())


def _create_local_queue(cluster: Cluster) -> None:
    cluster.scheduler.apply_local_queue(LocalQueue("default", "cq", "cq"))


def _another_equivalent(cluster: Cluster) -> None:
    cluster.submit(wl("later", 8, created=9))


CASES = [
    Case(
        "equivalents of a head that did not fit get its explanation",
        strict=False,
        submit=[wl("a", 8, created=1), wl("b", 8, created=2), wl("c", 8, created=3)],
        expect={"b": PendingReason.WAITING_FOR_QUOTA, "c": PendingReason.WAITING_FOR_QUOTA},
        same_message_as={"c": "b"},
    ),
    Case(
        "an equivalent arriving while its class is parked is explained in the next cycle",
        strict=False,
        submit=[wl("a", 8, created=1), wl("b", 8, created=2)],
        before_last_cycle=_another_equivalent,
        expect={"later": PendingReason.WAITING_FOR_QUOTA},
    ),
    Case(
        "workloads behind a blocked StrictFIFO head name it",
        strict=True,
        submit=[wl("a", 6, created=1), wl("big", 4, created=2), wl("small", 1, created=3)],
        expect={
            "big": PendingReason.WAITING_FOR_QUOTA,
            "small": PendingReason.BLOCKED_BY_HEAD,
        },
        message_contains={"small": "default/big"},
    ),
    Case(
        "a resumed ClusterQueue's equivalents lose their 'stopped' explanation",
        strict=False,
        submit=[wl("a", 8, created=1), wl("b", 8, created=2), wl("c", 8, created=3)],
        before_last_cycle=_resume,
        expect={"b": PendingReason.WAITING_FOR_QUOTA, "c": PendingReason.WAITING_FOR_QUOTA},
    ),
    Case(
        "workloads routed once their LocalQueue exists lose 'LocalQueue doesn't exist'",
        strict=False,
        submit=[wl("a", 8, created=1), wl("b", 8, created=2), wl("c", 8, created=3)],
        before_last_cycle=_create_local_queue,
        expect={"b": PendingReason.WAITING_FOR_QUOTA, "c": PendingReason.WAITING_FOR_QUOTA},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_pending_workload_is_explained(case: Case) -> None:
    stop = StopPolicy.HOLD if case.before_last_cycle is _resume else StopPolicy.NONE
    cluster = Cluster(queues=[queue(strict=case.strict, stop=stop).obj()])
    if case.before_last_cycle is _create_local_queue:
        cluster.scheduler.delete_local_queue("default", "cq")
    cluster.submit(*case.submit)
    result: CycleResult = cluster.cycle()
    if case.before_last_cycle is not None:
        case.before_last_cycle(cluster)
        result = cluster.cycle()
    for name, reason in case.expect.items():
        explanation = result.pending.get(f"default/{name}")
        assert explanation is not None, f"{name} not explained in this cycle"
        assert explanation.reason == reason, (name, explanation.message)
        assert explanation.workload == f"default/{name}"
    for name, other in case.same_message_as.items():
        assert (
            result.pending[f"default/{name}"].message == result.pending[f"default/{other}"].message
        )
    for name, text in case.message_contains.items():
        assert text in result.pending[f"default/{name}"].message
    for key, entry in cluster.scheduler.entries.items():
        if entry.phase == Phase.PENDING:
            explanation = cluster.scheduler.explain(key)
            assert explanation is not None and explanation.message != NOT_TRIED, key
