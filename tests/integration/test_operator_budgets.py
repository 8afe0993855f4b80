"""Usage budgets on the local control plane: a LocalQueue with a budget of 0.01 GPU-hours
(36 GPU-seconds) runs a 4-GPU Job until it is over budget; a new Job then waits, its
Workload's ``QuotaReserved=False`` message naming the budget; another LocalQueue of the same
ClusterQueue is unaffected. After a restart with the store, the budget's usage is rebuilt
from the store and the Job still waits, even once the first Job is gone and quota is free.

Fails if: running usage is not counted (the second Job is admitted), the explanation does
not name the budget, the budget leaks to the other LocalQueue (free-1 waits), or the usage
is not rebuilt from the store at the restart (the new leader starts at 0 and admits it)."""

from __future__ import annotations

import datetime as dt
import re
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    apply,
    cluster_queue,
    flavor,
    gpu_job,
    is_true,
    local_queue,
    start_operator,
    wait_for,
    workload_of,
)

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

POOL = "phx-budgets"
GPU = "nvidia.com/gpu"


def _admitted(cluster: ClusterHandle, namespace: str, job: str) -> bool:
    wl = workload_of(cluster, namespace, job)
    return bool(wl and is_true(wl, "QuotaReserved"))


def _reserved_at(cluster: ClusterHandle, namespace: str, job: str) -> dt.datetime | None:
    wl = workload_of(cluster, namespace, job) or {}
    for c in wl.get("status", {}).get("conditions", []):
        if c["type"] == "QuotaReserved" and c["status"] == "True":
            return dt.datetime.fromisoformat(c["lastTransitionTime"].replace("Z", "+00:00"))
    return None


def _pending_message(cluster: ClusterHandle, namespace: str, job: str) -> str:
    wl = workload_of(cluster, namespace, job) or {}
    for c in wl.get("status", {}).get("conditions", []):
        if c["type"] == "QuotaReserved" and c["status"] == "False":
            return str(c.get("message") or "")
    return ""


def _metric(port: int, name: str) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def test_over_budget_waits_and_still_waits_after_a_restart(
    cluster: ClusterHandle,
    kueue_crds: Path,
    tmp_path: Path,
    namespace: str,
    cleanup: list[str],
) -> None:
    cq = f"{namespace}-{int(time.time()) % 100000}"
    # The window starts now (not at midnight UTC), so it cannot reset during the test.
    start = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(minutes=1)
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "budgets": [
                    {
                        "localQueue": f"{namespace}/capped",
                        "resource": GPU,
                        "resourceHours": 0.01,
                        "period": "24h",
                        "periodStart": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    }
                ],
            }
        )
    )
    store = f"sqlite:///{tmp_path}/store.db"
    cleanup += [f"clusterqueue.kueue.x-k8s.io/{cq}", f"resourceflavor.kueue.x-k8s.io/{POOL}"]
    apply(cluster, flavor(POOL, pool=POOL), cluster_queue(cq, flavor_name=POOL, gpus=16))
    for lq in ("capped", "free"):
        apply(cluster, local_queue(lq, cluster_queue_name=cq), namespace=namespace)

    first = start_operator(
        cluster, tmp_path, f"--config={config}", f"--store={store}", name="first"
    )
    try:
        apply(cluster, gpu_job("cap-1", queue="capped", gpus=4), namespace=namespace)
        reserved = wait_for(
            "cap-1 admitted under budget",
            lambda: _reserved_at(cluster, namespace, "cap-1"),
            log=first.log_tail,
        )
        # 4 GPUs use the 36 GPU-seconds in 9 s; wait until the clock is well past that.
        wait_for(
            "cap-1 held 4 GPUs for 15 s",
            lambda: dt.datetime.now(dt.UTC) - reserved > dt.timedelta(seconds=15),
        )
        apply(cluster, gpu_job("cap-2", queue="capped", gpus=1), namespace=namespace)
        apply(cluster, gpu_job("free-1", queue="free", gpus=4), namespace=namespace)
        message = wait_for(
            "cap-2 says its budget is used up",
            lambda: (m := _pending_message(cluster, namespace, "cap-2")) and "gpu-hours" in m and m,
            log=first.log_tail,
        )
        assert re.search(
            rf"LocalQueue {namespace}/capped used [0-9.]+ of its 0\.01 nvidia\.com/gpu-hours"
            r" for the window \S+\.\.\S+; waits until it resets",
            message,
        ), message
        wait_for("free-1 admitted", lambda: _admitted(cluster, namespace, "free-1"))
        assert not _admitted(cluster, namespace, "cap-2")
        (used,) = _metric(first.metrics_port, "phalanx_budget_used_resource_hours")
        assert f'scope="LocalQueue {namespace}/capped"' in used
        assert float(used.rsplit(" ", 1)[1]) >= 0.01
        (limit,) = _metric(first.metrics_port, "phalanx_budget_limit_resource_hours")
        assert float(limit.rsplit(" ", 1)[1]) == 0.01
    finally:
        assert first.stop() == 0

    second = start_operator(
        cluster, tmp_path, f"--config={config}", f"--store={store}", name="second"
    )
    try:
        restored = re.search(
            r"event=budget_restored .* used_hours=([0-9.]+) source=store", second.log.read_text()
        )
        assert restored is not None, second.log_tail()
        assert float(restored.group(1)) >= 0.01
        # cap-1 goes: quota is free, but the budget is still used up.
        cluster.kubectl_ok("delete", "job", "cap-1", "-n", namespace, "--wait=false")
        wait_for("cap-1's Workload gone", lambda: workload_of(cluster, namespace, "cap-1") is None)
        apply(cluster, gpu_job("free-2", queue="free", gpus=4), namespace=namespace)
        wait_for(
            "free-2 admitted after the restart",
            lambda: _admitted(cluster, namespace, "free-2"),
            log=second.log_tail,
        )
        assert not _admitted(cluster, namespace, "cap-2")
        assert "of its 0.01 nvidia.com/gpu-hours" in _pending_message(cluster, namespace, "cap-2")
    finally:
        assert second.stop() == 0
