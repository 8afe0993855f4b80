"""The ClusterQueue/Cohort resource tree: nominal quota, borrowing and lending limits, usage.

ClusterQueues are leaves, cohorts inner nodes (see ``node.py`` for what a node holds and how
availability is computed). Usage changes are applied incrementally along the path to the
root (``add_usage`` / ``remove_usage``), so an admission costs O(depth) whatever the size of
the cohort. Only a structural change (a quota edited, a ClusterQueue moved) recomputes a
whole root tree.
"""

from __future__ import annotations

from collections.abc import Mapping

from phalanx.quotas.node import (
    DEFAULT_WEIGHT,
    QuotaNode,
    add_usage,
    next_quota_version,
    rebuild,
    remove_usage,
    track_borrowing,
)
from phalanx.quotas.resources import FlavorResource, ResourceQuota, Usage

__all__ = [
    "CohortCycleError",
    "QuotaNode",
    "QuotaTreeError",
    "ResourceTree",
    "check_invariants",
]


class QuotaTreeError(ValueError):
    """A tree operation that cannot be applied (unknown node, bad limit)."""


class CohortCycleError(QuotaTreeError):
    """Setting a Cohort's parent would make the cohort graph cyclic."""


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
        rebuild(node, root)
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
        root.quota_version = next_quota_version()
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
        rebuild(top, top)
        top.quota_version = next_quota_version()
        top.borrowers = {}
        for leaf in top.cluster_queues():
            for fr in leaf.usage:
                track_borrowing(leaf, fr)
        top.version += 1

    # -- usage -------------------------------------------------------------------------------

    def add_usage(self, cluster_queue: QuotaNode, usage: Usage) -> None:
        for fr, amount in usage.items():
            if amount:
                add_usage(cluster_queue, fr, amount)
                track_borrowing(cluster_queue, fr)
        cluster_queue.root.version += 1

    def remove_usage(self, cluster_queue: QuotaNode, usage: Usage) -> None:
        for fr, amount in usage.items():
            if amount:
                remove_usage(cluster_queue, fr, amount)
                track_borrowing(cluster_queue, fr)
        cluster_queue.root.version += 1


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
