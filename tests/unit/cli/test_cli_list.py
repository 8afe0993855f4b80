"""``phalanx list`` / ``kubectl phalanx list``: the rows kueuectl users expect, positions from
the visibility API, filters, and kubectl's table."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

import pytest

from phalanx.cli import list_cmd
from phalanx.cli.main import main

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def _wl(
    name: str,
    *,
    queue: str = "lq-a",
    conditions: tuple[tuple[str, str, str], ...] = (),
    cq: str | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [
            {"type": t, "status": s, "lastTransitionTime": at, "message": f"{t} message"}
            for t, s, at in conditions
        ]
    }
    if cq:
        status["admission"] = {"clusterQueue": cq, "podSetAssignments": []}
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "creationTimestamp": "2026-03-01T11:00:00Z",
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": f"{name}-job", "controller": True}
            ],
        },
        "spec": {"queueName": queue},
        "status": status,
    }


QUEUES = {("team-a", "lq-a"): "cq-a", ("team-a", "lq-b"): "cq-b"}


def test_a_pending_workload_shows_its_position_and_its_local_queues_cluster_queue() -> None:
    pending = _wl("w1", conditions=(("QuotaReserved", "False", "2026-03-01T11:00:05Z"),))
    row = list_cmd.workload_row(pending, {("team-a", "w1"): 3}, QUEUES, now=NOW)
    assert row == ["w1", "job.batch", "w1-job", "lq-a", "cq-a", "PENDING", "3", "", "1h"]
    unknown = list_cmd.workload_row(pending, {}, QUEUES, now=NOW)
    assert unknown[6] == "-", "a position that could not be read is shown as unknown"
    assert list_cmd.waiting_reason(pending) == "QuotaReserved message"


def test_admitted_and_finished_workloads_show_their_run_time() -> None:
    admitted = _wl(
        "w2",
        cq="cq-a",
        conditions=(
            ("QuotaReserved", "True", "2026-03-01T11:50:00Z"),
            ("Admitted", "True", "2026-03-01T11:50:00Z"),
        ),
    )
    row = list_cmd.workload_row(admitted, {}, QUEUES, now=NOW)
    assert row[4:8] == ["cq-a", "ADMITTED", "", "10m"]
    finished = _wl(
        "w3",
        cq="cq-a",
        conditions=(
            ("Admitted", "True", "2026-03-01T11:00:00Z"),
            ("Finished", "True", "2026-03-01T11:00:45Z"),
        ),
    )
    assert list_cmd.workload_row(finished, {}, QUEUES, now=NOW)[5:8] == ["FINISHED", "", "45s"]
    assert list_cmd.status_of(_wl("w4", conditions=(("QuotaReserved", "True", "x"),))) == (
        "QUOTARESERVED"
    )


def test_job_types_are_named_as_kubectl_names_resources() -> None:
    assert list_cmd.job_type({"apiVersion": "batch/v1", "kind": "Job"}) == "job.batch"
    assert (
        list_cmd.job_type({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet"})
        == "jobset.jobset.x-k8s.io"
    )
    assert list_cmd.job_type({"apiVersion": "v1", "kind": "Pod"}) == "pod"
    assert list_cmd.job_type({}) == ""


def test_the_filters_use_the_local_queues_cluster_queue_for_pending_workloads() -> None:
    def args(**kw: Any) -> argparse.Namespace:
        return argparse.Namespace(
            **{"localqueue": None, "clusterqueue": None, "status": "all", **kw}
        )

    pending_b = _wl("p", queue="lq-b")
    admitted_a = _wl("a", cq="cq-a", conditions=(("Admitted", "True", "x"),))
    assert list_cmd._wanted(pending_b, args(clusterqueue="cq-b"), QUEUES)
    assert not list_cmd._wanted(pending_b, args(clusterqueue="cq-a"), QUEUES)
    assert list_cmd._wanted(admitted_a, args(clusterqueue="cq-a"), QUEUES)
    assert list_cmd._wanted(pending_b, args(status="pending"), QUEUES)
    assert not list_cmd._wanted(admitted_a, args(status="pending"), QUEUES)
    assert not list_cmd._wanted(pending_b, args(localqueue="lq-a"), QUEUES)


def test_the_table_pads_columns_as_kubectl() -> None:
    assert list_cmd.table(["NAME", "AGE"], [["a-long-name", "5s"], ["b", "12m"]]) == (
        "NAME          AGE\na-long-name   5s\nb             12m\n"
    )
    assert list_cmd.table(["NAME"], []) == "No resources found\n"
    assert [list_cmd._age(dt.timedelta(seconds=s)) for s in (5, 119, 600, 3 * 3600 + 120)] == [
        "5s",
        "119s",
        "10m",
        "3h2m",
    ]


def test_bad_flags_are_refused_naming_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "clusterqueue", "-n", "team-a", "--kubeconfig", "/nonexistent"]) == 2
    assert "cluster-scoped" in capsys.readouterr().err
    assert main(["list", "workload", "--kubeconfig", "/nonexistent/kubeconfig"]) == 2
    assert "/nonexistent/kubeconfig" in capsys.readouterr().err
    assert main(["list", "pods", "--kubeconfig", "/nonexistent"]) == 2
    assert "--for job/NAME|workload/NAME" in capsys.readouterr().err
    assert main(["list", "rf", "-A", "--kubeconfig", "/nonexistent"]) == 2
    assert "cluster-scoped" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["list", "deployments"])
    assert "KIND" in capsys.readouterr().err
