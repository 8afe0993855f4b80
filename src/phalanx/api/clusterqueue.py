"""ClusterQueue: a pool of quota, by flavor and resource, that admits workloads."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from phalanx.api.fields import Int32, KueueModel, NameReference, list_map, list_set
from phalanx.api.meta import Condition, LabelSelector, ObjectMeta
from phalanx.api.quota import (
    MAX_RESOURCE_GROUPS,
    FairSharing,
    FairSharingStatus,
    FlavorUsage,
    ResourceGroup,
)

__all__ = [
    "AdmissionCheckStrategyRule",
    "AdmissionChecksStrategy",
    "AdmissionMode",
    "AdmissionScope",
    "BorrowWithinCohort",
    "BorrowWithinCohortPolicy",
    "ClusterQueue",
    "ClusterQueuePreemption",
    "ClusterQueueSpec",
    "ClusterQueueStatus",
    "FlavorFungibility",
    "FlavorFungibilityPolicy",
    "PreemptionPolicy",
    "QueueingStrategy",
    "StopPolicy",
]


class QueueingStrategy(StrEnum):
    STRICT_FIFO = "StrictFIFO"
    """Workloads are ordered by priority, then creation time; the head blocks the rest."""
    BEST_EFFORT_FIFO = "BestEffortFIFO"
    """Same order, but a workload that does not fit does not block newer ones that do."""


class StopPolicy(StrEnum):
    NONE = "None"
    HOLD = "Hold"
    """No new admissions; admitted workloads run to completion."""
    HOLD_AND_DRAIN = "HoldAndDrain"
    """No new admissions, and admitted workloads are evicted."""


class PreemptionPolicy(StrEnum):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    LOWER_OR_NEWER_EQUAL_PRIORITY = "LowerOrNewerEqualPriority"
    ANY = "Any"


class BorrowWithinCohortPolicy(StrEnum):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"


class FlavorFungibilityPolicy(StrEnum):
    MAY_STOP_SEARCH = "MayStopSearch"
    """Stop at the first flavor where the workload fits, borrowing or preempting if needed."""
    TRY_NEXT_FLAVOR = "TryNextFlavor"
    """Try the next flavor before borrowing or preempting in this one."""


class FlavorFungibility(KueueModel):
    """Whether a workload tries the next flavor before borrowing or preempting in the
    current one."""

    when_can_borrow: FlavorFungibilityPolicy = FlavorFungibilityPolicy.MAY_STOP_SEARCH
    """What to do when the workload fits in this flavor only by borrowing."""
    when_can_preempt: FlavorFungibilityPolicy = FlavorFungibilityPolicy.TRY_NEXT_FLAVOR
    """What to do when the workload fits in this flavor only by preempting."""


class BorrowWithinCohort(KueueModel):
    """Whether a workload that must borrow may preempt workloads of other ClusterQueues."""

    policy: BorrowWithinCohortPolicy = BorrowWithinCohortPolicy.NEVER
    """Never, or LowerPriority: preempt only workloads of lower priority."""
    max_priority_threshold: Int32 | None = None
    """Only workloads at or below this priority may be preempted."""


class ClusterQueuePreemption(KueueModel):
    """When a pending workload may preempt admitted ones."""

    reclaim_within_cohort: Literal[
        PreemptionPolicy.NEVER, PreemptionPolicy.LOWER_PRIORITY, PreemptionPolicy.ANY
    ] = PreemptionPolicy.NEVER
    """Preempt workloads of other ClusterQueues that borrow this queue's nominal quota:
    Never, LowerPriority or Any."""
    borrow_within_cohort: BorrowWithinCohort = Field(
        default_factory=BorrowWithinCohort, json_schema_extra={"default": {}}
    )
    """Preemption in the cohort by a workload that needs to borrow."""
    within_cluster_queue: Literal[
        PreemptionPolicy.NEVER,
        PreemptionPolicy.LOWER_PRIORITY,
        PreemptionPolicy.LOWER_OR_NEWER_EQUAL_PRIORITY,
    ] = PreemptionPolicy.NEVER
    """Preempt workloads of this ClusterQueue: Never, LowerPriority or
    LowerOrNewerEqualPriority."""


class AdmissionCheckStrategyRule(KueueModel):
    """One AdmissionCheck a workload of this queue must pass, and on which flavors."""

    name: Annotated[str, Field(min_length=1, max_length=316)]
    """The AdmissionCheck's name."""
    on_flavors: list[NameReference] | None = Field(
        default=None, max_length=64, json_schema_extra=list_set()
    )
    """The check applies to a workload given quota in one of these flavors; empty: every
    flavor of the queue."""


