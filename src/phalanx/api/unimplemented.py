"""Kueue v1beta2 fields that Phalanx does not implement.

DESIGN: a field Phalanx does not implement is rejected with a message naming it, never
silently ignored. Each entry here becomes a CEL rule ``!has(self.<field>)`` in the CRD (the
field is in the schema so that the API server does not prune it silently) and the message
``phalanx validate`` prints for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from phalanx.api.clusterqueue import ClusterQueueSpec, FlavorFungibility
from phalanx.api.fields import KueueModel
from phalanx.api.localqueue import LocalQueueSpec
from phalanx.api.resourceflavor import ResourceFlavorSpec
from phalanx.api.rules import Rule
from phalanx.api.workload import PodSetTopologyRequest, WorkloadSpec

__all__ = [
    "UNIMPLEMENTED_FIELDS",
    "UnimplementedField",
    "find_unimplemented",
    "unimplemented_rules",
]


@dataclass(frozen=True, kw_only=True)
class UnimplementedField:
    model: type[KueueModel]
    field: str
    """Wire name of the field."""
    json_type: Literal["object", "string", "integer", "array"]
    """OpenAPI type, so the schema can hold (and then reject) the field."""
    feature: str
    """The Kueue feature it belongs to, as a user would search for it."""

    @property
    def message(self) -> str:
        return (
            f"{self.field} ({self.feature}) is a Kueue field that Phalanx does not implement;"
            " remove it (see docs/api.md)"
        )

    def schema(self) -> dict[str, Any]:
        """Schema that holds the field (instead of pruning it) for its rule to reject."""
        schema: dict[str, Any] = {
            "type": self.json_type,
            "description": f"Kueue's {self.feature}: not implemented by Phalanx, rejected.",
        }
        if self.json_type == "object":
            # Any content: it is rejected whole by the rule, never interpreted.
            schema["x-kubernetes-preserve-unknown-fields"] = True
        elif self.json_type == "array":
            schema["items"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            schema["x-kubernetes-list-type"] = "atomic"
        return schema


UNIMPLEMENTED_FIELDS: tuple[UnimplementedField, ...] = (
    UnimplementedField(
        model=ClusterQueueSpec,
        field="concurrentAdmissionPolicy",
        json_type="object",
        feature="concurrent admission",
    ),
    UnimplementedField(
        model=FlavorFungibility,
        field="preference",
        json_type="string",
        feature="flavor preference between borrowing and preemption",
    ),
    UnimplementedField(
        model=LocalQueueSpec,
        field="wallTimePolicy",
        json_type="object",
        feature="wall-time limits",
    ),
    UnimplementedField(
        model=ResourceFlavorSpec,
        field="resourceWeights",
        json_type="object",
        feature="resource weights for fair sharing",
    ),
    UnimplementedField(
        model=WorkloadSpec,
        field="maximumExecutionTimeSeconds",
        json_type="integer",
        feature="maximum execution time",
    ),
    UnimplementedField(
        model=PodSetTopologyRequest,
        field="subGroupIndexLabel",
        json_type="string",
        feature="topology sub-groups (JobSet)",
    ),
    UnimplementedField(
        model=PodSetTopologyRequest,
        field="subGroupCount",
        json_type="integer",
        feature="topology sub-groups (JobSet)",
    ),
    UnimplementedField(
        model=PodSetTopologyRequest,
        field="podSetGroupName",
        json_type="string",
        feature="pod set groups",
    ),
    UnimplementedField(
        model=PodSetTopologyRequest,
        field="podsetSliceRequiredTopologyConstraints",
        json_type="array",
        feature="multi-level pod set slices",
    ),
    UnimplementedField(
        model=WorkloadSpec,
        field="preemptionGates",
        json_type="array",
        feature="preemption gates",
    ),
)


def find_unimplemented(model: type[Any] | None, field: str) -> UnimplementedField | None:
    """The entry for ``field`` of ``model``, if it is a known Kueue field Phalanx lacks."""
    for entry in UNIMPLEMENTED_FIELDS:
        if entry.model is model and entry.field == field:
            return entry
    return None


def _never_set(_: KueueModel) -> list[str]:
    # A parsed model cannot hold these fields: parsing already rejected them with the same
    # message (see phalanx.api.loader), so offline there is nothing left to find.
    return []


def unimplemented_rules() -> tuple[Rule[Any], ...]:
    """One API-server rule per unimplemented field, rejecting it with its message."""
    return tuple(
        Rule(
            name=f"unimplemented-{entry.model.__name__}-{entry.field}",
            model=entry.model,
            cel=f"!has(self.{entry.field})",
            message=entry.message,
            check=_never_set,
            field_path=f".{entry.field}",
        )
        for entry in UNIMPLEMENTED_FIELDS
    )
