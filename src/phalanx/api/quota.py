"""Resource groups and fair-sharing settings, shared by ClusterQueue and Cohort.

Limits: Kueue v1beta2 allows 64 flavors per group and 64 resources per flavor, checked by its
webhook. Phalanx keeps v1beta1's bound of 16 for each so that the API server itself can check
the cross-group rules (flavor and resource names unique across groups, flavors covering
exactly the group's resources) within its CEL cost budget; 16 x 16 is also Kueue's 256-flavor
total.
"""

from __future__ import annotations

from pydantic import Field

from phalanx.api.fields import (
    Int64,
    KueueModel,
    NameReference,
    Quantity,
    ResourceName,
    Time,
    list_map,
    list_set,
)

__all__ = [
    "MAX_FLAVORS_PER_GROUP",
    "MAX_RESOURCES_PER_GROUP",
    "MAX_RESOURCE_GROUPS",
    "AdmissionFairSharingStatus",
    "FairSharing",
    "FairSharingStatus",
    "FlavorQuotas",
    "FlavorUsage",
    "ResourceGroup",
    "ResourceQuota",
    "ResourceUsage",
]

MAX_RESOURCE_GROUPS = 16
MAX_FLAVORS_PER_GROUP = 16
MAX_RESOURCES_PER_GROUP = 16


class ResourceQuota(KueueModel):
    """The quota of one resource in one flavor."""

    name: ResourceName
    """Resource name, e.g. ``cpu``, ``memory`` or ``nvidia.com/gpu``."""
    nominal_quota: Quantity
    """Quantity available to this queue's workloads at any time; must be non-negative."""
    borrowing_limit: Quantity | None = None
    """Most this queue may borrow from its cohort above ``nominalQuota``; unset means no
    limit. Only allowed when the queue is in a cohort."""
    lending_limit: Quantity | None = None
    """Most of its unused ``nominalQuota`` this queue lends to its cohort; unset means all of
    it. Only allowed when the queue is in a cohort."""


class FlavorQuotas(KueueModel):
    """The quotas a ResourceFlavor provides for every resource of its group."""

    name: NameReference
    """Name of a ResourceFlavor."""
    resources: list[ResourceQuota] = Field(
        min_length=1, max_length=MAX_RESOURCES_PER_GROUP, json_schema_extra=list_map("name")
    )
    """One quota per covered resource of the group."""


class ResourceGroup(KueueModel):
    """Resources that are assigned together, and the flavors, in order of preference, that
    provide them."""

    covered_resources: list[ResourceName] = Field(
        min_length=1, max_length=MAX_RESOURCES_PER_GROUP, json_schema_extra=list_set()
    )
    """Resources covered by the flavors of this group; each resource appears in one group."""
    flavors: list[FlavorQuotas] = Field(
        min_length=1, max_length=MAX_FLAVORS_PER_GROUP, json_schema_extra=list_map("name")
    )
    """Flavors in the order they are tried; each flavor appears in one group."""


class FairSharing(KueueModel):
    """Weight of a ClusterQueue, Cohort or LocalQueue when sharing unused quota fairly."""

    weight: Quantity = 1
    """Relative share: usage above nominal quota is divided by it. 0 means always last."""


class AdmissionFairSharingStatus(KueueModel):
    """Resources a queue consumed, decayed (Kueue's admission fair sharing for a LocalQueue;
    Phalanx's decayed fair sharing for a ClusterQueue)."""

    consumed_resources: dict[str, Quantity]
    last_update: Time


class FairSharingStatus(KueueModel):
    """Current fair-sharing state of a ClusterQueue or Cohort."""

    weighted_share: Int64
    """Dominant resource share above nominal quota, divided by the weight (0 if within
    nominal quota)."""
    admission_fair_sharing_status: AdmissionFairSharingStatus | None = None
    """Phalanx's decayed fair sharing (not in Kueue): the ClusterQueue's decayed usage per
    resource, written every ``usageSamplingInterval`` by the leader and read back by a new
    one."""


class ResourceUsage(KueueModel):
    """Usage of one resource of a flavor."""

    name: ResourceName
    total: Quantity | None = None
    """Quantity in use, including what is borrowed."""
    borrowed: Quantity | None = None
    """Part of ``total`` above the nominal quota."""


class FlavorUsage(KueueModel):
    """Usage of the resources of one flavor."""

    name: NameReference
    resources: list[ResourceUsage] = Field(max_length=64, json_schema_extra=list_map("name"))
