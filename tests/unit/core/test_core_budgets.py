"""Usage budgets: resource-hours per LocalQueue or ClusterQueue per window; over budget, the
scope's workloads wait, explained, until the window resets."""

from __future__ import annotations

import pytest
from core_builders import MakeClusterQueue, MakeFlavorQuotas, MakeWorkload, admitted_names, flavor

from phalanx.admission.budgets import (
    Budget,
    BudgetLedger,
    ScopeKind,
    WhenExceeded,
    format_hours,
    format_time,
)
from phalanx.admission.decisions import PendingReason
from phalanx.admission.model import LocalQueue, PreemptionPolicy
from phalanx.admission.records import Where
from phalanx.admission.scheduler import Scheduler, SchedulerConfig

HOUR = 3_600_000
GPU = "nvidia.com/gpu"
WEEK = 168 * HOUR


def _budget(
    kind: ScopeKind = ScopeKind.LOCAL_QUEUE, scope: str = "default/a", **kw: object
) -> Budget:
    fields: dict[str, object] = {"resource": GPU, "resource_hours": 4.0, "period_ms": 10 * HOUR}
    fields.update(kw)
    return Budget(kind, scope, **fields)  # type: ignore[arg-type]


def _scheduler(*budgets: Budget) -> Scheduler:
    s = Scheduler(config=SchedulerConfig(budgets=budgets))
    s.apply_resource_flavor(flavor("default"))
    for cq in ("cq", "other"):
        s.apply_cluster_queue(
            MakeClusterQueue(cq).resource_group(MakeFlavorQuotas("default").resource(GPU, 8)).obj()
        )
    s.apply_local_queue(LocalQueue("default", "a", "cq"))
    s.apply_local_queue(LocalQueue("default", "b", "cq"))
    s.apply_local_queue(LocalQueue("default", "c", "other"))
    s.set_namespace("default", {})
    return s


def _submit(s: Scheduler, name: str, lq: str, gpus: int = 1, *, created: int = 0) -> None:
    s.add_workload(MakeWorkload(name).queue(lq).request(GPU, gpus).created(created).obj())


def test_window_is_aligned_to_the_anchor() -> None:
    b = _budget(period_ms=WEEK, anchor_ms=4 * 24 * HOUR)  # 1970-01-05 was a Monday
    now = 1_796_000_000_000
    start, end = b.window(now)
    assert start <= now < end and end - start == WEEK
    assert (start - 4 * 24 * HOUR) % WEEK == 0
    assert format_time(start) == "2026-11-30T00:00Z"
    assert b.window(start) == (start, end) and b.window(end)[0] == end


def test_ledger_counts_closed_and_running_time_inside_the_window() -> None:
    ledger = BudgetLedger((_budget(),))
    # 2 GPUs from 8h into a window starting at 10h, released at 11h: 1 GPU-hour... x2
    ledger.start(
        "w1", local_queue="default/a", cluster_queue="cq", amounts={GPU: 2.0}, now=8 * HOUR
    )
    ledger.stop("w1", 11 * HOUR)
    assert ledger.used_hours(0, 11 * HOUR) == pytest.approx(2.0)
    # Running: 3 GPUs since 12h count up to now, growing with it.
    ledger.start(
        "w2", local_queue="default/a", cluster_queue="cq", amounts={GPU: 3.0}, now=12 * HOUR
    )
    assert ledger.used_hours(0, 13 * HOUR) == pytest.approx(5.0)
    assert ledger.used_hours(0, 14 * HOUR) == pytest.approx(8.0)
    # Another scope, another resource: not counted.
    ledger.start(
        "w3", local_queue="default/b", cluster_queue="cq", amounts={GPU: 5.0}, now=12 * HOUR
    )
    ledger.start(
        "w4", local_queue="default/a", cluster_queue="cq", amounts={"cpu": 5.0}, now=12 * HOUR
    )
    assert ledger.used_hours(0, 14 * HOUR) == pytest.approx(8.0)
    # The next window (from 20h) counts only the running one, from its start.
    assert ledger.used_hours(0, 21 * HOUR) == pytest.approx(3.0)


