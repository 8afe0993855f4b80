"""The placement algorithm: best-fit domain, then the fewest children on the way down.

For one pod set:
1. Pick the level: REQUIRED L tries L only; PREFERRED L tries L, then each level above, then
   the whole flavor; UNCONSTRAINED behaves as PREFERRED at the lowest level.
2. At a level, choose best fit: among domains that hold every pod, the one with the least
   capacity left over (ties: a domain the gang already uses, then label order). Packing gangs
   into the fullest domain that still fits keeps whole racks free for the next large gang.
3. Descend: inside the chosen domain take children largest-first until the remainder fits in
   one child, and choose that last child best-fit; recurse down to nodes. This uses the fewest
   child domains, so a gang spans as few racks/hosts as its size allows.

Slices (``slice_level`` S, ``slice_size`` z): above S capacity is counted in whole slices
(a domain at S holds ``capacity // z`` slices), so every z consecutive pods share a domain of S.

With ``balanced`` (Kueue's ``TASBalancedPlacement``), a PREFERRED pod set first tries
``phalanx.placement.balanced``: the same number of domains, the pods spread evenly over them;
best fit is the fallback.

A gang's pod sets are placed in order, each seeing the usage of the ones before it; any failure
rolls back what was applied, so a gang is placed whole or not at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from phalanx.placement import explain
from phalanx.placement.balanced import balanced_shares
from phalanx.placement.capacity import Path, ShapeCache
from phalanx.placement.model import GangRequest, PodSetRequest, TopologyMode
from phalanx.placement.result import (
    DomainAssignment,
    FailureReason,
    GangPlacement,
    PlacementFailure,
    PlacementResult,
    PodSetPlacement,
)

if TYPE_CHECKING:
    from phalanx.placement.topology import FlavorTopology

__all__ = ["place_gang"]

NodeCounts = list[tuple[str, int]]
_T = TypeVar("_T")


def place_gang(
    topo: FlavorTopology,
    gang: GangRequest,
    *,
    explain: bool,
    commit: bool,
    balanced: bool = False,
) -> PlacementResult:
    """Place every pod set of ``gang``; keep the usage applied only if ``commit`` and placed.
    ``balanced`` turns on Kueue's balanced placement for PREFERRED pod sets."""
    applied: list[tuple[str, tuple[tuple[str, int], ...], int]] = []
    placements: list[PodSetPlacement] = []
    affinity: set[Path] = set()
    placed = False
    try:
        for index, pod_set in enumerate(gang.pod_sets):
            outcome = _place_pod_set(topo, gang.key, pod_set, affinity, explain, balanced)
            if isinstance(outcome, PlacementFailure):
                return PlacementResult(gang.key, None, outcome)
            placement, shape = outcome
            placements.append(placement)
            # Later pod sets must see this one's usage; a lone what-if needs no bookkeeping.
            if commit or index < len(gang.pod_sets) - 1:
                for domain in placement.domains:
                    topo.apply(domain.node, shape.requests, domain.count)
                    applied.append((domain.node, shape.requests, domain.count))
                    path = domain.values
                    affinity.update(path[:d] for d in range(1, len(path) + 1))
        placed = True
        return PlacementResult(gang.key, GangPlacement(gang.key, tuple(placements)), None)
    finally:
        if not (placed and commit):
            for node, requests, count in reversed(applied):
                topo.apply(node, requests, -count)


