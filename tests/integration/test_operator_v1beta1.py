"""kueue.x-k8s.io/v1beta1 on the real API server, converted by the operator's webhook: objects
written in v1beta1 are stored as v1beta2 and read back identically through v1beta1; queue
status (LocalQueue ``flavorUsage``, as Kueue's sample-queue-control.py reads it) is served in
v1beta1; and without the operator only v1beta1 fails."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    OperatorProcess,
    apply,
    free_port,
    gpu_job,
    is_true,
    node_pool,
    start_operator,
    wait_for,
    workload_of,
)

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

V1 = "kueue.x-k8s.io/v1beta1"
POOL = "phx-v1beta1"
CONVERTED = ("clusterqueues", "localqueues", "cohorts", "workloads")


def _get(
    cluster: ClusterHandle, plural: str, version: str, name: str, ns: str | None = None
) -> dict[str, Any]:
    args = ["get", f"{plural}.{version}.kueue.x-k8s.io", name, "-o", "json"]
    if ns:
        args += ["-n", ns]
    return dict(json.loads(cluster.kubectl_ok(*args)))


def _client_config(cluster: ClusterHandle, plural: str) -> dict[str, Any]:
    crd = json.loads(cluster.kubectl_ok("get", "crd", f"{plural}.kueue.x-k8s.io", "-o", "json"))
    return dict(crd["spec"]["conversion"]["webhook"]["clientConfig"])


def _webhook_port(op: OperatorProcess) -> str:
    return next(a.split("=", 1)[1] for a in op.process.args if str(a).startswith("--webhook-port="))  # type: ignore[union-attr]


def _wait_converting(cluster: ClusterHandle, op: OperatorProcess) -> None:
    """Until every converted CRD names ``op``'s /convert: a replica killed earlier (the
    install tests' SIGKILLs) may have left them naming its Service, which ``op`` replaces
    only on its first round, after it starts."""
    port = _webhook_port(op)
    wait_for(
        "the converted CRDs to name the operator's /convert",
        lambda: all(
            _client_config(cluster, p).get("url") == f"https://127.0.0.1:{port}/convert"
            for p in CONVERTED
        ),
        log=op.log_tail,
    )


def _v1_objects(name: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": V1,
            "kind": "ResourceFlavor",
            "metadata": {"name": name},
            "spec": {
                "nodeLabels": {"phalanx.dev/pool": POOL},
                "tolerations": [
                    {
                        "key": "phalanx.dev/pool",
                        "operator": "Equal",
                        "value": POOL,
                        "effect": "NoSchedule",
                    }
                ],
            },
        },
        {"apiVersion": V1, "kind": "Cohort", "metadata": {"name": name}, "spec": {}},
        {
            "apiVersion": V1,
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {
                "cohort": name,
                "namespaceSelector": {},
                "flavorFungibility": {"whenCanBorrow": "Borrow", "whenCanPreempt": "TryNextFlavor"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": name,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "1000"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": "8"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": V1,
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": name},
            "value": 500,
        },
    ]


def test_without_the_operator_v1beta2_works_and_v1beta1_fails_with_the_webhook_named(
    cluster: ClusterHandle, kueue_crds: Path, tmp_path: Path, cleanup: list[str]
) -> None:
    # An operator on its own loopback address points the CRDs at itself while it runs and
    # gives them back when it exits.
    op = start_operator(cluster, tmp_path, f"--webhook-port={free_port()}", name="v1beta1-alone")
    try:
        port = _webhook_port(op)
        wait_for(
            "the converted CRDs to name the operator's /convert",
            lambda: all(
                _client_config(cluster, p).get("url") == f"https://127.0.0.1:{port}/convert"
                and _client_config(cluster, p).get("caBundle")
                for p in CONVERTED
            ),
            log=op.log_tail,
        )
    finally:
        assert op.stop() == 0, op.log_tail()
    for plural in CONVERTED:
        assert "url" not in _client_config(cluster, plural), plural
        assert _client_config(cluster, plural)["service"]["path"] == "/convert"

    name = "phx-v1b-alone"
    cleanup += [f"clusterqueue.kueue.x-k8s.io/{name}", f"topology.kueue.x-k8s.io/{name}"]
    apply(
        cluster,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {"cohortName": "c", "namespaceSelector": {}},
        },
    )
    assert _get(cluster, "clusterqueues", "v1beta2", name)["spec"]["cohortName"] == "c"
    refused = cluster.kubectl("get", f"clusterqueues.v1beta1.kueue.x-k8s.io/{name}")
    assert refused.returncode != 0 and "conversion webhook" in refused.stderr, refused.stderr
    # Kinds that are the same in both versions convert without the webhook.
    apply(
        cluster,
        {
            "apiVersion": V1,
            "kind": "Topology",
            "metadata": {"name": name},
            "spec": {"levels": [{"nodeLabel": "kubernetes.io/hostname"}]},
        },
    )
    assert _get(cluster, "topologies", "v1beta2", name)["spec"]["levels"][0]["nodeLabel"]


def test_objects_written_in_v1beta1_are_stored_as_v1beta2_and_read_back_identically(
    cluster: ClusterHandle,
    phalanx_operator: OperatorProcess,
    namespace: str,
    cleanup: list[str],
) -> None:
    _wait_converting(cluster, phalanx_operator)
    name = f"phx-v1b-{int(time.time()) % 100000}"
    objects = _v1_objects(name)
    cleanup += [
        f"clusterqueue.kueue.x-k8s.io/{name}",
        f"cohort.kueue.x-k8s.io/{name}",
        f"resourceflavor.kueue.x-k8s.io/{name}",
        f"workloadpriorityclass.kueue.x-k8s.io/{name}",
    ]
    apply(cluster, *objects)

    cq = _get(cluster, "clusterqueues", "v1beta2", name)
    assert cq["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert cq["spec"]["cohortName"] == name and "cohort" not in cq["spec"]
    assert cq["spec"]["flavorFungibility"]["whenCanBorrow"] == "MayStopSearch"  # Kueue's Borrow
    back = _get(cluster, "clusterqueues", "v1beta1", name)
    assert back["apiVersion"] == V1
    assert back["spec"]["cohort"] == name and "cohortName" not in back["spec"]
    written = objects[2]["spec"]
    assert back["spec"]["resourceGroups"] == written["resourceGroups"]
    for plural, obj in (("cohorts", objects[1]), ("resourceflavors", objects[0])):
        read = _get(cluster, plural, "v1beta1", name)
        assert read["apiVersion"] == V1
        assert {k: read["spec"].get(k) for k in obj["spec"]} == obj["spec"], read
    assert _get(cluster, "workloadpriorityclasses", "v1beta1", name)["value"] == 500

    # A Workload written in v1beta1 with Kueue's v1beta1 priority fields.
    workload = {
        "apiVersion": V1,
        "kind": "Workload",
        "metadata": {"name": "by-hand", "namespace": namespace},
        "spec": {
            "queueName": "nowhere",
            "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass",
            "priorityClassName": name,
            "priority": 500,
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {"spec": {"containers": [{"name": "c", "image": "x.invalid/i"}]}},
                }
            ],
        },
    }
    apply(cluster, workload, namespace=namespace)
    stored = _get(cluster, "workloads", "v1beta2", "by-hand", namespace)
    assert stored["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": name,
    }
    read = _get(cluster, "workloads", "v1beta1", "by-hand", namespace)["spec"]
    assert (read["priorityClassSource"], read["priorityClassName"]) == (
        "kueue.x-k8s.io/workloadpriorityclass",
        name,
    )
    assert "priorityClassRef" not in read

    # A field Phalanx refuses in v1beta2 is refused in v1beta1 too, naming it.
    bad = {**objects[2], "metadata": {"name": name + "-scope"}}
    bad["spec"] = {**bad["spec"], "concurrentAdmissionPolicy": {}}
    refused = cluster.kubectl("apply", "-f", "-", input=json.dumps(bad))
    assert refused.returncode != 0 and "concurrentAdmissionPolicy" in refused.stderr, refused.stderr

    # v1beta1's list of admission check names is v1beta2's admissionChecksStrategy.
    cleanup.append(f"clusterqueue.kueue.x-k8s.io/{name}-checks")
    checked = {**objects[2], "metadata": {"name": name + "-checks"}}
    checked["spec"] = {**checked["spec"], "admissionChecks": ["prov"]}
    apply(cluster, checked)
    strategy = _get(cluster, "clusterqueues", "v1beta2", name + "-checks")["spec"]
    assert strategy["admissionChecksStrategy"] == {"admissionChecks": [{"name": "prov"}]}


def test_queue_usage_reads_through_v1beta1_as_kueue_clients_read_it(
    cluster: ClusterHandle,
    phalanx_operator: OperatorProcess,
    namespace: str,
    cleanup: list[str],
) -> None:
    _wait_converting(cluster, phalanx_operator)
    name = f"phx-v1u-{int(time.time()) % 100000}"
    objects = _v1_objects(name)
    cleanup += [
        f"clusterqueue.kueue.x-k8s.io/{name}",
        f"cohort.kueue.x-k8s.io/{name}",
        f"resourceflavor.kueue.x-k8s.io/{name}",
        f"workloadpriorityclass.kueue.x-k8s.io/{name}",
    ]
    with node_pool(cluster, POOL, racks=1, hosts=1):
        apply(cluster, *objects)
        apply(
            cluster,
            {
                "apiVersion": V1,
                "kind": "LocalQueue",
                "metadata": {"name": "lq"},
                "spec": {"clusterQueue": name},
            },
            namespace=namespace,
        )
        apply(cluster, gpu_job("train", queue="lq"), namespace=namespace)
        wait_for(
            "the Job admitted",
            lambda: (w := workload_of(cluster, namespace, "train")) and is_true(w, "Admitted"),
            log=phalanx_operator.log_tail,
        )

        def lq_gpus() -> str | None:
            status = _get(cluster, "localqueues", "v1beta1", "lq", namespace).get("status") or {}
            assert "flavorsUsage" not in status, status
            for flavor in status.get("flavorUsage") or ():
                for resource in flavor["resources"]:
                    if resource["name"] == "nvidia.com/gpu" and resource.get("total") == "8":
                        return str(resource["total"])
            return None

        assert (
            wait_for(
                "LocalQueue status.flavorUsage via v1beta1", lq_gpus, log=phalanx_operator.log_tail
            )
            == "8"
        )
        v2 = _get(cluster, "localqueues", "v1beta2", "lq", namespace)["status"]
        assert "flavorUsage" not in v2 and v2["flavorsUsage"]

        def cq_gpus() -> bool:
            status = _get(cluster, "clusterqueues", "v1beta1", name).get("status") or {}
            return any(
                r["name"] == "nvidia.com/gpu" and r.get("total") == "8"
                for f in status.get("flavorsUsage") or ()
                for r in f["resources"]
            )

        wait_for(
            "ClusterQueue status.flavorsUsage via v1beta1", cq_gpus, log=phalanx_operator.log_tail
        )
        admitted = workload_of(cluster, namespace, "train")
        assert admitted is not None
        wl = _get(cluster, "workloads", "v1beta1", admitted["metadata"]["name"], namespace)
        assert wl["apiVersion"] == V1 and wl["status"]["admission"]["clusterQueue"] == name
        cluster.kubectl("delete", "job", "train", "-n", namespace, "--wait=false")
