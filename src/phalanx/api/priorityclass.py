"""WorkloadPriorityClass: a named priority for workloads, independent of pod priority."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from phalanx.api.fields import Int32, KueueModel
from phalanx.api.meta import ObjectMeta

__all__ = ["WorkloadPriorityClass"]


class WorkloadPriorityClass(KueueModel):
    """A priority that Jobs pick with the label ``kueue.x-k8s.io/priority-class``."""

    api_version: Literal["kueue.x-k8s.io/v1beta2"] = "kueue.x-k8s.io/v1beta2"
    kind: Literal["WorkloadPriorityClass"] = "WorkloadPriorityClass"
    metadata: ObjectMeta
    value: Int32
    """Priority of the workloads of this class; higher is admitted first. Changing it does
    not change workloads already created."""
    description: str | None = Field(default=None, max_length=2048)
    """When this class should be used."""

    @property
    def name(self) -> str:
        return self.metadata.name
