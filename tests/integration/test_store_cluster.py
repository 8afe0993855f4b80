"""End to end: Jobs run, the operator is SIGKILLed mid-way and started again, and the usage
report counts each Workload's GPU-time exactly once, as its own admission and finish times
give it."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import pytest
from faults_support import GPU, JobBurst
from operator_fixtures import kueue_crds  # noqa: F401 - the fixture, installing the CRDs

from phalanx.bench.proc import OperatorProcess, start_operator
from phalanx.devcluster.handle import ClusterHandle
from phalanx.quotas.quantity import parse_quantity
from phalanx.store import db, report
from phalanx.store.events import parse_time

pytestmark = [pytest.mark.integration]


def _workloads(cluster: ClusterHandle, namespace: str) -> list[dict[str, Any]]:
    out = cluster.kubectl_ok("get", "workloads.kueue.x-k8s.io", "-n", namespace, "-o", "json")
    return list(json.loads(out)["items"])


def _condition_time(workload: dict[str, Any], kind: str) -> dt.datetime | None:
    for condition in (workload.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind and condition.get("status") == "True":
            return parse_time(condition["lastTransitionTime"])
    return None


def _gpu_seconds(workload: dict[str, Any]) -> float:
    """GPU x seconds from the Workload alone: what its admission held, from quota reserved
    to finished."""
    reserved, finished = (
        _condition_time(workload, "QuotaReserved"),
        _condition_time(workload, "Finished"),
    )
    assert reserved is not None and finished is not None, workload.get("status")
    admission = workload["status"]["admission"]
    gpus = sum(
        parse_quantity(ps.get("resourceUsage", {}).get(GPU, 0), resource=GPU)
        for ps in admission["podSetAssignments"]
    )
    return gpus * (finished - reserved).total_seconds()


def test_a_sigkilled_operator_counts_each_workloads_gpu_time_once(
    cluster: ClusterHandle,
    kueue_crds: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    burst = JobBurst(cluster, "store-e2e", jobs=12, run_seconds="4")
    burst.setup()
    op: OperatorProcess | None = None
    try:
        op = start_operator(kubeconfig=cluster.kubeconfig, workdir=tmp_path, extra=["--store", url])
        op.wait_ready()
        burst.create()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            reserved = [
                w
                for w in _workloads(cluster, burst.namespace)
                if _condition_time(w, "QuotaReserved")
            ]
            if len(reserved) >= 3:
                break
            time.sleep(0.5)
        op.kill()
        time.sleep(2)
        op = start_operator(kubeconfig=cluster.kubeconfig, workdir=tmp_path, extra=["--store", url])
        op.wait_ready()
        burst.wait_complete(timeout=300)
        workloads = _workloads(cluster, burst.namespace)
        assert len(workloads) == 12
        assert all(_condition_time(w, "Finished") for w in workloads)
        expected = sum(_gpu_seconds(w) for w in workloads)
        engine = db.open_engine(url)
        # The writer batches about once a second: wait until it stored every finish, then
        # read the report (read before the last finish is stored, a reservation still open
        # counts up to the report's end: more GPU-time than the Workload held).
        deadline = time.monotonic() + 60
        while True:
            finishes = sum(
                1
                for w in workloads
                if any(
                    e.transition == "finished"
                    for e in report.timeline(
                        engine, namespace=burst.namespace, name=w["metadata"]["name"]
                    )
                )
            )
            if finishes == 12 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert finishes == 12, op.log_tail()
        until = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        rows = report.usage(engine, since=until - dt.timedelta(days=1), until=until, by="namespace")
        (row,) = [r for r in rows if r.group == burst.namespace]
        assert row.resource_seconds[GPU] == pytest.approx(expected, abs=1e-6), _disagreements(
            engine, burst.namespace, workloads
        )
        assert row.admissions == 12 and row.preemptions == 0
        for w in workloads:
            kinds = [
                e.transition
                for e in report.timeline(
                    engine, namespace=burst.namespace, name=w["metadata"]["name"]
                )
            ]
            assert kinds.count("quota_reserved") == 1 and kinds.count("finished") == 1, kinds
        engine.dispose()
    finally:
        if op is not None:
            op.stop()
        burst.teardown()


def _disagreements(engine: Any, namespace: str, workloads: list[dict[str, Any]]) -> str:
    """Each Workload whose stored timeline does not match its API conditions: what to read
    when the totals differ."""
    lines = []
    for w in workloads:
        name = w["metadata"]["name"]
        stored = [
            (e.transition, e.at.isoformat())
            for e in report.timeline(engine, namespace=namespace, name=name)
        ]
        conditions = [
            (c.get("type"), c.get("status"), c.get("lastTransitionTime"))
            for c in (w.get("status") or {}).get("conditions") or ()
        ]
        reserved = _condition_time(w, "QuotaReserved")
        if [t for t, at in stored if t == "quota_reserved"] != ["quota_reserved"] or not any(
            t == "quota_reserved" and reserved is not None and at == reserved.isoformat()
            for t, at in stored
        ):
            lines.append(f"{name}: stored {stored}; API {conditions}")
    return "\n".join(lines) or "every Workload's stored reservation matches its API conditions"
