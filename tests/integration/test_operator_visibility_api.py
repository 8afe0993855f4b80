"""Kueue's visibility API through the API server's aggregation layer, on the local control plane.

The operator serves ``visibility.kueue.x-k8s.io`` in ``v1beta2`` and Kueue's older ``v1beta1``
(``--visibility-port``) on the host's address; the two APIServices point at a selector-less
Service whose EndpointSlice names that address (the API server runs with
``--enable-aggregator-routing`` and refuses loopback addresses in EndpointSlices). Users are
ServiceAccounts calling with their own tokens, bound to the shipped Kueue-compatible
ClusterRoles (``manifests/base/visibility.yaml``), not cluster-admin. ``kubectl get --raw`` on
both endpoints gives positions, the same in both versions, and freeing the quota one workload
at a time admits them in exactly that order; a user without rights gets 403 in either version.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from incluster_support import host_address
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    PHALANX,
    REPO,
    OperatorProcess,
    apply,
    delete_cluster_objects,
    free_port,
    get_list,
    is_true,
    local_queue,
    start_operator,
    wait_for,
)

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

FLAVOR = "phx-vis"
SERVICE_NS = "phx-visibility"
VERSIONS = ("v1beta2", "v1beta1")
APISERVICES = [f"{version}.visibility.kueue.x-k8s.io" for version in VERSIONS]
BASE = "/apis/visibility.kueue.x-k8s.io/v1beta2"
BASE_V1BETA1 = "/apis/visibility.kueue.x-k8s.io/v1beta1"
ROLES = REPO / "manifests" / "base" / "visibility.yaml"


def _user_roles() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(ROLES.read_text()) if d and d["kind"] == "ClusterRole"]


@pytest.fixture(scope="module")
def visibility(
    cluster: ClusterHandle, kueue_crds: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The operator serving the API, and both APIServices routed to it (Available)."""
    address = host_address()
    port = free_port(address)
    op = start_operator(
        cluster,
        tmp_path_factory.mktemp("operator"),
        f"--visibility-port={port}",
        f"--visibility-listen={address}",
    )
    cluster.kubectl("create", "namespace", SERVICE_NS)
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "phalanx-visibility", "namespace": SERVICE_NS},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "phalanx-visibility-host",
                "namespace": SERVICE_NS,
                "labels": {"kubernetes.io/service-name": "phalanx-visibility"},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        },
        *(
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": f"{version}.visibility.kueue.x-k8s.io"},
                "spec": {
                    "group": "visibility.kueue.x-k8s.io",
                    "version": version,
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                    "insecureSkipTLSVerify": True,
                    "service": {
                        "name": "phalanx-visibility",
                        "namespace": SERVICE_NS,
                        "port": 443,
                    },
                },
            }
            for version in VERSIONS
        ),
        *_user_roles(),
    ]
    try:
        apply(cluster, *objects)
        for name in APISERVICES:
            wait_for(
                f"the APIService {name} Available",
                lambda name=name: is_true(
                    json.loads(cluster.kubectl_ok("get", "apiservice", name, "-o", "json")),
                    "Available",
                ),
                timeout=60,
                log=op.log_tail,
            )
        yield op
    finally:
        # The APIServices first: an unavailable aggregated API stalls namespace deletion.
        cluster.kubectl("delete", "apiservice", *APISERVICES, "--ignore-not-found")
        cluster.kubectl("delete", "namespace", SERVICE_NS, "--wait=false")
        op.stop()


def _kubeconfig_for(cluster: ClusterHandle, folder: Path, namespace: str, account: str) -> Path:
    """A kubeconfig holding only ``account``'s token: no client certificate of cluster-admin."""
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    token = cluster.kubectl_ok("create", "token", account, "-n", namespace).strip()
    path = folder / f"{namespace}-{account}.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": admin["clusters"][0]["cluster"]}],
                "users": [{"name": account, "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": account}}],
                "current-context": "c",
            }
        )
    )
    return path


