"""What the scheduling core is told: Kueue's objects as plain frozen data.

Field names follow Kueue v1beta2 in snake case, so ``ClusterQueue.resource_groups[0].flavors``
is ``spec.resourceGroups[0].flavors``. Quantities are ``int`` base units (see
``phalanx.quotas.quantity``); times are ``int`` milliseconds on the caller's clock. Converting
API objects into these is ``phalanx.api``'s job.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from phalanx.placement.model import Taint, Toleration, TopologyRequest
from phalanx.quotas.resources import FlavorResource, ResourceQuota

__all__ = [
    "Admission",
    "BorrowWithinCohort",
    "ClusterQueue",
    "Cohort",
    "FlavorFungibility",
    "FlavorQuotas",
    "FungibilityPolicy",
    "FungibilityPreference",
    "LabelSelector",
    "LocalQueue",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "PodSet",
    "PodSetAssignment",
    "Preemption",
    "PreemptionPolicy",
    "QueueingStrategy",
    "ResourceFlavor",
    "ResourceGroup",
    "SelectorRequirement",
    "StopPolicy",
    "Taint",
    "Toleration",
    "TopologyRequest",
    "Workload",
    "WorkloadPriorityClass",
]

_EMPTY: Mapping[str, str] = MappingProxyType({})


class QueueingStrategy(enum.StrEnum):
    STRICT_FIFO = "StrictFIFO"
    BEST_EFFORT_FIFO = "BestEffortFIFO"


class StopPolicy(enum.StrEnum):
    NONE = "None"
    HOLD = "Hold"
    HOLD_AND_DRAIN = "HoldAndDrain"


class PreemptionPolicy(enum.StrEnum):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    LOWER_OR_NEWER_EQUAL_PRIORITY = "LowerOrNewerEqualPriority"
    ANY = "Any"


class FungibilityPolicy(enum.StrEnum):
    MAY_STOP_SEARCH = "MayStopSearch"
    TRY_NEXT_FLAVOR = "TryNextFlavor"


class FungibilityPreference(enum.StrEnum):
    BORROWING_OVER_PREEMPTION = "BorrowingOverPreemption"
    PREEMPTION_OVER_BORROWING = "PreemptionOverBorrowing"


@dataclass(frozen=True, slots=True)
class SelectorRequirement:
    """``matchExpressions[]`` of a label selector: In, NotIn, Exists, DoesNotExist."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return labels.get(self.key) not in self.values
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        raise ValueError(f"label selector operator {self.operator!r} is not supported")


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A Kubernetes label selector; the empty selector matches everything."""

    match_labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    match_expressions: tuple[SelectorRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if not self.match_labels and not self.match_expressions:
            return True
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        return all(req.matches(labels) for req in self.match_expressions)


@dataclass(frozen=True, slots=True)
class NodeSelectorRequirement:
    """``nodeSelectorTerms[].matchExpressions[]``: In, NotIn, Exists, DoesNotExist, Gt, Lt."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator in ("Gt", "Lt"):
            value = labels.get(self.key)
            if value is None or len(self.values) != 1:
                return False
            try:
                have, want = int(value), int(self.values[0])
            except ValueError:
                return False
            return have > want if self.operator == "Gt" else have < want
        return SelectorRequirement(self.key, self.operator, self.values).matches(labels)


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """One term of required node affinity; its requirements are ANDed."""

    match_expressions: tuple[NodeSelectorRequirement, ...] = ()


