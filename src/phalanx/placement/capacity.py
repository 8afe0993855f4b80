"""Capacity "in pods of one shape", per node and per domain, kept up to date incrementally.

Placement asks, many times per scheduling cycle, "how many more pods like this fit in each
rack?". Recomputing that from every node on every call would cost O(nodes). Instead each pod
shape (requests, tolerations, node selector) seen recently keeps a cache: per node, how many
such pods still fit (min over requested resources of free // request), and per domain the sum
over its nodes. A change on one node then costs O(levels) per cached shape.
"""

from __future__ import annotations

from collections.abc import Mapping

from phalanx.placement.model import Node, Taint, Toleration

__all__ = ["UNBOUNDED_FIT", "Path", "ShapeCache", "ShapeKey", "node_fit", "normalize_requests"]

# A domain is identified by the label values from the highest level down to its own level.
Path = tuple[str, ...]
# (requests as sorted (resource, amount) pairs incl. pods, tolerations, node selector pairs)
ShapeKey = tuple[tuple[tuple[str, int], ...], tuple[Toleration, ...], tuple[tuple[str, str], ...]]

# Fit of a pod that requests nothing on a node that does not count pods: large but finite, so
# sums over domains stay integers.
UNBOUNDED_FIT = 1 << 20
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def normalize_requests(requests: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """Positive requests, sorted, plus the one ``pods`` slot every pod takes."""
    items = {name: amount for name, amount in requests.items() if amount > 0}
    items.setdefault("pods", 1)
    return tuple(sorted(items.items()))


def node_fit(
    allocatable: Mapping[str, int],
    used: Mapping[str, int],
    requests: tuple[tuple[str, int], ...],
) -> int:
    """How many more pods of ``requests`` fit on a node. A node that does not report ``pods``
    is not limited by it; any other resource it does not report fits nothing."""
    best = UNBOUNDED_FIT
    for name, amount in requests:
        available = allocatable.get(name)
        if available is None:
            if name == "pods":
                continue
            return 0
        fit = (available - used.get(name, 0)) // amount
        if fit < best:
            if fit <= 0:
                return 0
            best = fit
    return best


def blocking_taint(taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...]) -> Taint | None:
    """The first NoSchedule/NoExecute taint none of ``tolerations`` tolerates, if any."""
    for taint in taints:
        if taint.effect in _BLOCKING_EFFECTS and not any(t.tolerates(taint) for t in tolerations):
            return taint
    return None


class ShapeCache:
    """Per-node fit and per-domain capacity for one pod shape."""

    __slots__ = (
        "cap",
        "excluded",
        "fit",
        "key",
        "leaf_caps",
        "requests",
        "selector",
        "tolerations",
    )

    def __init__(self, key: ShapeKey) -> None:
        self.key = key
        self.requests = key[0]
        self.tolerations = key[1]
        self.selector = key[2]
        self.fit: dict[str, int] = {}  # eligible node -> pods that still fit
        self.cap: dict[Path, int] = {}  # domain (incl. root ()) -> sum of fits below it
        self.excluded: dict[str, str] = {}  # node -> why this shape cannot use it
        # capacity -> how many lowest-level domains have exactly that much room (> 0): tells
        # best fit the least possible leftover before it walks the nodes.
        self.leaf_caps: dict[int, int] = {}

    def eligibility(self, node: Node) -> str | None:
        """Why a node of the flavor is not usable for this shape, or None."""
        for label, value in self.selector:
            if node.labels.get(label) != value:
                return "nodeSelector mismatch"
        if blocking_taint(node.taints, self.tolerations) is not None:
            return "untolerated taint"
        return None

    def build(
        self,
        nodes: Mapping[str, Node],
        ancestors: Mapping[str, tuple[Path, ...]],
        used: Mapping[str, Mapping[str, int]],
        depth: int,
    ) -> None:
        """Fill the cache for every eligible node at once: fits summed per lowest domain,
        then level by level upwards (one dict update per node instead of one per level)."""
        empty: Mapping[str, int] = {}
        requests = self.requests
        plain = not self.selector and not self.tolerations
        sums: dict[Path, int] = {}
        for name, paths in ancestors.items():
            node = nodes[name]
            if not (plain and not node.taints):
                reason = self.eligibility(node)
                if reason is not None:
                    self.excluded[name] = reason
                    continue
            fit = node_fit(node.allocatable, used.get(name, empty), requests)
            self.fit[name] = fit
            leaf = paths[-1]
            sums[leaf] = sums.get(leaf, 0) + fit
        for total in sums.values():
            self._count_leaf(total, 1)
        cap = self.cap
        cap[()] = 0
        for _ in range(depth):
            cap.update(sums)
            parents: dict[Path, int] = {}
            for path, total in sums.items():
                parent = path[:-1]
                parents[parent] = parents.get(parent, 0) + total
            sums = parents
        cap[()] = sums.get((), 0)

    def add_node(
        self,
        node: Node,
        ancestors: tuple[Path, ...],
        used: Mapping[str, int],
    ) -> None:
        reason = self.eligibility(node)
        if reason is not None:
            self.excluded[node.name] = reason
            return
        fit = node_fit(node.allocatable, used, self.requests)
        self.fit[node.name] = fit
        cap = self.cap
        self._move_leaf(cap.get(ancestors[-1], 0), fit)
        for path in ancestors:
            cap[path] = cap.get(path, 0) + fit

    def remove_node(self, name: str, ancestors: tuple[Path, ...]) -> None:
        self.excluded.pop(name, None)
        fit = self.fit.pop(name, None)
        if fit:
            cap = self.cap
            self._move_leaf(cap[ancestors[-1]], -fit)
            for path in ancestors:
                cap[path] -= fit

    def _move_leaf(self, before: int, delta: int) -> None:
        self._count_leaf(before, -1)
        self._count_leaf(before + delta, 1)

    def _count_leaf(self, capacity: int, sign: int) -> None:
        if capacity > 0:
            left = self.leaf_caps.get(capacity, 0) + sign
            if left:
                self.leaf_caps[capacity] = left
            else:
                del self.leaf_caps[capacity]

    def least_leaf_at_least(self, need: int) -> int | None:
        """The smallest room >= ``need`` some lowest-level domain has, if any."""
        fitting = [capacity for capacity in self.leaf_caps if capacity >= need]
        return min(fitting) if fitting else None

    def refresh_node(
        self,
        name: str,
        allocatable: Mapping[str, int],
        used: Mapping[str, int],
        ancestors: tuple[Path, ...],
    ) -> None:
        old = self.fit.get(name)
        if old is None:
            return
        new = node_fit(allocatable, used, self.requests)
        if new != old:
            self.fit[name] = new
            delta = new - old
            cap = self.cap
            self._move_leaf(cap[ancestors[-1]], delta)
            for path in ancestors:
                cap[path] += delta
