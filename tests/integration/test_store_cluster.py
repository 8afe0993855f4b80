"""End to end: Jobs run, the operator is SIGKILLed mid-way and started again (or the
PostgreSQL store is down for 30 s), and the usage report counts each Workload's GPU-time
exactly once, as its own admission and finish times give it."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faults_support import GPU, JobBurst
from operator_fixtures import kueue_crds  # noqa: F401 - the fixture, installing the CRDs
from sqlalchemy import create_engine, text
from store_postgres import LocalPostgres, PostgresUnavailable, postgres_server

from phalanx.bench.proc import OperatorProcess, metric_sum, scrape, start_operator
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
        _assert_counted_once(cluster, burst, url, op)
    finally:
        if op is not None:
            op.stop()
        burst.teardown()


def _assert_counted_once(
    cluster: ClusterHandle, burst: JobBurst, url: str, op: OperatorProcess
) -> None:
    """Every Job finished; the store holds each Workload's one reservation and one finish, and
    the usage report's GPU-time equals what the Workloads' own conditions give."""
    workloads = _workloads(cluster, burst.namespace)
    assert len(workloads) == burst.jobs
    assert all(_condition_time(w, "Finished") for w in workloads)
    expected = sum(_gpu_seconds(w) for w in workloads)
    engine = db.open_engine(url)
    try:
        # The writer batches about once a second (and backs off up to 30 s after a database
        # outage): wait until it stored every finish, then read the report (read before the
        # last finish is stored, a reservation still open counts up to the report's end:
        # more GPU-time than the Workload held).
        deadline = time.monotonic() + 90
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
            if finishes == burst.jobs or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert finishes == burst.jobs, op.log_tail()
        until = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        rows = report.usage(engine, since=until - dt.timedelta(days=1), until=until, by="namespace")
        (row,) = [r for r in rows if r.group == burst.namespace]
        assert row.resource_seconds[GPU] == pytest.approx(expected, abs=1e-6), _disagreements(
            engine, burst.namespace, workloads
        )
        assert row.admissions == burst.jobs and row.preemptions == 0
        for w in workloads:
            kinds = [
                e.transition
                for e in report.timeline(
                    engine, namespace=burst.namespace, name=w["metadata"]["name"]
                )
            ]
            assert kinds.count("quota_reserved") == 1 and kinds.count("finished") == 1, kinds
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def postgres() -> Iterator[LocalPostgres]:
    try:
        with postgres_server() as server:
            yield server
    except PostgresUnavailable as error:
        if os.environ.get("CI"):
            raise  # .ci/run installs it: missing there is a failure, not a skip
        pytest.skip(f"no PostgreSQL here: {error}")


def test_a_30s_database_outage_loses_nothing_and_scheduling_goes_on(
    cluster: ClusterHandle,
    kueue_crds: Path,  # noqa: F811
    postgres: LocalPostgres,
    tmp_path: Path,
) -> None:
    admin = create_engine(postgres.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text("DROP DATABASE IF EXISTS outage WITH (FORCE)"))
        connection.execute(text("CREATE DATABASE outage"))
    admin.dispose()
    url = postgres.url.rsplit("/", 1)[0] + "/outage"
    burst = JobBurst(cluster, "store-outage", jobs=40, run_seconds="8")
    burst.setup()
    op: OperatorProcess | None = None
    try:
        op = start_operator(kubeconfig=cluster.kubeconfig, workdir=tmp_path, extra=["--store", url])
        op.wait_ready()
        burst.create()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _reserved(cluster, burst.namespace) < 3:
            time.sleep(0.5)
        deadline = time.monotonic() + 30
        while metric_sum(scrape(op.metrics_url), "phalanx_store_up") != 1:
            assert time.monotonic() < deadline, "the store never came up\n" + op.log_tail()
            time.sleep(0.5)
        postgres.stop()
        down_at = dt.datetime.now(dt.UTC).replace(tzinfo=None, microsecond=0)
        seen_down = seen_backlog = 0.0
        unavailable: dict[str, Any] | None = None
        outage_end = time.monotonic() + 30
        while time.monotonic() < outage_end:
            text_ = scrape(op.metrics_url)
            if metric_sum(text_, "phalanx_store_up") == 0:
                seen_down = 1
            seen_backlog = max(seen_backlog, metric_sum(text_, "phalanx_store_backlog_events"))
            store = _store_condition(cluster, burst.queues[0])
            if store is not None and store["status"] == "False":
                unavailable = store
            time.sleep(1)
        up_at = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        # Scheduling went on without the database: Workloads were admitted during the outage.
        during = [
            w
            for w in _workloads(cluster, burst.namespace)
            if (t := _condition_time(w, "QuotaReserved")) is not None and down_at < t < up_at
        ]
        assert len(during) >= 3, f"{len(during)} admissions during the outage\n{op.log_tail()}"
        assert seen_down == 1, "phalanx_store_up never showed the outage"
        assert seen_backlog > 0, "no backlog was visible while the database was down"
        # Each ClusterQueue says so too, once writes have failed for a while.
        assert unavailable is not None, "HistoryStoreAvailable never turned False"
        assert unavailable["reason"] == "StoreUnavailable"
        assert "scheduling goes on" in unavailable["message"]
        postgres.start()
        burst.wait_complete(timeout=300)
        assert op.alive(), op.log_tail()
        _assert_counted_once(cluster, burst, url, op)
        deadline = time.monotonic() + 30
        while (store := _store_condition(cluster, burst.queues[1])) is None or store[
            "status"
        ] != "True":
            assert time.monotonic() < deadline, f"HistoryStoreAvailable stays {store}"
            time.sleep(0.5)
        assert "event=store_write_failed" in op.log_text()
    finally:
        if op is not None:
            op.stop()
        burst.teardown()
        with contextlib.suppress(PostgresUnavailable):  # already up unless it failed mid-outage
            postgres.start()


def _store_condition(cluster: ClusterHandle, cluster_queue: str) -> dict[str, Any] | None:
    cq = json.loads(cluster.kubectl_ok("get", "clusterqueues", cluster_queue, "-o", "json"))
    for condition in (cq.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "HistoryStoreAvailable":
            return dict(condition)
    return None


def _reserved(cluster: ClusterHandle, namespace: str) -> int:
    return sum(1 for w in _workloads(cluster, namespace) if _condition_time(w, "QuotaReserved"))


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
