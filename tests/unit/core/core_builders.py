"""Fluent builders for the scheduling core's objects, in the style of Kueue's test utilities
(``MakeClusterQueue("cq").Cohort("c").ResourceGroup(...)``), plus a small cluster harness.

Quantities are written as Kubernetes strings ("2", "500m", "16Gi") and parsed once here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Self

from phalanx.admission.decisions import CycleResult
from phalanx.admission.model import (
    BorrowWithinCohort,
    ClusterQueue,
    Cohort,
    FlavorFungibility,
    FlavorQuotas,
    FungibilityPolicy,
    LabelSelector,
    LocalQueue,
    NodeSelectorTerm,
    PodSet,
    Preemption,
    PreemptionPolicy,
    QueueingStrategy,
    ResourceFlavor,
    ResourceGroup,
    StopPolicy,
    Taint,
    Toleration,
    TopologyRequest,
    Workload,
)
from phalanx.admission.records import Phase
from phalanx.admission.scheduler import Scheduler, SchedulerConfig
from phalanx.quotas.quantity import parse_quantity
from phalanx.quotas.resources import ResourceQuota

NEVER = PreemptionPolicy.NEVER
LOWER = PreemptionPolicy.LOWER_PRIORITY
LOWER_OR_NEWER = PreemptionPolicy.LOWER_OR_NEWER_EQUAL_PRIORITY
ANY = PreemptionPolicy.ANY
TRY_NEXT = FungibilityPolicy.TRY_NEXT_FLAVOR
MAY_STOP = FungibilityPolicy.MAY_STOP_SEARCH


def q(text: str | int, resource: str = "cpu") -> int:
    return parse_quantity(text, resource=resource)


class MakeFlavorQuotas:
    def __init__(self, name: str) -> None:
        self._name = name
        self._resources: dict[str, ResourceQuota] = {}

    def resource(
        self,
        name: str,
        nominal: str | int,
        borrowing: str | int | None = None,
        lending: str | int | None = None,
    ) -> Self:
        self._resources[name] = ResourceQuota(
            nominal=q(nominal, name),
            borrowing_limit=None if borrowing is None else q(borrowing, name),
            lending_limit=None if lending is None else q(lending, name),
        )
        return self

    def obj(self) -> FlavorQuotas:
        return FlavorQuotas(self._name, dict(self._resources))


def _group(flavors: Iterable[MakeFlavorQuotas | FlavorQuotas]) -> ResourceGroup:
    built = tuple(f.obj() if isinstance(f, MakeFlavorQuotas) else f for f in flavors)
    covered: list[str] = []
    for flavor in built:
        for resource in flavor.resources:
            if resource not in covered:
                covered.append(resource)
    return ResourceGroup(tuple(covered), built)


class MakeClusterQueue:
    def __init__(self, name: str) -> None:
        self._name = name
        self._groups: list[ResourceGroup] = []
        self._cohort: str | None = None
        self._strategy = QueueingStrategy.BEST_EFFORT_FIFO
        self._selector: LabelSelector | None = LabelSelector()
        self._fungibility = FlavorFungibility()
        self._preemption = Preemption()
        self._stop = StopPolicy.NONE
        self._weight = 1000
        self._checks: tuple[str, ...] = ()

    def admission_checks(self, *names: str) -> Self:
        self._checks = names
        return self

    def cohort(self, name: str) -> Self:
        self._cohort = name
        return self

    def resource_group(self, *flavors: MakeFlavorQuotas | FlavorQuotas) -> Self:
        self._groups.append(_group(flavors))
        return self

    def strict_fifo(self) -> Self:
        self._strategy = QueueingStrategy.STRICT_FIFO
        return self

    def namespace_selector(self, selector: LabelSelector | None) -> Self:
        self._selector = selector
        return self

    def fungibility(
        self, *, borrow: FungibilityPolicy = MAY_STOP, preempt: FungibilityPolicy = TRY_NEXT
    ) -> Self:
        self._fungibility = FlavorFungibility(when_can_borrow=borrow, when_can_preempt=preempt)
        return self

    def preemption(
        self,
        *,
        within: PreemptionPolicy = NEVER,
        reclaim: PreemptionPolicy = NEVER,
        borrow: PreemptionPolicy = NEVER,
        threshold: int | None = None,
    ) -> Self:
        self._preemption = Preemption(
            within_cluster_queue=within,
            reclaim_within_cohort=reclaim,
            borrow_within_cohort=BorrowWithinCohort(borrow, threshold),
        )
        return self

    def stop(self, policy: StopPolicy) -> Self:
        self._stop = policy
        return self

    def weight(self, milli: int) -> Self:
        self._weight = milli
        return self

    def obj(self) -> ClusterQueue:
        return ClusterQueue(
            name=self._name,
            resource_groups=tuple(self._groups),
            cohort=self._cohort,
            queueing_strategy=self._strategy,
            namespace_selector=self._selector,
            flavor_fungibility=self._fungibility,
            preemption=self._preemption,
            stop_policy=self._stop,
            fair_weight=self._weight,
            admission_checks=self._checks,
        )


class MakeCohort:
    def __init__(self, name: str) -> None:
        self._name = name
        self._parent: str | None = None
        self._groups: list[ResourceGroup] = []
        self._weight = 1000

    def parent(self, name: str) -> Self:
        self._parent = name
        return self

    def resource_group(self, *flavors: MakeFlavorQuotas | FlavorQuotas) -> Self:
        self._groups.append(_group(flavors))
        return self

    def weight(self, milli: int) -> Self:
        self._weight = milli
        return self

    def obj(self) -> Cohort:
        return Cohort(self._name, self._parent, tuple(self._groups), self._weight)


class MakePodSet:
    def __init__(self, name: str = "main", count: int = 1) -> None:
        self._name = name
        self._count = count
        self._requests: dict[str, int] = {}
        self._min: int | None = None
        self._selector: dict[str, str] = {}
        self._affinity: tuple[NodeSelectorTerm, ...] = ()
        self._tolerations: tuple[Toleration, ...] = ()
        self._topology: TopologyRequest | None = None

    def request(self, resource: str, amount: str | int) -> Self:
        self._requests[resource] = q(amount, resource)
        return self

    def min_count(self, n: int) -> Self:
        self._min = n
        return self

    def node_selector(self, key: str, value: str) -> Self:
        self._selector[key] = value
        return self

    def affinity(self, *terms: NodeSelectorTerm) -> Self:
        self._affinity = terms
        return self

    def toleration(self, tol: Toleration) -> Self:
        self._tolerations += (tol,)
        return self

    def topology(self, request: TopologyRequest) -> Self:
        self._topology = request
        return self

    def obj(self) -> PodSet:
        return PodSet(
            name=self._name,
            count=self._count,
            requests=dict(self._requests),
            min_count=self._min,
            node_selector=dict(self._selector),
            node_affinity=self._affinity,
            tolerations=self._tolerations,
            topology=self._topology,
        )


class MakeWorkload:
    def __init__(self, name: str, namespace: str = "default") -> None:
        self._name = name
        self._namespace = namespace
        self._queue = "lq"
        self._pod_sets: list[PodSet] = []
        self._main: MakePodSet | None = None
        self._priority: int | None = None
        self._class: str | None = None
        self._created = 0
        self._active = True

    def queue(self, name: str) -> Self:
        self._queue = name
        return self

    def priority(self, value: int) -> Self:
        self._priority = value
        return self

    def priority_class(self, name: str) -> Self:
        self._class = name
        return self

    def created(self, ms: int) -> Self:
        self._created = ms
        return self

    def request(self, resource: str, amount: str | int) -> Self:
        """A request on the single default pod set ``main`` of one pod."""
        if self._main is None:
            self._main = MakePodSet()
        self._main.request(resource, amount)
        return self

    def pod_sets(self, *pod_sets: MakePodSet | PodSet) -> Self:
        for ps in pod_sets:
            self._pod_sets.append(ps.obj() if isinstance(ps, MakePodSet) else ps)
        return self

    def inactive(self) -> Self:
        self._active = False
        return self

    def obj(self) -> Workload:
        pod_sets = list(self._pod_sets)
        if self._main is not None:
            pod_sets.insert(0, self._main.obj())
        return Workload(
            namespace=self._namespace,
            name=self._name,
            queue_name=self._queue,
            pod_sets=tuple(pod_sets),
            priority=self._priority,
            priority_class=self._class,
            creation_time=self._created,
            active=self._active,
        )


def flavor(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    taints: Iterable[Taint] = (),
    tolerations: Iterable[Toleration] = (),
    topology: str | None = None,
) -> ResourceFlavor:
    return ResourceFlavor(
        name=name,
        node_labels=dict(labels or {}),
        node_taints=tuple(taints),
        tolerations=tuple(tolerations),
        topology_name=topology,
    )


@dataclass
class Cluster:
    """A scheduler with flavors and queues, and a LocalQueue named like each ClusterQueue in
    namespace ``default`` (so ``MakeWorkload(...).queue(cq_name)`` reaches that queue)."""

    flavors: list[ResourceFlavor] = field(default_factory=lambda: [flavor("default")])
    queues: list[ClusterQueue] = field(default_factory=list)
    cohorts: list[Cohort] = field(default_factory=list)
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    scheduler: Scheduler = field(init=False)
    now: int = 0

    def __post_init__(self) -> None:
        self.scheduler = Scheduler(config=self.config)
        for f in self.flavors:
            self.scheduler.apply_resource_flavor(f)
        for cohort in self.cohorts:
            self.scheduler.apply_cohort(cohort)
        for cq in self.queues:
            self.scheduler.apply_cluster_queue(cq)
            self.scheduler.apply_local_queue(LocalQueue("default", cq.name, cq.name))
        self.scheduler.set_namespace("default", {})

    def submit(self, *workloads: MakeWorkload | Workload) -> Self:
        for wl in workloads:
            self.scheduler.add_workload(wl.obj() if isinstance(wl, MakeWorkload) else wl)
        return self

    def cycle(self, step: int = 1) -> CycleResult:
        self.now += step
        return self.scheduler.run_cycle(self.now)

    def admit_all(self, *workloads: MakeWorkload | Workload) -> CycleResult:
        """Submit and run a cycle; assert every one of them was admitted."""
        self.submit(*workloads)
        result = self.cycle()
        keys = {(w.obj() if isinstance(w, MakeWorkload) else w).key for w in workloads}
        admitted = {a.workload for a in result.admitted}
        assert keys <= admitted, f"not admitted: {sorted(keys - admitted)}"
        return result

    def complete_preemptions(self, result: CycleResult) -> CycleResult:
        """Report every victim of ``result`` evicted, then run a cycle."""
        for preempt in result.preempted:
            for victim in preempt.victims:
                self.scheduler.workload_evicted(victim.workload, now=self.now)
        return self.cycle()

    def phase(self, name: str, namespace: str = "default") -> Phase | None:
        return self.scheduler.phase(f"{namespace}/{name}")

    def usage(self, cq: str, fl: str = "default", resource: str = "cpu") -> int:
        return self.scheduler.tree.cluster_queue(cq).usage.get((fl, resource), 0)


def admitted_names(result: CycleResult) -> list[str]:
    return [a.workload.split("/", 1)[1] for a in result.admitted]


def victim_names(result: CycleResult) -> list[str]:
    return sorted(v.workload.split("/", 1)[1] for p in result.preempted for v in p.victims)
