"""Pod groups and single Pods (Kueue's ``pod`` integration) on the local control plane: a
queued Pod is gated at creation, a group is queued only once all its pods exist, never starts
in part, is admitted whole, runs on the flavor's nodes and finishes when every pod has."""

from __future__ import annotations

import time
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
    get_list,
    gpu_usage,
    is_true,
    local_queue,
    node_pool,
    priority_classes,
    start_operator,
    wait_for,
)

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

POOL = "phx-podgroups"
GATE = "kueue.x-k8s.io/admission"


def group_pod(
    name: str,
    *,
    group: str,
    total: int,
    run_seconds: str = "3",
    gpus: int = 1,
    priority_class: str | None = None,
) -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                "kueue.x-k8s.io/queue-name": "lq",
                "kueue.x-k8s.io/pod-group-name": group,
            },
            "annotations": {
                "kueue.x-k8s.io/pod-group-total-count": str(total),
                "phalanx.dev/run-seconds": run_seconds,
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "w",
                    "image": "example.invalid/w:1",
                    "resources": {
                        "requests": {"cpu": "1", "nvidia.com/gpu": str(gpus)},
                        "limits": {"nvidia.com/gpu": str(gpus)},
                    },
                }
            ],
        },
    }
    if priority_class:
        pod["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = priority_class
    return pod


def gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == GATE for g in pod["spec"].get("schedulingGates") or ())


def pods_of(cluster: ClusterHandle, namespace: str, group: str) -> list[dict[str, Any]]:
    return get_list(cluster, "pods", namespace, "-l", f"kueue.x-k8s.io/pod-group-name={group}")


def workloads(cluster: ClusterHandle, namespace: str) -> dict[str, dict[str, Any]]:
    return {
        w["metadata"]["name"]: w for w in get_list(cluster, "workloads.kueue.x-k8s.io", namespace)
    }


@pytest.fixture
def pod_operator(
    cluster: ClusterHandle, kueue_crds: Path, tmp_path: Path, cleanup: list[str]
) -> Any:
    """A ClusterQueue of 8 GPUs on a dedicated pool and an operator with the pod
    integration enabled through --config (integrations.frameworks)."""
    cq_name = f"podgroups-{int(time.time()) % 100000}"
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "integrations": {"frameworks": ["batch/job", "pod"]},
            }
        )
    )
    with node_pool(cluster, POOL, racks=1, hosts=1):
        cleanup += [
            f"clusterqueue.kueue.x-k8s.io/{cq_name}",
            f"resourceflavor.kueue.x-k8s.io/{POOL}",
        ]
        apply(cluster, flavor(POOL, pool=POOL), cluster_queue(cq_name, flavor_name=POOL, gpus=7))
        op = start_operator(cluster, tmp_path, f"--config={config}", name="pod-groups")
        try:
            yield cq_name, op
        finally:
            op.stop()


def test_a_group_short_of_quota_never_starts_a_pod_and_a_late_member_completes_it(
    cluster: ClusterHandle, namespace: str, pod_operator: tuple[str, OperatorProcess]
) -> None:
    cq_name, op = pod_operator
    apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)

    # 8 pods, 7 GPUs of quota: queued whole, nothing starts.
    apply(
        cluster,
        *(group_pod(f"big-{i}", group="big", total=8) for i in range(8)),
        namespace=namespace,
    )
    big = wait_for(
        "the group's Workload, pending",
        lambda: (
            (w := workloads(cluster, namespace).get("big"))
            and (c := condition(w, "QuotaReserved"))
            and c["status"] == "False"
            and w
        ),
        log=op.log_tail,
    )
    assert [ps["count"] for ps in big["spec"]["podSets"]] == [8]
    assert big["metadata"]["annotations"]["kueue.x-k8s.io/is-group-workload"] == "true"
    time.sleep(3)
    pods = pods_of(cluster, namespace, "big")
    assert len(pods) == 8 and all(gated(p) for p in pods), "a pod of the short group started"
    assert not any(p["spec"].get("nodeName") for p in pods)
    cluster.kubectl_ok("delete", "pods", "-n", namespace, "-l", "kueue.x-k8s.io/pod-group-name=big")
    wait_for("the short group's Workload gone", lambda: "big" not in workloads(cluster, namespace))

    # Quota for 8 now; 7 of a group of 8 first: no Workload (Kueue's event), every pod gated.
    apply(cluster, cluster_queue(cq_name, flavor_name=POOL, gpus=8))
    apply(
        cluster,
        *(group_pod(f"late-{i}", group="late", total=8) for i in range(7)),
        namespace=namespace,
    )
    wait_for(
        "Kueue's ErrWorkloadCompose event on the incomplete group",
        lambda: any(
            e.get("reason") == "ErrWorkloadCompose" for e in get_list(cluster, "events", namespace)
        ),
        log=op.log_tail,
    )
    assert "late" not in workloads(cluster, namespace)
    assert all(gated(p) for p in pods_of(cluster, namespace, "late"))

    # The last member arrives: admitted whole, every gate removed, all run and finish.
    apply(cluster, group_pod("late-7", group="late", total=8), namespace=namespace)
    late = wait_for(
        "the completed group admitted",
        lambda: (w := workloads(cluster, namespace).get("late")) and is_true(w, "Admitted") and w,
        log=op.log_tail,
    )
    (assignment,) = late["status"]["admission"]["podSetAssignments"]
    assert assignment["count"] == 8
    started = wait_for(
        "all 8 pods ungated and bound to the pool",
        lambda: (
            (pods := pods_of(cluster, namespace, "late"))
            and len(pods) == 8
            and all(not gated(p) and p["spec"].get("nodeName", "").startswith(POOL) for p in pods)
            and pods
        ),
        log=op.log_tail,
    )
    assert all(p["spec"]["nodeSelector"] == {"phalanx.dev/test-pool": POOL} for p in started)
    wait_for(
        "the group's Workload Finished",
        lambda: is_true(workloads(cluster, namespace)["late"], "Finished"),
        timeout=90,
        log=op.log_tail,
    )
    finished = condition(workloads(cluster, namespace)["late"], "Finished")
    assert finished is not None and finished["message"] == "Pods succeeded: 8/8."
    wait_for("the quota back to zero", lambda: gpu_usage(cluster, cq_name) == ("0", 0))


