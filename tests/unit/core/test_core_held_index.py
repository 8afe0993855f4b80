"""Held workloads are indexed by the LocalQueue they wait for: a queue change re-routes only
the workloads waiting for that queue (in ``seq`` order), never every held workload, and
still releases every workload the change concerns (a ClusterQueue created again, one no
longer terminating, a namespace selector that now matches, a LocalQueue started)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from core_builders import MakeClusterQueue, MakeFlavorQuotas, MakeWorkload, flavor

from phalanx.admission import routing
from phalanx.admission.decisions import PendingReason
from phalanx.admission.model import LabelSelector, LocalQueue, StopPolicy
from phalanx.admission.queues import HeldWorkloads
from phalanx.admission.records import Entry, Phase, Where
from phalanx.admission.scheduler import Scheduler


def queue(name: str, *, selector: LabelSelector | None = None) -> MakeClusterQueue:
    cq = MakeClusterQueue(name).resource_group(MakeFlavorQuotas("default").resource("cpu", "4"))
    return cq if selector is None else cq.namespace_selector(selector)


def wl(name: str, lq: str, cpu: str = "1", namespace: str = "default") -> MakeWorkload:
    return MakeWorkload(name, namespace).queue(lq).request("cpu", cpu)


def scheduler() -> Scheduler:
    s = Scheduler()
    s.apply_resource_flavor(flavor("default"))
    s.set_namespace("default", {})
    return s


@pytest.fixture
def routed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The keys ``routing.route`` is called with, in call order."""
    calls: list[str] = []
    real = routing.route

    def counting(s: Scheduler, entry: Entry) -> None:
        calls.append(entry.key)
        real(s, entry)

    monkeypatch.setattr(routing, "route", counting)
    yield calls


def held_reason(s: Scheduler, key: str) -> PendingReason | None:
    explanation = s.explain(key)
    return explanation.reason if explanation is not None else None


def check_index(s: Scheduler) -> None:
    """The index and the dict agree: every held workload is in exactly one place."""
    held = s.held
    assert isinstance(held, HeldWorkloads)
    grouped = held.group_sizes()
    assert sum(grouped.values()) <= len(held)
    for entry in held.values():
        assert entry.where == Where.HELD and entry.phase == Phase.PENDING
        assert s.entries[entry.key] is entry


def test_applying_one_local_queue_routes_only_its_own_held_workloads(routed: list[str]) -> None:
    s = scheduler()
    s.apply_cluster_queue(queue("cq").obj())
    for i in range(1000):
        s.add_workload(wl(f"w{i:04d}", f"lq{i % 100:02d}").obj())
    assert len(s.held) == 1000
    routed.clear()

    s.apply_local_queue(LocalQueue("default", "lq07", "cq"))

    mine = [f"default/w{i:04d}" for i in range(7, 1000, 100)]
    assert routed == mine  # 10 route calls, not 1,000; in seq order
    assert len(s.held) == 990
    assert all(s.entries[key].where == Where.QUEUED for key in mine)
    check_index(s)


def test_applying_a_cluster_queue_routes_only_the_workloads_waiting_for_it(
    routed: list[str],
) -> None:
    s = scheduler()
    for i in range(100):
        s.apply_local_queue(LocalQueue("default", f"lq{i:02d}", "even" if i % 2 == 0 else "odd"))
    for i in range(1000):
        s.add_workload(wl(f"w{i:04d}", f"lq{i % 100:02d}").obj())
    assert held_reason(s, "default/w0000") == PendingReason.CLUSTER_QUEUE_NOT_FOUND
    routed.clear()

    s.apply_cluster_queue(queue("even").obj())

    assert routed == [f"default/w{i:04d}" for i in range(0, 1000, 2)]
    assert len(s.held) == 500
    routed.clear()
    s.apply_cluster_queue(queue("even").obj())  # the same spec again: nothing waits for it
    assert routed == []
    check_index(s)


def test_reapplying_an_unchanged_local_queue_routes_nothing(routed: list[str]) -> None:
    s = scheduler()
    s.apply_local_queue(LocalQueue("default", "lq", "missing"))
    for i in range(50):
        s.add_workload(wl(f"w{i}", "lq").obj())
    routed.clear()
    s.apply_local_queue(LocalQueue("default", "lq", "missing"))
    s.apply_local_queue(LocalQueue("default", "other", "missing"))
    assert routed == []
    assert held_reason(s, "default/w0") == PendingReason.CLUSTER_QUEUE_NOT_FOUND


def test_inactive_workloads_are_left_alone_by_queue_changes(routed: list[str]) -> None:
    s = scheduler()
    s.add_workload(wl("off", "lq").inactive().obj())
    s.add_workload(wl("on", "lq").obj())
    routed.clear()
    s.apply_cluster_queue(queue("cq").obj())
    s.apply_local_queue(LocalQueue("default", "lq", "cq"))
    assert routed == ["default/on"]
    assert held_reason(s, "default/off") == PendingReason.INACTIVE_WORKLOAD
    s.add_workload(wl("off", "lq").obj())  # activated: a new version of the workload
    assert s.entries["default/off"].where == Where.QUEUED
    assert {a.workload for a in s.run_cycle(1).admitted} == {"default/on", "default/off"}
    assert len(s.held) == 0


