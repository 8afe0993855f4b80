"""How admission asks for a physical placement on a flavor that has a Topology.

On such a flavor a workload needs quota **and** a placement of its whole gang. The scheduler
calls a ``PlacementOracle`` after the quota check passes: ``place`` to test (what-if),
``reserve`` when it admits, ``release`` when the workload finishes or is evicted. Preemption
asks ``place_without`` (what-if with some admitted workloads gone) so that it only evicts
victims whose absence lets the gang be placed. With no oracle (``None``) flavors are treated
as quota only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from phalanx.admission.model import Toleration, TopologyRequest

__all__ = ["PlacementAnswer", "PlacementDemand", "PlacementOracle"]

_NONE: Mapping[str, object] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class PlacementDemand:
    """One pod set to place on one flavor: ``count`` pods of ``requests`` each."""

    name: str
    count: int
    requests: Mapping[str, int]
    topology: TopologyRequest | None = None
    tolerations: tuple[Toleration, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PlacementAnswer:
    """``ok`` with a topology assignment per pod set name, or not ``ok`` with ``reason``."""

    ok: bool
    assignments: Mapping[str, object] = field(default_factory=lambda: _NONE)
    reason: str = ""


class PlacementOracle(Protocol):
    """Topology-aware placement, as admission needs it (see ``phalanx.placement``)."""

    def has_topology(self, flavor: str) -> bool:
        """Whether ``flavor`` needs a placement (it has a Topology the oracle knows)."""
        ...

    def place(
        self, *, flavor: str, key: str, pod_sets: Sequence[PlacementDemand]
    ) -> PlacementAnswer:
        """Would the gang ``key`` fit on ``flavor`` now? Never changes anything."""
        ...

    def place_without(
        self,
        *,
        flavor: str,
        key: str,
        pod_sets: Sequence[PlacementDemand],
        removed: Collection[str],
    ) -> PlacementAnswer:
        """Would the gang ``key`` fit on ``flavor`` if the workloads ``removed`` released
        what they hold there? Never changes anything (Kueue's preemption what-if on a
        speculative snapshot); unknown keys are ignored."""
        ...

    def reserve(
        self, *, flavor: str, key: str, pod_sets: Sequence[PlacementDemand]
    ) -> PlacementAnswer:
        """Place and hold the capacity for ``key`` (all pod sets or none)."""
        ...

    def release(self, *, flavor: str, key: str) -> None:
        """Free what ``key`` holds on ``flavor``; a no-op if it holds nothing."""
        ...
