"""Cross-field rules of Workload, its pod sets and its admission (see phalanx.api.rulebook)."""

from __future__ import annotations

from typing import Any

from phalanx.api.rules import Rule
from phalanx.api.workload import (
    PodSet,
    PodSetTopologyRequest,
    PriorityClassRef,
    Workload,
    WorkloadSpec,
)
from phalanx.api.workload_status import (
    TopologyAssignment,
    TopologyAssignmentSlice,
    TopologyAssignmentSliceLevelValues,
    TopologyAssignmentSlicePodCounts,
)

__all__ = ["WORKLOAD_RULES"]


def _quota_reserved_with_wrong_assignments(wl: Workload) -> list[str]:
    status = wl.status
    if status is None or status.admission is None or not status.conditions:
        return []
    reserved = any(c.type == "QuotaReserved" and c.status == "True" for c in status.conditions)
    if reserved and len(status.admission.pod_set_assignments) != len(wl.spec.pod_sets):
        return ["status.admission.podSetAssignments"]
    return []


def _slice_size_above_count(ps: PodSet) -> list[str]:
    request = ps.topology_request
    if request is None or request.pod_set_slice_size is None:
        return []
    return ["topologyRequest.podSetSliceSize"] if request.pod_set_slice_size > ps.count else []


def _topology_request_conflicts(request: PodSetTopologyRequest) -> list[str]:
    chosen = [
        request.required is not None,
        request.preferred is not None,
        bool(request.unconstrained),
    ]
    return [""] if sum(chosen) > 1 else []


