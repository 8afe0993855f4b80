"""The shipped manifests parse, run a leader-elected pair of replicas, grant the operator what
it uses and no more where that is easy to check (the Lease verbs the elector really sends,
webhook-configuration writes limited to the one configuration kopf manages), and ship the
webhook configurations the operator registers, fail closed. How the kustomize tree and the
Helm chart render is tests/unit/install/."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from phalanx.operator.config import WebhookConfig
from phalanx.operator.kube import ApiError, KubeApi
from phalanx.operator.leader import LeaderElectionConfig, LeaderElector

REPO = Path(__file__).resolve().parents[3]
MANIFESTS = REPO / "manifests"
# What manifests/default applies, less the CRDs: its two bases' object files.
OPERATOR_DIRS = (MANIFESTS / "base", MANIFESTS / "controller")
WEBHOOK_CONFIGURATIONS = {"mutatingwebhookconfigurations", "validatingwebhookconfigurations"}
HTTP_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _operator_objects() -> list[dict[str, Any]]:
    return [
        doc
        for folder in OPERATOR_DIRS
        for path in sorted(folder.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in _documents(path)
    ]


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        o
        for o in _operator_objects()
        if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''} in manifests/, got {found}"
    return found[0]


def _deployments() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(MANIFESTS.rglob("*.yaml"))
        for doc in _documents(path)
        if doc.get("kind") == "Deployment"
    ]


def _rules(kind: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (o["metadata"].get("namespace", ""), rule)
        for o in _operator_objects()
        if o["kind"] == kind
        for rule in o.get("rules") or ()
    ]


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return cast(dict[str, Any], containers[0])


def _arg(container: dict[str, Any], flag: str) -> str | None:
    for arg in container.get("args") or ():
        if arg == flag:
            return ""
        if arg.startswith(flag + "="):
            return str(arg.split("=", 1)[1])
    return None


def _downward(container: dict[str, Any], variable: str) -> str | None:
    for entry in container.get("env") or ():
        if entry["name"] == variable:
            return str(entry["valueFrom"]["fieldRef"]["fieldPath"])
    return None


# -- every manifest -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", sorted(MANIFESTS.rglob("*.yaml")), ids=lambda p: str(p.relative_to(MANIFESTS))
)
def test_every_manifest_is_valid_yaml_with_kind_and_api_version(path: Path):
    documents = _documents(path)
    assert documents, f"{path} holds no document"
    for doc in documents:
        assert isinstance(doc, dict) and doc.get("kind") and doc.get("apiVersion"), doc


# -- leader election in every shipped Deployment --------------------------------------------------


def test_every_deployment_runs_two_leader_elected_replicas():
    deployments = _deployments()
    assert deployments, "manifests/ ships no Deployment"
    for deployment in deployments:
        name = deployment["metadata"]["name"]
        assert deployment["spec"].get("replicas", 1) >= 2, f"{name}: fewer than 2 replicas"
        container = _container(deployment)
        assert _arg(container, "--leader-elect") == "", f"{name}: no --leader-elect"
        assert _arg(container, "--no-leader-elect") is None, f"{name}: leader election off"


def test_the_lease_namespace_and_identity_come_from_the_downward_api():
    container = _container(_one("Deployment", "phalanx"))
    assert _arg(container, "--leader-elect-namespace") == "$(POD_NAMESPACE)"
    assert _downward(container, "POD_NAMESPACE") == "metadata.namespace"
    # The pod name is unique among live pods, and a pod runs one operator process.
    assert _arg(container, "--leader-elect-identity") == "$(POD_NAME)"
    assert _downward(container, "POD_NAME") == "metadata.name"


def test_a_rolling_update_keeps_a_webhook_server_up():
    deployment = _one("Deployment", "phalanx")
    strategy = deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0
    budget = _one("PodDisruptionBudget", "phalanx")
    assert budget["spec"]["minAvailable"] >= 1
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()


# -- RBAC -----------------------------------------------------------------------------------------


def _lease_verbs_the_elector_sends() -> set[str]:
    """Run a real LeaderElector through create, renew and release against a recording fake,
    and translate the HTTP methods it sent into RBAC verbs (plus list/watch for its watch)."""
    sent: list[tuple[str, str]] = []
    lease: dict[str, Any] = {}

    class RecordingApi:
        async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
            sent.append((method, path))
            body = kwargs.get("body")
            if method == "GET":
                if not lease:
                    raise ApiError(404, {"reason": "NotFound"}, method=method, path=path)
                return dict(lease)
            if method in ("POST", "PUT"):
                version = int(lease.get("metadata", {}).get("resourceVersion", "0")) + 1
                lease.clear()
                lease.update(body, metadata={**body["metadata"], "resourceVersion": str(version)})
                return dict(lease)
            raise AssertionError(f"the test's fake does not know {method} {path}")

    config = LeaderElectionConfig(
        lease_name="phalanx-scheduler",
        namespace="phalanx-system",
        identity="pod-a",
        lease_duration=1.0,
        renew_deadline=0.3,
        retry_period=0.05,
        watch=False,  # the watch is an Informer: list + watch, added below
    )

    async def campaign() -> None:
        elector = LeaderElector(cast(KubeApi, RecordingApi()), config)
        elector.start()
        await asyncio.wait_for(elector.is_leader.wait(), timeout=5)
        await asyncio.sleep(0.2)  # a few renewals
        await elector.stop()  # releases the Lease

    asyncio.run(campaign())
    assert all("/leases" in path for _, path in sent), sent
    verbs = {HTTP_VERBS[method] for method, _ in sent}
    assert {"create", "update"} <= verbs, sent  # the fake saw a creation and a renewal
    if LeaderElectionConfig.watch:  # the default: candidates watch the Lease
        verbs |= {"list", "watch"}
    return verbs


def test_the_role_grants_the_lease_verbs_the_elector_uses_in_the_operator_namespace():
    needed = _lease_verbs_the_elector_sends()
    assert {"get", "create", "update"} <= needed
    deployment = _one("Deployment", "phalanx")
    namespace = deployment["metadata"]["namespace"]
    granted = {
        verb
        for rule_namespace, rule in _rules("Role")
        if rule_namespace == namespace
        and "coordination.k8s.io" in rule.get("apiGroups", ())
        and "leases" in rule.get("resources", ())
        and not rule.get("resourceNames")
        for verb in rule["verbs"]
    }
    assert needed <= granted, f"Role in {namespace} lacks {needed - granted} on leases"
    # Leases only in the operator's namespace, never cluster-wide.
    for _, rule in _rules("ClusterRole"):
        assert "leases" not in rule.get("resources", ()), rule
    # The Role is bound to the Deployment's ServiceAccount, in that namespace.
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    binding = _one("RoleBinding", "phalanx-leader-election")
    role = _one("Role")
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"] == namespace
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert {"kind": "ServiceAccount", "name": account, "namespace": namespace} in binding[
        "subjects"
    ]


def _pod_calls_of_the_pod_controller() -> list[tuple[str, str]]:
    """Run the pod controller's reads and writes (finish a group and a single Pod that left
    the informer, start a gated pod, stop an evicted group) against a recording fake."""
    from phalanx.operator import integration, pods
    from phalanx.operator.podsync import PodGroupController
    from phalanx.operator.state import ClusterState
    from phalanx.operator.writer import WriteOutcome

    sent: list[tuple[str, str]] = []

    class RecordingApi:
        get = KubeApi.get
        patch = KubeApi.patch
        delete = KubeApi.delete
        list_all = KubeApi.list_all

        async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
            sent.append((method, path))
            if method == "GET":
                return {"items": [], "metadata": {}}
            return {"metadata": {"name": path.rsplit("/", 1)[-1], "namespace": "ns"}}

    class Writer:
        async def apply_status(self, key: str, build: Any, *, verb: str) -> WriteOutcome:
            return WriteOutcome(ok=True)

    def pod(name: str, group: str | None) -> dict[str, Any]:
        labels = {"kueue.x-k8s.io/queue-name": "lq"}
        annotations = {}
        if group:
            labels[pods.GROUP_NAME_LABEL] = group
            annotations[pods.GROUP_TOTAL_COUNT_ANNOTATION] = "1"
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "labels": labels},
            "spec": {"containers": [{"name": "c"}]},
        }
        body["metadata"]["annotations"] = annotations
        defaults = pods.admission_defaults(body)
        body["metadata"].update(labels=defaults["labels"], annotations=defaults["annotations"])
        body["spec"]["schedulingGates"] = defaults["schedulingGates"]
        return body

    controller = PodGroupController(
        cast(KubeApi, RecordingApi()),
        ClusterState(),
        cast(Any, Writer()),
        cast(Any, type("M", (), {"api_write": lambda *a, **k: None})()),
    )
    injection = integration.FlavorInjection(
        pod_set="main", count=1, node_labels={}, tolerations=[], topology_gated=False
    )
    running = {**pod("r", "g"), "spec": {"containers": [{"name": "c"}]}}

    async def run() -> None:
        await controller._maybe_finish(pods.Group("ns", "g", is_group=True), "ns/g", 1)
        await controller._maybe_finish(pods.Group("ns", "solo", is_group=False), "ns/s", 1)
        await controller._start_pod(pod("p", "g"), "g", injection)
        await controller._stop("ns/g", [running])

    asyncio.run(run())
    return sent


def test_the_role_grants_the_pod_verbs_the_pod_controller_uses():
    sent = _pod_calls_of_the_pod_controller()
    assert all("/pods" in path for _, path in sent), sent
    # A GET of a named pod is a get; of the collection, a list.
    needed = {("list" if path.endswith("/pods") else HTTP_VERBS[method]) for method, path in sent}
    assert {"list", "patch", "delete"} <= needed, sent
    granted = {
        verb
        for _, rule in _rules("ClusterRole")
        if "" in rule.get("apiGroups", ()) and "pods" in rule.get("resources", ())
        for verb in rule["verbs"]
    }
    assert needed <= granted, f"the ClusterRole lacks {needed - granted} on pods: {sent}"


def test_webhook_configuration_writes_are_limited_to_the_operators_own():
    own = WebhookConfig().configuration_name
    rules = [
        rule
        for kind in ("ClusterRole", "Role")
        for _, rule in _rules(kind)
        if "admissionregistration.k8s.io" in rule.get("apiGroups", ())
        and WEBHOOK_CONFIGURATIONS & set(rule.get("resources", ()))
    ]
    assert rules, "no rule lets kopf manage the webhook configurations"
    for rule in rules:
        verbs = set(rule["verbs"])
        if rule.get("resourceNames"):
            assert rule["resourceNames"] == [own], rule
        else:
            # RBAC cannot restrict create by name; nothing else may go unrestricted (patch,
            # update or delete could rewrite or remove another product's webhooks).
            assert verbs <= {"create"}, rule
    granted = {verb for rule in rules for verb in rule["verbs"]}
    assert {"create", "patch"} <= granted  # what kopf's configuration manager sends


def test_no_rule_uses_wildcards():
    for kind in ("ClusterRole", "Role"):
        for _, rule in _rules(kind):
            for key in ("apiGroups", "resources", "nonResourceURLs", "verbs"):
                assert "*" not in rule.get(key, ()), (kind, rule)


# -- the Deployment's pods ------------------------------------------------------------------------


def test_the_pods_run_locked_down_with_probes_on_the_health_endpoint():
    deployment = _one("Deployment", "phalanx")
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
    assert {"cpu", "memory"} <= container["resources"]["limits"].keys()
    health = _arg(container, "--health-probe-port")
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert health and ports["health"] == int(health)
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_the_deployment_reads_the_phalanx_config_configmap():
    deployment = _one("Deployment", "phalanx")
    container = _container(deployment)
    config = _arg(container, "--config")
    assert config
    mount = next(m for m in container["volumeMounts"] if config.startswith(m["mountPath"] + "/"))
    volume = next(
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    )
    configmap = _one("ConfigMap", volume["configMap"]["name"])
    assert configmap["metadata"]["name"] == "phalanx-config"
    assert config.rsplit("/", 1)[1] in configmap["data"]


def test_metrics_have_a_service_of_their_own():
    webhook = _one("Service", "phalanx-webhook")
    metrics = _one("Service", "phalanx-metrics")
    assert [p["name"] for p in webhook["spec"]["ports"]] == ["webhook"]
    assert [p["name"] for p in metrics["spec"]["ports"]] == ["metrics"]


# -- webhook configurations -----------------------------------------------------------------------


def _operator_args(env: dict[str, str]) -> tuple[Any, Any]:
    """The Deployment's container args parsed by ``phalanx operator``'s own parser
    (``$(VAR)`` expanded from ``env`` as the kubelet does), and its ``--config`` file read
    from the phalanx-config ConfigMap it mounts."""
    import argparse
    import re

    from phalanx.cli import operator_cmd
    from phalanx.operator import configfile

    container = _one("Deployment", "phalanx")["spec"]["template"]["spec"]["containers"][0]
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
    parser = argparse.ArgumentParser()
    operator_cmd.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    text = _one("ConfigMap", "phalanx-config")["data"][args.config.name]
    return args, configfile.parse(yaml.safe_load(text))


def _built(
    registry: Any, *, client_config: dict[str, Any], name: str
) -> dict[str, list[dict[str, Any]]]:
    """What kopf writes into the two configurations for a registry's handlers, with the
    policy installed for ``name``: built by the function kopf's configuration manager calls."""
    from kopf._cogs.structs import references
    from kopf._core.engines import admission
    from kopf._core.intents.causes import WebhookType

    from phalanx.operator.webhooks import KUEUE_KINDS

    resources = [
        references.Resource("batch", "v1", "jobs", kind="Job", namespaced=True),
        *(
            references.Resource("kueue.x-k8s.io", "v1beta2", plural, kind=kind, namespaced=True)
            for plural, kind in KUEUE_KINDS
        ),
    ]
    built: dict[str, list[dict[str, Any]]] = {}
    for reason, kind in (
        (WebhookType.MUTATING, "MutatingWebhookConfiguration"),
        (WebhookType.VALIDATING, "ValidatingWebhookConfiguration"),
    ):
        handlers = [h for h in registry._webhooks.get_all_handlers() if h.reason == reason]
        built[kind] = admission.build_webhooks(
            handlers, resources=resources, name_suffix=name, client_config=client_config
        )
    return built


