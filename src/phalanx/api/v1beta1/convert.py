"""Kueue's conversions between ``kueue.x-k8s.io/v1beta1`` and ``v1beta2``, on JSON objects.

The conversion webhook hands over objects as JSON and wants JSON back, so these functions take
and return plain dicts (never models): every field they do not rename passes through as it is,
and the API server prunes what the target version's schema does not declare.

The renames are Kueue's (``apis/kueue/v1beta1/*_conversion.go``):

- ClusterQueue ``spec.cohort`` <-> ``spec.cohortName``; v1beta1 ``spec.admissionChecks`` (a
  list of names) becomes ``spec.admissionChecksStrategy.admissionChecks[].name``; the v1beta1
  flavor-fungibility values ``Borrow`` and ``Preempt`` become ``MayStopSearch``.
- LocalQueue ``status.flavorUsage`` <-> ``status.flavorsUsage``.
- Workload ``spec.priorityClassSource`` + ``spec.priorityClassName`` <->
  ``spec.priorityClassRef{group, kind, name}``; ``status.accumulatedPastExexcutionTimeSeconds``
  (v1beta1's spelling) <-> ``status.accumulatedPastExecutionTimeSeconds``; a topology
  assignment's ``domains[{values, count}]`` <-> ``slices`` (the compressed encoding).

Like Kueue's, the conversion is lossless for every v1beta2 field that v1beta1 can express, and
drops what it cannot (Kueue keeps no annotations for them): v1beta2's
``concurrentAdmissionPolicy``, ``preemptionGates`` and ``podsetSliceRequiredTopologyConstraints``
going down; v1beta1's deprecated ``pendingWorkloadsStatus``, LocalQueue ``status.flavors``,
``admissionFairSharingStatus`` of ClusterQueue and Cohort, and a ``priorityClassName`` without
a ``priorityClassSource`` going up. A v1beta2 topology assignment comes back from v1beta1 in
the single-slice encoding Phalanx writes; one written with several slices comes back as the
same domains in one slice.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, Final

from phalanx.api.fields import API_VERSION, GROUP
from phalanx.placement.encoding import decode_topology_assignment, encode_topology_assignment

__all__ = [
    "V1BETA1",
    "V1BETA1_API_VERSION",
    "WEBHOOK_CONVERTED_KINDS",
    "ConversionError",
    "convert_object",
    "to_v1beta1",
    "to_v1beta2",
]

V1BETA1: Final = "v1beta1"
V1BETA1_API_VERSION: Final = f"{GROUP}/{V1BETA1}"

WEBHOOK_CONVERTED_KINDS: Final = frozenset({"ClusterQueue", "Cohort", "LocalQueue", "Workload"})
"""The kinds whose CRDs convert through the webhook, as in Kueue's CRDs. ResourceFlavor,
Topology and WorkloadPriorityClass are the same in both versions: the API server converts them
itself (``strategy: None``), so their v1beta1 works without the operator."""

# v1beta1's spec.priorityClassSource values (apis/kueue/v1beta1/workload_types.go).
WORKLOAD_PRIORITY_CLASS_SOURCE: Final = "kueue.x-k8s.io/workloadpriorityclass"
POD_PRIORITY_CLASS_SOURCE: Final = "scheduling.k8s.io/priorityclass"
_SOURCE_TO_REF: Final = {
    WORKLOAD_PRIORITY_CLASS_SOURCE: ("kueue.x-k8s.io", "WorkloadPriorityClass"),
    POD_PRIORITY_CLASS_SOURCE: ("scheduling.k8s.io", "PriorityClass"),
}
_REF_TO_SOURCE: Final = {ref: source for source, ref in _SOURCE_TO_REF.items()}

# v1beta1 flavor-fungibility values v1beta2 dropped, and what they mean there.
_FUNGIBILITY_UP: Final = {
    "whenCanBorrow": {"Borrow": "MayStopSearch"},
    "whenCanPreempt": {"Preempt": "MayStopSearch"},
}

_Converter = Callable[[dict[str, Any]], None]


class ConversionError(ValueError):
    """An object that cannot be converted; the message names the object and the field."""


def convert_object(obj: Mapping[str, Any], *, to: str) -> dict[str, Any]:
    """``obj`` (a Kueue object in v1beta1 or v1beta2) as ``to`` (an apiVersion); a copy.

    Raises :class:`ConversionError` for another group or version, or a malformed field.
    """
    source = obj.get("apiVersion")
    versions = (V1BETA1_API_VERSION, API_VERSION)
    if source not in versions or to not in versions:
        raise ConversionError(
            f"{_describe(obj)}: can only convert between {' and '.join(versions)}, "
            f"not from {source!r} to {to!r}"
        )
    if source == to:
        return copy.deepcopy(dict(obj))
    return to_v1beta2(obj) if to == API_VERSION else to_v1beta1(obj)


def to_v1beta2(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A v1beta1 object as v1beta2 (Kueue's ``ConvertTo``)."""
    out = copy.deepcopy(dict(obj))
    _UP.get(str(out.get("kind")), _nothing)(out)
    out["apiVersion"] = API_VERSION
    return out


