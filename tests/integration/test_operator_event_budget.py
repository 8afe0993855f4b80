"""API writes per admission on the local control plane: routine Events (what a Workload's
status already records) are rate-limited while ``kubectl describe workload`` still shows the
admission, and the preemption and eviction always as Events; a Workload nothing owns is
evicted and requeued in one write."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    OperatorProcess,
    apply,
    cluster_queue,
    condition,
    delete_cluster_objects,
    flavor,
    get,
    is_true,
    local_queue,
    node_pool,
    start_operator,
    wait_for,
)
from prometheus_client.parser import text_string_to_metric_families

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

POOL = "phx-evb"
WORKLOADS = "workloads.kueue.x-k8s.io"


@pytest.fixture(scope="module")
def limited_operator(
    cluster: ClusterHandle, kueue_crds: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """Routine Events: one, then one per 1,000 s (none more during the test)."""
    op = start_operator(
        cluster,
        tmp_path_factory.mktemp("operator"),
        "--routine-events-qps=0.001",
        "--routine-events-burst=1",
    )
    try:
        with node_pool(cluster, POOL, racks=1, hosts=2):
            apply(cluster, flavor(POOL, pool=POOL))
            try:
                yield op
            finally:
                delete_cluster_objects(cluster, f"resourceflavor.kueue.x-k8s.io/{POOL}")
    finally:
        op.stop()


def workload(name: str, *, gpus: int, priority: int) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {
            "queueName": "lq",
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
                                    "resources": {"requests": {"nvidia.com/gpu": str(gpus)}},
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }


def counter(text: str, name: str, **labels: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def event_reasons(cluster: ClusterHandle, namespace: str, name: str) -> list[str]:
    out = cluster.kubectl_ok(
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.name={name},involvedObject.kind=Workload",
        "-o",
        "jsonpath={range .items[*]}{.reason}{'\\n'}{end}",
    )
    return sorted(r for r in out.split() if r)


def test_routine_events_are_limited_preemptions_are_not_and_describe_shows_both(
    cluster: ClusterHandle, limited_operator: OperatorProcess, namespace: str
) -> None:
    log = limited_operator.log_tail
    cq = f"{namespace}-{int(time.time()) % 100000}"
    apply(
        cluster,
        cluster_queue(
            cq,
            flavor_name=POOL,
            gpus=16,
            preemption={"withinClusterQueue": "LowerPriority"},
        ),
    )
    try:
        apply(cluster, local_queue("lq", cluster_queue_name=cq), namespace=namespace)
        before = limited_operator.metrics()
        for name in ("low-a", "low-b"):
            apply(cluster, workload(name, gpus=8, priority=1), namespace=namespace)
        for name in ("low-a", "low-b"):
            wait_for(
                f"{name} admitted",
                lambda n=name: is_true(get(cluster, WORKLOADS, n, namespace), "Admitted"),
                log=log,
            )
        wait_for(
            "one Admitted Event written, the other skipped and counted",
            lambda: (
                counter(
                    limited_operator.metrics(), "phalanx_events_skipped_total", reason="Admitted"
                )
                - counter(before, "phalanx_events_skipped_total", reason="Admitted")
                == 1
            ),
            log=log,
        )
        reasons = {n: event_reasons(cluster, namespace, n) for n in ("low-a", "low-b")}
        assert sorted(r for rs in reasons.values() for r in rs) == ["Admitted"], reasons
        skipped = next(n for n, rs in reasons.items() if not rs)
        described = cluster.kubectl_ok("describe", "workload", skipped, "-n", namespace)
        assert f"Quota reserved in ClusterQueue {cq}" in described, described
        assert "Cluster Queue:" in described and cq in described, described

        apply(cluster, workload("high", gpus=16, priority=100), namespace=namespace)
        wait_for(
            "the high-priority Workload admitted over both",
            lambda: is_true(get(cluster, WORKLOADS, "high", namespace), "Admitted"),
            log=log,
        )
        after = limited_operator.metrics()
        for name in ("low-a", "low-b"):
            victim = get(cluster, WORKLOADS, name, namespace)
            assert condition(victim, "Preempted")["status"] == "True"
            assert not is_true(victim, "QuotaReserved") and "admission" not in victim["status"]
            wait_for(
                f"{name}'s Preempted Event, beyond the routine limit",
                lambda n=name: "Preempted" in event_reasons(cluster, namespace, n),
                log=log,
            )
            described = cluster.kubectl_ok("describe", "workload", name, "-n", namespace)
            assert "Preempted" in described and "high" in described, described

        def writes(text: str, verb: str) -> float:
            return counter(text, "phalanx_api_writes_total", kind="Workload", verb=verb)

        # Nothing owns these Workloads: one write each evicts and requeues them.
        assert writes(after, "evict") - writes(before, "evict") == 2
        assert writes(after, "requeue") - writes(before, "requeue") == 0
    finally:
        delete_cluster_objects(cluster, f"clusterqueue.kueue.x-k8s.io/{cq}")