def _place_pod_set(
    topo: FlavorTopology,
    key: str,
    pod_set: PodSetRequest,
    affinity: set[Path],
    explain_: bool,
    balanced: bool = False,
) -> tuple[PodSetPlacement, ShapeCache] | PlacementFailure:
    shape = topo.shape(pod_set)
    request = pod_set.topology
    levels = topo.levels

    def invalid(detail: str) -> PlacementFailure:
        return explain.failure(
            topo,
            key=key,
            pod_set=pod_set,
            shape=shape,
            reason=FailureReason.INVALID_REQUEST,
            depth=0,
            units=lambda p, d: 0,
            slice_size=1,
            explain=False,
            detail=detail,
        )

    if pod_set.count < 0:
        return invalid("count must not be negative")
    if request.mode is TopologyMode.UNCONSTRAINED:
        depth = topo.depth
    elif request.level in levels:
        depth = levels.index(request.level) + 1
    else:
        return invalid(
            f"topology level {request.level!r} is not a level of flavor {topo.name}"
            f" (levels: {', '.join(levels)}); use one of them"
        )
    slice_depth: int | None = None
    size = 1
    if request.slice_level is not None:
        if request.slice_level not in levels:
            return invalid(
                f"podSetSliceRequiredTopology {request.slice_level!r} is not a level of flavor"
                f" {topo.name} (levels: {', '.join(levels)})"
            )
        slice_depth = levels.index(request.slice_level) + 1
        if request.mode is not TopologyMode.UNCONSTRAINED and slice_depth < depth:
            return invalid(
                f"podSetSliceRequiredTopology {request.slice_level!r} must be at or below the"
                f" pod set's level {request.level!r}"
            )
        size = request.slice_size or 0
        if size < 1 or pod_set.count % size:
            return invalid(
                f"podSetSliceSize {request.slice_size} must be a positive divisor of count"
                f" {pod_set.count}"
            )
    if pod_set.count == 0:
        return PodSetPlacement(pod_set.name, 0, levels, None, ()), shape

    units = _units_fn(topo, shape, slice_depth, size)
    need = pod_set.count // size
    out: NodeCounts = []
    if (
        balanced
        and request.mode is TopologyMode.PREFERRED
        and shape.cap.get((), 0) >= pod_set.count
    ):
        shares = balanced_shares(
            topo,
            pods=shape.cap,
            units=units,
            depth=depth,
            slice_depth=topo.depth if slice_depth is None else slice_depth,
            size=size,
            need=need,
        )
        if shares is not None:
            share_depth, parts = shares
            for domain, slices in sorted(parts):
                _descend(topo, shape, domain, share_depth, slices, slice_depth, size, out)
            return _placement(topo, pod_set, out), shape
    chosen: tuple[Path, int] | None = None
    if shape.cap.get((), 0) >= pod_set.count:
        bottom = depth if request.mode is TopologyMode.REQUIRED else 0
        for d in range(depth, bottom - 1, -1):
            path = _best_fit(topo, shape, d, need, units, affinity, plain=slice_depth is None)
            if path is not None:
                chosen = (path, d)
                break
    if chosen is None:
        if not shape.fit:
            reason = FailureReason.NO_NODES
        elif request.mode is TopologyMode.REQUIRED and units((), 0) >= need:
            reason = FailureReason.REQUIRED_LEVEL
        else:
            reason = FailureReason.NO_FIT
        return explain.failure(
            topo,
            key=key,
            pod_set=pod_set,
            shape=shape,
            reason=reason,
            depth=depth,
            units=units,
            slice_size=size,
            explain=explain_,
        )
    _descend(topo, shape, chosen[0], chosen[1], need, slice_depth, size, out)
    return _placement(topo, pod_set, out), shape


def _placement(topo: FlavorTopology, pod_set: PodSetRequest, out: NodeCounts) -> PodSetPlacement:
    domains = tuple(DomainAssignment(topo.node_path(node), node, n) for node, n in out)
    fit_level = _fit_level(topo, domains)
    return PodSetPlacement(pod_set.name, pod_set.count, topo.levels, fit_level, domains)


def _units_fn(
    topo: FlavorTopology, shape: ShapeCache, slice_depth: int | None, size: int
) -> explain.UnitsFn:
    cap = shape.cap
    if slice_depth is None:
        return lambda path, depth: cap.get(path, 0)
    memo: dict[Path, int] = {}
    bottom = slice_depth

    def units(path: Path, depth: int) -> int:
        if depth >= bottom:
            return cap.get(path, 0) // size
        found = memo.get(path)
        if found is None:
            found = sum(units(child, depth + 1) for child in topo.children(path))
            memo[path] = found
        return found

    return units