@dataclass(frozen=True, slots=True)
class ResourceFlavor:
    name: str
    node_labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    node_taints: tuple[Taint, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    topology_name: str | None = None


@dataclass(frozen=True, slots=True)
class FlavorQuotas:
    """``resourceGroups[].flavors[]``: one flavor's quota per covered resource."""

    name: str
    resources: Mapping[str, ResourceQuota]


@dataclass(frozen=True, slots=True)
class ResourceGroup:
    covered_resources: tuple[str, ...]
    flavors: tuple[FlavorQuotas, ...]


@dataclass(frozen=True, slots=True)
class FlavorFungibility:
    when_can_borrow: FungibilityPolicy = FungibilityPolicy.MAY_STOP_SEARCH
    when_can_preempt: FungibilityPolicy = FungibilityPolicy.TRY_NEXT_FLAVOR
    preference: FungibilityPreference | None = None


@dataclass(frozen=True, slots=True)
class BorrowWithinCohort:
    policy: PreemptionPolicy = PreemptionPolicy.NEVER
    max_priority_threshold: int | None = None


@dataclass(frozen=True, slots=True)
class Preemption:
    within_cluster_queue: PreemptionPolicy = PreemptionPolicy.NEVER
    reclaim_within_cohort: PreemptionPolicy = PreemptionPolicy.NEVER
    borrow_within_cohort: BorrowWithinCohort = field(default_factory=BorrowWithinCohort)


def _quotas_of(groups: tuple[ResourceGroup, ...]) -> dict[FlavorResource, ResourceQuota]:
    return {
        (flavor.name, resource): quota
        for group in groups
        for flavor in group.flavors
        for resource, quota in flavor.resources.items()
    }


@dataclass(frozen=True, slots=True)
class ClusterQueue:
    """``namespace_selector`` None is Kueue's null selector: no namespace may submit."""

    name: str
    resource_groups: tuple[ResourceGroup, ...] = ()
    cohort: str | None = None
    queueing_strategy: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO
    namespace_selector: LabelSelector | None = field(default_factory=LabelSelector)
    flavor_fungibility: FlavorFungibility = field(default_factory=FlavorFungibility)
    preemption: Preemption = field(default_factory=Preemption)
    stop_policy: StopPolicy = StopPolicy.NONE
    fair_weight: int = 1000
    """``fairSharing.weight`` in thousandths (weight 1 is 1000, weight 0.5 is 500)."""
    admission_checks: tuple[str, ...] = ()
    """Names of the AdmissionChecks of ``admissionChecksStrategy``: the queue admits nothing
    while one of them is missing or inactive (Kueue's rule). Which check applies to which
    workload, and its state, are the operator's business: the core reserves quota."""
    usage_based_fair_sharing: bool = False
    """``admissionScope.admissionMode: UsageBasedAdmissionFairSharing``: its LocalQueues are
    served by decayed usage when the scheduler has ``admission_fair_sharing`` configured
    (``phalanx.admission.fair_usage``)."""

    def quotas(self) -> dict[FlavorResource, ResourceQuota]:
        return _quotas_of(self.resource_groups)

    def flavor_names(self) -> tuple[str, ...]:
        return tuple(f.name for g in self.resource_groups for f in g.flavors)


@dataclass(frozen=True, slots=True)
class Cohort:
    name: str
    parent: str | None = None
    resource_groups: tuple[ResourceGroup, ...] = ()
    fair_weight: int = 1000

    def quotas(self) -> dict[FlavorResource, ResourceQuota]:
        return _quotas_of(self.resource_groups)


@dataclass(frozen=True, slots=True)
class LocalQueue:
    namespace: str
    name: str
    cluster_queue: str
    stop_policy: StopPolicy = StopPolicy.NONE
    fair_weight: float = 1.0
    """``fairSharing.weight`` for admission fair sharing (Kueue compares it as a float)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class WorkloadPriorityClass:
    name: str
    value: int


@dataclass(frozen=True, slots=True)
class PodSet:
    """``count`` pods, each requesting ``requests``; ``min_count`` enables partial admission."""

    name: str
    count: int
    requests: Mapping[str, int]
    min_count: int | None = None
    node_selector: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    node_affinity: tuple[NodeSelectorTerm, ...] = ()
    """Required node affinity terms (ORed); empty means none."""
    tolerations: tuple[Toleration, ...] = ()
    topology: TopologyRequest | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    """A Workload (or the Job it stands for). ``priority`` None takes the priority class's
    value, or 0 without one. ``creation_time`` orders the queue (FIFO)."""

    namespace: str
    name: str
    queue_name: str
    pod_sets: tuple[PodSet, ...]
    priority: int | None = None
    priority_class: str | None = None
    creation_time: int = 0
    active: bool = True

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PodSetAssignment:
    """``status.admission.podSetAssignments[]``."""

    name: str
    count: int
    flavors: Mapping[str, str]
    """resource -> flavor."""
    resource_usage: Mapping[str, int]
    """resource -> total quota used by the pod set (per-pod request x count)."""
    topology_assignment: object | None = None
    """Opaque placement result for a flavor with a topology (see ``PlacementOracle``)."""


@dataclass(frozen=True, slots=True)
class Admission:
    """``status.admission``: where a workload was admitted and with which flavors."""

    cluster_queue: str
    pod_sets: tuple[PodSetAssignment, ...]

    def usage(self) -> dict[FlavorResource, int]:
        total: dict[FlavorResource, int] = {}
        for ps in self.pod_sets:
            for resource, amount in ps.resource_usage.items():
                flavor = ps.flavors.get(resource)
                if flavor is not None and amount:
                    fr = (flavor, resource)
                    total[fr] = total.get(fr, 0) + amount
        return total
