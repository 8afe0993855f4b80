"""LeaderWorkerSets (Kueue's ``leaderworkerset.x-k8s.io/leaderworkerset`` integration) on the
local control plane, with LWS's real controller (``sigs.k8s.io/lws``, built from its Go module)
beside it: a labelled LeaderWorkerSet of 2 groups of 4 where the quota fits one group gets one
Workload per group (pod sets leader 1 and worker 3); one group's pods are ungated and run on
KWOK nodes of the flavor, the other's stay gated with the quota reason on its Workload; more
quota admits the second; scaling down to 1 deletes that group's Workload and releases its
quota; deleting the LeaderWorkerSet returns the usage to zero. A preempted group's pods are
deleted (a pod cannot be gated again), made again gated by its StatefulSets, and run again once
re-admitted. A group whose templates ask for a ``required`` rack runs each pod set in one rack.
The ``pod`` framework is not enabled: an LWS's pods are queued by the LWS integration alone."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    OperatorProcess,
    apply,
    cluster_queue,
    condition,
    flavor,
    get,
    get_list,
    gpu_job,
    gpu_usage,
    is_true,
    local_queue,
    node_pool,
    priority_classes,
    start_operator,
    topology,
    wait_for,
)

from phalanx.devcluster.handle import ClusterHandle
from phalanx.operator import lws as rules
from phalanx.operator import pods as pod_rules

pytestmark = pytest.mark.integration

POOL = "phx-lws"
LWS = "leaderworkersets.leaderworkerset.x-k8s.io"
POOL_LABEL = "phalanx.dev/test-pool"


def an_lws(
    name: str,
    *,
    replicas: int,
    size: int,
    gpus: int,
    priority_class: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": "lq"}
    if priority_class:
        labels["kueue.x-k8s.io/priority-class"] = priority_class

    def template(role: str) -> dict[str, Any]:
        requests = {"cpu": "1", "nvidia.com/gpu": str(gpus)}
        return {
            "metadata": {
                "labels": {"app": name, "role": role},
                "annotations": dict(annotations or {}),
            },
            "spec": {
                "containers": [
                    {
                        "name": role,
                        "image": "example.invalid/vllm:1",
                        "resources": {"requests": requests, "limits": requests},
                    }
                ]
            },
        }

    return {
        "apiVersion": rules.API_VERSION,
        "kind": rules.KIND,
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {
                "size": size,
                "leaderTemplate": template("leader"),
                "workerTemplate": template("worker"),
            },
        },
    }


def workloads_of(cluster: ClusterHandle, namespace: str, name: str) -> dict[int, dict[str, Any]]:
    """The set's Workloads by group index."""
    found = {}
    for wl in get_list(cluster, "workloads.kueue.x-k8s.io", namespace):
        owners = wl["metadata"].get("ownerReferences") or ()
        if any(o.get("kind") == rules.KIND and o.get("name") == name for o in owners):
            found[int(wl["metadata"]["annotations"][rules.COMPONENT_INDEX_ANNOTATION])] = wl
    return found


def group_pods(cluster: ClusterHandle, namespace: str, name: str, index: int) -> list[dict]:
    return get_list(
        cluster,
        "pods",
        namespace,
        "-l",
        f"{rules.NAME_LABEL}={name},{rules.GROUP_INDEX_LABEL}={index}",
    )


def gated(pod: dict[str, Any]) -> bool:
    return pod_rules.gated(pod)


def running_on_pool(pods: list[dict[str, Any]], size: int) -> bool:
    return (
        len(pods) == size
        and all(not gated(p) for p in pods)
        and all(p["spec"].get("nodeName", "").startswith(POOL) for p in pods)
        and all((p.get("status") or {}).get("phase") == "Running" for p in pods)
    )


@contextlib.contextmanager
def _operator(
    cluster: ClusterHandle,
    lws_controller: Path,
    tmp_path: Path,
    cleanup: list[str],
    *,
    racks: int,
) -> Iterator[tuple[str, OperatorProcess, Any]]:
    """A ClusterQueue of 8 GPUs on a dedicated pool (``racks`` racks of two 8-GPU nodes; a
    Topology with more than one) and an operator with the LeaderWorkerSet integration enabled
    (integrations.frameworks), ``pod`` not."""
    cq_name = f"lws-{int(time.time()) % 100000}"
    topology_name = f"{POOL}-topology" if racks > 1 else None
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "integrations": {"frameworks": ["batch/job", rules.FRAMEWORK]},
            }
        )
    )
    with node_pool(cluster, POOL, racks=racks, hosts=2):
        cleanup += [
            f"clusterqueue.kueue.x-k8s.io/{cq_name}",
            f"resourceflavor.kueue.x-k8s.io/{POOL}",
        ]
        if topology_name:
            cleanup.append(f"topology.kueue.x-k8s.io/{topology_name}")
            apply(cluster, topology(topology_name))
        apply(
            cluster,
            flavor(POOL, pool=POOL, topology_name=topology_name),
            cluster_queue(cq_name, flavor_name=POOL, gpus=8),
        )
        op = start_operator(cluster, tmp_path, f"--config={config}", name="lws")

        def log(lines: int = 80) -> str:
            controller = "\n".join(lws_controller.read_text(errors="replace").splitlines()[-30:])
            return f"{op.log_tail(lines)}\n---- LWS controller ----\n{controller}"

        try:
            yield cq_name, op, log
        finally:
            op.stop()


