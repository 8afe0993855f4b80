"""Kueue's scheduler-performance files: ``generator.yaml`` -> Scenario, ``rangespec.yaml``.

Format: kubernetes-sigs/kueue ``test/performance/scheduler`` (cohorts[].queuesSets[].
workloadsSets[].workloads[]). Errors name the field path and say what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from phalanx.admission.model import PreemptionPolicy, ResourceFlavor, TopologyRequest
from phalanx.bench.core_replay import (
    BenchResult,
    CohortSet,
    QueueSet,
    Scenario,
    WorkloadSet,
    WorkloadTemplate,
)
from phalanx.bench.tas import TopologyLevel, TopologySpec
from phalanx.quotas.quantity import QuantityError, parse_quantity

__all__ = [
    "RangeSpec",
    "ScenarioError",
    "TopologySpec",
    "load_rangespec",
    "load_scenario",
    "load_topology",
]


class ScenarioError(ValueError):
    """A scenario or rangespec file that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class RangeSpec:
    max_wall_ms: int | None
    min_usage_pct: Mapping[str, float]
    max_avg_time_to_admission_ms: Mapping[str, int]

    def problems(self, result: BenchResult) -> list[str]:
        """Thresholds that ``result`` misses (Kueue's checker, with virtual wall time)."""
        found = []
        if self.max_wall_ms is not None and result.virtual_wall_ms > self.max_wall_ms:
            found.append(f"wall {result.virtual_wall_ms} ms > maxWallMs {self.max_wall_ms}")
        for name, limit in sorted(self.max_avg_time_to_admission_ms.items()):
            got = result.classes.get(name)
            if got is None:
                found.append(f"workload class {name} missing from the run")
            elif got.avg_time_to_admission_ms > limit:
                found.append(
                    f"class {name}: avg time to admission {got.avg_time_to_admission_ms} ms"
                    f" > {limit}"
                )
        for name, floor in sorted(self.min_usage_pct.items()):
            pct = result.cq_classes.get(name)
            if pct is None:
                found.append(f"ClusterQueue class {name} missing from the run")
            elif pct < floor:
                found.append(f"ClusterQueue class {name}: usage {pct:.1f}% < {floor}%")
        return found