def _raw(cluster: ClusterHandle, kubeconfig: Path, path: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("get", "--raw", path, kubeconfig=kubeconfig)


def _ok(cluster: ClusterHandle, kubeconfig: Path, path: str) -> dict[str, Any]:
    proc = _raw(cluster, kubeconfig, path)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def _list_positions(kubeconfig: Path, namespace: str, lq: str) -> dict[str, str]:
    """NAME -> POSITION IN QUEUE of ``phalanx list workload`` for the pending ones of ``lq``."""
    proc = subprocess.run(
        [str(PHALANX), "list", "workload", "-n", namespace, "-q", lq, "--status", "pending",
         "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
    print(proc.stdout)  # the user guide's example output
    lines = proc.stdout.splitlines()
    column = lines[0].index("POSITION IN QUEUE")
    return {line.split()[0]: line[column:].split()[0] for line in lines[1:]}


def _workload(name: str, lq: str, priority: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {
            "queueName": lq,
            "priority": priority,
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "c",
                                    "image": "example.invalid/x",
                                    "resources": {"requests": {"nvidia.com/gpu": "1"}},
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }


def _admitted(cluster: ClusterHandle, namespace: str) -> set[str]:
    return {
        w["metadata"]["name"]
        for w in get_list(cluster, "workloads.kueue.x-k8s.io", namespace)
        if is_true(w, "QuotaReserved")
    }


def test_positions_are_the_admission_order_and_rbac_is_enforced(
    cluster: ClusterHandle,
    visibility: OperatorProcess,
    namespace: str,
    tmp_path: Path,
) -> None:
    cq = f"{namespace}-cq"
    apply(
        cluster,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": FLAVOR},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": FLAVOR,
                                "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "1"}],
                            }
                        ],
                    }
                ],
            },
        },
    )
    try:
        _run_scenario(cluster, namespace, cq, tmp_path, visibility)
    finally:
        delete_cluster_objects(
            cluster, f"clusterqueue.kueue.x-k8s.io/{cq}", f"resourceflavor.kueue.x-k8s.io/{FLAVOR}"
        )