class AdmissionChecksStrategy(KueueModel):
    """The AdmissionChecks of a ClusterQueue."""

    admission_checks: list[AdmissionCheckStrategyRule] = Field(
        min_length=1, max_length=64, json_schema_extra=list_map("name")
    )
    """Each check, with the flavors it applies to."""


class AdmissionMode(StrEnum):
    USAGE_BASED_ADMISSION_FAIR_SHARING = "UsageBasedAdmissionFairSharing"
    """The queue's LocalQueues are served by decayed usage (needs ``admissionFairSharing``
    in the operator's configuration)."""
    NO_ADMISSION_FAIR_SHARING = "NoAdmissionFairSharing"
    """Priority and FIFO only."""


class AdmissionScope(KueueModel):
    """Whether the ClusterQueue uses admission fair sharing between its LocalQueues."""

    admission_mode: AdmissionMode
    """UsageBasedAdmissionFairSharing or NoAdmissionFairSharing."""


class ClusterQueueSpec(KueueModel):
    """Desired state of a ClusterQueue."""

    resource_groups: list[ResourceGroup] | None = Field(
        default=None,
        max_length=MAX_RESOURCE_GROUPS,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    """Groups of resources and the flavors that provide quota for them (at most 16)."""
    cohort_name: NameReference | None = None
    """Cohort this queue belongs to; queues of a cohort borrow unused quota from each other."""
    queueing_strategy: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO
    """StrictFIFO or BestEffortFIFO."""
    namespace_selector: LabelSelector | None = None
    """Namespaces whose LocalQueues may submit here; unset matches none, ``{}`` matches all."""
    flavor_fungibility: FlavorFungibility = Field(
        default_factory=FlavorFungibility, json_schema_extra={"default": {}}
    )
    """Whether to try the next flavor before borrowing or preempting."""
    preemption: ClusterQueuePreemption = Field(
        default_factory=ClusterQueuePreemption, json_schema_extra={"default": {}}
    )
    """Preemption policies."""
    stop_policy: StopPolicy = StopPolicy.NONE
    """None, Hold or HoldAndDrain; anything but None makes the queue inactive."""
    fair_sharing: FairSharing | None = None
    """Weight of this queue in fair sharing."""
    admission_checks_strategy: AdmissionChecksStrategy | None = None
    """AdmissionChecks a workload must pass, besides quota, before it is admitted."""
    admission_scope: AdmissionScope | None = None
    """Admission fair sharing between this queue's LocalQueues (Kueue's
    ``AdmissionFairSharing``)."""


class ClusterQueueStatus(KueueModel):
    """Observed state of a ClusterQueue."""

    conditions: list[Condition] | None = Field(
        default=None, max_length=16, json_schema_extra=list_map("type")
    )
    """``Active``: whether the queue can admit workloads, and why not."""
    flavors_reservation: list[FlavorUsage] | None = Field(
        default=None, max_length=64, json_schema_extra=list_map("name")
    )
    """Quota reserved by workloads, by flavor."""
    flavors_usage: list[FlavorUsage] | None = Field(
        default=None, max_length=64, json_schema_extra=list_map("name")
    )
    """Quota used by admitted workloads, by flavor."""
    pending_workloads: Int32 | None = None
    """Workloads waiting for admission."""
    reserving_workloads: Int32 | None = None
    """Workloads holding a quota reservation."""
    admitted_workloads: Int32 | None = None
    """Admitted workloads that have not finished."""
    fair_sharing: FairSharingStatus | None = None
    """Fair-sharing state."""


class ClusterQueue(KueueModel):
    """A pool of quota, by flavor and resource, shared by the LocalQueues that point to it."""

    api_version: Literal["kueue.x-k8s.io/v1beta2"] = "kueue.x-k8s.io/v1beta2"
    kind: Literal["ClusterQueue"] = "ClusterQueue"
    metadata: ObjectMeta
    spec: ClusterQueueSpec = Field(default_factory=ClusterQueueSpec)
    status: ClusterQueueStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name
