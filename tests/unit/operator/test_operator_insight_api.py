"""Phalanx's explain/what-if API: a Job becomes the Workload the Job integration makes, bad
bodies get a 400 naming the field, and the answers carry the core's decision."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from phalanx.admission.model import LocalQueue
from phalanx.admission.scheduler import Scheduler
from phalanx.cli.explain_cmd import parse_target
from phalanx.operator import insight_api, visibility

sys.path.insert(0, str(Path(__file__).parents[1] / "core"))
from core_builders import MakeClusterQueue, MakeFlavorQuotas, MakeWorkload, flavor


def job(cpu: str = "1", *, parallelism: int = 2, labels: dict[str, str] | None = None) -> Any:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "labels": {"kueue.x-k8s.io/queue-name": "lq"} if labels is None else labels,
        },
        "spec": {
            "parallelism": parallelism,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}
                    ],
                }
            },
        },
    }


def no_objects(kind: str) -> dict[str, Any]:
    return {}


def scheduler() -> Scheduler:
    s = Scheduler()
    s.apply_resource_flavor(flavor("default"))
    s.apply_cluster_queue(
        MakeClusterQueue("cq").resource_group(MakeFlavorQuotas("default").resource("cpu", 4)).obj()
    )
    s.apply_local_queue(LocalQueue("team", "lq", "cq"))
    s.set_namespace("team", {})
    return s


def test_a_job_becomes_its_workload_and_the_answer_names_queue_and_flavor() -> None:
    manifest = insight_api.workload_for_request(job(), "team", objects=no_objects)
    assert manifest["spec"]["queueName"] == "lq"
    assert manifest["spec"]["podSets"][0]["count"] == 2
    body = insight_api.whatif_body(insight_api.what_if(scheduler(), manifest))
    status = body["status"]
    assert status["decision"] == "Admit"
    assert (status["localQueue"], status["clusterQueue"]) == ("lq", "cq")
    assert status["admission"]["podSetAssignments"][0]["flavors"] == {"cpu": "default"}
    assert "Decision: Admit" in status["text"]


def test_a_job_too_big_waits_with_its_explanation() -> None:
    manifest = insight_api.workload_for_request(job("3"), "team", objects=no_objects)
    status = insight_api.whatif_body(insight_api.what_if(scheduler(), manifest))["status"]
    assert status["decision"] == "Pending"
    assert status["explanation"]["reason"] == "ExceedsMaxQuota"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ([], "must be a JSON object"),
        ({"apiVersion": "v1", "kind": "Pod", "metadata": {}}, "send a batch/v1 Job"),
        (job(labels={}), "kueue.x-k8s.io/queue-name"),
        ({**job(), "metadata": {"name": "x", "namespace": "other"}}, "metadata.namespace"),
        (
            job(labels={"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/priority-class": "p"}),
            "WorkloadPriorityClass 'p'",
        ),
    ],
)
def test_bad_bodies_are_refused_naming_the_field(body: Any, words: str) -> None:
    with pytest.raises(insight_api.BadRequest, match=words):
        insight_api.workload_for_request(body, "team", objects=no_objects)


def test_explanation_of_a_pending_and_of_an_admitted_workload() -> None:
    s = scheduler()
    s.add_workload(MakeWorkload("fits", "team").queue("lq").request("cpu", 4).obj())
    s.add_workload(MakeWorkload("waits", "team").queue("lq").request("cpu", 2).created(1).obj())
    s.run_cycle(1)
    pending = insight_api.explanation_body(s, "team", "waits")
    assert pending is not None and pending["status"]["pending"] is True
    assert pending["status"]["shortfalls"][0]["missing"] == "2"
    assert pending["status"]["positionInLocalQueue"] == 0
    admitted = insight_api.explanation_body(s, "team", "fits")
    assert admitted is not None and admitted["status"]["pending"] is False
    assert admitted["status"]["clusterQueue"] == "cq"
    assert insight_api.explanation_body(s, "team", "nobody") is None


def test_discovery_lists_both_groups() -> None:
    names = [g["name"] for g in visibility.api_group_list()["groups"]]
    assert names == ["visibility.kueue.x-k8s.io", "visibility.phalanx.kueue.x-k8s.io"]
    resources = {r["name"]: r["verbs"] for r in insight_api.api_resource_list()["resources"]}
    assert resources["workloads/explanation"] == ["get"]
    assert resources["whatifs"] == ["create"]


def test_explain_targets() -> None:
    assert parse_target("w1") == ("workload", "w1")
    assert parse_target("wl/w1") == ("workload", "w1")
    assert parse_target("job/train") == ("job", "train")
    with pytest.raises(ValueError, match="job/NAME"):
        parse_target("pod/x")