def _run_scenario(
    cluster: ClusterHandle, namespace: str, cq: str, tmp_path: Path, op: OperatorProcess
) -> None:
    log = op.log_tail
    apply(
        cluster,
        local_queue("lq-a", cluster_queue_name=cq),
        local_queue("lq-b", cluster_queue_name=cq),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "viewer"}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "stranger"}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "team-a"}},
        namespace=namespace,
    )
    # viewer: both ClusterRoles, cluster-wide; team-a: the LocalQueue role in the namespace
    apply(
        cluster,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{namespace}-viewer-cq"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "kueue-pending-workloads-cq-viewer-role",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": namespace}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "team-a-lq", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "kueue-pending-workloads-lq-viewer-role",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "team-a", "namespace": namespace},
                {"kind": "ServiceAccount", "name": "viewer", "namespace": namespace},
            ],
        },
        # team-a lists its namespace's Workloads and LocalQueues, as a batch user does.
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "team-a-reader", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": ["kueue.x-k8s.io"],
                    "resources": ["workloads", "localqueues"],
                    "verbs": ["get", "list"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "team-a-reader", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "team-a-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "team-a", "namespace": namespace}],
        },
    )
    try:
        viewer = _kubeconfig_for(cluster, tmp_path, namespace, "viewer")
        team_a = _kubeconfig_for(cluster, tmp_path, namespace, "team-a")
        stranger = _kubeconfig_for(cluster, tmp_path, namespace, "stranger")
        # One workload holds the single GPU; six wait, one of them with a higher priority.
        apply(cluster, _workload("run", "lq-a"), namespace=namespace)
        wait_for("run admitted", lambda: _admitted(cluster, namespace) == {"run"}, log=log)
        waiting = [
            ("w0", "lq-a", 0),
            ("w1", "lq-b", 0),
            ("w2", "lq-a", 0),
            ("w3", "lq-b", 0),
            ("w4", "lq-b", 10),
            ("w5", "lq-a", 0),
        ]
        for name, lq, priority in waiting:
            apply(cluster, _workload(name, lq, priority), namespace=namespace)
        cq_path = f"{BASE}/clusterqueues/{cq}/pendingworkloads"

        def all_pending() -> dict[str, Any] | None:
            body = _ok(cluster, viewer, cq_path)
            return body if len(body["items"]) == len(waiting) else None

        summary = wait_for("six pending workloads listed", all_pending, log=log)
        print(json.dumps(summary, indent=2))  # the user guide's example output
        assert summary["kind"] == "PendingWorkloadsSummary"
        order = [item["metadata"]["name"] for item in summary["items"]]
        assert order[0] == "w4"  # priority first
        assert [i["positionInClusterQueue"] for i in summary["items"]] == list(range(6))
        for item in summary["items"]:
            assert item["phalanxExplanation"]["reason"] == "WaitingForQuota"
            assert item["metadata"]["namespace"] == namespace
        # The LocalQueue views agree with the ClusterQueue's, each from position 0.
        for lq, account in (("lq-a", team_a), ("lq-b", viewer)):
            lq_path = f"{BASE}/namespaces/{namespace}/localqueues/{lq}/pendingworkloads"
            items = _ok(cluster, account, lq_path)["items"]
            mine = [i for i in summary["items"] if i["localQueueName"] == lq]
            assert [i["metadata"]["name"] for i in items] == [i["metadata"]["name"] for i in mine]
            assert [i["positionInLocalQueue"] for i in items] == list(range(len(mine)))
            assert [i["positionInClusterQueue"] for i in items] == [
                i["positionInClusterQueue"] for i in mine
            ]
            # `phalanx list workload` (the kubectl-phalanx plugin) shows the same positions.
            listed = _list_positions(team_a, namespace, lq)
            assert listed == {
                i["metadata"]["name"]: str(i["positionInLocalQueue"]) for i in items
            }, listed
        page = _ok(cluster, viewer, f"{cq_path}?limit=2&offset=1")
        assert [i["metadata"]["name"] for i in page["items"]] == order[1:3]

        # Kueue's v1beta1: the same items, positions and paging, in its own apiVersion.
        v1_cq = f"{BASE_V1BETA1}/clusterqueues/{cq}/pendingworkloads"
        old = _ok(cluster, viewer, v1_cq)
        assert old["apiVersion"] == "visibility.kueue.x-k8s.io/v1beta1"
        assert old["items"] == summary["items"]
        old_page = _ok(cluster, viewer, f"{v1_cq}?limit=2&offset=1")
        assert old_page["items"] == page["items"]
        for lq, account in (("lq-a", team_a), ("lq-b", viewer)):
            path = f"namespaces/{namespace}/localqueues/{lq}/pendingworkloads"
            old_lq = _ok(cluster, account, f"{BASE_V1BETA1}/{path}")
            assert old_lq["apiVersion"] == "visibility.kueue.x-k8s.io/v1beta1"
            assert old_lq["items"] == _ok(cluster, account, f"{BASE}/{path}")["items"]

        # 403: no rights at all; the LocalQueue role in the namespace is not the ClusterQueue's.
        for base in (BASE, BASE_V1BETA1):
            lq_a = f"{base}/namespaces/{namespace}/localqueues/lq-a/pendingworkloads"
            cq_any = f"{base}/clusterqueues/{cq}/pendingworkloads"
            for account, path in ((stranger, lq_a), (stranger, cq_any), (team_a, cq_any)):
                proc = _raw(cluster, account, path)
                assert proc.returncode != 0 and "Forbidden" in proc.stderr, proc.stderr

        sample = f'phalanx_pending_workloads{{cluster_queue="{cq}",reason="WaitingForQuota"}} 6.0'
        wait_for("the pending-by-reason gauge", lambda: sample in op.metrics(), timeout=20, log=log)

        # Free the GPU one workload at a time: each is admitted in the order of its position.
        running = "run"
        for position, expected in enumerate(order):
            head = _ok(cluster, viewer, cq_path)["items"][0]
            assert head["metadata"]["name"] == expected
            assert head["positionInClusterQueue"] == 0
            cluster.kubectl_ok("delete", "workload", running, "-n", namespace)
            wait_for(
                f"position {position} ({expected}) admitted",
                lambda expected=expected: _admitted(cluster, namespace) == {expected},
                log=log,
            )
            running = expected
        assert _ok(cluster, viewer, cq_path)["items"] == []
    finally:
        cluster.kubectl("delete", "clusterrolebinding", f"{namespace}-viewer-cq")
