"""Building blocks shared by every kind: the model base class and the field types of Kueue's API.

Each type carries both its Python validation and the OpenAPI fragment the CRD generator emits,
so that what ``phalanx validate`` accepts offline and what the API server accepts are written
once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Final

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    Strict,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

from phalanx.quotas.quantity import QuantityError, parse_quantity

__all__ = [
    "API_VERSION",
    "DNS_LABEL_PATTERN",
    "DNS_SUBDOMAIN_PATTERN",
    "GROUP",
    "VERSION",
    "FreeForm",
    "Int32",
    "Int64",
    "KueueModel",
    "LabelName",
    "NameReference",
    "PodSetName",
    "Quantity",
    "ResourceName",
    "Time",
    "list_map",
    "list_set",
]

GROUP: Final = "kueue.x-k8s.io"
VERSION: Final = "v1beta2"
API_VERSION: Final = f"{GROUP}/{VERSION}"

# RFC 1123 subdomain: what Kubernetes accepts as an object name and Kueue as a reference.
DNS_SUBDOMAIN_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# RFC 1123 label: pod set names, namespaces.
DNS_LABEL_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A label key or resource name: optional DNS-subdomain prefix and a name part.
_QUALIFIED_NAME_PATTERN: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
# Kubernetes' quantity grammar without the leading minus: every quantity Kueue takes is a
# non-negative amount, and the API server can reject a negative one without a webhook.
_NON_NEGATIVE_QUANTITY_PATTERN: Final = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


class KueueModel(BaseModel):
    """Base of every Kueue API model: camelCase on the wire, snake_case in Python.

    Unknown fields are rejected rather than dropped, so a typo or a Kueue feature that
    Phalanx does not implement is reported instead of being silently ignored.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        frozen=True,
        use_enum_values=False,
    )


def _check_int32(value: int) -> int:
    if not -(2**31) <= value < 2**31:
        raise ValueError(f"{value} does not fit in a 32-bit integer")
    return value


Int32 = Annotated[
    int,
    Strict(),
    AfterValidator(_check_int32),
    Field(json_schema_extra={"format": "int32"}),
]
Int64 = Annotated[int, Strict(), Field(json_schema_extra={"format": "int64"})]


def _check_quantity(value: Any) -> int | str:
    """Accept what the API server accepts for a non-negative ``resource.Quantity``.

    The raw value (``"16Gi"``, ``8``) is kept for a faithful round trip; converting to base
    units needs the resource name (CPU counts in milli-units), so it happens in conversion.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        if isinstance(value, float):
            raise ValueError(
                f"{value!r} is a floating-point number; write it as a string such as "
                f'"{value}" or with a suffix such as "500m"'
            )
        raise ValueError(f"must be a quantity such as 8, 500m or 16Gi, got {value!r}")
    if isinstance(value, str) and value != value.strip():
        raise ValueError(f"{value!r} has surrounding spaces; write the quantity alone")
    try:
        amount = parse_quantity(value)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None
    # The sign, not the rounded amount: "-500m" of a whole-unit resource rounds to 0.
    if amount < 0 or (isinstance(value, str) and value.startswith("-")):
        raise ValueError(f"{value!r} is negative; quantities must be greater than or equal to 0")
    return value


Quantity = Annotated[
    int | str,
    PlainValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "minimum": 0,
            "pattern": _NON_NEGATIVE_QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]


def _check_time(value: Any) -> str:
    if not isinstance(value, str):
        # PyYAML turns an unquoted timestamp into a datetime; keep the wire form.
        if isinstance(value, datetime):
            return value.isoformat().replace("+00:00", "Z")
        raise ValueError(f"must be an RFC 3339 timestamp, got {value!r}")
    try:
        datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{value!r} is not an RFC 3339 timestamp such as 2025-01-31T12:00:00Z"
        ) from None
    return value


Time = Annotated[
    str,
    PlainValidator(_check_time),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]

# A resource name such as ``cpu`` or ``nvidia.com/gpu``. The length bound matters beyond
# tidiness: the API server prices CEL rules by the longest string they may compare.
ResourceName = Annotated[str, Field(min_length=1, max_length=317)]
LabelName = Annotated[str, Field(min_length=1, max_length=316, pattern=_QUALIFIED_NAME_PATTERN)]
# The name of another object (a ClusterQueue, Cohort, ResourceFlavor, Topology, LocalQueue).
NameReference = Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
PodSetName = Annotated[str, Field(max_length=63, pattern=DNS_LABEL_PATTERN)]


def _check_free_form(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping, got {type(value).__name__}")
    return value


# An embedded object Phalanx passes through untouched (a Pod template): the API server keeps
# it as written instead of pruning it, and the kube-apiserver validates the Pods it becomes.
FreeForm = Annotated[
    dict[str, Any],
    PlainValidator(_check_free_form),
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


def list_map(*keys: str) -> dict[str, Any]:
    """Schema extension for a list whose items are unique by ``keys`` (a Kubernetes map list).

    The API server rejects duplicates itself; ``phalanx.api.rules`` reads the same marker to
    reject them offline.
    """
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


def list_set() -> dict[str, Any]:
    """Schema extension for a list of unique scalars."""
    return {"x-kubernetes-list-type": "set"}
