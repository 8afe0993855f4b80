"""What an admin does: raise a ClusterQueue's quota (waiting Jobs start within seconds),
lower it (no new admissions, running Jobs untouched), apply an invalid ClusterQueue (the
webhook rejects it naming the field)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

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
    gpu_job,
    is_true,
    job_pods,
    local_queue,
    node_pool,
    wait_for,
    workload_of,
)

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

POOL = "phx-admin"


@pytest.fixture(scope="module")
def admin_pool(cluster: ClusterHandle, phalanx_operator: OperatorProcess) -> Iterator[list[str]]:
    with node_pool(cluster, POOL, racks=1, hosts=4) as nodes:
        apply(cluster, flavor(POOL, pool=POOL))
        try:
            yield nodes
        finally:
            delete_cluster_objects(cluster, f"resourceflavor.kueue.x-k8s.io/{POOL}")


def _admitted(cluster: ClusterHandle, namespace: str, job: str) -> bool:
    wl = workload_of(cluster, namespace, job)
    return bool(wl and is_true(wl, "Admitted"))


def _set_quota(cluster: ClusterHandle, cq: str, gpus: int) -> None:
    patch = [
        {
            "op": "replace",
            "path": "/spec/resourceGroups/0/flavors/0/resources/1/nominalQuota",
            "value": str(gpus),
        }
    ]
    cluster.kubectl_ok(
        "patch", "clusterqueue.kueue.x-k8s.io", cq, "--type=json", "-p", json.dumps(patch)
    )


def test_raising_quota_admits_waiting_jobs_and_lowering_it_spares_running_ones(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, admin_pool: list[str], namespace: str
) -> None:
    log = phalanx_operator.log_tail
    # Unique per run: a ClusterQueue of the same name may still be terminating.
    cq = f"{namespace}-{int(time.time()) % 100000}"
    apply(cluster, cluster_queue(cq, flavor_name=POOL, gpus=8))
    try:
        apply(cluster, local_queue("lq", cluster_queue_name=cq), namespace=namespace)
        jobs = ["j0", "j1", "j2"]
        for name in jobs:
            apply(cluster, gpu_job(name, queue="lq"), namespace=namespace)
        wait_for("one Job admitted", lambda: _admitted(cluster, namespace, "j0"), log=log)
        wait_for(
            "the other two pending",
            lambda: all(
                (w := workload_of(cluster, namespace, j)) and condition(w, "QuotaReserved")
                for j in ("j1", "j2")
            ),
            log=log,
        )
        assert not _admitted(cluster, namespace, "j1") and not _admitted(cluster, namespace, "j2")

        raised = time.monotonic()
        _set_quota(cluster, cq, 24)
        wait_for(
            "the waiting Jobs admitted after the raise",
            lambda: _admitted(cluster, namespace, "j1") and _admitted(cluster, namespace, "j2"),
            timeout=10,
            interval=0.2,
            log=log,
        )
        took = time.monotonic() - raised
        assert took < 5, f"admitted {took:.1f}s after the quota was raised"
        wait_for(
            "three pods running",
            lambda: all(
                [p["status"].get("phase") for p in job_pods(cluster, namespace, j)] == ["Running"]
                for j in jobs
            ),
            log=log,
        )

        # Lowering below usage: running Jobs keep running, a new one waits.
        _set_quota(cluster, cq, 8)
        apply(cluster, gpu_job("j3", queue="lq"), namespace=namespace)
        reserved = wait_for(
            "the new Job pending",
            lambda: (
                (w := workload_of(cluster, namespace, "j3"))
                and (c := condition(w, "QuotaReserved"))
                and c["status"] == "False"
                and c
            ),
            log=log,
        )
        assert "nvidia.com/gpu" in reserved["message"]
        time.sleep(3)
        for name in jobs:
            assert _admitted(cluster, namespace, name), f"{name} lost its admission"
            wl = workload_of(cluster, namespace, name)
            assert wl is not None and not is_true(wl, "Evicted")
            assert get(cluster, "job", name, namespace)["spec"].get("suspend") is False
            assert [p["status"].get("phase") for p in job_pods(cluster, namespace, name)] == [
                "Running"
            ]
        assert not _admitted(cluster, namespace, "j3")
        assert job_pods(cluster, namespace, "j3") == []
    finally:
        delete_cluster_objects(cluster, f"clusterqueue.kueue.x-k8s.io/{cq}")


def test_an_invalid_cluster_queue_is_rejected_by_the_webhook_naming_the_field(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, admin_pool: list[str], namespace: str
) -> None:
    # Lending more than the nominal quota: schema-valid (quantities are int-or-string, which
    # CEL cannot compare), so only Phalanx's validating webhook can catch it.
    bad = cluster_queue(f"{namespace}-bad", flavor_name=POOL, gpus=8, cohort="c", lending_limit=16)
    proc = cluster.kubectl("apply", "-f", "-", input=json.dumps(bad))
    assert proc.returncode != 0, "the invalid ClusterQueue was accepted"
    message = proc.stderr
    assert 'admission webhook "validate-clusterqueues' in message, message
    assert "spec.resourceGroups[0].flavors[0].resources[1].lendingLimit" in message, message
    assert "lendingLimit must not exceed nominalQuota" in message, message
    assert get_or_none(cluster, f"{namespace}-bad") is None
    # The same object without the mistake is accepted (the webhook is not rejecting all).
    good = cluster_queue(f"{namespace}-good", flavor_name=POOL, gpus=8, cohort="c", lending_limit=8)
    try:
        cluster.kubectl_ok("apply", "-f", "-", input=json.dumps(good))
    finally:
        delete_cluster_objects(cluster, f"clusterqueue.kueue.x-k8s.io/{namespace}-good")


def get_or_none(cluster: ClusterHandle, name: str) -> dict[str, object] | None:
    proc = cluster.kubectl("get", "clusterqueue.kueue.x-k8s.io", name, "-o", "json")
    return json.loads(proc.stdout) if proc.returncode == 0 else None
