"""Cohort: a node of the borrowing tree that ClusterQueues (and child Cohorts) belong to."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from phalanx.api.fields import KueueModel, NameReference
from phalanx.api.meta import ObjectMeta
from phalanx.api.quota import MAX_RESOURCE_GROUPS, FairSharing, FairSharingStatus, ResourceGroup

__all__ = ["Cohort", "CohortSpec", "CohortStatus"]


class CohortSpec(KueueModel):
    """Desired state of a Cohort."""

    parent_name: NameReference | None = None
    """Parent Cohort; unset makes this Cohort the root of its tree."""
    resource_groups: list[ResourceGroup] | None = Field(
        default=None,
        max_length=MAX_RESOURCE_GROUPS,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    """Quota shared by the whole subtree, on top of its ClusterQueues' own. Borrowing and
    lending limits here bound the subtree against its parent, so they need a parent."""
    fair_sharing: FairSharing | None = None
    """Weight of this Cohort in fair sharing among its siblings."""


class CohortStatus(KueueModel):
    """Observed state of a Cohort."""

    fair_sharing: FairSharingStatus | None = None


class Cohort(KueueModel):
    """A named group of ClusterQueues that lend each other unused quota."""

    api_version: Literal["kueue.x-k8s.io/v1beta2"] = "kueue.x-k8s.io/v1beta2"
    kind: Literal["Cohort"] = "Cohort"
    metadata: ObjectMeta
    spec: CohortSpec = Field(default_factory=CohortSpec)
    status: CohortStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name
