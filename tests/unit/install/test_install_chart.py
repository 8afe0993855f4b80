"""The Helm chart renders what the kustomize tree does for the same settings: the same objects
(kind, namespace, name) with the same contents, labels and Helm's bookkeeping aside. Builds
helm (and kubectl) into ~/.cache/phalanx on first use."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from install_tools import CHART, COMPONENTS, MANIFESTS, helm, helm_template, kustomize, run

Key = tuple[str, str, str]


def _normalised(objects: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Objects by (kind, namespace, name), without what differs by tool and not by meaning:
    labels, Helm's checksum annotation, the ConfigMap's YAML layout (compared parsed)."""
    result: dict[Key, dict[str, Any]] = {}
    for original in objects:
        obj = copy.deepcopy(original)
        metadata = obj["metadata"]
        metadata.pop("labels", None)
        if not metadata.get("annotations"):
            metadata.pop("annotations", None)
        template = (obj.get("spec") or {}).get("template", {}).get("metadata", {})
        (template.get("annotations") or {}).pop("checksum/config", None)
        if template.get("annotations") == {}:
            template.pop("annotations")
        if obj["kind"] == "ConfigMap":
            obj["data"] = {k: yaml.safe_load(v) for k, v in obj["data"].items()}
        key = (obj["kind"], metadata.get("namespace", ""), metadata["name"])
        assert key not in result, f"{key} twice"
        result[key] = obj
    return result


def _compare(chart: list[dict[str, Any]], kustomized: list[dict[str, Any]]) -> None:
    ours = _normalised(chart)
    theirs = _normalised([o for o in kustomized if o["kind"] != "Namespace"])
    assert sorted(ours) == sorted(theirs)
    for key, obj in theirs.items():
        assert ours[key] == obj, f"{key} differs between the chart and the kustomize tree"


def test_helm_lints_the_chart():
    run(helm(), "lint", CHART, "--strict")


def test_the_default_values_render_manifests_default():
    _compare(helm_template(), kustomize(MANIFESTS / "default"))


def test_every_switch_on_renders_manifests_default_with_every_component():
    chart = helm_template(
        "enablePrometheus=true", "enableNetworkPolicy=true", "enableCertManager=true"
    )
    _compare(chart, kustomize(MANIFESTS / "default", components=COMPONENTS))


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_switch_matches_its_component(component: str):
    switch = {
        "servicemonitor": "enablePrometheus",
        "networkpolicy": "enableNetworkPolicy",
        "cert-manager": "enableCertManager",
    }[component]
    _compare(
        helm_template(f"{switch}=true"),
        kustomize(MANIFESTS / "default", components=(component,)),
    )


def test_another_namespace_moves_everything_and_the_webhooks_skip_it():
    objects = helm_template("controllerManager.replicas=3", namespace="batch-system")
    for obj in objects:
        namespace = obj["metadata"].get("namespace")
        assert namespace in (None, "batch-system"), obj["metadata"]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 3
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--webhook-service=batch-system/phalanx-webhook" in args
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        configuration = next(o for o in objects if o["kind"] == kind)
        for webhook in configuration["webhooks"]:
            expression = webhook["namespaceSelector"]["matchExpressions"][0]
            assert expression["values"] == ["kube-system", "batch-system"]
            assert webhook["clientConfig"]["service"]["namespace"] == "batch-system"
    bindings = [o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert {s["namespace"] for b in bindings for s in b["subjects"]} == {"batch-system"}


def test_a_webhook_timeout_above_ten_seconds_is_refused():
    proc = run_failing(helm(), "template", "phalanx", CHART, "--set", "webhook.timeoutSeconds=30")
    assert "timeoutSeconds" in proc


def run_failing(*cmd: Any) -> str:
    import subprocess

    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    assert done.returncode != 0, done.stdout
    return done.stderr
