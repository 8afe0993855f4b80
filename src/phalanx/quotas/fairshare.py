"""Dominant resource share (DRS), Kueue's fair-sharing measure of how much a node borrows.

For a ClusterQueue or Cohort with a parent: for each resource, the amount used beyond the
node's own subtree quota (summed over flavors) divided by what the parent could lend of that
resource; the largest such ratio is the dominant share, divided by the node's weight. A node
not borrowing has share 0; a node with weight 0 that borrows has the largest possible share.

With decayed fair sharing (a Phalanx addition) the usage is not what the node holds now but
what the caller gives per resource (``decayed``: the decayed average, at least what is held
now, in thousandths of base units since a decayed average is fractional, flavors summed; a
Cohort's is the sum of its ClusterQueues'): borrowed per resource is then that, plus the
candidate's request, minus the node's subtree quota of the resource summed over flavors.

Kueue keeps the ratio as a float in thousandths. Phalanx keeps integers so that ordering is
exact and reproducible: ``value`` is Kueue's weighted share times 1000 (rounded down), and
``weighted_share`` is Kueue's status value (rounded up).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from phalanx.quotas.resources import FlavorResource, Usage
from phalanx.quotas.tree import QuotaNode

__all__ = [
    "DECAYED_SCALE",
    "DecayedUsageOf",
    "Share",
    "dominant_resource_share",
    "lendable",
    "share_path",
]

DECAYED_SCALE = 1000
"""Decayed usage is in thousandths of base units (a thousandth of a GPU, a micro-CPU)."""
DecayedUsageOf = Callable[[QuotaNode], Mapping[str, int]]
"""A node's decayed usage per resource (``DECAYED_SCALE`` x base units, flavors summed), for
decayed fair sharing."""

_PER_MILLE = 1000
_PRECISION = 1000
INFINITE_SHARE = sys.maxsize


@dataclass(frozen=True, slots=True, order=True)
class Share:
    """A node's dominant resource share; compares by ``value`` (lower is served first)."""

    value: int
    dominant_resource: str = ""
    borrowing: bool = False

    @property
    def weighted_share(self) -> int:
        """Kueue's ``status.fairSharing.weightedShare``: per-mille, rounded up."""
        if self.value == INFINITE_SHARE:
            return INFINITE_SHARE
        return -(-self.value // _PRECISION)


ZERO_SHARE = Share(0)


def lendable(parent: QuotaNode) -> dict[str, int]:
    """What ``parent`` could lend per resource, summed over flavors (no usage assumed)."""
    total: dict[str, int] = {}
    for fr in parent.root.subtree:
        total[fr[1]] = total.get(fr[1], 0) + parent.potential_available(fr)
    return total


def dominant_resource_share(
    node: QuotaNode,
    extra: Usage | None = None,
    *,
    lendable_cache: dict[str, dict[str, int]] | None = None,
    decayed: Mapping[str, int] | None = None,
) -> Share:
    """The DRS of ``node`` if ``extra`` usage were added to it (removed, if negative).

    ``lendable_cache`` maps a parent's name to ``lendable(parent)``; it depends only on
    quotas, so callers may keep it for as long as the tree's structure does not change.
    ``decayed``: the node's decayed usage per resource (``DECAYED_SCALE`` x base units),
    used instead of what it holds now.
    """
    parent = node.parent
    if parent is None:
        return ZERO_SHARE
    extra = extra or {}
    if decayed is None:
        borrowed, scale = _borrowed_now(node, extra), 1
    else:
        borrowed, scale = _borrowed_decayed(node, extra, decayed), DECAYED_SCALE
    if not borrowed:
        return ZERO_SHARE
    if lendable_cache is None:
        capacity = lendable(parent)
    else:
        capacity = lendable_cache.get(parent.name) or {}
        if not capacity:
            capacity = lendable(parent)
            lendable_cache[parent.name] = capacity
    if node.fair_weight == 0:
        return Share(INFINITE_SHARE, min(borrowed), True)
    best, best_resource = 0, ""
    for resource in sorted(borrowed):
        lend = capacity.get(resource, 0) * scale
        if lend <= 0:
            continue
        value = borrowed[resource] * _PER_MILLE * _PRECISION * 1000 // (lend * node.fair_weight)
        if value > best:
            best, best_resource = value, resource
    return Share(best, best_resource, True)


def _borrowed_now(node: QuotaNode, extra: Usage) -> dict[str, int]:
    """Per resource, what ``node`` holds beyond its subtree quota, flavor by flavor."""
    borrowed: dict[str, int] = {}
    for fr in set(node.subtree) | set(extra):
        amount = node.usage.get(fr, 0) + extra.get(fr, 0) - node.subtree.get(fr, 0)
        if amount > 0:
            borrowed[fr[1]] = borrowed.get(fr[1], 0) + amount
    return borrowed


def _borrowed_decayed(node: QuotaNode, extra: Usage, decayed: Mapping[str, int]) -> dict[str, int]:
    """Per resource, the decayed usage plus ``extra`` beyond the subtree quota (flavors
    summed: decayed usage is kept per resource, as Kueue's ``consumedResources``), in
    ``DECAYED_SCALE`` x base units."""
    totals = dict(decayed)
    for fr, amount in extra.items():
        totals[fr[1]] = totals.get(fr[1], 0) + amount * DECAYED_SCALE
    for fr, quota in node.subtree.items():
        totals[fr[1]] = totals.get(fr[1], 0) - quota * DECAYED_SCALE
    return {resource: amount for resource, amount in totals.items() if amount > 0}


def share_path(
    node: QuotaNode,
    extra: Mapping[FlavorResource, int] | None,
    *,
    lendable_cache: dict[str, dict[str, int]] | None = None,
    decayed: DecayedUsageOf | None = None,
) -> tuple[int, ...]:
    """Shares from the top of the tree down to ``node``, each with ``extra`` added.

    Comparing these tuples orders candidates the way Kueue's hierarchical fair-sharing
    tournament does in the common cases: first by the share of their top-level subtree,
    then by the next level down. ``decayed``: each node's decayed usage (decayed fair
    sharing) instead of what it holds now.
    """
    chain = [n for n in node.path_to_root() if n.parent is not None]
    chain.reverse()
    return tuple(
        dominant_resource_share(
            n,
            extra,
            lendable_cache=lendable_cache,
            decayed=None if decayed is None else decayed(n),
        ).value
        for n in chain
    )
