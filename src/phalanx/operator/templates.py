"""Pod templates inside a kind's own object (JobSet, PyTorchJob, RayJob, RayCluster): the JSON
patch ops that give one its admission and that put it back as the Workload recorded it.

Pure: each kind says where its templates are (a JSON pointer) and guards the patch itself.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from phalanx.operator import jobs
from phalanx.operator.integration import FlavorInjection

__all__ = ["inject", "restore"]

_RESTORED = ("nodeSelector", "tolerations", "schedulingGates")


def inject(
    template: Mapping[str, Any],
    path: str,
    *,
    workload_name: str,
    injection: FlavorInjection,
    labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Ops giving the template at ``path`` its pod set's flavors (node selector, tolerations),
    the admission checks' labels and annotations, the pod set label, the Workload annotation
    and, with a topology assignment, the topology gate; ``labels`` are added too."""
    pod_spec = template.get("spec") or {}
    tmeta = template.get("metadata") or {}
    node_selector = {**(pod_spec.get("nodeSelector") or {}), **injection.node_labels}
    tolerations = list(pod_spec.get("tolerations") or [])
    for toleration in injection.tolerations:
        if toleration not in tolerations:
            tolerations.append(dict(toleration))
    all_labels = {
        **(tmeta.get("labels") or {}),
        **injection.labels,
        jobs.PODSET_LABEL: injection.pod_set,
        **(labels or {}),
    }
    annotations = {
        **(tmeta.get("annotations") or {}),
        **injection.annotations,
        jobs.WORKLOAD_ANNOTATION: workload_name,
    }
    gates = [
        g for g in pod_spec.get("schedulingGates") or [] if g.get("name") != jobs.TOPOLOGY_GATE
    ]
    if injection.topology_gated:
        gates.append({"name": jobs.TOPOLOGY_GATE})
    return [
        {
            "op": "add",
            "path": f"{path}/metadata",
            "value": {**tmeta, "labels": all_labels, "annotations": annotations},
        },
        {"op": "add", "path": f"{path}/spec/nodeSelector", "value": node_selector},
        {"op": "add", "path": f"{path}/spec/tolerations", "value": tolerations},
        {"op": "add", "path": f"{path}/spec/schedulingGates", "value": gates},
    ]


def restore(
    original: Mapping[str, Any], current: Mapping[str, Any], path: str
) -> list[dict[str, Any]]:
    """Ops putting back ``original``'s metadata, node selector, tolerations and scheduling
    gates at ``path``; a field the original did not have is removed (a custom resource keeps
    an empty one, so writing ``{}`` would leave the template different from what was
    submitted)."""
    ops: list[dict[str, Any]] = []
    if "metadata" in original:
        ops.append(
            {"op": "add", "path": f"{path}/metadata", "value": copy.deepcopy(original["metadata"])}
        )
    elif "metadata" in current:
        ops.append({"op": "remove", "path": f"{path}/metadata"})
    pod_spec = original.get("spec") or {}
    live_spec = current.get("spec") or {}
    for field in _RESTORED:
        if field in pod_spec:
            value = copy.deepcopy(pod_spec[field])
            ops.append({"op": "add", "path": f"{path}/spec/{field}", "value": value})
        elif field in live_spec:
            ops.append({"op": "remove", "path": f"{path}/spec/{field}"})
    return ops
