"""What placement is asked: nodes, pod sets and their topology requests, as frozen data.

Converting Kueue objects (pydantic models, kopf bodies) into these types is the job of
``phalanx.api``; this module only knows Kueue's *names*, so that a reader can map every field
back to the Workload and Topology it came from.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "ANNOTATION_PREFERRED",
    "ANNOTATION_REQUIRED",
    "ANNOTATION_SLICE_REQUIRED",
    "ANNOTATION_SLICE_SIZE",
    "ANNOTATION_UNCONSTRAINED",
    "HOSTNAME_LABEL",
    "GangRequest",
    "Node",
    "PlacementRequestError",
    "PodSetRequest",
    "Taint",
    "Toleration",
    "TopologyError",
    "TopologyMode",
    "TopologyRequest",
    "topology_request_from_annotations",
]

HOSTNAME_LABEL = "kubernetes.io/hostname"
ANNOTATION_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
ANNOTATION_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
ANNOTATION_UNCONSTRAINED = "kueue.x-k8s.io/podset-unconstrained-topology"
ANNOTATION_SLICE_REQUIRED = "kueue.x-k8s.io/podset-slice-required-topology"
ANNOTATION_SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"


class TopologyError(ValueError):
    """A Topology that cannot be built (the admin must fix the Topology object)."""


class PlacementRequestError(ValueError):
    """A pod set's topology request that cannot be understood (the user must fix the job)."""


class TopologyMode(enum.StrEnum):
    """Kueue's three ways to constrain a pod set to the topology."""

    REQUIRED = "Required"
    PREFERRED = "Preferred"
    UNCONSTRAINED = "Unconstrained"


@dataclass(frozen=True, slots=True)
class TopologyRequest:
    """Kueue's ``PodSetTopologyRequest``: where the pods of one pod set may go.

    ``level`` is a node label key of the Topology. ``slice_level``/``slice_size`` are
    ``podSetSliceRequiredTopology``/``podSetSliceSize``: every group of ``slice_size``
    consecutive pod indexes must land in one domain of ``slice_level``.
    """

    mode: TopologyMode = TopologyMode.UNCONSTRAINED
    level: str | None = None
    slice_level: str | None = None
    slice_size: int | None = None

    @classmethod
    def required(
        cls, level: str, *, slice_level: str | None = None, slice_size: int | None = None
    ) -> TopologyRequest:
        return cls(TopologyMode.REQUIRED, level, slice_level, slice_size)

    @classmethod
    def preferred(
        cls, level: str, *, slice_level: str | None = None, slice_size: int | None = None
    ) -> TopologyRequest:
        return cls(TopologyMode.PREFERRED, level, slice_level, slice_size)

    @classmethod
    def unconstrained(
        cls, *, slice_level: str | None = None, slice_size: int | None = None
    ) -> TopologyRequest:
        return cls(TopologyMode.UNCONSTRAINED, None, slice_level, slice_size)


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """The kube-scheduler's rule (k8s.io/api/core/v1 Toleration.ToleratesTaint)."""
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            # An empty key with Exists tolerates every taint; with Equal it matches nothing.
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True, slots=True)
class Node:
    """A node as placement sees it: where it sits (labels) and what it offers."""

    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, int]
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    unschedulable: bool = False


@dataclass(frozen=True, slots=True)
class PodSetRequest:
    """``count`` identical pods, each requesting ``requests`` (base units per resource)."""

    name: str
    count: int
    requests: Mapping[str, int]
    topology: TopologyRequest = field(default_factory=TopologyRequest)
    tolerations: tuple[Toleration, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GangRequest:
    """A workload's pod sets, placed all together or not at all."""

    key: str
    pod_sets: tuple[PodSetRequest, ...]


def topology_request_from_annotations(annotations: Mapping[str, str]) -> TopologyRequest | None:
    """Read Kueue's pod-template TAS annotations; None when the template has none.

    Raises PlacementRequestError naming the annotation when they contradict each other.
    """
    if not annotations:  # most templates: nothing to read
        return None
    required = annotations.get(ANNOTATION_REQUIRED)
    preferred = annotations.get(ANNOTATION_PREFERRED)
    unconstrained = annotations.get(ANNOTATION_UNCONSTRAINED)
    slice_level = annotations.get(ANNOTATION_SLICE_REQUIRED)
    slice_text = annotations.get(ANNOTATION_SLICE_SIZE)
    given = [
        name
        for name, value in (
            (ANNOTATION_REQUIRED, required),
            (ANNOTATION_PREFERRED, preferred),
            (ANNOTATION_UNCONSTRAINED, unconstrained),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise PlacementRequestError(
            f"metadata.annotations: {' and '.join(given)} are mutually exclusive; keep one"
        )
    if unconstrained is not None and unconstrained.lower() not in ("true", "false"):
        raise PlacementRequestError(
            f"metadata.annotations[{ANNOTATION_UNCONSTRAINED}]: {unconstrained!r} is not a"
            " boolean; use true or false"
        )
    slice_size = _parse_slice_size(slice_text, slice_level)
    if required is not None:
        return TopologyRequest.required(required, slice_level=slice_level, slice_size=slice_size)
    if preferred is not None:
        return TopologyRequest.preferred(preferred, slice_level=slice_level, slice_size=slice_size)
    if (unconstrained is not None and unconstrained.lower() == "true") or slice_level:
        return TopologyRequest.unconstrained(slice_level=slice_level, slice_size=slice_size)
    return None


def _parse_slice_size(text: str | None, slice_level: str | None) -> int | None:
    if text is None:
        return None
    if slice_level is None:
        raise PlacementRequestError(
            f"metadata.annotations[{ANNOTATION_SLICE_SIZE}] needs"
            f" {ANNOTATION_SLICE_REQUIRED} to name the level the slices must fit in"
        )
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size < 1:
        raise PlacementRequestError(
            f"metadata.annotations[{ANNOTATION_SLICE_SIZE}]: {text!r} is not a positive integer"
        )
    return size
