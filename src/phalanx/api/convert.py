"""API objects (as the API server sends them: JSON dicts) to the core's frozen dataclasses, and
admission decisions back to ``status.admission`` JSON.

The operator converts every Workload it sees, and a burst brings tens of thousands; so these
functions read the raw dicts directly (no pydantic round trip) and cache quantity parsing.
Objects reaching here were admitted by the API server's schema and Phalanx's webhook; a field
that still does not parse raises :class:`ConversionError` naming it, and the operator reports
that on the object instead of scheduling it.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from phalanx.admission import model as core
from phalanx.placement import Node, Taint, Toleration, TopologyRequest
from phalanx.placement import topology_request_from_annotations as _annotation_topology
from phalanx.quotas.quantity import QuantityError, format_quantity, parse_quantity
from phalanx.quotas.resources import ResourceQuota

__all__ = [
    "ConversionError",
    "admission_from_status",
    "admission_to_status",
    "cluster_queue",
    "cohort",
    "local_queue",
    "node",
    "pod_requests",
    "pod_usage",
    "resource_flavor",
    "timestamp_ms",
    "topology_levels",
    "workload",
    "workload_priority_class",
]

_MILLI_WEIGHT = "cpu"  # parse_quantity in milli-units: weight 0.5 -> 500 thousandths


class ConversionError(ValueError):
    """A field of an API object that the core cannot use; the message names the field."""


@lru_cache(maxsize=4096)
def _quantity(text: str, resource: str) -> int:
    return parse_quantity(text, resource=resource)


def _parse(value: Any, resource: str, path: str) -> int:
    try:
        return _quantity(str(value), resource)
    except QuantityError as error:
        raise ConversionError(f"{path}: {error}") from error


def timestamp_ms(text: str | None) -> int:
    """RFC 3339 (``2026-01-02T03:04:05Z``) to milliseconds since the epoch; 0 when absent."""
    if not text:
        return 0
    return _timestamp_ms(text)


@lru_cache(maxsize=4096)
def _timestamp_ms(text: str) -> int:
    # Creation times have whole seconds: a burst's Workloads share them.
    return int(datetime.datetime.fromisoformat(text).timestamp() * 1000)


# -- admin kinds ------------------------------------------------------------------------------


def _resource_groups(
    groups: Iterable[Mapping[str, Any]] | None, path: str
) -> tuple[core.ResourceGroup, ...]:
    out: list[core.ResourceGroup] = []
    for g, group in enumerate(groups or ()):
        flavors: list[core.FlavorQuotas] = []
        for f, flavor in enumerate(group.get("flavors") or ()):
            quotas: dict[str, ResourceQuota] = {}
            for r, res in enumerate(flavor.get("resources") or ()):
                name = res["name"]
                at = f"{path}[{g}].flavors[{f}].resources[{r}]"
                borrowing = res.get("borrowingLimit")
                lending = res.get("lendingLimit")
                quotas[name] = ResourceQuota(
                    nominal=_parse(res.get("nominalQuota", 0), name, f"{at}.nominalQuota"),
                    borrowing_limit=None
                    if borrowing is None
                    else _parse(borrowing, name, f"{at}.borrowingLimit"),
                    lending_limit=None
                    if lending is None
                    else _parse(lending, name, f"{at}.lendingLimit"),
                )
            flavors.append(core.FlavorQuotas(name=flavor["name"], resources=quotas))
        out.append(
            core.ResourceGroup(
                covered_resources=tuple(group.get("coveredResources") or ()),
                flavors=tuple(flavors),
            )
        )
    return tuple(out)


def _label_selector(selector: Mapping[str, Any] | None) -> core.LabelSelector | None:
    if selector is None:
        return None
    return core.LabelSelector(
        match_labels=dict(selector.get("matchLabels") or {}),
        match_expressions=tuple(
            core.SelectorRequirement(
                key=req["key"], operator=req["operator"], values=tuple(req.get("values") or ())
            )
            for req in selector.get("matchExpressions") or ()
        ),
    )


def _weight(fair_sharing: Mapping[str, Any] | None, path: str) -> int:
    if not fair_sharing or fair_sharing.get("weight") is None:
        return 1000
    return _parse(fair_sharing["weight"], _MILLI_WEIGHT, f"{path}.weight")


def cluster_queue(obj: Mapping[str, Any]) -> core.ClusterQueue:
    spec = obj.get("spec") or {}
    preemption = spec.get("preemption") or {}
    borrow = preemption.get("borrowWithinCohort") or {}
    fungibility = spec.get("flavorFungibility") or {}
    preference = fungibility.get("preference")
    return core.ClusterQueue(
        name=obj["metadata"]["name"],
        resource_groups=_resource_groups(spec.get("resourceGroups"), "spec.resourceGroups"),
        cohort=spec.get("cohortName") or None,
        queueing_strategy=core.QueueingStrategy(spec.get("queueingStrategy", "BestEffortFIFO")),
        namespace_selector=_label_selector(spec.get("namespaceSelector")),
        flavor_fungibility=core.FlavorFungibility(
            when_can_borrow=core.FungibilityPolicy(
                fungibility.get("whenCanBorrow", "MayStopSearch")
            ),
            when_can_preempt=core.FungibilityPolicy(
                fungibility.get("whenCanPreempt", "TryNextFlavor")
            ),
            preference=core.FungibilityPreference(preference) if preference else None,
        ),
        preemption=core.Preemption(
            within_cluster_queue=core.PreemptionPolicy(
                preemption.get("withinClusterQueue", "Never")
            ),
            reclaim_within_cohort=core.PreemptionPolicy(
                preemption.get("reclaimWithinCohort", "Never")
            ),
            borrow_within_cohort=core.BorrowWithinCohort(
                policy=core.PreemptionPolicy(borrow.get("policy", "Never")),
                max_priority_threshold=borrow.get("maxPriorityThreshold"),
            ),
        ),
        stop_policy=core.StopPolicy(spec.get("stopPolicy", "None")),
        fair_weight=_weight(spec.get("fairSharing"), "spec.fairSharing"),
        admission_checks=tuple(
            str(rule["name"])
            for rule in (spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or ()
        ),
        usage_based_fair_sharing=(spec.get("admissionScope") or {}).get("admissionMode")
        == "UsageBasedAdmissionFairSharing",
    )


def cohort(obj: Mapping[str, Any]) -> core.Cohort:
    spec = obj.get("spec") or {}
    return core.Cohort(
        name=obj["metadata"]["name"],
        parent=spec.get("parentName") or None,
        resource_groups=_resource_groups(spec.get("resourceGroups"), "spec.resourceGroups"),
        fair_weight=_weight(spec.get("fairSharing"), "spec.fairSharing"),
    )


def local_queue(obj: Mapping[str, Any]) -> core.LocalQueue:
    spec = obj.get("spec") or {}
    return core.LocalQueue(
        namespace=obj["metadata"]["namespace"],
        name=obj["metadata"]["name"],
        cluster_queue=spec.get("clusterQueue", ""),
        stop_policy=core.StopPolicy(spec.get("stopPolicy", "None")),
        fair_weight=_weight(spec.get("fairSharing"), "spec.fairSharing") / 1000,
    )


def _taints(items: Iterable[Mapping[str, Any]] | None) -> tuple[Taint, ...]:
    return tuple(
        Taint(key=t["key"], value=t.get("value", ""), effect=t.get("effect", "NoSchedule"))
        for t in items or ()
    )


def _tolerations(items: Iterable[Mapping[str, Any]] | None) -> tuple[Toleration, ...]:
    return tuple(
        Toleration(
            key=t.get("key", ""),
            operator=t.get("operator", "Equal"),
            value=t.get("value", ""),
            effect=t.get("effect", ""),
        )
        for t in items or ()
    )


def resource_flavor(obj: Mapping[str, Any]) -> core.ResourceFlavor:
    spec = obj.get("spec") or {}
    return core.ResourceFlavor(
        name=obj["metadata"]["name"],
        node_labels=dict(spec.get("nodeLabels") or {}),
        node_taints=_taints(spec.get("nodeTaints")),
        tolerations=_tolerations(spec.get("tolerations")),
        topology_name=spec.get("topologyName") or None,
    )


def topology_levels(obj: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(level["nodeLabel"] for level in (obj.get("spec") or {}).get("levels") or ())


def workload_priority_class(obj: Mapping[str, Any]) -> core.WorkloadPriorityClass:
    return core.WorkloadPriorityClass(name=obj["metadata"]["name"], value=int(obj.get("value", 0)))


# -- pods and workloads -----------------------------------------------------------------------


def _container_requests(container: Mapping[str, Any], where: str, index: int) -> dict[str, int]:
    """The requests of ``where[index]`` (``spec.containers``, ...); the field is spelt out only
    for the error (this runs for every container of every Workload version)."""
    resources = container.get("resources") or {}
    limits = resources.get("limits")
    requests = resources.get("requests") or {}
    # Kubernetes defaults a missing request to the limit; Kueue counts it the same way.
    merged = {**limits, **requests} if limits else requests
    out: dict[str, int] = {}
    for name, value in merged.items():
        try:
            out[name] = _quantity(str(value), name)
        except QuantityError as error:
            field = f"{where}[{index}].resources.requests[{name}]"
            raise ConversionError(f"{field}: {error}") from error
    return out


def pod_requests(pod_spec: Mapping[str, Any], path: str = "spec") -> dict[str, int]:
    """Effective requests of one pod, as the kube-scheduler computes them: the sum of the
    containers (and sidecars), or the largest init container if that is more, plus overhead."""
    total: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for i, container in enumerate(pod_spec.get("initContainers") or ()):
        requests = _container_requests(container, f"{path}.initContainers", i)
        if container.get("restartPolicy") == "Always":
            for name, amount in requests.items():
                sidecars[name] = sidecars.get(name, 0) + amount
            continue
        for name, amount in requests.items():
            # An init container runs beside the sidecars started before it.
            init_peak[name] = max(init_peak.get(name, 0), amount + sidecars.get(name, 0))
    for i, container in enumerate(pod_spec.get("containers") or ()):
        for name, amount in _container_requests(container, f"{path}.containers", i).items():
            total[name] = total.get(name, 0) + amount
    for name, amount in sidecars.items():
        total[name] = total.get(name, 0) + amount
    for name, amount in init_peak.items():
        total[name] = max(total.get(name, 0), amount)
    for name, amount in (pod_spec.get("overhead") or {}).items():
        total[name] = total.get(name, 0) + _parse(amount, name, f"{path}.overhead[{name}]")
    return {name: amount for name, amount in total.items() if amount}


def _node_affinity(pod_spec: Mapping[str, Any]) -> tuple[core.NodeSelectorTerm, ...]:
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    return tuple(
        core.NodeSelectorTerm(
            match_expressions=tuple(
                core.NodeSelectorRequirement(
                    key=req["key"], operator=req["operator"], values=tuple(req.get("values") or ())
                )
                for req in term.get("matchExpressions") or ()
            )
        )
        for term in required.get("nodeSelectorTerms") or ()
    )


def _topology(
    pod_set: Mapping[str, Any], template: Mapping[str, Any], path: str
) -> TopologyRequest | None:
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    try:
        from_annotations = _annotation_topology(annotations)
    except ValueError as error:
        raise ConversionError(f"{path}.template.{error}") from error
    request = pod_set.get("topologyRequest")
    if not request:
        return from_annotations
    # Slices may come from the request (Kueue's fields) or the template's annotations.
    slice_level = request.get("podSetSliceRequiredTopology") or (
        from_annotations.slice_level if from_annotations else None
    )
    slice_size = request.get("podSetSliceSize") or (
        from_annotations.slice_size if from_annotations else None
    )
    if request.get("required"):
        return TopologyRequest.required(
            request["required"], slice_level=slice_level, slice_size=slice_size
        )
    if request.get("preferred"):
        return TopologyRequest.preferred(
            request["preferred"], slice_level=slice_level, slice_size=slice_size
        )
    if request.get("unconstrained") or slice_level:
        return TopologyRequest.unconstrained(slice_level=slice_level, slice_size=slice_size)
    return from_annotations


def workload(obj: Mapping[str, Any]) -> core.Workload:
    """A Workload's spec as the core sees it; ``creation_time`` in ms orders the queue."""
    metadata = obj["metadata"]
    spec = obj.get("spec") or {}
    pod_sets: list[core.PodSet] = []
    for i, pod_set in enumerate(spec.get("podSets") or ()):
        path = f"spec.podSets[{i}]"
        template = pod_set.get("template") or {}
        pod_spec = template.get("spec") or {}
        pod_sets.append(
            core.PodSet(
                name=pod_set.get("name", "main"),
                count=int(pod_set.get("count", 1)),
                requests=pod_requests(pod_spec, f"{path}.template.spec"),
                min_count=pod_set.get("minCount"),
                node_selector=dict(pod_spec.get("nodeSelector") or {}),
                node_affinity=_node_affinity(pod_spec),
                tolerations=_tolerations(pod_spec.get("tolerations")),
                topology=_topology(pod_set, template, path),
            )
        )
    ref = spec.get("priorityClassRef") or {}
    priority = spec.get("priority")
    return core.Workload(
        namespace=metadata["namespace"],
        name=metadata["name"],
        queue_name=spec.get("queueName") or "",
        pod_sets=tuple(pod_sets),
        priority=None if priority is None else int(priority),
        priority_class=ref.get("name") if ref.get("kind") == "WorkloadPriorityClass" else None,
        creation_time=timestamp_ms(metadata.get("creationTimestamp")),
        active=spec.get("active", True) is not False,
    )