def test_restored_usage_counts_and_running_ones_count_from_the_restore() -> None:
    ledger = BudgetLedger((_budget(),))
    ledger.restore(0, 1.5, 12 * HOUR)
    ledger.start("w", local_queue="default/a", cluster_queue="cq", amounts={GPU: 1.0}, now=0)
    assert ledger.used_hours(0, 13 * HOUR) == pytest.approx(2.5)
    ledger.stop("w", 14 * HOUR)
    assert ledger.used_hours(0, 15 * HOUR) == pytest.approx(3.5)
    assert ledger.used_hours(0, 20 * HOUR) == 0.0  # reset


def test_under_budget_is_admitted_however_long_it_will_run() -> None:
    s = _scheduler(_budget(resource_hours=4.0))
    _submit(s, "big", "a", 8)
    assert admitted_names(s.run_cycle(1)) == ["big"]


def test_over_budget_waits_with_the_budget_named_until_the_window_resets() -> None:
    s = _scheduler(_budget(resource_hours=4.0))
    _submit(s, "w1", "a", 2)
    assert admitted_names(s.run_cycle(0)) == ["w1"]
    _submit(s, "w2", "a", 1, created=1)
    # 1h in: 2 GPU-hours used of 4; w2 is admitted.
    assert admitted_names(s.run_cycle(HOUR)) == ["w2"]
    # At 2h, 2 x 2 + 1 x 1 = 5 >= 4: w3 waits; b has no budget.
    _submit(s, "w3", "a", 1, created=2)
    _submit(s, "other", "b", 1, created=3)
    assert admitted_names(s.run_cycle(2 * HOUR)) == ["other"]
    explanation = s.explain("default/w3")
    assert explanation is not None
    assert explanation.reason == PendingReason.BUDGET_EXCEEDED
    assert explanation.message == (
        "LocalQueue default/a used 5.0 of its 4.0 nvidia.com/gpu-hours for the window"
        " 1970-01-01T00:00Z..1970-01-01T10:00Z; waits until it resets"
    )
    assert s.entries["default/w3"].where == Where.BUDGET
    # Freeing quota does not help: still over budget.
    s.finish_workload("default/w1", now=3 * HOUR)
    s.run_cycle(3 * HOUR)
    assert s.explain("default/w3").reason == PendingReason.BUDGET_EXCEEDED  # type: ignore[union-attr]
    # The window resets at 10h: admitted.
    assert admitted_names(s.run_cycle(10 * HOUR - 1)) == []
    assert admitted_names(s.run_cycle(10 * HOUR)) == ["w3"]


def test_running_usage_alone_crosses_the_limit() -> None:
    """Nothing finished: what is running counts up to now."""
    s = _scheduler(_budget(resource_hours=4.0))
    _submit(s, "w1", "a", 2)
    assert admitted_names(s.run_cycle(0)) == ["w1"]
    _submit(s, "w2", "a", 1, created=1)
    s.finish_workload("default/w1", now=HOUR)  # 2 GPU-hours
    _submit(s, "w0", "a", 2, created=2)
    assert admitted_names(s.run_cycle(HOUR)) == ["w2", "w0"]
    _submit(s, "w4", "a", 1, created=3)
    assert admitted_names(s.run_cycle(HOUR + 39 * 60_000)) == ["w4"]  # 2 + 3 x 0.65 = 3.95
    _submit(s, "w5", "a", 1, created=4)
    assert admitted_names(s.run_cycle(HOUR + 40 * 60_000)) == []  # 3.95 + 4 / 60 > 4
    assert s.explain("default/w5").reason == PendingReason.BUDGET_EXCEEDED  # type: ignore[union-attr]
    assert "used 4.017 of its 4.0" in s.explain("default/w5").message  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("budget", "waiting", "admitted"),
    [
        (_budget(ScopeKind.LOCAL_QUEUE, "default/a"), ["a1"], ["b1", "c1"]),
        (_budget(ScopeKind.CLUSTER_QUEUE, "cq"), ["a1", "b1"], ["c1"]),
    ],
    ids=["local-queue", "cluster-queue"],
)
def test_scope_local_queue_or_cluster_queue(
    budget: Budget, waiting: list[str], admitted: list[str]
) -> None:
    s = _scheduler(budget)
    _submit(s, "a0", "a", 4)
    assert admitted_names(s.run_cycle(0)) == ["a0"]
    for name in ("a1", "b1", "c1"):
        _submit(s, name, name[0], 1, created=1)
    assert sorted(admitted_names(s.run_cycle(HOUR))) == admitted
    for name in waiting:
        assert s.explain(f"default/{name}").reason == PendingReason.BUDGET_EXCEEDED  # type: ignore[union-attr]
    assert budget.label in s.explain(f"default/{waiting[0]}").message  # type: ignore[union-attr]