def _registered_webhooks() -> dict[str, list[dict[str, Any]]]:
    """What the operator of manifests/controller keeps in the two configurations, behind the
    manifests' Service: its registry, and the settings ``phalanx operator`` derives from the
    Deployment's args and the phalanx-config ConfigMap, installed as the operator installs
    them (app.build_settings) into kopf's builder."""
    import kopf

    from phalanx.cli import operator_cmd
    from phalanx.operator.app import build_settings
    from phalanx.operator.config import OperatorConfig
    from phalanx.operator.webhooks import register_webhooks

    args, settings = _operator_args({"POD_NAMESPACE": "phalanx-system", "POD_NAME": "p"})
    webhook = WebhookConfig(
        listen_addr=args.webhook_listen,
        port=args.webhook_port,
        service=args.webhook_service,
        cert_dir=Path("/nonexistent"),
        timeout_seconds=args.webhook_timeout_seconds,
        namespace_selector=operator_cmd.webhook_namespace_selector(args, settings),
    )
    _install_policy(build_settings, OperatorConfig(webhook=webhook))
    registry = kopf.OperatorRegistry()
    register_webhooks(registry, validator=lambda obj: [], persistent=True)
    namespace, _, name = args.webhook_service.partition("/")
    service = {"service": {"name": name, "namespace": namespace, "port": 443}}
    return _built(registry, client_config=service, name=webhook.configuration_name)


