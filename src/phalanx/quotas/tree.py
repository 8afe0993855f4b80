"""The ClusterQueue/Cohort resource tree: nominal quota, borrowing and lending limits, usage.

The arithmetic follows Kueue's ``resource_node.go``. Every node (ClusterQueue or Cohort) has:

* ``subtree``: its own nominal quota plus what its children lend to it (a child lends its
  subtree quota minus its ``local`` part);
* ``local``: the part of ``subtree`` kept for the node's own subtree because of a lending
  limit (``subtree - lending_limit``, or 0 when the node lends everything);
* ``usage``: for a ClusterQueue, what its admitted workloads use; for a Cohort, the sum of
  its children's usage beyond their ``local`` part.

Usage changes are applied incrementally along the path to the root (``add_usage`` /
``remove_usage``), so an admission costs O(depth) whatever the size of the cohort. Only a
structural change (a quota edited, a ClusterQueue moved) recomputes a whole root tree.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

from phalanx.quotas.resources import FlavorResource, ResourceQuota, Usage

__all__ = [
    "CohortCycleError",
    "QuotaNode",
    "QuotaTreeError",
    "ResourceTree",
    "check_invariants",
]

# Quota versions are unique across all trees, so a node that moves to another tree never
# mistakes that tree's version for its own memo's.
_QUOTA_VERSIONS = itertools.count(1)

DEFAULT_WEIGHT = 1000
"""Fair-sharing weight 1, in thousandths (weights may be fractional: ``0.5`` is 500)."""


class QuotaTreeError(ValueError):
    """A tree operation that cannot be applied (unknown node, bad limit)."""


class CohortCycleError(QuotaTreeError):
    """Setting a Cohort's parent would make the cohort graph cyclic."""


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


def _add_usage(node: QuotaNode, fr: FlavorResource, amount: int) -> None:
    local_available = node.local_available(fr)
    node.usage[fr] = node.usage.get(fr, 0) + amount
    if node.parent is not None and amount > local_available:
        _add_usage(node.parent, fr, amount - local_available)


def _remove_usage(node: QuotaNode, fr: FlavorResource, amount: int) -> None:
    stored_in_parent = node.usage.get(fr, 0) - node.local.get(fr, 0)
    left = node.usage.get(fr, 0) - amount
    if left:
        node.usage[fr] = left
    else:
        node.usage.pop(fr, None)
    if stored_in_parent <= 0 or node.parent is None:
        return
    _remove_usage(node.parent, fr, min(amount, stored_in_parent))


