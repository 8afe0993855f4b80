"""Asking the ``PlacementOracle`` for a gang's placement on the flavors that have a topology.

Pod sets are grouped by the TAS flavor they were assigned; each group is placed (what-if)
or reserved in one call, and a failure on any flavor releases what the others reserved, so
a gang holds placements everywhere or nowhere. ``PlacementProbe`` is the victim search's
question "would it fit physically if these workloads were gone?".
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace

from phalanx.admission.flavors import Assignment
from phalanx.admission.model import Admission, PodSet, PodSetAssignment, Workload
from phalanx.admission.placement_hook import PlacementDemand, PlacementOracle

__all__ = [
    "PlacementProbe",
    "needs_placement",
    "place_admission",
    "place_assignment",
    "with_topology",
]

Outcome = tuple[bool, dict[str, object], str]
"""(placed, topology assignment per pod set name, why not)."""


def needs_placement(
    placement: PlacementOracle | None, pod_sets: Sequence[PodSetAssignment]
) -> bool:
    if placement is None:
        return False
    return any(placement.has_topology(f) for ps in pod_sets for f in ps.flavors.values())


def place_assignment(
    placement: PlacementOracle | None, key: str, assignment: Assignment, *, reserve: bool
) -> Outcome:
    """Quota fits; does the gang also fit physically on every flavor with a topology?"""
    if placement is None:
        return True, {}, ""
    return _place(
        placement,
        key,
        ((c.pod_set, c.count, c.flavors.values()) for c in assignment.pod_sets),
        reserve=reserve,
    )


class PlacementProbe:
    """Whether a preemptor's gang fits on its TAS flavors once some workloads are gone.

    The victim search calls it after the quota fits, with the keys of the workloads it has
    taken out; ``failure`` keeps the latest reason it did not fit, for the explanation.
    """

    __slots__ = ("assignment", "failure", "key", "placement")

    def __init__(self, placement: PlacementOracle, key: str, assignment: Assignment) -> None:
        self.placement = placement
        self.key = key
        self.assignment = assignment
        self.failure = ""

    def __call__(self, removed: Collection[str]) -> bool:
        ok, _, why = _place(
            self.placement,
            self.key,
            ((c.pod_set, c.count, c.flavors.values()) for c in self.assignment.pod_sets),
            reserve=False,
            removed=removed,
        )
        if not ok:
            self.failure = why
        return ok


def place_admission(
    placement: PlacementOracle, workload: Workload, admission: Admission, *, reserve: bool
) -> Outcome:
    """Place an admission decided earlier (a preemptor whose victims are now gone)."""
    pod_sets = {ps.name: ps for ps in workload.pod_sets}
    return _place(
        placement,
        workload.key,
        ((pod_sets[a.name], a.count, a.flavors.values()) for a in admission.pod_sets),
        reserve=reserve,
    )


def _place(
    placement: PlacementOracle,
    key: str,
    pod_sets: Iterable[tuple[PodSet, int, Iterable[str]]],
    *,
    reserve: bool,
    removed: Collection[str] | None = None,
) -> Outcome:
    by_flavor: dict[str, list[PlacementDemand]] = {}
    for ps, count, flavors in pod_sets:
        tas = sorted({f for f in flavors if placement.has_topology(f)})
        if not tas:
            continue
        by_flavor.setdefault(tas[0], []).append(
            PlacementDemand(
                name=ps.name,
                count=count,
                requests=ps.requests,
                topology=ps.topology,
                tolerations=ps.tolerations,
                node_selector=ps.node_selector,
            )
        )
    done: list[str] = []
    topology: dict[str, object] = {}
    for flavor in sorted(by_flavor):
        demands = by_flavor[flavor]
        if reserve:
            answer = placement.reserve(flavor=flavor, key=key, pod_sets=demands)
        elif removed is not None:
            answer = placement.place_without(
                flavor=flavor, key=key, pod_sets=demands, removed=removed
            )
        else:
            answer = placement.place(flavor=flavor, key=key, pod_sets=demands)
        if not answer.ok:
            if reserve:
                for held in done:
                    placement.release(flavor=held, key=key)
            return False, {}, f"topology placement failed on flavor {flavor}: {answer.reason}"
        done.append(flavor)
        topology.update(answer.assignments)
    return True, topology, ""


def with_topology(admission: Admission, topology: dict[str, object]) -> Admission:
    return replace(
        admission,
        pod_sets=tuple(
            replace(ps, topology_assignment=topology.get(ps.name, ps.topology_assignment))
            for ps in admission.pod_sets
        ),
    )