WORKLOAD_RULES: tuple[Rule[Any], ...] = (
    Rule(
        name="PodSet-min-count-within-count",
        model=PodSet,
        cel="!has(self.minCount) || self.minCount <= self.count",
        message="minCount must not exceed count",
        check=lambda ps: (
            ["minCount"] if ps.min_count is not None and ps.min_count > ps.count else []
        ),
        field_path=".minCount",
    ),
    Rule(
        name="Workload-one-partial-pod-set",
        model=WorkloadSpec,
        cel="size(self.podSets.filter(p, has(p.minCount))) <= 1",
        message="only one pod set can set minCount (partial admission shrinks a single pod set)",
        check=lambda s: (
            ["podSets"] if sum(ps.min_count is not None for ps in s.pod_sets) > 1 else []
        ),
        field_path=".podSets",
    ),
    Rule(
        name="Workload-priority-class-needs-priority",
        model=WorkloadSpec,
        cel="!has(self.priorityClassRef) || has(self.priority)",
        message="priority must be set when priorityClassRef is set (copy the class's value)",
        check=lambda s: ["priority"] if s.priority_class_ref and s.priority is None else [],
        field_path=".priority",
    ),
    Rule(
        name="PriorityClassRef-scheduling-group-kind",
        model=PriorityClassRef,
        cel="self.group != 'scheduling.k8s.io' || self.kind == 'PriorityClass'",
        message="group scheduling.k8s.io needs kind PriorityClass",
        check=lambda r: (
            ["kind"] if r.group == "scheduling.k8s.io" and r.kind != "PriorityClass" else []
        ),
        field_path=".kind",
    ),
    Rule(
        name="PriorityClassRef-kueue-group-kind",
        model=PriorityClassRef,
        cel="self.group != 'kueue.x-k8s.io' || self.kind == 'WorkloadPriorityClass'",
        message="group kueue.x-k8s.io needs kind WorkloadPriorityClass",
        check=lambda r: (
            ["kind"] if r.group == "kueue.x-k8s.io" and r.kind != "WorkloadPriorityClass" else []
        ),
        field_path=".kind",
    ),
    Rule(
        name="PodSetTopologyRequest-one-mode",
        model=PodSetTopologyRequest,
        cel="(has(self.required) ? 1 : 0) + (has(self.preferred) ? 1 : 0) +"
        " (has(self.unconstrained) && self.unconstrained ? 1 : 0) <= 1",
        message="set at most one of required, preferred and unconstrained",
        check=_topology_request_conflicts,
    ),
    Rule(
        name="PodSetTopologyRequest-slice-pair",
        model=PodSetTopologyRequest,
        cel="has(self.podSetSliceRequiredTopology) == has(self.podSetSliceSize)",
        message="podSetSliceRequiredTopology and podSetSliceSize must be set together (each"
        " slice of podSetSliceSize pods lands in one domain of that level)",
        check=lambda r: (
            [""]
            if (r.pod_set_slice_required_topology is None) != (r.pod_set_slice_size is None)
            else []
        ),
    ),
    Rule(
        name="PodSet-slice-size-within-count",
        model=PodSet,
        cel="!has(self.topologyRequest) || !has(self.topologyRequest.podSetSliceSize) ||"
        " self.topologyRequest.podSetSliceSize <= self.count",
        message="topologyRequest.podSetSliceSize must not be greater than the pod set's count",
        check=_slice_size_above_count,
        field_path=".topologyRequest.podSetSliceSize",
    ),
    Rule(
        name="Workload-assignments-match-pod-sets",
        model=Workload,
        cel="has(self.status) && has(self.status.conditions) &&"
        " self.status.conditions.exists(c, c.type == 'QuotaReserved' && c.status == 'True') &&"
        " has(self.status.admission) ?"
        " size(self.spec.podSets) == size(self.status.admission.podSetAssignments) : true",
        message="status.admission.podSetAssignments must have one entry per pod set while"
        " quota is reserved",
        check=_quota_reserved_with_wrong_assignments,
        field_path=".status.admission.podSetAssignments",
    ),
    Rule(
        name="TopologyAssignment-values-per-level",
        model=TopologyAssignment,
        cel="self.slices.all(x, size(x.valuesPerLevel) == size(self.levels))",
        message="each slice needs one valuesPerLevel entry per level",
        check=lambda ta: [
            f"slices[{i}].valuesPerLevel"
            for i, s in enumerate(ta.slices)
            if len(s.values_per_level) != len(ta.levels)
        ],
        field_path=".slices",
    ),
    Rule(
        name="TopologyAssignmentSlice-pod-counts-length",
        model=TopologyAssignmentSlice,
        cel="!has(self.podCounts.individual) ||"
        " size(self.podCounts.individual) == self.domainCount",
        message="podCounts.individual must have length equal to domainCount",
        check=lambda s: (
            ["podCounts.individual"]
            if s.pod_counts.individual is not None
            and len(s.pod_counts.individual) != s.domain_count
            else []
        ),
        field_path=".podCounts.individual",
    ),
    Rule(
        name="TopologyAssignmentSlicePodCounts-one-form",
        model=TopologyAssignmentSlicePodCounts,
        cel="has(self.universal) != has(self.individual)",
        message="exactly one of the fields in [universal individual] must be set",
        check=lambda c: [""] if (c.universal is None) == (c.individual is None) else [],
    ),
    Rule(
        name="TopologyAssignmentSlice-roots-length",
        model=TopologyAssignmentSlice,
        cel="self.valuesPerLevel.all(x, !has(x.individual) ||"
        " size(x.individual.roots) == self.domainCount)",
        message="valuesPerLevel.individual, if set, must have roots of length equal to"
        " domainCount of this TopologyAssignmentSlice",
        check=lambda s: [
            f"valuesPerLevel[{i}].individual.roots"
            for i, v in enumerate(s.values_per_level)
            if v.individual is not None and len(v.individual.roots) != s.domain_count
        ],
        field_path=".valuesPerLevel",
    ),
    Rule(
        name="TopologyAssignmentSliceLevelValues-one-form",
        model=TopologyAssignmentSliceLevelValues,
        cel="has(self.universal) != has(self.individual)",
        message="exactly one of the fields in [universal individual] must be set",
        check=lambda v: [""] if (v.universal is None) == (v.individual is None) else [],
    ),
)