def _best_fit(
    topo: FlavorTopology,
    shape: ShapeCache,
    depth: int,
    need: int,
    units: explain.UnitsFn,
    affinity: set[Path],
    *,
    plain: bool,
) -> Path | None:
    """The fitting domain with the least room left; ties go to the domain whose parent,
    then grandparent, has the least room (fill fragmented racks first), then label order.

    This can run over every node, so it walks the level parent by parent, parents with the
    least room first: a parent without room for ``need`` is skipped whole, and once a domain
    fits exactly (nothing left over) no later parent can beat it and the walk stops.
    """
    if depth == 0:
        return () if units((), 0) >= need else None
    cap = shape.cap
    # At the lowest level the least possible leftover is known up front (from the count of
    # domains per capacity), so the first domain with exactly that room, in rank order, wins.
    target: int | None = None
    if plain and depth == topo.depth and not affinity:
        target = shape.least_leaf_at_least(need)
        if target is None:
            return None
    floor = need if target is None else target
    parents: list[tuple[tuple[int, ...], Path]] = []
    for parent in topo.domains_at(depth - 1):
        if plain and cap.get(parent, 0) < floor:
            continue
        parents.append((tuple(cap.get(parent[:d], 0) for d in range(depth - 1, 0, -1)), parent))
    parents.sort()
    best: Path | None = None
    best_head = (True, 0)
    perfect = (False, 0)
    for _room, parent in parents:
        if target is not None:
            for path in topo.children(parent):
                if cap.get(path, 0) == target:
                    return path
            continue
        for path in topo.children(parent):  # label order: the first of equals wins
            free = cap.get(path, 0) if plain else units(path, depth)
            if free < need:
                continue
            head = (bool(affinity) and path not in affinity, free - need)
            # Parents come in rising room, so among equal heads the earlier one ranks first.
            if best is None or head < best_head:
                best, best_head = path, head
                if head == perfect:
                    return best
    return best


def _descend(
    topo: FlavorTopology,
    shape: ShapeCache,
    path: Path,
    depth: int,
    need: int,
    slice_depth: int | None,
    size: int,
    out: NodeCounts,
) -> None:
    """Append (node, pods) for ``need`` units inside ``path`` (slices above the slice level)."""
    if slice_depth is not None and depth >= slice_depth:
        # Inside one domain of the slice level nothing can split a slice any more.
        need, slice_depth, size = need * size, None, 1
    if depth == topo.depth:
        fit = shape.fit
        nodes = [(fit.get(name, 0), name) for name in topo.leaf_nodes(path)]
        for name, count in _fewest(nodes, need):
            out.append((name, count))
        return
    units = _units_fn(topo, shape, slice_depth, size)
    children = [(units(child, depth + 1), child) for child in topo.children(path)]
    for child, count in _fewest(children, need):
        _descend(topo, shape, child, depth + 1, count, slice_depth, size, out)


def _fewest(items: list[tuple[int, _T]], need: int) -> list[tuple[_T, int]]:
    """Largest-first until the remainder fits one item, which is then chosen best-fit.

    ``items`` are (capacity, id) in id order; returns (id, amount taken) summing to ``need``.
    """
    ranked = sorted((item for item in items if item[0] > 0), key=lambda it: -it[0])
    taken: list[tuple[_T, int]] = []
    remaining = need
    i = 0
    while remaining > 0:
        # ranked[i:] is sorted by capacity descending (stable: id order among equals).
        j = i
        while j < len(ranked) and ranked[j][0] >= remaining:
            j += 1
        if j > i:
            smallest = ranked[j - 1][0]
            pick = next(k for k in range(i, j) if ranked[k][0] == smallest)
            taken.append((ranked[pick][1], remaining))
            return taken
        if i == len(ranked):
            raise RuntimeError(f"capacity cache inconsistent: {remaining} units left over")
        capacity, ident = ranked[i]
        taken.append((ident, capacity))
        remaining -= capacity
        i += 1
    return taken


def _fit_level(topo: FlavorTopology, domains: tuple[DomainAssignment, ...]) -> str | None:
    """The lowest level at which one domain holds every pod."""
    if not domains:
        return None
    first = domains[0].values
    common = len(first)
    for domain in domains[1:]:
        while common and domain.values[:common] != first[:common]:
            common -= 1
    return topo.levels[common - 1] if common else None
