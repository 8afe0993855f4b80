"""``phalanx explain`` and ``phalanx what-if`` against the operator's live core, through the API
server's aggregation layer, as a namespaced ServiceAccount user (not cluster-admin).

The operator serves ``visibility.phalanx.kueue.x-k8s.io/v1alpha1`` on the host's address beside
Kueue's visibility API (routed as in test_operator_visibility_api.py). Users hold only the
shipped ClusterRoles (``manifests/base/visibility.yaml``) in their namespace, and may read Jobs.

* Borrowing: a ClusterQueue whose quota another one borrows explains its waiting Job by naming
  the borrower and the GPUs it borrows; after ``reclaimWithinCohort: Any``, what-if on a Job
  names its victims, and the Job created afterwards preempts exactly those.
* Topology: a gang no rack can hold is explained with the best rack's free room.
* A user without the roles gets 403 (the CLI says which ClusterRole to ask for).
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
    cluster_queue,
    condition,
    delete_cluster_objects,
    flavor,
    free_port,
    gpu_job,
    is_true,
    local_queue,
    node_pool,
    start_operator,
    topology,
    wait_for,
    workload_of,
)

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

SERVICE_NS = "phx-explain"
APISERVICES = {
    "v1beta2.visibility.kueue.x-k8s.io": ("visibility.kueue.x-k8s.io", "v1beta2"),
    "v1alpha1.visibility.phalanx.kueue.x-k8s.io": ("visibility.phalanx.kueue.x-k8s.io", "v1alpha1"),
}
ROLES = REPO / "manifests" / "base" / "visibility.yaml"
POOL = "phx-exp"
TAS_POOL = "phx-expt"


@pytest.fixture(scope="module")
def served(
    cluster: ClusterHandle, kueue_crds: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The operator serving both groups, their APIServices Available, the users' roles."""
    address = host_address()
    port = free_port(address)
    op = start_operator(
        cluster,
        tmp_path_factory.mktemp("operator"),
        f"--visibility-port={port}",
        f"--visibility-listen={address}",
    )
    cluster.kubectl("create", "namespace", SERVICE_NS)
    roles = [d for d in yaml.safe_load_all(ROLES.read_text()) if d and d["kind"] == "ClusterRole"]
    services = [
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": name},
            "spec": {
                "group": group,
                "version": version,
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
                "insecureSkipTLSVerify": True,
                "service": {"name": "phalanx-visibility", "namespace": SERVICE_NS, "port": 443},
            },
        }
        for name, (group, version) in APISERVICES.items()
    ]
    try:
        apply(
            cluster,
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
            *services,
            *roles,
        )
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
        for name in APISERVICES:
            cluster.kubectl("delete", "apiservice", name, "--ignore-not-found")
        cluster.kubectl("delete", "namespace", SERVICE_NS, "--wait=false")
        op.stop()


def _users(cluster: ClusterHandle, namespace: str, folder: Path) -> tuple[Path, Path]:
    """(dev, stranger) kubeconfigs: dev has the explain and what-if roles and reads Jobs in
    ``namespace``; stranger has nothing."""
    apply(
        cluster,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "dev"}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "stranger"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "job-reader"},
            "rules": [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]}],
        },
        *(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": f"dev-{role}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": "dev", "namespace": namespace}],
            }
            for kind, role in (
                ("ClusterRole", "phalanx-workload-explanation-viewer-role"),
                ("ClusterRole", "phalanx-whatif-creator-role"),
                ("Role", "job-reader"),
            )
        ),
        namespace=namespace,
    )
    return (
        _kubeconfig_for(cluster, folder, namespace, "dev"),
        _kubeconfig_for(cluster, folder, namespace, "stranger"),
    )


def _kubeconfig_for(cluster: ClusterHandle, folder: Path, namespace: str, account: str) -> Path:
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
                "contexts": [
                    {
                        "name": "c",
                        "context": {"cluster": "c", "user": account, "namespace": namespace},
                    }
                ],
                "current-context": "c",
            }
        )
    )
    return path