def to_v1beta1(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A v1beta2 object as v1beta1 (Kueue's ``ConvertFrom``)."""
    out = copy.deepcopy(dict(obj))
    _DOWN.get(str(out.get("kind")), _nothing)(out)
    out["apiVersion"] = V1BETA1_API_VERSION
    return out


# -- ClusterQueue ---------------------------------------------------------------------------------


def _cluster_queue_up(obj: dict[str, Any]) -> None:
    spec = _section(obj, "spec")
    _rename(spec, "cohort", "cohortName")
    checks = spec.pop("admissionChecks", None)
    if checks:
        # Kueue overwrites any admissionChecksStrategy given alongside.
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    fungibility = spec.get("flavorFungibility")
    if isinstance(fungibility, dict):
        for field, renames in _FUNGIBILITY_UP.items():
            value = fungibility.get(field)
            if isinstance(value, str) and value in renames:
                fungibility[field] = renames[value]
    status = _section(obj, "status")
    status.pop("pendingWorkloadsStatus", None)
    _drop_admission_fair_sharing(status)


def _cluster_queue_down(obj: dict[str, Any]) -> None:
    spec = _section(obj, "spec")
    _rename(spec, "cohortName", "cohort")
    spec.pop("concurrentAdmissionPolicy", None)


# -- Cohort and LocalQueue ------------------------------------------------------------------------


def _cohort_up(obj: dict[str, Any]) -> None:
    _drop_admission_fair_sharing(_section(obj, "status"))


def _local_queue_up(obj: dict[str, Any]) -> None:
    status = _section(obj, "status")
    _rename(status, "flavorUsage", "flavorsUsage")
    status.pop("flavors", None)  # deprecated in v1beta1, removed in v1beta2


def _local_queue_down(obj: dict[str, Any]) -> None:
    _rename(_section(obj, "status"), "flavorsUsage", "flavorUsage")


# -- Workload -------------------------------------------------------------------------------------


def _workload_up(obj: dict[str, Any]) -> None:
    spec = _section(obj, "spec")
    source = spec.pop("priorityClassSource", None)
    name = spec.pop("priorityClassName", None)
    if source in _SOURCE_TO_REF and name:
        group, kind = _SOURCE_TO_REF[source]
        spec["priorityClassRef"] = {"group": group, "kind": kind, "name": name}
    status = _section(obj, "status")
    _rename(status, "accumulatedPastExexcutionTimeSeconds", "accumulatedPastExecutionTimeSeconds")
    for where, assignment in _topology_assignments(obj):
        domains = assignment.pop("domains", None) or []
        try:
            encoded = encode_topology_assignment(
                assignment.get("levels") or [],
                [(tuple(str(v) for v in d["values"]), int(d["count"])) for d in domains],
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ConversionError(
                f"{_describe(obj)}: {where}.domains: each domain needs values and count ({error})"
            ) from error
        assignment["slices"] = encoded["slices"]


def _workload_down(obj: dict[str, Any]) -> None:
    spec = _section(obj, "spec")
    ref = spec.pop("priorityClassRef", None)
    if isinstance(ref, dict):
        source = _REF_TO_SOURCE.get((str(ref.get("group")), str(ref.get("kind"))))
        if source is not None:
            spec["priorityClassSource"] = source
            spec["priorityClassName"] = ref.get("name")
    spec.pop("preemptionGates", None)
    for pod_set in spec.get("podSets") or ():
        request = pod_set.get("topologyRequest") if isinstance(pod_set, dict) else None
        if isinstance(request, dict):
            request.pop("podsetSliceRequiredTopologyConstraints", None)
    status = _section(obj, "status")
    _rename(status, "accumulatedPastExecutionTimeSeconds", "accumulatedPastExexcutionTimeSeconds")
    status.pop("preemptionGates", None)
    for where, assignment in _topology_assignments(obj):
        slices = assignment.pop("slices", None) or []
        try:
            _, domains = decode_topology_assignment({**assignment, "slices": slices})
        except (KeyError, TypeError, ValueError) as error:
            raise ConversionError(f"{_describe(obj)}: {where}: {error}") from error
        assignment["domains"] = [{"values": list(values), "count": n} for values, n in domains]


def _topology_assignments(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each pod set assignment's ``topologyAssignment``, with its field path."""
    admission = _section(obj, "status").get("admission")
    if not isinstance(admission, dict):
        return []
    found = []
    for i, assignment in enumerate(admission.get("podSetAssignments") or ()):
        topology = assignment.get("topologyAssignment") if isinstance(assignment, dict) else None
        if isinstance(topology, dict):
            where = f"status.admission.podSetAssignments[{i}].topologyAssignment"
            found.append((where, topology))
    return found


# -- shared ---------------------------------------------------------------------------------------


def _section(obj: dict[str, Any], name: str) -> dict[str, Any]:
    """``obj[name]`` if it is an object, else a detached empty dict (nothing to convert)."""
    value = obj.get(name)
    return value if isinstance(value, dict) else {}


def _rename(section: dict[str, Any], old: str, new: str) -> None:
    """Move ``old`` to ``new``; as in Kueue, the source field wins over a stray target field."""
    if old in section:
        section[new] = section.pop(old)


def _drop_admission_fair_sharing(status: dict[str, Any]) -> None:
    fair_sharing = status.get("fairSharing")
    if isinstance(fair_sharing, dict):
        fair_sharing.pop("admissionFairSharingStatus", None)


def _describe(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    meta = metadata if isinstance(metadata, Mapping) else {}
    namespace = meta.get("namespace")
    name = f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))
    return f"{obj.get('kind')} {name}"


def _nothing(obj: dict[str, Any]) -> None:
    """ResourceFlavor, Topology and WorkloadPriorityClass are the same in both versions."""


_UP: Final[dict[str, _Converter]] = {
    "ClusterQueue": _cluster_queue_up,
    "Cohort": _cohort_up,
    "LocalQueue": _local_queue_up,
    "Workload": _workload_up,
}
_DOWN: Final[dict[str, _Converter]] = {
    "ClusterQueue": _cluster_queue_down,
    "LocalQueue": _local_queue_down,
    "Workload": _workload_down,
}
