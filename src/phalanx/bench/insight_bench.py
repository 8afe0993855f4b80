"""``phalanx bench explain``: how long ``explain`` and ``what-if`` take on a busy core.

Builds a core with cohorts of ClusterQueues whose quota is all in use (some of it borrowed),
``pending`` workloads queued behind it in mixed sizes and priorities, runs one cycle so every
pending workload has its explanation, then times ``Scheduler.explain_report`` for pending
workloads and ``Scheduler.what_if`` for new ones that would be admitted, preempt, or wait.
Each call runs alone on the event loop in the operator, between cycles, so its latency is what
a user waits for (plus the API server's round trip) and what the next cycle waits behind.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

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
from phalanx.admission.scheduler import Scheduler
from phalanx.bench.tracker import percentile
from phalanx.quotas.resources import ResourceQuota

__all__ = ["InsightBench", "LatencyStats", "run_insight_bench"]

FLAVOR = "default"
RESOURCE = "cpu"
NOMINAL_CPUS = 16


@dataclass(frozen=True, slots=True)
class LatencyStats:
    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, seconds: list[float]) -> LatencyStats:
        """Nearest-rank percentiles (``tracker.percentile``, as the e2e bench reports)."""
        if not seconds:
            return cls(0, 0.0, 0.0, 0.0)
        return cls(
            len(seconds),
            percentile(seconds, 50) * 1000,
            percentile(seconds, 99) * 1000,
            max(seconds) * 1000,
        )


@dataclass(frozen=True, slots=True)
class InsightBench:
    pending: int
    cluster_queues: int
    admitted: int
    build_s: float
    cycle_s: float
    explain: LatencyStats
    what_if: LatencyStats
    verdicts: dict[str, int] = field(default_factory=dict)

    def text(self) -> str:
        def line(name: str, s: LatencyStats) -> str:
            return (
                f"{name:<8} calls {s.count:>6}  p50 {s.p50_ms:8.3f} ms  p99 {s.p99_ms:8.3f} ms"
                f"  max {s.max_ms:8.3f} ms"
            )

        verdicts = ", ".join(f"{k} {v}" for k, v in sorted(self.verdicts.items()))
        return "\n".join(
            [
                f"core: {self.pending} pending, {self.admitted} admitted, in"
                f" {self.cluster_queues} ClusterQueues (built in {self.build_s:.1f} s,"
                f" first cycle {self.cycle_s:.1f} s)",
                line("explain", self.explain),
                line("what-if", self.what_if),
                f"what-if decisions: {verdicts}",
            ]
        )


def _cluster_queue(name: str, cohort: str) -> ClusterQueue:
    quota = ResourceQuota(nominal=NOMINAL_CPUS * 1000)
    return ClusterQueue(
        name=name,
        resource_groups=(ResourceGroup((RESOURCE,), (FlavorQuotas(FLAVOR, {RESOURCE: quota}),)),),
        cohort=cohort,
        preemption=Preemption(
            within_cluster_queue=PreemptionPolicy.LOWER_PRIORITY,
            reclaim_within_cohort=PreemptionPolicy.ANY,
        ),
    )


def _workload(name: str, queue: str, cpus: int, priority: int, created: int) -> Workload:
    return Workload(
        namespace="bench",
        name=name,
        queue_name=queue,
        pod_sets=(PodSet(name="main", count=1, requests={RESOURCE: cpus * 1000}),),
        priority=priority,
        creation_time=created,
    )


def build(*, pending: int, cluster_queues: int, per_cohort: int = 5) -> tuple[Scheduler, int]:
    """A core whose quota is in use and ``pending`` workloads wait; returns it and how many
    workloads are admitted. Half the queues' quota is lent: their neighbours borrow it."""
    s = Scheduler()
    s.apply_resource_flavor(ResourceFlavor(FLAVOR))
    s.set_namespace("bench", {})
    names = [f"cq-{i}" for i in range(cluster_queues)]
    for i, name in enumerate(names):
        s.apply_cluster_queue(_cluster_queue(name, f"cohort-{i // per_cohort}"))
        s.apply_local_queue(LocalQueue("bench", name, name))
    created = 0
    for i, name in enumerate(names):
        # Even queues fill their quota and borrow half as much again; odd ones run half.
        cpus = NOMINAL_CPUS + NOMINAL_CPUS // 2 if i % 2 == 0 else NOMINAL_CPUS // 2
        for j in range(cpus // 2):
            created += 1
            s.add_workload(_workload(f"run-{name}-{j}", name, 2, j % 3, created))
        s.run_cycle(created)
    admitted = sum(len(state.admitted) for state in s.queues.values())
    for k in range(pending):
        created += 1
        name = names[k % cluster_queues]
        s.add_workload(_workload(f"wait-{k}", name, 4 + (k % 4) * 4, -1 - k % 2, created))
    return s, admitted


def run_insight_bench(
    *,
    pending: int = 15_000,
    cluster_queues: int = 50,
    explains: int = 2000,
    what_ifs: int = 500,
    clock: Callable[[], float] = time.perf_counter,
) -> InsightBench:
    start = clock()
    s, admitted = build(pending=pending, cluster_queues=cluster_queues)
    built = clock()
    s.run_cycle(10_000_000)
    cycled = clock()
    keys = [k for k in s.entries if s.explain(k) is not None]
    step = max(1, len(keys) // max(explains, 1))
    explain_times: list[float] = []
    for key in keys[::step][:explains]:
        t0 = clock()
        s.explain_report(key)
        explain_times.append(clock() - t0)
    verdicts: Counter[str] = Counter()
    what_if_times: list[float] = []
    names = sorted(s.queues)
    for k in range(what_ifs):
        # Sizes from fitting in the spare quota of a lending queue to more than a cohort has,
        # priorities from below everything to above everything.
        cpus = (1, 2, 8, 24, 100)[k % 5]
        workload = _workload(f"ask-{k}", names[k % len(names)], cpus, (k % 3) * 5 - 2, 0)
        t0 = clock()
        answer = s.what_if(workload)
        what_if_times.append(clock() - t0)
        verdicts[answer.verdict.value] += 1
    return InsightBench(
        pending=len(keys),
        cluster_queues=cluster_queues,
        admitted=admitted,
        build_s=built - start,
        cycle_s=cycled - built,
        explain=LatencyStats.of(explain_times),
        what_if=LatencyStats.of(what_if_times),
        verdicts=dict(verdicts),
    )
