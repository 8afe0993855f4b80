"""AdmissionCheck and ProvisioningRequestConfig: what a workload must pass, besides quota,
before it is admitted.

A ClusterQueue names its checks in ``spec.admissionChecksStrategy``; a workload that gets
quota in it is ``QuotaReserved`` and becomes ``Admitted`` only once every check that applies
to its flavors is ``Ready`` in its ``status.admissionChecks``. The controller named by
``spec.controllerName`` sets those states; Phalanx implements Kueue's ProvisioningRequest
controller (``kueue.x-k8s.io/provisioning-request``), configured by a ProvisioningRequestConfig.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from phalanx.api.fields import (
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    Int32,
    KueueModel,
    ResourceName,
    list_map,
    list_set,
)
from phalanx.api.meta import Condition, ObjectMeta

__all__ = [
    "PROVISIONING_REQUEST_CONTROLLER",
    "AdmissionCheck",
    "AdmissionCheckParametersReference",
    "AdmissionCheckSpec",
    "AdmissionCheckStatus",
    "PodSetMergePolicy",
    "ProvisioningRequestConfig",
    "ProvisioningRequestConfigSpec",
    "ProvisioningRequestPodSetUpdates",
    "ProvisioningRequestPodSetUpdatesNodeSelector",
    "ProvisioningRequestRetryStrategy",
]

PROVISIONING_REQUEST_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
"""``spec.controllerName`` of the checks Phalanx's ProvisioningRequest controller serves."""

_LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)


class AdmissionCheckParametersReference(KueueModel):
    """The object holding a check's configuration (for the ProvisioningRequest controller:
    a ProvisioningRequestConfig)."""

    api_group: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """Group of the referenced object, e.g. ``kueue.x-k8s.io``."""
    kind: str = Field(min_length=1, max_length=63, pattern=r"^(?i)[a-z]([-a-z0-9]*[a-z0-9])?$")
    """Kind of the referenced object, e.g. ``ProvisioningRequestConfig``."""
    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)
    """Name of the referenced object."""


class AdmissionCheckSpec(KueueModel):
    """Which controller evaluates the check, and with what configuration."""

    controller_name: str = Field(min_length=1, max_length=253)
    """The controller that sets this check's state on workloads (immutable)."""
    parameters: AdmissionCheckParametersReference | None = None
    """The check's configuration object."""


class AdmissionCheckStatus(KueueModel):
    """Observed state of an AdmissionCheck."""

    conditions: list[Condition] | None = Field(
        default=None, max_length=16, json_schema_extra=list_map("type")
    )
    """``Active``: whether its controller can evaluate it; a ClusterQueue naming an inactive
    or missing check admits nothing."""


class AdmissionCheck(KueueModel):
    """A condition a workload must satisfy, besides quota, before it is admitted."""

    api_version: Literal["kueue.x-k8s.io/v1beta2"] = "kueue.x-k8s.io/v1beta2"
    kind: Literal["AdmissionCheck"] = "AdmissionCheck"
    metadata: ObjectMeta
    spec: AdmissionCheckSpec
    status: AdmissionCheckStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name


class PodSetMergePolicy(StrEnum):
    IDENTICAL_POD_TEMPLATES = "IdenticalPodTemplates"
    """Pod sets with identical templates become one ProvisioningRequest pod set."""
    IDENTICAL_WORKLOAD_SCHEDULING_REQUIREMENTS = "IdenticalWorkloadSchedulingRequirements"
    """Pod sets with the same requests, node selector, tolerations and affinity are merged."""


class ProvisioningRequestRetryStrategy(KueueModel):
    """How often a failed ProvisioningRequest is tried again before the workload is
    deactivated (Kueue's defaults: 3 retries, 60 s doubling up to 1800 s)."""

    backoff_limit_count: Int32 = Field(default=3, ge=0)
    """Retries after the first attempt; once exhausted the check is Rejected."""
    backoff_base_seconds: Int32 = Field(default=60, ge=0)
    """First backoff; it doubles with every retry."""
    backoff_max_seconds: Int32 = Field(default=1800, ge=0)
    """Longest backoff."""


class ProvisioningRequestPodSetUpdatesNodeSelector(KueueModel):
    """A node selector entry the admitted pods get, with a value the autoscaler reports."""

    key: str = Field(min_length=1, max_length=317, pattern=_LABEL_KEY_PATTERN)
    """The node label key."""
    value_from_provisioning_class_detail: str = Field(min_length=1, max_length=32768)
    """The key of the ProvisioningRequest's ``status.provisioningClassDetails`` whose value
    is used."""


class ProvisioningRequestPodSetUpdates(KueueModel):
    """Updates to the pods of an admitted workload, to land on the provisioned nodes."""

    node_selector: list[ProvisioningRequestPodSetUpdatesNodeSelector] | None = Field(
        default=None, max_length=8, json_schema_extra=list_map("key")
    )
    """Node selector entries."""


class ProvisioningRequestConfigSpec(KueueModel):
    """How the ProvisioningRequests of a check are made."""

    provisioning_class_name: str = Field(
        min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN
    )
    """The autoscaler's provisioning class, e.g. ``check-capacity.autoscaling.x-k8s.io``."""
    parameters: dict[str, Annotated[str, Field(max_length=32768)]] | None = Field(
        default=None, json_schema_extra={"maxProperties": 100}
    )
    """Class parameters, passed to every ProvisioningRequest."""
    managed_resources: list[ResourceName] | None = Field(
        default=None, max_length=100, json_schema_extra=list_set()
    )
    """Only pod sets requesting one of these are provisioned; empty: all resources. A
    workload none of whose pod sets requests one passes the check at once."""
    retry_strategy: ProvisioningRequestRetryStrategy = Field(
        default_factory=ProvisioningRequestRetryStrategy,
        json_schema_extra={
            "default": {"backoffLimitCount": 3, "backoffBaseSeconds": 60, "backoffMaxSeconds": 1800}
        },
    )
    """Retries of a failed ProvisioningRequest."""
    pod_set_updates: ProvisioningRequestPodSetUpdates | None = None
    """What the admitted pods get from the provisioned capacity."""
    pod_set_merge_policy: PodSetMergePolicy | None = None
    """Merge similar pod sets into one ProvisioningRequest pod set."""


class ProvisioningRequestConfig(KueueModel):
    """The configuration of a ProvisioningRequest admission check."""

    api_version: Literal["kueue.x-k8s.io/v1beta2"] = "kueue.x-k8s.io/v1beta2"
    kind: Literal["ProvisioningRequestConfig"] = "ProvisioningRequestConfig"
    metadata: ObjectMeta
    spec: ProvisioningRequestConfigSpec

    @property
    def name(self) -> str:
        return self.metadata.name
