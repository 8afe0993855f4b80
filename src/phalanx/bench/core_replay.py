"""Replay a Kueue scheduler-performance scenario through the core, in virtual time.

The scenario is Kueue's ``test/performance/scheduler`` generator config as data: cohorts of
ClusterQueues, each receiving sets of workloads at fixed creation intervals. A workload runs
for its ``runtime_ms`` once admitted and then finishes; a preempted one is requeued and
runs its whole runtime again when re-admitted (as Kueue's test runner does).

Cycle cadence: events are grouped by virtual time; after applying all events of one instant
(arrivals, finishes, completed evictions) the engine runs one scheduling cycle at that
instant, and again at the same instant while the cycle produced new same-instant events
(evictions complete after ``eviction_ms``, default 0). Nothing happens between events, so
an idle cluster costs nothing.

The engine is pure: CPU time is read through an injected clock (``cpu_clock``) that wraps
only the calls into the ``Scheduler``, so ``core_cpu_s`` is the core's cost alone.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from phalanx.admission.decisions import CycleResult
from phalanx.admission.model import (
    ClusterQueue,
    FlavorQuotas,
    LocalQueue,
    PodSet,
    Preemption,
    PreemptionPolicy,
    ResourceFlavor,
    ResourceGroup,
    TopologyRequest,
    Workload,
)
from phalanx.admission.placement_hook import PlacementOracle
from phalanx.admission.scheduler import Scheduler, SchedulerConfig
from phalanx.quotas.resources import ResourceQuota
from phalanx.quotas.tree import check_invariants

__all__ = [
    "BenchResult",
    "ClassResult",
    "CohortSet",
    "QueueSet",
    "Scenario",
    "WorkloadSet",
    "WorkloadTemplate",
    "replay",
]

RESOURCE = "cpu"


@dataclass(frozen=True, slots=True)
class WorkloadTemplate:
    class_name: str
    runtime_ms: int
    priority: int
    request: int
    """Per pod, in base units (milli-CPU)."""
    pod_count: int = 1
    topology: TopologyRequest | None = None


@dataclass(frozen=True, slots=True)
class WorkloadSet:
    count: int
    interval_ms: int
    workloads: tuple[WorkloadTemplate, ...]


@dataclass(frozen=True, slots=True)
class QueueSet:
    class_name: str
    count: int
    nominal: int
    borrowing_limit: int | None
    reclaim_within_cohort: PreemptionPolicy
    within_cluster_queue: PreemptionPolicy
    workload_sets: tuple[WorkloadSet, ...]


@dataclass(frozen=True, slots=True)
class CohortSet:
    class_name: str
    count: int
    queue_sets: tuple[QueueSet, ...]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    cohorts: tuple[CohortSet, ...]
    flavor: ResourceFlavor = field(default_factory=lambda: ResourceFlavor("rf"))


@dataclass(frozen=True, slots=True)
class ClassResult:
    count: int
    avg_time_to_admission_ms: int
    evictions: int


@dataclass(frozen=True, slots=True)
class BenchResult:
    scenario: str
    workloads: int
    admissions: int
    evictions: int
    virtual_wall_ms: int
    ideal_ms: int
    classes: dict[str, ClassResult]
    cq_classes: dict[str, float]
    """ClusterQueue class -> average usage as % of nominal quota over the run."""
    core_cpu_s: float
    decisions: int
    cycles: int
    attempts: int
    invariant_violations: tuple[str, ...] = ()

    @property
    def us_per_decision(self) -> float:
        return self.core_cpu_s * 1e6 / self.decisions if self.decisions else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "scenario": self.scenario,
            "workloads": self.workloads,
            "admissions": self.admissions,
            "evictions": self.evictions,
            "virtual_wall_ms": self.virtual_wall_ms,
            "ideal_ms": self.ideal_ms,
            "classes": {
                name: {
                    "count": c.count,
                    "avg_time_to_admission_ms": c.avg_time_to_admission_ms,
                    "evictions": c.evictions,
                }
                for name, c in sorted(self.classes.items())
            },
            "cq_classes": {
                name: {"avg_usage_pct": round(pct, 2)}
                for name, pct in sorted(self.cq_classes.items())
            },
            "core_cpu_s": round(self.core_cpu_s, 3),
            "us_per_decision": round(self.us_per_decision, 1),
            "decisions": self.decisions,
            "cycles": self.cycles,
            "attempts": self.attempts,
        }


@dataclass(slots=True)
class _Job:
    workload: Workload
    template: WorkloadTemplate
    cq_class: str
    cohort: str
    admitted_at: int = -1
    last_admission: int = -1
    generation: int = 0
    evictions: int = 0
    running_since: int = -1
    usage: int = 0


# Event kinds, in the order they apply within one instant.
_FINISH, _EVICTED, _ARRIVE = 0, 1, 2


def _build(scenario: Scenario) -> tuple[list[ClusterQueue], list[tuple[int, _Job]]]:
    """The ClusterQueues and the workloads (with arrival times) named as Kueue's generator
    names them: queue ``{class}-{set}-{index}-{cohort}``, workload ``{class}-{set}-{n}-{i}``."""
    queues: list[ClusterQueue] = []
    arrivals: list[tuple[int, _Job]] = []
    for cohort_set in scenario.cohorts:
        for ci in range(cohort_set.count):
            cohort = f"{cohort_set.class_name}-{ci}"
            for qsi, qset in enumerate(cohort_set.queue_sets):
                for qi in range(qset.count):
                    name = f"{qset.class_name}-{qsi}-{qi}-{cohort}"
                    quota = ResourceQuota(qset.nominal, qset.borrowing_limit)
                    queues.append(
                        ClusterQueue(
                            name=name,
                            cohort=cohort,
                            resource_groups=(
                                ResourceGroup(
                                    (RESOURCE,),
                                    (FlavorQuotas(scenario.flavor.name, {RESOURCE: quota}),),
                                ),
                            ),
                            preemption=Preemption(
                                within_cluster_queue=qset.within_cluster_queue,
                                reclaim_within_cohort=qset.reclaim_within_cohort,
                            ),
                        )
                    )
                    for wsi, wset in enumerate(qset.workload_sets):
                        # Kueue's generator waits one interval before each creation.
                        created = 0
                        for si in range(wset.count):
                            for ti, template in enumerate(wset.workloads):
                                created += wset.interval_ms
                                workload = Workload(
                                    namespace=name,
                                    name=f"{template.class_name}-{wsi}-{si}-{ti}",
                                    queue_name=name,
                                    pod_sets=(
                                        PodSet(
                                            "main",
                                            template.pod_count,
                                            {RESOURCE: template.request},
                                            topology=template.topology,
                                        ),
                                    ),
                                    priority=template.priority,
                                    creation_time=created,
                                )
                                arrivals.append(
                                    (created, _Job(workload, template, qset.class_name, cohort))
                                )
    return queues, arrivals


def ideal_ms(scenario: Scenario) -> int:
    """The bound no scheduler can beat: the last arrival plus its runtime, or a cohort's
    total work divided by its total quota, whichever is larger."""
    return _ideal(*_build(scenario))


def _ideal(queues: list[ClusterQueue], arrivals: list[tuple[int, _Job]]) -> int:
    quota: dict[str, int] = {}
    for cq in queues:
        cohort = cq.cohort or cq.name
        quota[cohort] = quota.get(cohort, 0) + sum(q.nominal for q in cq.quotas().values())
    work: dict[str, int] = {}
    last = 0
    for created, job in arrivals:
        t = job.template
        work[job.cohort] = work.get(job.cohort, 0) + t.request * t.pod_count * t.runtime_ms
        last = max(last, created + t.runtime_ms)
    bound = max((-(-work[c] // quota[c]) for c in work if quota.get(c)), default=0)
    return max(last, bound)


def replay(
    scenario: Scenario,
    *,
    config: SchedulerConfig | None = None,
    placement: PlacementOracle | None = None,
    cpu_clock: Callable[[], float] | None = None,
    eviction_ms: int = 0,
    check_every_cycle: bool = False,
    after_build: Callable[[], None] | None = None,
) -> BenchResult:
    """Run ``scenario`` to completion and measure it (see the module docstring).

    ``after_build`` runs once every workload of the scenario has been built, before the
    clock starts. The CLI uses it to move those objects out of the garbage collector's
    passes (``gc.freeze``): in a replay all 50,000 workloads exist from the start, which a
    live cluster never has, and traversing them would be charged to the core.
    """
    clock = cpu_clock or (lambda: 0.0)
    spent = 0.0
    scheduler = Scheduler(config=config, placement=placement)
    queues, arrivals = _build(scenario)
    if after_build is not None:
        after_build()
    jobs = {job.workload.key: job for _, job in arrivals}
    nominal_by_class: dict[str, int] = {}
    started = clock()
    scheduler.apply_resource_flavor(scenario.flavor)
    for cq in queues:
        scheduler.apply_cluster_queue(cq)
        scheduler.set_namespace(cq.name, {})
        scheduler.apply_local_queue(LocalQueue(cq.name, cq.name, cq.name))
    spent += clock() - started
    class_of = {job.workload.queue_name: job.cq_class for _, job in arrivals}
    for cq in queues:
        cls = class_of.get(cq.name, cq.name)
        nominal_by_class[cls] = nominal_by_class.get(cls, 0) + sum(
            q.nominal for q in cq.quotas().values()
        )

    events: list[tuple[int, int, int, str, int]] = []
    seq = 0
    for created, job in sorted(arrivals, key=lambda a: (a[0], a[1].workload.key)):
        seq += 1
        events.append((created, _ARRIVE, seq, job.workload.key, 0))
    heapq.heapify(events)

    usage_integral: dict[str, int] = {}
    admissions = evictions = decisions = cycles = attempts = 0
    violations: list[str] = []
    now = 0

    def stop_running(job: _Job, at: int) -> None:
        if job.running_since >= 0:
            usage_integral[job.cq_class] = usage_integral.get(job.cq_class, 0) + job.usage * (
                at - job.running_since
            )
            job.running_since = -1

    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, kind, _, key, generation = heapq.heappop(events)
            job = jobs[key]
            before = clock()
            if kind == _ARRIVE:
                scheduler.add_workload(job.workload)
            elif kind == _FINISH:
                if generation != job.generation:
                    spent += clock() - before
                    continue
                stop_running(job, now)
                scheduler.finish_workload(key)
            else:
                stop_running(job, now)
                scheduler.workload_evicted(key, now=now)
            spent += clock() - before
        before = clock()
        result = scheduler.run_cycle(now)
        spent += clock() - before
        cycles += 1
        attempts += result.attempts
        decisions += len(result.admitted) + len(result.preempted)
        if check_every_cycle:
            violations.extend(_check(scheduler, result))
        for admit in result.admitted:
            job = jobs[admit.workload]
            admissions += 1
            job.generation += 1
            job.last_admission = now
            job.running_since = now
            job.usage = sum(admit.admission.usage().values())
            seq += 1
            heapq.heappush(
                events,
                (now + job.template.runtime_ms, _FINISH, seq, admit.workload, job.generation),
            )
        for preempt in result.preempted:
            for victim in preempt.victims:
                job = jobs[victim.workload]
                job.evictions += 1
                job.generation += 1
                evictions += 1
                seq += 1
                heapq.heappush(events, (now + eviction_ms, _EVICTED, seq, victim.workload, 0))

    classes: dict[str, list[int]] = {}
    for job in jobs.values():
        stats = classes.setdefault(job.template.class_name, [0, 0, 0])
        stats[0] += 1
        stats[1] += max(0, job.last_admission - job.workload.creation_time)
        stats[2] += job.evictions
    wall = now
    return BenchResult(
        scenario=scenario.name,
        workloads=len(jobs),
        admissions=admissions,
        evictions=evictions,
        virtual_wall_ms=wall,
        ideal_ms=_ideal(queues, arrivals),
        classes={
            name: ClassResult(count=s[0], avg_time_to_admission_ms=s[1] // s[0], evictions=s[2])
            for name, s in classes.items()
        },
        cq_classes={
            name: (100.0 * usage_integral.get(name, 0) / (nominal * wall) if wall else 0.0)
            for name, nominal in nominal_by_class.items()
        },
        core_cpu_s=spent,
        decisions=decisions,
        cycles=cycles,
        attempts=attempts,
        invariant_violations=tuple(violations),
    )


def _check(scheduler: Scheduler, result: CycleResult) -> list[str]:
    """The invariants the bench test asserts after every cycle."""
    problems = check_invariants(scheduler.tree)
    for admit in result.admitted:
        entry = scheduler.entries.get(admit.workload)
        if entry is None:
            continue
        for ps, assigned in zip(entry.workload.pod_sets, admit.admission.pod_sets, strict=True):
            if ps.min_count is None and assigned.count != ps.count:
                problems.append(f"{admit.workload}: pod set {ps.name} admitted partially")
    return problems