class ResourceTree:
    """All ClusterQueues and Cohorts, as a forest of quota trees.

    ClusterQueues are leaves; cohorts exist either because a Cohort object was applied
    (``set_cohort``) or because some ClusterQueue or Cohort names them (implicit cohorts).
    """

    def __init__(self) -> None:
        self._queues: dict[str, QuotaNode] = {}
        self._cohorts: dict[str, QuotaNode] = {}

    # -- lookup ------------------------------------------------------------------------------

    def cluster_queue(self, name: str) -> QuotaNode:
        try:
            return self._queues[name]
        except KeyError:
            raise QuotaTreeError(f"ClusterQueue {name!r} is not in the quota tree") from None

    def has_cluster_queue(self, name: str) -> bool:
        return name in self._queues

    def cohort(self, name: str) -> QuotaNode | None:
        return self._cohorts.get(name)

    def cluster_queue_names(self) -> list[str]:
        return sorted(self._queues)

    def roots(self) -> list[QuotaNode]:
        found = {id(node.root): node.root for node in self._queues.values()}
        for cohort in self._cohorts.values():
            found.setdefault(id(cohort.root), cohort.root)
        return sorted(found.values(), key=lambda n: (n.name, n.is_cohort))

    # -- structure ---------------------------------------------------------------------------

    def set_cluster_queue(
        self,
        name: str,
        *,
        cohort: str | None,
        quotas: Mapping[FlavorResource, ResourceQuota],
        fair_weight: int = DEFAULT_WEIGHT,
    ) -> None:
        """Add or update a ClusterQueue; its usage is kept across updates."""
        _check_limits(name, quotas, has_parent=cohort is not None)
        node = self._queues.get(name)
        if node is None:
            node = QuotaNode(name, is_cohort=False)
            self._queues[name] = node
            node.quotas = dict(quotas)
            node.fair_weight = fair_weight
            if cohort:
                # A new, empty queue joining a cohort: add its quota along the path instead
                # of rebuilding the tree (keeps loading N queues O(N x depth)).
                self._attach_new_leaf(node, self._implicit_cohort(cohort))
            else:
                self._recompute(node)
            return
        old_root = node.root
        node.quotas = dict(quotas)
        node.fair_weight = fair_weight
        self._reparent(node, self._implicit_cohort(cohort) if cohort else None)
        self._recompute(old_root)
        self._recompute(node)

    def _attach_new_leaf(self, node: QuotaNode, parent: QuotaNode) -> None:
        parent.children[node.name] = node
        node.parent = parent
        root = parent.root
        _rebuild(node, root)
        deltas = {fr: quota - node.local.get(fr, 0) for fr, quota in node.subtree.items()}
        ancestor: QuotaNode | None = parent
        while ancestor is not None and deltas:
            passed: dict[FlavorResource, int] = {}
            for fr, delta in deltas.items():
                old_subtree = ancestor.subtree.get(fr, 0)
                old_local = ancestor.local.get(fr, 0)
                new_subtree = old_subtree + delta
                ancestor.subtree[fr] = new_subtree
                quota = ancestor.quotas.get(fr)
                new_local = old_local
                if quota is not None and quota.lending_limit is not None:
                    new_local = max(0, new_subtree - quota.lending_limit)
                    ancestor.local[fr] = new_local
                if new_local != old_local and ancestor.usage.get(fr, 0):
                    # Where this cohort's usage is stored moved: recompute it all.
                    self._recompute(root)
                    return
                upward = (new_subtree - new_local) - (old_subtree - old_local)
                if upward:
                    passed[fr] = upward
            ancestor = ancestor.parent
            deltas = passed
        root.quota_version = next(_QUOTA_VERSIONS)
        root.version += 1

    def remove_cluster_queue(self, name: str) -> None:
        """Drop a ClusterQueue (its usage leaves the cohort with it)."""
        node = self._queues.pop(name, None)
        if node is None:
            return
        old_root = node.root
        self._reparent(node, None)
        if old_root is not node:
            self._recompute(old_root)

    def set_cohort(
        self,
        name: str,
        *,
        parent: str | None = None,
        quotas: Mapping[FlavorResource, ResourceQuota] | None = None,
        fair_weight: int = DEFAULT_WEIGHT,
    ) -> None:
        """Apply a Cohort object: its own quota, its parent cohort, its fair-sharing weight.

        Raises CohortCycleError, changing nothing, if ``parent`` is ``name`` or below it.
        """
        if parent is not None:
            ancestor = self._cohorts.get(parent)
            if parent == name or (
                ancestor is not None and any(n.name == name for n in ancestor.path_to_root())
            ):
                raise CohortCycleError(
                    f"Cohort {name!r}: spec.parentName {parent!r} makes the cohort tree cyclic;"
                    " choose a parent that is not below this cohort"
                )
        node = self._cohorts.get(name)
        if node is None:
            node = QuotaNode(name, is_cohort=True)
            self._cohorts[name] = node
        _check_limits(name, quotas or {}, has_parent=parent is not None)
        old_root = node.root
        node.explicit = True
        node.quotas = dict(quotas or {})
        node.fair_weight = fair_weight
        self._reparent(node, self._implicit_cohort(parent) if parent else None)
        self._recompute(old_root)
        self._recompute(node)

    def remove_cohort(self, name: str) -> None:
        """Delete a Cohort object. Queues naming it keep it alive as a plain (implicit) cohort."""
        node = self._cohorts.get(name)
        if node is None:
            return
        old_root = node.root
        node.explicit = False
        node.quotas = {}
        node.fair_weight = DEFAULT_WEIGHT
        parent = node.parent
        self._reparent(node, None)
        self._forget_if_unused(node)
        if parent is not None:
            self._forget_if_unused(parent)
        self._recompute(old_root)
        self._recompute(node)

    def _implicit_cohort(self, name: str) -> QuotaNode:
        node = self._cohorts.get(name)
        if node is None:
            node = QuotaNode(name, is_cohort=True)
            self._cohorts[name] = node
        return node

    def _reparent(self, node: QuotaNode, parent: QuotaNode | None) -> None:
        old = node.parent
        if old is parent:
            return
        if old is not None:
            del old.children[node.name]
            node.parent = None
            self._forget_if_unused(old)
            self._recompute(old.root)
        if parent is not None:
            parent.children[node.name] = node
            node.parent = parent

    def _forget_if_unused(self, node: QuotaNode) -> None:
        if node.is_cohort and not node.explicit and not node.children:
            parent = node.parent
            if parent is not None:
                del parent.children[node.name]
                node.parent = None
                self._forget_if_unused(parent)
            self._cohorts.pop(node.name, None)

    def _recompute(self, node: QuotaNode) -> None:
        """Rebuild derived quota and cohort usage of ``node``'s whole tree from ClusterQueue
        usage (``node`` may be any node of it)."""
        top = node
        while top.parent is not None:
            top = top.parent
        _rebuild(top, top)
        top.quota_version = next(_QUOTA_VERSIONS)
        top.borrowers = {}
        for leaf in top.cluster_queues():
            for fr in leaf.usage:
                _track_borrowing(leaf, fr)
        top.version += 1

    # -- usage -------------------------------------------------------------------------------

    def add_usage(self, cluster_queue: QuotaNode, usage: Usage) -> None:
        for fr, amount in usage.items():
            if amount:
                _add_usage(cluster_queue, fr, amount)
                _track_borrowing(cluster_queue, fr)
        cluster_queue.root.version += 1

    def remove_usage(self, cluster_queue: QuotaNode, usage: Usage) -> None:
        for fr, amount in usage.items():
            if amount:
                _remove_usage(cluster_queue, fr, amount)
                _track_borrowing(cluster_queue, fr)
        cluster_queue.root.version += 1


