"""``PlacementOracle`` backed by ``phalanx.placement``: one FlavorTopology per TAS flavor.

The operator feeds nodes and pods into the ``FlavorTopologies`` registry; the scheduler
asks this adapter to place, reserve and release whole gangs. A pod set's topology
assignment in the admission is the placement's ``PodSetPlacement`` (its
``topology_assignment()`` is Kueue's v1beta2 encoding).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

from phalanx.admission.placement_hook import PlacementAnswer, PlacementDemand
from phalanx.placement import (
    FlavorTopology,
    GangRequest,
    PlacementResult,
    PodSetRequest,
    TopologyRequest,
)

__all__ = ["TopologyLookup", "TopologyPlacement"]


class TopologyLookup(Protocol):
    """Where the placement trees live: ``phalanx.placement.FlavorTopologies`` (bench, tests)
    or the operator's ``TopologyOracle`` (kept current from its informers)."""

    def has_topology(self, flavor: str) -> bool: ...

    def get(self, flavor: str) -> FlavorTopology | None: ...


class TopologyPlacement:
    """The one adapter from placement trees to admission's ``PlacementOracle``.

    ``balanced_placement`` is Kueue's feature gate ``TASBalancedPlacement`` (alpha, off by
    default there and here): pod sets with a *preferred* topology are spread evenly over the
    fewest domains instead of packed best fit (see ``phalanx.placement.balanced``).
    """

    def __init__(self, topologies: TopologyLookup, *, balanced_placement: bool = False) -> None:
        self.topologies = topologies
        self.balanced_placement = balanced_placement

    def has_topology(self, flavor: str) -> bool:
        return self.topologies.has_topology(flavor)

    def place(
        self, *, flavor: str, key: str, pod_sets: Sequence[PlacementDemand]
    ) -> PlacementAnswer:
        topology = self.topologies.get(flavor)
        if topology is None:
            return PlacementAnswer(False, reason=f"flavor {flavor} has no topology")
        return _answer(topology.place(_gang(key, pod_sets), balanced=self.balanced_placement))

    def place_without(
        self,
        *,
        flavor: str,
        key: str,
        pod_sets: Sequence[PlacementDemand],
        removed: Collection[str],
    ) -> PlacementAnswer:
        topology = self.topologies.get(flavor)
        if topology is None:
            return PlacementAnswer(False, reason=f"flavor {flavor} has no topology")
        # speculate() undoes the releases on exit: the victims keep their reservations.
        with topology.speculate():
            for victim in sorted(removed):
                topology.release(victim)
            return _answer(topology.place(_gang(key, pod_sets), balanced=self.balanced_placement))

    def reserve(
        self, *, flavor: str, key: str, pod_sets: Sequence[PlacementDemand]
    ) -> PlacementAnswer:
        topology = self.topologies.get(flavor)
        if topology is None:
            return PlacementAnswer(False, reason=f"flavor {flavor} has no topology")
        if topology.is_reserved(key):
            # A gang re-admitted (e.g. after partial admission was recomputed) replaces its
            # previous reservation rather than holding two.
            topology.release(key)
        return _answer(topology.reserve(_gang(key, pod_sets), balanced=self.balanced_placement))

    def release(self, *, flavor: str, key: str) -> None:
        topology = self.topologies.get(flavor)
        if topology is not None:
            topology.release(key)


def _gang(key: str, pod_sets: Sequence[PlacementDemand]) -> GangRequest:
    return GangRequest(
        key=key,
        pod_sets=tuple(
            PodSetRequest(
                name=ps.name,
                count=ps.count,
                requests=ps.requests,
                # A pod set on a TAS flavor without a request is placed unconstrained.
                topology=ps.topology if ps.topology is not None else TopologyRequest(),
                tolerations=ps.tolerations,
                node_selector=ps.node_selector,
            )
            for ps in pod_sets
        ),
    )


def _answer(result: PlacementResult) -> PlacementAnswer:
    if result.placement is not None:
        return PlacementAnswer(True, {ps.name: ps for ps in result.placement.pod_sets})
    reason = result.failure.message if result.failure is not None else "no placement"
    return PlacementAnswer(False, reason=reason)
