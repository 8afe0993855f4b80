"""Workload status: the admission a ClusterQueue granted, and the conditions on the way."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from phalanx.api.fields import (
    FreeForm,
    Int32,
    KueueModel,
    NameReference,
    PodSetName,
    Quantity,
    Time,
    list_map,
)
from phalanx.api.meta import Condition

__all__ = [
    "Admission",
    "AdmissionCheckState",
    "PodSetAssignment",
    "PodSetRequest",
    "PodSetUpdate",
    "PreemptionGateState",
    "ReclaimablePod",
    "RequeueState",
    "SchedulingStats",
    "SchedulingStatsEviction",
    "TopologyAssignment",
    "TopologyAssignmentSlice",
    "TopologyAssignmentSliceLevelIndividualValues",
    "TopologyAssignmentSliceLevelValues",
    "TopologyAssignmentSlicePodCounts",
    "UnhealthyNode",
    "WorkloadStatus",
]

DomainValue = Annotated[str, Field(max_length=63)]
TopologyLevelLabel = Annotated[str, Field(max_length=317)]


class TopologyAssignmentSliceLevelIndividualValues(KueueModel):
    """Different values for the domains of a slice, at one level. Kueue's compact encoding:
    the common prefix and suffix are written once."""

    prefix: DomainValue | None = None
    suffix: DomainValue | None = None
    roots: list[DomainValue] = Field(
        min_length=1, max_length=100_000, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )
    """One value per domain, without prefix and suffix."""


class TopologyAssignmentSliceLevelValues(KueueModel):
    """The domain values, at one level, of the domains of a slice: one value for all of them
    (``universal``) or one each (``individual``)."""

    universal: DomainValue | None = None
    """The value of every domain of the slice."""
    individual: TopologyAssignmentSliceLevelIndividualValues | None = None


class TopologyAssignmentSlicePodCounts(KueueModel):
    """Pods per domain of a slice: the same number in each (``universal``) or one each."""

    universal: Int32 | None = Field(default=None, ge=1)
    """Pods in every domain of the slice."""
    individual: list[Annotated[Int32, Field(ge=1)]] | None = Field(
        default=None,
        min_length=1,
        max_length=100_000,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    """Pods in each domain, in order."""


class TopologyAssignmentSlice(KueueModel):
    """A run of domains and the number of pods in each."""

    domain_count: Int32 = Field(ge=1)
    values_per_level: list[TopologyAssignmentSliceLevelValues] = Field(
        min_length=1, max_length=16, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )
    """One entry per level of the assignment."""
    pod_counts: TopologyAssignmentSlicePodCounts


class TopologyAssignment(KueueModel):
    """Pods per topology domain, at the lowest level of the topology."""

    levels: list[TopologyLevelLabel] = Field(
        min_length=1, max_length=16, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )
    """Node label keys of the levels, highest first."""
    slices: list[TopologyAssignmentSlice] = Field(
        max_length=1000, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )


class PodSetAssignment(KueueModel):
    """What one pod set was admitted with."""

    name: PodSetName = "main"
    flavors: dict[str, NameReference] | None = None
    """Flavor assigned to each resource."""
    resource_usage: dict[str, Quantity] | None = None
    """Total resources of all the pods of the pod set."""
    count: Int32 | None = Field(default=None, ge=0)
    """Pods counted at admission."""
    topology_assignment: TopologyAssignment | None = None
    """Domains the pods are placed in, for a flavor with a Topology."""
    delayed_topology_request: Literal["Pending", "Ready"] | None = Field(default=None, max_length=7)
    """Kueue's delayed topology assignment (with ProvisioningRequests): accepted, not
    written by Phalanx, which places the pods when it admits."""


class Admission(KueueModel):
    """The ClusterQueue that admitted the workload and what each pod set got."""

    cluster_queue: NameReference
    pod_set_assignments: list[PodSetAssignment] = Field(
        max_length=8, json_schema_extra=list_map("name")
    )


class RequeueState(KueueModel):
    """Backoff state of a workload evicted for not becoming ready in time."""

    count: Int32 | None = Field(default=None, ge=0)
    """Times the workload was requeued."""
    requeue_at: Time | None = None
    """When it is queued again."""


class ReclaimablePod(KueueModel):
    """Pods of a pod set whose quota is no longer needed (they finished)."""

    name: PodSetName
    count: Int32 = Field(ge=0)


class PodSetRequest(KueueModel):
    """Resources a pending pod set asked for when last considered."""

    name: PodSetName
    resources: dict[str, Quantity] | None = None


class SchedulingStatsEviction(KueueModel):
    """How many times the workload was evicted for one reason."""

    reason: Annotated[str, Field(max_length=316)]
    underlying_cause: Annotated[str, Field(max_length=316)]
    """Kueue's cause of a deactivation; empty for Phalanx's evictions."""
    count: Int32 = Field(ge=0)


class SchedulingStats(KueueModel):
    evictions: list[SchedulingStatsEviction] | None = Field(
        default=None, max_length=256, json_schema_extra=list_map("reason", "underlyingCause")
    )


class UnhealthyNode(KueueModel):
    """A node Kueue's failure recovery found unhealthy (accepted, not written by Phalanx)."""

    name: Annotated[str, Field(max_length=63)]


