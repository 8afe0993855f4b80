"""One flavor's topology: the domain tree of its nodes, what is used on them, and reservations.

This is the mutable state placement works on (Kueue's per-flavor TAS cache). Everything that
changes free capacity comes through here: nodes appearing, changing or leaving; pods bound to
nodes (whoever admitted them); gangs reserved and released by admission.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from phalanx.placement import search
from phalanx.placement.capacity import (
    Path,
    ShapeCache,
    ShapeKey,
    node_fit,
    normalize_requests,
)
from phalanx.placement.model import (
    HOSTNAME_LABEL,
    GangRequest,
    Node,
    PodSetRequest,
    Toleration,
    TopologyError,
)
from phalanx.placement.result import NodeUsage, PlacementResult, Reservation

__all__ = ["FlavorTopology"]

_log = logging.getLogger(__name__)

# Shapes beyond this many are evicted least-recently-used first; each cached shape costs
# O(levels) on every node change, so the cache is kept to the shapes actually in the queue.
_MAX_SHAPES = 32


class FlavorTopology:
    """Domain tree, free capacity and reservations of one ResourceFlavor with a Topology."""

    def __init__(
        self,
        *,
        name: str,
        levels: Sequence[str],
        node_labels: Mapping[str, str] | None = None,
        tolerations: Sequence[Toleration] = (),
    ) -> None:
        self.name = name
        self.levels: tuple[str, ...] = _validate_levels(levels)
        self.depth = len(self.levels)
        self._node_labels = dict(node_labels or {})
        self._tolerations = tuple(tolerations)
        self._nodes: dict[str, Node] = {}
        self._excluded: dict[str, str] = {}
        self._ancestors: dict[str, tuple[Path, ...]] = {}  # eligible node -> root..leaf paths
        self._children: dict[Path, set[Path]] = {(): set()}
        self._leaf_nodes: dict[Path, set[str]] = {}
        self._sorted_children: dict[Path, tuple[Path, ...]] = {}
        self._sorted_leaf: dict[Path, tuple[str, ...]] = {}
        self._level_domains: dict[int, tuple[Path, ...]] = {}
        self._used: dict[str, dict[str, int]] = {}  # node name -> resource -> used
        self._pods: dict[str, tuple[str, tuple[tuple[str, int], ...], str | None]] = {}
        self._reservations: dict[str, Reservation] = {}
        self._shapes: OrderedDict[ShapeKey, ShapeCache] = OrderedDict()
        self._journals: list[list[tuple[str, Reservation]]] = []

    # ---------------------------------------------------------------- nodes
    def upsert_node(self, node: Node) -> None:
        if node.name in self._nodes:
            self._detach(node.name)
        self._nodes[node.name] = node
        reason = self._exclusion(node)
        if reason is not None:
            self._excluded[node.name] = reason
            _log.debug(
                "event=node_excluded flavor=%s node=%s reason=%r", self.name, node.name, reason
            )
            return
        self._attach(node)

    def remove_node(self, name: str) -> None:
        if name in self._nodes:
            self._detach(name)
            del self._nodes[name]

    def excluded_nodes(self) -> dict[str, str]:
        return dict(sorted(self._excluded.items()))

    def _exclusion(self, node: Node) -> str | None:
        for label, value in self._node_labels.items():
            if node.labels.get(label) != value:
                return f"flavor nodeLabels mismatch ({label}={value})"
        for level in self.levels:
            if level not in node.labels:
                return f"missing topology label {level}"
        if not node.ready:
            return "NotReady"
        if node.unschedulable:
            return "unschedulable"
        return None

    def _attach(self, node: Node) -> None:
        path = tuple(node.labels[level] for level in self.levels)
        ancestors = tuple(path[:d] for d in range(self.depth + 1))
        for d in range(1, self.depth + 1):
            siblings = self._children.setdefault(path[: d - 1], set())
            if path[:d] not in siblings:
                siblings.add(path[:d])
                self._structure_changed(path[: d - 1], d)
        self._leaf_nodes.setdefault(path, set()).add(node.name)
        self._sorted_leaf.pop(path, None)
        self._ancestors[node.name] = ancestors
        used = self._used.get(node.name, {})
        for shape in self._shapes.values():
            shape.add_node(node, ancestors, used)

    def _detach(self, name: str) -> None:
        self._excluded.pop(name, None)
        ancestors = self._ancestors.pop(name, None)
        if ancestors is None:
            return
        for shape in self._shapes.values():
            shape.remove_node(name, ancestors)
        leaf = ancestors[-1]
        self._leaf_nodes[leaf].discard(name)
        self._sorted_leaf.pop(leaf, None)
        if self._leaf_nodes[leaf]:
            return
        del self._leaf_nodes[leaf]
        # Prune domains left without nodes, bottom-up, so listings never show empty domains.
        for d in range(self.depth, 0, -1):
            path = ancestors[d]
            if self._children.get(path):
                break
            self._children.pop(path, None)
            self._children[ancestors[d - 1]].discard(path)
            self._structure_changed(ancestors[d - 1], d)
            for shape in self._shapes.values():
                shape.cap.pop(path, None)

    def _structure_changed(self, parent: Path, depth: int) -> None:
        self._sorted_children.pop(parent, None)
        self._level_domains.pop(depth, None)

    # ---------------------------------------------------------------- pods
    def add_pod(
        self, *, uid: str, node: str, requests: Mapping[str, int], gang: str | None = None
    ) -> None:
        """A pod bound to ``node``. Pods of a gang Phalanx placed on this flavor (``gang`` set)
        are recorded but never counted: the gang's reservation is the single source of their
        usage, as in Kueue, so restart order and terminating pods cannot double-count."""
        if uid in self._pods:
            self.remove_pod(uid)
        normalized = normalize_requests(requests)
        self._pods[uid] = (node, normalized, gang)
        if gang is None:
            self._use(node, normalized, 1)

    def remove_pod(self, uid: str) -> None:
        entry = self._pods.pop(uid, None)
        if entry is not None and entry[2] is None:
            self._use(entry[0], entry[1], -1)

    def _use(self, node: str, normalized: tuple[tuple[str, int], ...], pods: int) -> None:
        used = self._used.setdefault(node, {})
        for name, amount in normalized:
            total = used.get(name, 0) + amount * pods
            if total:
                used[name] = total
            else:
                used.pop(name, None)
        if not used:
            del self._used[node]
        ancestors = self._ancestors.get(node)
        if ancestors is None:
            return
        allocatable = self._nodes[node].allocatable
        current = self._used.get(node, {})
        for shape in self._shapes.values():
            shape.refresh_node(node, allocatable, current, ancestors)

    # ---------------------------------------------------------------- reservations
    def place(
        self, gang: GangRequest, *, explain: bool = True, balanced: bool = False
    ) -> PlacementResult:
        """What-if: where the gang would go now. Never changes any state. ``balanced`` is
        Kueue's TASBalancedPlacement for preferred pod sets (see placement.balanced)."""
        return search.place_gang(self, gang, explain=explain, commit=False, balanced=balanced)

    def reserve(
        self, gang: GangRequest, *, explain: bool = True, balanced: bool = False
    ) -> PlacementResult:
        """Place the gang and hold its capacity until :meth:`release`."""
        if gang.key in self._reservations:
            raise ValueError(f"gang {gang.key!r} already holds a reservation; release it first")
        result = search.place_gang(self, gang, explain=explain, commit=True, balanced=balanced)
        if result.placement is not None:
            requests = {ps.name: ps.requests for ps in gang.pod_sets}
            self._record(Reservation.from_placement(result.placement, requests))
            _log.debug(
                "event=placement_reserved flavor=%s gang=%s fit_levels=%s",
                self.name,
                gang.key,
                ",".join(str(ps.fit_level) for ps in result.placement.pod_sets),
            )
        return result

    def _record(self, reservation: Reservation) -> None:
        """Book a reservation whose usage is already applied to the nodes."""
        self._reservations[reservation.key] = reservation
        if self._journals:
            self._journals[-1].append(("reserve", reservation))

    def release(self, key: str) -> Reservation | None:
        reservation = self._reservations.pop(key, None)
        if reservation is None:
            return None
        for usage in reservation.usage:
            self._use(usage.node, normalize_requests(usage.requests), -usage.pods)
        if self._journals:
            self._journals[-1].append(("release", reservation))
        _log.debug("event=placement_released flavor=%s gang=%s", self.name, key)
        return reservation

    def restore(self, reservation: Reservation) -> None:
        """Re-apply a reservation exactly (undo of release, or rebuild after a restart)."""
        if reservation.key in self._reservations:
            raise ValueError(f"gang {reservation.key!r} already holds a reservation")
        for usage in reservation.usage:
            self._use(usage.node, normalize_requests(usage.requests), usage.pods)
        self._record(reservation)

    @contextmanager
    def speculate(self) -> Iterator[None]:
        """Undo every reserve/release/restore made inside the block (Kueue's undoable snapshot)."""
        journal: list[tuple[str, Reservation]] = []
        self._journals.append(journal)
        try:
            yield
        finally:
            self._journals.pop()
            saved, self._journals = self._journals, []
            try:
                for action, reservation in reversed(journal):
                    if action == "reserve":
                        self.release(reservation.key)
                    else:
                        self.restore(reservation)
            finally:
                self._journals = saved

    def is_reserved(self, key: str) -> bool:
        return key in self._reservations

    def reservations(self) -> Mapping[str, Reservation]:
        return dict(self._reservations)

    def reservation_from_assignments(
        self, key: str, pod_sets: Sequence[tuple[Mapping[str, int], Sequence[tuple[Path, int]]]]
    ) -> Reservation:
        """Rebuild a reservation from an admitted workload's assignment, for :meth:`restore`
        after a restart: per pod set, (per-pod requests, [(values at the assignment levels,
        count)]). When the lowest level is not the hostname, a domain's pods are charged to its
        nodes largest-fit first (the kube-scheduler may bind them elsewhere in the domain)."""
        usage: list[NodeUsage] = []
        host_only = self.levels[-1] == HOSTNAME_LABEL
        for requests, domains in pod_sets:
            normalized = normalize_requests(requests)
            for values, count in domains:
                nodes = self._nodes_matching(values, host_only)
                if not nodes:
                    raise ValueError(
                        f"topologyAssignment of {key!r}: no node of flavor {self.name!r} has"
                        f" {values!r}; it cannot be restored"
                    )
                nodes.sort(key=lambda n: (-self._fit_now(n, normalized), n))
                remaining = count
                for i, name in enumerate(nodes):
                    last = i == len(nodes) - 1
                    take = remaining if last else min(remaining, self._fit_now(name, normalized))
                    if take > 0:
                        usage.append(NodeUsage(name, dict(requests), take))
                        remaining -= take
                    if remaining == 0:
                        break
        return Reservation(key, tuple(usage))

    def _nodes_matching(self, values: Path, host_only: bool) -> list[str]:
        if host_only:
            return sorted(
                name
                for name, node in self._nodes.items()
                if node.labels.get(HOSTNAME_LABEL) == values[-1]
            )
        return sorted(self._leaf_nodes.get(tuple(values), ()))

    def _fit_now(self, node: str, normalized: tuple[tuple[str, int], ...]) -> int:
        return node_fit(self._nodes[node].allocatable, self._used.get(node, {}), normalized)

    # ---------------------------------------------------------------- queries
    def free_capacity(
        self,
        requests: Mapping[str, int],
        *,
        level: str | None = None,
        tolerations: Sequence[Toleration] = (),
        node_selector: Mapping[str, str] | None = None,
    ) -> dict[Path, int]:
        """Pods of this shape that still fit, per domain of ``level`` (default: highest)."""
        probe = PodSetRequest(
            name="probe",
            count=1,
            requests=requests,
            tolerations=tuple(tolerations),
            node_selector=dict(node_selector or {}),
        )
        if level is not None and level not in self.levels:
            raise ValueError(
                f"level {level!r} is not a level of flavor {self.name}"
                f" (levels: {', '.join(self.levels)})"
            )
        shape = self.shape(probe)
        depth = 1 if level is None else self.levels.index(level) + 1
        return {path: shape.cap.get(path, 0) for path in self.domains_at(depth)}

    # ------------------------------------------- structure, for phalanx.placement.search
    def shape(self, pod_set: PodSetRequest) -> ShapeCache:
        key: ShapeKey = (
            normalize_requests(pod_set.requests),
            self._tolerations + tuple(pod_set.tolerations),
            tuple(sorted(pod_set.node_selector.items())),
        )
        cache = self._shapes.get(key)
        if cache is not None:
            self._shapes.move_to_end(key)
            return cache
        cache = ShapeCache(key)
        cache.build(self._nodes, self._ancestors, self._used, self.depth)
        self._shapes[key] = cache
        if len(self._shapes) > _MAX_SHAPES:
            self._shapes.popitem(last=False)
        return cache

    def children(self, path: Path) -> tuple[Path, ...]:
        found = self._sorted_children.get(path)
        if found is None:
            found = tuple(sorted(self._children.get(path, ())))
            self._sorted_children[path] = found
        return found

    def leaf_nodes(self, path: Path) -> tuple[str, ...]:
        found = self._sorted_leaf.get(path)
        if found is None:
            found = tuple(sorted(self._leaf_nodes.get(path, ())))
            self._sorted_leaf[path] = found
        return found

    def domains_at(self, depth: int) -> tuple[Path, ...]:
        found = self._level_domains.get(depth)
        if found is None:
            if depth == 0:
                found = ((),)
            else:
                found = tuple(
                    sorted(c for p in self.domains_at(depth - 1) for c in self._children.get(p, ()))
                )
            self._level_domains[depth] = found
        return found

    def node_path(self, name: str) -> Path:
        return self._ancestors[name][-1]

    def apply(self, node: str, normalized: tuple[tuple[str, int], ...], pods: int) -> None:
        self._use(node, normalized, pods)

    def eligible_node_count(self) -> int:
        return len(self._ancestors)

    def excluded_summary(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for reason in self._excluded.values():
            counts[reason] = counts.get(reason, 0) + 1
        return counts


def _validate_levels(levels: Sequence[str]) -> tuple[str, ...]:
    result = tuple(levels)
    if not result:
        raise TopologyError("spec.levels: a Topology needs at least one level; add a nodeLabel")
    seen: set[str] = set()
    for i, level in enumerate(result):
        if not level:
            raise TopologyError(f"spec.levels[{i}].nodeLabel: must not be empty")
        if level in seen:
            raise TopologyError(f"spec.levels[{i}].nodeLabel: {level!r} is listed twice")
        if level == HOSTNAME_LABEL and i != len(result) - 1:
            raise TopologyError(
                f"spec.levels[{i}].nodeLabel: {HOSTNAME_LABEL} may only be the last level"
            )
        seen.add(level)
    return result