def _install_policy(build_settings: Any, config: Any) -> None:
    """``build_settings`` installs the policy before it makes the webhook server (which
    needs certificates this test has not): stop it there."""
    from unittest import mock

    with mock.patch("phalanx.operator.app.webhook_server", side_effect=_Stop), pytest.raises(_Stop):
        build_settings(config)


class _Stop(Exception):
    pass


def _essentials(webhook: dict[str, Any]) -> dict[str, Any]:
    rules = [
        {key: sorted(rule[key]) for key in ("apiGroups", "apiVersions", "resources", "operations")}
        for rule in webhook["rules"]
    ]
    return {
        "name": webhook["name"],
        "clientConfig": webhook["clientConfig"],
        "rules": rules,
        "objectSelector": webhook.get("objectSelector"),
        "sideEffects": webhook["sideEffects"],
        "failurePolicy": webhook["failurePolicy"],
        "timeoutSeconds": webhook["timeoutSeconds"],
        "namespaceSelector": webhook["namespaceSelector"],
        "matchPolicy": webhook["matchPolicy"],
        "admissionReviewVersions": webhook["admissionReviewVersions"],
    }


@pytest.mark.parametrize("kind", ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"])
def test_the_shipped_webhook_configurations_are_the_operators_own(kind: str):
    """A running operator rewrites the configurations whenever its client config changes: what
    it writes must be what the manifests ship, or re-applying them would be undone."""
    shipped = _one(kind, WebhookConfig().configuration_name)["webhooks"]
    registered = _registered_webhooks()[kind]
    assert sorted((_essentials(w) for w in shipped), key=lambda w: w["name"]) == sorted(
        (_essentials(w) for w in registered), key=lambda w: w["name"]
    )


@pytest.mark.parametrize("kind", ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"])
def test_every_shipped_webhook_fails_closed_quickly_outside_system_namespaces(kind: str):
    namespace = _one("Deployment", "phalanx")["metadata"]["namespace"]
    for webhook in _one(kind, WebhookConfig().configuration_name)["webhooks"]:
        assert webhook["failurePolicy"] == "Fail", webhook["name"]
        assert 1 <= webhook["timeoutSeconds"] <= 10, webhook["name"]
        assert webhook["namespaceSelector"] == {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system", namespace],
                }
            ]
        }, webhook["name"]
