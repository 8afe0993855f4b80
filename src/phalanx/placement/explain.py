"""Why a pod set does not fit: per level, the domain with the most room against what it needs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from phalanx.placement.capacity import Path, ShapeCache
from phalanx.placement.model import PodSetRequest, TopologyMode
from phalanx.placement.result import CLUSTER_LEVEL, FailureReason, LevelFit, PlacementFailure
from phalanx.quotas.quantity import format_quantity

if TYPE_CHECKING:
    from phalanx.placement.topology import FlavorTopology

__all__ = ["describe_shape", "failure", "short_level"]

# Units (pods, or whole slices) a domain at a depth can take.
UnitsFn = Callable[[Path, int], int]


def short_level(level: str) -> str:
    """``cloud.provider.com/topology-rack`` reads as ``topology-rack`` in one-line messages."""
    return level.rsplit("/", 1)[-1]


def describe_shape(pod_set: PodSetRequest) -> str:
    parts = [
        f"{name}: {format_quantity(amount, resource=name)}"
        for name, amount in sorted(pod_set.requests.items())
        if amount > 0
    ]
    return ", ".join(parts) if parts else "no requests"


def failure(
    topo: FlavorTopology,
    *,
    key: str,
    pod_set: PodSetRequest,
    shape: ShapeCache,
    reason: FailureReason,
    depth: int,
    units: UnitsFn,
    slice_size: int,
    explain: bool,
    detail: str = "",
) -> PlacementFailure:
    """Build the failure; with ``explain`` the per-level scan costs O(domains)."""
    excluded = dict(topo.excluded_summary())
    for why in shape.excluded.values():
        excluded[why] = excluded.get(why, 0) + 1
    head = f'pod set "{pod_set.name}" needs {pod_set.count} pods ({describe_shape(pod_set)} each)'
    if reason is FailureReason.INVALID_REQUEST:
        return PlacementFailure(
            key, pod_set.name, reason, pod_set.count, (), excluded, f"{head}: {detail}"
        )
    levels: list[LevelFit] = []
    if explain:
        for d in range(topo.depth + 1):
            domains = topo.domains_at(d) if topo.eligible_node_count() else ()
            best, best_path = _largest(topo, shape, d, units, plain=slice_size == 1)
            name = CLUSTER_LEVEL if d == 0 else topo.levels[d - 1]
            levels.append(
                LevelFit(name, best_path, max(best, 0) * slice_size, pod_set.count, len(domains))
            )
    message = _message(topo, head, reason, pod_set, depth, levels, excluded, units, slice_size)
    return PlacementFailure(
        key, pod_set.name, reason, pod_set.count, tuple(levels), excluded, message
    )


def _largest(
    topo: FlavorTopology, shape: ShapeCache, depth: int, units: UnitsFn, *, plain: bool
) -> tuple[int, Path]:
    """The domain of a level with the most room (ties: label order). Without slices a child
    never has more room than its parent, so parents are visited largest first and the walk
    stops at the first parent that cannot hold more than the best child found."""
    if depth == 0 or not topo.eligible_node_count():
        return units((), 0), ()
    best, best_path = -1, topo.domains_at(depth)[0]
    if not plain:
        for path in topo.domains_at(depth):
            free = units(path, depth)
            if free > best:
                best, best_path = free, path
        return best, best_path
    cap = shape.cap
    parents = sorted(topo.domains_at(depth - 1), key=lambda p: -cap.get(p, 0))
    for parent in parents:
        if cap.get(parent, 0) < best:
            break
        for path in topo.children(parent):
            free = cap.get(path, 0)
            if free > best or (free == best and path < best_path):
                best, best_path = free, path
    return best, best_path


def _message(
    topo: FlavorTopology,
    head: str,
    reason: FailureReason,
    pod_set: PodSetRequest,
    depth: int,
    levels: list[LevelFit],
    excluded: dict[str, int],
    units: UnitsFn,
    slice_size: int,
) -> str:
    if reason is FailureReason.NO_NODES:
        text = f"{head}: no node of flavor {topo.name} is eligible"
    else:
        mode = pod_set.topology.mode
        if mode is TopologyMode.REQUIRED:
            where = f" in one {short_level(topo.levels[depth - 1])}"
        else:
            where = ""
        text = f"{head}{where}"
        if slice_size > 1:
            per = short_level(pod_set.topology.slice_level or "")
            text += f" in slices of {slice_size} per {per}"
        total = units((), 0) * slice_size
        if levels:
            # From the requested level up: the finer levels cannot matter once these fail.
            shown = [fit for i, fit in enumerate(levels) if i <= depth][::-1]
            text += "; largest free: " + ", ".join(
                f"{short_level(fit.level)}"
                + (f" {'/'.join(fit.largest_domain)}" if fit.largest_domain else "")
                + f" fits {fit.largest_free}"
                for fit in shown
            )
        else:
            text += f"; flavor {topo.name} fits {total}"
    if excluded:
        total_excluded = sum(excluded.values())
        detail = ", ".join(f"{n} {why}" for why, n in sorted(excluded.items()))
        text += f"; {total_excluded} nodes excluded ({detail})"
    return text
