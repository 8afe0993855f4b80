"""The quota tree: nominal quota, borrowing and lending limits, cohorts, usage, fair share.

Cases follow Kueue's documentation (concepts/cluster_queue.md "Borrowing example",
"BorrowingLimit", "LendingLimit"; concepts/cohort.md for hierarchical cohorts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from phalanx.quotas.fairshare import INFINITE_SHARE, dominant_resource_share
from phalanx.quotas.resources import ResourceQuota
from phalanx.quotas.tree import CohortCycleError, QuotaTreeError, ResourceTree, check_invariants

CPU = ("default", "cpu")


@dataclass
class TreeCase:
    name: str
    queues: dict[str, tuple[str | None, ResourceQuota]]
    usage: dict[str, int] = field(default_factory=dict)
    cohorts: dict[str, tuple[str | None, int]] = field(default_factory=dict)
    """cohort -> (parent, own nominal quota)"""
    available: dict[str, int] = field(default_factory=dict)
    potential: dict[str, int] = field(default_factory=dict)


def build(case: TreeCase) -> ResourceTree:
    tree = ResourceTree()
    for name, (parent, nominal) in case.cohorts.items():
        tree.set_cohort(name, parent=parent, quotas={CPU: ResourceQuota(nominal)})
    for name, (cohort, quota) in case.queues.items():
        tree.set_cluster_queue(name, cohort=cohort, quotas={CPU: quota})
    for name, amount in case.usage.items():
        tree.add_usage(tree.cluster_queue(name), {CPU: amount})
    return tree


CASES = [
    TreeCase(
        "lone queue: nominal minus usage",
        queues={"a": (None, ResourceQuota(10))},
        usage={"a": 4},
        available={"a": 6},
        potential={"a": 10},
    ),
    TreeCase(
        "docs borrowing example: team-a can use 9+12 when team-b is idle",
        queues={"a": ("ab", ResourceQuota(9)), "b": ("ab", ResourceQuota(12))},
        available={"a": 21, "b": 21},
        potential={"a": 21},
    ),
    TreeCase(
        "borrowing limit 1: team-a is capped at 9+1",
        queues={"a": ("ab", ResourceQuota(9, borrowing_limit=1)), "b": ("ab", ResourceQuota(12))},
        available={"a": 10, "b": 21},
        potential={"a": 10, "b": 21},
    ),
    TreeCase(
        "usage of one queue is not available to the other",
        queues={"a": ("ab", ResourceQuota(9)), "b": ("ab", ResourceQuota(12))},
        usage={"b": 15},
        available={"a": 6, "b": 6},
    ),
    TreeCase(
        "lending limit: team-b lends only 2 of its 12",
        queues={"a": ("ab", ResourceQuota(9)), "b": ("ab", ResourceQuota(12, lending_limit=2))},
        available={"a": 11, "b": 21},
        potential={"a": 11},
    ),
    TreeCase(
        "usage inside the non-lent part does not touch the cohort",
        queues={"a": ("ab", ResourceQuota(9)), "b": ("ab", ResourceQuota(12, lending_limit=2))},
        usage={"b": 10},
        available={"a": 11, "b": 11},
    ),
    TreeCase(
        "borrowed lendable quota is not available to its lender",
        queues={"a": ("ab", ResourceQuota(9)), "b": ("ab", ResourceQuota(12, lending_limit=2))},
        usage={"a": 11},
        available={"a": 0, "b": 10},
    ),
    TreeCase(
        "a Cohort object's own quota is shared by its queues",
        queues={"a": ("ab", ResourceQuota(5)), "b": ("ab", ResourceQuota(5))},
        cohorts={"ab": (None, 10)},
        available={"a": 20},
    ),
    TreeCase(
        "hierarchical cohorts: quota flows up and down the tree",
        queues={"a": ("left", ResourceQuota(4)), "b": ("right", ResourceQuota(6))},
        cohorts={"left": ("root", 0), "right": ("root", 0), "root": (None, 10)},
        usage={"b": 12},
        available={"a": 8, "b": 8},
        potential={"a": 20},
    ),
    TreeCase(
        "borrowing limit bounds what comes from the whole tree",
        queues={
            "a": ("left", ResourceQuota(4, borrowing_limit=3)),
            "b": ("right", ResourceQuota(6)),
        },
        cohorts={"left": ("root", 0), "right": ("root", 0), "root": (None, 10)},
        available={"a": 7},
        potential={"a": 7},
    ),
    TreeCase(
        "over-admission after a quota cut shows as negative availability",
        queues={"a": (None, ResourceQuota(4))},
        usage={"a": 6},
        available={"a": -2},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_available(case: TreeCase) -> None:
    tree = build(case)
    for name, expected in case.available.items():
        assert tree.cluster_queue(name).available(CPU) == expected, name
    for name, expected in case.potential.items():
        assert tree.cluster_queue(name).potential_available(CPU) == expected, name


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_add_then_remove_restores_every_node(case: TreeCase) -> None:
    tree = build(case)
    before = {root.name: [(n.name, dict(n.usage)) for n in root.walk()] for root in tree.roots()}
    for name in case.queues:
        node = tree.cluster_queue(name)
        tree.add_usage(node, {CPU: 3})
        tree.remove_usage(node, {CPU: 3})
    after = {root.name: [(n.name, dict(n.usage)) for n in root.walk()] for root in tree.roots()}
    assert after == before


@pytest.mark.parametrize(
    ("usage", "amount", "expected"),
    [
        (0, 5, 0),  # within nominal
        (5, 1, 1),  # from the flat cohort
        (3, 3, 1),
    ],
)
def test_borrowing_height_flat(usage: int, amount: int, expected: int) -> None:
    tree = ResourceTree()
    tree.set_cluster_queue("a", cohort="c", quotas={CPU: ResourceQuota(5)})
    tree.set_cluster_queue("b", cohort="c", quotas={CPU: ResourceQuota(5)})
    tree.add_usage(tree.cluster_queue("a"), {CPU: usage})
    assert tree.cluster_queue("a").borrowing_height(CPU, amount) == expected


def test_borrowing_height_grows_with_distance() -> None:
    tree = ResourceTree()
    tree.set_cohort("left", parent="root")
    tree.set_cohort("right", parent="root")
    tree.set_cluster_queue("a1", cohort="left", quotas={CPU: ResourceQuota(2)})
    tree.set_cluster_queue("a2", cohort="left", quotas={CPU: ResourceQuota(2)})
    tree.set_cluster_queue("b", cohort="right", quotas={CPU: ResourceQuota(10)})
    a1 = tree.cluster_queue("a1")
    assert a1.borrowing_height(CPU, 2) == 0
    assert a1.borrowing_height(CPU, 4) == 1  # the sibling's quota is enough
    assert a1.borrowing_height(CPU, 8) == 2  # needs the other subtree


def test_moving_a_queue_keeps_its_usage_and_updates_both_cohorts() -> None:
    tree = ResourceTree()
    tree.set_cluster_queue("a", cohort="x", quotas={CPU: ResourceQuota(5)})
    tree.set_cluster_queue("b", cohort="x", quotas={CPU: ResourceQuota(5)})
    tree.set_cluster_queue("c", cohort="y", quotas={CPU: ResourceQuota(5)})
    tree.add_usage(tree.cluster_queue("a"), {CPU: 7})
    tree.set_cluster_queue("a", cohort="y", quotas={CPU: ResourceQuota(5)})
    assert tree.cluster_queue("a").usage[CPU] == 7
    assert tree.cluster_queue("b").available(CPU) == 5
    assert tree.cluster_queue("c").available(CPU) == 3
    assert check_invariants(tree) == []


def test_removing_a_cohort_object_keeps_the_implicit_cohort() -> None:
    tree = ResourceTree()
    tree.set_cohort("ab", quotas={CPU: ResourceQuota(10)})
    tree.set_cluster_queue("a", cohort="ab", quotas={CPU: ResourceQuota(1)})
    tree.set_cluster_queue("b", cohort="ab", quotas={CPU: ResourceQuota(1)})
    assert tree.cluster_queue("a").available(CPU) == 12
    tree.remove_cohort("ab")
    assert tree.cluster_queue("a").available(CPU) == 2
    assert tree.cohort("ab") is not None


def test_an_unreferenced_implicit_cohort_disappears() -> None:
    tree = ResourceTree()
    tree.set_cluster_queue("a", cohort="gone", quotas={CPU: ResourceQuota(1)})
    tree.set_cluster_queue("a", cohort=None, quotas={CPU: ResourceQuota(1)})
    assert tree.cohort("gone") is None


def test_cycle_is_refused_and_nothing_changes() -> None:
    tree = ResourceTree()
    tree.set_cohort("child", parent="top")
    tree.set_cohort("top")
    with pytest.raises(CohortCycleError, match=r"spec\.parentName"):
        tree.set_cohort("top", parent="child")
    top = tree.cohort("top")
    assert top is not None and top.parent is None


def test_limits_without_a_cohort_are_rejected_with_the_field() -> None:
    tree = ResourceTree()
    with pytest.raises(QuotaTreeError, match="borrowing or lending limit without a cohort"):
        tree.set_cluster_queue("a", cohort=None, quotas={CPU: ResourceQuota(1, borrowing_limit=1)})


def test_negative_quota_is_rejected() -> None:
    with pytest.raises(ValueError, match="nominal must be non-negative"):
        ResourceQuota(-1)


def test_invariant_checker_reports_overuse() -> None:
    tree = ResourceTree()
    tree.set_cluster_queue("a", cohort="c", quotas={CPU: ResourceQuota(2, borrowing_limit=1)})
    tree.set_cluster_queue("b", cohort="c", quotas={CPU: ResourceQuota(10)})
    tree.add_usage(tree.cluster_queue("a"), {CPU: 4})
    assert any("quota+borrowing 3" in p for p in check_invariants(tree))


@pytest.mark.parametrize(
    ("usage_a", "weight", "expected"),
    [
        (5, 1000, 0),  # within nominal: no share
        (8, 1000, 300_000),  # borrows 3 of 10 lendable -> 300 per mille
        (8, 2000, 150_000),  # weight 2 halves it
        (8, 0, INFINITE_SHARE),  # weight 0 while borrowing
    ],
)
def test_dominant_resource_share(usage_a: int, weight: int, expected: int) -> None:
    tree = ResourceTree()
    tree.set_cluster_queue("a", cohort="c", quotas={CPU: ResourceQuota(5)}, fair_weight=weight)
    tree.set_cluster_queue("b", cohort="c", quotas={CPU: ResourceQuota(5)})
    tree.add_usage(tree.cluster_queue("a"), {CPU: usage_a})
    share = dominant_resource_share(tree.cluster_queue("a"))
    assert share.value == expected
    assert share.borrowing == (expected > 0)


def test_share_counts_the_resource_that_dominates() -> None:
    gpu = ("default", "gpu")
    tree = ResourceTree()
    quotas = {CPU: ResourceQuota(10), gpu: ResourceQuota(4)}
    tree.set_cluster_queue("a", cohort="c", quotas=quotas)
    tree.set_cluster_queue("b", cohort="c", quotas=quotas)
    tree.add_usage(tree.cluster_queue("a"), {CPU: 11, gpu: 6})
    share = dominant_resource_share(tree.cluster_queue("a"))
    assert share.dominant_resource == "gpu"
    assert share.weighted_share == 250  # 2 of 8 lendable GPUs


def _snapshot(tree: ResourceTree) -> dict[str, tuple[dict[object, int], ...]]:
    top = tree.cohort("top")
    assert top is not None
    return {n.name: (dict(n.subtree), dict(n.local), dict(n.usage)) for n in top.walk()}


@pytest.mark.parametrize("lending", [None, 0, 3, 50])
def test_adding_queues_one_by_one_matches_a_full_rebuild(lending: int | None) -> None:
    tree = ResourceTree()
    tree.set_cohort("top", quotas={CPU: ResourceQuota(5)})
    tree.set_cohort("mid", parent="top", quotas={CPU: ResourceQuota(2, lending_limit=lending)})
    tree.set_cluster_queue("early", cohort="mid", quotas={CPU: ResourceQuota(4)})
    tree.add_usage(tree.cluster_queue("early"), {CPU: 7})
    for i in range(5):
        parent = "mid" if i % 2 else "top"
        tree.set_cluster_queue(f"q{i}", cohort=parent, quotas={CPU: ResourceQuota(i, None, 1)})
        incremental = _snapshot(tree)
        potential = tree.cluster_queue(f"q{i}").potential_available(CPU)
        tree.set_cohort("top", quotas={CPU: ResourceQuota(5)})  # forces a full rebuild
        assert _snapshot(tree) == incremental
        assert tree.cluster_queue(f"q{i}").potential_available(CPU) == potential
    assert check_invariants(tree) == []
