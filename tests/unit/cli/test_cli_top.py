"""``phalanx top``'s frames from queues shaped as the API returns them (the status the operator
writes: counts, ``flavorsUsage`` with ``total`` and ``borrowed``, the ``Active`` condition), the
tables and JSON it prints, how a frame is presented live or once, and its flag errors."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

import pytest

from phalanx.cli import top_cmd
from phalanx.cli.main import build_parser, main

NOW = dt.datetime(2026, 12, 4, 5, 30, tzinfo=dt.UTC)


def _active(status: str, reason: str = "Ready") -> list[dict[str, Any]]:
    return [{"type": "Active", "status": status, "reason": reason, "message": ""}]


def cluster_queue(
    name: str,
    *,
    cohort: str | None = None,
    flavors: dict[str, dict[str, str]],
    usage: dict[tuple[str, str], tuple[str, str]] | None = None,
    pending: int = 0,
    admitted: int = 0,
    stop: str | None = None,
    active: str = "True",
) -> dict[str, Any]:
    """A ClusterQueue as ``kubectl get -o json`` shows it: ``flavors`` flavor -> resource ->
    nominal quota; ``usage`` (flavor, resource) -> (total, borrowed); the status lists every
    flavor and resource of the spec, zeros included, as the operator writes it."""
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": [
            {
                "coveredResources": sorted({r for rs in flavors.values() for r in rs}),
                "flavors": [
                    {
                        "name": flavor,
                        "resources": [{"name": r, "nominalQuota": q} for r, q in rs.items()],
                    }
                    for flavor, rs in flavors.items()
                ],
            }
        ]
        if flavors
        else [],
    }
    if cohort:
        spec["cohortName"] = cohort
    if stop:
        spec["stopPolicy"] = stop
    used = usage or {}
    listed = [
        {
            "name": flavor,
            "resources": [
                {
                    "name": r,
                    "total": used.get((flavor, r), ("0", "0"))[0],
                    "borrowed": used.get((flavor, r), ("0", "0"))[1],
                }
                for r in rs
            ],
        }
        for flavor, rs in flavors.items()
    ]
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name, "creationTimestamp": "2026-12-04T05:00:00Z"},
        "spec": spec,
        "status": {
            "conditions": _active(active, "Ready" if active == "True" else "Stopped"),
            "pendingWorkloads": pending,
            "reservingWorkloads": admitted,
            "admittedWorkloads": admitted,
            "flavorsReservation": listed,
            "flavorsUsage": listed,
            "fairSharing": {"weightedShare": 0},
        },
    }


def local_queue(
    namespace: str,
    name: str,
    cq: str,
    *,
    usage: dict[str, dict[str, str]],
    pending: int = 0,
    admitted: int = 0,
    stop: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"clusterQueue": cq}
    if stop:
        spec["stopPolicy"] = stop
    listed = [
        {"name": f, "resources": [{"name": r, "total": t} for r, t in rs.items()]}
        for f, rs in usage.items()
    ]
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
        "status": {
            "conditions": _active("False" if stop else "True"),
            "pendingWorkloads": pending,
            "reservingWorkloads": admitted,
            "admittedWorkloads": admitted,
            "flavorsReservation": listed,
            "flavorsUsage": listed,
        },
    }


QUEUES = [
    cluster_queue(
        "team-b",
        cohort="all",
        flavors={"h100": {"cpu": "16", "nvidia.com/gpu": "8"}},
        usage={("h100", "cpu"): ("2", "0"), ("h100", "nvidia.com/gpu"): ("12", "4")},
        pending=3,
        admitted=2,
    ),
    cluster_queue(
        "team-a",
        cohort="all",
        flavors={"h100": {"nvidia.com/gpu": "8"}, "a100": {"cpu": "4", "memory": "16Gi"}},
        usage={("a100", "cpu"): ("500m", "0"), ("a100", "memory"): ("4Gi", "0")},
        stop="HoldAndDrain",
        active="False",
    ),
    cluster_queue("empty", flavors={}, active="False"),
]
LOCALS = [
    local_queue("team-b", "train", "team-b", usage={"h100": {"nvidia.com/gpu": "12"}}, admitted=2),
    local_queue("team-a", "dev", "team-a", usage={}, pending=1, stop="Hold"),
]


def test_frame_holds_counts_usage_nominal_and_borrowed_in_the_specs_order() -> None:
    shown = top_cmd.frame(QUEUES, None, now=NOW)
    assert shown["time"] == "2026-12-04T05:30:00Z"
    assert "localQueues" not in shown  # not asked for
    assert [q["name"] for q in shown["clusterQueues"]] == ["empty", "team-a", "team-b"]
    team_b = shown["clusterQueues"][2]
    assert team_b == {
        "name": "team-b",
        "cohort": "all",
        "pendingWorkloads": 3,
        "reservingWorkloads": 2,
        "admittedWorkloads": 2,
        "stopPolicy": "None",
        "active": True,
        "resources": [
            {"flavor": "h100", "resource": "cpu", "usage": "2", "nominal": "16", "borrowed": "0"},
            {
                "flavor": "h100",
                "resource": "nvidia.com/gpu",
                "usage": "12",
                "nominal": "8",
                "borrowed": "4",
            },
        ],
    }
    team_a = shown["clusterQueues"][1]
    assert [(r["flavor"], r["resource"]) for r in team_a["resources"]] == [
        ("h100", "nvidia.com/gpu"),
        ("a100", "cpu"),
        ("a100", "memory"),
    ]
    assert (team_a["stopPolicy"], team_a["active"]) == ("HoldAndDrain", False)


def test_a_queue_without_status_yet_shows_zeros() -> None:
    fresh = cluster_queue("new", flavors={"h100": {"nvidia.com/gpu": "8"}})
    del fresh["status"]
    (view,) = top_cmd.frame([fresh], None, now=NOW)["clusterQueues"]
    assert view["pendingWorkloads"] == view["admittedWorkloads"] == 0
    assert view["resources"][0]["usage"] == view["resources"][0]["borrowed"] == "0"
    assert view["active"] is False


def test_tables_one_row_per_flavor_and_resource() -> None:
    text = top_cmd.render(top_cmd.frame(QUEUES, None, now=NOW), all_namespaces=False)
    assert text == (
        "CLUSTERQUEUE   COHORT   PENDING   ADMITTED   STATE          FLAVOR   RESOURCE"
        "         USAGE/NOMINAL    BORROWED\n"
        "empty                   0         0          Inactive\n"
        "team-a         all      0         0          HoldAndDrain   h100     nvidia.com/gpu"
        "   0/8 (0%)         0\n"
        "                                                            a100     cpu"
        "              500m/4 (12%)     0\n"
        "                                                            a100     memory"
        "           4Gi/16Gi (25%)   0\n"
        "team-b         all      3         2          Active         h100     cpu"
        "              2/16 (12%)       0\n"
        "                                                            h100     nvidia.com/gpu"
        "   12/8 (150%)      4\n"
    )


def test_local_queues_with_and_without_namespace_column() -> None:
    shown = top_cmd.frame(QUEUES[:1], LOCALS, now=NOW)
    assert [(q["namespace"], q["name"]) for q in shown["localQueues"]] == [
        ("team-a", "dev"),
        ("team-b", "train"),
    ]
    text = top_cmd.render(shown, all_namespaces=True)
    tables = text.split("\n\n")
    assert len(tables) == 2
    assert tables[1] == (
        "NAMESPACE   LOCALQUEUE   CLUSTERQUEUE   PENDING   ADMITTED   STATE    FLAVOR"
        "   RESOURCE         USAGE\n"
        "team-a      dev          team-a         1         0          Hold\n"
        "team-b      train        team-b         0         2          Active   h100"
        "     nvidia.com/gpu   12\n"
    )
    one = top_cmd.render(top_cmd.frame([], LOCALS[1:], now=NOW), all_namespaces=False)
    assert one == (
        "No ClusterQueues found\n\n"
        "LOCALQUEUE   CLUSTERQUEUE   PENDING   ADMITTED   STATE   FLAVOR   RESOURCE   USAGE\n"
        "dev          team-a         1         0          Hold\n"
    )
    none = top_cmd.render(top_cmd.frame([], [], now=NOW), all_namespaces=False)
    assert none == "No ClusterQueues found\n\nNo LocalQueues found\n"


def test_usage_of_nominal() -> None:
    def cell(usage: str, nominal: str, resource: str = "cpu") -> str:
        return top_cmd.usage_of_nominal({"usage": usage, "nominal": nominal, "resource": resource})

    assert cell("1500m", "2") == "1500m/2 (75%)"
    assert cell("3", "0") == "3/0"  # no quota of its own: everything borrowed
    assert cell("1", "lots") == "1/lots"


def test_json_is_the_frame() -> None:
    shown = top_cmd.frame(QUEUES, LOCALS, now=NOW)
    assert json.loads(top_cmd.render_json(shown, compact=False)) == shown
    line = top_cmd.render_json(shown, compact=True)
    assert line.count("\n") == 1 and json.loads(line) == shown


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["top", *argv])


def test_presenting_frames() -> None:
    body = "CLUSTERQUEUE ...\n"
    assert top_cmd.present(body, args=_args("--once"), tty=True) == body
    assert top_cmd.present(body, args=_args("--once"), tty=False) == body
    live_tty = top_cmd.present(body, args=_args("--interval", "0.5"), tty=True)
    assert live_tty.startswith(top_cmd.CLEAR + "Every 0.5s: phalanx top   ")
    assert live_tty.endswith("(Ctrl-C to stop)\n\n" + body)
    piped = top_cmd.present(body, args=_args("--localqueues"), tty=False)
    assert piped.startswith("Every 2s: phalanx top --localqueues   ")
    assert top_cmd.CLEAR not in piped and piped.endswith(body + "\n")
    assert top_cmd.present('{"time":""}\n', args=_args("-o", "json"), tty=False) == '{"time":""}\n'


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", "inf"])
def test_interval_must_be_positive(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        _args("--interval", value)
    assert exit_.value.code == 2
    assert "argument --interval: must be a positive number of seconds" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["-n", "team-a"], "add --localqueues"),
        (["-A"], "add --localqueues"),
        (["--localqueues", "-n", "a", "-A"], "give one of them"),
    ],
)
def test_namespace_flags_need_local_queues(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["top", *argv, "--once"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: -n/--namespace and -A/--all-namespaces") and says in err


def test_completion_offers_the_verb_and_its_flags() -> None:
    from phalanx.cli import completion_cmd

    parser = build_parser()
    assert "top" in completion_cmd.complete(parser, ["t"])
    flags = completion_cmd.complete(parser, ["top", "--"])
    assert {"--localqueues", "--interval", "--once", "--output"} <= set(flags)