def _track_borrowing(node: QuotaNode, fr: FlavorResource) -> None:
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


def _rebuild(node: QuotaNode, root: QuotaNode) -> None:
    node.root = root
    node.borrow_limit = {
        fr: q.borrowing_limit for fr, q in node.quotas.items() if q.borrowing_limit is not None
    }
    subtree = {fr: q.nominal for fr, q in node.quotas.items()}
    if node.is_cohort:
        usage: dict[FlavorResource, int] = {}
        for child in node.children.values():
            _rebuild(child, root)
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


def _check_limits(
    name: str, quotas: Mapping[FlavorResource, ResourceQuota], *, has_parent: bool
) -> None:
    if has_parent:
        return
    for (flavor, resource), quota in quotas.items():
        if quota.borrowing_limit is not None or quota.lending_limit is not None:
            raise QuotaTreeError(
                f"{name}: flavor {flavor!r} resource {resource!r} sets a borrowing or lending"
                " limit without a cohort; set a cohort or remove the limit"
            )


def check_invariants(tree: ResourceTree) -> list[str]:
    """Every way usage in ``tree`` exceeds what quotas and limits allow, as messages.

    Used by tests and by the bench to assert that admission never over-commits: a root's
    usage stays within its subtree quota and a node with a borrowing limit never uses more
    than its subtree quota plus that limit.
    """
    problems: list[str] = []
    for root in tree.roots():
        for node in root.walk():
            frs = set(node.usage) | set(node.subtree)
            for fr in sorted(frs):
                used = node.usage.get(fr, 0)
                if node.parent is None and used > node.subtree.get(fr, 0):
                    problems.append(
                        f"{node!r} {fr}: usage {used} > quota {node.subtree.get(fr, 0)}"
                    )
                limit = node.borrow_limit.get(fr)
                if node.parent is not None and limit is not None:
                    cap = node.subtree.get(fr, 0) + limit
                    if used > cap:
                        problems.append(f"{node!r} {fr}: usage {used} > quota+borrowing {cap}")
    return problems
