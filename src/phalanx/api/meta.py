"""The Kubernetes meta/v1 types that Kueue's kinds embed: object metadata, conditions and
label selectors."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field

from phalanx.api.fields import (
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    Int64,
    KueueModel,
    LabelName,
    Time,
)

__all__ = [
    "Condition",
    "ConditionStatus",
    "LabelSelector",
    "LabelSelectorOperator",
    "LabelSelectorRequirement",
    "ObjectMeta",
]


class ObjectMeta(KueueModel):
    """Standard object metadata. ``name`` is required: Phalanx's objects are applied, not
    created with ``generateName``."""

    name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    generate_name: str | None = None
    namespace: str | None = Field(default=None, max_length=63, pattern=DNS_LABEL_PATTERN)
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: Int64 | None = None
    creation_timestamp: Time | None = None
    deletion_timestamp: Time | None = None
    deletion_grace_period_seconds: Int64 | None = None
    finalizers: list[str] | None = None
    # Written by the API server; kept so that an exported object round-trips.
    owner_references: list[dict[str, Any]] | None = None
    managed_fields: list[dict[str, Any]] | None = None
    self_link: str | None = None


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(KueueModel):
    """A metav1.Condition, as Kueue reports ``Active``, ``QuotaReserved``, ``Admitted``..."""

    type: LabelName
    """Condition type in CamelCase, e.g. ``Admitted``."""
    status: ConditionStatus
    """True, False or Unknown."""
    observed_generation: Int64 | None = Field(default=None, ge=0)
    """The ``metadata.generation`` the condition was computed from."""
    last_transition_time: Time
    """When the status last changed."""
    reason: str = Field(
        min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
    )
    """Machine-readable reason in CamelCase."""
    message: str = Field(max_length=32768)
    """Human-readable explanation."""


class LabelSelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(KueueModel):
    """One ``key operator values`` term of a label selector."""

    key: LabelName
    """The label key the requirement applies to."""
    operator: LabelSelectorOperator
    """In, NotIn, Exists or DoesNotExist."""
    values: list[str] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )
    """Values for In and NotIn; must be empty for Exists and DoesNotExist."""


class LabelSelector(KueueModel):
    """A metav1.LabelSelector; the empty selector ``{}`` matches everything."""

    # Replaced as a whole on apply, as Kubernetes treats every label selector.
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-map-type": "atomic"})

    match_labels: dict[str, str] | None = None
    """Labels that must all be present with these values."""
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )
    """Requirements that must all hold."""