def _read(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{path}: cannot read YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: expected a mapping at the top level")
    return data


def _get(obj: Mapping[str, Any], key: str, where: str, *, default: Any = ...) -> Any:
    if key in obj:
        return obj[key]
    if default is ...:
        raise ScenarioError(f"{where}.{key} is required")
    return default


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ScenarioError(f"{where} must be a non-negative integer, got {value!r}")
    return value


def _quantity(value: Any, where: str, resource: str = "cpu") -> int:
    try:
        return parse_quantity(value if isinstance(value, int) else str(value), resource=resource)
    except QuantityError as exc:
        raise ScenarioError(f"{where}: {exc}") from exc


def _policy(value: Any, where: str) -> PreemptionPolicy:
    try:
        return PreemptionPolicy(value or "Never")
    except ValueError:
        choices = ", ".join(p.value for p in PreemptionPolicy)
        raise ScenarioError(f"{where} must be one of {choices}, got {value!r}") from None


def _topology_request(spec: Mapping[str, Any], where: str) -> TopologyRequest | None:
    level = spec.get("tasLevel")
    if not level:
        return None
    constraint = spec.get("tasConstraint", "required")
    if constraint == "required":
        return TopologyRequest.required(level)
    if constraint == "preferred":
        return TopologyRequest.preferred(level)
    if constraint == "balanced":
        # As Kueue's generator encodes it: slices of sliceSize pods, each in one domain.
        size = spec.get("sliceSize")
        return TopologyRequest.unconstrained(
            slice_level=level, slice_size=_int(size, f"{where}.sliceSize") if size else None
        )
    raise ScenarioError(
        f"{where}.tasConstraint must be required, preferred or balanced, got {constraint!r}"
    )


def load_scenario(path: Path) -> Scenario:
    data = _read(path)
    cohorts = _get(data, "cohorts", "generator")
    if not isinstance(cohorts, list) or not cohorts:
        raise ScenarioError("generator.cohorts must be a non-empty list")
    flavor_block = data.get("resourceFlavor") or {}
    flavor_name = flavor_block.get("name", "rf")
    cohort_sets = []
    for ci, cohort in enumerate(cohorts):
        where = f"cohorts[{ci}]"
        queue_sets = []
        for qi, qs in enumerate(_get(cohort, "queuesSets", where)):
            qwhere = f"{where}.queuesSets[{qi}]"
            workload_sets = []
            for wi, ws in enumerate(_get(qs, "workloadsSets", qwhere)):
                wwhere = f"{qwhere}.workloadsSets[{wi}]"
                templates = []
                for ti, wl in enumerate(_get(ws, "workloads", wwhere)):
                    twhere = f"{wwhere}.workloads[{ti}]"
                    templates.append(
                        WorkloadTemplate(
                            class_name=str(_get(wl, "className", twhere)),
                            runtime_ms=_int(_get(wl, "runtimeMs", twhere), f"{twhere}.runtimeMs"),
                            priority=int(_get(wl, "priority", twhere, default=0)),
                            request=_quantity(_get(wl, "request", twhere), f"{twhere}.request"),
                            pod_count=_int(wl.get("podCount", 1), f"{twhere}.podCount") or 1,
                            topology=_topology_request(wl, twhere),
                        )
                    )
                workload_sets.append(
                    WorkloadSet(
                        count=_int(_get(ws, "count", wwhere), f"{wwhere}.count"),
                        interval_ms=_int(
                            _get(ws, "creationIntervalMs", wwhere), f"{wwhere}.creationIntervalMs"
                        ),
                        workloads=tuple(templates),
                    )
                )
            limit = qs.get("borrowingLimit")
            queue_sets.append(
                QueueSet(
                    class_name=str(_get(qs, "className", qwhere)),
                    count=_int(_get(qs, "count", qwhere), f"{qwhere}.count"),
                    nominal=_quantity(_get(qs, "nominalQuota", qwhere), f"{qwhere}.nominalQuota"),
                    borrowing_limit=None
                    if limit is None
                    else _quantity(limit, f"{qwhere}.borrowingLimit"),
                    reclaim_within_cohort=_policy(
                        qs.get("reclaimWithinCohort"), f"{qwhere}.reclaimWithinCohort"
                    ),
                    within_cluster_queue=_policy(
                        qs.get("withinClusterQueue"), f"{qwhere}.withinClusterQueue"
                    ),
                    workload_sets=tuple(workload_sets),
                )
            )
        cohort_sets.append(
            CohortSet(
                class_name=str(_get(cohort, "className", where)),
                count=_int(_get(cohort, "count", where), f"{where}.count"),
                queue_sets=tuple(queue_sets),
            )
        )
    topology = load_topology(data)
    flavor = ResourceFlavor(
        name=flavor_name,
        node_labels={topology.flavor_node_label: "tas"} if topology else {},
        topology_name=topology.name if topology else None,
    )
    return Scenario(name=path.parent.name, cohorts=tuple(cohort_sets), flavor=flavor)


def load_topology(data: Mapping[str, Any]) -> TopologySpec | None:
    block = data.get("topology")
    if not block:
        return None
    levels = []
    listed = _get(block, "levels", "topology")
    if not isinstance(listed, list) or len(listed) < 2:
        raise ScenarioError(
            "topology.levels must list at least 2 levels (the last one is the node, with its"
            " capacity), as Kueue's generator requires"
        )
    for li, level in enumerate(listed):
        where = f"topology.levels[{li}]"
        capacity = {
            res: _quantity(amount, f"{where}.capacity.{res}", res)
            for res, amount in (level.get("capacity") or {}).items()
        }
        levels.append(
            TopologyLevel(
                name=str(_get(level, "name", where)),
                count=_int(_get(level, "count", where), f"{where}.count"),
                node_label=str(_get(level, "nodeLabel", where)),
                capacity=capacity,
            )
        )
    flavor_block = data.get("resourceFlavor") or {}
    return TopologySpec(
        name=str(_get(block, "name", "topology")),
        levels=tuple(levels),
        flavor=str(flavor_block.get("name", "rf")),
        flavor_node_label=str(flavor_block.get("nodeLabel", "tas-node-group")),
    )


def load_topology_file(path: Path) -> TopologySpec | None:
    return load_topology(_read(path))


def load_rangespec(path: Path) -> RangeSpec:
    data = _read(path)
    cmd = data.get("cmd") or {}
    wall = cmd.get("maxWallMs")
    return RangeSpec(
        max_wall_ms=None if wall is None else _int(wall, "cmd.maxWallMs"),
        min_usage_pct={
            str(k): float(v) for k, v in (data.get("clusterQueueClassesMinUsage") or {}).items()
        },
        max_avg_time_to_admission_ms={
            str(k): _int(v, f"wlClassesMaxAvgTimeToAdmissionMs.{k}")
            for k, v in (data.get("wlClassesMaxAvgTimeToAdmissionMs") or {}).items()
        },
    )
