"""ResourceFlavor: a kind of node (GPU model, spot or on-demand...) that quota is given in."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from phalanx.api.fields import Int64, KueueModel, LabelName, NameReference, Time
from phalanx.api.meta import ObjectMeta

__all__ = [
    "ResourceFlavor",
    "ResourceFlavorSpec",
    "Taint",
    "TaintEffect",
    "Toleration",
    "TolerationOperator",
]


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class TolerationOperator(StrEnum):
    EQUAL = "Equal"
    EXISTS = "Exists"


class Taint(KueueModel):
    """A core/v1 Taint carried by the nodes of a flavor."""

    key: LabelName
    value: str | None = Field(default=None, max_length=63)
    effect: TaintEffect
    time_added: Time | None = None


class Toleration(KueueModel):
    """A core/v1 Toleration added to the pods admitted in a flavor."""

    key: LabelName | None = None
    """Taint key; empty with operator Exists matches every taint."""
    operator: TolerationOperator | None = None
    """Equal (default) or Exists."""
    value: str | None = Field(default=None, max_length=63)
    effect: TaintEffect | None = None
    """Empty matches every effect."""
    toleration_seconds: Int64 | None = None
    """How long a NoExecute taint is tolerated."""


class ResourceFlavorSpec(KueueModel):
    """Desired state of a ResourceFlavor."""

    node_labels: dict[str, Annotated[str, Field(max_length=63)]] | None = Field(
        default=None, max_length=8, json_schema_extra={"x-kubernetes-map-type": "atomic"}
    )
    """Labels of the nodes of this flavor; injected as a node selector into admitted pods."""
    node_taints: list[Taint] | None = Field(
        default=None, max_length=8, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )
    """Taints of the nodes of this flavor; a workload must tolerate them to be assigned it."""
    tolerations: list[Toleration] | None = Field(
        default=None, max_length=8, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )
    """Tolerations added to the pods admitted in this flavor."""
    topology_name: NameReference | None = None
    """Topology describing the nodes of this flavor; enables topology-aware placement."""


class ResourceFlavor(KueueModel):
    """A kind of node that ClusterQueues give quota in."""

    api_version: Literal["kueue.x-k8s.io/v1beta2"] = "kueue.x-k8s.io/v1beta2"
    kind: Literal["ResourceFlavor"] = "ResourceFlavor"
    metadata: ObjectMeta
    spec: ResourceFlavorSpec = Field(default_factory=ResourceFlavorSpec)

    @property
    def name(self) -> str:
        return self.metadata.name
