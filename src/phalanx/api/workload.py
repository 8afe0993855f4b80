"""Workload: a gang of pod sets that is admitted all at once, or not at all."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from phalanx.api.fields import (
    DNS_SUBDOMAIN_PATTERN,
    FreeForm,
    Int32,
    KueueModel,
    NameReference,
    PodSetName,
    list_map,
)
from phalanx.api.meta import ObjectMeta
from phalanx.api.workload_status import WorkloadStatus

__all__ = [
    "MAX_POD_SETS",
    "PodSet",
    "PodSetTopologyRequest",
    "PriorityClassGroup",
    "PriorityClassKind",
    "PriorityClassRef",
    "Workload",
    "WorkloadSpec",
]

MAX_POD_SETS = 8
TopologyLevelName = Annotated[str, Field(max_length=63)]


class PriorityClassGroup(StrEnum):
    KUEUE = "kueue.x-k8s.io"
    SCHEDULING = "scheduling.k8s.io"


class PriorityClassKind(StrEnum):
    WORKLOAD_PRIORITY_CLASS = "WorkloadPriorityClass"
    PRIORITY_CLASS = "PriorityClass"


class PriorityClassRef(KueueModel):
    """The class a workload's priority comes from: a WorkloadPriorityClass or a pod
    PriorityClass."""

    group: PriorityClassGroup
    """``kueue.x-k8s.io`` for a WorkloadPriorityClass, ``scheduling.k8s.io`` for a
    PriorityClass."""
    kind: PriorityClassKind
    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)


class PodSetTopologyRequest(KueueModel):
    """Where the pods of a pod set must, or should, land together. Filled from the pod
    template annotations ``kueue.x-k8s.io/podset-{required,preferred,unconstrained}-topology``.
    """

    required: TopologyLevelName | None = None
    """Topology level (node label) all pods must share a domain of."""
    preferred: TopologyLevelName | None = None
    """Topology level the pods should share a domain of, else the next level up."""
    unconstrained: bool | None = None
    """Place the pods anywhere there is capacity."""
    pod_index_label: str | None = Field(default=None, max_length=317)
    """Label holding each pod's index, so that neighbours in rank land close together."""
    pod_set_slice_required_topology: TopologyLevelName | None = None
    """Topology level (node label) each slice of ``podSetSliceSize`` consecutive pods must
    share a domain of (annotation ``kueue.x-k8s.io/podset-slice-required-topology``)."""
    pod_set_slice_size: Int32 | None = Field(default=None, ge=1)
    """Pods per slice (annotation ``kueue.x-k8s.io/podset-slice-size``); set together with
    ``podSetSliceRequiredTopology``, at most the pod set's count."""


class PodSet(KueueModel):
    """A group of identical pods."""

    name: PodSetName = "main"
    """Name, unique in the workload."""
    template: FreeForm
    """Pod template; only the resources, node selection, tolerations, labels and
    annotations matter for admission."""
    count: Int32 = Field(default=1, ge=0)
    """Number of pods."""
    min_count: Int32 | None = Field(default=None, ge=1)
    """Smallest acceptable number of pods, if the workload accepts partial admission."""
    topology_request: PodSetTopologyRequest | None = None
    """Topology placement constraint of the pod set."""


class WorkloadSpec(KueueModel):
    """Desired state of a Workload."""

    pod_sets: list[PodSet] = Field(
        min_length=1, max_length=MAX_POD_SETS, json_schema_extra=list_map("name")
    )
    """Pod sets, admitted together (1 to 8)."""
    queue_name: NameReference | None = None
    """LocalQueue, in the workload's namespace, it is submitted to."""
    priority_class_ref: PriorityClassRef | None = None
    """Class the priority comes from."""
    priority: Int32 | None = None
    """Priority; higher is admitted first and may preempt lower."""
    active: bool = True
    """False evicts the workload and keeps it from being admitted."""


class Workload(KueueModel):
    """A unit of admission: its pod sets are admitted together or not at all."""

    api_version: Literal["kueue.x-k8s.io/v1beta2"] = "kueue.x-k8s.io/v1beta2"
    kind: Literal["Workload"] = "Workload"
    metadata: ObjectMeta
    spec: WorkloadSpec
    status: WorkloadStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name
