"""PyTorchJobs (Kueue's ``kubeflow.org/pytorchjob`` integration) on the local control plane,
with the Kubeflow training-operator's PyTorchJob controller and webhook
(``github.com/kubeflow/training-operator``, built from its Go module) beside it: a labelled
PyTorchJob is held at creation (``spec.runPolicy.suspend``) and gets a Workload with one pod
set per replica type (``master``, ``worker``); it waits whole while quota is short, is admitted
whole, its pods run on KWOK nodes of the admitted flavor and it succeeds; a preempted one is
held through ``spec.runPolicy.suspend`` with its templates restored, re-admitted later and
succeeds; a ``required`` rack topology request puts the workers in one rack; the quota returns
to zero."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
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
    gpu_usage,
    is_true,
    local_queue,
    node_pool,
    priority_classes,
    start_operator,
    topology,
    wait_for,
    workload_of,
)

from phalanx.devcluster.handle import ClusterHandle
from phalanx.operator import pytorchjob as rules

pytestmark = pytest.mark.integration

POOL = "phx-pytorch"
TOPOLOGY = "phx-pytorch-topology"
PYTORCHJOBS = "pytorchjobs.kubeflow.org"
POOL_LABEL = "phalanx.dev/test-pool"
PODSET_LABEL = "kueue.x-k8s.io/podset"


def a_pytorchjob(
    name: str,
    *,
    workers: int,
    gpus: int,
    run_seconds: str = "3",
    priority_class: str | None = None,
    required: str | None = None,
) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": "lq"}
    if priority_class:
        labels["kueue.x-k8s.io/priority-class"] = priority_class

    def replica_spec(replicas: int, requests: dict[str, str]) -> dict[str, Any]:
        annotations = {"phalanx.dev/run-seconds": run_seconds}
        if required and "nvidia.com/gpu" in requests:
            annotations["kueue.x-k8s.io/podset-required-topology"] = required
        return {
            "replicas": replicas,
            "restartPolicy": "Never",
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "containers": [
                        {
                            "name": "pytorch",  # the training-operator's default container
                            "image": "example.invalid/train:1",
                            "resources": {"requests": requests, "limits": requests},
                        }
                    ],
                },
            },
        }

    return {
        "apiVersion": rules.API_VERSION,
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": replica_spec(1, {"cpu": "1"}),
                "Worker": replica_spec(workers, {"cpu": "1", "nvidia.com/gpu": str(gpus)}),
            }
        },
    }


def pytorchjob_pods(cluster: ClusterHandle, namespace: str, name: str) -> list[dict[str, Any]]:
    return get_list(cluster, "pods", namespace, "-l", f"{rules.JOB_NAME_LABEL}={name}")


def templates(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t: s["template"] for t, s in obj["spec"]["pytorchReplicaSpecs"].items()}


def suspended(obj: dict[str, Any]) -> Any:
    return (obj["spec"].get("runPolicy") or {}).get("suspend")


@pytest.fixture
def pytorch_operator(
    cluster: ClusterHandle,
    kueue_crds: Path,
    pytorch_controller: Path,
    tmp_path: Path,
    cleanup: list[str],
) -> Any:
    """A ClusterQueue of 8 GPUs on a dedicated pool (two racks of two 8-GPU nodes, with a
    Topology) and an operator with the PyTorchJob integration enabled."""
    cq_name = f"pytorch-{int(time.time()) % 100000}"
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
    with node_pool(cluster, POOL, racks=2, hosts=2):
        cleanup += [
            f"clusterqueue.kueue.x-k8s.io/{cq_name}",
            f"resourceflavor.kueue.x-k8s.io/{POOL}",
        ]
        apply(
            cluster,
            topology(TOPOLOGY),
            flavor(POOL, pool=POOL, topology_name=TOPOLOGY),
            cluster_queue(cq_name, flavor_name=POOL, gpus=8),
        )
        op = start_operator(cluster, tmp_path, f"--config={config}", name="pytorchjobs")

        def log(lines: int = 80) -> str:
            controller = "\n".join(
                pytorch_controller.read_text(errors="replace").splitlines()[-30:]
            )
            return f"{op.log_tail(lines)}\n---- training-operator ----\n{controller}"

        try:
            yield cq_name, op, log
        finally:
            op.stop()
            delete_cluster_objects(cluster, f"topology.kueue.x-k8s.io/{TOPOLOGY}")


def test_a_pytorchjob_waits_whole_while_quota_is_short_then_one_that_fits_runs(
    cluster: ClusterHandle,
    namespace: str,
    pytorch_operator: tuple[str, OperatorProcess, Any],
) -> None:
    cq_name, _op, log = pytorch_operator
    apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)

    # 3 workers x 4 GPUs = 12 GPUs against 8 of quota: held at creation, waits whole.
    apply(cluster, a_pytorchjob("big", workers=3, gpus=4), namespace=namespace)
    big = get(cluster, PYTORCHJOBS, "big", namespace)
    assert suspended(big) is True, "the webhook did not hold the queued PyTorchJob"
    wl = wait_for(
        "big's Workload, pending with an explanation",
        lambda: (
            (w := workload_of(cluster, namespace, "big", kind="PyTorchJob"))
            and (c := condition(w, "QuotaReserved"))
            and c["status"] == "False"
            and c.get("message")
            and w
        ),
        log=log,
    )
    assert wl["metadata"]["name"] == rules.workload_name("big", big["metadata"]["uid"])
    assert [(p["name"], p["count"]) for p in wl["spec"]["podSets"]] == [
        ("master", 1),
        ("worker", 3),
    ]
    pending = condition(wl, "QuotaReserved")
    assert pending is not None and "nvidia.com/gpu" in pending["message"], pending
    time.sleep(3)
    assert pytorchjob_pods(cluster, namespace, "big") == [], "a pod of the short job started"
    assert suspended(get(cluster, PYTORCHJOBS, "big", namespace)) is True

    # 2 workers x 4 GPUs fit: admitted whole, runs on the flavor's nodes, succeeds.
    apply(cluster, a_pytorchjob("fits", workers=2, gpus=4), namespace=namespace)
    admitted = wait_for(
        "fits admitted",
        lambda: (
            (w := workload_of(cluster, namespace, "fits", kind="PyTorchJob"))
            and is_true(w, "Admitted")
            and w
        ),
        log=log,
    )
    assignments = {a["name"]: a for a in admitted["status"]["admission"]["podSetAssignments"]}
    assert {n: a["count"] for n, a in assignments.items()} == {"master": 1, "worker": 2}
    started = get(cluster, PYTORCHJOBS, "fits", namespace)
    assert suspended(started) is False
    assert {t: s["spec"]["nodeSelector"] for t, s in templates(started).items()} == {
        "Master": {POOL_LABEL: POOL},
        "Worker": {POOL_LABEL: POOL},
    }
    pods = wait_for(
        "fits' 3 pods bound to the pool's nodes",
        lambda: (
            (ps := pytorchjob_pods(cluster, namespace, "fits"))
            and len(ps) == 3
            and all(p["spec"].get("nodeName", "").startswith(POOL) for p in ps)
            and ps
        ),
        log=log,
    )
    # The flavor's label, and the host the topology assignment chose (the flavor has a Topology).
    assert all(p["spec"]["nodeSelector"][POOL_LABEL] == POOL for p in pods)
    assert sorted(p["metadata"]["labels"][PODSET_LABEL] for p in pods) == [
        "master",
        "worker",
        "worker",
    ]
    wait_for(
        "fits Succeeded and its Workload Finished",
        lambda: (
            is_true(get(cluster, PYTORCHJOBS, "fits", namespace), "Succeeded")
            and (w := workload_of(cluster, namespace, "fits", kind="PyTorchJob"))
            and is_true(w, "Finished")
        ),
        timeout=120,
        log=log,
    )
    finished = condition(
        workload_of(cluster, namespace, "fits", kind="PyTorchJob") or {}, "Finished"
    )
    assert finished is not None and finished["reason"] == "Succeeded"
    assert not is_true(
        workload_of(cluster, namespace, "big", kind="PyTorchJob") or {}, "QuotaReserved"
    )
    cluster.kubectl_ok("delete", PYTORCHJOBS, "big", "-n", namespace, "--wait=false")
    wait_for("the quota back to zero", lambda: gpu_usage(cluster, cq_name) == ("0", 0), log=log)


def test_a_preempted_pytorchjob_is_held_restored_readmitted_and_succeeds(
    cluster: ClusterHandle,
    namespace: str,
    pytorch_operator: tuple[str, OperatorProcess, Any],
    cleanup: list[str],
) -> None:
    cq_name, _op, log = pytorch_operator
    low, high, classes = priority_classes(namespace, cleanup)
    apply(
        cluster,
        *classes,
        cluster_queue(
            cq_name, flavor_name=POOL, gpus=8, preemption={"withinClusterQueue": "LowerPriority"}
        ),
    )
    # Long enough to be preempted while running, short enough to succeed once re-admitted.
    # Created before its LocalQueue, so that the templates read back are the submitted ones.
    apply(
        cluster,
        a_pytorchjob("low", workers=2, gpus=4, run_seconds="30", priority_class=low),
        namespace=namespace,
    )
    original = templates(get(cluster, PYTORCHJOBS, "low", namespace))
    apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)
    wait_for(
        "low's 3 pods running on the pool",
        lambda: (
            (ps := pytorchjob_pods(cluster, namespace, "low"))
            and len(ps) == 3
            and all(p["spec"].get("nodeName", "").startswith(POOL) for p in ps)
        ),
        log=log,
    )
    # A higher-priority Job of all 8 GPUs preempts it; it runs 10 s, long enough to see low
    # held.
    apply(
        cluster,
        gpu_job("urgent", queue="lq", gpus=8, run_seconds="10", priority_class=high),
        namespace=namespace,
    )
    wait_for(
        "low evicted (preempted)",
        lambda: (
            (w := workload_of(cluster, namespace, "low", kind="PyTorchJob"))
            and (c := condition(w, "Evicted"))
            and c["status"] == "True"
            and condition(w, "Preempted") is not None
        ),
        log=log,
    )
    seen: list[Any] = []

    def restored() -> bool:
        job = get(cluster, PYTORCHJOBS, "low", namespace)
        seen[:] = [suspended(job), templates(job)]
        return suspended(job) is True and templates(job) == original

    try:
        wait_for(
            "low held through spec.runPolicy.suspend with its templates restored",
            restored,
            log=log,
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\nlast seen: {seen}\noriginal: {original}") from None
    wait_for(
        "low's pods gone and urgent admitted",
        lambda: (
            pytorchjob_pods(cluster, namespace, "low") == []
            and any(
                is_true(w, "Admitted")
                for w in get_list(cluster, "workloads.kueue.x-k8s.io", namespace)
                if w["metadata"]["name"].startswith("job-urgent-")
            )
        ),
        log=log,
    )
    # urgent finishes; low is admitted again, resumed by the training-operator, succeeds.
    wait_for(
        "low re-admitted and running again",
        lambda: (
            (w := workload_of(cluster, namespace, "low", kind="PyTorchJob"))
            and is_true(w, "Admitted")
            and not is_true(w, "Evicted")
            and suspended(get(cluster, PYTORCHJOBS, "low", namespace)) is False
            and len(pytorchjob_pods(cluster, namespace, "low")) == 3
        ),
        timeout=120,
        log=log,
    )
    wait_for(
        "low Succeeded and its Workload Finished",
        lambda: (
            is_true(get(cluster, PYTORCHJOBS, "low", namespace), "Succeeded")
            and is_true(workload_of(cluster, namespace, "low", kind="PyTorchJob") or {}, "Finished")
        ),
        timeout=150,
        log=log,
    )
    wait_for("the quota back to zero", lambda: gpu_usage(cluster, cq_name) == ("0", 0), log=log)


def test_a_required_rack_puts_every_worker_in_one_rack(
    cluster: ClusterHandle,
    namespace: str,
    pytorch_operator: tuple[str, OperatorProcess, Any],
) -> None:
    cq_name, _op, log = pytorch_operator
    apply(cluster, cluster_queue(cq_name, flavor_name=POOL, gpus=16))
    apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)
    # 2 workers x 8 GPUs: two hosts, which a rack of the pool (2 hosts x 8 GPUs) holds; left
    # to the kube-scheduler, they could as well land in two racks.
    apply(
        cluster,
        a_pytorchjob("racked", workers=2, gpus=8, required=RACK),
        namespace=namespace,
    )
    admitted = wait_for(
        "racked admitted",
        lambda: (
            (w := workload_of(cluster, namespace, "racked", kind="PyTorchJob"))
            and is_true(w, "Admitted")
            and w
        ),
        log=log,
    )
    worker_set = admitted["spec"]["podSets"][1]
    assert worker_set["topologyRequest"] == {
        "required": RACK,
        "podIndexLabel": rules.REPLICA_INDEX_LABEL,
    }

    def bound_workers() -> list[dict[str, Any]]:
        pods = pytorchjob_pods(cluster, namespace, "racked")
        workers = [p for p in pods if p["metadata"]["labels"].get(PODSET_LABEL) == "worker"]
        return (
            workers if len(workers) == 2 and all(p["spec"].get("nodeName") for p in workers) else []
        )

    pods = wait_for("racked's 2 workers bound", bound_workers, log=log)
    nodes = {
        n["metadata"]["name"]: n
        for n in get_list(cluster, "nodes", None, "-l", f"{POOL_LABEL}={POOL}")
    }
    racks = {nodes[p["spec"]["nodeName"]]["metadata"]["labels"][RACK] for p in pods}
    assert len(racks) == 1, f"the workers span racks {racks}"
    for pod in pods:
        assert not pod["spec"].get("schedulingGates"), "a worker kept its topology gate"
    wait_for(
        "racked Succeeded and its Workload Finished",
        lambda: (
            is_true(get(cluster, PYTORCHJOBS, "racked", namespace), "Succeeded")
            and is_true(
                workload_of(cluster, namespace, "racked", kind="PyTorchJob") or {}, "Finished"
            )
        ),
        timeout=120,
        log=log,
    )
    wait_for("the quota back to zero", lambda: gpu_usage(cluster, cq_name) == ("0", 0), log=log)