@pytest.fixture
def lws_operator(
    cluster: ClusterHandle,
    kueue_crds: Path,
    lws_controller: Path,
    tmp_path: Path,
    cleanup: list[str],
) -> Iterator[tuple[str, OperatorProcess, Any]]:
    with _operator(cluster, lws_controller, tmp_path, cleanup, racks=1) as handles:
        yield handles


@pytest.fixture
def lws_rack_operator(
    cluster: ClusterHandle,
    kueue_crds: Path,
    lws_controller: Path,
    tmp_path: Path,
    cleanup: list[str],
) -> Iterator[tuple[str, OperatorProcess, Any]]:
    with _operator(cluster, lws_controller, tmp_path, cleanup, racks=2) as handles:
        yield handles


def test_an_lws_is_admitted_per_group_scaled_down_and_deleted(
    cluster: ClusterHandle,
    namespace: str,
    lws_operator: tuple[str, OperatorProcess, Any],
) -> None:
    cq_name, _op, log = lws_operator
    apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)

    # 2 groups of 4 pods x 2 GPUs: 8 GPUs a group against 8 of quota, so one group fits.
    apply(cluster, an_lws("llm", replicas=2, size=4, gpus=2), namespace=namespace)
    obj = get(cluster, LWS, "llm", namespace)
    for name in ("leaderTemplate", "workerTemplate"):
        meta = obj["spec"]["leaderWorkerTemplate"][name]["metadata"]
        assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "lq", name
        assert meta["annotations"][rules.SUSPENDED_BY_PARENT_ANNOTATION] == rules.FRAMEWORK

    def one_admitted_one_pending() -> tuple[int, int] | None:
        wls = workloads_of(cluster, namespace, "llm")
        if len(wls) != 2:
            return None
        admitted = [i for i, w in wls.items() if is_true(w, "Admitted")]
        pending = [
            i
            for i, w in wls.items()
            if (c := condition(w, "QuotaReserved")) and c["status"] == "False" and c.get("message")
        ]
        if len(admitted) != 1 or len(pending) != 1:
            return None
        if not running_on_pool(group_pods(cluster, namespace, "llm", admitted[0]), 4):
            return None
        return admitted[0], pending[0]

    admitted, pending = wait_for(
        "one group admitted and running on the pool, the other pending with a reason",
        one_admitted_one_pending,
        timeout=120,
        log=log,
    )
    wls = workloads_of(cluster, namespace, "llm")
    uid = obj["metadata"]["uid"]
    for index, wl in wls.items():
        assert wl["metadata"]["name"] == rules.workload_name("llm", uid, index)
        assert [(p["name"], p["count"]) for p in wl["spec"]["podSets"]] == [
            ("leader", 1),
            ("worker", 3),
        ]
    reason = condition(wls[pending], "QuotaReserved")
    assert reason is not None and "nvidia.com/gpu" in reason["message"], reason
    running = group_pods(cluster, namespace, "llm", admitted)
    assert all(p["spec"]["nodeSelector"] == {POOL_LABEL: POOL} for p in running)
    roles = sorted(p["metadata"]["labels"]["kueue.x-k8s.io/podset"] for p in running)
    assert roles == ["leader", "worker", "worker", "worker"]
    waiting = wait_for(
        "the pending group's 4 pods created, all gated",
        lambda: (
            (ps := group_pods(cluster, namespace, "llm", pending))
            and len(ps) == 4
            and all(gated(p) for p in ps)
            and ps
        ),
        log=log,
    )
    assert all(not p["spec"].get("nodeName") for p in waiting)
    wait_for("8 GPUs in use", lambda: gpu_usage(cluster, cq_name) == ("8", 1), log=log)

    # More quota: the second group is admitted and runs.
    apply(cluster, cluster_queue(cq_name, flavor_name=POOL, gpus=16))
    wait_for(
        "the second group admitted and running on the pool",
        lambda: (
            is_true(workloads_of(cluster, namespace, "llm").get(pending) or {}, "Admitted")
            and running_on_pool(group_pods(cluster, namespace, "llm", pending), 4)
        ),
        timeout=120,
        log=log,
    )
    wait_for("16 GPUs in use", lambda: gpu_usage(cluster, cq_name) == ("16", 2), log=log)

    # Scale down to 1: group 1's Workload is deleted and its quota released.
    cluster.kubectl_ok(
        "patch", LWS, "llm", "-n", namespace, "--type=merge", "-p", '{"spec":{"replicas":1}}'
    )
    wait_for(
        "group 1's Workload deleted and its quota released",
        lambda: (
            list(workloads_of(cluster, namespace, "llm")) == [0]
            and gpu_usage(cluster, cq_name) == ("8", 1)
        ),
        log=log,
    )
    assert is_true(workloads_of(cluster, namespace, "llm")[0], "Admitted")
    assert not is_true(workloads_of(cluster, namespace, "llm")[0], "Finished")

    # Deleted: its Workloads go with it (owner references) and the usage returns to zero.
    cluster.kubectl_ok("delete", LWS, "llm", "-n", namespace, "--wait=false")
    wait_for(
        "the usage back to zero",
        lambda: (
            workloads_of(cluster, namespace, "llm") == {}
            and gpu_usage(cluster, cq_name) == ("0", 0)
        ),
        timeout=120,
        log=log,
    )


