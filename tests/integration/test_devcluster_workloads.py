"""Plain Kubernetes workloads on the devcluster: a Job runs on KWOK nodes to completion, the
node topology is visible to kubectl, and RBAC denies an unprivileged service account."""

from __future__ import annotations

import collections
import datetime as dt
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

RACK_LABEL = "cloud.provider.com/topology-rack"


def _job(name: str, *, parallelism: int, run_seconds: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {
                "parallelism": parallelism,
                "completions": parallelism,
                "backoffLimit": 0,
                "template": {
                    "metadata": {"annotations": {"phalanx.dev/run-seconds": run_seconds}},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "train",
                                "image": "example.invalid/train:1",
                                "resources": {
                                    "requests": {"cpu": "4", "nvidia.com/gpu": "8"},
                                    "limits": {"nvidia.com/gpu": "8"},
                                },
                            }
                        ],
                    },
                },
            },
        }
    )


def _ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_devcluster_job_runs_on_kwok_nodes_to_completion(
    cluster: ClusterHandle, namespace: str
) -> None:
    cluster.kubectl_ok(
        "apply", "-n", namespace, "-f", "-", input=_job("train", parallelism=3, run_seconds="2")
    )
    cluster.kubectl_ok(
        "wait", "-n", namespace, "--for=condition=Complete", "job/train", "--timeout=90s"
    )
    job = json.loads(cluster.kubectl_ok("get", "-n", namespace, "job/train", "-o", "json"))
    assert job["status"]["succeeded"] == 3
    pods = json.loads(
        cluster.kubectl_ok("get", "pods", "-n", namespace, "-l", "job-name=train", "-o", "json")
    )["items"]
    assert len(pods) == 3
    kwok_nodes = set(
        cluster.kubectl_ok("get", "nodes", "-l", "type=kwok", "-o", "name")
        .replace("node/", "")
        .split()
    )
    for pod in pods:
        assert pod["status"]["phase"] == "Succeeded"
        assert pod["spec"]["nodeName"] in kwok_nodes
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["reason"] == "Completed" and terminated["exitCode"] == 0
        ran = (_ts(terminated["finishedAt"]) - _ts(pod["status"]["startTime"])).total_seconds()
        # run-seconds=2 was honoured (timestamps have 1 s resolution; the default is 5 s).
        assert 1 <= ran <= 4, f"pod ran {ran}s, expected about 2s"
    # Each pod asked for a whole 8-GPU node, so the scheduler spread them over 3 nodes.
    assert len({p["spec"]["nodeName"] for p in pods}) == 3


def test_devcluster_kubectl_lists_topology_labels(cluster: ClusterHandle) -> None:
    out = cluster.kubectl_ok(
        "get", "nodes", "-l", "phalanx.dev/devcluster-node=true", "-L", RACK_LABEL, "--no-headers"
    )
    rows = [line.split() for line in out.strip().splitlines()]
    assert len(rows) == 16
    assert all(row[1] == "Ready" for row in rows), out
    racks = collections.Counter(row[-1] for row in rows)
    assert racks == {"b0-r0": 4, "b0-r1": 4, "b1-r0": 4, "b1-r1": 4}
    node = json.loads(cluster.kubectl_ok("get", "node", "gpu-b1-r0-h2", "-o", "json"))
    assert node["metadata"]["labels"]["cloud.provider.com/topology-block"] == "b1"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "gpu-b1-r0-h2"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def _token_kubeconfig(cluster: ClusterHandle, token: str, path: Path) -> None:
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    admin["users"] = [{"name": "sa", "user": {"token": token}}]
    admin["contexts"][0]["context"]["user"] = "sa"
    path.write_text(yaml.safe_dump(admin))


def test_devcluster_rbac_denies_unprivileged_service_account(
    cluster: ClusterHandle, namespace: str, kube_api_client: Any
) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    cluster.kubectl_ok("create", "serviceaccount", "-n", namespace, "nobody")
    token = cluster.kubectl_ok("create", "token", "-n", namespace, "nobody").strip()
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "sa.yaml"
        _token_kubeconfig(cluster, token, kubeconfig)
        # The token authenticates (so a denial below is authorization, not authentication)...
        whoami = cluster.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig)
        assert whoami.returncode == 0, whoami.stderr
        username = json.loads(whoami.stdout)["status"]["userInfo"]["username"]
        assert username == f"system:serviceaccount:{namespace}:nobody"
        # ...and RBAC denies it listing nodes.
        denied = cluster.kubectl("get", "nodes", kubeconfig=kubeconfig)
        assert denied.returncode != 0
        assert "Forbidden" in denied.stderr and 'cannot list resource "nodes"' in denied.stderr
    # The same through the Python client: HTTP 403 for the service account, 200 for the admin.
    config = client.Configuration()
    config.host = cluster.server
    config.ssl_ca_cert = kube_api_client.configuration.ssl_ca_cert
    config.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(config) as sa_client, pytest.raises(ApiException) as excinfo:
        client.CoreV1Api(sa_client).list_node()
    assert excinfo.value.status == 403
    assert len(client.CoreV1Api(kube_api_client).list_node().items) >= 16