def test_a_cluster_queue_deleted_and_created_again_takes_its_workloads_back() -> None:
    s = scheduler()
    s.apply_cluster_queue(queue("cq").obj())
    s.apply_local_queue(LocalQueue("default", "lq", "cq"))
    s.add_workload(wl("big", "lq", cpu="8").obj())  # never fits: stays queued
    s.run_cycle(1)
    s.delete_cluster_queue("cq")
    assert held_reason(s, "default/big") == PendingReason.CLUSTER_QUEUE_NOT_FOUND
    s.add_workload(wl("small", "lq").obj())
    s.apply_cluster_queue(queue("cq").obj())
    assert s.entries["default/big"].where == Where.QUEUED
    assert [a.workload for a in s.run_cycle(2).admitted] == ["default/small"]
    check_index(s)


def test_a_terminating_cluster_queue_applied_again_takes_its_held_workloads() -> None:
    s = scheduler()
    s.apply_cluster_queue(queue("cq").obj())
    s.apply_local_queue(LocalQueue("default", "lq", "cq"))
    s.add_workload(wl("running", "lq").obj())
    s.run_cycle(1)
    s.delete_cluster_queue("cq")  # "running" holds its quota: the queue is Terminating
    s.add_workload(wl("late", "lq").obj())
    assert held_reason(s, "default/late") == PendingReason.CLUSTER_QUEUE_NOT_FOUND
    s.apply_cluster_queue(queue("cq").obj())
    assert [a.workload for a in s.run_cycle(2).admitted] == ["default/late"]


def test_a_namespace_selector_that_now_matches_releases_the_workloads() -> None:
    s = scheduler()
    s.apply_cluster_queue(queue("cq", selector=LabelSelector({"team": "a"})).obj())
    s.apply_local_queue(LocalQueue("default", "lq", "cq"))
    s.add_workload(wl("w", "lq").obj())
    assert held_reason(s, "default/w") == PendingReason.NAMESPACE_MISMATCH
    s.apply_cluster_queue(queue("cq", selector=LabelSelector()).obj())
    assert [a.workload for a in s.run_cycle(1).admitted] == ["default/w"]


def test_a_stopped_local_queue_started_again_releases_its_workloads(routed: list[str]) -> None:
    s = scheduler()
    s.apply_cluster_queue(queue("cq").obj())
    s.apply_local_queue(LocalQueue("default", "lq", "cq", StopPolicy.HOLD))
    s.apply_local_queue(LocalQueue("default", "other", "cq", StopPolicy.HOLD))
    s.add_workload(wl("a", "lq").obj())
    s.add_workload(wl("b", "other").obj())
    assert held_reason(s, "default/a") == PendingReason.LOCAL_QUEUE_STOPPED
    routed.clear()
    s.apply_local_queue(LocalQueue("default", "lq", "cq"))
    assert routed == ["default/a"]
    assert [a.workload for a in s.run_cycle(1).admitted] == ["default/a"]
    assert held_reason(s, "default/b") == PendingReason.LOCAL_QUEUE_STOPPED
    check_index(s)


def test_deleted_and_replaced_workloads_leave_the_index() -> None:
    s = scheduler()
    for i in range(20):
        s.add_workload(wl(f"w{i}", f"lq{i % 4}").obj())
    for i in range(0, 20, 2):
        s.delete_workload(f"default/w{i}")
    for i in range(1, 20, 4):
        s.add_workload(wl(f"w{i}", "elsewhere").obj())  # moved to another LocalQueue
    held = s.held
    assert isinstance(held, HeldWorkloads)
    assert held.group_sizes() == {"default/lq3": 5, "default/elsewhere": 5}
    assert len(held) == 10
    check_index(s)


def routable(s: Scheduler, entry: Entry) -> bool:
    """Whether ``route`` would put ``entry`` in a ClusterQueue's queue now."""
    lq = s.local_queues.get(entry.local_queue)
    if not entry.workload.active or lq is None or lq.stop_policy != StopPolicy.NONE:
        return False
    state = s.queues.get(lq.cluster_queue)
    if state is None or state.terminating:
        return False
    selector = state.spec.namespace_selector
    return selector is not None and selector.matches(s.namespaces.get(entry.workload.namespace, {}))


def test_no_held_workload_is_routable_after_any_sequence_of_changes() -> None:
    """Seeded random walk over queue, namespace and workload changes: after every step, no
    held workload could be queued (the index never misses a group a change concerns)."""
    import random

    rng = random.Random(20260101)
    s = scheduler()
    s.set_namespace("team", {"team": "a"})
    selectors = [LabelSelector(), LabelSelector({"team": "a"}), None]
    for step in range(600):
        op = rng.randrange(9)
        cq = f"cq{rng.randrange(3)}"
        lq = f"lq{rng.randrange(6)}"
        ns = rng.choice(["default", "team"])
        if op == 0:
            s.apply_cluster_queue(queue(cq, selector=rng.choice(selectors)).obj())
        elif op == 1:
            s.delete_cluster_queue(cq)
        elif op == 2:
            stop = rng.choice([StopPolicy.NONE, StopPolicy.NONE, StopPolicy.HOLD])
            s.apply_local_queue(LocalQueue(ns, lq, cq, stop))
        elif op == 3:
            s.delete_local_queue(ns, lq)
        elif op == 4:
            s.set_namespace(ns, rng.choice([{}, {"team": "a"}]))
        elif op in (5, 6):
            made = wl(f"w{rng.randrange(60)}", lq, cpu=rng.choice(["1", "3"]), namespace=ns)
            s.add_workload((made.inactive() if rng.random() < 0.1 else made).obj())
        elif op == 7:
            s.delete_workload(f"{ns}/w{rng.randrange(60)}")
        else:
            result = s.run_cycle(step)
            for admit in result.admitted:
                if rng.random() < 0.5:
                    s.finish_workload(admit.workload)
        stuck = [e.key for e in s.held.values() if routable(s, e)]
        assert stuck == [], f"step {step}: held but routable: {stuck}"
        check_index(s)
