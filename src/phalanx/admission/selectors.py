"""Whether a pod set may run on a flavor at all: taints, tolerations, node selectors.

Kueue only compares a pod's node selector and required node affinity against the label keys
the flavor itself declares in ``nodeLabels`` (other keys are the kube-scheduler's business),
and a flavor's ``NoSchedule``/``NoExecute`` taints must be tolerated by the pod's tolerations
plus the flavor's own tolerations.
"""

from __future__ import annotations

from collections.abc import Mapping

from phalanx.admission.model import PodSet, ResourceFlavor

__all__ = ["flavor_mismatch"]

_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def flavor_mismatch(flavor: ResourceFlavor, pod_set: PodSet, *, has_topology: bool) -> str | None:
    """None when ``pod_set`` may use ``flavor``; else the reason, one clause."""
    if pod_set.topology is not None and not has_topology:
        return f"flavor {flavor.name} does not support TopologyAwareScheduling"
    tolerations = pod_set.tolerations + flavor.tolerations
    for taint in flavor.node_taints:
        if taint.effect not in _BLOCKING_EFFECTS:
            continue
        if not any(t.tolerates(taint) for t in tolerations):
            value = f"={taint.value}" if taint.value else ""
            return f"untolerated taint {taint.key}{value}:{taint.effect} in flavor {flavor.name}"
    labels = flavor.node_labels
    for key, value in pod_set.node_selector.items():
        if key in labels and labels[key] != value:
            return f"flavor {flavor.name} doesn't match node selector {key}={value}"
    if pod_set.node_affinity and not _affinity_matches(pod_set, labels):
        return f"flavor {flavor.name} doesn't match node affinity"
    return None


def _affinity_matches(pod_set: PodSet, labels: Mapping[str, str]) -> bool:
    for term in pod_set.node_affinity:
        relevant = [req for req in term.match_expressions if req.key in labels]
        if not relevant:
            # A term with nothing about this flavor's keys matches any flavor; terms are ORed.
            return True
        if all(req.matches(labels) for req in relevant):
            return True
    return False
