"""The local control plane's overlay applies as users apply Phalanx
(``kubectl apply --server-side -k manifests/overlays/devcluster``) and the API server accepts
every object: the CRDs are Established, the ServiceAccount's RBAC grants what it should and
refuses what it should not, the webhook configurations are valid and fail closed; and the full
default tree (Deployment, PDB, Services) passes the API server's validation (a server-side dry
run: the devcluster runs no images)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from phalanx.devcluster.handle import ClusterHandle
from phalanx.operator import configfile

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "manifests" / "overlays" / "devcluster"
CONFIGURATION = "phalanx.kueue.x-k8s.io"
WEBHOOK_KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
ACCOUNT = "system:serviceaccount:phalanx-system:phalanx"


def _get(cluster: ClusterHandle, *args: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl_ok("get", *args, "-o", "json")))


def _point_conversion_at_the_service(cluster: ClusterHandle) -> None:
    """A converted CRD that an operator of this machine last pointed at its loopback URL gets
    the generated Service form back, as a clean exit of that operator does; otherwise the apply
    would merge a url and a service into one client config, which the API server refuses."""
    for path in sorted((REPO / "crds").glob("*.yaml")):
        generated = yaml.safe_load(path.read_text())
        wanted = ((generated["spec"].get("conversion") or {}).get("webhook") or {}).get(
            "clientConfig"
        )
        name = generated["metadata"]["name"]
        live = cluster.kubectl("get", f"crd/{name}", "-o", "json")
        if not wanted or live.returncode != 0:
            continue
        current = json.loads(live.stdout)["spec"]["conversion"].get("webhook") or {}
        if "url" in (current.get("clientConfig") or {}):
            patch = [
                {"op": "replace", "path": "/spec/conversion/webhook/clientConfig", "value": wanted}
            ]
            cluster.kubectl_ok("patch", f"crd/{name}", "--type=json", "-p", json.dumps(patch))


def _can(cluster: ClusterHandle, *args: str) -> bool:
    proc = cluster.kubectl("auth", "can-i", *args, f"--as={ACCOUNT}")
    return proc.stdout.strip() == "yes"


@pytest.fixture
def applied_overlay(cluster: ClusterHandle):
    # The configurations are kopf's to keep; an operator of an earlier test module left them
    # with its loopback URL (or empty). Start from none, and leave none: pointing at a Service
    # nothing serves, failing closed, they would refuse later tests' queued Jobs.
    for kind in WEBHOOK_KINDS:
        cluster.kubectl_ok("delete", kind, CONFIGURATION, "--ignore-not-found")
    _point_conversion_at_the_service(cluster)
    try:
        yield cluster.kubectl_ok("apply", "--server-side", "-k", str(OVERLAY))
    finally:
        for kind in WEBHOOK_KINDS:
            cluster.kubectl_ok("delete", kind, CONFIGURATION, "--ignore-not-found")


def test_the_devcluster_overlay_is_accepted(
    cluster: ClusterHandle, applied_overlay: str, namespace: str
) -> None:
    rendered = [
        doc for doc in yaml.safe_load_all(cluster.kubectl_ok("kustomize", str(OVERLAY))) if doc
    ]
    kinds = {doc["kind"] for doc in rendered}
    assert "Deployment" not in kinds, "the devcluster runs no images"

    # Every object of the overlay exists now.
    for doc in rendered:
        name = doc["metadata"]["name"]
        where = ["-n", doc["metadata"]["namespace"]] if "namespace" in doc["metadata"] else []
        resource = f"{doc['kind'].lower()}.{doc['apiVersion'].split('/')[0]}"
        if "/" not in doc["apiVersion"]:
            resource = doc["kind"].lower()
        assert cluster.kubectl("get", resource, name, *where).returncode == 0, (resource, name)

    crds = [
        doc["metadata"]["name"] for doc in rendered if doc["kind"] == "CustomResourceDefinition"
    ]
    assert len(crds) == 9  # the Kueue kinds Phalanx serves
    cluster.kubectl_ok(
        "wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in crds]
    )

    # The ConfigMap is one the operator accepts.
    configmap = _get(cluster, "configmap", "phalanx-config", "-n", "phalanx-system")
    text = configmap["data"]["controller_manager_config.yaml"]
    assert configfile.parse(yaml.safe_load(text)).fair_sharing is not None

    # RBAC as the API server evaluates it for the ServiceAccount.
    assert _can(cluster, "create", "workloads.kueue.x-k8s.io", "-n", namespace)
    assert _can(cluster, "patch", "pods", "-n", namespace)
    assert _can(cluster, "update", "leases.coordination.k8s.io", "-n", "phalanx-system")
    assert not _can(cluster, "update", "leases.coordination.k8s.io", "-n", "kube-system")
    assert not _can(cluster, "get", "secrets", "-n", "phalanx-system")
    # Pods: delete is granted (the pod integration deletes an evicted group's pods; the
    # least-privilege test maps it); create and update are not.
    assert _can(cluster, "delete", "pods", "-n", namespace)
    assert not _can(cluster, "create", "pods", "-n", namespace)
    assert not _can(cluster, "update", "pods", "-n", namespace)
    for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
        assert _can(cluster, "patch", f"{kind}/{CONFIGURATION}")
        assert not _can(cluster, "patch", f"{kind}/someone-elses")
    assert _can(cluster, "patch", "customresourcedefinitions/workloads.kueue.x-k8s.io")
    assert not _can(cluster, "patch", "customresourcedefinitions/jobs.example.com")

    # The webhook configurations were admitted as shipped: fail closed, 10 s, system namespaces
    # excluded, through the Service.
    for kind in WEBHOOK_KINDS:
        webhooks = _get(cluster, kind, CONFIGURATION)["webhooks"]
        assert webhooks
        for webhook in webhooks:
            assert webhook["failurePolicy"] == "Fail"
            assert webhook["timeoutSeconds"] <= 10
            assert webhook["clientConfig"]["service"]["name"] == "phalanx-webhook"
            values = webhook["namespaceSelector"]["matchExpressions"][0]["values"]
            assert {"kube-system", "phalanx-system"} <= set(values)

    # ...and in force: with no operator serving, a queued Job is refused (fail closed), an
    # unqueued one is not.
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "queued", "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox"}],
                }
            }
        },
    }
    refused = cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(job)
    )
    assert refused.returncode != 0 and "phalanx-webhook" in refused.stderr, refused.stderr
    job["metadata"] = {"name": "plain"}
    cluster.kubectl_ok(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(job)
    )


def test_the_default_tree_passes_the_api_servers_validation(
    cluster: ClusterHandle, applied_overlay: str
) -> None:
    out = cluster.kubectl_ok(
        "apply", "--server-side", "--dry-run=server", "-k", str(REPO / "manifests" / "default")
    )
    for kind in ("deployment.apps/phalanx", "poddisruptionbudget.policy/phalanx"):
        assert f"{kind} serverside-applied (server dry run)" in out, out
    assert "service/phalanx-metrics serverside-applied" in out, out