def test_a_preempted_group_is_made_again_gated_readmitted_and_runs(
    cluster: ClusterHandle,
    namespace: str,
    lws_operator: tuple[str, OperatorProcess, Any],
    cleanup: list[str],
) -> None:
    cq_name, _op, log = lws_operator
    low, high, classes = priority_classes(namespace, cleanup)
    apply(
        cluster,
        *classes,
        cluster_queue(
            cq_name, flavor_name=POOL, gpus=8, preemption={"withinClusterQueue": "LowerPriority"}
        ),
    )
    apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)
    apply(
        cluster,
        an_lws("llm", replicas=1, size=4, gpus=2, priority_class=low),
        namespace=namespace,
    )
    first = wait_for(
        "the group running on the pool",
        lambda: (ps := group_pods(cluster, namespace, "llm", 0)) and running_on_pool(ps, 4) and ps,
        timeout=120,
        log=log,
    )
    first_uids = {p["metadata"]["uid"] for p in first}
    # A Job of all 8 GPUs at a higher priority preempts the group; it runs 10 s.
    apply(
        cluster,
        gpu_job("urgent", queue="lq", gpus=8, run_seconds="10", priority_class=high),
        namespace=namespace,
    )
    wait_for(
        "the group evicted (preempted)",
        lambda: (
            (w := workloads_of(cluster, namespace, "llm").get(0))
            and (c := condition(w, "Evicted"))
            and c["status"] == "True"
            and condition(w, "Preempted") is not None
        ),
        log=log,
    )
    wait_for(
        "the group's pods made again, gated, while urgent runs",
        lambda: (
            (ps := group_pods(cluster, namespace, "llm", 0))
            and len(ps) == 4
            and not first_uids & {p["metadata"]["uid"] for p in ps}
            and all(gated(p) for p in ps)
        ),
        log=log,
    )
    wait_for(
        "the group re-admitted and running again on the pool",
        lambda: (
            (w := workloads_of(cluster, namespace, "llm").get(0))
            and is_true(w, "Admitted")
            and not is_true(w, "Evicted")
            and running_on_pool(group_pods(cluster, namespace, "llm", 0), 4)
        ),
        timeout=120,
        log=log,
    )
    cluster.kubectl_ok("delete", LWS, "llm", "-n", namespace, "--wait=false")
    wait_for("the usage back to zero", lambda: gpu_usage(cluster, cq_name) == ("0", 0), log=log)


def test_a_group_asking_for_a_required_rack_runs_each_pod_set_in_one_rack(
    cluster: ClusterHandle,
    namespace: str,
    lws_rack_operator: tuple[str, OperatorProcess, Any],
) -> None:
    cq_name, _op, log = lws_rack_operator
    apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)
    rack = "cloud.provider.com/topology-rack"
    apply(
        cluster,
        an_lws(
            "llm",
            replicas=1,
            size=4,
            gpus=2,
            annotations={"kueue.x-k8s.io/podset-required-topology": rack},
        ),
        namespace=namespace,
    )
    wl = wait_for(
        "the group admitted with a topology assignment per pod set",
        lambda: (
            (w := workloads_of(cluster, namespace, "llm").get(0)) and is_true(w, "Admitted") and w
        ),
        timeout=120,
        log=log,
    )
    requests = {p["name"]: p.get("topologyRequest") for p in wl["spec"]["podSets"]}
    assert requests == {
        "leader": {"required": rack},
        "worker": {"required": rack, "podIndexLabel": rules.WORKER_INDEX_LABEL},
    }
    assignments = wl["status"]["admission"]["podSetAssignments"]
    assert all(a.get("topologyAssignment") for a in assignments), assignments
    pods = wait_for(
        "the group's pods running on the pool",
        lambda: (ps := group_pods(cluster, namespace, "llm", 0)) and running_on_pool(ps, 4) and ps,
        timeout=120,
        log=log,
    )
    nodes = {
        n["metadata"]["name"]: n["metadata"]["labels"][rack]
        for n in get_list(cluster, "nodes", None, "-l", f"{POOL_LABEL}={POOL}")
    }
    by_set: dict[str, set[str]] = {}
    for pod in pods:
        role = pod["metadata"]["labels"]["kueue.x-k8s.io/podset"]
        by_set.setdefault(role, set()).add(nodes[pod["spec"]["nodeName"]])
    assert sorted(by_set) == ["leader", "worker"]
    assert all(len(racks) == 1 for racks in by_set.values()), by_set
    cluster.kubectl_ok("delete", LWS, "llm", "-n", namespace, "--wait=false")
    wait_for("the usage back to zero", lambda: gpu_usage(cluster, cq_name) == ("0", 0), log=log)
