"""Admission fair sharing on the local control plane: a LocalQueue with a history of heavy
usage (in the store, its status empty as after a migration from a Kueue without admission
fair sharing) waits behind the other LocalQueue of its ClusterQueue; the LocalQueues' status
shows ``consumedResources``; after a restart (no store this time: the status alone) the order
holds.

Fails if: the store rebuild is broken (heavy starts at 0 and goes first by FIFO), the status
is not written (the wait for ``consumedResources`` times out), or a new leader does not
restore from the status (heavy is back at 0 after the restart and goes first)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    apply,
    cluster_queue,
    flavor,
    get,
    gpu_job,
    is_true,
    local_queue,
    start_operator,
    wait_for,
    workload_of,
)

from phalanx.devcluster.handle import ClusterHandle
from phalanx.store import db
from phalanx.store import events as ev

pytestmark = pytest.mark.integration

POOL = "phx-afs"
GPU = "nvidia.com/gpu"


def _history(url: str, namespace: str) -> None:
    """The heavy LocalQueue held 8 GPUs from 2h10m ago until 10 minutes ago."""
    now = dt.datetime.now(dt.UTC)
    start = (now - dt.timedelta(minutes=130)).strftime("%Y-%m-%dT%H:%M:%SZ")
    end = (now - dt.timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    old = {
        "metadata": {
            "uid": "afs-history-1",
            "namespace": namespace,
            "name": "old-training",
            "creationTimestamp": start,
        },
        "spec": {"queueName": "heavy"},
        "status": {
            "admission": {
                "clusterQueue": "x",
                "podSetAssignments": [
                    {
                        "name": "main",
                        "count": 1,
                        "flavors": {GPU: POOL},
                        "resourceUsage": {GPU: "8"},
                    }
                ],
            },
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "lastTransitionTime": start},
                {"type": "Finished", "status": "True", "lastTransitionTime": end},
            ],
        },
    }
    engine = db.open_engine(url)
    db.upgrade(engine)
    db.write_events(engine, ev.events_of(old))
    engine.dispose()


def _consumed(cluster: ClusterHandle, namespace: str, lq: str) -> dict[str, str] | None:
    obj = get(cluster, "localqueues.kueue.x-k8s.io", lq, namespace)
    afs = ((obj.get("status") or {}).get("fairSharing") or {}).get("admissionFairSharingStatus")
    return None if afs is None else dict(afs.get("consumedResources") or {})


def _admitted(cluster: ClusterHandle, namespace: str, job: str) -> bool:
    wl = workload_of(cluster, namespace, job)
    return bool(wl and is_true(wl, "QuotaReserved"))


def _release(cluster: ClusterHandle, namespace: str, job: str) -> None:
    wl = workload_of(cluster, namespace, job)
    cluster.kubectl_ok("delete", "job", job, "-n", namespace, "--wait=false")
    if wl is not None:
        cluster.kubectl(
            "delete", "workload", wl["metadata"]["name"], "-n", namespace, "--wait=false"
        )


def test_heavy_history_waits_behind_and_the_order_survives_a_restart(
    cluster: ClusterHandle,
    kueue_crds: Path,
    tmp_path: Path,
    namespace: str,
    cleanup: list[str],
) -> None:
    cq = f"{namespace}-{int(time.time()) % 100000}"
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "admissionFairSharing": {
                    "usageHalfLifeTime": "1h",
                    "usageSamplingInterval": "2s",
                    "resourceWeights": {"cpu": 0},
                },
            }
        )
    )
    store = f"sqlite:///{tmp_path}/store.db"
    _history(store, namespace)
    queue: dict[str, Any] = cluster_queue(cq, flavor_name=POOL, gpus=8)
    queue["spec"]["admissionScope"] = {"admissionMode": "UsageBasedAdmissionFairSharing"}
    cleanup += [f"clusterqueue.kueue.x-k8s.io/{cq}", f"resourceflavor.kueue.x-k8s.io/{POOL}"]
    apply(cluster, flavor(POOL, pool=POOL), queue)
    for lq in ("heavy", "light"):
        apply(cluster, local_queue(lq, cluster_queue_name=cq), namespace=namespace)

    first = start_operator(
        cluster, tmp_path, f"--config={config}", f"--store={store}", name="first"
    )
    try:
        # Rebuilt from the store: 8 x (0.5^(10/60) - 0.5^(130/60)) = 5.35 GPUs; light: 0.
        heavy = wait_for(
            "heavy's status shows its rebuilt usage",
            lambda: _consumed(cluster, namespace, "heavy"),
            log=first.log_tail,
        )
        gpus = float(heavy[GPU].rstrip("m")) / (1000 if heavy[GPU].endswith("m") else 1)
        assert gpus > 5.0, heavy
        assert "source=store" in first.log.read_text()
        wait_for("light's status", lambda: _consumed(cluster, namespace, "light") is not None)
        apply(cluster, gpu_job("blocker", queue="light"), namespace=namespace)
        wait_for("the blocker admitted", lambda: _admitted(cluster, namespace, "blocker"))
        for job, lq in (("heavy-1", "heavy"), ("heavy-2", "heavy"), ("light-1", "light")):
            apply(cluster, gpu_job(job, queue=lq), namespace=namespace)
            time.sleep(1.1)  # creation order: heavy's are older
        wait_for(
            "three workloads pending",
            lambda: all(workload_of(cluster, namespace, j) for j in ("heavy-1", "light-1")),
        )
        _release(cluster, namespace, "blocker")
        wait_for(
            "light-1 admitted before the older heavy-1",
            lambda: _admitted(cluster, namespace, "light-1"),
            log=first.log_tail,
        )
        assert not _admitted(cluster, namespace, "heavy-1")
        message = wait_for(
            "heavy-1 says why it waits",
            lambda: next(
                (
                    c["message"]
                    for c in (workload_of(cluster, namespace, "heavy-1") or {})
                    .get("status", {})
                    .get("conditions", [])
                    if c["type"] == "QuotaReserved" and "admission fair sharing" in c["message"]
                ),
                None,
            ),
            log=first.log_tail,
        )
        assert f"LocalQueue {namespace}/heavy waited behind {namespace}/light" in message
        assert "nvidia.com/gpu-hours" in message
        light = wait_for(
            "light's consumed usage moves with its admissions",
            lambda: (c := _consumed(cluster, namespace, "light")) and c.get(GPU),
        )
        assert light
    finally:
        assert first.stop() == 0

    # A new leader without the store: the status alone keeps heavy behind light.
    second = start_operator(cluster, tmp_path, f"--config={config}", name="second")
    try:
        apply(cluster, gpu_job("light-2", queue="light"), namespace=namespace)
        assert "source=status" in second.log.read_text() or wait_for(
            "restored from the status",
            lambda: "source=status" in second.log.read_text(),
            log=second.log_tail,
        )
        wait_for("light-2 has a Workload", lambda: workload_of(cluster, namespace, "light-2"))
        _release(cluster, namespace, "light-1")
        wait_for(
            "light-2 admitted before heavy-1 after the restart",
            lambda: _admitted(cluster, namespace, "light-2"),
            log=second.log_tail,
        )
        assert not _admitted(cluster, namespace, "heavy-1")
        assert not _admitted(cluster, namespace, "heavy-2")
    finally:
        assert second.stop() == 0
