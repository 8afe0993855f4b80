"""The integrations' RBAC, one component per kind with its own CRD: the chart renders each
component's ClusterRole and binding (the same objects as kustomize with the component) only
when ``managerConfig.integrations.frameworks`` names its framework, bound in the release's
namespace, and each grants no more than its integration sends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from install_tools import MANIFESTS, helm_template, kustomize


@dataclass(frozen=True)
class KindRbac:
    component: str
    framework: str
    rules: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return f"phalanx-{self.component}"

    @property
    def enabled(self) -> str:
        return f"managerConfig.integrations.frameworks={{batch/job,{self.framework}}}"


def _rule(group: str, resource: str, *verbs: str) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}


KINDS = [
    KindRbac(
        "jobset",
        "jobset.x-k8s.io/jobset",
        [
            _rule("jobset.x-k8s.io", "jobsets", "list", "watch", "patch"),
            _rule("jobset.x-k8s.io", "jobsets/finalizers", "update"),
        ],
    ),
    KindRbac(
        "pytorchjob",
        "kubeflow.org/pytorchjob",
        [
            _rule("kubeflow.org", "pytorchjobs", "list", "watch", "patch"),
            _rule("kubeflow.org", "pytorchjobs/finalizers", "update"),
        ],
    ),
    KindRbac(
        "ray",
        "ray.io/rayjob",
        [
            _rule("ray.io", "rayjobs", "list", "watch", "patch"),
            _rule("ray.io", "rayjobs/finalizers", "update"),
            # A RayJob's own RayCluster: an evicted RayJob's quota waits until it is gone.
            _rule("ray.io", "rayclusters", "list", "watch"),
        ],
    ),
    KindRbac(
        "raycluster",
        "ray.io/raycluster",
        [
            _rule("ray.io", "rayclusters", "list", "watch", "patch"),
            _rule("ray.io", "rayclusters/finalizers", "update"),
        ],
    ),
    KindRbac(
        "trainjob",
        "trainer.kubeflow.org/trainjob",
        [
            _rule("trainer.kubeflow.org", "trainjobs", "list", "watch", "patch"),
            _rule("trainer.kubeflow.org", "trainjobs/finalizers", "update"),
            # The JobSet the Trainer makes: the TrainJob's pod sets are read from it.
            _rule("jobset.x-k8s.io", "jobsets", "list", "watch"),
        ],
    ),
    KindRbac(
        "lws",
        "leaderworkerset.x-k8s.io/leaderworkerset",
        [
            # Admitted through its pods: never patched, only watched.
            _rule("leaderworkerset.x-k8s.io", "leaderworkersets", "list", "watch"),
            _rule("leaderworkerset.x-k8s.io", "leaderworkersets/finalizers", "update"),
            # A group scaled away: its Workload is deleted.
            _rule("kueue.x-k8s.io", "workloads", "delete"),
        ],
    ),
]
IDS = [k.component for k in KINDS]


def _rbac(objects: list[dict[str, Any]], name: str) -> dict[str, dict[str, Any]]:
    found = {}
    for obj in objects:
        if obj["metadata"]["name"] == name:
            obj["metadata"].pop("labels", None)
            found[obj["kind"]] = obj
    return found


def test_every_component_is_listed_here() -> None:
    # Catches a new kind's component shipped without this test's checks.
    rbac_components = {
        p.parent.name
        for p in (MANIFESTS / "components").glob("*/rbac.yaml")
        if p.parent.name != "store"
    }
    assert rbac_components == set(IDS)


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_the_chart_renders_the_component_only_with_the_framework_enabled(kind: KindRbac) -> None:
    assert _rbac(helm_template(), kind.name) == {}
    chart = _rbac(helm_template(kind.enabled), kind.name)
    assert set(chart) == {"ClusterRole", "ClusterRoleBinding"}
    assert chart == _rbac(kustomize(MANIFESTS / "default", components=(kind.component,)), kind.name)


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_the_binding_follows_the_release_namespace(kind: KindRbac) -> None:
    binding = _rbac(helm_template(kind.enabled, namespace="batch-system"), kind.name)
    assert binding["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "phalanx", "namespace": "batch-system"}
    ]


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_it_grants_what_the_integration_sends_and_nothing_more(kind: KindRbac) -> None:
    role = _rbac(helm_template(kind.enabled), kind.name)["ClusterRole"]
    assert role["rules"] == kind.rules
