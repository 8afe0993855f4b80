"""LocalQueue: the namespaced entry point through which workloads reach a ClusterQueue."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from phalanx.api.clusterqueue import StopPolicy
from phalanx.api.fields import (
    Int32,
    Int64,
    KueueModel,
    NameReference,
    Quantity,
    ResourceName,
    list_map,
)
from phalanx.api.meta import Condition, ObjectMeta
from phalanx.api.quota import AdmissionFairSharingStatus, FairSharing

__all__ = [
    "LocalQueue",
    "LocalQueueFairSharingStatus",
    "LocalQueueFlavorUsage",
    "LocalQueueResourceUsage",
    "LocalQueueSpec",
    "LocalQueueStatus",
]


class LocalQueueSpec(KueueModel):
    """Desired state of a LocalQueue."""

    cluster_queue: NameReference | None = None
    """The ClusterQueue this queue submits to; it cannot be changed afterwards."""
    stop_policy: StopPolicy = StopPolicy.NONE
    """None, Hold or HoldAndDrain; anything but None stops admission from this queue."""
    fair_sharing: FairSharing | None = None
    """Weight of this queue when sharing its ClusterQueue with other LocalQueues."""


class LocalQueueResourceUsage(KueueModel):
    """Usage of one resource of a flavor by this queue."""

    name: ResourceName
    total: Quantity | None = None


class LocalQueueFlavorUsage(KueueModel):
    """Usage of one flavor by this queue."""

    name: NameReference
    resources: list[LocalQueueResourceUsage] = Field(
        max_length=16, json_schema_extra=list_map("name")
    )


class LocalQueueFairSharingStatus(KueueModel):
    """Fair-sharing state of this queue within its ClusterQueue."""

    weighted_share: Int64
    admission_fair_sharing_status: AdmissionFairSharingStatus | None = None
    """Admission fair sharing: the queue's decayed usage, written every
    ``usageSamplingInterval`` by the leader and read back by a new one."""


class LocalQueueStatus(KueueModel):
    """Observed state of a LocalQueue."""

    conditions: list[Condition] | None = Field(
        default=None, max_length=16, json_schema_extra=list_map("type")
    )
    """``Active``: whether the backing ClusterQueue exists and admits."""
    pending_workloads: Int32 | None = None
    """Workloads of this queue not yet admitted."""
    reserving_workloads: Int32 | None = None
    """Workloads of this queue holding a quota reservation."""
    admitted_workloads: Int32 | None = None
    """Admitted workloads of this queue that have not finished."""
    flavors_reservation: list[LocalQueueFlavorUsage] | None = Field(
        default=None, max_length=16, json_schema_extra=list_map("name")
    )
    """Quota reserved by this queue's workloads, by flavor."""
    flavors_usage: list[LocalQueueFlavorUsage] | None = Field(
        default=None, max_length=16, json_schema_extra=list_map("name")
    )
    """Quota used by this queue's admitted workloads, by flavor."""
    fair_sharing: LocalQueueFairSharingStatus | None = None


class LocalQueue(KueueModel):
    """A namespaced queue: Jobs name it with the ``kueue.x-k8s.io/queue-name`` label."""

    api_version: Literal["kueue.x-k8s.io/v1beta2"] = "kueue.x-k8s.io/v1beta2"
    kind: Literal["LocalQueue"] = "LocalQueue"
    metadata: ObjectMeta
    spec: LocalQueueSpec = Field(default_factory=LocalQueueSpec)
    status: LocalQueueStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name