class PreemptionGateState(KueueModel):
    """A preemption gate's position (accepted, not written by Phalanx)."""

    name: Annotated[str, Field(min_length=1, max_length=63)]
    position: Literal["Closed", "Open"]
    last_transition_time: Time


class PodSetUpdate(KueueModel):
    """What an admission check asks to add to a pod set's pods."""

    name: PodSetName
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    node_selector: dict[str, str] | None = None
    tolerations: list[FreeForm] | None = Field(
        default=None, max_length=8, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )


class AdmissionCheckState(KueueModel):
    """The state of one admission check (accepted, not written by Phalanx)."""

    name: Annotated[str, Field(min_length=1, max_length=316)]
    state: Literal["Pending", "Ready", "Retry", "Rejected"]
    last_transition_time: Time
    message: Annotated[str, Field(max_length=32768)]
    pod_set_updates: list[PodSetUpdate] | None = Field(
        default=None, max_length=8, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )
    requeue_after_seconds: Int32 | None = None
    retry_count: Int32 | None = None


class WorkloadStatus(KueueModel):
    """Observed state of a Workload."""

    conditions: list[Condition] | None = Field(
        default=None, max_length=16, json_schema_extra=list_map("type")
    )
    """QuotaReserved, Admitted, PodsReady, Evicted, Preempted, Requeued, Finished."""
    admission: Admission | None = None
    """Set when quota is reserved; cleared on eviction."""
    requeue_state: RequeueState | None = None
    reclaimable_pods: list[ReclaimablePod] | None = Field(
        default=None, max_length=8, json_schema_extra=list_map("name")
    )
    resource_requests: list[PodSetRequest] | None = Field(
        default=None, max_length=8, json_schema_extra=list_map("name")
    )
    accumulated_past_execution_time_seconds: Int32 | None = None
    """Seconds the workload was admitted before its latest eviction (Phalanx adds the
    admitted time when an eviction completes, as Kueue does)."""
    scheduling_stats: SchedulingStats | None = None
    """Evictions by reason (Phalanx counts them, as Kueue does)."""
    admission_checks: list[AdmissionCheckState] | None = Field(
        default=None, max_length=8, json_schema_extra=list_map("name")
    )
    """Kueue's admission checks: accepted, not written by Phalanx."""
    cluster_name: Annotated[str, Field(max_length=256)] | None = None
    """MultiKueue: accepted, not written by Phalanx."""
    nominated_cluster_names: list[Annotated[str, Field(max_length=256)]] | None = Field(
        default=None, max_length=20, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )
    """MultiKueue: accepted, not written by Phalanx."""
    unhealthy_nodes: list[UnhealthyNode] | None = Field(
        default=None, max_length=8, json_schema_extra=list_map("name")
    )
    """Failure recovery: accepted, not written by Phalanx."""
    preemption_gates: list[PreemptionGateState] | None = Field(
        default=None, max_length=8, json_schema_extra=list_map("name")
    )
    """Preemption gates: accepted, not written by Phalanx."""
