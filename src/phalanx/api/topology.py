"""Topology: the levels of the datacenter (block, rack, host) that placement packs gangs into."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from phalanx.api.fields import KueueModel, LabelName
from phalanx.api.meta import ObjectMeta

__all__ = ["HOSTNAME_LABEL", "MAX_TOPOLOGY_LEVELS", "Topology", "TopologyLevel", "TopologySpec"]

HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
MAX_TOPOLOGY_LEVELS: Final = 16


class TopologyLevel(KueueModel):
    """One level of the topology, named by the node label whose value is the domain."""

    node_label: LabelName
    """Node label of this level, e.g. ``cloud.provider.com/topology-rack``."""


class TopologySpec(KueueModel):
    """Desired state of a Topology."""

    levels: list[TopologyLevel] = Field(
        min_length=1,
        max_length=MAX_TOPOLOGY_LEVELS,
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    """Levels from the highest (e.g. block) to the lowest (e.g. host); they cannot change."""


class Topology(KueueModel):
    """How nodes group into domains, highest level first."""

    api_version: Literal["kueue.x-k8s.io/v1beta2"] = "kueue.x-k8s.io/v1beta2"
    kind: Literal["Topology"] = "Topology"
    metadata: ObjectMeta
    spec: TopologySpec

    @property
    def name(self) -> str:
        return self.metadata.name
