"""Decayed fair sharing between ClusterQueues on the local control plane: team-a, whose
ClusterQueue used 8 GPUs for two hours until ten minutes ago (in the store; its status empty,
as when the feature is just turned on), waits behind team-b in their cohort although its
workload is older and neither holds anything; team-a's status then shows its decayed usage;
after a restart (with an empty store this time: the status alone) the order holds.

Fails if: the ordering ignores decayed usage (team-a's older workload goes first by FIFO, as
plain DRS ties), the store rebuild is broken (team-a starts at 0, same), the status is not
written (the wait for ``consumedResources`` times out), or a new leader does not restore from
the status (team-a is back at 0 after the restart and goes first)."""

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

POOL = "phx-drs"
GPU = "nvidia.com/gpu"


def _history(url: str, namespace: str, cluster_queue_name: str) -> None:
    """team-a's ClusterQueue held 8 GPUs from 2h10m ago until 10 minutes ago."""
    now = dt.datetime.now(dt.UTC)
    start = (now - dt.timedelta(minutes=130)).strftime("%Y-%m-%dT%H:%M:%SZ")
    end = (now - dt.timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    old = {
        "metadata": {
            "uid": "drs-history-1",
            "namespace": namespace,
            "name": "old-training",
            "creationTimestamp": start,
        },
        "spec": {"queueName": "team-a"},
        "status": {
            "admission": {
                "clusterQueue": cluster_queue_name,
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


def _consumed(cluster: ClusterHandle, name: str) -> dict[str, str] | None:
    obj = get(cluster, "clusterqueues.kueue.x-k8s.io", name)
    fair = (obj.get("status") or {}).get("fairSharing") or {}
    status = fair.get("admissionFairSharingStatus")
    return None if status is None else dict(status.get("consumedResources") or {})


def _gpus(quantity: str) -> float:
    return float(quantity.rstrip("m")) / (1000 if quantity.endswith("m") else 1)


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


def _pending_message(cluster: ClusterHandle, namespace: str, job: str) -> str | None:
    conditions = ((workload_of(cluster, namespace, job) or {}).get("status") or {}).get(
        "conditions"
    ) or []
    return next(
        (
            c["message"]
            for c in conditions
            if c["type"] == "QuotaReserved" and "decayed fair sharing" in c.get("message", "")
        ),
        None,
    )


def test_heavy_history_goes_last_in_the_cohort_and_the_order_survives_a_restart(
    cluster: ClusterHandle,
    kueue_crds: Path,
    tmp_path: Path,
    namespace: str,
    cleanup: list[str],
) -> None:
    suffix = f"{namespace}-{int(time.time()) % 100000}"
    team_a, team_b, cohort = f"a-{suffix}", f"b-{suffix}", f"org-{suffix}"
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "fairSharing": {"enable": True},
                "decayedFairSharing": {"usageHalfLifeTime": "1h", "usageSamplingInterval": "2s"},
            }
        )
    )
    store = f"sqlite:///{tmp_path}/store.db"
    _history(store, namespace, team_a)
    queues: list[dict[str, Any]] = [
        cluster_queue(name, flavor_name=POOL, gpus=4, cohort=cohort) for name in (team_a, team_b)
    ]
    cleanup += [f"clusterqueue.kueue.x-k8s.io/{name}" for name in (team_a, team_b)]
    cleanup.append(f"resourceflavor.kueue.x-k8s.io/{POOL}")
    apply(cluster, flavor(POOL, pool=POOL), *queues)
    apply(cluster, local_queue("team-a", cluster_queue_name=team_a), namespace=namespace)
    apply(cluster, local_queue("team-b", cluster_queue_name=team_b), namespace=namespace)

    first = start_operator(
        cluster, tmp_path, f"--config={config}", f"--store={store}", name="first"
    )
    try:
        # Rebuilt from the store: 8 x (0.5^(10/60) - 0.5^(130/60)) = 5.35 GPUs; team-b: 0.
        rebuilt = wait_for(
            "team-a's status shows its rebuilt decayed usage",
            lambda: _consumed(cluster, team_a),
            log=first.log_tail,
        )
        assert _gpus(rebuilt[GPU]) > 5.0, rebuilt
        assert f"kind=ClusterQueue queue={team_a} source=store" in first.log.read_text()
        wait_for("team-b's status", lambda: _consumed(cluster, team_b) is not None)
        # The blocker fills the cohort (8 GPUs: team-b's 4 and team-a's 4 borrowed).
        apply(cluster, gpu_job("blocker", queue="team-b"), namespace=namespace)
        wait_for("the blocker admitted", lambda: _admitted(cluster, namespace, "blocker"))
        for job, lq in (("a-1", "team-a"), ("b-1", "team-b")):
            apply(cluster, gpu_job(job, queue=lq), namespace=namespace)
            time.sleep(1.1)  # creation order: team-a's is older
        wait_for(
            "both workloads pending",
            lambda: all(workload_of(cluster, namespace, j) for j in ("a-1", "b-1")),
        )
        _release(cluster, namespace, "blocker")
        wait_for(
            "b-1 admitted before the older a-1",
            lambda: _admitted(cluster, namespace, "b-1"),
            log=first.log_tail,
        )
        assert not _admitted(cluster, namespace, "a-1")
        message = wait_for(
            "a-1 says why it waits",
            lambda: _pending_message(cluster, namespace, "a-1"),
            log=first.log_tail,
        )
        assert f"ClusterQueue {team_a} used" in message
        assert "nvidia.com/gpu-hours (decayed, half-life 1h) vs a fair 5.8" in message
        assert f"ClusterQueue {team_b} went first" in message
    finally:
        assert first.stop() == 0

    # A new leader with an empty store: the status alone keeps team-a behind team-b.
    empty = f"sqlite:///{tmp_path}/empty.db"
    second = start_operator(
        cluster, tmp_path, f"--config={config}", f"--store={empty}", name="second"
    )
    try:
        wait_for(
            "team-a restored from its status",
            lambda: f"kind=ClusterQueue queue={team_a} source=status" in second.log.read_text(),
            log=second.log_tail,
        )
        apply(cluster, gpu_job("b-2", queue="team-b"), namespace=namespace)
        wait_for("b-2 has a Workload", lambda: workload_of(cluster, namespace, "b-2"))
        _release(cluster, namespace, "b-1")
        wait_for(
            "b-2 admitted before a-1 after the restart",
            lambda: _admitted(cluster, namespace, "b-2"),
            log=second.log_tail,
        )
        assert not _admitted(cluster, namespace, "a-1")
        restored = _consumed(cluster, team_a)
        assert restored is not None and _gpus(restored[GPU]) > 5.0, restored
    finally:
        assert second.stop() == 0