def test_deleted_while_waiting_is_forgotten() -> None:
    s = _scheduler(_budget(resource_hours=0.0))
    _submit(s, "w", "a")
    assert admitted_names(s.run_cycle(0)) == []
    s.delete_workload("default/w")
    assert admitted_names(s.run_cycle(10 * HOUR)) == []
    assert s.phase("default/w") is None


def test_hours_are_printed_readably() -> None:
    assert format_hours(412.0) == "412.0"
    assert format_hours(400) == "400.0"
    assert format_hours(0.0123456) == "0.01235"
    assert format_hours(0.01) == "0.01"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ledger_sums_equal_the_overlaps_counted_one_by_one(seed: int) -> None:
    """The ledger keeps running sums (O(1) per read); random starts and stops over several
    windows, with a restore, read the same as summing each reservation's overlap."""
    import random

    rng = random.Random(seed)
    budget = _budget(period_ms=5 * HOUR, anchor_ms=HOUR)
    ledger = BudgetLedger((budget,))
    restore_at = rng.randrange(0, 3 * HOUR)
    ledger.restore(0, 1.25, restore_at)
    held: dict[str, tuple[int, float]] = {}
    ended: list[tuple[int, int, float]] = []
    now = restore_at
    for step in range(400):
        now += rng.randrange(0, 10 * 60_000)
        if held and rng.random() < 0.45:
            key = rng.choice(sorted(held))
            start, amount = held.pop(key)
            ended.append((start, now, amount))
            ledger.stop(key, now)
        else:
            key, amount = f"w{step}", rng.choice([1.0, 2.0, 0.5, 8.0])
            lq = rng.choice(["default/a", "default/b"])  # b: another scope, not counted
            if lq == "default/a":
                held[key] = (now, amount)
            ledger.start(key, local_queue=lq, cluster_queue="cq", amounts={GPU: amount}, now=now)
        window_start = budget.window(now)[0]
        since = max(window_start, restore_at)
        want = 1.25 * HOUR if window_start <= restore_at else 0.0
        for start, end, amount in ended:
            want += amount * max(0, end - max(start, since))
        for start, amount in held.values():
            want += amount * max(0, now - max(start, since))
        assert ledger.used_hours(0, now) == pytest.approx(want / HOUR, rel=1e-9, abs=1e-9)


def _preempting_scheduler(*budgets: Budget) -> Scheduler:
    """One 4-GPU ClusterQueue whose workloads preempt lower priorities in it."""
    s = Scheduler(config=SchedulerConfig(budgets=budgets))
    s.apply_resource_flavor(flavor("default"))
    s.apply_cluster_queue(
        MakeClusterQueue("cq")
        .resource_group(MakeFlavorQuotas("default").resource(GPU, 4))
        .preemption(within=PreemptionPolicy.LOWER_PRIORITY)
        .obj()
    )
    s.apply_local_queue(LocalQueue("default", "a", "cq"))
    s.apply_local_queue(LocalQueue("default", "b", "cq"))
    s.set_namespace("default", {})
    return s


def _victims(decisions: object) -> list[str]:
    return sorted(v.workload for p in getattr(decisions, "preempted", ()) for v in p.victims)


def test_over_a_preemptible_budget_is_admitted_and_preempted_first() -> None:
    """LocalQueue a used up its Preemptible budget: its next workload is admitted (nothing
    waits), says so, and ranks below every priority as a victim: b's lower-priority
    workload preempts it, not a's high-priority one admitted under budget."""
    s = _preempting_scheduler(_budget(resource_hours=2.0, when_exceeded=WhenExceeded.PREEMPTIBLE))
    s.add_workload(MakeWorkload("early").queue("a").request(GPU, 2).priority(100).obj())
    assert admitted_names(s.run_cycle(0)) == ["early"]
    s.add_workload(MakeWorkload("late").queue("a").request(GPU, 2).priority(100).created(1).obj())
    out = s.run_cycle(HOUR)  # 2 GPU-hours used of 2: over budget
    assert admitted_names(out) == ["late"]
    (admit,) = out.admitted
    assert admit.over_budget.startswith(
        "admitted preemptible while it runs: LocalQueue default/a used 2.0 of its 2.0"
    )
    assert [a.over_budget for a in s.run_cycle(HOUR).admitted] == []
    # b's priority-10 workload needs 2 GPUs: the over-budget one goes, priority 100 or not.
    s.add_workload(MakeWorkload("low").queue("b").request(GPU, 2).priority(10).created(2).obj())
    assert _victims(s.run_cycle(HOUR + 1)) == ["default/late"]