def test_a_single_pod_gets_kueues_workload_name_and_runs_once_admitted(
    cluster: ClusterHandle, namespace: str, pod_operator: tuple[str, OperatorProcess]
) -> None:
    cq_name, op = pod_operator
    apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)
    pod = group_pod("solo", group="unused", total=1)
    del pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"]
    apply(cluster, pod, namespace=namespace)
    wl = wait_for(
        "the single Pod's Workload admitted",
        lambda: next(
            (w for n, w in workloads(cluster, namespace).items() if n.startswith("pod-solo-")),
            None,
        ),
        log=op.log_tail,
    )
    assert len(wl["metadata"]["name"]) == len("pod-solo-") + 5
    wait_for(
        "the single Pod's Workload Finished",
        lambda: any(
            is_true(w, "Finished")
            for n, w in workloads(cluster, namespace).items()
            if n.startswith("pod-solo-")
        ),
        timeout=90,
        log=op.log_tail,
    )


def test_a_queued_pod_of_a_disabled_integration_is_left_alone_with_an_event(
    cluster: ClusterHandle, kueue_crds: Path, tmp_path: Path, namespace: str
) -> None:
    # The default frameworks: batch/job only, as in Kueue.
    op = start_operator(cluster, tmp_path, name="pods-disabled")
    try:
        apply(cluster, group_pod("loner", group="lone", total=1), namespace=namespace)
        event = wait_for(
            "the IntegrationNotEnabled event on the pod",
            lambda: next(
                (
                    e
                    for e in get_list(cluster, "events", namespace)
                    if e.get("reason") == "IntegrationNotEnabled"
                ),
                None,
            ),
            log=op.log_tail,
        )
        assert event["involvedObject"]["name"] == "loner"
        assert "'pod' is not enabled" in event["message"]
        (pod,) = pods_of(cluster, namespace, "lone")
        assert not gated(pod), "a Pod of a disabled integration was gated"
        assert not workloads(cluster, namespace), "a Workload was made for it"
    finally:
        op.stop()


def test_a_preempted_group_loses_its_pods_before_its_quota(
    cluster: ClusterHandle,
    namespace: str,
    pod_operator: tuple[str, OperatorProcess],
    cleanup: list[str],
) -> None:
    cq_name, op = pod_operator
    low, high, classes = priority_classes(namespace, cleanup)
    apply(
        cluster,
        *classes,
        cluster_queue(
            cq_name,
            flavor_name=POOL,
            gpus=8,
            preemption={"withinClusterQueue": "LowerPriority"},
        ),
    )
    apply(cluster, local_queue("lq", cluster_queue_name=cq_name), namespace=namespace)
    apply(
        cluster,
        *(
            group_pod(
                f"low-{i}", group="low", total=4, gpus=2, run_seconds="3600", priority_class=low
            )
            for i in range(4)
        ),
        namespace=namespace,
    )
    wait_for(
        "the low group running",
        lambda: (
            (ps := pods_of(cluster, namespace, "low"))
            and len(ps) == 4
            and all(p["spec"].get("nodeName") for p in ps)
        ),
        log=op.log_tail,
    )
    apply(
        cluster,
        *(
            group_pod(
                f"high-{i}", group="high", total=2, gpus=4, run_seconds="3600", priority_class=high
            )
            for i in range(2)
        ),
        namespace=namespace,
    )
    # The preempted group's pods are deleted at once, and with them (its owners) the
    # garbage collector may delete its Workload within a poll interval (seen in CI: 0.2 s),
    # so the preemption is read from the Event the operator posts on the Workload, which
    # outlives it.
    wait_for(
        "the low group preempted",
        lambda: any(
            e["involvedObject"].get("kind") == "Workload"
            and e["involvedObject"].get("name") == "low"
            and e.get("reason") == "Preempted"
            for e in get_list(cluster, "events", namespace)
        ),
        log=op.log_tail,
    )
    evicted = workloads(cluster, namespace).get("low")
    if evicted is not None:  # still there: it says so in its conditions too
        assert is_true(evicted, "Evicted") and condition(evicted, "Preempted") is not None
    wait_for(
        "the high group admitted and running",
        lambda: (
            (w := workloads(cluster, namespace).get("high"))
            and is_true(w, "Admitted")
            and (ps := pods_of(cluster, namespace, "high"))
            and all(not gated(p) for p in ps)
        ),
        log=op.log_tail,
    )
    assert pods_of(cluster, namespace, "low") == [], "the preempted group's pods stayed"
