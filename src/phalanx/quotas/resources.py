"""The vocabulary of quota arithmetic: flavor-resource pairs, quotas and usage maps.

Every amount is an ``int`` of the resource's base unit (see ``quantity.py``); a flavor-resource
pair is the key Kueue calls ``FlavorResource``: the same resource (``cpu``) under two flavors
(``spot``, ``on-demand``) is two independent quotas.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "FlavorResource",
    "ResourceQuota",
    "Usage",
    "add_into",
    "merge_usage",
    "subtract_into",
]

FlavorResource = tuple[str, str]
"""``(flavor, resource)``, e.g. ``("a100", "nvidia.com/gpu")``."""

Usage = Mapping[FlavorResource, int]
"""Amounts per flavor-resource pair, in base units."""


@dataclass(frozen=True, slots=True)
class ResourceQuota:
    """Kueue's per flavor-resource quota of a ClusterQueue or Cohort.

    ``borrowing_limit`` None means "borrow as much as the cohort has"; ``lending_limit`` None
    means "lend all of the nominal quota". Both must be None on a node without a parent.
    """

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    def __post_init__(self) -> None:
        for name in ("nominal", "borrowing_limit", "lending_limit"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be non-negative, got {value}")


def add_into(target: dict[FlavorResource, int], usage: Usage) -> None:
    """``target += usage``, key by key."""
    for fr, amount in usage.items():
        target[fr] = target.get(fr, 0) + amount


def subtract_into(target: dict[FlavorResource, int], usage: Usage) -> None:
    """``target -= usage``, dropping keys that reach zero so maps stay small."""
    for fr, amount in usage.items():
        left = target.get(fr, 0) - amount
        if left:
            target[fr] = left
        else:
            target.pop(fr, None)


def merge_usage(usages: Iterable[Usage]) -> dict[FlavorResource, int]:
    """The key-wise sum of several usage maps."""
    total: dict[FlavorResource, int] = {}
    for usage in usages:
        add_into(total, usage)
    return total