def test_under_budget_workloads_keep_their_priority_as_victims() -> None:
    """The same without a budget exceeded: the priority-10 workload preempts nobody."""
    s = _preempting_scheduler(_budget(resource_hours=100.0, when_exceeded=WhenExceeded.PREEMPTIBLE))
    s.add_workload(MakeWorkload("early").queue("a").request(GPU, 2).priority(100).obj())
    s.add_workload(MakeWorkload("late").queue("a").request(GPU, 2).priority(100).created(1).obj())
    assert admitted_names(s.run_cycle(0)) == ["early", "late"]
    s.add_workload(MakeWorkload("low").queue("b").request(GPU, 2).priority(10).created(2).obj())
    out = s.run_cycle(HOUR)
    assert _victims(out) == [] and admitted_names(out) == []


def test_a_wait_budget_still_waits_beside_a_preemptible_one() -> None:
    s = _scheduler(
        _budget(resource_hours=1.0),
        _budget(
            ScopeKind.CLUSTER_QUEUE,
            "cq",
            resource_hours=1.0,
            when_exceeded=WhenExceeded.PREEMPTIBLE,
        ),
    )
    _submit(s, "w1", "a", 2)
    assert admitted_names(s.run_cycle(0)) == ["w1"]
    _submit(s, "w2", "a", 1, created=1)
    _submit(s, "w3", "b", 1, created=2)
    out = s.run_cycle(HOUR)
    # a's own Wait budget is used up: w2 waits; b has only the Preemptible one: admitted.
    assert admitted_names(out) == ["w3"]
    assert s.explain("default/w2").reason == PendingReason.BUDGET_EXCEEDED  # type: ignore[union-attr]
    assert "ClusterQueue cq used 2.0 of its 1.0" in out.admitted[0].over_budget


def test_a_restored_over_budget_workload_stays_preemptible() -> None:
    s = _preempting_scheduler()
    s.add_workload(MakeWorkload("late").queue("a").request(GPU, 4).priority(100).obj())
    out = s.run_cycle(0)
    (admit,) = out.admitted
    restored = _preempting_scheduler()
    workload = MakeWorkload("late").queue("a").request(GPU, 4).priority(100).obj()
    restored.add_workload(workload)
    restored.delete_workload("default/late")
    restored.restore_admitted(workload, admit.admission, over_budget="admitted preemptible: x")
    restored.add_workload(MakeWorkload("low").queue("b").request(GPU, 2).priority(10).obj())
    assert _victims(restored.run_cycle(HOUR)) == ["default/late"]


def test_over_a_preemptible_budget_nobody_is_preempted_for_it() -> None:
    """Over its Preemptible budget, a high-priority workload is admitted only into free quota:
    preempting the running low-priority one would let that one preempt it back at once, and
    the two would evict each other in turn."""
    s = _preempting_scheduler(_budget(resource_hours=2.0, when_exceeded=WhenExceeded.PREEMPTIBLE))
    s.add_workload(MakeWorkload("used").queue("a").request(GPU, 2).priority(100).obj())
    assert admitted_names(s.run_cycle(0)) == ["used"]
    s.finish_workload("default/used", now=HOUR)  # 2 GPU-hours: a is over its budget
    s.add_workload(MakeWorkload("low").queue("b").request(GPU, 4).priority(10).created(1).obj())
    assert admitted_names(s.run_cycle(HOUR)) == ["low"]
    s.add_workload(MakeWorkload("high").queue("a").request(GPU, 4).priority(100).created(2).obj())
    for step in range(1, 6):
        out = s.run_cycle(HOUR + step)
        assert _victims(out) == [] and admitted_names(out) == []
    s.finish_workload("default/low", now=2 * HOUR)
    out = s.run_cycle(2 * HOUR)
    assert admitted_names(out) == ["high"] and out.admitted[0].over_budget
