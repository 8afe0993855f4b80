"""Shared fixtures of the API tests: the example manifests, and a builder for variants."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

MANIFESTS = Path(__file__).parent / "manifests"


def manifest_files() -> list[Path]:
    return sorted(MANIFESTS.glob("*.yaml"))


def load_raw(name: str, index: int = 0) -> dict[str, Any]:
    """A deep copy of document ``index`` of ``manifests/<name>.yaml``, as plain data."""
    docs = [d for d in yaml.safe_load_all((MANIFESTS / f"{name}.yaml").read_text()) if d]
    return copy.deepcopy(docs[index])


def minimal_cq(**spec: Any) -> dict[str, Any]:
    """A ClusterQueue with one group (cpu, nvidia.com/gpu) and one flavor, spec overridable."""
    body: dict[str, Any] = {
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "nvidia.com/gpu"],
                "flavors": [
                    {
                        "name": "h100",
                        "resources": [
                            {"name": "cpu", "nominalQuota": 8},
                            {"name": "nvidia.com/gpu", "nominalQuota": 8},
                        ],
                    }
                ],
            }
        ]
    }
    body.update(spec)
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "cq"},
        "spec": body,
    }


def minimal_workload(*pod_sets: dict[str, Any], **spec: Any) -> dict[str, Any]:
    sets = list(pod_sets) or [{"name": "main", "count": 2, "template": {"spec": {}}}]
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "wl", "namespace": "default"},
        "spec": {"podSets": sets, **spec},
    }


def group(resources: list[str], *flavors: str, **quota: Any) -> dict[str, Any]:
    """A resource group covering ``resources`` with the given flavors, each giving ``quota``
    (nominalQuota 1 unless overridden) for every resource."""
    return {
        "coveredResources": resources,
        "flavors": [
            {"name": f, "resources": [{"name": r, "nominalQuota": 1, **quota} for r in resources]}
            for f in flavors
        ],
    }