def admission_from_status(admission: Mapping[str, Any]) -> core.Admission:
    """``status.admission`` back to the core's form (restoring state after a restart).

    The topology assignment stays in its API (v1beta2 JSON) form; the placement module reads
    that form to rebuild reservations.
    """
    pod_sets = []
    for i, psa in enumerate(admission.get("podSetAssignments") or ()):
        usage = {
            name: _parse(value, name, f"status.admission.podSetAssignments[{i}].resourceUsage")
            for name, value in (psa.get("resourceUsage") or {}).items()
        }
        pod_sets.append(
            core.PodSetAssignment(
                name=psa.get("name", "main"),
                count=int(psa.get("count", 0)),
                flavors=dict(psa.get("flavors") or {}),
                resource_usage=usage,
                topology_assignment=psa.get("topologyAssignment"),
            )
        )
    return core.Admission(cluster_queue=admission["clusterQueue"], pod_sets=tuple(pod_sets))


def admission_to_status(admission: core.Admission) -> dict[str, Any]:
    assignments = []
    for ps in admission.pod_sets:
        entry: dict[str, Any] = {
            "name": ps.name,
            "flavors": dict(ps.flavors),
            "resourceUsage": {
                name: format_quantity(amount, resource=name)
                for name, amount in ps.resource_usage.items()
            },
            "count": ps.count,
        }
        topology = ps.topology_assignment
        if topology is not None:
            encode = getattr(topology, "topology_assignment", None)
            raw = encode() if callable(encode) else topology
            if not isinstance(raw, Mapping):
                raise ConversionError(
                    f"status.admission.podSetAssignments[{ps.name}].topologyAssignment:"
                    f" cannot encode {type(raw).__name__}"
                )
            # placement already writes Kueue's wire form, which the CRD accepts as is.
            entry["topologyAssignment"] = dict(raw)
        assignments.append(entry)
    return {"clusterQueue": admission.cluster_queue, "podSetAssignments": assignments}


# -- nodes and pods (capacity for placement) --------------------------------------------------


def node(obj: Mapping[str, Any]) -> Node:
    metadata = obj["metadata"]
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    allocatable = {
        name: _quantity(str(value), name)
        for name, value in (status.get("allocatable") or {}).items()
    }
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    return Node(
        name=metadata["name"],
        labels=dict(metadata.get("labels") or {}),
        allocatable=allocatable,
        taints=_taints(spec.get("taints")),
        ready=ready,
        unschedulable=bool(spec.get("unschedulable", False)),
    )


def pod_usage(obj: Mapping[str, Any]) -> tuple[str, str, dict[str, int]] | None:
    """``(uid, node, requests)`` of a pod holding capacity on a node; None when it holds none
    (not bound yet, or finished)."""
    spec = obj.get("spec") or {}
    node_name = spec.get("nodeName")
    phase = (obj.get("status") or {}).get("phase")
    if not node_name or phase in ("Succeeded", "Failed"):
        return None
    return obj["metadata"]["uid"], node_name, pod_requests(spec)
