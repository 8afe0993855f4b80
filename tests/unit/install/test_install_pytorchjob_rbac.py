"""The PyTorchJob integration's RBAC: the chart renders the ``pytorchjob`` component's
ClusterRole and binding (the same objects as kustomize with the component) only when
``managerConfig.integrations.frameworks`` names ``kubeflow.org/pytorchjob``, bound in the
release's namespace, and they grant no more than the integration sends."""

from __future__ import annotations

from typing import Any

from install_tools import MANIFESTS, helm_template, kustomize

NAME = "phalanx-pytorchjob"
ENABLED = "managerConfig.integrations.frameworks={batch/job,kubeflow.org/pytorchjob}"


def _rbac(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {}
    for obj in objects:
        if obj["metadata"]["name"] == NAME:
            obj["metadata"].pop("labels", None)
            found[obj["kind"]] = obj
    return found


def test_the_chart_renders_the_component_only_with_the_framework_enabled() -> None:
    assert _rbac(helm_template()) == {}
    chart = _rbac(helm_template(ENABLED))
    assert set(chart) == {"ClusterRole", "ClusterRoleBinding"}
    assert chart == _rbac(kustomize(MANIFESTS / "default", components=("pytorchjob",)))


def test_the_binding_follows_the_release_namespace() -> None:
    binding = _rbac(helm_template(ENABLED, namespace="batch-system"))["ClusterRoleBinding"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "phalanx", "namespace": "batch-system"}
    ]


def test_it_grants_what_the_integration_sends_and_nothing_more() -> None:
    role = _rbac(helm_template(ENABLED))["ClusterRole"]
    assert role["rules"] == [
        {
            "apiGroups": ["kubeflow.org"],
            "resources": ["pytorchjobs"],
            "verbs": ["list", "watch", "patch"],
        },
        {
            "apiGroups": ["kubeflow.org"],
            "resources": ["pytorchjobs/finalizers"],
            "verbs": ["update"],
        },
    ]
