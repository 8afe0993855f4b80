"""Kueue's balanced placement (feature gate ``TASBalancedPlacement``) for a preferred pod set.

Best fit fills the largest domains first and leaves the rest to the last one: 25 pods on two
hosts of 15 go 15 + 10. Collective operations (all-gather, all-reduce) run at the pace of the
slowest link, so some jobs want 13 + 12 instead. Balanced placement keeps the *number* of
domains best fit would use and evens the pods out across them:

- the balance is measured one level below the requested level L (the hosts under
  ``preferred: rack``; L itself when L is the slice level, then it must be the lowest level);
- the gang must fit in one domain one level above L (one block), tried block by block;
- the **threshold** of a block is the largest minimum any placement on the fewest domains can
  give: with the n largest domains holding the gang, ``min(slices // n, n-th largest room)``;
- the block with the highest threshold wins, then the one needing the fewest domains of L;
- domains below the threshold are set aside; among the rest, the fewest domains of L with
  the least room left over are chosen (ties: more evenly filled first), then the fewest
  domains one level down with the least room left over; each gets the threshold and the
  remainder goes to the roomiest first.

When no block holds the gang, or the chosen domains cannot take it whole, the caller falls
back to best fit, as Kueue does. Counting is in slices (``podSetSliceSize``) above the slice
level and in pods at and below it; choosing the set compares room in pods, as Kueue's does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from phalanx.placement.capacity import Path

if TYPE_CHECKING:
    from phalanx.placement.topology import FlavorTopology

__all__ = ["Room", "balanced_shares", "choose_domains", "spread", "threshold_of"]

UnitsFn = Callable[[Path, int], int]


@dataclass(frozen=True, slots=True)
class Room:
    """A domain as balancing sees it: how many slices and how many pods still fit."""

    path: Path
    slices: int
    pods: int


def balanced_shares(
    topo: FlavorTopology,
    *,
    pods: Mapping[Path, int],
    units: UnitsFn,
    depth: int,
    slice_depth: int,
    size: int,
    need: int,
) -> tuple[int, list[tuple[Path, int]]] | None:
    """Where ``need`` slices of a pod set preferring the level at ``depth`` go, balanced:
    (the depth of the returned domains, [(domain, slices)]); None means use best fit."""
    if depth == slice_depth and depth != topo.depth:
        # Kueue prunes below the threshold one level down, where a slice level above the
        # lowest one counts no slices at all, so every candidate is pruned and it falls back.
        return None
    below = depth < slice_depth
    best: tuple[int, int, list[Room], dict[Path, list[Room]]] | None = None
    for parent in topo.domains_at(depth - 1):
        if units(parent, depth - 1) < need:
            continue  # cannot hold the gang: no threshold (this skips most of a full flavor)
        # Domains without room take no part in any step below, so they are left out early.
        group = [Room(p, units(p, depth), pods[p]) for p in topo.children(parent) if pods.get(p)]
        children = (
            {
                g.path: [
                    Room(c, units(c, depth + 1), pods[c])
                    for c in topo.children(g.path)
                    if pods.get(c)
                ]
                for g in group
            }
            if below
            else {}
        )
        balanced = [c for g in group for c in children[g.path]] if below else group
        threshold = threshold_of(balanced, need)
        if threshold is None or (best is not None and threshold < best[0]):
            continue
        kept_group, kept_children = _prune(group, children, threshold, below=below)
        used = _greedy_count(kept_group, need)
        if used is None:
            continue
        if best is None or threshold > best[0] or used < best[1]:
            best = (threshold, used, kept_group, kept_children)
    if best is None:
        return None
    threshold, _, group, children = best
    if below:
        chosen = choose_domains(group, need, size, order=_by_room_and_evenness(children))
        if chosen is None:
            return None
        candidates = [c for g in chosen for c in children[g.path]]
        depth += 1
    else:
        candidates = group
    shares = spread(candidates, need, size, threshold)
    return None if shares is None else (depth, shares)


def threshold_of(domains: Sequence[Room], need: int) -> int | None:
    """The largest minimum a placement on the fewest of ``domains`` can give each of them
    (None: they do not hold ``need`` slices together)."""
    ranked = _ranked(domains)
    used = _greedy_count(ranked, need, ranked=True)
    if used is None:
        return None
    return min(need // used, ranked[used - 1].slices)


def choose_domains(
    domains: Sequence[Room],
    need: int,
    size: int,
    *,
    order: Callable[[Room], tuple[object, ...]] | None = None,
) -> list[Room] | None:
    """The fewest domains that hold ``need`` slices, with the least room (in pods) left over.

    Among sets of that size with equal leftover, the one built from the earliest domains in
    ``order`` (default: label order) wins. A dynamic program over (domains used, pods still
    to place) keeps the first set reaching each state; Kueue's, so the choice is the same.
    """
    fewest = _greedy_count(domains, need)
    if fewest is None:
        return None
    ranked = sorted(domains, key=order or (lambda d: (d.path,)))
    layers: list[dict[int, tuple[Room, ...]]] = [{} for _ in range(fewest + 1)]
    layers[0][need * size] = ()
    for domain in ranked:
        if domain.slices <= 0:
            continue
        for used in range(fewest, 0, -1):
            before = layers[used - 1]
            after = layers[used]
            for left in sorted(before):
                if left <= 0:
                    continue
                after.setdefault(left - domain.pods, (*before[left], domain))
    done = [left for left in layers[fewest] if left <= 0]
    return list(layers[fewest][max(done)]) if done else None


def spread(
    domains: Sequence[Room], need: int, size: int, threshold: int
) -> list[tuple[Path, int]] | None:
    """``threshold`` slices on each chosen domain, the rest to the roomiest first."""
    chosen = choose_domains(domains, need, size)
    if chosen is None or need < len(chosen) * threshold:
        return None
    extra = need - len(chosen) * threshold
    shares: list[tuple[Path, int]] = []
    for domain in _ranked(chosen):
        take = min(domain.slices - threshold, extra)
        shares.append((domain.path, threshold + take))
        extra -= take
    return None if extra > 0 else shares


def _prune(
    group: list[Room], children: Mapping[Path, list[Room]], threshold: int, *, below: bool
) -> tuple[list[Room], dict[Path, list[Room]]]:
    """Set aside what cannot take ``threshold`` slices: domains one level down first, then
    domains of the requested level, whose room is what their remaining children hold."""
    kept_group: list[Room] = []
    kept_children: dict[Path, list[Room]] = {}
    for domain in group:
        if below:
            kids = [
                c if c.slices >= threshold else Room(c.path, 0, 0) for c in children[domain.path]
            ]
            kept_children[domain.path] = kids
            domain = Room(domain.path, sum(c.slices for c in kids), sum(c.pods for c in kids))
        if domain.slices >= threshold:
            kept_group.append(domain)
    return kept_group, kept_children


def _ranked(domains: Iterable[Room]) -> list[Room]:
    """Best fit's order: most slices first, then the least pods (less waste), then labels."""
    return sorted(domains, key=lambda d: (-d.slices, d.pods, d.path))


def _greedy_count(domains: Sequence[Room], need: int, *, ranked: bool = False) -> int | None:
    """How many domains best fit takes, roomiest first, to hold ``need`` slices."""
    left = need
    for used, domain in enumerate(domains if ranked else _ranked(domains), start=1):
        if domain.slices <= 0:
            break
        left -= domain.slices
        if left <= 0:
            return used
    return None


def _by_room_and_evenness(
    children: Mapping[Path, list[Room]],
) -> Callable[[Room], tuple[object, ...]]:
    """Roomiest first; among equals, the domain whose children are filled most evenly (the
    higher entropy of their pod room), so the spread one level down has the most to work
    with; then labels."""

    def key(domain: Room) -> tuple[object, ...]:
        return (-domain.slices, -_entropy(c.pods for c in children[domain.path]), domain.path)

    return key


def _entropy(values: Iterable[int]) -> float:
    counts = [v for v in values if v > 0]
    total = sum(counts)
    if not total:
        return 0.0
    return -sum(v / total * math.log2(v / total) for v in counts)
