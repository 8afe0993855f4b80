"""What placement answers: placements, reservations and explanations, as frozen data."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from phalanx.placement.encoding import DomainCount, encode_topology_assignment
from phalanx.placement.model import HOSTNAME_LABEL

__all__ = [
    "CLUSTER_LEVEL",
    "DomainAssignment",
    "FailureReason",
    "GangPlacement",
    "LevelFit",
    "NodeUsage",
    "PlacementFailure",
    "PlacementResult",
    "PodSetPlacement",
    "Reservation",
]

# Name used in explanations for the whole flavor (the virtual root above the highest level).
CLUSTER_LEVEL = "cluster"


@dataclass(frozen=True, slots=True)
class DomainAssignment:
    """``count`` pods planned on ``node``, whose label values per topology level are ``values``."""

    values: tuple[str, ...]
    node: str
    count: int


@dataclass(frozen=True, slots=True)
class PodSetPlacement:
    """Where every pod of one pod set goes, in pod-index order."""

    name: str
    count: int
    levels: tuple[str, ...]
    fit_level: str | None
    domains: tuple[DomainAssignment, ...]

    def assignment_levels(self) -> tuple[str, ...]:
        """Kueue writes only the hostname when it is a level: it names the node by itself."""
        if self.levels and self.levels[-1] == HOSTNAME_LABEL:
            return (HOSTNAME_LABEL,)
        return self.levels

    def domain_counts(self) -> tuple[DomainCount, ...]:
        """(values at the assignment levels, pods), merging consecutive nodes of one domain."""
        skip = len(self.levels) - len(self.assignment_levels())
        out: list[DomainCount] = []
        for domain in self.domains:
            values = domain.values[skip:]
            if out and out[-1][0] == values:
                out[-1] = (values, out[-1][1] + domain.count)
            else:
                out.append((values, domain.count))
        return tuple(out)

    def topology_assignment(self) -> dict[str, Any]:
        """Kueue v1beta2 ``podSetAssignments[].topologyAssignment`` (see encoding.py)."""
        return encode_topology_assignment(self.assignment_levels(), self.domain_counts())

    def pod_node_selectors(self) -> tuple[dict[str, str], ...]:
        """Pod index -> the node selector that pins it inside its assigned domain."""
        levels = self.assignment_levels()
        out: list[dict[str, str]] = []
        for values, count in self.domain_counts():
            selector = dict(zip(levels, values, strict=True))
            out.extend(dict(selector) for _ in range(count))
        return tuple(out)


@dataclass(frozen=True, slots=True)
class GangPlacement:
    key: str
    pod_sets: tuple[PodSetPlacement, ...]


class FailureReason(enum.StrEnum):
    NO_FIT = "NoFit"  # not enough room anywhere in the flavor
    REQUIRED_LEVEL = "RequiredLevel"  # room exists, but not inside one domain of the level
    INVALID_REQUEST = "InvalidRequest"  # the request names an unknown level or bad slice
    NO_NODES = "NoNodes"  # no node of the flavor is eligible for this pod set


@dataclass(frozen=True, slots=True)
class LevelFit:
    """At one level: the domain with the most room for this pod set, against what it needs."""

    level: str
    largest_domain: tuple[str, ...]
    largest_free: int
    needed: int
    domains: int


@dataclass(frozen=True, slots=True)
class PlacementFailure:
    key: str
    pod_set: str
    reason: FailureReason
    needed: int
    levels: tuple[LevelFit, ...]
    excluded: Mapping[str, int]
    message: str


@dataclass(frozen=True, slots=True)
class PlacementResult:
    key: str
    placement: GangPlacement | None
    failure: PlacementFailure | None

    @property
    def ok(self) -> bool:
        return self.placement is not None


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """``pods`` pods of ``requests`` each, held on ``node`` by one gang."""

    node: str
    requests: Mapping[str, int]
    pods: int


@dataclass(frozen=True, slots=True)
class Reservation:
    """Exactly what a gang holds; releasing and restoring it are exact inverses."""

    key: str
    usage: tuple[NodeUsage, ...]

    @classmethod
    def from_placement(
        cls, placement: GangPlacement, requests: Mapping[str, Mapping[str, int]]
    ) -> Reservation:
        """``requests`` maps pod set name -> per-pod requests."""
        usage = tuple(
            NodeUsage(domain.node, requests[ps.name], domain.count)
            for ps in placement.pod_sets
            for domain in ps.domains
        )
        return cls(placement.key, usage)
