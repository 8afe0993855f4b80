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
        if obj["metadata"]["name"] == "phalanx-visibility-auth-reader":
            # read the API server's request-header settings, where they are (as Kueue)
            assert namespace == "kube-system"
            assert obj["subjects"][0]["namespace"] == "batch-system"
            continue
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


# -- metrics: one port, HTTPS, a scraper allowed to read them --------------------------------


def _metrics_wiring(objects: list[dict[str, Any]]) -> int:
    """Checks that every object naming the metrics port names the same one, served as HTTPS
    with token authentication, scraped so; returns the port."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    (deployment,) = by_kind["Deployment"]
    namespace = deployment["metadata"]["namespace"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    (flag,) = [a for a in args if a.startswith("--metrics-port=")]
    port = int(flag.split("=", 1)[1])
    assert not any(a.startswith("--metrics-secure") and a.endswith("false") for a in args)
    assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in container["ports"]
    service = next(s for s in by_kind["Service"] if s["metadata"]["name"] == "phalanx-metrics")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}
    ]
    for monitor in by_kind.get("ServiceMonitor", []):
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] == "metrics" and endpoint["scheme"] == "https"
        assert endpoint["bearerTokenFile"].endswith("/serviceaccount/token")
        tls = endpoint["tlsConfig"]
        # The metrics server serves the webhook certificate: its CA, its Service's name.
        assert tls["ca"]["secret"] == {"name": "phalanx-webhook-certs", "key": "ca.crt"}
        assert tls["serverName"] == f"phalanx-webhook.{namespace}.svc"
        for certificate in by_kind.get("Certificate", []):
            assert tls["serverName"] in certificate["spec"]["dnsNames"]
        (binding,) = [
            b
            for b in by_kind["ClusterRoleBinding"]
            if b["roleRef"]["name"] == "phalanx-metrics-reader"
        ]
        assert binding["roleRef"]["kind"] == "ClusterRole"
        assert [s["kind"] for s in binding["subjects"]] == ["ServiceAccount"]
    for policy in by_kind.get("NetworkPolicy", []):
        if policy["metadata"]["name"] == "phalanx-metrics":
            (rule,) = policy["spec"]["ingress"]
            assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
    return port


def test_metrics_are_https_on_one_port_in_the_tree_and_the_chart():
    everything = ("enablePrometheus=true", "enableNetworkPolicy=true", "enableCertManager=true")
    assert _metrics_wiring(kustomize(MANIFESTS / "default", components=COMPONENTS)) == 8443
    assert _metrics_wiring(helm_template(*everything)) == 8443
    moved = helm_template(*everything, "metrics.port=9443", namespace="batch-system")
    assert _metrics_wiring(moved) == 9443


def test_the_prometheus_service_account_and_tls_settings_are_values():
    objects = helm_template(
        "enablePrometheus=true",
        "metrics.prometheusNamespace=obs",
        "metrics.prometheusServiceAccount=kps-prometheus",
        "metrics.serviceMonitor.tlsConfig.insecureSkipVerify=true",
    )
    (binding,) = [
        o
        for o in objects
        if o["metadata"]["name"] == "phalanx-metrics-reader" and o["kind"] == "ClusterRoleBinding"
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kps-prometheus", "namespace": "obs"}
    ]
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["tlsConfig"] == {"insecureSkipVerify": True}


def test_the_operator_is_told_the_webhook_timeout_the_configurations_ship():
    for objects in (kustomize(MANIFESTS / "default"), helm_template("webhook.timeoutSeconds=5")):
        deployment = next(o for o in objects if o["kind"] == "Deployment")
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        (flag,) = [a for a in args if a.startswith("--webhook-timeout-seconds=")]
        timeouts = {
            w["timeoutSeconds"]
            for o in objects
            if o["kind"].endswith("WebhookConfiguration")
            for w in o["webhooks"]
        }
        assert timeouts == {int(flag.split("=", 1)[1])}


def test_the_store_secret_value_matches_the_store_component():
    """``store.existingSecret`` renders what manifests/components/store does: the URL of the
    usage history store from the Secret's ``url`` key instead of ``off``."""
    chart = helm_template("store.existingSecret=phalanx-store")
    _compare(chart, kustomize(MANIFESTS / "default", components=("store",)))
    (deployment,) = [o for o in chart if o["kind"] == "Deployment"]
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PHALANX_STORE"]["valueFrom"]["secretKeyRef"] == {
        "name": "phalanx-store",
        "key": "url",
    }
    (default,) = [o for o in helm_template() if o["kind"] == "Deployment"]
    env = {e["name"]: e for e in default["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PHALANX_STORE"] == {"name": "PHALANX_STORE", "value": "off"}