def _phalanx(
    kubeconfig: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(PHALANX), *args, "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False, input=stdin,
    )  # fmt: skip
    print(f"$ kubectl phalanx {' '.join(args)}\n{proc.stdout}{proc.stderr}")  # the user guide's
    return proc


def _json(kubeconfig: Path, *args: str, stdin: str | None = None) -> dict[str, Any]:
    proc = _phalanx(kubeconfig, *args, "-o", "json", stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def _admitted(cluster: ClusterHandle, namespace: str, job: str) -> bool:
    wl = workload_of(cluster, namespace, job)
    return bool(wl and is_true(wl, "Admitted"))


def _pending_tried(cluster: ClusterHandle, namespace: str, job: str) -> bool:
    wl = workload_of(cluster, namespace, job)
    reserved = condition(wl, "QuotaReserved") if wl else None
    return bool(reserved and reserved.get("status") == "False")


def test_explain_names_the_borrower_and_what_if_predicts_the_victims(
    cluster: ClusterHandle, served: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    log = served.log_tail
    lender, borrower = f"{namespace}-a", f"{namespace}-b"
    with node_pool(cluster, POOL, racks=1, hosts=6):
        apply(
            cluster,
            flavor(POOL, pool=POOL),
            cluster_queue(lender, flavor_name=POOL, gpus=16, cohort=namespace),
            cluster_queue(borrower, flavor_name=POOL, gpus=16, cohort=namespace),
        )
        try:
            apply(
                cluster,
                local_queue("lq-a", cluster_queue_name=lender),
                local_queue("lq-b", cluster_queue_name=borrower),
                namespace=namespace,
            )
            dev, stranger = _users(cluster, namespace, tmp_path)
            b_jobs = [f"b{i}" for i in range(4)]
            for name in b_jobs:
                apply(cluster, gpu_job(name, queue="lq-b"), namespace=namespace)
            wait_for(
                "the borrower's four Jobs admitted (16 GPUs borrowed)",
                lambda: all(_admitted(cluster, namespace, j) for j in b_jobs),
                log=log,
            )
            # The lender may not reclaim (reclaimWithinCohort: Never): its Job waits.
            apply(cluster, gpu_job("a0", queue="lq-a", pods=2), namespace=namespace)
            wait_for("a0 tried", lambda: _pending_tried(cluster, namespace, "a0"), log=log)
            body = _json(dev, "explain", "job/a0", "-n", namespace)
            status = body["status"]
            assert status["pending"] is True and status["reason"] == "WaitingForQuota"
            assert status["borrowers"] == [
                {
                    "clusterQueue": borrower,
                    "flavor": POOL,
                    "resource": "nvidia.com/gpu",
                    "borrowed": "16",
                }
            ]
            assert f"ClusterQueue/{borrower} (borrowing)" in status["blocking"]
            text = _phalanx(dev, "explain", "job/a0", "-n", namespace).stdout
            assert f"ClusterQueue {borrower} borrows 16 nvidia.com/gpu in flavor {POOL}" in text
            assert "reclaimWithinCohort: Never" in text

            # No rights: 403 on both, and the CLI names the role to ask for.
            a0 = workload_of(cluster, namespace, "a0")
            assert a0 is not None
            denied = _phalanx(stranger, "explain", a0["metadata"]["name"], "-n", namespace)
            assert denied.returncode == 1, denied.stderr
            assert "phalanx-workload-explanation-viewer-role" in denied.stderr
            job_file = tmp_path / "a1.yaml"
            job_file.write_text(yaml.safe_dump(gpu_job("a1", queue="lq-a", pods=2)))
            denied = _phalanx(stranger, "what-if", "-f", str(job_file), "-n", namespace)
            assert denied.returncode == 1 and "phalanx-whatif-creator-role" in denied.stderr

            # Let the lender reclaim; a0 goes, a1 is asked about first, then created.
            cluster.kubectl_ok("delete", "job", "a0", "-n", namespace, "--wait=true")
            wait_for("a0's Workload gone", lambda: workload_of(cluster, namespace, "a0") is None)
            apply(
                cluster,
                cluster_queue(
                    lender,
                    flavor_name=POOL,
                    gpus=16,
                    cohort=namespace,
                    preemption={"reclaimWithinCohort": "Any"},
                ),
            )
            answer = _json(dev, "what-if", "-f", str(job_file), "-n", namespace)["status"]
            _phalanx(dev, "what-if", "-f", str(job_file), "-n", namespace)
            assert answer["decision"] == "Preempt", answer
            assert (answer["localQueue"], answer["clusterQueue"]) == ("lq-a", lender)
            predicted = sorted(v["name"] for v in answer["victims"])
            assert len(predicted) == 2
            assert {v["reason"] for v in answer["victims"]} == {"InCohortReclamation"}
            assert all(_admitted(cluster, namespace, j) for j in b_jobs), "what-if changed nothing"

            apply(cluster, gpu_job("a1", queue="lq-a", pods=2), namespace=namespace)
            wait_for(
                "a1 admitted", lambda: _admitted(cluster, namespace, "a1"), timeout=60, log=log
            )
            preempted = []
            for name in b_jobs:
                wl = workload_of(cluster, namespace, name)
                assert wl is not None
                if is_true(wl, "Preempted"):
                    preempted.append(wl["metadata"]["name"])
            assert sorted(preempted) == predicted
        finally:
            delete_cluster_objects(
                cluster,
                f"clusterqueue.kueue.x-k8s.io/{lender}",
                f"clusterqueue.kueue.x-k8s.io/{borrower}",
                f"resourceflavor.kueue.x-k8s.io/{POOL}",
            )


def test_explain_names_the_missing_topology_capacity(
    cluster: ClusterHandle, served: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    log = served.log_tail
    cq = f"{namespace}-cq"
    with node_pool(cluster, TAS_POOL, racks=2, hosts=3):
        apply(
            cluster,
            topology(TAS_POOL),
            flavor(TAS_POOL, pool=TAS_POOL, topology_name=TAS_POOL),
            cluster_queue(cq, flavor_name=TAS_POOL, gpus=100),
        )
        try:
            apply(cluster, local_queue("lq", cluster_queue_name=cq), namespace=namespace)
            dev, _ = _users(cluster, namespace, tmp_path)
            # Racks have 3 nodes of 8 GPUs: a 4-pod gang of whole nodes fits in none.
            wide = gpu_job("wide", queue="lq", pods=4, required="cloud.provider.com/topology-rack")
            job_file = tmp_path / "wide.yaml"
            job_file.write_text(yaml.safe_dump(wide))
            answer = _json(dev, "what-if", "-f", str(job_file))["status"]
            _phalanx(dev, "what-if", "-f", str(job_file))
            assert answer["decision"] == "Pending"
            assert answer["explanation"]["reason"] == "TopologyPlacementFailed"

            apply(cluster, wide, namespace=namespace)
            wait_for("wide tried", lambda: _pending_tried(cluster, namespace, "wide"), log=log)
            status = _json(dev, "explain", "job/wide")["status"]
            assert status["reason"] == "TopologyPlacementFailed"
            assert "fits 3" in status["message"], status["message"]
            text = _phalanx(dev, "explain", "job/wide").stdout
            assert "largest free" in text

            # A gang of 3 fits one rack: what-if says where.
            fits = gpu_job("fits", queue="lq", pods=3, required="cloud.provider.com/topology-rack")
            job_file.write_text(yaml.safe_dump(fits))
            answer = _json(dev, "what-if", "-f", str(job_file))["status"]
            _phalanx(dev, "what-if", "-f", str(job_file))
            assert answer["decision"] == "Admit", answer
            assignment = answer["admission"]["podSetAssignments"][0]
            assert "topologyAssignment" in assignment
        finally:
            cluster.kubectl("delete", "job", "--all", "-n", namespace, "--wait=false")
            delete_cluster_objects(
                cluster,
                f"clusterqueue.kueue.x-k8s.io/{cq}",
                f"resourceflavor.kueue.x-k8s.io/{TAS_POOL}",
                f"topology.kueue.x-k8s.io/{TAS_POOL}",
            )
