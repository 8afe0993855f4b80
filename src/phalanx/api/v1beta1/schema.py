"""The v1beta1 version of each CRD, derived from its v1beta2 version.

v1beta1 differs from v1beta2 only in the fields :mod:`phalanx.api.v1beta1.convert` renames, so
its schema is the v1beta2 schema with those fields renamed or replaced (and the CEL rules that
name them rewritten), rather than a second set of models that could drift from the first.
Checks a v1beta1 schema cannot express are still made: every v1beta1 write is converted to
v1beta2 and passes through the validating webhook (its ``matchPolicy`` is ``Equivalent``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Final

from phalanx.api.v1beta1.convert import (
    POD_PRIORITY_CLASS_SOURCE,
    V1BETA1,
    WEBHOOK_CONVERTED_KINDS,
    WORKLOAD_PRIORITY_CLASS_SOURCE,
)

__all__ = [
    "CONVERSION_PATH",
    "CONVERSION_REVIEW_VERSIONS",
    "CONVERSION_SERVICE",
    "DEPRECATION_WARNING",
    "conversion",
    "v1beta1_version",
]

DEPRECATION_WARNING: Final = "This version is deprecated. Use v1beta2 instead."
"""Kueue's warning for its v1beta1 (``kubectl`` prints it on every v1beta1 request)."""

CONVERSION_PATH: Final = "/convert"
"""Where the operator's webhook server answers ConversionReviews."""

CONVERSION_SERVICE: Final = {"namespace": "phalanx-system", "name": "phalanx-webhook", "port": 443}
"""The Service of manifests/operator/. The operator rewrites the client config to where it
actually serves (and adds the caBundle) when it starts; until then, as in Kueue's CRDs, it names
the in-cluster Service."""

CONVERSION_REVIEW_VERSIONS: Final = ("v1",)

_Schema = dict[str, Any]


def conversion(kind: str) -> dict[str, Any]:
    """The CRD's ``spec.conversion``: Kueue's choice of kinds go through the webhook."""
    if kind not in WEBHOOK_CONVERTED_KINDS:
        return {"strategy": "None"}
    return {
        "strategy": "Webhook",
        "webhook": {
            "conversionReviewVersions": list(CONVERSION_REVIEW_VERSIONS),
            "clientConfig": {"service": {**CONVERSION_SERVICE, "path": CONVERSION_PATH}},
        },
    }


def v1beta1_version(kind: str, v1beta2: dict[str, Any]) -> dict[str, Any]:
    """The ``spec.versions[]`` entry of ``kind``'s CRD for v1beta1: served, not stored,
    deprecated, with the v1beta2 entry's schema under v1beta1's field names."""
    version = copy.deepcopy(v1beta2)
    version.update(name=V1BETA1, served=True, storage=False, deprecated=True)
    version["deprecationWarning"] = DEPRECATION_WARNING
    schema = version["schema"]["openAPIV3Schema"]
    _EDITS.get(kind, _same)(schema)
    for column in version.get("additionalPrinterColumns", ()):
        if column["jsonPath"] == ".spec.cohortName":
            column["jsonPath"] = ".spec.cohort"
    return version


def _cluster_queue(schema: _Schema) -> None:
    spec = _node(schema, "spec")
    props = spec["properties"]
    props["cohort"] = props.pop("cohortName")
    props.pop("concurrentAdmissionPolicy", None)
    props["admissionChecks"] = {
        "description": "Names of the AdmissionChecks every Workload of this queue must pass "
        "(v1beta1; v1beta2 writes spec.admissionChecksStrategy).",
        "type": "array",
        "items": {"type": "string", "maxLength": 316},  # Kueue's AdmissionCheckReference
        "maxItems": 64,
        "x-kubernetes-list-type": "set",
    }
    rules = []
    for rule in spec.get("x-kubernetes-validations", ()):
        if "concurrentAdmissionPolicy" in rule["rule"]:
            continue
        rules.append(_renamed(rule, "cohortName", "cohort"))
    spec["x-kubernetes-validations"] = rules
    fungibility = _node(spec, "flavorFungibility")["properties"]
    fungibility["whenCanBorrow"]["enum"] = [*fungibility["whenCanBorrow"]["enum"], "Borrow"]
    fungibility["whenCanPreempt"]["enum"] = [*fungibility["whenCanPreempt"]["enum"], "Preempt"]


def _local_queue(schema: _Schema) -> None:
    props = _node(schema, "status")["properties"]
    props["flavorUsage"] = props.pop("flavorsUsage")


def _workload(schema: _Schema) -> None:
    spec = _node(schema, "spec")
    props = spec["properties"]
    ref = props.pop("priorityClassRef")
    props["priorityClassSource"] = {
        "description": "Where priorityClassName comes from (v1beta1; v1beta2 writes "
        "spec.priorityClassRef).",
        "type": "string",
        "enum": [WORKLOAD_PRIORITY_CLASS_SOURCE, POD_PRIORITY_CLASS_SOURCE, ""],
    }
    props["priorityClassName"] = {
        "description": "Name of the WorkloadPriorityClass or PriorityClass the priority comes "
        "from (v1beta1).",
        **{k: ref["properties"]["name"][k] for k in ("type", "maxLength", "pattern")},
    }
    spec["x-kubernetes-validations"] = [
        _renamed(rule, "priorityClassRef", "priorityClassName")
        for rule in spec.get("x-kubernetes-validations", ())
    ]
    status = _node(schema, "status")["properties"]
    if "accumulatedPastExecutionTimeSeconds" in status:
        status["accumulatedPastExexcutionTimeSeconds"] = status.pop(
            "accumulatedPastExecutionTimeSeconds"
        )
    assignment = _node(schema, "status", "admission", "podSetAssignments", "topologyAssignment")
    levels = assignment["properties"]["levels"]
    assignment["properties"] = {
        "levels": levels,
        "domains": {
            "description": "The domains the pods are placed in, in pod-index order (v1beta1; "
            "v1beta2 writes the compressed slices).",
            "type": "array",
            "x-kubernetes-list-type": "atomic",
            "items": {
                "type": "object",
                "required": ["values", "count"],
                "properties": {
                    "values": {
                        "description": "The domain's node label value at each level.",
                        "type": "array",
                        "items": {"type": "string"},
                        "minItems": 1,
                        "maxItems": levels.get("maxItems", 16),
                        "x-kubernetes-list-type": "atomic",
                    },
                    "count": {
                        "description": "Pods placed in the domain.",
                        "type": "integer",
                        "format": "int32",
                        "minimum": 1,
                    },
                },
            },
        },
    }
    assignment["required"] = ["levels", "domains"]
    assignment.pop("x-kubernetes-validations", None)  # they check the slices


def _same(schema: _Schema) -> None:
    """Cohort, ResourceFlavor, Topology, WorkloadPriorityClass: no field differs."""


def _node(schema: _Schema, *path: str) -> _Schema:
    """The schema of ``path`` (property names; a list's items are stepped through)."""
    node = schema
    for name in path:
        if node.get("type") == "array":
            node = node["items"]
        try:
            node = node["properties"][name]
        except KeyError:
            raise KeyError(f"the v1beta2 schema has no {'.'.join(path)}") from None
    if node.get("type") == "array":
        node = node["items"]
    return node


def _renamed(rule: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    return {
        key: value.replace(old, new) if isinstance(value, str) else value
        for key, value in rule.items()
    }


_EDITS: Final[dict[str, Callable[[_Schema], None]]] = {
    "ClusterQueue": _cluster_queue,
    "LocalQueue": _local_queue,
    "Workload": _workload,
}
