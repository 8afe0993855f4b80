"""Topology-aware gang placement: where each admitted gang's pods run.

Pure, synchronous and deterministic. Admission builds one :class:`FlavorTopology` per
ResourceFlavor that names a Topology, keeps it current with node and pod events, and asks it to
``place`` (what-if) or ``reserve`` (commit) whole gangs. See docs/placement.md.
"""

from phalanx.placement.encoding import decode_topology_assignment, encode_topology_assignment
from phalanx.placement.model import (
    HOSTNAME_LABEL,
    GangRequest,
    Node,
    PlacementRequestError,
    PodSetRequest,
    Taint,
    Toleration,
    TopologyError,
    TopologyMode,
    TopologyRequest,
    topology_request_from_annotations,
)
from phalanx.placement.registry import FlavorTopologies
from phalanx.placement.result import (
    CLUSTER_LEVEL,
    DomainAssignment,
    FailureReason,
    GangPlacement,
    LevelFit,
    NodeUsage,
    PlacementFailure,
    PlacementResult,
    PodSetPlacement,
    Reservation,
)
from phalanx.placement.topology import FlavorTopology

__all__ = [
    "CLUSTER_LEVEL",
    "HOSTNAME_LABEL",
    "DomainAssignment",
    "FailureReason",
    "FlavorTopologies",
    "FlavorTopology",
    "GangPlacement",
    "GangRequest",
    "LevelFit",
    "Node",
    "NodeUsage",
    "PlacementFailure",
    "PlacementRequestError",
    "PlacementResult",
    "PodSetPlacement",
    "PodSetRequest",
    "Reservation",
    "Taint",
    "Toleration",
    "TopologyError",
    "TopologyMode",
    "TopologyRequest",
    "decode_topology_assignment",
    "encode_topology_assignment",
    "topology_request_from_annotations",
]
