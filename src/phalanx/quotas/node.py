"""One node of the quota tree (a ClusterQueue or a Cohort) and its arithmetic.

Every node has, per flavor-resource, as in Kueue's ``resource_node.go``:

* ``subtree``: its own nominal quota plus what its children lend to it (a child lends its
  subtree quota minus its ``local`` part);
* ``local``: the part of ``subtree`` kept for the node's own subtree because of a lending
  limit (``subtree - lending_limit``, or 0 when the node lends everything);
* ``usage``: for a ClusterQueue, what its admitted workloads use; for a Cohort, the sum of
  its children's usage beyond their ``local`` part.

The tree (``tree.ResourceTree``) owns structure; this module answers "how much is available"
and applies usage along the path to the root.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from phalanx.quotas.resources import FlavorResource, ResourceQuota

__all__ = [
    "DEFAULT_WEIGHT",
    "QuotaNode",
    "add_usage",
    "next_quota_version",
    "rebuild",
    "remove_usage",
    "track_borrowing",
]

# Quota versions are unique across all trees, so a node that moves to another tree never
# mistakes that tree's version for its own memo's.
_QUOTA_VERSIONS = itertools.count(1)

DEFAULT_WEIGHT = 1000
"""Fair-sharing weight 1, in thousandths (weights may be fractional: ``0.5`` is 500)."""


def next_quota_version() -> int:
    return next(_QUOTA_VERSIONS)


class QuotaNode:
    """One ClusterQueue or Cohort in the tree. Read its fields; mutate through the tree."""

    __slots__ = (
        "borrow_limit",
        "borrowers",
        "children",
        "explicit",
        "fair_weight",
        "is_cohort",
        "local",
        "name",
        "parent",
        "potential",
        "potential_version",
        "quota_version",
        "quotas",
        "root",
        "subtree",
        "usage",
        "version",
    )

    def __init__(self, name: str, *, is_cohort: bool) -> None:
        self.name = name
        self.is_cohort = is_cohort
        self.parent: QuotaNode | None = None
        self.children: dict[str, QuotaNode] = {}
        self.quotas: dict[FlavorResource, ResourceQuota] = {}
        self.borrow_limit: dict[FlavorResource, int] = {}
        self.subtree: dict[FlavorResource, int] = {}
        self.local: dict[FlavorResource, int] = {}
        self.usage: dict[FlavorResource, int] = {}
        self.fair_weight = DEFAULT_WEIGHT
        # A cohort named only by a ClusterQueue's cohortName has no object of its own.
        self.explicit = not is_cohort
        self.root: QuotaNode = self
        # Bumped on the root for every change in the tree, so callers can memoise answers.
        self.version = 0
        # On a root: for each flavor-resource, the ClusterQueues of the tree using more than
        # their nominal quota of it. Kept current on every usage change, so "who is
        # borrowing" (preemption candidates, explanations) never scans the whole cohort.
        # (Insertion-ordered dicts used as sets: iteration is deterministic without sorting.)
        self.borrowers: dict[FlavorResource, dict[QuotaNode, None]] = {}
        # potential_available depends on quotas only: memoised per quota version of the root
        # (bumped on every quota change in the tree).
        self.potential: dict[FlavorResource, int] = {}
        self.potential_version = 0
        self.quota_version = 0

    def __repr__(self) -> str:
        kind = "Cohort" if self.is_cohort else "ClusterQueue"
        return f"<{kind} {self.name}>"

    def nominal(self, fr: FlavorResource) -> int:
        quota = self.quotas.get(fr)
        return quota.nominal if quota is not None else 0

    def path_to_root(self) -> Iterator[QuotaNode]:
        node: QuotaNode | None = self
        while node is not None:
            yield node
            node = node.parent

    def walk(self) -> Iterator[QuotaNode]:
        """This node and every node below it, parents before children, in name order."""
        yield self
        for name in sorted(self.children):
            yield from self.children[name].walk()

    def cluster_queues(self) -> Iterator[QuotaNode]:
        return (node for node in self.walk() if not node.is_cohort)

    # -- Kueue's resource_node.go, one idea per method -------------------------------------

    def local_available(self, fr: FlavorResource) -> int:
        """Unused quota this node keeps for itself (invisible to its parent)."""
        return max(0, self.local.get(fr, 0) - self.usage.get(fr, 0))

    def available(self, fr: FlavorResource) -> int:
        """How much more of ``fr`` this node may use now, borrowing included.

        Negative after over-admission (quota lowered under running workloads).
        """
        parent = self.parent
        if parent is None:
            return self.subtree.get(fr, 0) - self.usage.get(fr, 0)
        parent_available = parent.available(fr)
        limit = self.borrow_limit.get(fr)
        local = self.local.get(fr, 0)
        used = self.usage.get(fr, 0)
        if limit is not None:
            stored_in_parent = self.subtree.get(fr, 0) - local
            used_in_parent = max(0, used - local)
            parent_available = min(stored_in_parent - used_in_parent + limit, parent_available)
        return max(0, local - used) + parent_available

    def potential_available(self, fr: FlavorResource) -> int:
        """The most this node could use if nothing else in the tree used anything."""
        version = self.root.quota_version
        if self.potential_version != version:
            self.potential = {}
            self.potential_version = version
        known = self.potential.get(fr)
        if known is not None:
            return known
        parent = self.parent
        if parent is None:
            available = self.subtree.get(fr, 0)
        else:
            available = self.local.get(fr, 0) + parent.potential_available(fr)
            limit = self.borrow_limit.get(fr)
            if limit is not None:
                available = min(self.subtree.get(fr, 0) + limit, available)
        self.potential[fr] = available
        return available

    def borrowing_with(self, fr: FlavorResource, amount: int) -> bool:
        """Whether using ``amount`` more would take this node past its own subtree quota."""
        return self.usage.get(fr, 0) + amount > self.subtree.get(fr, 0)

    def is_borrowing(self, fr: FlavorResource) -> bool:
        return self.usage.get(fr, 0) > self.subtree.get(fr, 0)

    def borrowing_height(self, fr: FlavorResource, amount: int) -> int:
        """Kueue's borrowing level: 0 when ``amount`` fits in this node's own quota, else the
        height of the lowest enclosing cohort whose subtree quota holds it (the whole tree's
        height when none does). Lower is preferred when ordering and choosing flavors."""
        if self.parent is None or not self.borrowing_with(fr, amount):
            return 0
        remaining = amount - self.local_available(fr)
        node = self.parent
        while node is not None:
            if not node.borrowing_with(fr, remaining):
                return _height(node)
            remaining -= node.local_available(fr)
            if node.parent is None:
                return _height(node)
            node = node.parent
        return 0  # pragma: no cover - the loop always returns at the root

    def within_nominal(self, frs: Iterator[FlavorResource] | tuple[FlavorResource, ...]) -> bool:
        return all(self.usage.get(fr, 0) <= self.subtree.get(fr, 0) for fr in frs)


def _height(node: QuotaNode) -> int:
    """Distance from ``node`` to its furthest leaf (a cohort holding only queues is 1)."""
    best = min(len(node.children), 1)
    for child in node.children.values():
        if child.is_cohort:
            best = max(best, _height(child) + 1)
    return best


def add_usage(node: QuotaNode, fr: FlavorResource, amount: int) -> None:
    local_available = node.local_available(fr)
    node.usage[fr] = node.usage.get(fr, 0) + amount
    if node.parent is not None and amount > local_available:
        add_usage(node.parent, fr, amount - local_available)


def remove_usage(node: QuotaNode, fr: FlavorResource, amount: int) -> None:
    stored_in_parent = node.usage.get(fr, 0) - node.local.get(fr, 0)
    left = node.usage.get(fr, 0) - amount
    if left:
        node.usage[fr] = left
    else:
        node.usage.pop(fr, None)
    if stored_in_parent <= 0 or node.parent is None:
        return
    remove_usage(node.parent, fr, min(amount, stored_in_parent))


def track_borrowing(node: QuotaNode, fr: FlavorResource) -> None:
    if node.parent is None:
        return
    borrowers = node.root.borrowers
    if node.usage.get(fr, 0) > node.subtree.get(fr, 0):
        found = borrowers.get(fr)
        if found is None:
            borrowers[fr] = {node: None}
        else:
            found[node] = None
    else:
        found = borrowers.get(fr)
        if found is not None:
            found.pop(node, None)
            if not found:
                del borrowers[fr]


def rebuild(node: QuotaNode, root: QuotaNode) -> None:
    node.root = root
    node.borrow_limit = {
        fr: q.borrowing_limit for fr, q in node.quotas.items() if q.borrowing_limit is not None
    }
    subtree = {fr: q.nominal for fr, q in node.quotas.items()}
    if node.is_cohort:
        usage: dict[FlavorResource, int] = {}
        for child in node.children.values():
            rebuild(child, root)
            for fr, quota in child.subtree.items():
                subtree[fr] = subtree.get(fr, 0) + quota - child.local.get(fr, 0)
            for fr, used in child.usage.items():
                stored = max(0, used - child.local.get(fr, 0))
                if stored:
                    usage[fr] = usage.get(fr, 0) + stored
        node.usage = usage
    node.subtree = subtree
    node.local = {
        fr: max(0, subtree.get(fr, 0) - q.lending_limit)
        for fr, q in node.quotas.items()
        if q.lending_limit is not None
    }
