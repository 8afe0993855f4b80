"""All-or-nothing gangs with topology: an 8-pod x 8-GPU Job never starts partially; it waits
with an explanation while only 7 nodes' worth of quota is free, then starts whole, every pod
in one rack, when it asks for a ``required`` rack."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    RACK,
    OperatorProcess,
    apply,
    cluster_queue,
    condition,
    delete_cluster_objects,
    flavor,
    get,
    get_list,
    gpu_job,
    is_true,
    job_pods,
    local_queue,
    node_pool,
    topology,
    wait_for,
    workload_of,
)

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

POOL = "phx-gang"
CQ = "phx-gang-cq"
TOPOLOGY = "phx-gang-topology"


@pytest.fixture(scope="module")
def gang_pool(cluster: ClusterHandle, phalanx_operator: OperatorProcess) -> Iterator[list[str]]:
    # Two racks of 8 hosts x 8 GPUs: a rack holds exactly one 8 x 8 gang.
    with node_pool(cluster, POOL, racks=2, hosts=8) as nodes:
        apply(
            cluster,
            topology(TOPOLOGY),
            flavor(POOL, pool=POOL, topology_name=TOPOLOGY),
            cluster_queue(CQ, flavor_name=POOL, gpus=64),
        )
        try:
            yield nodes
        finally:
            delete_cluster_objects(
                cluster,
                f"clusterqueue.kueue.x-k8s.io/{CQ}",
                f"resourceflavor.kueue.x-k8s.io/{POOL}",
                f"topology.kueue.x-k8s.io/{TOPOLOGY}",
            )


def test_gang_waits_whole_then_starts_whole_in_one_rack(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, gang_pool: list[str], namespace: str
) -> None:
    log = phalanx_operator.log_tail
    apply(cluster, local_queue("lq", cluster_queue_name=CQ), namespace=namespace)
    # One node's worth of the 64-GPU quota is taken: 56 GPUs (7 nodes) stay free.
    apply(cluster, gpu_job("blocker", queue="lq", pods=1, gpus=8), namespace=namespace)
    wait_for(
        "the blocker running",
        lambda: (
            (p := job_pods(cluster, namespace, "blocker"))
            and p[0]["status"].get("phase") == "Running"
        ),
        log=log,
    )
    apply(
        cluster,
        gpu_job("gang", queue="lq", pods=8, gpus=8, required=RACK),
        namespace=namespace,
    )
    pending = wait_for(
        "the gang's pending explanation",
        lambda: (
            (w := workload_of(cluster, namespace, "gang"))
            and (c := condition(w, "QuotaReserved"))
            and c["status"] == "False"
            and c
        ),
        log=log,
    )
    assert pending["reason"] == "Pending"
    assert "nvidia.com/gpu" in pending["message"], pending["message"]
    # Never partially started: not one pod while it waits.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert job_pods(cluster, namespace, "gang") == []
        assert get(cluster, "job", "gang", namespace)["spec"]["suspend"] is True
        time.sleep(0.5)

    cluster.kubectl_ok("delete", "job", "blocker", "-n", namespace, "--wait=false")
    admitted = wait_for(
        "the gang's admission",
        lambda: (w := workload_of(cluster, namespace, "gang")) and is_true(w, "Admitted") and w,
        timeout=60,
        log=log,
    )
    topology_assignment = admitted["status"]["admission"]["podSetAssignments"][0][
        "topologyAssignment"
    ]
    assert topology_assignment["levels"] == ["kubernetes.io/hostname"]
    pods = wait_for(
        "8 running pods",
        lambda: (
            (p := job_pods(cluster, namespace, "gang"))
            and len(p) == 8
            and all(x["status"].get("phase") == "Running" for x in p)
            and p
        ),
        timeout=60,
        log=log,
    )
    nodes = {
        n["metadata"]["name"]: n
        for n in get_list(cluster, "nodes", None, "-l", f"phalanx.dev/test-pool={POOL}")
    }
    racks = {nodes[p["spec"]["nodeName"]]["metadata"]["labels"][RACK] for p in pods}
    assert len(racks) == 1, f"the gang spans racks {racks}"
    assert len({p["spec"]["nodeName"] for p in pods}) == 8
    for pod in pods:
        assert not pod["spec"].get("schedulingGates"), "a pod kept its topology gate"
        assert pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] == pod["spec"]["nodeName"]


def test_gang_that_no_rack_can_hold_waits_with_the_topology_reason(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, gang_pool: list[str], namespace: str
) -> None:
    # Its own ClusterQueue: the quota is free whatever the previous test left running.
    own = f"{CQ}-2"
    apply(cluster, cluster_queue(own, flavor_name=POOL, gpus=64))
    apply(cluster, local_queue("lq", cluster_queue_name=own), namespace=namespace)
    # Two 8-GPU pods required on one host: the quota has room, no 8-GPU host does.
    apply(
        cluster,
        gpu_job("too-big", queue="lq", pods=2, gpus=8, required="kubernetes.io/hostname"),
        namespace=namespace,
    )
    pending = wait_for(
        "the topology explanation",
        lambda: (
            (w := workload_of(cluster, namespace, "too-big"))
            and (c := condition(w, "QuotaReserved"))
            and c["status"] == "False"
            and c
        ),
        log=phalanx_operator.log_tail,
    )
    try:
        assert "needs 2 pods" in pending["message"], pending["message"]
        assert "in one hostname" in pending["message"], pending["message"]
        assert job_pods(cluster, namespace, "too-big") == []
    finally:
        delete_cluster_objects(cluster, f"clusterqueue.kueue.x-k8s.io/{own}")
