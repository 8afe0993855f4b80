"""Properties on random clusters and workload streams (hypothesis).

* usage never exceeds what nominal quota, borrowing and lending limits allow, at any level
  of the cohort tree, both in the core's books and in what the API shows reserving
  (admitted workloads and preemption victims still being evicted), and the books always
  equal what admitted and evicting workloads and preemptors' holds account for;
* a workload is admitted whole (every pod set at its count, or within [minCount, count]
  when partial admission is allowed) or not at all;
* admitting then finishing returns usage to where it was;
* the same input gives the same decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

from core_builders import (
    ANY,
    LOWER,
    LOWER_OR_NEWER,
    NEVER,
    MakeClusterQueue,
    MakeCohort,
    MakeFlavorQuotas,
    MakePodSet,
    MakeWorkload,
    flavor,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phalanx.admission.decisions import CycleResult
from phalanx.admission.model import ClusterQueue, Cohort, LocalQueue
from phalanx.admission.records import Phase
from phalanx.admission.scheduler import Scheduler, SchedulerConfig
from phalanx.quotas.resources import merge_usage
from phalanx.quotas.tree import ResourceTree, check_invariants

FLAVORS = ("f0", "f1")
POLICIES = (NEVER, LOWER, LOWER_OR_NEWER)
RECLAIM = (NEVER, LOWER, ANY)


@dataclass(frozen=True)
class World:
    queues: tuple[ClusterQueue, ...]
    cohorts: tuple[Cohort, ...]
    fair: bool


@st.composite
def worlds(draw: st.DrawFn) -> World:
    hierarchical = draw(st.booleans())
    cohorts = []
    if hierarchical:
        cohorts = [
            MakeCohort("top")
            .resource_group(MakeFlavorQuotas("f0").resource("cpu", draw(st.integers(0, 4))))
            .obj(),
            MakeCohort("left").parent("top").obj(),
            MakeCohort("right").parent("top").obj(),
        ]
    queues = []
    for i in range(draw(st.integers(2, 4))):
        cohort = draw(st.sampled_from(["left", "right"] if hierarchical else ["c", "c", "d", None]))
        flavors = []
        for name in draw(st.sampled_from([("f0",), ("f1",), ("f0", "f1"), ("f1", "f0")])):
            nominal = draw(st.integers(0, 8))
            borrowing = draw(st.none() | st.integers(0, 4)) if cohort else None
            lending = draw(st.none() | st.integers(0, nominal)) if cohort else None
            flavors.append(MakeFlavorQuotas(name).resource("cpu", nominal, borrowing, lending))
        queue = MakeClusterQueue(f"q{i}").resource_group(*flavors)
        if cohort:
            queue.cohort(cohort)
        if draw(st.booleans()):
            queue.strict_fifo()
        reclaim = draw(st.sampled_from(RECLAIM)) if cohort else NEVER
        queue.preemption(
            within=draw(st.sampled_from(POLICIES)),
            reclaim=reclaim,
            borrow=draw(st.sampled_from((NEVER, LOWER))) if reclaim != NEVER else NEVER,
            threshold=draw(st.none() | st.integers(0, 3)),
        )
        queue.weight(draw(st.sampled_from([500, 1000, 2000])))
        queues.append(queue.obj())
    return World(tuple(queues), tuple(cohorts), draw(st.booleans()))


# One step of the stream: ("add", queue index, cpu, pods, min pods, priority)
# | ("cycle",) | ("finish", n) | ("evictions",) | ("evict-one", n) | ("delete", n)
Op = tuple[object, ...]


@st.composite
def ops(draw: st.DrawFn) -> list[Op]:
    """Rounds of arrivals followed by a cycle, with finishes, deletions and completed
    evictions in between: a workload stream dense enough to fill queues and preempt."""
    steps: list[Op] = []
    for _ in range(draw(st.integers(3, 10))):
        for _ in range(draw(st.integers(1, 6))):
            steps.append(
                (
                    "add",
                    draw(st.integers(0, 3)),
                    draw(st.integers(1, 2)),
                    draw(st.integers(1, 3)),
                    draw(st.integers(0, 2)),
                    draw(st.integers(0, 3)),
                )
            )
        steps.append(("cycle",))
        extra = draw(
            st.lists(
                st.one_of(
                    st.tuples(st.just("finish"), st.integers(0, 50)),
                    st.tuples(st.just("delete"), st.integers(0, 50)),
                    st.just(("evictions",)),
                    st.tuples(st.just("evict-one"), st.integers(0, 50)),
                    st.just(("cycle",)),
                ),
                max_size=3,
            )
        )
        steps.extend(extra)
    return steps


def build(world: World) -> Scheduler:
    scheduler = Scheduler(config=SchedulerConfig(fair_sharing=world.fair))
    for name in FLAVORS:
        scheduler.apply_resource_flavor(flavor(name))
    for cohort in world.cohorts:
        scheduler.apply_cohort(cohort)
    for queue in world.queues:
        scheduler.apply_cluster_queue(queue)
        scheduler.apply_local_queue(LocalQueue("ns", queue.name, queue.name))
    scheduler.set_namespace("ns", {})
    return scheduler


def _empty_copy(scheduler: Scheduler) -> ResourceTree:
    tree = ResourceTree()
    for name in scheduler.tree.cluster_queue_names():
        node = scheduler.tree.cluster_queue(name)
        cohort = node.parent.name if node.parent else None
        tree.set_cluster_queue(name, cohort=cohort, quotas=node.quotas)
    for cohort_name in {n.name for root in scheduler.tree.roots() for n in root.walk()}:
        node = scheduler.tree.cohort(cohort_name)
        if node is not None and node.explicit:
            parent = node.parent.name if node.parent else None
            tree.set_cohort(cohort_name, parent=parent, quotas=node.quotas)
    return tree


def accounted_usage(scheduler: Scheduler) -> ResourceTree:
    """A fresh tree holding exactly what the scheduler's workloads should count: admitted
    and evicting workloads, and what preemptors hold while their victims terminate."""
    tree = _empty_copy(scheduler)
    by_queue: dict[str, list[dict[tuple[str, str], int]]] = {}
    for entry in scheduler.entries.values():
        if entry.phase != Phase.PENDING and entry.usage:
            by_queue.setdefault(entry.cluster_queue or "", []).append(entry.usage)
        for name, held in entry.held:
            by_queue.setdefault(name, []).append(held)
    for name, usages in by_queue.items():
        tree.add_usage(tree.cluster_queue(name), merge_usage(usages))
    return tree


def reserved_in_api(scheduler: Scheduler) -> ResourceTree:
    """What the API shows reserving: every workload with ``status.admission``, i.e. admitted
    and still-evicting ones, counted from their admissions (not the core's books)."""
    tree = _empty_copy(scheduler)
    for entry in scheduler.entries.values():
        if entry.phase in (Phase.ADMITTED, Phase.EVICTING):
            assert entry.admission is not None
            assert entry.usage == entry.admission.usage(), entry
            tree.add_usage(tree.cluster_queue(entry.admission.cluster_queue), entry.usage)
    return tree


def check(scheduler: Scheduler, result: CycleResult) -> None:
    assert scheduler.books.problems(scheduler.entries.values()) == []
    by_queue: dict[str, set[str]] = {}
    for entry in scheduler.entries.values():
        by_queue.setdefault(entry.local_queue, set()).add(entry.key)
    assert {k: set(g) for k, g in scheduler.by_local_queue.items()} == by_queue
    assert check_invariants(scheduler.tree) == []
    assert check_invariants(reserved_in_api(scheduler)) == []
    fresh = accounted_usage(scheduler)
    assert check_invariants(fresh) == []
    for name in scheduler.tree.cluster_queue_names():
        assert scheduler.tree.cluster_queue(name).usage == fresh.cluster_queue(name).usage
    for admit in result.admitted:
        entry = scheduler.entries[admit.workload]
        total: dict[tuple[str, str], int] = {}
        for ps, assigned in zip(entry.workload.pod_sets, admit.admission.pod_sets, strict=True):
            low = ps.count if ps.min_count is None else ps.min_count
            assert low <= assigned.count <= ps.count
            assert set(assigned.flavors) == set(ps.requests)
            for res, per_pod in ps.requests.items():
                assert assigned.resource_usage[res] == per_pod * assigned.count
                fr = (assigned.flavors[res], res)
                total[fr] = total.get(fr, 0) + per_pod * assigned.count
        assert total == entry.usage


def play(world: World, steps: list[Op], *, checked: bool) -> list[CycleResult]:
    scheduler = build(world)
    results: list[CycleResult] = []
    now = 0
    pending_victims: list[str] = []
    serial = 0
    for op in steps:
        kind = op[0]
        if kind == "add":
            _, qi, cpu, pods, min_pods, priority = op
            assert isinstance(qi, int) and isinstance(pods, int) and isinstance(min_pods, int)
            queue = world.queues[qi % len(world.queues)].name
            pod_set = MakePodSet("main", pods).request("cpu", str(cpu))
            if min_pods and min_pods < pods:
                pod_set.min_count(min_pods)
            serial += 1
            scheduler.add_workload(
                MakeWorkload(f"w{serial}", "ns")
                .queue(queue)
                .pod_sets(pod_set)
                .priority(int(str(priority)))
                .created(now)
                .obj()
            )
        elif kind == "cycle":
            now += 1
            result = scheduler.run_cycle(now)
            results.append(result)
            pending_victims += [v.workload for p in result.preempted for v in p.victims]
            if checked:
                check(scheduler, result)
        elif kind == "evictions":
            for key in pending_victims:
                scheduler.workload_evicted(key, now=now)
            pending_victims = []
        elif kind == "evict-one":
            # One victim's eviction completes while the preemptor's others still run.
            if pending_victims:
                key = pending_victims.pop(int(str(op[1])) % len(pending_victims))
                scheduler.workload_evicted(key, now=now)
        else:
            # Finishing or deleting hits running workloads and victims still being evicted.
            admitted = sorted(
                k
                for k, e in scheduler.entries.items()
                if e.phase in (Phase.ADMITTED, Phase.EVICTING)
            )
            if admitted:
                key = admitted[int(str(op[1])) % len(admitted)]
                if kind == "finish":
                    scheduler.finish_workload(key)
                else:
                    scheduler.delete_workload(key)
    now += 1
    results.append(scheduler.run_cycle(now))
    if checked:
        check(scheduler, results[-1])
    return results


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(world=worlds(), steps=ops())
def test_usage_stays_within_limits_and_admissions_are_whole(world: World, steps: list[Op]) -> None:
    play(world, steps, checked=True)


@SETTINGS
@given(world=worlds(), steps=ops())
def test_same_input_same_decisions(world: World, steps: list[Op]) -> None:
    assert play(world, steps, checked=False) == play(world, steps, checked=False)


@SETTINGS
@given(world=worlds(), steps=ops(), extra=st.lists(st.integers(1, 3), min_size=1, max_size=4))
def test_admit_then_finish_returns_usage(world: World, steps: list[Op], extra: list[int]) -> None:
    scheduler = build(world)
    now = 0
    for n, op in enumerate(steps):
        if op[0] == "add":
            queue = world.queues[int(str(op[1])) % len(world.queues)].name
            scheduler.add_workload(
                MakeWorkload(f"w{n}", "ns").queue(queue).request("cpu", str(op[2])).obj()
            )
        elif op[0] == "cycle":
            now += 1
            for p in scheduler.run_cycle(now).preempted:
                for v in p.victims:
                    scheduler.workload_evicted(v.workload, now=now)
    now += 1
    scheduler.run_cycle(now)

    def snapshot() -> dict[str, dict[tuple[str, str], int]]:
        return {
            node.name: dict(node.usage) for root in scheduler.tree.roots() for node in root.walk()
        }

    before = snapshot()
    for n, cpu in enumerate(extra):
        for queue in world.queues:
            scheduler.add_workload(
                MakeWorkload(f"x{n}-{queue.name}", "ns")
                .queue(queue.name)
                .request("cpu", str(cpu))
                .priority(-1)
                .obj()
            )
    now += 1
    result = scheduler.run_cycle(now)
    if result.preempted:
        return  # victims changed the books; this property is about plain admissions
    for admit in result.admitted:
        scheduler.finish_workload(admit.workload)
    for key in [k for k in scheduler.entries if k.startswith("ns/x")]:
        scheduler.delete_workload(key)
    assert snapshot() == before
